//! Single-node semantics through `LockManager::single`, for every backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Claim, ClaimRequest, ExtendItem, LockManager, LossReason, Ttl};
use redlease_adapters::Commands;
use redlease_testkit::server::{Flavor, RedisServer};

use crate::common::{self, ALL_BACKENDS, Backend, config, fence_of, key, on_every_server};

const TTL: Duration = Duration::from_millis(500);

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["PTTL", key])
        .parse()
        .expect("PTTL is an integer")
}

#[test]
fn acquire_free_key_sets_token_ttl_and_increments_fence_by_one() {
    on_every_server(
        "acquire_free_key_sets_token_ttl_and_increments_fence_by_one",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL)).unwrap();
                let k = key("free", backend);
                let f = fence_of(&k);
                server.cmd(&["SET", &f, "41"]);
                let started = Instant::now();
                let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
                assert_eq!(
                    server.cmd(&["GET", &k]),
                    lease.token().as_str(),
                    "{backend:?}"
                );
                let ms = pttl(&server, &k);
                // The TTL was set after `started` and read before now: at least TTL − elapsed is left (1 ms for
                // PTTL's rounding), never more than TTL.
                let floor = TTL.as_millis() as i64 - started.elapsed().as_millis() as i64 - 1;
                assert!(
                    ms >= floor && ms <= TTL.as_millis() as i64,
                    "{backend:?}: PTTL {ms} not within [{floor}, {}]",
                    TTL.as_millis()
                );
                assert_eq!(lease.fencing_token(), Some(42), "{backend:?}");
                assert_eq!(server.cmd(&["GET", &f]), "42", "{backend:?}");
                lease.release().await.unwrap();
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{backend:?}");
                assert_eq!(server.cmd(&["GET", &f]), "42", "the fence is never deleted");
                // Unfenced acquisition too.
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                assert_eq!(server.cmd(&["GET", &k]), lease.token().as_str());
                lease.release().await.unwrap();
            }
        },
    );
}

#[test]
fn acquire_held_key_is_contended_and_changes_nothing() {
    on_every_server(
        "acquire_held_key_is_contended_and_changes_nothing",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL)).unwrap();
                let k = key("held", backend);
                let f = fence_of(&k);
                let set_at = Instant::now();
                server.cmd(&["SET", &k, "someone-else", "PX", "5000"]);
                server.cmd(&["SET", &f, "7"]);
                for fenced in [false, true] {
                    let lock = manager.lock(&k);
                    let lock = if fenced { lock.fenced(&f) } else { lock };
                    let err = lock.try_acquire().await.unwrap_err();
                    assert!(err.is_contended(), "{backend:?} fenced={fenced}: {err}");
                    assert_eq!(server.cmd(&["GET", &k]), "someone-else");
                    let ms = pttl(&server, &k);
                    let floor = 5000 - set_at.elapsed().as_millis() as i64 - 1;
                    assert!(
                        ms >= floor && ms <= 5000,
                        "{backend:?}: TTL changed to {ms} (expected [{floor}, 5000])"
                    );
                    assert_eq!(server.cmd(&["GET", &f]), "7", "{backend:?}: fence changed");
                }
            }
        },
    );
}

/// Takes the free `lock`. Its 50 ms rounds may time out on a loaded machine (and a timed-out request may
/// still land, holding the key for its 60 ms): tried again then, up to ten times.
async fn take(lock: &redlease::Lock, backend: Backend) -> redlease::Lease {
    let mut last = None;
    for _ in 0..10 {
        match lock.try_acquire().await {
            Ok(lease) => return lease,
            Err(e @ redlease::Error::NotAcquired { .. }) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{backend:?}: {e}"),
        }
    }
    panic!("{backend:?}: a free key not acquired in ten tries: {last:?}")
}

