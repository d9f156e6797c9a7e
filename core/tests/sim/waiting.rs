//! Waiting acquisitions (issue 21): the next attempt after a contended answer follows the holder's reported
//! expiry, and a deadline that cuts an attempt on a lock known to be held ends as contention.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use redlease::{Error, NotAcquiredReason, Timer};
use redlease_testkit::{Fault, Op};

use crate::support::*;

/// A holder's lease (TTL 300 ms) is dropped without release and expires; a waiter that started 50 ms after
/// it must acquire within a few milliseconds of the expiry, whatever its jitter draws (`retry_delay` 200 ms,
/// jitter 0.5: up to 300 ms between polls).
fn expired_holder_is_noticed_promptly(notifications: bool) {
    for seed in 1..=16u64 {
        let cfg = config()
            .with_jitter_seed(seed)
            .with_notifications(notifications);
        let mut c = Cluster::new(1, seed, cfg);
        let lock = c.manager.lock("job").expiry(ms(300));
        let holder = c.try_acquire(&lock).unwrap();
        let expires = c.now() + ms(300);
        drop(holder);
        c.sim.run_for(ms(50));
        let got = Arc::new(Mutex::new(None::<Instant>));
        let (l, g, k) = (lock.clone(), got.clone(), c.clock.clone());
        c.sim.spawn(async move {
            if let Ok(lease) = l.acquire_within(secs(5)).await {
                *g.lock().unwrap() = Some(k.now());
                let _ = lease.release().await;
            }
        });
        c.sim.run_for(secs(2));
        let at = got.lock().unwrap().expect("acquired");
        assert!(
            at >= expires && at <= expires + ms(10),
            "seed {seed}, notifications {notifications}: acquired {:?} after the holder's key expired",
            at.saturating_duration_since(expires)
        );
    }
}

#[test]
fn a_waiter_notices_an_expired_holder_within_a_few_ms_of_its_ttl() {
    expired_holder_is_noticed_promptly(true);
}

#[test]
fn a_polling_waiter_notices_an_expired_holder_within_a_few_ms_of_its_ttl() {
    expired_holder_is_noticed_promptly(false);
}

/// The node answers acquisitions in 50 ms; the waiter's second attempt starts 30 ms before its deadline and
/// is cut there. The lock was held all along: the acquisition ends as contention, not as a node timeout.
#[test]
fn a_deadline_that_cuts_an_attempt_on_a_held_lock_reports_contention() {
    for notifications in [false, true] {
        let cfg = config()
            .with_retry_delay(ms(20))
            .with_retry_jitter(0.0)
            .with_notifications(notifications);
        let mut c = Cluster::new(1, 3, cfg);
        let lock = c.manager.lock("job").expiry(secs(30));
        let _holder = c.try_acquire(&lock).unwrap();
        c.faults[0].script(Op::Acquire, vec![Fault::SlowReply(ms(50)); 8]);
        let r = c
            .sim
            .block_on(async move { lock.acquire_within(ms(100)).await });
        match r {
            Err(Error::NotAcquired {
                reason, attempts, ..
            }) => {
                assert_eq!(
                    (reason, attempts),
                    (NotAcquiredReason::Contended, 2),
                    "notifications {notifications}"
                );
            }
            other => panic!("notifications {notifications}: {other:?}"),
        }
    }
}
