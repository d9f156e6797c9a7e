//! The conformance suite against the in-memory node, on virtual and on real time, and proof that it catches
//! a node that breaks a contract.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use redlease::notify::Notifier;
use redlease::{Claim, KeyState, NodeError, RedisNode, SystemTimer, Token, Ttl, async_trait};
use redlease_testkit::{MemoryNode, Sim, block_on, conformance};

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
        self.inner.release(key, token).await
    }
    async fn acquire_or_ttl(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        fresh: bool,
    ) -> Result<Claim, NodeError> {
        let claim = self.inner.acquire_or_ttl(key, token, ttl, fresh).await?;
        if self.bug == "acquire_or_ttl reports the TTL asked for" {
            if let Claim::Held { .. } = claim {
                return Ok(Claim::Held {
                    remaining: Some(ttl.as_duration()),
                });
            }
        }
        Ok(claim)
    }
    fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier()
    }
    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        if self.bug == "extend re-creates" {
            self.inner.set(key, token.as_str(), Some(ttl.as_duration()));
            return Ok(true);
        }
        self.inner.extend(key, token, ttl).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        self.inner.inspect(key).await
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
            "release publishes nothing",
            "a_node_that_notifies_publishes_each_release_and_unsubscribes",
        ),
        (
            "acquire_or_ttl reports the TTL asked for",
            "acquire_or_ttl_keeps_the_acquire_contracts_and_reports_the_holders_ttl",
        ),
    ] {
        let mut sim = Sim::new(2);
        let clock = sim.clock();
        let node = Broken {
            inner: MemoryNode::with_timer(clock.clone()),
            bug,
        };
        let failure = sim
            .block_on(async { conformance::run(&node, &clock).await })
            .unwrap_err();
        assert_eq!(failure.case, case, "{bug}: {failure}");
    }
}