#[test]
fn release_after_expiry_or_takeover_reports_lost_and_keeps_the_new_owner() {
    on_every_server(
        "release_after_expiry_or_takeover_reports_lost_and_keeps_the_new_owner",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            // The operation timeout is set explicitly: the default (ttl / 5) would give a 60 ms lease 12 ms per round.
            let short = Duration::from_millis(60);
            // Past our deadline, and past the server's expiry (set before the acquisition returned).
            let expired = short + short / 2;
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let cfg = config(short).with_operation_timeout(short - Duration::from_millis(10));
                let manager = LockManager::single(Arc::clone(&node), cfg).unwrap();
                // For the 5 s lease below: rounds of the default ttl / 5.
                let patient = LockManager::single(node, config(Duration::from_secs(5))).unwrap();
                let k = key("release", backend);

                // Expired, nobody else: lost, and nothing is left.
                let lease = take(&manager.lock(&k), backend).await;
                tokio::time::sleep(expired).await;
                let err = lease.release().await.unwrap_err();
                assert!(err.is_lost(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["EXISTS", &k]), "0");

                // Taken over by a new owner after expiry: lost, and the new owner's key is intact.
                let lease = take(&manager.lock(&k), backend).await;
                tokio::time::sleep(expired).await;
                server.cmd(&["SET", &k, "new-owner", "PX", "5000"]);
                let err = lease.release().await.unwrap_err();
                assert!(err.is_lost(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["GET", &k]), "new-owner");
                server.cmd(&["DEL", &k]);

                // Taken over while still valid on our side (a foreign SET): the node refuses to delete it.
                let lease = take(&patient.lock(&k), backend).await;
                server.cmd(&["SET", &k, "intruder", "PX", "5000"]);
                let err = lease.release().await.unwrap_err();
                assert!(err.is_lost(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["GET", &k]), "intruder");
                server.cmd(&["DEL", &k]);
            }
        },
    );
}

#[test]
fn extend_after_expiry_or_del_reports_lost_and_never_recreates_the_key() {
    on_every_server(
        "extend_after_expiry_or_del_reports_lost_and_never_recreates_the_key",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(Duration::from_secs(2))).unwrap();
                let k = key("extend", backend);

                // A working extension first.
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                let started = Instant::now();
                lease.extend(Duration::from_secs(3)).await.unwrap();
                let ms = pttl(&server, &k);
                let floor = 3000 - started.elapsed().as_millis() as i64 - 1;
                assert!(
                    ms >= floor && ms <= 3000,
                    "{backend:?}: PTTL {ms} after extend, not within [{floor}, 3000]"
                );

                // DEL while valid: the extension reports the loss and does not re-create the key.
                server.cmd(&["DEL", &k]);
                let err = lease.extend(Duration::from_secs(3)).await.unwrap_err();
                assert!(
                    matches!(
                        err,
                        redlease::Error::Lost {
                            reason: LossReason::NotHeld,
                            ..
                        }
                    ),
                    "{backend:?}: {err}"
                );
                assert_eq!(server.cmd(&["EXISTS", &k]), "0");

                // Expired on the server (TTL shortened behind our back): same.
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                server.cmd(&["PEXPIRE", &k, "1"]);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let err = lease.extend(Duration::from_secs(3)).await.unwrap_err();
                assert!(err.is_lost(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["EXISTS", &k]), "0");

                // Expired on our side too (a short lease; its operation timeout is the manager's 400 ms default,
                // too long for it, so a manager with a short one).
                let short = Duration::from_millis(50);
                let node = common::node(backend, &server.url()).await;
                let cfg = config(short).with_operation_timeout(short - Duration::from_millis(10));
                let lease = LockManager::single(node, cfg)
                    .unwrap()
                    .lock(&k)
                    .try_acquire()
                    .await
                    .unwrap();
                // Past our deadline, and past the server's expiry (set before the acquisition returned).
                tokio::time::sleep(short + short / 2).await;
                let err = lease.extend(Duration::from_secs(3)).await.unwrap_err();
                assert!(err.is_lost(), "{backend:?}: {err}");
                assert_eq!(server.cmd(&["EXISTS", &k]), "0");
            }
        },
    );
}

