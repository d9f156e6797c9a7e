//! Handing a held lease to another process (`Lease::handoff` → `LeaseTicket` → `Lock::resume`).

use redlease::{
    Config, ConfigError, Error, LeaseState, LeaseTicket, LockManager, LossReason, Timer,
};
use std::time::Duration;

use redlease_testkit::{History, Op};

use crate::support::*;

/// Another process's manager over the same nodes (no fault wrappers, its own engine).
fn worker(c: &Cluster, config: Config) -> LockManager {
    if c.nodes.len() == 1 {
        LockManager::single(c.nodes[0].clone(), config)
    } else {
        LockManager::redlock(c.nodes.clone(), config)
    }
    .unwrap()
    .with_timer(c.clock.clone())
}

#[test]
fn a_lease_handed_off_through_text_is_resumed_elsewhere_with_validity_from_the_resuming_round() {
    for (n, fenced) in [(1, false), (1, true), (3, false)] {
        let mut c = Cluster::new(n, 81, config());
        let history = History::new();
        let dispatcher = c.manager.clone().with_observer(history.recorder(1));
        let w = worker(&c, config()).with_observer(history.recorder(2));
        let mut lock = dispatcher.lock("job").expiry(secs(30));
        let mut wlock = w.lock("job").expiry(secs(20));
        if fenced {
            lock = lock.fenced("job:fence");
            wlock = wlock.fenced("job:fence");
        }
        let lease = c.try_acquire(&lock).unwrap();
        let token = lease.token().as_str().to_owned();
        let fence = lease.fencing_token();
        let signal = lease.lost();
        c.sim.run_for(secs(10));
        let releases = c.faults[0].calls(Op::Release);
        let wire = lease.handoff().unwrap().encode();
        assert!(wire.contains(&token), "the text carries the token");
        // The handing side ends at once, without deleting anything.
        assert_eq!(c.sim.block_on(signal), LossReason::Released);
        assert_eq!(c.holders("job", &token).len(), n);
        c.sim.run_for(secs(5));
        assert_eq!(c.faults[0].calls(Op::Release), releases, "nothing released");

        let ticket: LeaseTicket = wire.parse().unwrap();
        assert_eq!(ticket.key(), "job");
        assert_eq!(ticket.fencing_token(), fence);
        let resumed_at = c.now();
        let resumed = c
            .sim
            .block_on(async move { wlock.resume(&ticket).await })
            .unwrap();
        assert_eq!(resumed.token().as_str(), token);
        assert_eq!(resumed.fencing_token(), fence, "the fence is kept");
        // Validity from the resuming round with the worker's 20 s TTL (zero latency): not the 30 s lease's
        // deadline, which would be 15 s from now.
        let drift = secs(20) / 100 + ms(2);
        assert_eq!(resumed.valid_until(), resumed_at + secs(20) - drift);
        assert_eq!(resumed.state(), LeaseState::Held);
        // The worker's TTL is on the nodes now.
        for node in &c.nodes {
            assert_eq!(node.pttl("job").flatten(), Some(secs(20)), "n={n}");
        }
        c.sim
            .block_on(async move { resumed.release().await })
            .unwrap();
        assert!(c.holders("job", &token).is_empty());
        assert_eq!(history.check(), Ok(()), "n={n} fenced={fenced}");
    }
}

#[test]
fn a_resumed_lease_is_renewed_with_the_resuming_locks_settings() {
    let mut c = Cluster::new(3, 82, config());
    let lease = c
        .try_acquire(&c.manager.lock("job").expiry(secs(3)))
        .unwrap();
    let ticket = lease.handoff().unwrap();
    let w = worker(&c, config());
    let lock = w.lock("job").expiry(secs(3)).renew_every(secs(1));
    let clock = c.clock.clone();
    let (kept, state) = c.sim.block_on(async move {
        let lease = lock.resume(&ticket).await.unwrap();
        let kept = lease
            .run(async {
                clock.sleep_until(clock.now() + secs(30)).await;
            })
            .await;
        let state = lease.state();
        lease.release().await.unwrap();
        (kept, state)
    });
    assert!(kept.is_ok(), "renewed through 10 TTLs: {kept:?}");
    assert_eq!(state, LeaseState::Held);
}

