//! One test per client and runtime the docs claim: redis-rs on tokio, redis-rs on smol, fred on tokio
//! (and fred elsewhere: a typed error, not a panic). Each holds a lease renewed in the background by the
//! shipped spawner across several TTLs, checked on the server.

#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
use std::time::Duration;

#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
use redlease::Config;
#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
use redlease_testkit::server::{Flavor, RedisServer, on_each_flavor};

/// A TTL several renewals fit into, with a margin of most of a TTL for a loaded machine.
#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
const TTL: Duration = Duration::from_secs(1);
#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
const RENEW: Duration = Duration::from_millis(200);
/// How long the lease is held without `run`: only background renewal keeps it.
#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
const HOLD: Duration = Duration::from_millis(2_500);

#[cfg(any(all(feature = "redis", feature = "tokio"), feature = "fred"))]
fn config() -> Config {
    Config::default().with_expiry(TTL).with_attempts(1)
}

#[cfg(all(feature = "redis", feature = "tokio"))]
#[test]
fn redis_rs_on_tokio_holds_a_lease_renewed_by_the_tokio_timer_and_spawner() {
    use redlease_adapters::runtime::{TokioSpawner, TokioTimer};
    on_each_flavor(
        "redis_rs_on_tokio_holds_a_lease_renewed_by_the_tokio_timer_and_spawner",
        &Flavor::ALL,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let manager = redlease_adapters::redis::single(&server.url(), config())
                    .unwrap()
                    .with_timer(TokioTimer)
                    .with_spawner(TokioSpawner::current().unwrap());
                let lease = manager
                    .lock("rt:{tokio}:lock")
                    .auto_renew(RENEW)
                    .try_acquire()
                    .await
                    .unwrap();
                tokio::time::sleep(HOLD).await;
                assert!(lease.is_held());
                assert_eq!(
                    server.cmd(&["GET", "rt:{tokio}:lock"]),
                    lease.token().as_str()
                );
                lease.release().await.unwrap();
                assert_eq!(server.cmd(&["EXISTS", "rt:{tokio}:lock"]), "0");
            });
        },
    );
}

#[cfg(all(feature = "redis", feature = "smol"))]
#[test]
fn redis_rs_on_smol_holds_a_lease_renewed_by_the_smol_spawner() {
    use redlease_adapters::runtime::SmolSpawner;
    on_each_flavor(
        "redis_rs_on_smol_holds_a_lease_renewed_by_the_smol_spawner",
        &Flavor::ALL,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            smol::block_on(async {
                // No tokio runtime here: with both runtime features compiled in, redis-rs must pick smol.
                assert!(tokio::runtime::Handle::try_current().is_err());
                let manager = redlease_adapters::redis::single(&server.url(), config())
                    .unwrap()
                    .with_spawner(SmolSpawner::global());
                let lease = manager
                    .lock("rt:{smol}:lock")
                    .auto_renew(RENEW)
                    .try_acquire()
                    .await
                    .unwrap();
                smol::Timer::after(HOLD).await;
                assert!(lease.is_held());
                assert_eq!(
                    server.cmd(&["GET", "rt:{smol}:lock"]),
                    lease.token().as_str()
                );
                lease.release().await.unwrap();
                assert_eq!(server.cmd(&["EXISTS", "rt:{smol}:lock"]), "0");
            });
        },
    );
}

#[cfg(feature = "smol")]
#[test]
fn the_smol_spawner_also_runs_tasks_on_an_executor_of_ones_own() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use redlease::Spawn;
    use redlease_adapters::runtime::SmolSpawner;

    let executor = Arc::new(smol::Executor::new());
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    SmolSpawner::on(Arc::clone(&executor)).spawn(Box::pin(async move {
        flag.store(true, Ordering::SeqCst);
    }));
    // Nothing runs the executor yet.
    assert!(!ran.load(Ordering::SeqCst));
    smol::block_on(executor.run(async {
        while !ran.load(Ordering::SeqCst) {
            smol::future::yield_now().await;
        }
    }));
}

