//! A conformance suite for [`RedisNode`] implementations.
//!
//! [`run`] exercises every operation's contract (ownership checks, TTL handling, fencing, expiry, never
//! re-creating a key, never shortening one) through the trait alone, under a fresh random key prefix, and returns the first
//! deviation. Run it against your own node in one call:
//!
//! ```
//! use redlease::SystemTimer;
//! use redlease_testkit::{block_on, conformance, MemoryNode};
//!
//! let node = MemoryNode::new();
//! block_on(conformance::run(&node, &SystemTimer)).unwrap();
//! ```
//!
//! [`run`] observes state through the node's own [`inspect`](RedisNode::inspect), so a node whose inspect
//! shares a bug with its writes could pass. [`run_with_reader`] takes an independent [`StateReader`] (for a
//! Redis node: a second connection that runs `GET` and `PTTL`) and reads every state through it, checking
//! that `inspect` agrees.
//!
//! Expiry is observed by sleeping on `timer` for about 150 ms in total (instant under virtual time). All keys
//! share one `{hash tag}`, so a Redis Cluster node passes too.
//!
//! Capabilities are checked where a node claims them: release notifications for a node with a
//! [`notifier`](RedisNode::notifier) (a release that deletes, after a contended
//! [`claim`](RedisNode::claim) of a waiter, one that [wants the TTL](redlease::ClaimRequest::wants_ttl),
//! publishes [`notify::payload`] on the key's channel, and so does a [multi-key](RedisNode::multi_key)
//! release while that waiter's marker lives; the subscription is confirmed and nothing stays subscribed
//! after the watch is dropped; a permit's release after an acquisition the permits blocked publishes too;
//! and on a node that keeps waiter markers — the contended claim or the blocked acquisition left
//! [`notify::waiting_key`] behind — a release with no marker, plain, multi-key or a permit's, publishes
//! nothing), and the holder's TTL for a node
//! whose `claim` reports one (it must be the key's TTL). Every `claim` is checked in all four forms (fresh or
//! not, wanting the holder's TTL or not) against a free key, a key held by another token and a key holding
//! its own token: `acquire`'s contracts, and a fresh claim that changes no existing key on a node whose
//! [`fresh_is_nx`](redlease::NodeProfile::fresh_is_nx) says so. Also a
//! [`run_id`](RedisNode::run_id) (non-empty, the same between calls, after a write and for another key; a
//! claim that fills its [run id slot](redlease::ClaimRequest::run_id) fills it with what `run_id` answers,
//! in every form, and a claim whose slot stays empty is fine) and
//! [`wait_replicas`](RedisNode::wait_replicas) (a count, at once for none, fewer than asked and within about
//! its timeout for a thousand) for a node that does not answer them [`NodeErrorKind::Unsupported`].

use std::fmt;
use std::time::Duration;

use redlease::notify::{self, Subscription, Watch};
use redlease::{
    Claim, ClaimRequest, ExtendItem, KeyState, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    NodeErrorKind, RedisNode, RunIdSlot, Timer, Token, Ttl, async_trait,
};

/// An independent way to read what a node stored: the raw value and remaining TTL of a key, without going
/// through the node under test (for Redis: `GET` and `PTTL` on a second connection).
#[async_trait]
pub trait StateReader: Send + Sync {
    /// The value and remaining TTL (`None`: no expiry) of `key`, or `None` when it does not exist; `Err`
    /// with a description when the read failed.
    async fn read(&self, key: &str) -> Result<Option<KeyState>, String>;
}

/// A contract the node under test broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The case that failed.
    pub case: &'static str,
    /// What was expected and what happened.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance case {:?} failed: {}",
            self.case, self.message
        )
    }
}

impl std::error::Error for Failure {}

/// The names of the cases [`run`] checks, in order.
pub const CASES: &[&str] = &[
    "acquire_free_key",
    "acquire_held_key_is_contended",
    "acquire_own_token_again_resets_ttl",
    "claim_takes_a_free_key_in_every_form",
    "claim_never_changes_a_key_held_by_another_and_reports_its_ttl",
    "claim_with_the_holders_token_never_shortens_and_a_fresh_nx_claim_changes_nothing",
    "release_only_own_token",
    "extend_only_own_token_and_never_creates",
    "extend_never_shortens_a_key",
    "keys_expire_and_stay_expired",
    "fenced_acquire_counts_up",
    "fenced_contention_changes_nothing",
    "fenced_own_token_retry_reuses_the_fence",
    "fenced_bad_counter_fails_before_writing",
    "fenced_own_token_without_counter_fails",
    "ttl_edges",
    "unusual_key_names",
    "raise_fence_never_lowers_and_later_fences_exceed_it",
    "raise_fence_refuses_a_non_integer_counter",
    "run_id_is_stable_between_calls",
    "a_claim_reports_the_run_id_that_run_id_answers",
    "wait_replicas_for_none_answers_at_once",
    "wait_replicas_for_more_than_exist_answers_a_shortfall_within_its_timeout",
    "extend_many_answers_each_item_as_extend_would",
    "multi_key_takes_every_key_or_none_with_its_fences_in_one_step",
    "multi_key_extends_without_shortening_and_releases_only_own_tokens",
    "a_node_that_notifies_publishes_each_release_and_unsubscribes",
    "permits_admit_at_most_n_and_expire_by_the_servers_clock",
    "read_write_permits_share_exclude_and_claim",
    "fair_permits_serve_the_queue_in_arrival_order",
    "fenced_writers_take_a_larger_fence_with_each_grant",
    "permits_extend_in_a_batch",
    "permit_releases_publish_only_while_a_waiter_may_listen",
];

/// How long a notification case waits to see that a release published nothing (real time on a live server,
/// where a message arrives within milliseconds).
const QUIET_WAIT: Duration = Duration::from_millis(500);

/// How long a notification case waits for a subscription or a message (real time on a live server).
const NOTIFY_WAIT: Duration = Duration::from_secs(3);

struct Ctx<'a> {
    node: &'a dyn RedisNode,
    reader: Option<&'a dyn StateReader>,
    timer: &'a dyn Timer,
    prefix: String,
    case: &'static str,
}

type Outcome = Result<(), Failure>;

impl Ctx<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}{}:{}", self.prefix, self.case, name)
    }

    fn fail(&self, message: impl Into<String>) -> Failure {
        Failure {
            case: self.case,
            message: message.into(),
        }
    }

    fn ensure(&self, cond: bool, message: impl FnOnce() -> String) -> Outcome {
        if cond {
            Ok(())
        } else {
            Err(self.fail(message()))
        }
    }

    fn ok<T>(&self, op: &str, r: Result<T, NodeError>) -> Result<T, Failure> {
        r.map_err(|e| self.fail(format!("{op} returned an error: {e}")))
    }

    /// The state of `key`: through the independent reader when there is one (and then `inspect` must agree
    /// on the value and on having a TTL), else through `inspect`.
    async fn read(&self, key: &str) -> Result<Option<KeyState>, Failure> {
        let inspected = self.ok("inspect", self.node.inspect(key).await)?;
        let Some(reader) = self.reader else {
            return Ok(inspected);
        };
        let read = reader
            .read(key)
            .await
            .map_err(|e| self.fail(format!("the independent read of {key} failed: {e}")))?;
        let same = match (&read, &inspected) {
            (None, None) => true,
            (Some(r), Some(i)) => r.value == i.value && r.ttl.is_some() == i.ttl.is_some(),
            _ => false,
        };
        self.ensure(same, || {
            format!("inspect of {key} answered {inspected:?}, an independent read {read:?}")
        })?;
        Ok(read)
    }

    /// Waits (up to [`NOTIFY_WAIT`] on the timer) until `watch` holds a notification; whether it did.
    async fn notified(&self, watch: &mut Watch) -> bool {
        self.notified_within(watch, NOTIFY_WAIT).await
    }

    /// Waits (up to `limit` on the timer) until `watch` holds a notification; whether it did.
    async fn notified_within(&self, watch: &mut Watch, limit: Duration) -> bool {
        let mut sleep = self.timer.sleep_until(self.timer.now() + limit);
        std::future::poll_fn(|cx| {
            if watch.poll_notified(cx, self.timer.now()).is_ready() {
                return std::task::Poll::Ready(true);
            }
            sleep.as_mut().poll(cx).map(|()| false)
        })
        .await
    }

    async fn sleep(&self, d: Duration) {
        let at = self.timer.now() + d;
        self.timer.sleep_until(at).await;
    }

    /// Asserts the key holds `token` with a TTL in `(ttl - slack, ttl]`.
    async fn expect_held(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        slack: Duration,
    ) -> Outcome {
        let state = self.read(key).await?;
        let Some(state) = state else {
            return Err(self.fail(format!("expected {key} to hold our token, found no key")));
        };
        self.ensure(state.holds(token), || format!("{key} holds another value"))?;
        let Some(left) = state.ttl else {
            return Err(self.fail(format!("{key} has no TTL")));
        };
        self.ensure(left <= ttl && left + slack > ttl, || {
            format!(
                "{key} TTL {left:?} not within ({:?}, {ttl:?}]",
                ttl.saturating_sub(slack)
            )
        })
    }

    async fn expect_absent(&self, key: &str) -> Outcome {
        let state = self.read(key).await?;
        self.ensure(state.is_none(), || {
            format!("expected {key} to be absent, found {state:?}")
        })
    }

    async fn fence_value(&self, fence_key: &str) -> Result<Option<u64>, Failure> {
        let state = self.read(fence_key).await?;
        match state {
            None => Ok(None),
            Some(s) => {
                self.ensure(s.ttl.is_none(), || {
                    format!("fence key {fence_key} has a TTL {:?}", s.ttl)
                })?;
                std::str::from_utf8(&s.value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map(Some)
                    .ok_or_else(|| self.fail(format!("fence key {fence_key} is not an integer")))
            }
        }
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap_or(Ttl::MAX)
}

fn token() -> Result<Token, Failure> {
    Token::random().map_err(|e| Failure {
        case: "setup",
        message: e.to_string(),
    })
}

const LONG: u64 = 10_000;
/// The four forms of a [`ClaimRequest`]: (`fresh`, `wants_ttl`).
const CLAIM_FORMS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];
/// The TTL (ms) of the permits a batch then extends to [`LONG`]: the batch is sent well within it, even on a
/// loaded machine, and the case sleeps past it to see the extension hold.
const SHORT_PERMIT: u64 = 2_000;
/// How much shorter than what was set a TTL may read: the time between a write and the read that checks it,
/// with both on a loaded machine (a live node's reader may be another connection or process). Every TTL
/// checked is at least `LONG / 2`, more than twice this, so a wrong TTL (reset, not reset, shortened,
/// lengthened) still falls outside the window.
const SLACK: Duration = Duration::from_secs(2);

