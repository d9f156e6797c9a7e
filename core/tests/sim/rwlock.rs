//! Read/write locks (`LockManager::rw_lock`): readers share, a writer excludes everyone, a waiting writer
//! holds new readers off, and a writer's claim outlives its waiting by at most its TTL.

use std::sync::{Arc, Mutex};

use redlease::Timer;
use redlease_testkit::History;

use crate::support::*;

#[test]
fn readers_share_and_a_writer_excludes_everyone() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 121, config());
        let rw = c.manager.rw_lock("report");
        let readers: Vec<_> = (0..3)
            .map(|_| c.try_acquire(rw.read()).expect("readers share"))
            .collect();
        let e = c.try_acquire(rw.write()).unwrap_err();
        assert!(e.is_contended(), "n={n}: {e}");
        for r in readers {
            c.sim.block_on(async move { r.release().await }).unwrap();
        }
        let writer = c.try_acquire(rw.write()).expect("the readers left");
        assert!(
            c.try_acquire(rw.read()).unwrap_err().is_contended(),
            "n={n}"
        );
        assert!(
            c.try_acquire(rw.write()).unwrap_err().is_contended(),
            "n={n}"
        );
        c.sim
            .block_on(async move { writer.release().await })
            .unwrap();
        // The first writer attempt gave up and withdrew its claim: readers are welcome again.
        assert!(c.try_acquire(rw.read()).is_ok(), "n={n}");
    }
}

#[test]
fn a_waiting_writer_holds_new_readers_off_and_goes_next() {
    let mut c = Cluster::new(1, 122, config());
    let rw = c.manager.rw_lock("report");
    let first = c.try_acquire(rw.read()).unwrap();
    let clock = c.clock.clone();
    let won = Arc::new(Mutex::new(None));
    c.sim.spawn({
        let (rw, won) = (rw.clone(), won.clone());
        async move {
            let r = rw.write().acquire_within(secs(60)).await;
            *won.lock().unwrap() = Some((r, clock.now()));
        }
    });
    c.sim.run_for(ms(10));
    // The writer waits; a new reader is turned away although only readers hold the lock.
    assert!(won.lock().unwrap().is_none());
    assert!(c.try_acquire(rw.read()).unwrap_err().is_contended());
    let released = c.now();
    c.sim
        .block_on(async move { first.release().await })
        .unwrap();
    c.sim.run_for(ms(100));
    let (r, at) = won.lock().unwrap().take().expect("the writer went next");
    let writer = r.unwrap();
    assert!(at - released < ms(50), "woken {:?} after", at - released);
    c.sim
        .block_on(async move { writer.release().await })
        .unwrap();
    assert!(
        c.try_acquire(rw.read()).is_ok(),
        "the claim left with the writer"
    );
}

