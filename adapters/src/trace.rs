//! Per-node spans through `tracing` (feature `tracing`, which also turns on redlease's own spans and events).
//!
//! redlease's spans (`redlease.acquire`, `redlease.renewal`, …) describe whole rounds; wrapping each node in
//! [`Traced`] adds one `redlease.node` span (debug) per call on that node, so a slow or failing server shows
//! up by name:
//!
//! | field | value |
//! |---|---|
//! | `node` | the node's [endpoint](redlease::NodeProfile::endpoint) with any `user:password@` removed ([`redact`]), or `node <index>` |
//! | `op` | `acquire`, `acquire_fresh`, `acquire_waiting`, `acquire_fenced`, `release`, `extend`, `inspect` (see below) |
//! | `key` | the lock key |
//! | `outcome` | `yes`, `no` or `error` |
//! | `error_kind` | on failure: [`NodeErrorKind::as_str`](redlease::NodeErrorKind::as_str) |
//!
//! A [`claim`](RedisNode::claim) is named by its form, with the names the calls it replaced had: `acquire`
//! for a claim that is neither [fresh](redlease::ClaimRequest::fresh) nor
//! [wants the holder's TTL](redlease::ClaimRequest::wants_ttl) (as for a call of `acquire` itself),
//! `acquire_fresh` for a fresh one (a plain `SET NX` on the adapters' nodes), and `acquire_waiting` for one
//! that wants the holder's TTL (a waiting acquisition's attempt, fresh or not).
//!
//! A failed call also logs a debug event with the error's kind, whether it may have been applied, and its
//! message (the adapters' messages name the operation and the error category, never a token or a password;
//! any `user:password@` in it is removed all the same). Tokens are never recorded.
//!
//! ```
//! use redlease::{Config, LockManager};
//! use redlease_adapters::trace::Traced;
//!
//! let node = Traced::new(redlease_testkit::MemoryNode::new());
//! let manager = LockManager::single(node, Config::default()).unwrap();
//! # let _ = manager;
//! ```

use std::fmt;

use redlease::{
    Claim, ClaimRequest, KeyState, NodeError, NodeWrapper, RedisNode, Token, Ttl, async_trait,
};
use tracing::Instrument;
use tracing::field::Empty;

/// A [`RedisNode`] that runs every call of `N` in a `redlease.node` span; see the [module docs](self).
pub struct Traced<N> {
    inner: N,
    name: String,
}

impl<N: fmt::Debug> fmt::Debug for Traced<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Traced")
            .field("node", &self.name)
            .field("inner", &self.inner)
            .finish()
    }
}

impl<N: RedisNode> Traced<N> {
    /// Wraps `inner`, naming it by its endpoint (credentials removed), or `node` if it has none.
    pub fn new(inner: N) -> Self {
        let name = inner
            .profile()
            .endpoint
            .map_or_else(|| "node".to_owned(), |e| redact(&e));
        Self { inner, name }
    }

    /// Names the node `name` in its spans instead (credentials removed all the same).
    #[must_use]
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = redact(name);
        self
    }

    /// The wrapped node.
    pub fn inner(&self) -> &N {
        &self.inner
    }

    fn span(&self, op: &'static str, key: &str) -> tracing::Span {
        tracing::debug_span!(
            "redlease.node",
            node = %self.name,
            op,
            key,
            outcome = Empty,
            error_kind = Empty
        )
    }
}

/// `url` with the user-info part (`user:password@`) of every `scheme://…` in it removed:
/// `redis://:pw@10.0.0.5:6379/0` becomes `redis://10.0.0.5:6379/0`. Text without credentials is returned
/// unchanged.
pub fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace; user-info is up to its last '@'.
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => out.push_str(&authority[at + 1..]),
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Records the outcome of one call on its span, and logs a failure.
fn finish<T>(span: &tracing::Span, result: &Result<T, NodeError>, yes: impl Fn(&T) -> bool) {
    match result {
        Ok(v) => {
            span.record("outcome", if yes(v) { "yes" } else { "no" });
        }
        Err(e) => {
            span.record("outcome", "error");
            span.record("error_kind", e.kind().as_str());
            span.in_scope(|| {
                tracing::debug!(
                    kind = e.kind().as_str(),
                    ambiguous = e.is_ambiguous(),
                    message = %redact(e.message()),
                    "node call failed"
                );
            });
        }
    }
}