#[test]
fn restart_while_held_reports_loss_no_later_than_the_validity_deadline() {
    on_every_server(
        "restart_while_held_reports_loss_no_later_than_the_validity_deadline",
        |flavor| async move {
            use crate::common::Backend;
            let mut server = RedisServer::start_flavor(flavor, &[]);
            // Reconnecting backends see the restarted, empty server; the multiplexed connection stays broken.
            for backend in [
                Backend::RedisManager,
                Backend::FredClient,
                Backend::RedisMultiplexed,
            ] {
                let node = common::node(backend, &server.url()).await;
                let ttl = Duration::from_secs(1);
                let cfg = config(ttl);
                // The signal fires by the deadline; the test's task learns of it after a wake-up on a loaded
                // machine, for which one operation timeout (200 ms) is left.
                let wake_up = cfg.operation_timeout_for(ttl);
                let manager = LockManager::single(node, cfg).unwrap();
                let k = key("restart", backend);
                let lease = manager
                    .lock(&k)
                    .renew_every(Duration::from_millis(250))
                    .try_acquire()
                    .await
                    .unwrap();
                // Renewal runs inside `run` while the work lasts; the work outlasts the loss.
                let work = lease.run(tokio::time::sleep(Duration::from_secs(5)));
                let kill_and_watch = async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    // Read after the kill: no renewal can move the deadline any more.
                    server.kill();
                    let deadline = lease.valid_until();
                    server.restart();
                    (deadline, lease.lost().await, Instant::now())
                };
                let (work_result, (deadline, reason, lost_at)) = tokio::join!(work, kill_and_watch);
                assert!(
                    work_result.unwrap_err().is_lost(),
                    "{backend:?}: the work was stopped by the loss"
                );
                assert!(
                    lost_at <= deadline + wake_up,
                    "{backend:?}: loss ({reason}) signalled {:?} after the validity deadline",
                    lost_at - deadline
                );
                assert!(
                    matches!(
                        reason,
                        LossReason::NotHeld | LossReason::ExtendFailed | LossReason::Expired
                    ),
                    "{backend:?}: {reason:?}"
                );
                assert!(!lease.is_held());
                assert_eq!(
                    server.cmd(&["EXISTS", &k]),
                    "0",
                    "{backend:?}: nothing re-created"
                );
            }
        },
    );
}

#[test]
fn stalled_server_bounds_acquire_by_the_operation_timeout_and_never_reports_contention() {
    on_every_server(
        "stalled_server_bounds_acquire_by_the_operation_timeout_and_never_reports_contention",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                // Four servers stall at once (one per flavor) on two cores: the bound is a multiple of the
                // operation timeout, far below the TTL a stall would otherwise wait out (it has no end).
                const OP: Duration = Duration::from_millis(250);
                const EXPIRY: Duration = Duration::from_millis(1200);
                let cfg = config(EXPIRY).with_operation_timeout(OP);
                let manager = LockManager::single(node, cfg).unwrap();
                let k = key("stall", backend);
                server.pause();
                let started = Instant::now();
                let result = manager.lock(&k).try_acquire().await;
                let elapsed = started.elapsed();
                server.resume();
                let err = result.unwrap_err();
                assert!(
                    !err.is_contended(),
                    "{backend:?}: a stall is not contention: {err}"
                );
                assert!(elapsed < OP * 4, "{backend:?}: took {elapsed:?}");
                // After the resume the key holds our (unknown) token with a TTL, or nothing; it expires either way.
                let ttl = pttl(&server, &k);
                assert!(
                    ttl == -2 || (0..=EXPIRY.as_millis() as i64).contains(&ttl),
                    "{backend:?}: PTTL {ttl}"
                );
                tokio::time::sleep(EXPIRY + Duration::from_millis(50)).await;
                assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{backend:?}");
                // The node still answers correctly afterwards.
                let lease = manager.lock(&k).try_acquire().await.unwrap();
                lease.release().await.unwrap();
            }
        },
    );
}