#[test]
fn a_writer_that_gave_up_withdraws_its_claim_and_one_that_died_holds_readers_off_at_most_2_s() {
    let mut c = Cluster::new(1, 123, config());
    let rw = c.manager.rw_lock("report").expiry(secs(30));
    let reader = c.try_acquire(rw.read()).unwrap();
    // A writer that tries once and gives up withdraws its claim at once.
    assert!(c.try_acquire(rw.write()).unwrap_err().is_contended());
    assert!(c.try_acquire(rw.read()).is_ok());
    // One that dies while waiting leaves its claim: 2 × max_retry_delay (2 s), not its 30 s TTL.
    let writer = rw.write().clone();
    c.sim.block_on(async move {
        let mut wait = Box::pin(writer.acquire_within(secs(60)));
        std::future::poll_fn(|cx| {
            let _ = wait.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        std::mem::forget(wait);
    });
    let start = c.now();
    c.sim
        .block_on(async move { reader.release().await })
        .unwrap();
    assert!(c.try_acquire(rw.read()).unwrap_err().is_contended());
    c.sim.run_for(secs(2) - ms(1) - (c.now() - start));
    assert!(c.try_acquire(rw.read()).unwrap_err().is_contended());
    c.sim.run_for(ms(1));
    assert!(c.try_acquire(rw.read()).is_ok(), "the claim expired");
}

#[test]
fn a_writer_waiting_longer_than_its_claim_keeps_readers_off_until_it_gets_the_lock() {
    let mut c = Cluster::new(1, 124, config());
    let rw = c.manager.rw_lock("report");
    let reader = c.try_acquire(rw.read()).unwrap();
    let won = Arc::new(Mutex::new(false));
    c.sim.spawn({
        let (rw, won) = (rw.clone(), won.clone());
        async move {
            let lease = rw.write().acquire_within(secs(60)).await.unwrap();
            *won.lock().unwrap() = true;
            std::mem::forget(lease);
        }
    });
    // Ten claim lifetimes: the waiting writer refreshes its claim each time.
    for _ in 0..10 {
        c.sim.run_for(secs(2));
        assert!(c.try_acquire(rw.read()).unwrap_err().is_contended());
    }
    c.sim
        .block_on(async move { reader.release().await })
        .unwrap();
    c.sim.run_for(ms(100));
    assert!(*won.lock().unwrap());
}

/// Readers and writers from four hostile clients (skewed clocks, pauses, late and reordered requests, every
/// random fault), on 1, 3 or 5 nodes: a writer never overlaps anyone. `REDLEASE_RW_SEEDS` runs more.
#[test]
fn readers_and_writers_never_overlap_under_hostile_faults() {
    let (mut reads, mut writes) = (0, 0);
    let seeds = hostile_seeds("REDLEASE_RW_SEEDS", 1_000, |seed| {
        let mut c = hostile_cluster(seed);
        let history = History::new();
        let horizon = secs(8);
        // Clients 0 and 1 read, 2 and 3 write.
        for id in 0..4u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let rw = manager.rw_lock("report");
            let mut rng = c.sim.rng();
            c.sim.client(id).spawn(async move {
                let end = clock.now() + horizon;
                while clock.now() < end {
                    let mut lock = if id >= 2 {
                        rw.write().clone()
                    } else {
                        rw.read().clone()
                    };
                    if rng.next_u64() % 2 == 0 {
                        lock = lock.auto_renew(ms(500));
                    }
                    match lock.acquire_within(ms(100 + rng.next_u64() % 1_500)).await {
                        Ok(lease) => {
                            hold_or_lost(&lease, &clock, ms(rng.next_u64() % 1_200)).await;
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
        if let Err(v) = history.check_readers_writers(|client| client >= 2) {
            panic!("seed {seed}: {v}");
        }
        for e in history.events() {
            if matches!(e.kind, redlease_testkit::EventKind::Acquired { .. }) {
                if e.client >= 2 {
                    writes += 1;
                } else {
                    reads += 1;
                }
            }
        }
    });
    assert!(
        reads > seeds as usize && writes > seeds as usize / 2,
        "reads {reads}, writes {writes}"
    );
}

#[test]
fn a_fenced_writer_takes_a_larger_fence_each_time_and_readers_take_none() {
    let mut c = Cluster::new(1, 125, config());
    let rw = c.manager.rw_lock("report:{7}").fenced("report:{7}:fence");
    let first = c.try_acquire(rw.write()).unwrap();
    assert_eq!(first.fencing_token(), Some(1));
    // Blocked attempts (a reader, a second writer) never move the counter.
    assert!(c.try_acquire(rw.read()).unwrap_err().is_contended());
    assert!(c.try_acquire(rw.write()).unwrap_err().is_contended());
    assert_eq!(
        c.nodes[0].get("report:{7}:fence").as_deref(),
        Some(&b"1"[..])
    );
    c.sim
        .block_on(async move { first.release().await })
        .unwrap();
    let reader = c.try_acquire(rw.read()).unwrap();
    assert_eq!(reader.fencing_token(), None, "readers are not fenced");
    c.sim
        .block_on(async move { reader.release().await })
        .unwrap();
    let second = c.try_acquire(rw.write()).unwrap();
    assert_eq!(second.fencing_token(), Some(2));
    // An extension keeps the number.
    c.sim.block_on(second.extend(secs(10))).unwrap();
    assert_eq!(second.fencing_token(), Some(2));
    c.sim
        .block_on(async move { second.release().await })
        .unwrap();
    c.assert_every_lock_key_has_ttl();
}

#[test]
fn fencing_a_redlock_writer_is_refused_before_sending() {
    // Readers and fair locks: `fair::fencing_a_fair_lock_or_a_reader_is_refused_before_anything_is_sent`.
    let mut r = Cluster::new(3, 127, config());
    let rw = r.manager.rw_lock("report:{7}").fenced("report:{7}:fence");
    let e = r.try_acquire(rw.write()).unwrap_err();
    assert!(matches!(e, redlease::Error::FencingUnsupported), "{e}");
    assert_eq!(r.calls(), 0);
}

/// Fenced writers beside readers under every hostile condition (single mode: fencing is single-mode only):
/// no overlap, the writers' fences strictly increase in grant order, every writer has one and no reader
/// does. `REDLEASE_RW_SEEDS` runs more.
#[test]
fn fenced_writers_fences_strictly_increase_under_hostile_faults() {
    let mut writes = 0;
    hostile_seeds("REDLEASE_RW_SEEDS", 1_000, |seed| {
        let config = config()
            .with_expiry(secs(2))
            .with_retry_delay(ms(50))
            .with_jitter_seed(seed);
        let mut c = Cluster::hostile(1, seed, config);
        let history = History::new();
        let horizon = secs(8);
        for id in 0..4u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let rw = manager.rw_lock("report:{1}").fenced("report:{1}:fence");
            let mut rng = c.sim.rng();
            c.sim.client(id).spawn(async move {
                let end = clock.now() + horizon;
                while clock.now() < end {
                    let mut lock = if id >= 2 {
                        rw.write().clone()
                    } else {
                        rw.read().clone()
                    };
                    if rng.next_u64() % 2 == 0 {
                        lock = lock.auto_renew(ms(500));
                    }
                    match lock.acquire_within(ms(100 + rng.next_u64() % 1_500)).await {
                        Ok(lease) => {
                            assert_eq!(lease.fencing_token().is_some(), id >= 2, "seed {seed}");
                            hold_or_lost(&lease, &clock, ms(rng.next_u64() % 1_200)).await;
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
        if let Err(v) = history.check_readers_writers(|client| client >= 2) {
            panic!("seed {seed}: {v}");
        }
        for e in history.events() {
            if let redlease_testkit::EventKind::Acquired { fence, .. } = e.kind {
                assert_eq!(fence.is_some(), e.client >= 2, "seed {seed}");
                writes += usize::from(e.client >= 2);
            }
        }
    });
    assert!(writes > 300, "writes {writes}");
}

/// Readers of one client waiting for a writer all get in when it releases (the notification reaches each),
/// and a writer waiting for readers gets in when the last one leaves, not after `max_retry_delay`.
#[test]
fn a_release_wakes_every_waiting_reader_and_the_waiting_writer_of_a_client() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 128, config());
        let rw = c.manager.rw_lock("report");
        let writer = c.try_acquire(rw.write()).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..3 {
            let (rw, got, clock) = (rw.clone(), got.clone(), c.clock.clone());
            c.sim.spawn(async move {
                let lease = rw.read().acquire_within(secs(60)).await.unwrap();
                got.lock().unwrap().push(clock.now());
                clock.sleep_until(clock.now() + ms(10)).await;
                lease.release().await.unwrap();
            });
        }
        c.sim.run_for(ms(100));
        let released = c.now();
        c.sim
            .block_on(async move { writer.release().await })
            .unwrap();
        c.sim.run_for(ms(200));
        let got = got.lock().unwrap().clone();
        assert_eq!(got.len(), 3, "n={n}: readers in after the writer left");
        for at in &got {
            assert!(
                *at - released < ms(50),
                "n={n}: a reader got in {:?} after",
                *at - released
            );
        }
    }
}