// A `NodeWrapper`: every capability it does not trace (the fast-path claim, the endpoint, later ones) is
// the inner node's.
#[async_trait]
impl<N: RedisNode> NodeWrapper for Traced<N> {
    type Inner = N;

    fn inner(&self) -> &N {
        &self.inner
    }

    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let span = self.span("acquire", key);
        let r = self
            .inner
            .acquire(key, token, ttl)
            .instrument(span.clone())
            .await;
        finish(&span, &r, |ok| *ok);
        r
    }

    /// Named by its form (see the [module docs](self)).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        let op = match (req.fresh, req.wants_ttl) {
            (_, true) => "acquire_waiting",
            (true, false) => "acquire_fresh",
            (false, false) => "acquire",
        };
        let span = self.span(op, req.key);
        let r = self.inner.claim(req).instrument(span.clone()).await;
        finish(&span, &r, |claim| claim.is_taken());
        r
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        let span = self.span("acquire_fenced", key);
        let r = self
            .inner
            .acquire_fenced(key, fence_key, token, ttl)
            .instrument(span.clone())
            .await;
        finish(&span, &r, Option::is_some);
        r
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        let span = self.span("release", key);
        let r = self
            .inner
            .release(key, token)
            .instrument(span.clone())
            .await;
        finish(&span, &r, |ok| *ok);
        r
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        let span = self.span("extend", key);
        let r = self
            .inner
            .extend(key, token, ttl)
            .instrument(span.clone())
            .await;
        finish(&span, &r, |ok| *ok);
        r
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, NodeError> {
        let span = self.span("inspect", key);
        let r = self.inner.inspect(key).instrument(span.clone()).await;
        finish(&span, &r, Option::is_some);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_removes_user_info_and_keeps_the_rest() {
        assert_eq!(
            redact("redis://:s3cret@10.0.0.5:6379/0"),
            "redis://10.0.0.5:6379/0"
        );
        assert_eq!(redact("rediss://user:p@ss@host:6380"), "rediss://host:6380");
        assert_eq!(
            redact("connect to redis://u:pw@a:1/2 and redis://b:2 failed"),
            "connect to redis://a:1/2 and redis://b:2 failed"
        );
        assert_eq!(redact("redis://10.0.0.5:6379/0"), "redis://10.0.0.5:6379/0");
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("redis://user:pw@"), "redis://");
    }

    /// A claim's span is named by its form, with the names of the calls it replaced (`acquire_fresh` is in
    /// the module docs' table, which users filter on).
    #[test]
    fn a_claims_span_is_named_by_its_form() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::fmt::MakeWriter;
        use tracing_subscriber::fmt::format::FmtSpan;

        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> MakeWriter<'a> for Buf {
            type Writer = Buf;
            fn make_writer(&'a self) -> Buf {
                self.clone()
            }
        }

        let node = Traced::new(redlease_testkit::MemoryNode::new()).with_name("n");
        let token = Token::random().unwrap();
        let ttl = Ttl::from_millis(10_000).unwrap();
        for (fresh, wants_ttl, op) in [
            (false, false, "acquire"),
            (true, false, "acquire_fresh"),
            (false, true, "acquire_waiting"),
            (true, true, "acquire_waiting"),
        ] {
            let buf = Buf::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(buf.clone())
                .with_max_level(tracing::Level::DEBUG)
                .with_span_events(FmtSpan::CLOSE)
                .with_ansi(false)
                .finish();
            let req = ClaimRequest::new("k", &token, ttl)
                .fresh(fresh)
                .wants_ttl(wants_ttl);
            let claim = tracing::subscriber::with_default(subscriber, || {
                redlease_testkit::block_on(RedisNode::claim(&node, req))
            });
            assert!(claim.is_ok(), "{claim:?}");
            let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            assert!(
                log.contains(&format!("redlease.node{{node=n op=\"{op}\" key=\"k\"")),
                "{req:?}: {log}"
            );
        }
    }

    #[test]
    fn traced_forwards_every_capability_of_its_node() {
        let inner = redlease_testkit::MemoryNode::new();
        let traced = Traced::new(inner.clone());
        redlease_testkit::block_on(redlease_testkit::conformance::run_wrapper(
            &traced,
            &inner,
            &redlease::SystemTimer,
        ))
        .unwrap();
    }
}
