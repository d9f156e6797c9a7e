// What the crate's own examples run on, so that they compile and run from the published crate alone (its
// dev-dependencies cannot include redlease-testkit, which depends on this crate). Not a module: each example
// includes it on a hidden line, `# mod doc_support { include!("doc_support.rs"); } use doc_support::*;`.
// The testkit's `MemoryNode` is the full in-memory node; this is the smallest one the examples need.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use redlease::{
    Claim, ClaimRequest, KeyState, NodeError, PermitOp, PermitReply, RedisNode, Token, Ttl,
    async_trait,
};

/// A single-process "Redis": key → (value, expiry), and fence counters.
#[derive(Default)]
pub struct MapNode {
    keys: Mutex<HashMap<String, (String, Instant)>>,
    fences: Mutex<HashMap<String, u64>>,
    permits: Mutex<HashMap<String, Vec<(String, Instant)>>>,
}

impl MapNode {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(keys: &mut HashMap<String, (String, Instant)>, key: &str) -> Option<String> {
        match keys.get(key) {
            Some((v, at)) if *at > Instant::now() => Some(v.clone()),
            Some(_) => {
                keys.remove(key);
                None
            }
            None => None,
        }
    }

    fn set(keys: &mut HashMap<String, (String, Instant)>, key: &str, token: &Token, ttl: Ttl) {
        keys.insert(key.into(), (token.as_str().into(), Instant::now() + ttl.as_duration()));
    }

    /// `PEXPIRE key ttl GT` on a live key: its expiry becomes the later of the one it has and `ttl` from now
    /// (an extension never shortens a key).
    fn extend_to(keys: &mut HashMap<String, (String, Instant)>, key: &str, ttl: Ttl) {
        if let Some((_, at)) = keys.get_mut(key) {
            *at = (*at).max(Instant::now() + ttl.as_duration());
        }
    }
}

#[async_trait]
impl RedisNode for MapNode {
    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let mut keys = self.keys();
        match Self::live(&mut keys, key) {
            Some(v) if v != token.as_str() => Ok(false),
            Some(_) => {
                Self::extend_to(&mut keys, key, ttl);
                Ok(true)
            }
            None => {
                Self::set(&mut keys, key, token, ttl);
                Ok(true)
            }
        }
    }

    /// A fresh claim is `SET NX` (the profile says so); the holder's TTL is not reported.
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        if !req.fresh {
            return Ok(Claim::from_taken(self.acquire(req.key, req.token, req.ttl).await?));
        }
        let mut keys = self.keys();
        if Self::live(&mut keys, req.key).is_some() {
            return Ok(Claim::Held { remaining: None });
        }
        Self::set(&mut keys, req.key, req.token, req.ttl);
        Ok(Claim::Taken)
    }

    fn profile(&self) -> redlease::NodeProfile {
        redlease::NodeProfile::new()
            .with_fresh_is_nx(true)
            .with_endpoint(format!("map://{:p}", self))
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        let mut keys = self.keys();
        let mut fences = self.fences.lock().unwrap_or_else(|e| e.into_inner());
        match Self::live(&mut keys, key) {
            Some(v) if v != token.as_str() => Ok(None),
            Some(_) => {
                Self::extend_to(&mut keys, key, ttl);
                Ok(fences.get(fence_key).copied())
            }
            None => {
                let fence = fences.entry(fence_key.into()).or_insert(0);
                *fence += 1;
                Self::set(&mut keys, key, token, ttl);
                Ok(Some(*fence))
            }
        }
    }

    async fn raise_fence(&self, fence_key: &str, at_least: u64) -> Result<u64, NodeError> {
        let mut fences = self.fences.lock().unwrap_or_else(|e| e.into_inner());
        let fence = fences.entry(fence_key.into()).or_insert(0);
        *fence = (*fence).max(at_least);
        Ok(*fence)
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        let mut keys = self.keys();
        let held = Self::live(&mut keys, key).as_deref() == Some(token.as_str());
        if held {
            keys.remove(key);
        }
        Ok(held)
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let mut keys = self.keys();
        let held = Self::live(&mut keys, key).as_deref() == Some(token.as_str());
        if held {
            Self::extend_to(&mut keys, key, ttl);
        }
        Ok(held)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let mut keys = self.keys();
        let expiry = keys.get(key).map(|(_, at)| *at);
        Ok(Self::live(&mut keys, key).map(|v| {
            KeyState::new(v, expiry.map(|at| at.saturating_duration_since(Instant::now())))
        }))
    }

    async fn permit(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        op: PermitOp<'_>,
    ) -> Result<PermitReply, NodeError> {
        let mut all = self.permits.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let set = all.entry(key.into()).or_default();
        set.retain(|(_, at)| *at > now);
        let mine = set.iter().position(|(t, _)| t == token.as_str());
        let until = now + ttl.as_duration();
        Ok(match (op, mine) {
            (PermitOp::Acquire { .. } | PermitOp::Extend, Some(i)) => {
                set[i].1 = set[i].1.max(until);
                PermitReply::Done
            }
            (PermitOp::Acquire { permits }, None) if set.len() < permits as usize => {
                set.push((token.as_str().into(), until));
                PermitReply::Done
            }
            (PermitOp::Acquire { .. }, None) => PermitReply::Full {
                next_expiry: set.iter().map(|(_, at)| *at - now).min(),
            },
            (PermitOp::Release, Some(i)) => {
                set.remove(i);
                PermitReply::Done
            }
            _ => PermitReply::NotHeld,
        })
    }
}

/// Runs a future to completion on this thread.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
