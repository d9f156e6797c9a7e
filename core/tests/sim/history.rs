use std::time::Duration;

use redlease::Timer;
use redlease::machine::Jitter;
use redlease_testkit::{EventKind, History, RandomFaults, VirtualClock, for_each_seed};

use crate::support::*;

/// Races `fut` against a sleep of `after` on `clock`: `None` if the sleep won (and `fut` was dropped there,
/// wherever it was).
async fn cancel_after<F: std::future::Future>(
    fut: F,
    clock: &impl Timer,
    after: Duration,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut timer = clock.sleep_until(clock.now() + after);
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(v));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Works for `d` while watching the lease (a careful holder); `false` if the lease was lost meanwhile.
async fn hold_for(lease: &redlease::Lease, clock: &impl Timer, d: Duration) -> bool {
    let signal = lease.lost();
    cancel_after(signal, clock, d).await.is_none()
}

/// Extends `lease` to `ttl`; one time in three the extension is cancelled (dropped) within its first
/// 60 ms, wherever it was: a caller's timeout or `select!` around `Lease::extend`.
async fn extend_or_cancel(
    lease: &redlease::Lease,
    ttl: Duration,
    clock: &impl Timer,
    rng: &mut Jitter,
) {
    if rng.next_u64() % 3 == 0 {
        let after = ms(rng.next_u64() % 60);
        let _ = cancel_after(lease.extend(ttl), clock, after).await;
    } else {
        let _ = lease.extend(ttl).await;
    }
}

/// One hostile client: every way of holding a lease, chosen at random per acquisition — background
/// renewal, renewal inside `run` (whose work may end while a renewal is in flight), manual extensions
/// longer and shorter than the expiry, cancelled or not — and every way of ending one: release, drop, an
/// acquisition or a release cancelled mid-way.
pub(crate) async fn renewing_client(
    lock: redlease::Lock,
    clock: redlease_testkit::SkewedClock,
    mut rng: Jitter,
    horizon: Duration,
) {
    let end = clock.now() + horizon;
    while clock.now() < end {
        let renew = rng.next_u64() % 3 != 0;
        let mut lock = lock.clone();
        if renew {
            lock = lock.auto_renew(ms(400 + rng.next_u64() % 400));
        }
        // Sometimes the acquisition itself is cancelled at a random point.
        let patience = ms(200 + rng.next_u64() % 2_000);
        let cancel_at = ms(rng.next_u64() % 600);
        let acquired = if rng.next_u64() % 5 == 0 {
            cancel_after(lock.acquire_within(patience), &clock, cancel_at).await
        } else {
            Some(lock.acquire_within(patience).await)
        };
        let Some(Ok(lease)) = acquired else {
            let d = ms(1 + rng.next_u64() % 300);
            clock.sleep_until(clock.now() + d).await;
            continue;
        };
        match rng.next_u64() % 3 {
            // Hold with whatever renews it (background renewal if the lock renews, else nothing).
            0 => {
                let _ = hold_for(&lease, &clock, ms(rng.next_u64() % 4_000)).await;
            }
            // Work inside `run` (which renews when the lock does), with manual extensions on the way.
            1 => {
                let ttls: Vec<Duration> = (0..rng.next_u64() % 3)
                    .map(|_| ms(300 + rng.next_u64() % 3_000))
                    .collect();
                let nap = ms(1 + rng.next_u64() % 1_500);
                let mut inner = Jitter::from_seed(rng.next_u64());
                let _ = lease
                    .run(async {
                        for ttl in &ttls {
                            clock.sleep_until(clock.now() + nap).await;
                            extend_or_cancel(&lease, *ttl, &clock, &mut inner).await;
                        }
                        clock.sleep_until(clock.now() + nap).await;
                    })
                    .await;
            }
            // Manual extensions while watching the lease, no `run`.
            _ => {
                for _ in 0..rng.next_u64() % 3 {
                    if !hold_for(&lease, &clock, ms(rng.next_u64() % 1_200)).await {
                        break;
                    }
                    let ttl = ms(300 + rng.next_u64() % 3_000);
                    extend_or_cancel(&lease, ttl, &clock, &mut rng).await;
                }
            }
        }
        match rng.next_u64() % 4 {
            0 => drop(lease),
            1 => {
                let after = ms(rng.next_u64() % 100);
                let _ = cancel_after(lease.release(), &clock, after).await;
            }
            _ => {
                let _ = lease.release().await;
            }
        }
    }
}

/// Three clients on their own skewed clocks, paused at random, against `n` nodes on skewed clocks with every
/// random fault (late and reordered requests included), for `horizon`; the history comes from the core's
/// event hook only.
fn renewing_history(seed: u64, horizon: Duration) -> History {
    let n = [1usize, 3, 5][(seed % 3) as usize];
    let config = config()
        .with_expiry(secs(2))
        .with_retry_delay(ms(50))
        .with_jitter_seed(seed);
    let mut c = Cluster::hostile(n, seed, config);
    let history = History::new();
    for id in 0..3u64 {
        let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
        let mut lock = manager.lock("r");
        if n == 1 {
            lock = lock.fenced("r:fence");
        }
        let rng = c.sim.rng();
        c.sim
            .client(id)
            .spawn(renewing_client(lock, clock, rng, horizon));
    }
    assert!(
        c.sim.run_until_idle(secs(120)),
        "seed {seed}: clients stuck"
    );
    c.assert_every_lock_key_has_ttl();
    history
}