/// The README's recipe: a restart without persistence resets the fence counter, so the next holder would get
/// a fence the resource has already passed (and be refused as stale); `raise_fence` above the resource's
/// largest accepted fence restores the order.
#[test]
fn raise_fence_restores_fence_order_after_a_restart_without_persistence() {
    on_every_server(
        "raise_fence_restores_fence_order_after_a_restart_without_persistence",
        |flavor| async move {
            let mut server = RedisServer::start_flavor(flavor, &[]);
            // What the fenced resource remembers, per backend: the largest fence it accepted before the restart.
            let mut accepted = Vec::new();
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL)).unwrap();
                let k = key("reseed", backend);
                server.cmd(&["SET", &fence_of(&k), "4710"]);
                let lease = manager
                    .lock(&k)
                    .fenced(fence_of(&k))
                    .try_acquire()
                    .await
                    .unwrap();
                accepted.push(lease.fencing_token().unwrap());
                lease.release().await.unwrap();
            }
            server.restart();
            for (backend, resource_max) in ALL_BACKENDS.into_iter().zip(accepted) {
                assert_eq!(resource_max, 4711, "{backend:?}");
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL)).unwrap();
                let (k, f) = (key("reseed", backend), fence_of(&key("reseed", backend)));
                // Without the raise the counter starts again: a fence the resource would refuse as stale.
                let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
                assert_eq!(lease.fencing_token(), Some(1), "{backend:?}");
                lease.release().await.unwrap();
                // Raised above what the resource accepted: the next fence is larger, and raising lower is a no-op.
                assert_eq!(
                    manager.raise_fence(&f, resource_max).await.unwrap(),
                    resource_max
                );
                assert_eq!(
                    manager.raise_fence(&f, 5).await.unwrap(),
                    resource_max,
                    "{backend:?}"
                );
                assert_eq!(
                    server.cmd(&["PTTL", &f]),
                    "-1",
                    "{backend:?}: the counter has no TTL"
                );
                let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
                assert_eq!(lease.fencing_token(), Some(resource_max + 1), "{backend:?}");
                lease.release().await.unwrap();
                // A counter that is not a number is refused, unchanged.
                server.cmd(&["SET", &f, "junk"]);
                let err = manager.raise_fence(&f, 10).await.unwrap_err();
                assert_eq!(
                    common::first_node_error(&err).map(|e| e.kind()),
                    Some(redlease::NodeErrorKind::Fence),
                    "{backend:?}: {err}"
                );
                assert_eq!(server.cmd(&["GET", &f]), "junk", "{backend:?}");
            }
        },
    );
}

/// Holder info lives in the lock's value after the token: every server path (scripts, native `SET IFEQ`,
/// `DELIFEQ`, no Lua at all) writes, extends, fences and deletes it with the lock, and `holder_info` reads it
/// back without the token.
#[test]
fn holder_info_is_stored_extended_and_deleted_with_the_lock_on_every_server() {
    on_every_server(
        "holder_info_is_stored_extended_and_deleted_with_the_lock_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let node = common::node(backend, &server.url()).await;
                let manager = LockManager::single(node, config(TTL)).unwrap();
                let k = key("holder-info", backend);
                let f = fence_of(&k);
                for fenced in [false, true] {
                    let lock = manager
                        .lock(&k)
                        .with_holder_info("host=web-3 pid=42 job=a:b.c");
                    let lock = if fenced { lock.fenced(&f) } else { lock };
                    let lease = lock.try_acquire().await.unwrap();
                    let stored = server.cmd(&["GET", &k]);
                    assert_eq!(
                        stored,
                        lease.token().as_str(),
                        "{backend:?} fenced={fenced}"
                    );
                    assert!(stored.ends_with(":host=web-3 pid=42 job=a:b.c"), "{stored}");
                    let holder = manager.lock(&k).holder_info().await.unwrap().expect("held");
                    assert_eq!(holder.info(), Some("host=web-3 pid=42 job=a:b.c"));
                    lease.extend(TTL * 4).await.unwrap();
                    assert!(
                        pttl(&server, &k) > TTL.as_millis() as i64,
                        "{backend:?}: extended"
                    );
                    lease.release().await.unwrap();
                    assert_eq!(
                        server.cmd(&["EXISTS", &k]),
                        "0",
                        "{backend:?} fenced={fenced}"
                    );
                    assert!(manager.lock(&k).holder_info().await.unwrap().is_none());
                }
            }
        },
    );
}

/// The modes a node can run in on `flavor` (pinned to scripts needs Lua; pinned to native needs `DELIFEQ`).
fn modes(flavor: Flavor) -> &'static [Commands] {
    match flavor {
        Flavor::Redis | Flavor::Valkey81 => &[Commands::Automatic, Commands::Scripts],
        Flavor::Valkey91NoLua => &[Commands::Automatic, Commands::Native],
        _ => &[Commands::Automatic, Commands::Scripts, Commands::Native],
    }
}

