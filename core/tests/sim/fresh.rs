//! Which request an acquisition retry sends: a plain `SET NX` (a [fresh](redlease::ClaimRequest::fresh)
//! [`RedisNode::claim`]) on a node that can never have stored the token, the own-token branch (a claim that is
//! not fresh) everywhere else.
//!
//! A retry that found the lock held by another owner on a node sends `SET NX` there again (one cheap
//! command instead of a script: the common case of a waiting acquisition). A node whose request may have
//! stored the token, or may still — it said yes, failed ambiguously, or was abandoned — must be asked through
//! the own-token branch: a plain `SET NX` would find our own token and answer "held", so the acquisition
//! would wait for its own key to expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use redlease::{
    Claim, ClaimRequest, Error, LockManager, NodeErrorKind, NodeFuture, NodeWrapper,
    NotAcquiredReason,
};
use redlease_testkit::{Fault, FaultyNode, MemoryNode, Op, Sim};

use crate::support::*;

const FOREIGN: &str = "someone-else";

/// Counts the acquisition requests by kind: plain `SET NX` (fresh) and own-token.
#[derive(Default)]
struct Counts {
    fresh: AtomicU64,
    own: AtomicU64,
}

impl Counts {
    fn get(&self) -> (u64, u64) {
        (self.fresh.load(SeqCst), self.own.load(SeqCst))
    }
}

struct Counting {
    inner: MemoryNode,
    counts: Arc<Counts>,
}

impl Counting {
    /// Counts `call` when it is sent (first polled), not when it is built: a fault wrapper may build a call
    /// it never sends.
    fn counted<'f, T: Send + 'f>(
        &'f self,
        fresh: bool,
        call: NodeFuture<'f, T>,
    ) -> NodeFuture<'f, T> {
        Box::pin(async move {
            let counter = if fresh {
                &self.counts.fresh
            } else {
                &self.counts.own
            };
            counter.fetch_add(1, SeqCst);
            call.await
        })
    }
}

impl NodeWrapper for Counting {
    type Inner = MemoryNode;

    fn inner(&self) -> &MemoryNode {
        &self.inner
    }

    fn claim<'a, 'b, 'f>(&'a self, req: ClaimRequest<'b>) -> NodeFuture<'f, Claim>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        self.counted(req.fresh, redlease::RedisNode::claim(&self.inner, req))
    }
}

/// `n` counted in-memory nodes behind fault wrappers (with the simulation's network spawner, for late
/// requests), a manager over them.
struct Env {
    sim: Sim,
    nodes: Vec<MemoryNode>,
    counts: Vec<Arc<Counts>>,
    faults: Vec<redlease_testkit::Faults>,
    manager: LockManager,
}

fn env(n: usize, seed: u64, config: redlease::Config) -> Env {
    let sim = Sim::new(seed);
    let clock = sim.clock();
    let mut nodes = Vec::new();
    let mut counts = Vec::new();
    let mut faults = Vec::new();
    let mut wrapped = Vec::new();
    for _ in 0..n {
        let node = MemoryNode::with_timer(clock.clone());
        let c = Arc::new(Counts::default());
        let counting = Counting {
            inner: node.clone(),
            counts: Arc::clone(&c),
        };
        let (faulty, f) = FaultyNode::with_spawner(counting, clock.clone(), sim.spawner());
        nodes.push(node);
        counts.push(c);
        faults.push(f);
        wrapped.push(faulty);
    }
    let manager = if n == 1 {
        LockManager::single(wrapped.pop().unwrap(), config)
    } else {
        LockManager::redlock(wrapped, config)
    }
    .unwrap()
    .with_timer(clock);
    Env {
        sim,
        nodes,
        counts,
        faults,
        manager,
    }
}

#[test]
fn retries_against_a_held_lock_send_a_plain_set_nx_every_time() {
    for notifications in [false, true] {
        let mut e = env(
            1,
            3,
            config().with_attempts(4).with_notifications(notifications),
        );
        e.nodes[0].set("job", FOREIGN, Some(secs(60)));
        let lock = e.manager.lock("job");
        let result = e.sim.block_on(async move { lock.acquire().await });
        assert!(
            matches!(
                result,
                Err(Error::NotAcquired {
                    attempts: 4,
                    reason: NotAcquiredReason::Contended,
                    ..
                })
            ),
            "{result:?}"
        );
        assert_eq!(
            e.counts[0].get(),
            (4, 0),
            "notifications {notifications}: (SET NX, own-token) requests"
        );
    }
}

#[test]
fn a_waiting_acquisition_takes_the_released_lock_with_a_plain_set_nx() {
    let mut e = env(1, 5, config().with_retry_delay(ms(50)));
    e.nodes[0].set("job", FOREIGN, Some(ms(300)));
    let lock = e.manager.lock("job");
    let lease = e
        .sim
        .block_on(async move { lock.acquire_within(secs(5)).await })
        .unwrap();
    let (fresh, own) = e.counts[0].get();
    assert!(fresh >= 2, "{fresh} SET NX requests");
    assert_eq!(own, 0, "the token was never stored before the win");
    assert_eq!(
        e.nodes[0].get("job").as_deref(),
        Some(lease.token().as_str().as_bytes())
    );
}

#[test]
fn in_redlock_only_nodes_that_said_held_keep_the_plain_set_nx() {
    // Nodes 0 and 1 are held by another owner; node 2 says yes to every attempt, and the failed attempts'
    // clean-ups are refused there (never applied: the token is kept, as one that was sent would have it
    // replaced) until the last one deletes our token. Node 2 stored the token: from attempt 2 on it is
    // asked through the own-token branch; nodes 0 and 1 never stored it and keep getting `SET NX`.
    let mut e = env(3, 7, config().with_attempts(3));
    for i in [0, 1] {
        e.nodes[i].set("job", FOREIGN, Some(secs(60)));
    }
    e.faults[2].script(
        Op::Release,
        vec![Fault::Fail(redlease::NodeErrorKind::Connection); 2],
    );
    let lock = e.manager.lock("job");
    let result = e.sim.block_on(async move { lock.acquire().await });
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "{result:?}"
    );
    assert_eq!(e.counts[0].get(), (3, 0));
    assert_eq!(e.counts[1].get(), (3, 0));
    assert_eq!(e.counts[2].get(), (1, 2));
    assert_eq!(e.nodes[2].get("job"), None, "clean-up deleted our token");
}

#[test]
fn a_request_that_timed_out_and_landed_late_is_recognised_by_the_retry() {
    // Attempt 1's `SET NX` sits in the network past the operation timeout and lands while the key is free,
    // storing our token. Its clean-up fails definitely (not applied), so the token is kept. Attempt 2 must
    // ask through the own-token branch and win; a plain `SET NX` would find our own token and answer
    // "held": the acquisition would fail against its own key.
    let config = config()
        .with_operation_timeout(ms(100))
        .with_retry_delay(ms(10))
        .with_attempts(2);
    let mut e = env(1, 9, config);
    e.faults[0].script(Op::Acquire, [Fault::Late(ms(150))]);
    e.faults[0].script(Op::Release, [Fault::Fail(NodeErrorKind::Connection)]);
    let lock = e.manager.lock("job").expiry(secs(10));
    let lease = e
        .sim
        .block_on(async move { lock.acquire().await })
        .expect("attempt 2 recognises the token attempt 1 stored late");
    assert_eq!(e.counts[0].get(), (1, 1), "(SET NX, own-token) requests");
    assert_eq!(
        e.nodes[0].get("job").as_deref(),
        Some(lease.token().as_str().as_bytes())
    );
}
