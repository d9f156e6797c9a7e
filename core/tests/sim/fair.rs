//! Fair locks (`Lock::fair`): waiters queue on the server and get the lock in arrival order; a waiter that
//! gives up leaves at once, one that died within its place's life; the queue is bounded.

use std::sync::{Arc, Mutex};

use redlease::{NodeErrorKind, PermitOp, RedisNode, Timer, Token, Ttl};
use redlease_testkit::MemoryNode;

use crate::support::*;

#[test]
fn waiters_get_a_fair_lock_in_arrival_order() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 141, config());
        let lock = c.manager.lock("printer").fair();
        let holder = c.try_acquire(&lock).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        // Six waiters arrive 10 ms apart, in an order unrelated to their ids' task order.
        for (k, id) in [3u64, 0, 5, 1, 4, 2].into_iter().enumerate() {
            let (lock, order, clock) = (lock.clone(), order.clone(), c.clock.clone());
            c.sim.spawn(async move {
                clock.sleep_until(clock.now() + ms(10 * k as u64 + 1)).await;
                let lease = lock.acquire_within(secs(60)).await.unwrap();
                order.lock().unwrap().push(id);
                clock.sleep_until(clock.now() + ms(50)).await;
                lease.release().await.unwrap();
            });
        }
        c.sim.run_for(secs(5));
        assert!(order.lock().unwrap().is_empty(), "held meanwhile");
        // A newcomer that tries the moment the holder releases, before any woken waiter runs, does not
        // barge in: the first in the queue is next.
        let newcomer = lock.clone();
        let barged = c.sim.block_on(async move {
            holder.release().await.unwrap();
            newcomer.try_acquire().await
        });
        assert!(
            barged.unwrap_err().is_contended(),
            "n={n}: a newcomer barged in"
        );
        c.sim.run_for(secs(5));
        assert_eq!(*order.lock().unwrap(), [3, 0, 5, 1, 4, 2], "n={n}");
    }
}

#[test]
fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let mut c = Cluster::new(1, 142, config());
    let lock = c.manager.lock("printer").fair();
    let holder = c.try_acquire(&lock).unwrap();
    // The first waiter gives up after 200 ms; the second waits on.
    let first = lock.clone();
    let r = c
        .sim
        .block_on(async move { first.acquire_within(ms(200)).await });
    assert!(r.unwrap_err().is_contended());
    let won = Arc::new(Mutex::new(None));
    c.sim.spawn({
        let (lock, won, clock) = (lock.clone(), won.clone(), c.clock.clone());
        async move {
            let lease = lock.acquire_within(secs(60)).await.unwrap();
            *won.lock().unwrap() = Some(clock.now());
            std::mem::forget(lease);
        }
    });
    c.sim.run_for(ms(10));
    let released = c.now();
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    c.sim.run_for(ms(100));
    let at = won.lock().unwrap().expect("the second waiter got it");
    assert!(
        at - released < ms(50),
        "not held up by the one that left: {:?}",
        at - released
    );
}