/// Runs every case against `node`, sleeping on `timer` to observe expiry.
///
/// # Errors
/// The first [`Failure`].
pub async fn run(node: &dyn RedisNode, timer: &dyn Timer) -> Result<(), Failure> {
    run_cases(node, None, timer).await
}

/// Runs every case like [`run`], reading every state through `reader` (independent of the node) and checking
/// that the node's `inspect` agrees with it.
///
/// # Errors
/// The first [`Failure`].
pub async fn run_with_reader(
    node: &dyn RedisNode,
    reader: &dyn StateReader,
    timer: &dyn Timer,
) -> Result<(), Failure> {
    run_cases(node, Some(reader), timer).await
}

/// Checks a wrapper node (a decorator around `inner`): that it reports the inner node's capabilities — its
/// [`profile`](RedisNode::profile) (the endpoint, whether a fresh [`claim`](RedisNode::claim) is a plain
/// `SET NX`, the batch limit), the start-up check's [`readiness`](RedisNode::readiness), the inner node's
/// [`notifier`](RedisNode::notifier), and the holder's TTL where the inner node's `claim` reports it — and
/// that every case of [`run`] passes through
/// it, with each state read from `inner` directly.
///
/// A wrapper written with [`redlease::NodeWrapper`] forwards everything by default; one that implements
/// [`RedisNode`] and writes only the required methods fails here (case `wrapper_forwards_capabilities`).
///
/// ```
/// use redlease::SystemTimer;
/// use redlease_testkit::{block_on, conformance, MemoryNode};
///
/// let inner = MemoryNode::new();
/// // `Arc<N>` and `Box<N>` are wrappers too.
/// let wrapper = std::sync::Arc::new(inner.clone());
/// block_on(conformance::run_wrapper(&wrapper, &inner, &SystemTimer)).unwrap();
/// ```
///
/// # Errors
/// The first [`Failure`].
pub async fn run_wrapper(
    wrapper: &dyn RedisNode,
    inner: &dyn RedisNode,
    timer: &dyn Timer,
) -> Result<(), Failure> {
    let case = "wrapper_forwards_capabilities";
    let (w, i) = (wrapper.profile(), inner.profile());
    if w != i {
        return Err(Failure {
            case,
            message: format!("profile() is {w:?}, the inner node's is {i:?}"),
        });
    }
    let key = "redlease:conformance:{wrapper}:run_id";
    let (w, i) = (wrapper.run_id(key).await, inner.run_id(key).await);
    let same = match (&w, &i) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.kind() == b.kind(),
        _ => false,
    };
    if !same {
        return Err(Failure {
            case,
            message: format!("run_id() is {w:?}, the inner node's is {i:?}"),
        });
    }
    let wait = redlease::ReplicaWait::new(0, Duration::from_millis(50));
    let (w, i) = (
        wrapper.wait_replicas(key, wait).await,
        inner.wait_replicas(key, wait).await,
    );
    let same = match (&w, &i) {
        (Ok(_), Ok(_)) => true,
        (Err(a), Err(b)) => a.kind() == b.kind(),
        _ => false,
    };
    if !same {
        return Err(Failure {
            case,
            message: format!("wait_replicas() is {w:?}, the inner node's is {i:?}"),
        });
    }
    let same_notifier = match (wrapper.notifier(), inner.notifier()) {
        (None, None) => true,
        (Some(w), Some(i)) => w.same(i),
        _ => false,
    };
    if !same_notifier {
        return Err(Failure {
            case,
            message: format!(
                "notifier() is {}, the inner node's is {} (a wrapper forwards the inner node's notifier)",
                if wrapper.notifier().is_some() {
                    "Some"
                } else {
                    "None"
                },
                if inner.notifier().is_some() {
                    "Some"
                } else {
                    "None"
                },
            ),
        });
    }
    // The holder's TTL that the inner node reports must come through (the default reports none).
    let fail = |message: String| Failure { case, message };
    let key = format!(
        "redlease:conformance:{{{}}}:wrapper",
        &token()?.as_str()[..12]
    );
    let (owner, other) = (token()?, token()?);
    inner
        .acquire(&key, &owner, ttl(LONG))
        .await
        .map_err(|e| fail(format!("acquire through the inner node failed: {e}")))?;
    let waiting = ClaimRequest::new(&key, &other, ttl(LONG))
        .fresh(true)
        .wants_ttl(true);
    let claims = (inner.claim(waiting).await, wrapper.claim(waiting).await);
    let _ = inner.release(&key, &owner).await;
    match claims {
        (Ok(Claim::Held { remaining: Some(_) }), Ok(Claim::Held { remaining: None })) => {
            return Err(fail(
                "claim reports no TTL where the inner node reports the holder's: not forwarded"
                    .into(),
            ));
        }
        (_, Err(e)) => {
            return Err(fail(format!("claim through the wrapper failed: {e}")));
        }
        _ => {}
    }
    // Several keys in one step: a node that can must still can through the wrapper (a release of a key that
    // does not exist writes nothing).
    let nothing = [MultiKeyItem::new(&key, &other)];
    let (w, i) = (
        wrapper.multi_key(&nothing, MultiKeyOp::Release).await,
        inner.multi_key(&nothing, MultiKeyOp::Release).await,
    );
    let unsupported = |r: &Result<MultiKeyReply, NodeError>| matches!(r, Err(e) if e.kind() == NodeErrorKind::Unsupported);
    if unsupported(&w) != unsupported(&i) {
        return Err(fail(format!(
            "multi_key() answered {w:?}, the inner node's {i:?}: not forwarded"
        )));
    }
    // The start-up check's answer (the default says nothing: `Unknown`).
    let (w, i) = (wrapper.readiness(&key).await, inner.readiness(&key).await);
    if std::mem::discriminant(&w) != std::mem::discriminant(&i) || w.paths() != i.paths() {
        return Err(fail(format!(
            "readiness() is {w:?}, the inner node's is {i:?}"
        )));
    }
    run_with_reader(wrapper, &InnerReader(inner), timer).await
}

/// Reads states through a node's own `inspect` (the inner node of a wrapper under test).
struct InnerReader<'a>(&'a dyn RedisNode);

#[async_trait]
impl StateReader for InnerReader<'_> {
    async fn read(&self, key: &str) -> Result<Option<KeyState>, String> {
        self.0.inspect(key).await.map_err(|e| e.to_string())
    }
}

async fn run_cases(
    node: &dyn RedisNode,
    reader: Option<&dyn StateReader>,
    timer: &dyn Timer,
) -> Result<(), Failure> {
    let run_id = token()?;
    let prefix = format!("redlease:conformance:{{{}}}:", &run_id.as_str()[..12]);
    for &case in CASES {
        let ctx = Ctx {
            node,
            reader,
            timer,
            prefix: prefix.clone(),
            case,
        };
        run_case(&ctx).await?;
    }
    Ok(())
}