#[test]
fn resuming_a_ticket_whose_key_expired_or_was_taken_fails_as_not_held() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 83, config());
        let lease = c
            .try_acquire(&c.manager.lock("job").expiry(secs(2)))
            .unwrap();
        let ticket = lease.handoff().unwrap();
        c.sim.run_for(secs(3));
        let w = worker(&c, config());
        let lock = w.lock("job").expiry(secs(2));
        let r = c.sim.block_on({
            let lock = lock.clone();
            let ticket = ticket.clone();
            async move { lock.resume(&ticket).await }
        });
        assert!(
            matches!(
                r,
                Err(Error::Lost {
                    reason: LossReason::NotHeld,
                    ..
                })
            ),
            "n={n}: expired: {r:?}"
        );
        // Taken by someone else meanwhile: refused, and the new holder's key is untouched.
        let other = c
            .try_acquire(&c.manager.lock("job").expiry(secs(30)))
            .unwrap();
        let r = c.sim.block_on(async move { lock.resume(&ticket).await });
        assert!(
            matches!(
                r,
                Err(Error::Lost {
                    reason: LossReason::NotHeld,
                    ..
                })
            ),
            "n={n}: taken: {r:?}"
        );
        assert_eq!(c.holders("job", other.token().as_str()).len(), n);
        for node in &c.nodes {
            assert_eq!(node.pttl("job").flatten(), Some(secs(30)));
        }
    }
}

#[test]
fn a_ticket_that_does_not_fit_the_lock_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(1, 84, config());
    let ticket = c
        .try_acquire(&c.manager.lock("job").fenced("job:fence"))
        .unwrap()
        .handoff()
        .unwrap();
    let single = worker(&c, config());
    let three = Cluster::new(3, 84, config());
    let redlock = worker(&three, config());
    let calls = c.calls();
    for (lock, why) in [
        (single.lock("other").fenced("job:fence"), "another key"),
        (single.lock("job"), "fenced"),
        (redlock.lock("job"), "mode"),
    ] {
        let r = c.sim.block_on({
            let ticket = ticket.clone();
            async move { lock.resume(&ticket).await }
        });
        match r {
            Err(Error::Config(ConfigError::TicketMismatch(_))) => {}
            other => panic!("{why}: {other:?}"),
        }
    }
    assert_eq!(c.calls(), calls, "nothing was sent");
    assert!(
        "redlease-ticket-v1.s.-.0.0.zz.6a6f62"
            .parse::<LeaseTicket>()
            .is_err()
    );
}