#[cfg(feature = "fred")]
#[test]
fn fred_on_tokio_holds_a_lease_renewed_by_the_tokio_timer_and_spawner() {
    use redlease_adapters::runtime::{TokioSpawner, TokioTimer};
    on_each_flavor(
        "fred_on_tokio_holds_a_lease_renewed_by_the_tokio_timer_and_spawner",
        &Flavor::ALL,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let manager = redlease_adapters::fred::single(&server.url(), config())
                    .unwrap()
                    .with_timer(TokioTimer)
                    .with_spawner(TokioSpawner::current().unwrap());
                let lease = manager
                    .lock("rt:{fred}:lock")
                    .auto_renew(RENEW)
                    .try_acquire()
                    .await
                    .unwrap();
                tokio::time::sleep(HOLD).await;
                assert!(lease.is_held());
                assert_eq!(
                    server.cmd(&["GET", "rt:{fred}:lock"]),
                    lease.token().as_str()
                );
                lease.release().await.unwrap();
                assert_eq!(server.cmd(&["EXISTS", "rt:{fred}:lock"]), "0");
            });
        },
    );
}

#[cfg(feature = "fred")]
#[test]
fn fred_outside_tokio_is_a_typed_unsupported_error_at_once_not_a_panic() {
    use redlease::{Error, NotAcquiredReason};
    on_each_flavor(
        "fred_outside_tokio_is_a_typed_unsupported_error_at_once_not_a_panic",
        &Flavor::ALL,
        |flavor| {
            let server = RedisServer::start_flavor(flavor, &[]);
            let manager =
                redlease_adapters::fred::single(&server.url(), config().with_attempts(3)).unwrap();
            let err = smol::block_on(manager.lock("rt:{fred-smol}:lock").acquire()).unwrap_err();
            // Permanent: the first attempt ends the acquisition.
            assert!(
                matches!(
                    err,
                    Error::NotAcquired {
                        reason: NotAcquiredReason::Refused,
                        attempts: 1,
                        ..
                    }
                ),
                "{err:?}"
            );
            let text = crate::chain(&err);
            assert!(text.contains("tokio"), "{text}");
            assert_eq!(server.cmd(&["EXISTS", "rt:{fred-smol}:lock"]), "0");
        },
    );
}

#[cfg(feature = "tokio")]
#[test]
fn the_tokio_spawner_is_an_error_outside_a_runtime_and_spawns_from_any_thread_inside_one() {
    use std::sync::mpsc;

    use redlease::Spawn;
    use redlease_adapters::runtime::TokioSpawner;

    assert!(TokioSpawner::current().is_err());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let spawner = rt.block_on(async { TokioSpawner::current().unwrap() });
    let (tx, rx) = mpsc::channel();
    // From a thread that is not the runtime's (as a lease dropped outside the runtime would).
    std::thread::spawn(move || {
        spawner.spawn(Box::pin(async move {
            tx.send(()).unwrap();
        }));
    })
    .join()
    .unwrap();
    rt.block_on(async {
        for _ in 0..1000 {
            if rx.try_recv().is_ok() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the task spawned from another thread never ran");
    });
}

#[cfg(feature = "tokio")]
#[test]
fn a_long_tokio_timer_sleep_wakes_its_task_at_least_once_a_second_and_ends_on_time() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use redlease::Timer;
    use redlease_adapters::runtime::TokioTimer;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let start = TokioTimer.now();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut sleep = TokioTimer.sleep_until(start + Duration::from_secs(10));
        let counted = Arc::clone(&polls);
        std::future::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::SeqCst);
            sleep.as_mut().poll(cx)
        })
        .await;
        // Paused clock: auto-advanced exactly to the deadline.
        assert_eq!(TokioTimer.now() - start, Duration::from_secs(10));
        // The first poll, then one wake per second at least: a suspend is noticed within a second.
        let n = polls.load(Ordering::SeqCst);
        assert!(n >= 11, "{n} polls");
    });
}
