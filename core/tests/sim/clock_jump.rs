//! A forward jump of the server's clock expires keys early: no client can prevent a second holder, and
//! fencing is what keeps the stale holder's write out.

use redlease::{Config, LockManager, Timer};
use redlease_testkit::{EventKind, History, MemoryNode, Sim, Violation, VirtualClock};

use crate::support::*;

/// A store that accepts a write only with a fencing token at least as large as any it has seen.
#[derive(Default)]
struct FencedStore {
    highest: u64,
    value: Option<&'static str>,
}

impl FencedStore {
    fn write(&mut self, fence: u64, value: &'static str) -> bool {
        if fence < self.highest {
            return false;
        }
        self.highest = fence;
        self.value = Some(value);
        true
    }
}

#[test]
fn a_server_clock_jump_lets_a_second_holder_in_and_fencing_rejects_the_stale_write() {
    let mut sim = Sim::new(40);
    let client_clock = sim.clock();
    // The server keeps its own clock, which jumps; the clients' monotonic clock does not.
    let server_clock = VirtualClock::new();
    let node = MemoryNode::with_timer(server_clock.clone());
    let manager = LockManager::single(node, Config::default().jitter_seed(1))
        .unwrap()
        .with_timer(client_clock.clone());
    let lock = manager.lock("job").expiry(secs(30)).fenced("job:fence");
    let history = History::new();

    let a = sim.block_on({
        let lock = lock.clone();
        async move { lock.try_acquire().await }
    });
    let a = a.unwrap();
    let t = client_clock.now();
    history.record(
        1,
        "job",
        t,
        EventKind::Acquired {
            valid_until: a.valid_until(),
            fence: a.fencing_token(),
        },
    );

    // Ten seconds later the server's clock jumps a minute ahead: A's key expires on the server while A's
    // lease still has 20 s of validity by its own clock.
    sim.run_for(secs(10));
    server_clock.advance(secs(60));
    let b = sim.block_on({
        let lock = lock.clone();
        async move { lock.try_acquire().await }
    });
    let b = b.expect("the jump expired A's key, so B acquires");
    history.record(
        2,
        "job",
        client_clock.now(),
        EventKind::Acquired {
            valid_until: b.valid_until(),
            fence: b.fencing_token(),
        },
    );
    assert!(
        a.is_held(),
        "A cannot know: by its clock the lease is valid"
    );

    // The checker flags the overlap: this fault breaks any Redis lock.
    assert!(matches!(history.check(), Err(Violation::Overlap { .. })));

    // Fencing keeps the resource consistent: B writes with the larger token, A's late write is refused.
    let (fa, fb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
    assert!(fb > fa);
    let mut store = FencedStore::default();
    assert!(store.write(fb, "from B"));
    assert!(!store.write(fa, "from A (stale)"));
    assert_eq!(store.value, Some("from B"));
}