#[test]
fn a_dead_waiters_place_expires_within_twice_the_max_retry_delay() {
    let mut c = Cluster::new(1, 143, config());
    let lock = c.manager.lock("printer").fair();
    let holder = c.try_acquire(&lock).unwrap();
    // A waiter joins the queue, then its process dies: its future is dropped without a word.
    let dead = lock.clone();
    c.sim.block_on(async move {
        let mut wait = Box::pin(dead.acquire_within(secs(60)));
        std::future::poll_fn(|cx| {
            let _ = wait.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        std::mem::forget(wait);
    });
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    // First in the queue, the dead waiter keeps the lock from others until its place expires (2 s).
    let start = c.now();
    assert!(c.try_acquire(&lock).unwrap_err().is_contended());
    c.sim.run_for(secs(2) - (c.now() - start));
    assert!(c.try_acquire(&lock).is_ok(), "its place expired");
}

#[test]
fn a_full_queue_refuses_a_new_waiter_with_busy() {
    let node = MemoryNode::new();
    let ttl = Ttl::from_millis(60_000).unwrap();
    let op = PermitOp::AcquireFair {
        claim: Ttl::from_millis(2_000).unwrap(),
        queue: 2,
    };
    redlease_testkit::block_on(async {
        let holder = Token::random().unwrap();
        node.permit("q", &holder, ttl, op).await.unwrap();
        for _ in 0..2 {
            let waiter = Token::random().unwrap();
            assert!(node.permit("q", &waiter, ttl, op).await.is_ok());
        }
        let third = Token::random().unwrap();
        let e = node.permit("q", &third, ttl, op).await.unwrap_err();
        assert_eq!(e.kind(), NodeErrorKind::Busy);
        assert!(e.to_string().contains("queue is full"), "{e}");
    });
}

/// Four hostile clients (skewed clocks, pauses, late and reordered requests, every random fault) wait for a
/// fair lock on 1, 3 or 5 nodes, over 1000 seeds: never two holders, every loss by its deadline, and arrival
/// order kept for every waiter that stayed in the queue (`History::check_fifo` says what that means under
/// faults). `REDLEASE_FAIR_SEEDS` runs more seeds.
#[test]
fn a_fair_lock_never_has_two_holders_and_serves_in_arrival_order_under_hostile_faults() {
    let (mut total, mut compared) = (0, 0);
    let seeds = hostile_seeds("REDLEASE_FAIR_SEEDS", 1_000, |seed| {
        let mut c = hostile_cluster(seed);
        let history = redlease_testkit::History::new();
        let horizon = secs(8);
        let config = c.manager.config().clone();
        // A place lives twice max_retry_delay (at most the TTL) on the node's clock, which runs up to 0.6 %
        // fast: on the history's clock, a little less.
        let life = (config.max_retry_delay() * 2)
            .min(config.expiry())
            .mul_f64(0.99);
        for id in 0..4u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let manager =
                manager.with_observer(history.recorder(id).on_clock(clock.clone()).with_attempts());
            let lock = manager.lock("printer").fair();
            let mut rng = c.sim.rng();
            c.sim.client(id).spawn(async move {
                let end = clock.now() + horizon;
                while clock.now() < end {
                    let mut lock = lock.clone();
                    if rng.next_u64() % 2 == 0 {
                        lock = lock.auto_renew(ms(500));
                    }
                    match lock.acquire_within(ms(100 + rng.next_u64() % 2_000)).await {
                        Ok(lease) => {
                            hold_or_lost(&lease, &clock, ms(rng.next_u64() % 800)).await;
                            let _ = lease.release().await;
                        }
                        Err(_) => {
                            clock
                                .sleep_until(clock.now() + ms(1 + rng.next_u64() % 200))
                                .await
                        }
                    }
                }
            });
        }
        assert!(
            c.sim.run_until_idle(secs(120)),
            "seed {seed}: clients stuck"
        );
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        match history.check_fifo(life) {
            Ok(n) => compared += n,
            Err(v) => panic!("seed {seed}: {v}"),
        }
        total += history.acquisitions();
    });
    eprintln!(
        "fair: {seeds} seeds, {total} acquisitions, {compared} pairs compared for arrival order"
    );
    assert!(total > seeds as usize * 2, "only {total} acquisitions");
    assert!(
        compared > seeds as usize,
        "only {compared} pairs of waiters compared for arrival order"
    );
}

#[test]
fn fencing_a_fair_lock_or_a_reader_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(1, 144, config());
    let rw = c.manager.rw_lock("report");
    for lock in [
        c.manager.lock("printer").fair().fenced("printer:fence"),
        rw.read().clone().fenced("report:fence"),
    ] {
        assert!(matches!(
            c.try_acquire(&lock),
            Err(redlease::Error::Config(redlease::ConfigError::Semaphore(_)))
        ));
    }
    assert_eq!(c.calls(), 0);
}

