//! The conformance suite against the in-memory node, on virtual and on real time, and proof that it catches
//! a node that breaks a contract.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use redlease::notify::Notifier;
use redlease::{
    Claim, ClaimRequest, KeyState, NodeError, PermitOp, PermitReply, RedisNode, ReplicaWait, RunId,
    SystemTimer, Token, Ttl, async_trait,
};
use redlease_testkit::{FaultyNode, MemoryNode, Op, Sim, block_on, conformance};

#[test]
fn memory_node_passes_on_virtual_time() {
    let mut sim = Sim::new(1);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    sim.block_on(async { conformance::run(&node, &clock).await })
        .unwrap();
    // Only fence counters are left without a TTL.
    for key in node.keys_without_ttl() {
        assert!(key.ends_with(":fence"), "{key}");
    }
}

/// The capability cases run where a node claims them: a memory node with replicas, also behind a fault
/// wrapper that forwards `run_id` and `wait_replicas`.
#[test]
fn memory_node_with_replicas_passes_also_behind_a_fault_wrapper() {
    let mut sim = Sim::new(3);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    node.set_replicas(Some(2));
    sim.block_on(async { conformance::run(&node, &clock).await })
        .unwrap();
    let (faulty, faults) = FaultyNode::new(node, clock.clone());
    sim.block_on(async { conformance::run(&faulty, &clock).await })
        .unwrap();
    assert!(faults.calls(Op::RunId) >= 3 && faults.calls(Op::WaitReplicas) >= 2);
}

#[test]
fn memory_node_passes_on_real_time() {
    block_on(conformance::run(&MemoryNode::new(), &SystemTimer)).unwrap();
}

/// A node with one deliberate bug, to show the suite notices.
struct Broken {
    inner: MemoryNode,
    bug: &'static str,
}

#[async_trait]
impl RedisNode for Broken {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        if self.bug == "acquire ignores its own token" && self.inner.get(key).is_some() {
            return Ok(false);
        }
        self.inner.acquire(key, token, ttl).await
    }
    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.inner.acquire_fenced(key, fence_key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        if self.bug == "release without compare" {
            return Ok(self.inner.del(key));
        }
        if self.bug == "release publishes nothing" {
            // Compare-and-delete done right, but silently (a plain DEL publishes nothing).
            let ours = self.inner.get(key).as_deref() == Some(token.as_str().as_bytes());
            return Ok(ours && self.inner.del(key));
        }
        let marker = redlease::notify::waiting_key(key).unwrap();
        if self.bug == "a lock release publishes without a waiter"
            && self.inner.get(&marker).is_none()
        {
            // A release that publishes whether or not a waiter marked the key (the marker planted for the
            // release alone, so that nothing else sees it).
            self.inner
                .set(&marker, "1", Some(std::time::Duration::from_secs(1)));
            let released = self.inner.release(key, token).await;
            self.inner.del(&marker);
            return released;
        }
        self.inner.release(key, token).await
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        if let (Some(slot), "a claim reports another server's run id") = (req.run_id, self.bug) {
            // Filled first, so the inner node's fill does not go in.
            slot.fill(RunId::new("another-server"));
        }
        if self.bug == "a fresh claim extends an existing key" && req.fresh {
            return Ok(Claim::from_taken(
                self.inner.acquire(req.key, req.token, req.ttl).await?,
            ));
        }
        if self.bug == "a claim without the TTL ignores its own token"
            && !req.wants_ttl
            && self.inner.get(req.key).is_some()
        {
            return Ok(Claim::Held { remaining: None });
        }
        let claim = self.inner.claim(req).await?;
        if self.bug == "a waiting claim leaves no waiter marker" {
            self.inner
                .del(&redlease::notify::waiting_key(req.key).unwrap());
        }
        if self.bug == "claim reports the TTL asked for" {
            if let Claim::Held { .. } = claim {
                return Ok(Claim::Held {
                    remaining: Some(req.ttl.as_duration()),
                });
            }
        }
        Ok(claim)
    }
    /// The inner node's (its fresh claim is `SET NX`), without batches: `extend_many` is not forwarded.
    fn profile(&self) -> redlease::NodeProfile {
        self.inner.profile().with_batch_limit(0)
    }
    fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier()
    }
    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        let reply = self.inner.permit(key, token, ttl, op).await?;
        let marker = redlease::notify::waiting_key(key).unwrap();
        if self.bug == "a permit release publishes without a waiter"
            && op == PermitOp::Release
            && reply == PermitReply::Done
            && self.inner.get(&marker).is_none()
        {
            // A release that publishes whether or not a waiter marked the key: a plain lock's release of
            // the same name publishes on the same channel (with a marker planted for it alone).
            let other = Token::random().unwrap();
            self.inner.acquire(key, &other, ttl).await?;
            self.inner
                .set(&marker, "1", Some(std::time::Duration::from_secs(1)));
            self.inner.release(key, &other).await?;
            self.inner.del(&marker);
        }
        if self.bug == "a blocked permit acquisition leaves no waiter marker"
            && matches!(reply, PermitReply::Full { .. })
        {
            self.inner.del(&marker);
        }
        Ok(reply)
    }
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        if self.bug == "extend re-creates" {
            self.inner.set(key, token.as_str(), Some(ttl.as_duration()));
            return Ok(true);
        }
        if self.bug == "extend overwrites a longer TTL"
            && self.inner.get(key).as_deref() == Some(token.as_str().as_bytes())
        {
            // A plain `PEXPIRE key ttl` (no `GT`): a shorter TTL shortens the key.
            self.inner.set(key, token.as_str(), Some(ttl.as_duration()));
            return Ok(true);
        }
        self.inner.extend(key, token, ttl).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        self.inner.inspect(key).await
    }
    async fn run_id(&self, key: &str) -> Result<RunId, NodeError> {
        if self.bug == "run_id depends on the key" {
            return Ok(RunId::new(key));
        }
        self.inner.run_id(key).await
    }
    async fn wait_replicas(&self, key: &str, wait: ReplicaWait) -> Result<u32, NodeError> {
        if self.bug == "wait_replicas answers the number asked" {
            return Ok(wait.replicas);
        }
        self.inner.wait_replicas(key, wait).await
    }
}