#[test]
fn renewing_releasing_dropping_and_cancelled_leases_never_overlap_over_1000_hostile_seeds() {
    let mut total = 0;
    let mut extensions = 0;
    for_each_seed(0..1000, |seed| {
        let history = renewing_history(seed, secs(8));
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        total += history.acquisitions();
        extensions += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Extended { .. }))
            .count();
    });
    // Liveness floor, and proof that renewals reached the history through the hook.
    assert!(total > 5_000, "only {total} acquisitions over 1000 seeds");
    assert!(extensions > 5_000, "only {extensions} extensions recorded");
}

/// One client: acquires, works for a few rounds with manual extensions (longer and shorter than the expiry),
/// then releases. Everything it believes reaches the history through the manager's observer.
async fn client(lock: redlease::Lock, clock: VirtualClock, mut rng: Jitter, horizon: Duration) {
    let start = clock.now();
    let pause = |rng: &mut Jitter, max_ms: u64| ms(rng.next_u64() % max_ms + 1);
    while clock.now() - start < horizon {
        let lease = match lock.acquire_within(secs(3)).await {
            Ok(lease) => lease,
            Err(_) => {
                let d = pause(&mut rng, 500);
                clock.sleep_until(clock.now() + d).await;
                continue;
            }
        };
        let rounds = rng.next_u64() % 5;
        let nap = pause(&mut rng, 2_500);
        let ttls: Vec<Duration> = (0..rounds)
            .map(|_| ms(500 + rng.next_u64() % 3_000))
            .collect();
        let work = async {
            for ttl in &ttls {
                clock.sleep_until(clock.now() + nap).await;
                if lease.extend(*ttl).await.is_err() {
                    return;
                }
            }
        };
        let _ = lease.run(work).await;
        let _ = lease.release().await;
    }
}

/// Runs `clients` clients against `n` faulty nodes for `horizon` of virtual time and returns their history.
fn simulate(seed: u64, n: usize, clients: u64, horizon: Duration) -> History {
    let config = config()
        .with_expiry(secs(2))
        .with_retry_delay(ms(50))
        .with_jitter_seed(seed);
    let mut c = Cluster::new(n, seed, config);
    for (i, f) in c.faults.iter().enumerate() {
        f.random(RandomFaults::new(seed * 7 + i as u64, 0.05, 0.02, 0.05, ms(30)).slow_reply(0.02));
    }
    let history = History::new();
    c.manager = c.manager.clone().with_observer(history.clone());
    let mut lock = c.manager.lock("resource");
    if n == 1 {
        lock = lock.fenced("resource:fence");
    }
    for id in 0..clients {
        let rng = c.sim.rng();
        let _ = id;
        c.sim
            .spawn(client(lock.clone(), c.clock.clone(), rng, horizon));
    }
    assert!(
        c.sim.run_until_idle(secs(120)),
        "seed {seed}: clients did not finish"
    );
    history
}

#[test]
fn history_checker_finds_no_overlap_over_500_seeds_with_random_faults() {
    let mut total = 0;
    for_each_seed(0..500, |seed| {
        let n = [1usize, 3, 5][(seed % 3) as usize];
        let clients = 2 + Jitter::from_seed(seed).next_u64() % 4;
        let history = simulate(seed, n, clients, secs(30));
        if let Err(v) = history.check() {
            let events = history.events();
            let tail: Vec<_> = events.iter().rev().take(12).collect();
            panic!("seed {seed}: {v}\nlast events: {tail:#?}");
        }
        assert!(
            history.acquisitions() > 0,
            "seed {seed}: nobody ever acquired"
        );
        total += history.acquisitions();
    });
    assert!(total > 5_000, "only {total} acquisitions over 500 seeds");
}

#[test]
fn history_checker_catches_an_unsafe_lock() {
    // A "lock" that ignores the server: both clients believe they hold it at once. The checker must object.
    let history = History::new();
    let clock = VirtualClock::new();
    let t0 = clock.now();
    history.record(
        1,
        "r",
        t0,
        EventKind::Acquired {
            valid_until: t0 + secs(2),
            fence: Some(1),
        },
    );
    history.record(
        2,
        "r",
        t0 + secs(1),
        EventKind::Acquired {
            valid_until: t0 + secs(3),
            fence: Some(2),
        },
    );
    assert!(history.check().is_err());
}

/// One seed's history, with instants made relative to the first event so two runs can be compared.
fn replay(seed: u64) -> Vec<String> {
    let history = simulate(seed, 3, 4, secs(20));
    let events = history.events();
    let origin = events.iter().map(|e| e.at).min().unwrap();
    let rel = |t: std::time::Instant| t.saturating_duration_since(origin);
    // Lease ids are unique in the process, not per run: number them by first appearance.
    let mut ids: Vec<u64> = Vec::new();
    for e in &events {
        if !ids.contains(&e.client) {
            ids.push(e.client);
        }
    }
    let client = |c: u64| ids.iter().position(|&i| i == c).unwrap();
    events
        .iter()
        .map(|e| {
            let kind = match &e.kind {
                EventKind::Acquired { valid_until, fence } => {
                    format!("acquired until {:?} fence {fence:?}", rel(*valid_until))
                }
                EventKind::Extended { valid_until } => {
                    format!("extended until {:?}", rel(*valid_until))
                }
                other => format!("{other:?}"),
            };
            format!("{:?} client {} {kind}", rel(e.at), client(e.client))
        })
        .collect()
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 99] {
        let first = replay(seed);
        assert!(first.len() > 20, "seed {seed}: too few events to compare");
        assert_eq!(first, replay(seed), "seed {seed} is not deterministic");
    }
    assert_ne!(replay(3), replay(99));
}