/// Several waiters of one client: each release hands the lock to the head of the queue at once (its
/// notification reaches the head, not only some waiter that is not first), not after `max_retry_delay`.
#[test]
fn each_release_reaches_the_head_of_the_queue_among_one_clients_waiters() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 145, config());
        let lock = c.manager.lock("printer").fair();
        let holder = c.try_acquire(&lock).unwrap();
        let times = Arc::new(Mutex::new(Vec::new()));
        for k in 0..4u64 {
            let (lock, times, clock) = (lock.clone(), times.clone(), c.clock.clone());
            c.sim.spawn(async move {
                clock.sleep_until(clock.now() + ms(10 * k + 1)).await;
                let lease = lock.acquire_within(secs(60)).await.unwrap();
                let at = clock.now();
                clock.sleep_until(clock.now() + ms(10)).await;
                lease.release().await.unwrap();
                times.lock().unwrap().push((at, clock.now()));
            });
        }
        c.sim.run_for(ms(100));
        let released = c.now();
        c.sim
            .block_on(async move { holder.release().await })
            .unwrap();
        c.sim.run_for(secs(5));
        let times = times.lock().unwrap().clone();
        assert_eq!(times.len(), 4, "n={n}");
        // Four holds of 10 ms, each handed on by a notification: far less than one max_retry_delay (1 s).
        let last = times.iter().map(|t| t.1).max().unwrap();
        assert!(
            last - released < ms(100),
            "n={n}: four 10 ms holds took {:?} after the first release",
            last - released
        );
    }
}

/// Eight tasks of one client take turns on a fair lock (as the benchmark's FAIR row): every handoff follows
/// the release's notification, so in two seconds of 1 ms holds there are hundreds, not a few (one per
/// `max_retry_delay`).
#[test]
fn eight_tasks_of_one_client_take_turns_promptly() {
    let mut c = Cluster::new(1, 146, config());
    let lock = c.manager.lock("printer").fair();
    let handoffs = Arc::new(Mutex::new(0u64));
    let end = c.now() + secs(2);
    for _ in 0..8 {
        let (lock, handoffs, clock) = (lock.clone(), handoffs.clone(), c.clock.clone());
        c.sim.spawn(async move {
            while clock.now() < end {
                let Ok(lease) = lock.acquire_within(secs(2)).await else {
                    continue;
                };
                *handoffs.lock().unwrap() += 1;
                clock.sleep_until(clock.now() + ms(1)).await;
                lease.release().await.unwrap();
            }
        });
    }
    c.sim.run_for(secs(3));
    let handoffs = *handoffs.lock().unwrap();
    assert!(handoffs > 500, "{handoffs} handoffs in 2 s");
}

/// The waiter a release notification reaches first is not always the head of the queue: here the waiter
/// registered first lost its first attempt (an error) and queued behind a later one. The head must still be
/// woken by the release (every waiter of a fair lock is woken), not after `max_retry_delay`.
#[test]
fn a_release_reaches_the_head_even_when_it_is_not_the_first_registered_waiter() {
    let mut c = Cluster::new(1, 147, config());
    let lock = c.manager.lock("printer").fair();
    let holder = c.try_acquire(&lock).unwrap();
    c.faults[0].script(
        redlease_testkit::Op::Acquire,
        [redlease_testkit::Fault::Fail(NodeErrorKind::Connection)],
    );
    let won = Arc::new(Mutex::new(Vec::new()));
    for (k, name) in ["first registered", "head"].into_iter().enumerate() {
        let (lock, won, clock) = (lock.clone(), won.clone(), c.clock.clone());
        c.sim.spawn(async move {
            clock.sleep_until(clock.now() + ms(10 * k as u64 + 1)).await;
            let lease = lock.acquire_within(secs(60)).await.unwrap();
            won.lock().unwrap().push((name, clock.now()));
            clock.sleep_until(clock.now() + ms(10)).await;
            lease.release().await.unwrap();
        });
    }
    c.sim.run_for(ms(500));
    let released = c.now();
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    c.sim.run_for(secs(5));
    let won = won.lock().unwrap().clone();
    assert_eq!(won.len(), 2);
    assert_eq!(won[0].0, "head", "the queue's order");
    assert!(
        won[0].1 - released < ms(50),
        "the head got the lock {:?} after the release",
        won[0].1 - released
    );
}