#[test]
fn suite_catches_broken_nodes() {
    for (bug, case) in [
        (
            "acquire ignores its own token",
            "acquire_own_token_again_resets_ttl",
        ),
        ("release without compare", "release_only_own_token"),
        (
            "extend re-creates",
            "extend_only_own_token_and_never_creates",
        ),
        (
            "extend overwrites a longer TTL",
            "extend_never_shortens_a_key",
        ),
        (
            "release publishes nothing",
            "a_node_that_notifies_publishes_each_release_and_unsubscribes",
        ),
        (
            "a lock release publishes without a waiter",
            "a_node_that_notifies_publishes_each_release_and_unsubscribes",
        ),
        (
            "a waiting claim leaves no waiter marker",
            "a_node_that_notifies_publishes_each_release_and_unsubscribes",
        ),
        (
            "claim reports the TTL asked for",
            "claim_never_changes_a_key_held_by_another_and_reports_its_ttl",
        ),
        (
            "a fresh claim extends an existing key",
            "claim_with_the_holders_token_never_shortens_and_a_fresh_nx_claim_changes_nothing",
        ),
        (
            "a claim without the TTL ignores its own token",
            "claim_with_the_holders_token_never_shortens_and_a_fresh_nx_claim_changes_nothing",
        ),
        (
            "a permit release publishes without a waiter",
            "permit_releases_publish_only_while_a_waiter_may_listen",
        ),
        (
            "a blocked permit acquisition leaves no waiter marker",
            "permit_releases_publish_only_while_a_waiter_may_listen",
        ),
        (
            "run_id depends on the key",
            "run_id_is_stable_between_calls",
        ),
        (
            "a claim reports another server's run id",
            "a_claim_reports_the_run_id_that_run_id_answers",
        ),
        (
            "wait_replicas answers the number asked",
            "wait_replicas_for_more_than_exist_answers_a_shortfall_within_its_timeout",
        ),
    ] {
        let mut sim = Sim::new(2);
        let clock = sim.clock();
        let node = Broken {
            inner: MemoryNode::with_timer(clock.clone()),
            bug,
        };
        node.inner.set_replicas(Some(2));
        let failure = sim
            .block_on(async { conformance::run(&node, &clock).await })
            .unwrap_err();
        assert_eq!(failure.case, case, "{bug}: {failure}");
    }
}

/// A decorator that implements `RedisNode` directly and writes only the required methods, the way a wrapper
/// author who does not know the provided ones would.
struct ForwardsOnlyRequired(MemoryNode);

#[async_trait]
impl RedisNode for ForwardsOnlyRequired {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.0.acquire(key, token, ttl).await
    }
    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.0.acquire_fenced(key, fence_key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.0.release(key, token).await
    }
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.0.extend(key, token, ttl).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        self.0.inspect(key).await
    }
}

