//! Push handoff: waiting acquisitions woken by release notifications (`redlease::notify`), under virtual
//! time with in-memory nodes.

use std::sync::{Arc, Mutex};

use redlease::Timer;
use redlease::notify::channel;
use redlease_testkit::Op;

use crate::support::*;

#[test]
fn a_waiter_acquires_at_the_instant_of_the_release_not_at_its_next_poll() {
    let mut c = Cluster::new(1, 1, config().expiry(secs(30)).retry_delay(secs(10)));
    let lock = c.manager.lock("job");
    let held = c.try_acquire(&lock).unwrap();
    let t0 = c.now();
    let clock = c.clock.clone();
    let got = Arc::new(Mutex::new(None));
    let (l, g, k) = (lock.clone(), got.clone(), clock.clone());
    c.sim.spawn(async move {
        let lease = l.acquire_within(secs(60)).await.unwrap();
        *g.lock().unwrap() = Some(k.now());
        lease.release().await.unwrap();
    });
    c.sim.run_for(ms(500));
    assert_eq!(
        c.nodes[0].numsub(&channel("job")),
        1,
        "the waiter subscribed"
    );
    c.sim.block_on(async move { held.release().await.unwrap() });
    let released = c.now();
    c.sim.run_for(ms(10));
    assert_eq!(
        *got.lock().unwrap(),
        Some(released),
        "woken by the release itself"
    );
    assert!(released - t0 < secs(10), "long before the 10 s retry delay");
    assert_eq!(
        c.nodes[0].numsub(&channel("job")),
        0,
        "unsubscribed after the last waiter"
    );
    assert_eq!(c.nodes[0].subscriber_connections(), 0);
    // Attempt 1 (held), the attempt the confirmed subscription triggers (held), the one the release triggers.
    assert_eq!(c.faults[0].calls(Op::Acquire), 1 + 3);
}