#[test]
fn a_lost_lease_cannot_be_handed_off() {
    let mut c = Cluster::with_spawner(1, 85, config());
    let lease = c
        .try_acquire(&c.manager.lock("job").expiry(secs(2)))
        .unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(secs(2));
    match lease.handoff() {
        Err(Error::Lost {
            reason: LossReason::Expired,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    c.sim.run_for(ms(10));
    assert!(c.holders("job", &token).is_empty());
}

#[test]
fn a_resumed_lease_has_its_own_hold_limit_counted_from_the_resumption() {
    let mut c = Cluster::new(1, 86, config());
    let ticket = c
        .try_acquire(&c.manager.lock("job"))
        .unwrap()
        .handoff()
        .unwrap();
    c.sim.run_for(secs(5));
    let w = worker(&c, config());
    let lock = w.lock("job").max_hold(secs(4));
    let start = c.now();
    let lease = c
        .sim
        .block_on(async move { lock.resume(&ticket).await })
        .unwrap();
    assert_eq!(lease.valid_until(), start + secs(4));
    assert_eq!(c.sim.block_on(lease.lost()), LossReason::HoldLimit);
}

/// Found by the hostile handoff run (seed 187): a Redlock lease won without node 2 writes its key there in
/// the background (repair); a repair round still running when the lease was handed off deleted the key
/// again when it ended ("the lease ended"), under the resumed lease.
#[test]
fn a_repair_running_at_handoff_leaves_the_key_to_the_resumed_lease() {
    let mut c = Cluster::with_spawner(3, 87, config());
    c.faults[2].script(
        Op::Acquire,
        [
            redlease_testkit::Fault::Fail(redlease::NodeErrorKind::Connection),
            redlease_testkit::Fault::SlowReply(ms(50)),
        ],
    );
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(ms(10));
    assert_eq!(
        c.holders("job", &token),
        vec![0, 1, 2],
        "the repair wrote node 2"
    );
    let ticket = lease.handoff().unwrap();
    let w = worker(&c, config());
    let lock = w.lock("job");
    let resumed = c
        .sim
        .block_on(async move { lock.resume(&ticket).await })
        .unwrap();
    c.sim.run_for(ms(200));
    assert_eq!(
        c.holders("job", &token),
        vec![0, 1, 2],
        "nothing of the handed-off lease deleted the key"
    );
    assert!(resumed.is_held());
}

/// Tickets waiting for a client to resume them, as text (what a queue between processes would carry).
type Mailbox = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// One hostile client that hands leases to the others: it resumes a waiting ticket when there is one (else
/// acquires), holds the lease for a while — renewed in the background or not, with a hold limit or not —
/// and then releases it, drops it, or hands it off into the mailbox.
async fn handing_client(
    lock: redlease::Lock,
    clock: redlease_testkit::SkewedClock,
    mut rng: redlease::machine::Jitter,
    horizon: Duration,
    mailbox: Mailbox,
) {
    let end = clock.now() + horizon;
    while clock.now() < end {
        let mut lock = lock.clone();
        if rng.next_u64() % 2 == 0 {
            lock = lock.auto_renew(ms(400 + rng.next_u64() % 400));
        }
        if rng.next_u64() % 4 == 0 {
            lock = lock.max_hold(ms(300 + rng.next_u64() % 3_000));
        }
        let waiting = mailbox.lock().unwrap().pop();
        let got = match waiting {
            Some(text) => {
                let ticket: LeaseTicket = text.parse().unwrap();
                lock.resume(&ticket).await
            }
            None => lock.acquire_within(ms(200 + rng.next_u64() % 2_000)).await,
        };
        let Ok(lease) = got else {
            clock
                .sleep_until(clock.now() + ms(1 + rng.next_u64() % 300))
                .await;
            continue;
        };
        let signal = lease.lost();
        let hold = ms(rng.next_u64() % 2_500);
        let mut sleep = clock.sleep_until(clock.now() + hold);
        let mut signal = std::pin::pin!(signal);
        std::future::poll_fn(|cx| {
            if signal.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
            sleep.as_mut().poll(cx)
        })
        .await;
        match rng.next_u64() % 3 {
            0 => {
                if let Ok(ticket) = lease.handoff() {
                    mailbox.lock().unwrap().push(ticket.encode());
                }
            }
            1 => drop(lease),
            _ => {
                let _ = lease.release().await;
            }
        }
    }
}

fn handoff_history(seed: u64, horizon: Duration) -> History {
    let n = [1usize, 3, 5][(seed % 3) as usize];
    let config = config()
        .with_expiry(secs(2))
        .with_retry_delay(ms(50))
        .with_jitter_seed(seed);
    let mut c = Cluster::hostile(n, seed, config);
    let history = History::new();
    let mailbox = Mailbox::default();
    for id in 0..3u64 {
        let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
        let mut lock = manager.lock("h");
        if n == 1 {
            lock = lock.fenced("h:fence");
        }
        let rng = c.sim.rng();
        c.sim
            .client(id)
            .spawn(handing_client(lock, clock, rng, horizon, mailbox.clone()));
    }
    assert!(
        c.sim.run_until_idle(secs(120)),
        "seed {seed}: clients stuck"
    );
    c.assert_every_lock_key_has_ttl();
    history
}

/// Leases handed between three hostile clients (skewed clocks, pauses, late and reordered requests, every
/// random fault), mixed with acquisitions, releases, drops and hold limits: never two holders, fences never
/// decreasing (a resumed lease keeps its fence). `REDLEASE_HANDOFF_SEEDS` runs more seeds.
#[test]
fn handed_off_and_resumed_leases_never_overlap_under_hostile_faults() {
    let (mut resumed, mut total) = (0, 0);
    hostile_seeds("REDLEASE_HANDOFF_SEEDS", 300, |seed| {
        let history = handoff_history(seed, secs(8));
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        total += history.acquisitions();
        resumed += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, redlease_testkit::EventKind::Resumed { .. }))
            .count();
    });
    assert!(
        resumed * 10 > total,
        "too few resumptions: {resumed} of {total} acquisitions"
    );
}

/// A lease past its validity whose key still lives on the node (its TTL outlasts the validity by the drift
/// margin): the refused handoff deletes the key in the background, as dropping the lease would.
#[test]
fn a_refused_handoff_cleans_up_a_key_that_outlived_the_validity() {
    let mut c = Cluster::with_spawner(1, 86, config());
    let lease = c
        .try_acquire(&c.manager.lock("job").expiry(secs(2)))
        .unwrap();
    let token = lease.token().as_str().to_owned();
    let left = lease.valid_until().saturating_duration_since(c.now());
    c.sim.run_for(left + ms(1));
    assert!(
        !c.holders("job", &token).is_empty(),
        "the key outlives the validity"
    );
    assert!(matches!(lease.handoff(), Err(Error::Lost { .. })));
    c.sim.run_for(ms(10));
    assert!(c.holders("job", &token).is_empty(), "cleaned up");
}