/// An extension never shortens a key (`PEXPIRE … GT`): a late or duplicated shorter extension that lands
/// after a longer one must not shorten the key under the lease (two holders). On every server, every mode the
/// server serves and every backend: a long then a short manual extension leaves the long PTTL (the lease
/// itself believes the short one); the own-token branches of the acquisitions and the batch keep it too; and
/// a renewal with the (shorter) configured expiry after a longer manual extension keeps the longer one.
#[test]
fn an_extension_never_shortens_the_key_on_every_server_mode_and_client() {
    const LONG: Duration = Duration::from_secs(20);
    const SHORT: Duration = Duration::from_secs(2);
    const EXPIRY: Duration = Duration::from_secs(1);
    const INTERVAL: Duration = Duration::from_millis(300);
    // What a key extended to LONG must still have when read: LONG less a generous allowance for the time
    // between the extension and the read on a loaded machine; far above SHORT and EXPIRY either way.
    const FLOOR: i64 = (LONG.as_millis() - 5_000) as i64;
    on_every_server(
        "an_extension_never_shortens_the_key_on_every_server_mode_and_client",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for &mode in modes(flavor) {
                for backend in ALL_BACKENDS {
                    let what = format!("{flavor} {backend:?} {mode:?}");
                    let (node, caps) = common::node_in(backend, &server.url(), mode).await;
                    let manager = LockManager::single(Arc::clone(&node), config(EXPIRY))
                        .unwrap()
                        .with_spawner(|task| {
                            tokio::spawn(task);
                        });
                    let k = key(&format!("never-shorter-{mode:?}"), backend);
                    let f = fence_of(&k);
                    let short = Ttl::from_duration(SHORT).unwrap();
                    // A long, then a short manual extension.
                    let lease = manager.lock(&k).try_acquire().await.unwrap();
                    lease.extend(LONG).await.unwrap();
                    assert!(pttl(&server, &k) > FLOOR, "{what}: extended to {LONG:?}");
                    lease.extend(SHORT).await.unwrap();
                    let left = pttl(&server, &k);
                    assert!(
                        left > FLOOR,
                        "{what} ({caps:?}): the extension to {SHORT:?} shortened the key to {left} ms"
                    );
                    assert!(
                        lease.valid_until() <= Instant::now() + SHORT,
                        "{what}: the lease believes more than its last extension gave"
                    );
                    // The own-token branches of the acquisitions, and the batch.
                    let token = lease.token();
                    assert!(node.acquire(&k, token, short).await.unwrap(), "{what}");
                    assert!(pttl(&server, &k) > FLOOR, "{what}: acquire shortened it");
                    let retry = ClaimRequest::new(&k, token, short).wants_ttl(true);
                    let claim = node.claim(retry).await.unwrap();
                    assert_eq!(claim, Claim::Taken, "{what}");
                    assert!(
                        pttl(&server, &k) > FLOOR,
                        "{what}: a claim wanting the TTL shortened it"
                    );
                    if node.profile().batch_limit > 0 {
                        let items = [ExtendItem::new(&k, token, short)];
                        assert_eq!(node.extend_many(&items).await.unwrap(), [true], "{what}");
                        assert!(
                            pttl(&server, &k) > FLOOR,
                            "{what}: extend_many shortened it"
                        );
                    }
                    lease.release().await.unwrap();
                    // The own-token branch of the fenced acquisition.
                    let lease = manager.lock(&k).fenced(&f).try_acquire().await.unwrap();
                    lease.extend(LONG).await.unwrap();
                    let again = node.acquire_fenced(&k, &f, lease.token(), short).await;
                    assert_eq!(again.unwrap(), lease.fencing_token(), "{what}");
                    assert!(
                        pttl(&server, &k) > FLOOR,
                        "{what}: acquire_fenced shortened it"
                    );
                    lease.release().await.unwrap();
                    // A renewal (with the 1 s expiry) after a longer manual extension.
                    let lease = manager
                        .lock(&k)
                        .auto_renew(INTERVAL)
                        .try_acquire()
                        .await
                        .unwrap();
                    lease.extend(LONG).await.unwrap();
                    let extended_until = lease.valid_until();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    // A renewal round with the expiry moves the lease's belief down to about 1 s.
                    while lease.valid_until() + Duration::from_secs(10) > extended_until {
                        assert!(Instant::now() < deadline, "{what}: no renewal ran");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    assert!(lease.is_held(), "{what}");
                    let left = pttl(&server, &k);
                    assert!(
                        left > FLOOR,
                        "{what} ({caps:?}): a renewal with {EXPIRY:?} shortened the key to {left} ms"
                    );
                    lease.release().await.unwrap();
                    assert_eq!(server.cmd(&["EXISTS", &k]), "0", "{what}");
                }
            }
        },
    );
}