async fn run_case(c: &Ctx<'_>) -> Outcome {
    let node = c.node;
    let long = Duration::from_millis(LONG);
    match c.case {
        "acquire_free_key" => {
            let (k, t) = (c.key("lock"), token()?);
            let got = c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            c.ensure(got, || "acquire on a free key returned false".into())?;
            c.expect_held(&k, &t, long, SLACK).await
        }
        "acquire_held_key_is_contended" => {
            let (k, owner, other) = (c.key("lock"), token()?, token()?);
            c.ok("acquire", node.acquire(&k, &owner, ttl(LONG)).await)?;
            c.sleep(Duration::from_millis(20)).await;
            let got = c.ok("acquire", node.acquire(&k, &other, ttl(LONG * 2)).await)?;
            c.ensure(!got, || "a second token acquired a held key".into())?;
            // Value unchanged and TTL not reset by the failed attempt.
            c.expect_held(&k, &owner, long - Duration::from_millis(20), SLACK)
                .await
        }
        "acquire_own_token_again_resets_ttl" => {
            let (k, t) = (c.key("lock"), token()?);
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            let again = c.ok("acquire", node.acquire(&k, &t, ttl(LONG * 3)).await)?;
            c.ensure(again, || {
                "re-acquiring with the holder's own token returned false".into()
            })?;
            c.expect_held(&k, &t, long * 3, SLACK).await
        }
        "claim_takes_a_free_key_in_every_form" => {
            for (fresh, wants_ttl) in CLAIM_FORMS {
                let (k, t) = (c.key(&format!("lock:{fresh}:{wants_ttl}")), token()?);
                let req = ClaimRequest::new(&k, &t, ttl(LONG))
                    .fresh(fresh)
                    .wants_ttl(wants_ttl);
                let got = c.ok("claim", node.claim(req).await)?;
                c.ensure(got == Claim::Taken, || {
                    format!("{req:?} on a free key answered {got:?}")
                })?;
                c.expect_held(&k, &t, long, SLACK).await?;
                c.ok("release", node.release(&k, &t).await)?;
            }
            Ok(())
        }
        "claim_never_changes_a_key_held_by_another_and_reports_its_ttl" => {
            let (k, owner) = (c.key("lock"), token()?);
            c.ok("acquire", node.acquire(&k, &owner, ttl(LONG)).await)?;
            c.sleep(Duration::from_millis(20)).await;
            let held = long - Duration::from_millis(20);
            for (fresh, wants_ttl) in CLAIM_FORMS {
                let other = token()?;
                let req = ClaimRequest::new(&k, &other, ttl(LONG * 2))
                    .fresh(fresh)
                    .wants_ttl(wants_ttl);
                match c.ok("claim", node.claim(req).await)? {
                    Claim::Held { remaining: None } => {}
                    // Asked for or not, a TTL reported must be the holder's.
                    Claim::Held {
                        remaining: Some(left),
                    } => c.ensure(left <= held && left + SLACK > held, || {
                        format!(
                            "{req:?} reported the holder's TTL as {left:?}, the key's is ~{held:?}"
                        )
                    })?,
                    got => return Err(c.fail(format!("{req:?} took a held key: {got:?}"))),
                }
                // Value unchanged and TTL not reset by the failed attempt.
                c.expect_held(&k, &owner, held, SLACK).await?;
            }
            c.ok("release", node.release(&k, &owner).await).map(|_| ())
        }
        // A retry of an acquisition (not fresh) recognises its token, and its own-token branch extends the key
        // without ever shortening it. A fresh request never meets its own token but for a late copy of one,
        // which a node whose fresh claim is `SET NX` must leave unanswered: it changes nothing.
        "claim_with_the_holders_token_never_shortens_and_a_fresh_nx_claim_changes_nothing" => {
            let nx = node.profile().fresh_is_nx;
            for (fresh, wants_ttl) in CLAIM_FORMS {
                let (k, t) = (c.key(&format!("lock:{fresh}:{wants_ttl}")), token()?);
                // A retry finds the key its earlier request set; a late fresh copy, one a later round
                // extended (set here with the longer TTL at once: `extend` is checked by its own case).
                let first = if fresh { LONG * 3 } else { LONG };
                c.ok("acquire", node.acquire(&k, &t, ttl(first)).await)?;
                let claim = |ms| {
                    ClaimRequest::new(&k, &t, ttl(ms))
                        .fresh(fresh)
                        .wants_ttl(wants_ttl)
                };
                if !fresh {
                    let again = c.ok("claim", node.claim(claim(LONG * 3)).await)?;
                    c.ensure(again == Claim::Taken, || {
                        format!(
                            "{:?} with the holder's token answered {again:?}",
                            claim(LONG * 3)
                        )
                    })?;
                    c.expect_held(&k, &t, long * 3, SLACK).await?;
                }
                // Shorter than the key has: never shortened, whatever the form and the answer.
                let shorter = c.ok("claim", node.claim(claim(LONG / 2)).await)?;
                if !fresh {
                    c.ensure(shorter == Claim::Taken, || {
                        format!(
                            "{:?} with the holder's token answered {shorter:?}",
                            claim(LONG / 2)
                        )
                    })?;
                } else if nx {
                    c.ensure(matches!(shorter, Claim::Held { .. }), || {
                        format!(
                            "{:?} on a node whose fresh claim is SET NX answered {shorter:?} for an existing key",
                            claim(LONG / 2)
                        )
                    })?;
                }
                c.expect_held(&k, &t, long * 3, SLACK).await?;
                if fresh && nx {
                    // Longer than the key has: a SET NX still changes nothing.
                    let longer = c.ok("claim", node.claim(claim(LONG * 5)).await)?;
                    c.ensure(matches!(longer, Claim::Held { .. }), || {
                        format!(
                            "{:?} on a node whose fresh claim is SET NX answered {longer:?} for an existing key",
                            claim(LONG * 5)
                        )
                    })?;
                    c.expect_held(&k, &t, long * 3, SLACK).await?;
                }
                c.ok("release", node.release(&k, &t).await)?;
            }
            Ok(())
        }
        "release_only_own_token" => {
            let (k, owner, other) = (c.key("lock"), token()?, token()?);
            c.ok("acquire", node.acquire(&k, &owner, ttl(LONG)).await)?;
            let foreign = c.ok("release", node.release(&k, &other).await)?;
            c.ensure(!foreign, || {
                "release with a foreign token returned true".into()
            })?;
            c.expect_held(&k, &owner, long, SLACK).await?;
            let own = c.ok("release", node.release(&k, &owner).await)?;
            c.ensure(own, || {
                "release with the owner's token returned false".into()
            })?;
            c.expect_absent(&k).await?;
            let twice = c.ok("release", node.release(&k, &owner).await)?;
            c.ensure(!twice, || "a second release returned true".into())
        }
        "extend_only_own_token_and_never_creates" => {
            let (k, owner, other) = (c.key("lock"), token()?, token()?);
            c.ok("acquire", node.acquire(&k, &owner, ttl(LONG)).await)?;
            let foreign = c.ok("extend", node.extend(&k, &other, ttl(LONG * 5)).await)?;
            c.ensure(!foreign, || {
                "extend with a foreign token returned true".into()
            })?;
            c.expect_held(&k, &owner, long, SLACK).await?;
            let own = c.ok("extend", node.extend(&k, &owner, ttl(LONG * 5)).await)?;
            c.ensure(own, || {
                "extend with the owner's token returned false".into()
            })?;
            c.expect_held(&k, &owner, long * 5, SLACK).await?;
            let missing = c.key("missing");
            let created = c.ok("extend", node.extend(&missing, &owner, ttl(LONG)).await)?;
            c.ensure(!created, || "extend of a missing key returned true".into())?;
            c.expect_absent(&missing).await
        }
        // `PEXPIRE … GT`: a late or duplicated shorter request must not shorten a key a longer one set.
        "extend_never_shortens_a_key" => {
            let (k, f, owner) = (c.key("lock"), c.key("fence"), token()?);
            let fence = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &owner, ttl(LONG)).await,
            )?;
            c.ensure(fence.is_some(), || {
                "fenced acquire of a free key returned None".into()
            })?;
            let longer = c.ok("extend", node.extend(&k, &owner, ttl(LONG * 3)).await)?;
            c.ensure(longer, || {
                "extend with the owner's token returned false".into()
            })?;
            c.expect_held(&k, &owner, long * 3, SLACK).await?;
            let shorter = c.ok("extend", node.extend(&k, &owner, ttl(LONG / 2)).await)?;
            c.ensure(shorter, || {
                "extend to a shorter TTL than the key has returned false (the key is ours)".into()
            })?;
            c.expect_held(&k, &owner, long * 3, SLACK).await?;
            // The own-token branch of every acquisition extends the same way.
            let again = c.ok("acquire", node.acquire(&k, &owner, ttl(LONG / 2)).await)?;
            c.ensure(again, || {
                "re-acquiring with the holder's token and a shorter TTL returned false".into()
            })?;
            c.expect_held(&k, &owner, long * 3, SLACK).await?;
            let retry = ClaimRequest::new(&k, &owner, ttl(LONG / 2)).wants_ttl(true);
            let claim = c.ok("claim", node.claim(retry).await)?;
            c.ensure(claim == Claim::Taken, || {
                format!("a retry with the holder's token and a shorter TTL answered {claim:?}")
            })?;
            c.expect_held(&k, &owner, long * 3, SLACK).await?;
            let retry = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &owner, ttl(LONG / 2)).await,
            )?;
            c.ensure(retry == fence, || {
                format!("a fenced retry with a shorter TTL returned {retry:?} after {fence:?}")
            })?;
            c.expect_held(&k, &owner, long * 3, SLACK).await?;
            if node.profile().batch_limit > 0 {
                let items = [ExtendItem::new(&k, &owner, ttl(LONG / 2))];
                let flags = c.ok("extend_many", node.extend_many(&items).await)?;
                c.ensure(flags == [true], || {
                    format!("extend_many to a shorter TTL answered {flags:?}, expected [true]")
                })?;
                c.expect_held(&k, &owner, long * 3, SLACK).await?;
            }
            // A longer TTL still lengthens it.
            let longest = c.ok("extend", node.extend(&k, &owner, ttl(LONG * 5)).await)?;
            c.ensure(longest, || {
                "extend with the owner's token returned false".into()
            })?;
            c.expect_held(&k, &owner, long * 5, SLACK).await?;
            c.ok("release", node.release(&k, &owner).await).map(|_| ())
        }
        "keys_expire_and_stay_expired" => {
            let (k, owner, next) = (c.key("lock"), token()?, token()?);
            c.ok("acquire", node.acquire(&k, &owner, ttl(60)).await)?;
            c.sleep(Duration::from_millis(150)).await;
            c.expect_absent(&k).await?;
            let extended = c.ok("extend", node.extend(&k, &owner, ttl(LONG)).await)?;
            c.ensure(!extended, || "extend after expiry returned true".into())?;
            c.expect_absent(&k).await?;
            let released = c.ok("release", node.release(&k, &owner).await)?;
            c.ensure(!released, || "release after expiry returned true".into())?;
            let taken = c.ok("acquire", node.acquire(&k, &next, ttl(LONG)).await)?;
            c.ensure(taken, || "acquire after expiry returned false".into())?;
            let stale = c.ok("release", node.release(&k, &owner).await)?;
            c.ensure(!stale, || {
                "the expired owner's release deleted the new owner's key".into()
            })?;
            c.expect_held(&k, &next, long, SLACK).await
        }
        "fenced_acquire_counts_up" => {
            let (k, f) = (c.key("lock"), c.key("fence"));
            let mut last = 0;
            for round in 0..5 {
                let t = token()?;
                let fence = c.ok(
                    "acquire_fenced",
                    node.acquire_fenced(&k, &f, &t, ttl(LONG)).await,
                )?;
                let Some(fence) = fence else {
                    return Err(c.fail(format!(
                        "fenced acquire of a free key returned None in round {round}"
                    )));
                };
                c.ensure(fence == last + 1, || {
                    format!("fence {fence} after {last}: expected exactly +1")
                })?;
                c.ensure(c_fence_eq(c.fence_value(&f).await?, fence), || {
                    "stored fence differs".into()
                })?;
                c.expect_held(&k, &t, long, SLACK).await?;
                c.ok("release", node.release(&k, &t).await)?;
                last = fence;
            }
            Ok(())
        }
        "fenced_contention_changes_nothing" => {
            let (k, f) = (c.key("lock"), c.key("fence"));
            let (owner, other) = (token()?, token()?);
            let first = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &owner, ttl(LONG)).await,
            )?;
            c.ensure(first == Some(1), || {
                format!("first fence was {first:?}, expected Some(1)")
            })?;
            let second = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &other, ttl(LONG * 2)).await,
            )?;
            c.ensure(second.is_none(), || {
                format!("contended fenced acquire returned {second:?}")
            })?;
            c.ensure(c_fence_eq(c.fence_value(&f).await?, 1), || {
                "contention changed the fence".into()
            })?;
            c.expect_held(&k, &owner, long, SLACK).await
        }
        "fenced_own_token_retry_reuses_the_fence" => {
            let (k, f, t) = (c.key("lock"), c.key("fence"), token()?);
            let first = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &t, ttl(LONG)).await,
            )?;
            let retry = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &t, ttl(LONG * 2)).await,
            )?;
            c.ensure(first.is_some() && retry == first, || {
                format!("a retry with the holder's token returned {retry:?} after {first:?}")
            })?;
            c.ensure(c_fence_eq(c.fence_value(&f).await?, 1), || {
                "a retry incremented the fence".into()
            })?;
            c.expect_held(&k, &t, long * 2, SLACK).await
        }
        "fenced_bad_counter_fails_before_writing" => {
            let (k, f, t) = (c.key("lock"), c.key("fence"), token()?);
            // Store a non-integer (a token) under the fence key through the trait itself.
            c.ok("acquire", node.acquire(&f, &token()?, ttl(LONG)).await)?;
            let r = node.acquire_fenced(&k, &f, &t, ttl(LONG)).await;
            match r {
                Err(e) => c.ensure(!e.is_ambiguous(), || {
                    format!("a rejected script reported an ambiguous error: {e}")
                })?,
                Ok(v) => {
                    return Err(c.fail(format!(
                        "fenced acquire with a non-integer fence returned {v:?}"
                    )));
                }
            }
            c.expect_absent(&k).await
        }
        // An optional capability: a node answering `Unsupported` (without sending anything) passes.
        "raise_fence_never_lowers_and_later_fences_exceed_it" => {
            let (k, f) = (c.key("lock"), c.key("fence"));
            let raised = match node.raise_fence(&f, 1000).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => c.ok("raise_fence", other)?,
            };
            c.ensure(raised == 1000, || {
                format!("raising a missing counter to 1000 returned {raised}")
            })?;
            c.ensure(c.fence_value(&f).await? == Some(1000), || {
                "the raised counter does not hold 1000".into()
            })?;
            let lower = c.ok("raise_fence", node.raise_fence(&f, 10).await)?;
            c.ensure(lower == 1000, || {
                format!("raising to 10 returned {lower}, not the larger 1000")
            })?;
            let t = token()?;
            let fence = c.ok(
                "acquire_fenced",
                node.acquire_fenced(&k, &f, &t, ttl(LONG)).await,
            )?;
            c.ensure(fence == Some(1001), || {
                format!("the first fence after raising to 1000 was {fence:?}")
            })?;
            let again = c.ok("raise_fence", node.raise_fence(&f, 5000).await)?;
            c.ensure(again == 5000, || {
                format!("raising 1001 to 5000 returned {again}")
            })?;
            c.ensure(c.fence_value(&f).await? == Some(5000), || {
                "the counter was not raised to 5000".into()
            })?;
            c.ok("release", node.release(&k, &t).await)?;
            Ok(())
        }
        "permits_admit_at_most_n_and_expire_by_the_servers_clock" => {
            // An optional capability (leased semaphores): a node that claims it must keep these contracts.
            use redlease::{PermitOp, PermitReply};
            let k = c.key("semaphore");
            let (a, b, x) = (token()?, token()?, token()?);
            let two = PermitOp::Acquire { permits: 2 };
            match node.permit(&k, &a, ttl(LONG), two).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    let r = c.ok("permit acquire", other)?;
                    c.ensure(r == PermitReply::Done, || {
                        format!("the first of 2 permits: {r:?}")
                    })?;
                }
            }
            let r = c.ok("permit acquire", node.permit(&k, &b, ttl(300), two).await)?;
            c.ensure(r == PermitReply::Done, || {
                format!("the second of 2 permits: {r:?}")
            })?;
            let r = c.ok("permit acquire", node.permit(&k, &x, ttl(LONG), two).await)?;
            match r {
                PermitReply::Full {
                    next_expiry: Some(next),
                } => c.ensure(next <= Duration::from_millis(300), || {
                    format!("the earliest permit expires in 300 ms, reported {next:?}")
                })?,
                other => return Err(c.fail(format!("a third of 2 permits: {other:?}"))),
            }
            // A holder's own acquisition refreshes its permit; a stranger cannot extend or release.
            let r = c.ok("permit acquire", node.permit(&k, &a, ttl(LONG), two).await)?;
            c.ensure(r == PermitReply::Done, || {
                format!("re-acquiring a held permit: {r:?}")
            })?;
            for op in [PermitOp::Extend, PermitOp::Release] {
                let r = c.ok("permit", node.permit(&k, &x, ttl(LONG), op).await)?;
                c.ensure(r == PermitReply::NotHeld, || {
                    format!("{op:?} by a stranger: {r:?}")
                })?;
            }
            // The short permit expires by itself (the server's clock), and its place is free again.
            c.sleep(Duration::from_millis(400)).await;
            let r = c.ok(
                "permit extend",
                node.permit(&k, &b, ttl(LONG), PermitOp::Extend).await,
            )?;
            c.ensure(r == PermitReply::NotHeld, || {
                format!("extending an expired permit: {r:?}")
            })?;
            let r = c.ok("permit acquire", node.permit(&k, &x, ttl(LONG), two).await)?;
            c.ensure(r == PermitReply::Done, || {
                format!("a permit after one expired: {r:?}")
            })?;
            // A raised count admits more, for new acquisitions only.
            let r = c.ok(
                "permit acquire",
                node.permit(&k, &b, ttl(LONG), PermitOp::Acquire { permits: 3 })
                    .await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("a third of 3 permits: {r:?}")
            })?;
            for t in [&a, &b, &x] {
                let r = c.ok(
                    "permit release",
                    node.permit(&k, t, ttl(LONG), PermitOp::Release).await,
                )?;
                c.ensure(r == PermitReply::Done, || {
                    format!("releasing a held permit: {r:?}")
                })?;
                let r = c.ok(
                    "permit release",
                    node.permit(&k, t, ttl(LONG), PermitOp::Release).await,
                )?;
                c.ensure(r == PermitReply::NotHeld, || {
                    format!("releasing twice: {r:?}")
                })?;
            }
            c.expect_absent(&k).await
        }
        "read_write_permits_share_exclude_and_claim" => {
            // An optional capability (read/write locks): a node that claims it must keep these contracts.
            use redlease::{PermitOp, PermitReply};
            let k = c.key("rw");
            let (r1, r2, w) = (token()?, token()?, token()?);
            let write = PermitOp::AcquireExclusive {
                claim: ttl(300),
                fence: None,
            };
            match node
                .permit(&k, &r1, ttl(LONG), PermitOp::AcquireShared)
                .await
            {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    let r = c.ok("shared acquire", other)?;
                    c.ensure(r == PermitReply::Done, || {
                        format!("the first reader: {r:?}")
                    })?;
                }
            }
            let r = c.ok(
                "shared acquire",
                node.permit(&k, &r2, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(r == PermitReply::Done, || format!("a second reader: {r:?}"))?;
            // The writer finds readers: it records a claim, answered with the claim's life at most.
            let r = c.ok(
                "exclusive acquire",
                node.permit(&k, &w, ttl(LONG), write).await,
            )?;
            match r {
                PermitReply::Full {
                    next_expiry: Some(next),
                } => c.ensure(next <= Duration::from_millis(300), || {
                    format!("a writer's 300 ms claim reported {next:?}")
                })?,
                other => return Err(c.fail(format!("a writer beside readers: {other:?}"))),
            }
            // The claim holds a new reader off; an existing reader refreshes its share.
            let r3 = token()?;
            let r = c.ok(
                "shared acquire",
                node.permit(&k, &r3, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(matches!(r, PermitReply::Full { .. }), || {
                format!("a reader beside a claim: {r:?}")
            })?;
            let r = c.ok(
                "shared extend",
                node.permit(&k, &r1, ttl(LONG), PermitOp::Extend).await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("a reader's extension: {r:?}")
            })?;
            for t in [&r1, &r2] {
                let r = c.ok(
                    "shared release",
                    node.permit(&k, t, ttl(LONG), PermitOp::Release).await,
                )?;
                c.ensure(r == PermitReply::Done, || {
                    format!("a reader's release: {r:?}")
                })?;
            }
            let r = c.ok(
                "exclusive acquire",
                node.permit(&k, &w, ttl(LONG), write).await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("the writer after the readers left: {r:?}")
            })?;
            let r = c.ok(
                "shared acquire",
                node.permit(&k, &r3, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(matches!(r, PermitReply::Full { .. }), || {
                format!("a reader beside the writer: {r:?}")
            })?;
            let other = token()?;
            let r = c.ok(
                "exclusive acquire",
                node.permit(&k, &other, ttl(LONG), write).await,
            )?;
            c.ensure(matches!(r, PermitReply::Full { .. }), || {
                format!("a second writer: {r:?}")
            })?;
            let r = c.ok(
                "exclusive release",
                node.permit(&k, &w, ttl(LONG), PermitOp::Release).await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("the writer's release: {r:?}")
            })?;
            // The second writer's claim (300 ms) expires by itself; then a reader gets in.
            c.sleep(Duration::from_millis(400)).await;
            let r = c.ok(
                "shared acquire",
                node.permit(&k, &r3, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("a reader after the claim expired: {r:?}")
            })?;
            c.ok(
                "shared release",
                node.permit(&k, &r3, ttl(LONG), PermitOp::Release).await,
            )?;
            c.expect_absent(&k).await
        }
        "fair_permits_serve_the_queue_in_arrival_order" => {
            // An optional capability (fair locks): a node that claims it must keep these contracts.
            use redlease::{PermitOp, PermitReply};
            let k = c.key("fair");
            let fair = PermitOp::AcquireFair {
                claim: ttl(2_000),
                queue: 2,
            };
            let (h, w1, w2, w3) = (token()?, token()?, token()?, token()?);
            match node.permit(&k, &h, ttl(LONG), fair).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    let r = c.ok("fair acquire", other)?;
                    c.ensure(r == PermitReply::Done, || {
                        format!("the first fair acquire: {r:?}")
                    })?;
                }
            }
            for w in [&w1, &w2] {
                let r = c.ok("fair acquire", node.permit(&k, w, ttl(LONG), fair).await)?;
                c.ensure(matches!(r, PermitReply::Full { .. }), || {
                    format!("a waiter: {r:?}")
                })?;
                c.sleep(Duration::from_millis(5)).await;
            }
            // The queue holds two: a third waiter is refused, changing nothing.
            match node.permit(&k, &w3, ttl(LONG), fair).await {
                Err(e) => c.ensure(e.kind() == NodeErrorKind::Busy && !e.is_ambiguous(), || {
                    format!("a waiter beyond the queue: {e}")
                })?,
                Ok(r) => return Err(c.fail(format!("a waiter beyond the queue: {r:?}"))),
            }
            let r = c.ok(
                "fair release",
                node.permit(&k, &h, ttl(LONG), PermitOp::Release).await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("the holder's release: {r:?}")
            })?;
            // The second in line cannot jump the first.
            let r = c.ok("fair acquire", node.permit(&k, &w2, ttl(LONG), fair).await)?;
            c.ensure(matches!(r, PermitReply::Full { .. }), || {
                format!("the second before the first: {r:?}")
            })?;
            let r = c.ok("fair acquire", node.permit(&k, &w1, ttl(LONG), fair).await)?;
            c.ensure(r == PermitReply::Done, || {
                format!("the first in line: {r:?}")
            })?;
            let r = c.ok(
                "fair extend",
                node.permit(&k, &w1, ttl(LONG), PermitOp::Extend).await,
            )?;
            c.ensure(r == PermitReply::Done, || {
                format!("the fair holder's extension: {r:?}")
            })?;
            // A waiter that leaves (release) gives up its place.
            c.ok(
                "fair release",
                node.permit(&k, &w2, ttl(LONG), PermitOp::Release).await,
            )?;
            c.ok(
                "fair release",
                node.permit(&k, &w1, ttl(LONG), PermitOp::Release).await,
            )?;
            c.expect_absent(&k).await
        }
        "fenced_writers_take_a_larger_fence_with_each_grant" => {
            // An optional capability (a read/write lock's fenced writer): the counter is incremented in the
            // step that grants the writer the lock, and only then.
            use redlease::{PermitOp, PermitReply};
            let (k, f) = (c.key("rw"), c.key("fence"));
            let write = PermitOp::AcquireExclusive {
                claim: ttl(300),
                fence: Some(&f),
            };
            let (w1, w2, r) = (token()?, token()?, token()?);
            match node.permit(&k, &w1, ttl(LONG), write).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    let got = c.ok("fenced exclusive acquire", other)?;
                    c.ensure(got == PermitReply::Fenced { fence: 1 }, || {
                        format!("the first fenced writer on a fresh counter: {got:?}")
                    })?;
                }
            }
            c.ensure(c.fence_value(&f).await? == Some(1), || {
                "the counter does not hold 1 after the first grant".into()
            })?;
            // The holder's own retry is a refresh: the number it has, no new one.
            let got = c.ok(
                "fenced exclusive acquire",
                node.permit(&k, &w1, ttl(LONG), write).await,
            )?;
            c.ensure(got == PermitReply::Fenced { fence: 1 }, || {
                format!("the holder's refresh: {got:?}")
            })?;
            // Blocked attempts (a reader, another writer) never touch the counter; readers get no fence.
            let got = c.ok(
                "shared acquire",
                node.permit(&k, &r, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(matches!(got, PermitReply::Full { .. }), || {
                format!("a reader beside the fenced writer: {got:?}")
            })?;
            let got = c.ok(
                "fenced exclusive acquire",
                node.permit(&k, &w2, ttl(LONG), write).await,
            )?;
            c.ensure(matches!(got, PermitReply::Full { .. }), || {
                format!("a second writer: {got:?}")
            })?;
            c.ensure(c.fence_value(&f).await? == Some(1), || {
                "a blocked writer moved the counter".into()
            })?;
            let got = c.ok(
                "exclusive release",
                node.permit(&k, &w1, ttl(LONG), PermitOp::Release).await,
            )?;
            c.ensure(got == PermitReply::Done, || {
                format!("the fenced writer's release: {got:?}")
            })?;
            let got = c.ok(
                "fenced exclusive acquire",
                node.permit(&k, &w2, ttl(LONG), write).await,
            )?;
            c.ensure(got == PermitReply::Fenced { fence: 2 }, || {
                format!("the next writer: {got:?}")
            })?;
            c.ok(
                "exclusive release",
                node.permit(&k, &w2, ttl(LONG), PermitOp::Release).await,
            )?;
            let got = c.ok(
                "shared acquire",
                node.permit(&k, &r, ttl(LONG), PermitOp::AcquireShared)
                    .await,
            )?;
            c.ensure(got == PermitReply::Done, || {
                format!("a reader once the writers left: {got:?}")
            })?;
            c.ok(
                "shared release",
                node.permit(&k, &r, ttl(LONG), PermitOp::Release).await,
            )?;
            c.ensure(c.fence_value(&f).await? == Some(2), || {
                "the counter does not hold 2 after two grants".into()
            })?;
            c.expect_absent(&k).await
        }
        "permits_extend_in_a_batch" => {
            // Optional capabilities (semaphores, batched extension): a node that claims both extends permit
            // items of one `extend_many` call as `permit`'s extension does, beside lock keys.
            use redlease::{ExtendItem, PermitOp, PermitReply};
            let (sem, rw, lock) = (c.key("semaphore"), c.key("rw"), c.key("lock"));
            let (a, b, r, l, x) = (token()?, token()?, token()?, token()?, token()?);
            let two = PermitOp::Acquire { permits: 2 };
            match node.permit(&sem, &a, ttl(SHORT_PERMIT), two).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    c.ok("permit acquire", other)?;
                }
            }
            c.ok(
                "permit acquire",
                node.permit(&sem, &b, ttl(SHORT_PERMIT), two).await,
            )?;
            // Read/write locks are optional too (the adapters on a cluster node without Lua): their item is left
            // out then.
            let shared = match node
                .permit(&rw, &r, ttl(SHORT_PERMIT), PermitOp::AcquireShared)
                .await
            {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => false,
                other => c.ok("shared acquire", other)? == PermitReply::Done,
            };
            c.ok("acquire", node.acquire(&lock, &l, ttl(SHORT_PERMIT)).await)?;
            let mut items = vec![
                ExtendItem::new(&sem, &a, ttl(LONG)).for_permit(),
                ExtendItem::new(&sem, &x, ttl(LONG)).for_permit(),
                ExtendItem::new(&sem, &b, ttl(LONG)).for_permit(),
                ExtendItem::new(&lock, &l, ttl(LONG)),
            ];
            if shared {
                items.push(ExtendItem::new(&rw, &r, ttl(LONG)).for_permit());
            }
            let flags = match node.extend_many(&items).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous() => {
                    for t in [&a, &b] {
                        c.ok(
                            "permit release",
                            node.permit(&sem, t, ttl(LONG), PermitOp::Release).await,
                        )?;
                    }
                    if shared {
                        c.ok(
                            "permit release",
                            node.permit(&rw, &r, ttl(LONG), PermitOp::Release).await,
                        )?;
                    }
                    c.ok("release", node.release(&lock, &l).await)?;
                    return Ok(());
                }
                other => c.ok("extend_many", other)?,
            };
            let mut want = vec![true, false, true, true];
            if shared {
                want.push(true);
            }
            c.ensure(flags == want, || {
                format!(
                    "extend_many over permits (a, a stranger, b), a lock and a reader: {flags:?}"
                )
            })?;
            // The lock key got the longer TTL; the semaphore key follows its permits' expiry.
            c.expect_held(&lock, &l, Duration::from_millis(LONG), SLACK)
                .await?;
            // Past the TTL they had before the batch: only the batch's extension keeps them.
            c.sleep(Duration::from_millis(SHORT_PERMIT + 500)).await;
            for (k, t) in [(&sem, &a), (&sem, &b), (&rw, &r)] {
                if k == &rw && !shared {
                    continue;
                }
                let got = c.ok(
                    "permit extend",
                    node.permit(k, t, ttl(LONG), PermitOp::Extend).await,
                )?;
                c.ensure(got == PermitReply::Done, || {
                    format!("a permit extended in the batch expired at its old TTL: {got:?}")
                })?;
                c.ok(
                    "permit release",
                    node.permit(k, t, ttl(LONG), PermitOp::Release).await,
                )?;
            }
            c.ok("release", node.release(&lock, &l).await)?;
            c.expect_absent(&sem).await
        }
        "run_id_is_stable_between_calls" => {
            // An optional capability: a node that claims it must report one id while its server runs.
            let k = c.key("lock");
            let first = match node.run_id(&k).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => c.ok("run_id", other)?,
            };
            c.ensure(!first.as_str().is_empty(), || "run_id is empty".into())?;
            let again = c.ok("run_id", node.run_id(&k).await)?;
            c.ensure(again == first, || {
                format!("run_id changed between two calls: {first} then {again}")
            })?;
            // A write in between and another key of the same server change nothing.
            let t = token()?;
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            let other = c.ok("run_id", node.run_id(&c.key("other")).await)?;
            c.ensure(other == first, || {
                format!("run_id after a write, for another key, is {other}; before it was {first}")
            })?;
            c.ok("release", node.release(&k, &t).await).map(|_| ())
        }
        "a_claim_reports_the_run_id_that_run_id_answers" => {
            // An optional report: a claim may fill the slot its request carries, and then with the run id
            // `run_id` answers (the same server); a slot left empty is fine (the core asks `run_id`).
            let k = c.key("lock");
            for (fresh, wants_ttl) in [(true, false), (true, true), (false, false), (false, true)] {
                let t = token()?;
                let slot = RunIdSlot::new();
                let req = ClaimRequest::new(&k, &t, ttl(LONG))
                    .fresh(fresh)
                    .wants_ttl(wants_ttl)
                    .report_run_id(&slot);
                let got = c.ok("claim", node.claim(req).await)?;
                let form = format!("fresh {fresh}, wants_ttl {wants_ttl}");
                c.ensure(got.is_taken(), || {
                    format!("a claim ({form}) of a free key with a run id slot answered {got:?}")
                })?;
                if let Some(reported) = slot.get() {
                    let asked = c.ok("run_id", node.run_id(&k).await)?;
                    c.ensure(asked == *reported, || {
                        format!(
                            "a claim ({form}) reported run id {reported}, but run_id answers {asked}"
                        )
                    })?;
                }
                c.ok("release", node.release(&k, &t).await)?;
            }
            Ok(())
        }
        "wait_replicas_for_more_than_exist_answers_a_shortfall_within_its_timeout" => {
            // No server has a thousand replicas: a node that claims the capability answers how many
            // acknowledged (fewer), not an error, and within about the wait's timeout.
            let (k, t) = (c.key("lock"), token()?);
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            let wait = redlease::ReplicaWait::new(1000, Duration::from_millis(100));
            let started = c.timer.now();
            let acknowledged = match node.wait_replicas(&k, wait).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => c.ok("wait_replicas", other)?,
            };
            let took = c.timer.now().saturating_duration_since(started);
            c.ensure(acknowledged < wait.replicas, || {
                format!("{acknowledged} of 1000 replicas acknowledged")
            })?;
            c.ensure(took < Duration::from_secs(4), || {
                format!("a 100 ms wait for replicas took {took:?}")
            })
        }
        "wait_replicas_for_none_answers_at_once" => {
            // `WAIT 0 timeout` returns at once with the number of replicas that have the writes so far.
            let (k, t) = (c.key("lock"), token()?);
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            let wait = redlease::ReplicaWait::new(0, Duration::from_secs(5));
            let started = c.timer.now();
            match node.wait_replicas(&k, wait).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                other => {
                    c.ok("wait_replicas", other)?;
                }
            }
            let took = c.timer.now().saturating_duration_since(started);
            c.ensure(took < Duration::from_secs(4), || {
                format!("waiting for 0 replicas took {took:?}: it must not wait for the timeout")
            })
        }
        "raise_fence_refuses_a_non_integer_counter" => {
            let f = c.key("fence");
            let junk = token()?;
            c.ok("acquire", node.acquire(&f, &junk, ttl(LONG)).await)?;
            match node.raise_fence(&f, 7).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported => return Ok(()),
                Err(e) => c.ensure(!e.is_ambiguous(), || {
                    format!("a refused raise reported an ambiguous error: {e}")
                })?,
                Ok(v) => {
                    return Err(c.fail(format!(
                        "raise_fence on a counter holding a token returned {v}"
                    )));
                }
            }
            c.expect_held(&f, &junk, long, SLACK).await
        }
        // An optional capability, claimed by a non-zero batch limit in the node's profile.
        "extend_many_answers_each_item_as_extend_would" => {
            if node.profile().batch_limit == 0 {
                return Ok(());
            }
            let (ours, theirs, missing) = (c.key("ours"), c.key("theirs"), c.key("missing"));
            let (t, other) = (token()?, token()?);
            c.ok("acquire", node.acquire(&ours, &t, ttl(LONG)).await)?;
            c.ok("acquire", node.acquire(&theirs, &other, ttl(LONG)).await)?;
            let items = [
                ExtendItem::new(&ours, &t, ttl(LONG * 3)),
                ExtendItem::new(&theirs, &t, ttl(LONG * 3)),
                ExtendItem::new(&missing, &t, ttl(LONG * 3)),
            ];
            let flags = c.ok("extend_many", node.extend_many(&items).await)?;
            c.ensure(flags == [true, false, false], || {
                format!("extend_many answered {flags:?}, expected [true, false, false]")
            })?;
            c.expect_held(&ours, &t, long * 3, SLACK).await?;
            c.expect_held(&theirs, &other, long, SLACK).await?;
            c.expect_absent(&missing).await?;
            let none = c.ok("extend_many", node.extend_many(&[]).await)?;
            c.ensure(none.is_empty(), || {
                format!("an empty batch answered {none:?}")
            })
        }
        "multi_key_takes_every_key_or_none_with_its_fences_in_one_step" => {
            let (a, b, cc) = (c.key("a"), c.key("b"), c.key("c"));
            let (fa, fc) = (c.key("a:fence"), c.key("c:fence"));
            let (ta, tb, tc, other) = (token()?, token()?, token()?, token()?);
            let items = [
                MultiKeyItem::new(&a, &ta).fenced(&fa),
                MultiKeyItem::new(&b, &tb),
                MultiKeyItem::new(&cc, &tc).fenced(&fc),
            ];
            let acquire = |ttl_ms| MultiKeyOp::Acquire { ttl: ttl(ttl_ms) };
            // Another owner holds the middle key: nothing at all is written, not even the first key or a fence.
            c.ok("acquire", node.acquire(&b, &other, ttl(LONG)).await)?;
            match node.multi_key(&items, acquire(LONG * 2)).await {
                Err(e) if e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous() => {
                    // Not claimed: it must have sent nothing.
                    c.expect_absent(&a).await?;
                    c.expect_absent(&cc).await?;
                    return c.expect_held(&b, &other, long, SLACK).await;
                }
                Err(e) => return Err(c.fail(format!("multi_key returned an error: {e}"))),
                Ok(MultiKeyReply::Held {
                    index: 1,
                    remaining,
                }) => {
                    c.ensure(
                        remaining.is_none_or(|r| r <= long && r + SLACK > long),
                        || format!("the holder's remaining TTL {remaining:?}, not about {long:?}"),
                    )?;
                }
                Ok(other) => {
                    return Err(c.fail(format!(
                        "multi_key over a held second key answered {other:?}, expected Held {{ index: 1, .. }}"
                    )));
                }
            }
            c.expect_absent(&a).await?;
            c.expect_absent(&cc).await?;
            c.expect_held(&b, &other, long, SLACK).await?;
            c.ensure(c.fence_value(&fa).await?.is_none(), || {
                "a refused multi_key created a fence".into()
            })?;
            c.ensure(c.fence_value(&fc).await?.is_none(), || {
                "a refused multi_key created a fence".into()
            })?;
            // Free: every key set with its token and the TTL, every fence issued, in one call.
            c.ok("release", node.release(&b, &other).await)?;
            let reply = c.ok("multi_key", node.multi_key(&items, acquire(LONG)).await)?;
            c.ensure(
                reply
                    == MultiKeyReply::Taken {
                        fences: vec![Some(1), None, Some(1)],
                    },
                || format!("multi_key on free keys answered {reply:?}"),
            )?;
            c.expect_held(&a, &ta, long, SLACK).await?;
            c.expect_held(&b, &tb, long, SLACK).await?;
            c.expect_held(&cc, &tc, long, SLACK).await?;
            c.ensure(c_fence_eq(c.fence_value(&fa).await?, 1), || {
                "fence a".into()
            })?;
            c.ensure(c_fence_eq(c.fence_value(&fc).await?, 1), || {
                "fence c".into()
            })?;
            // Again with our tokens (a retry whose reply was lost), shorter: nothing shortened, no new fence.
            let again = c.ok("multi_key", node.multi_key(&items, acquire(LONG / 2)).await)?;
            c.ensure(
                again
                    == MultiKeyReply::Taken {
                        fences: vec![Some(1), None, Some(1)],
                    },
                || format!("multi_key with our own tokens answered {again:?}"),
            )?;
            c.expect_held(&a, &ta, long, SLACK).await?;
            c.expect_held(&cc, &tc, long, SLACK).await?;
            // One key ours, another taken by someone else meanwhile: refused, and ours is not touched.
            c.ok("release", node.release(&cc, &tc).await)?;
            c.ok("acquire", node.acquire(&cc, &other, ttl(LONG * 3)).await)?;
            let refused = c.ok("multi_key", node.multi_key(&items, acquire(LONG * 2)).await)?;
            c.ensure(
                matches!(refused, MultiKeyReply::Held { index: 2, .. }),
                || format!("multi_key with the third key held by another answered {refused:?}"),
            )?;
            c.expect_held(&a, &ta, long, SLACK).await?;
            c.ensure(c_fence_eq(c.fence_value(&fc).await?, 1), || {
                "fence c changed".into()
            })?;
            // A fence counter that is not an integer: a definite error, and nothing written.
            let (x, y, fx) = (c.key("x"), c.key("y"), c.key("x:fence"));
            c.ok("acquire", node.acquire(&fx, &other, ttl(LONG)).await)?;
            let bad = [
                MultiKeyItem::new(&y, &tb),
                MultiKeyItem::new(&x, &ta).fenced(&fx),
            ];
            match node.multi_key(&bad, acquire(LONG)).await {
                Err(e) => c.ensure(!e.is_ambiguous(), || {
                    format!("expected a definite error for a bad fence counter, got {e}")
                })?,
                Ok(r) => return Err(c.fail(format!("a bad fence counter answered {r:?}"))),
            }
            c.expect_absent(&x).await?;
            c.expect_absent(&y).await
        }
        "multi_key_extends_without_shortening_and_releases_only_own_tokens" => {
            let (a, b, missing) = (c.key("a"), c.key("b"), c.key("missing"));
            let (ta, tb, other) = (token()?, token()?, token()?);
            let both = [MultiKeyItem::new(&a, &ta), MultiKeyItem::new(&b, &tb)];
            match node
                .multi_key(&both, MultiKeyOp::Acquire { ttl: ttl(LONG * 2) })
                .await
            {
                Err(e) if e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous() => {
                    c.expect_absent(&a).await?;
                    return c.expect_absent(&b).await;
                }
                r => {
                    let r = c.ok("multi_key", r)?;
                    c.ensure(matches!(r, MultiKeyReply::Taken { .. }), || {
                        format!("multi_key on free keys answered {r:?}")
                    })?;
                }
            }
            let items = [
                MultiKeyItem::new(&a, &ta),
                MultiKeyItem::new(&b, &other),
                MultiKeyItem::new(&missing, &ta),
            ];
            // Shorter: kept; the foreign item and the missing key answer false, nothing created.
            let short = c.ok(
                "multi_key",
                node.multi_key(&items, MultiKeyOp::Extend { ttl: ttl(LONG) })
                    .await,
            )?;
            c.ensure(short == MultiKeyReply::Done(vec![true, false, false]), || {
                format!("a shorter extension answered {short:?}, expected Done([true, false, false])")
            })?;
            c.expect_held(&a, &ta, long * 2, SLACK).await?;
            c.expect_absent(&missing).await?;
            let longer = c.ok(
                "multi_key",
                node.multi_key(&items, MultiKeyOp::Extend { ttl: ttl(LONG * 3) })
                    .await,
            )?;
            c.ensure(
                longer == MultiKeyReply::Done(vec![true, false, false]),
                || format!("a longer extension answered {longer:?}"),
            )?;
            c.expect_held(&a, &ta, long * 3, SLACK).await?;
            c.expect_held(&b, &tb, long * 2, SLACK).await?;
            // Released: only keys holding their item's token.
            let released = c.ok(
                "multi_key",
                node.multi_key(&items, MultiKeyOp::Release).await,
            )?;
            c.ensure(
                released == MultiKeyReply::Done(vec![true, false, false]),
                || {
                    format!(
                        "the release answered {released:?}, expected Done([true, false, false])"
                    )
                },
            )?;
            c.expect_absent(&a).await?;
            c.expect_held(&b, &tb, long * 2, SLACK).await?;
            let gone = c.ok(
                "multi_key",
                node.multi_key(&both, MultiKeyOp::Release).await,
            )?;
            c.ensure(gone == MultiKeyReply::Done(vec![false, true]), || {
                format!("the second release answered {gone:?}, expected Done([false, true])")
            })?;
            c.expect_absent(&b).await
        }
        "fenced_own_token_without_counter_fails" => {
            let (k, f, t) = (c.key("lock"), c.key("fence"), token()?);
            // The lock holds our token but no fence was ever issued for it: the number cannot be confirmed.
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            match node.acquire_fenced(&k, &f, &t, ttl(LONG * 2)).await {
                Err(e) => c.ensure(!e.is_ambiguous(), || {
                    format!("expected a definite error, got {e}")
                })?,
                Ok(v) => return Err(c.fail(format!("returned {v:?} without a fence counter"))),
            }
            c.ensure(c.fence_value(&f).await?.is_none(), || {
                "the failed call created a fence".into()
            })?;
            c.expect_held(&k, &t, long, SLACK).await
        }
        "ttl_edges" => {
            let (k, t) = (c.key("short"), token()?);
            c.ok("acquire", node.acquire(&k, &t, ttl(1)).await)?;
            c.sleep(Duration::from_millis(20)).await;
            c.expect_absent(&k).await?;
            let (k, t) = (c.key("huge"), token()?);
            let got = c.ok("acquire", node.acquire(&k, &t, Ttl::MAX).await)?;
            c.ensure(got, || "acquire with Ttl::MAX returned false".into())?;
            c.expect_held(&k, &t, Ttl::MAX.as_duration(), Duration::from_secs(60))
                .await?;
            let ext = c.ok("extend", node.extend(&k, &t, Ttl::MAX).await)?;
            c.ensure(ext, || "extend with Ttl::MAX returned false".into())?;
            c.ok("release", node.release(&k, &t).await).map(|_| ())
        }
        "unusual_key_names" => {
            for name in [
                "spaces in name",
                "ünïcødé",
                "{braces}",
                "colon:and:more",
                "\"quotes\"",
                "x",
            ] {
                let (k, t) = (c.key(name), token()?);
                let got = c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
                c.ensure(got, || format!("acquire of key {k:?} returned false"))?;
                c.expect_held(&k, &t, long, SLACK).await?;
                let released = c.ok("release", node.release(&k, &t).await)?;
                c.ensure(released, || format!("release of key {k:?} returned false"))?;
            }
            Ok(())
        }
        "a_node_that_notifies_publishes_each_release_and_unsubscribes" => {
            let Some(notifier) = node.notifier() else {
                return Ok(());
            };
            let before = notifier.stats();
            let k = c.key("lock");
            let mut watch = notifier.watch(&k);
            match watch.subscribe(c.timer.now()) {
                Subscription::Active | Subscription::Pending => {}
                other => return Err(c.fail(format!("subscribing answered {other:?}"))),
            }
            // The confirmed subscription is itself a notification.
            c.ensure(c.notified(&mut watch).await && watch.is_active(), || {
                format!("the subscription was not confirmed within {NOTIFY_WAIT:?}")
            })?;
            watch.begin_attempt();
            watch.end_attempt(notify::Outcome::Held);
            // Releases no waiting attempt was ever made for (no waiter marker): a plain one and, where the
            // node takes several keys in one step, a multi-key one. A node that keeps waiter markers
            // publishes neither (checked below, once the marker is seen).
            let lone = token()?;
            c.ok("acquire", node.acquire(&k, &lone, ttl(LONG)).await)?;
            c.ok("release", node.release(&k, &lone).await)?;
            let one = [MultiKeyItem::new(&k, &lone)];
            let multi_key = match node
                .multi_key(&one, MultiKeyOp::Acquire { ttl: ttl(LONG) })
                .await
            {
                Err(e) if e.kind() == NodeErrorKind::Unsupported && !e.is_ambiguous() => false,
                r => {
                    c.ok("multi_key", r)?;
                    let r = c.ok("multi_key", node.multi_key(&one, MultiKeyOp::Release).await)?;
                    c.ensure(r == MultiKeyReply::Done(vec![true]), || {
                        format!("a multi-key release of a held key answered {r:?}")
                    })?;
                    true
                }
            };
            let unmarked_published = c.notified_within(&mut watch, QUIET_WAIT).await;
            if unmarked_published {
                // Both messages in (they arrive within milliseconds), then the watch ready again.
                c.sleep(Duration::from_millis(100)).await;
                watch.begin_attempt();
                watch.end_attempt(notify::Outcome::Held);
            }
            // A release of another token wakes the watch, with the token's payload. Each release follows a
            // contended attempt of a waiting acquisition (`claim` wanting the TTL), which tells a node that
            // keeps waiter markers (`notify::waiting_key`) that a waiter may be listening.
            let t = token()?;
            let waiter = token()?;
            let waiting = ClaimRequest::new(&k, &waiter, ttl(LONG))
                .fresh(true)
                .wants_ttl(true);
            c.ok("acquire", node.acquire(&k, &t, ttl(LONG)).await)?;
            c.ok("claim", node.claim(waiting).await)?;
            let marked = match notify::waiting_key(&k) {
                Some(marker) => c.read(&marker).await?.is_some(),
                None => false,
            };
            let released = c.ok("release", node.release(&k, &t).await)?;
            c.ensure(released, || {
                "release with the owner's token returned false".into()
            })?;
            if !c.notified(&mut watch).await {
                // What the notifier saw and whether the waiter marker is there tell a lost message from a
                // release that did not publish.
                let marker = match (notify::waiting_key(&k), c.reader) {
                    (Some(marker), Some(reader)) => format!("{:?}", reader.read(&marker).await),
                    (marker, _) => format!("{marker:?} (not read)"),
                };
                return Err(c.fail(format!(
                    "no notification within {NOTIFY_WAIT:?} of a release (notifier {:?}, waiter marker {marker})",
                    notifier.stats()
                )));
            }
            watch.begin_attempt();
            watch.end_attempt(notify::Outcome::Held);
            // A release of the watch's own token is recognised by its payload and wakes nobody.
            let own = token()?;
            watch.own(&own);
            c.ok("acquire", node.acquire(&k, &own, ttl(LONG)).await)?;
            c.ok("claim", node.claim(waiting).await)?;
            c.ok("release", node.release(&k, &own).await)?;
            // A second release while the marker lives: by the multi-key release where the node has one.
            let second = token()?;
            c.ok("acquire", node.acquire(&k, &second, ttl(LONG)).await)?;
            if multi_key {
                let one = [MultiKeyItem::new(&k, &second)];
                c.ok("multi_key", node.multi_key(&one, MultiKeyOp::Release).await)?;
            } else {
                c.ok("release", node.release(&k, &second).await)?;
            }
            c.ensure(c.notified(&mut watch).await, || {
                format!("no notification of a second release (multi-key: {multi_key})")
            })?;
            c.ensure(!(marked && unmarked_published), || {
                format!(
                    "a release published although no waiting attempt had been made (no waiter marker; \
                     multi-key release tried: {multi_key}), on a node that keeps waiter markers"
                )
            })?;
            let stats = notifier.stats();
            c.ensure(stats.own > before.own, || {
                format!(
                    "the release of the watch's own token was not recognised (payload other than {:?}?): {stats:?}",
                    notify::payload(&own)
                )
            })?;
            drop(watch);
            c.ensure(notifier.stats().channels == before.channels, || {
                format!(
                    "still subscribed after the last watch was dropped: {:?}",
                    notifier.stats()
                )
            })
        }
        "permit_releases_publish_only_while_a_waiter_may_listen" => {
            // For a node with a notifier and permits: a permit's release publishes after an acquisition the
            // permits blocked (a waiter that may be listening). A node that keeps waiter markers (the
            // blocked acquisition left `notify::waiting_key` of the key behind, as the adapters' nodes and
            // `MemoryNode` do) must also publish nothing for a release with no marker.
            use redlease::{PermitOp, PermitReply};
            let Some(notifier) = node.notifier() else {
                return Ok(());
            };
            let one = PermitOp::Acquire { permits: 1 };
            let write = PermitOp::AcquireExclusive {
                claim: ttl(LONG),
                fence: None,
            };
            // A semaphore of one permit (a waiter blocked by its holder), and a read/write lock (a reader
            // blocked by the writer).
            for (name, hold, wait) in [
                ("semaphore", one, one),
                ("rw", write, PermitOp::AcquireShared),
            ] {
                let k = c.key(name);
                let mut watch = notifier.watch(&k);
                match watch.subscribe(c.timer.now()) {
                    Subscription::Active | Subscription::Pending => {}
                    other => return Err(c.fail(format!("subscribing answered {other:?}"))),
                }
                c.ensure(c.notified(&mut watch).await && watch.is_active(), || {
                    format!("the subscription was not confirmed within {NOTIFY_WAIT:?}")
                })?;
                watch.begin_attempt();
                watch.end_attempt(notify::Outcome::Held);
                // A release no acquisition was ever blocked for.
                let first = token()?;
                match node.permit(&k, &first, ttl(LONG), hold).await {
                    Err(e) if e.kind() == NodeErrorKind::Unsupported => continue,
                    other => {
                        let r = c.ok("permit acquire", other)?;
                        c.ensure(r == PermitReply::Done, || {
                            format!("{name}: a free permit: {r:?}")
                        })?;
                    }
                }
                let r = c.ok(
                    "permit release",
                    node.permit(&k, &first, ttl(LONG), PermitOp::Release).await,
                )?;
                c.ensure(r == PermitReply::Done, || {
                    format!("{name}: releasing a held permit: {r:?}")
                })?;
                let unmarked_published = c.notified_within(&mut watch, QUIET_WAIT).await;
                if unmarked_published {
                    watch.begin_attempt();
                    watch.end_attempt(notify::Outcome::Held);
                }
                // A release after a blocked acquisition publishes.
                let (holder, waiter) = (token()?, token()?);
                let r = c.ok(
                    "permit acquire",
                    node.permit(&k, &holder, ttl(LONG), hold).await,
                )?;
                c.ensure(r == PermitReply::Done, || {
                    format!("{name}: a free permit: {r:?}")
                })?;
                let r = c.ok(
                    "permit acquire",
                    node.permit(&k, &waiter, ttl(LONG), wait).await,
                )?;
                c.ensure(matches!(r, PermitReply::Full { .. }), || {
                    format!("{name}: an acquisition the holder blocks: {r:?}")
                })?;
                let marked = match notify::waiting_key(&k) {
                    Some(marker) => c.read(&marker).await?.is_some(),
                    None => false,
                };
                let r = c.ok(
                    "permit release",
                    node.permit(&k, &holder, ttl(LONG), PermitOp::Release).await,
                )?;
                c.ensure(r == PermitReply::Done, || {
                    format!("{name}: releasing a held permit: {r:?}")
                })?;
                c.ensure(c.notified(&mut watch).await, || {
                    format!(
                        "{name}: no notification within {NOTIFY_WAIT:?} of a permit's release after a blocked \
                         acquisition (waiter marker {marked}, notifier {:?})",
                        notifier.stats()
                    )
                })?;
                c.ensure(!(marked && unmarked_published), || {
                    format!(
                        "{name}: a permit's release published although no acquisition had been blocked (no \
                         waiter marker), on a node that keeps waiter markers"
                    )
                })?;
                drop(watch);
            }
            Ok(())
        }
        other => Err(c.fail(format!("unknown case {other}"))),
    }
}

fn c_fence_eq(stored: Option<u64>, expected: u64) -> bool {
    stored == Some(expected)
}