/// The same decorator written with `NodeWrapper`: it overrides one operation and forwards the rest.
struct CountsReleases {
    inner: MemoryNode,
    releases: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl redlease::NodeWrapper for CountsReleases {
    type Inner = MemoryNode;

    fn inner(&self) -> &MemoryNode {
        &self.inner
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.releases
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.release(key, token).await
    }
}

#[test]
fn a_wrapper_that_forwards_only_the_required_methods_is_caught() {
    let inner = MemoryNode::new();
    let wrapper = ForwardsOnlyRequired(inner.clone());
    let failure = block_on(conformance::run_wrapper(&wrapper, &inner, &SystemTimer)).unwrap_err();
    assert_eq!(failure.case, "wrapper_forwards_capabilities", "{failure}");
    assert!(failure.message.contains("profile()"), "{failure}");
}

#[test]
fn node_wrapper_forwards_everything_it_does_not_override() {
    let inner = MemoryNode::new();
    let wrapper = CountsReleases {
        inner: inner.clone(),
        releases: Default::default(),
    };
    block_on(conformance::run_wrapper(&wrapper, &inner, &SystemTimer)).unwrap();
    assert!(
        wrapper.releases.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the overridden release ran"
    );
    // Arc and Box forward too.
    block_on(conformance::run_wrapper(
        &std::sync::Arc::new(inner.clone()),
        &inner,
        &SystemTimer,
    ))
    .unwrap();
    let boxed: Box<dyn RedisNode> = Box::new(inner.clone());
    block_on(conformance::run_wrapper(&boxed, &inner, &SystemTimer)).unwrap();
}

/// A hand-written wrapper that forwards the older capabilities and, with `notifier`, the notifier too, but
/// not `claim` (or, without, neither).
struct ForgetsNotifications {
    inner: MemoryNode,
    notifier: bool,
}

#[async_trait]
impl RedisNode for ForgetsNotifications {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.inner.acquire(key, token, ttl).await
    }
    fn profile(&self) -> redlease::NodeProfile {
        self.inner.profile()
    }
    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.inner.acquire_fenced(key, fence_key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.inner.extend(key, token, ttl).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        self.inner.inspect(key).await
    }
    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        self.inner.raise_fence(fence_key, at_least).await
    }
    async fn run_id(&self, key: &str) -> Result<redlease::RunId, NodeError> {
        self.inner.run_id(key).await
    }
    async fn wait_replicas(
        &self,
        key: &str,
        wait: redlease::ReplicaWait,
    ) -> Result<u32, NodeError> {
        self.inner.wait_replicas(key, wait).await
    }
    async fn extend_many(
        &self,
        items: &[redlease::ExtendItem<'_>],
    ) -> Result<Vec<bool>, NodeError> {
        self.inner.extend_many(items).await
    }
    fn notifier(&self) -> Option<&Notifier> {
        self.notifier.then(|| self.inner.notifier()).flatten()
    }
}

#[test]
fn a_wrapper_that_drops_the_notifier_or_the_holders_ttl_is_caught() {
    for (notifier, missing) in [(false, "notifier"), (true, "claim")] {
        let inner = MemoryNode::new();
        let wrapper = ForgetsNotifications {
            inner: inner.clone(),
            notifier,
        };
        let failure =
            block_on(conformance::run_wrapper(&wrapper, &inner, &SystemTimer)).unwrap_err();
        assert_eq!(failure.case, "wrapper_forwards_capabilities", "{failure}");
        assert!(failure.message.contains(missing), "{missing}: {failure}");
    }
}

/// A wrapper that answers the start-up check itself instead of asking its inner node.
struct HidesReadiness(MemoryNode);

#[async_trait]
impl redlease::NodeWrapper for HidesReadiness {
    type Inner = MemoryNode;

    fn inner(&self) -> &MemoryNode {
        &self.0
    }

    async fn readiness(&self, _key: &str) -> redlease::Readiness {
        redlease::Readiness::Unknown
    }
}

#[test]
fn a_wrapper_that_does_not_forward_the_start_up_check_is_caught() {
    let inner = MemoryNode::new();
    let failure = block_on(conformance::run_wrapper(
        &HidesReadiness(inner.clone()),
        &inner,
        &SystemTimer,
    ))
    .unwrap_err();
    assert_eq!(failure.case, "wrapper_forwards_capabilities", "{failure}");
    assert!(failure.message.contains("readiness"), "{failure}");
    // The testkit's fault injector forwards it.
    let (faulty, _faults) = FaultyNode::new(inner.clone(), SystemTimer);
    block_on(conformance::run_wrapper(&faulty, &inner, &SystemTimer)).unwrap();
}
