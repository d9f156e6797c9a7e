//! Duplicated delivery (`Fault::Duplicated`): a request applied twice, the copy later — a retry that a client
//! library or a proxy sent on another connection while the first copy was still on its way. The caller's
//! answer confirms one copy; the other lands afterwards, after requests sent later. Each test is a
//! minimised finding of the hostile fault mix (`history::duplicated_delivery_alone_never_overlaps`).

use redlease::{Lease, Timer};
use redlease_testkit::{Fault, History, Op};

use crate::support::*;

/// Seed 177 of the mix, minimised. Attempt 1's write is applied but its reply is lost; the clean-up deletes
/// it and the node confirms — and a copy of that compare-and-delete lands 300 ms later. Attempt 2 reused the
/// token (the clean-up was confirmed), won, and the late copy deleted the new lease's key: a second client
/// took the lock while the first held it. Fixed by giving the next attempt a new token after any clean-up
/// that was sent (`Acquisition::handle_cleanup`).
#[test]
fn a_duplicated_cleanup_of_a_failed_attempt_cannot_delete_the_next_attempts_key() {
    let mut c = Cluster::new(1, 177, config().with_expiry(secs(10)));
    let history = History::new();
    let one = c.manager.clone().with_observer(history.recorder(1));
    let two = c.manager.clone().with_observer(history.recorder(2));
    c.faults[0].script(Op::Acquire, [Fault::ReplyLost]);
    c.faults[0].script(Op::Release, [Fault::Duplicated(ms(300))]);
    let lock = one.lock("job");
    let lease: Lease = c
        .sim
        .block_on(async move { lock.acquire().await })
        .expect("attempt 2 acquires");
    assert!(lease.is_held());
    assert_eq!(c.faults[0].calls(Op::Release), 1, "one clean-up");
    // The copy of the clean-up lands.
    c.sim.run_for(ms(400));
    assert_eq!(c.faults[0].duplicates_applied(Op::Release), 1);
    assert!(
        lease.is_held(),
        "{:?} left",
        lease.valid_until() - c.clock.now()
    );
    let second = c.try_acquire(&two.lock("job"));
    assert_eq!(history.check(), Ok(()));
    assert!(
        second.is_err(),
        "the late copy of the clean-up deleted the held lease's key"
    );
    assert_eq!(
        c.nodes[0].get("job").as_deref(),
        Some(lease.token().as_str().as_bytes())
    );
    std::mem::forget(second);
}

/// An extension's copy landing after a longer extension must not shorten the key under the lease. The lease
/// extends to 1 s (confirmed; a copy lands 500 ms later), then to 10 s (confirmed): the copy asks for 1 s
/// again. Before extensions stopped shortening keys it set 1 s, the key expired 1.5 s in while the lease
/// believed it held it for 10 s, and a second client took the lock.
///
/// The core's record of extensions that may still land (`machine/unconfirmed.rs`, `Unconfirmed::handle_round`)
/// clears a node once it answered, so the second round counts it; a duplicate of an answered request breaks
/// that assumption, and no bound on how late a copy lands is known to the client. The fix is on the server's
/// side, in the node contract (`RedisNode::extend`): an extension never shortens a key (`PEXPIRE … GT`, or the
/// same comparison in the extension script, and in the own-token branch of the acquisition scripts), so the
/// copy changes nothing and the key keeps the 10 s.
#[test]
fn a_duplicated_shorter_extension_cannot_shorten_the_key_under_a_longer_one() {
    let mut c = Cluster::new(1, 178, config().with_expiry(secs(5)));
    let history = History::new();
    let one = c.manager.clone().with_observer(history.recorder(1));
    let two = c.manager.clone().with_observer(history.recorder(2));
    let lease = c.try_acquire(&one.lock("job")).expect("acquired");
    c.faults[0].script(Op::Extend, [Fault::Duplicated(ms(500))]);
    c.sim
        .block_on(async { lease.extend(secs(1)).await })
        .expect("extended to 1 s");
    c.sim.run_for(ms(100));
    c.sim
        .block_on(async { lease.extend(secs(10)).await })
        .expect("extended to 10 s");
    c.sim.run_for(secs(2));
    assert_eq!(c.faults[0].duplicates_applied(Op::Extend), 1);
    assert!(lease.is_held());
    // The copy landed and the key kept the longer TTL (10 s less the 2.1 s since).
    let left = c.nodes[0].pttl("job").flatten().expect("the key has a TTL");
    assert!(left > secs(7), "the key has {left:?} left");
    let second = c.try_acquire(&two.lock("job"));
    assert_eq!(history.check(), Ok(()));
    assert!(second.is_err(), "two holders");
    std::mem::forget(second);
}
