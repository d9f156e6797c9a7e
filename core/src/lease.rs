//! A held lease: its fencing token and validity, extension, release, renewal and the loss signal.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::driver::lease::{
    Ending, Extension, RenewalClaim, Shared, Together, extend_in_one_step, one_step_engine,
    renew_together, renewable_together, waiter_id,
};
use crate::driver::{Engine, RoundResult};
use crate::error::{Error, LossReason, Operation, QuorumError};
use crate::machine::slots::Slots;
use crate::node::NodeError;
use crate::observe::{CleanupCause, EventKind, LeaseId, Nodes};
use crate::ticket::LeaseTicket;
use crate::time::Sleep;
use crate::token::Token;

/// What a lease's holder may currently assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseState {
    /// Valid, and the last renewal (if any) succeeded.
    Held,
    /// Still valid, but the last renewal failed without proving the lease gone; renewal keeps retrying. Work
    /// should prepare to stop: unless a renewal succeeds, the lease is lost at its validity deadline.
    AtRisk,
    /// Lost for good; the holder must stop acting as the owner.
    Lost(LossReason),
}

/// A lease this process holds.
///
/// A `Lease` is proof of a successful acquisition, valid until [`valid_until`](Self::valid_until) unless
/// extended. Releasing consumes it, so "release twice" or "extend after release" cannot be written.
///
/// # Renewal
/// A lease is renewed
/// - while [`run`](Self::run) executes a future — always, every [`renew_every`](crate::Lock::renew_every)
///   (default a third of the TTL), with no spawning at all: the recommended form; and
/// - in the background, if its lock was described with [`auto_renew`](crate::Lock::auto_renew) (which needs
///   the manager's [spawner](crate::LockManager::with_spawner); acquisition fails without one).
///
/// Otherwise nothing renews it and it is lost at its validity deadline unless [`extend`](Self::extend)ed.
///
/// # Dropping
/// Dropping a lease stops its renewal and resolves its [`LossSignal`]s. If the manager has a spawner, the
/// key is also deleted in the background; otherwise it expires after its TTL. Prefer [`release`](Self::release).
pub struct Lease {
    shared: Arc<Shared>,
    armed: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.shared.key)
            .field("token", &self.shared.token)
            .field("fencing_token", &self.shared.fence)
            .field("state", &self.state())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            armed: true,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The ownership token of this acquisition (print it only through its redacting `Debug`/`Display`).
    pub fn token(&self) -> &Token {
        &self.shared.token
    }

    /// The fencing token issued with this lease, for locks described with [`fenced`](crate::Lock::fenced).
    ///
    /// Every acquisition of the lock receives a larger number than all earlier ones. Pass it to the protected
    /// resource and have it reject writes carrying a smaller number than the largest it has seen: that is what
    /// stops a paused or partitioned former holder. Extension never changes it.
    pub fn fencing_token(&self) -> Option<u64> {
        self.shared.fence
    }

    /// The fencing token as an `i64`, for a SQL `BIGINT` column or a driver that binds signed integers.
    ///
    /// Fences come from a Redis counter, which is a signed 64-bit integer, so every fence fits: `Some` for
    /// every fenced lease (a node breaking [`acquire_fenced`](crate::RedisNode::acquire_fenced)'s contract
    /// with a larger number is the only way to get `None` from a fenced lease), `None` for an unfenced one.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// # use redlease::{Config, LockManager};
    /// # block_on(async {
    /// # let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager.lock("orders:{42}:lock").fenced("orders:{42}:fence").try_acquire().await?;
    /// let fence: i64 = lease.fencing_token_i64().expect("a fenced lease");
    /// // e.g. sqlx::query("UPDATE orders SET …, last_fence = $1 WHERE id = 42 AND last_fence <= $1").bind(fence)
    /// assert_eq!(fence, 1);
    /// # lease.release().await?;
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn fencing_token_i64(&self) -> Option<i64> {
        self.shared.fence.and_then(|f| i64::try_from(f).ok())
    }

    /// The instant (on the manager's timer) after which the lease must be considered lost unless extended.
    pub fn valid_until(&self) -> Instant {
        self.shared.lock().h.valid_until
    }

    /// Validity left now; zero once lost.
    pub fn remaining(&self) -> Duration {
        match self.shared.current(self.shared.now()) {
            Ok(until) => until.saturating_duration_since(self.shared.now()),
            Err(_) => Duration::ZERO,
        }
    }

    /// What the holder may assume right now.
    pub fn state(&self) -> LeaseState {
        let at_risk = self.shared.lock().h.at_risk.is_some();
        match self.shared.current(self.shared.now()) {
            Ok(_) if at_risk => LeaseState::AtRisk,
            Ok(_) => LeaseState::Held,
            Err(reason) => LeaseState::Lost(reason),
        }
    }

    /// `true` while the lease is held (including while at risk).
    pub fn is_held(&self) -> bool {
        !matches!(self.state(), LeaseState::Lost(_))
    }

    /// A future that resolves, with the reason, once the lease is lost, released or dropped, and stays
    /// resolved. Cloneable; each clone waits independently.
    ///
    /// It resolves no later than the validity deadline even if nothing renews or polls the lease.
    ///
    /// For work that cannot run inside [`run`](Self::run), race it against the signal yourself:
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, LockManager, LossReason};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager.lock("leader").expiry(Duration::from_millis(200)).try_acquire().await?;
    /// let lost = lease.lost();
    /// assert!(!lost.has_ended());
    /// // Nothing renews this lease: the signal fires at its validity deadline.
    /// assert_eq!(lost.await, LossReason::Expired);
    /// // Released or dropped leases resolve their signals too, with `Released`.
    /// let lease = manager.lock("follower").try_acquire().await?;
    /// let signal = lease.lost();
    /// lease.release().await?;
    /// assert_eq!(signal.await, LossReason::Released);
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn lost(&self) -> LossSignal {
        LossSignal::new(Arc::clone(&self.shared))
    }

    /// Extends the lease to `ttl` from now on a majority (single mode: its one node), by compare-and-pexpire.
    ///
    /// Never re-creates an expired key and never issues a new fencing token. Does not change the TTL later
    /// automatic renewals use. The nodes never shorten the key (an extension sets its TTL to the longer of
    /// what it has left and `ttl`, see [`RedisNode`](crate::RedisNode#extensions-never-shorten-a-key)), so a
    /// `ttl` shorter than what the lease has left leaves the key's longer TTL on the nodes, while the lease
    /// itself counts only on `ttl`: its deadline moves earlier before the request is sent, and automatic
    /// renewal re-plans for the new deadline. The lease's belief is conservative; the key can only outlast
    /// it, which costs other clients waiting time, never safety.
    ///
    /// # Errors
    /// - [`Error::Config`] for an invalid `ttl` (zero, too long, within the drift allowance), before any
    ///   command is sent;
    /// - [`Error::Quorum`] if too few nodes answered in time (refused connections, timeouts, error replies):
    ///   nothing proves the lease gone, so it stays held until its current deadline,
    ///   [at risk](LeaseState::AtRisk), and `extend` may be retried; if nothing extends it, it is lost at the
    ///   deadline (its loss then carries these node errors as `source`);
    /// - [`Error::Lost`] if the lease was already lost, or if this extension proved it gone: the nodes no
    ///   longer hold it ([`LossReason::NotHeld`]), or the round left no validity
    ///   ([`LossReason::ExtendFailed`]). The lease is then given up and its token deleted from every node that
    ///   may still hold it.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, Error, LeaseState, LockManager};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager.lock("report").try_acquire().await?;
    /// match lease.extend(Duration::from_secs(60)).await {
    ///     Ok(()) => {}
    ///     // Too few nodes answered: still ours until `valid_until`, at risk; try again or stop in time.
    ///     Err(Error::Quorum(e)) => {
    ///         assert!(matches!(lease.state(), LeaseState::AtRisk));
    ///         eprintln!("extension failed ({e}); valid until {:?}", lease.valid_until());
    ///     }
    ///     // Gone: stop acting as the owner.
    ///     Err(lost) => return Err(lost),
    /// }
    /// lease.release().await?;
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn extend(&self, ttl: Duration) -> impl Future<Output = Result<(), Error>> {
        // In a span with the `tracing` feature. Not an `async fn`: without the feature this is the
        // extension's own future, no bigger.
        let span = crate::trace::span(crate::trace::SpanOf::Extend(
            &self.shared.key,
            self.shared.engine.mode,
            self.shared.id,
        ));
        crate::trace::instrument(span, self.extend_in(ttl))
    }

    async fn extend_in(&self, ttl: Duration) -> Result<(), Error> {
        let engine = &self.shared.engine;
        let ttl_wire = engine.config.check_expiry(ttl)?;
        let op_timeout = self
            .shared
            .op_timeout
            .min(engine.config.operation_timeout_for(ttl));
        let permit = self.shared.extend_permit().await;
        let now = self.shared.now();
        let valid_until = self
            .shared
            .current(now)
            .map_err(|reason| self.shared.lost_error(reason, None))?;
        let timeout = op_timeout.min(valid_until.saturating_duration_since(now));
        let outcome = self.shared.extend_once(ttl_wire, timeout, false).await;
        drop(permit);
        self.conclude_extension(outcome).await
    }

    /// What a manual extension's round `outcome` makes of the lease (its permit released).
    async fn conclude_extension(&self, outcome: Extension) -> Result<(), Error> {
        match outcome {
            Extension::Extended {
                started,
                wall_started,
                valid_until,
            } => match self.shared.apply(started, wall_started, valid_until, false) {
                Ok(()) => Ok(()),
                // Succeeded, but only at or after the deadline: the lease is lost all the same, and our token
                // (now with a fresh TTL) must not stay behind.
                Err(reason) => Err(self.shared.give_up(reason, None).await),
            },
            Extension::NotHeld => Err(self.shared.give_up(LossReason::NotHeld, None).await),
            Extension::Failed(Some(source)) => Err(self.shared.extension_failed(source).await),
            // A quorum extended it, but the round left no validity (or spanned a suspend).
            Extension::Failed(None) => {
                Err(self.shared.give_up(LossReason::ExtendFailed, None).await)
            }
        }
    }

    /// Extends `leases` — the parts of one set on one single-mode node — to `ttl` with one atomic step of the
    /// node ([`MultiKeyOp::Extend`]): each part's permit, record and outcome as in its own
    /// [`extend`](Self::extend), one request for all. `None` when they cannot go in one step (nothing was
    /// applied): extend each on its own.
    pub(crate) async fn extend_together(
        leases: &[Lease],
        ttl: Duration,
    ) -> Option<Vec<Result<(), Error>>> {
        // Every part's loss signal is polled meanwhile, so that a part whose deadline passes while the step
        // waits for another part's permit (a renewal in flight) or for the node is reported at its deadline.
        watching_losses(leases, Self::extend_together_unwatched(leases, ttl)).await
    }

    async fn extend_together_unwatched(
        leases: &[Lease],
        ttl: Duration,
    ) -> Option<Vec<Result<(), Error>>> {
        let engine = one_step_engine(leases.iter().map(|l| &*l.shared))?;
        let ttl_wire = engine.config.check_expiry(ttl).ok()?;
        let mut permits = Vec::with_capacity(leases.len());
        for lease in leases {
            permits.push(lease.shared.extend_permit().await);
        }
        let now = engine.timer.now();
        let mut timeout = engine.config.operation_timeout_for(ttl);
        let mut results: Vec<Option<Result<(), Error>>> = leases.iter().map(|_| None).collect();
        let mut live = Vec::with_capacity(leases.len());
        for (j, lease) in leases.iter().enumerate() {
            match lease.shared.current(now) {
                Ok(valid_until) => {
                    timeout = timeout
                        .min(lease.shared.op_timeout)
                        .min(valid_until.saturating_duration_since(now));
                    live.push(j);
                }
                Err(reason) => results[j] = Some(Err(lease.shared.lost_error(reason, None))),
            }
        }
        let parts: Vec<&Shared> = live.iter().map(|&j| &*leases[j].shared).collect();
        let outcomes = extend_in_one_step(&engine, &parts, ttl_wire, timeout, false).await;
        drop(permits);
        for (&j, outcome) in live.iter().zip(outcomes?) {
            results[j] = Some(leases[j].conclude_extension(outcome).await);
        }
        Some(results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect())
    }

    /// Releases the lease: compare-and-delete of its token on every node, waiting for each up to the operation
    /// timeout. The lease ends (renewal stops, loss signals resolve) as soon as this starts, whatever the
    /// outcome.
    ///
    /// On success the [`ReleaseReport`] names the nodes that could not confirm the deletion (a minority; they
    /// keep our key until its TTL ends). A Redlock lease whose key was still being written on a node that
    /// missed the acquisition (a repair round in flight) may see that write land after the deletion; the
    /// repair deletes it again when its round ends, within the operation timeout.
    ///
    /// # Errors
    /// - [`Error::Lost`] if the lease had been lost before the release (expired, taken over, or deleted): work
    ///   done under it may have overlapped another holder;
    /// - [`Error::Quorum`] if too few nodes answered to tell whether the lease was still held (the remaining
    ///   keys expire by their TTL).
    pub fn release(self) -> impl Future<Output = Result<ReleaseReport, Error>> {
        // In a span with the `tracing` feature. Not an `async fn`: without the feature this is the release's
        // own future, no bigger. (Nothing happens before the first poll: dropped unpolled, the future drops
        // the lease, as before.)
        let span = crate::trace::span(crate::trace::SpanOf::Release(
            &self.shared.key,
            self.shared.engine.mode,
            self.shared.id,
        ));
        crate::trace::instrument(span, self.release_in())
    }

    async fn release_in(self) -> Result<ReleaseReport, Error> {
        let releasing = self.begin_release();
        // Armed before the first await: a release dropped from here on still deletes our token.
        let mut guard = releasing.guard();
        // A repair round of this lease in flight (writing the key where it was missing) may land after this
        // deletion: that round deletes it again when it ends (`undo_repair_if_ended`), bounded by the
        // operation timeout. Not waited for here: with a hung node it would double the release's time.
        let r = releasing.round().await;
        guard.disarm();
        drop(guard);
        releasing.finish(&r)
    }

    /// Ends the lease for a release (renewal stops, loss signals resolve); its compare-and-delete follows:
    /// [`Releasing::round`], or one step together with other leases' (`crate::multi`).
    pub(crate) fn begin_release(mut self) -> Releasing {
        self.armed = false;
        let shared = Arc::clone(&self.shared);
        drop(self);
        let prior = shared.end(Ending::Released);
        Releasing { shared, prior }
    }

    /// Hands the lease to another process: ends it here without releasing it — renewal stops, loss signals
    /// resolve with [`LossReason::Released`], the key stays on the nodes — and returns the
    /// [`LeaseTicket`] that [`Lock::resume`](crate::Lock::resume) continues it with.
    ///
    /// Nothing renews the lease between the handoff and the resumption: resume it within its
    /// [remaining](Self::remaining) validity, or the key expires and the resumption fails. The ticket
    /// carries no validity; the resuming process proves ownership with an extension round of its own. It does
    /// carry, per node, what this lease may still have in flight there (an extension whose answer never came),
    /// so that a late, shorter extension cannot shorten the key under the resumed lease.
    ///
    /// # Errors
    /// [`Error::Lost`] if the lease was already lost or expired (its token is then deleted in the background,
    /// as when a lease is dropped).
    pub fn handoff(mut self) -> Result<LeaseTicket, Error> {
        self.armed = false;
        let shared = Arc::clone(&self.shared);
        drop(self);
        let n = shared.engine.nodes.len();
        let (pending, missing) = {
            let st = shared.lock();
            (st.h.unconfirmed.snapshot(n), st.h.missing.bits())
        };
        if let Some(reason) = shared.end(Ending::HandedOff) {
            if !shared.lock().h.cleaned {
                shared.engine.spawn_cleanup(
                    &shared.key,
                    &shared.token,
                    shared.op_timeout,
                    (shared.id, CleanupCause::Dropped),
                );
            }
            return Err(shared
                .loss_error()
                .unwrap_or_else(|| shared.lost_error(reason, None)));
        }
        Ok(LeaseTicket {
            key: shared.key.to_string(),
            token: shared.token.clone(),
            mode: shared.engine.mode,
            fence: shared.fence,
            pending,
            missing,
        })
    }

    /// Runs `work` while holding the lease, renewing it meanwhile (every
    /// [`renew_every`](crate::Lock::renew_every), default a third of the TTL, unless background renewal
    /// already runs), and stops it as soon as the lease is lost.
    ///
    /// Nothing is spawned: renewal runs inside this future, interleaved with `work`. The lease stays held when
    /// `run` returns; release it afterwards.
    ///
    /// When several `run`s of one lease overlap, one renews at a time; when it returns, another takes over.
    ///
    /// # Errors
    /// [`Error::Lost`] if the lease is lost before `work` completes, with the cause of the loss (the node
    /// errors of a failed extension, for example) as its `source`. `work` is dropped at the moment of the loss;
    /// `run` then finishes deleting the token from the nodes (one round, bounded by the operation timeout)
    /// before it returns, so that no node keeps our key for a whole TTL.
    ///
    /// ```
    /// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
    /// use std::time::Duration;
    /// use redlease::{Config, LockManager};
    ///
    /// # block_on(async {
    /// let manager = LockManager::single(MapNode::default(), Config::default())?;
    /// let lease = manager
    ///     .lock("nightly")
    ///     .renew_every(Duration::from_secs(10))
    ///     .try_acquire()
    ///     .await?;
    /// match lease.run(async { 2 + 2 }).await {
    ///     Ok(sum) => assert_eq!(sum, 4),
    ///     // The lease was lost: the work was stopped; do not act as the owner any more.
    ///     Err(lost) => eprintln!("{lost}"),
    /// }
    /// lease.release().await?;
    /// # Ok::<(), redlease::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        run_all(std::slice::from_ref(self), work).await
    }
}

/// Starts the background renewal ([`Lock::auto_renew`](crate::Lock::auto_renew)) of a set's parts that
/// nothing renews yet, on the manager's spawner: together, one step of their node per round
/// ([`renew_together`]), where they may be and none is renewed already; otherwise each on its own, as a
/// single lease is.
pub(crate) fn renew_set_in_background(leases: &[Lease]) {
    let Some(spawner) = leases.first().and_then(|l| l.shared.engine.spawner.clone()) else {
        return;
    };
    let claimed: Vec<bool> = leases.iter().map(|l| l.shared.claim_renewal()).collect();
    if claimed.iter().all(|&c| c) && renewable_together(leases.iter().map(|l| &*l.shared)) {
        let parts: Vec<Arc<Shared>> = leases.iter().map(|l| Arc::clone(&l.shared)).collect();
        let own = Arc::clone(&spawner);
        spawner.spawn(Box::pin(async move {
            if renew_together(parts.clone(), false).await == Together::Separately {
                for part in &parts {
                    part.renew_in_background(&own);
                }
            }
        }));
        return;
    }
    for (lease, claimed) in leases.iter().zip(claimed) {
        if claimed {
            lease.shared.renew_in_background(&spawner);
        }
    }
}

/// [`Lease::run`] over several leases at once (a [`MultiLease`](crate::MultiLease)'s parts): renews each
/// (where no other renewal runs for it) and stops `work` as soon as any of them is lost.
///
/// Parts that may be renewed together ([`renewable_together`]) and that no other renewal has are renewed
/// together, one step of their node per round ([`renew_together`]); otherwise, or when the node cannot,
/// each on its own.
pub(crate) async fn run_all<F: Future>(leases: &[Lease], work: F) -> Result<F::Output, Error> {
    type Renewal = Pin<Box<dyn Future<Output = ()> + Send>>;
    type JointRenewal = Pin<Box<dyn Future<Output = Together> + Send>>;
    let n = leases.len();
    // Inline for one lease: `Lease::run` allocates nothing more than before.
    let mut signals = Slots::from_fn(n, |i| leases[i].lost());
    let mut claims = Slots::from_fn(n, |i| RenewalClaim {
        shared: &leases[i].shared,
        held: false,
    });
    let mut renewals: Slots<Option<Renewal>> = Slots::from_fn(n, |_| None);
    // The renewal of every part together, while it runs (it holds every claim).
    let mut joint: Option<JointRenewal> = None;
    let together = n > 1 && renewable_together(leases.iter().map(|l| &*l.shared));
    // In an `Option`, so that it can be dropped in place (stopped) the moment a lease is lost.
    let mut work = pin!(Some(work));
    let lost = std::future::poll_fn(|cx| {
        // Whether the parts whose claim is held but that nothing renews yet are to be renewed on their own now:
        // given back by the joint renewal (the node cannot take the step), or claimed for a joint renewal
        // while another renewal had some other part.
        let mut separately = false;
        if let Some(j) = joint.as_mut() {
            if let Poll::Ready(how) = j.as_mut().poll(cx) {
                joint = None;
                separately = how == Together::Separately;
            }
        } else if together && claims.iter().all(|c| !c.held) {
            for claim in claims.iter_mut() {
                claim.held = claim.shared.claim_renewal();
            }
            if claims.iter().all(|c| c.held) {
                let parts = leases.iter().map(|l| Arc::clone(&l.shared)).collect();
                let mut j: JointRenewal = Box::pin(renew_together(parts, true));
                match j.as_mut().poll(cx) {
                    Poll::Pending => joint = Some(j),
                    Poll::Ready(how) => separately = how == Together::Separately,
                }
            } else {
                separately = true;
            }
        }
        for ((renewal, claim), lease) in renewals.iter_mut().zip(claims.iter_mut()).zip(leases) {
            let shared = &lease.shared;
            if let Some(r) = renewal.as_mut() {
                if r.as_mut().poll(cx).is_ready() {
                    *renewal = None;
                }
            } else if (separately && claim.held) || (!claim.held && shared.claim_renewal()) {
                // No renewal runs (none yet, or another `run` that renewed has returned): take it over.
                claim.held = true;
                if shared.engine.batch_size().is_some() {
                    // Renewed by the manager's shared renewer, in batches, until the claim is dropped.
                    shared.renew_batched();
                } else {
                    let mut r: Renewal = Box::pin(Arc::clone(shared).renew());
                    if r.as_mut().poll(cx).is_pending() {
                        *renewal = Some(r);
                    }
                }
            }
        }
        for (i, signal) in signals.iter_mut().enumerate() {
            if let Poll::Ready(reason) = Pin::new(signal).poll(cx) {
                return Poll::Ready(Err((i, reason)));
            }
        }
        match work.as_mut().as_pin_mut() {
            Some(w) => w.poll(cx).map(Ok),
            None => Poll::Pending,
        }
    })
    .await;
    let (i, reason) = match lost {
        Ok(out) => return Ok(out),
        Err(lost) => lost,
    };
    // Lost: stop the work at once (it must no longer act as the owner), but let the lost lease's own renewal
    // finish giving up — its compare-and-delete is bounded by the operation timeout — and delete our token
    // ourselves if nobody did (the loss may have come from an `extend` inside the work we just dropped).
    // A joint renewal finishes its round, if one is in flight, and gives up every part lost, then stops.
    // The other leases' renewals stop here (their rounds were recorded when planned); they stay held.
    work.set(None);
    let joint = joint.take();
    let renewal = renewals.get_mut(i).and_then(Option::take);
    drop(renewals);
    let shared = &leases[i].shared;
    // Meanwhile every part's loss signal is still polled: another part whose deadline passes during this
    // clean-up (up to an operation timeout) is reported lost at its deadline, not when `run` returns.
    watching_losses(leases, async {
        if let Some(j) = joint {
            j.await;
        }
        if let Some(r) = renewal {
            r.await;
        }
        shared.clean_up().await;
    })
    .await;
    drop(claims);
    Err(shared
        .loss_error()
        .unwrap_or_else(|| shared.lost_error(reason, None)))
}

/// What [`Lease::release`] achieved.
///
/// The lease counts as released when a quorum deleted its token; nodes that failed keep it until its TTL
/// runs out (at most the lease's expiry).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReleaseReport {
    deleted: usize,
    nodes: usize,
    failures: Vec<(usize, NodeError)>,
}

impl ReleaseReport {
    /// Nodes that deleted our token.
    pub fn deleted(&self) -> usize {
        self.deleted
    }

    /// Nodes the manager has.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The nodes that could not confirm the deletion, by node index, with their errors. Empty when every node
    /// answered (a node that answered "not held" is not a failure: its copy had already expired).
    pub fn failures(&self) -> &[(usize, NodeError)] {
        &self.failures
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.shared.end(Ending::Dropped);
            // Deleting our own token is always safe, lost or not (a lease lost at its deadline may still be on
            // the nodes for the drift allowance, one that lost a renewal race for its whole TTL).
            if !self.shared.lock().h.cleaned {
                self.shared.engine.spawn_cleanup(
                    &self.shared.key,
                    &self.shared.token,
                    self.shared.op_timeout,
                    (self.shared.id, CleanupCause::Dropped),
                );
            }
        }
    }
}

/// Drives `fut` while polling the loss signal of every lease in `leases` (not stopping for one), so that a
/// lease whose deadline passes meanwhile is reported lost at its deadline, not when `fut` ends.
pub(crate) async fn watching_losses<F: Future>(leases: &[Lease], fut: F) -> F::Output {
    let mut signals: Vec<Option<LossSignal>> = leases.iter().map(|l| Some(l.lost())).collect();
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        for slot in &mut signals {
            if let Some(signal) = slot {
                if Pin::new(signal).poll(cx).is_ready() {
                    *slot = None;
                }
            }
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// A lease ended by a release whose compare-and-delete is under way (see [`Lease::begin_release`]).
pub(crate) struct Releasing {
    shared: Arc<Shared>,
    /// Whether it had been lost before the release.
    prior: Option<LossReason>,
}

impl Releasing {
    pub(crate) fn key(&self) -> &str {
        &self.shared.key
    }

    pub(crate) fn token(&self) -> &Token {
        &self.shared.token
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.shared.engine
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.shared.op_timeout
    }

    /// Deletes the token in the background if dropped armed (the release's future was dropped).
    pub(crate) fn guard(&self) -> CleanupOnDrop<'_> {
        let shared = &self.shared;
        CleanupOnDrop::new(
            &shared.engine,
            &shared.key,
            &shared.token,
            shared.op_timeout,
            shared.id,
        )
    }

    /// The lease's own compare-and-delete round on every node.
    pub(crate) fn round(&self) -> impl Future<Output = RoundResult<bool>> + '_ {
        let shared = &self.shared;
        shared
            .engine
            .release_round(&shared.key, &shared.token, shared.op_timeout, None)
    }

    /// The release's outcome, from its compare-and-delete round `r`.
    pub(crate) fn finish(self, r: &RoundResult<bool>) -> Result<ReleaseReport, Error> {
        let Releasing { shared, prior } = self;
        let engine = &shared.engine;
        if engine.hook.active() {
            engine.hook.emit(
                &shared.key,
                shared.id,
                r.ended,
                EventKind::ReleaseRound {
                    nodes: Nodes::new(&r.tally),
                    round: r.ended.saturating_duration_since(r.started),
                },
            );
        }
        if prior.is_some() {
            return Err(shared
                .loss_error()
                .unwrap_or_else(|| shared.lost_error(LossReason::Expired, None)));
        }
        let n = engine.nodes.len();
        if r.tally.yes() >= engine.quorum() {
            Ok(ReleaseReport {
                deleted: r.tally.yes(),
                nodes: n,
                failures: r.tally.errors(),
            })
        } else if r.tally.refused() {
            Err(shared.lost_error(LossReason::NotHeld, None))
        } else {
            Err(QuorumError::new(
                Operation::Release,
                r.tally.yes(),
                r.tally.required(),
                r.tally.errors(),
            )
            .into())
        }
    }
}

/// Spawns a background compare-and-delete if dropped while armed (a cancelled acquisition or release).
pub(crate) struct CleanupOnDrop<'a> {
    engine: &'a Arc<Engine>,
    key: &'a str,
    token: &'a Token,
    timeout: Duration,
    id: LeaseId,
    armed: bool,
}

impl<'a> CleanupOnDrop<'a> {
    pub(crate) fn new(
        engine: &'a Arc<Engine>,
        key: &'a str,
        token: &'a Token,
        timeout: Duration,
        id: LeaseId,
    ) -> Self {
        Self {
            engine,
            key,
            token,
            timeout,
            id,
            armed: true,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CleanupOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.spawn_cleanup(
                self.key,
                self.token,
                self.timeout,
                (self.id, CleanupCause::Cancelled),
            );
        }
    }
}

/// Resolves when a lease is lost, released or dropped; see [`Lease::lost`].
///
/// Polling it after it resolved returns the same reason again.
pub struct LossSignal {
    shared: Arc<Shared>,
    id: u64,
    sleep: Option<(Instant, Sleep)>,
}

impl LossSignal {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            id: waiter_id(),
            sleep: None,
        }
    }

    /// Whether the lease has ended — lost, released or dropped — without waiting: `true` exactly when
    /// awaiting the signal would complete at once.
    pub fn has_ended(&self) -> bool {
        self.shared.current(self.shared.now()).is_err()
    }
}

impl Clone for LossSignal {
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.shared))
    }
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("key", &self.shared.key)
            .field("ended", &self.has_ended())
            .finish()
    }
}

impl Future for LossSignal {
    type Output = LossReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LossReason> {
        let this = &mut *self;
        loop {
            let now = this.shared.now();
            let deadline = {
                // Check and register under one lock, so a loss marked in between cannot be missed.
                let mut st = this.shared.lock();
                if let Some(reason) = st.h.lost {
                    return Poll::Ready(reason);
                }
                if st.h.ended {
                    return Poll::Ready(LossReason::Released);
                }
                if now >= st.h.valid_until {
                    let reason = this.shared.expiry_reason(st.h.valid_until);
                    drop(st);
                    return Poll::Ready(this.shared.mark_lost(reason));
                }
                if st.h.wall_started.is_some() {
                    // Woken after a resume (the default timer wakes every sleeper then): a suspend longer
                    // than the drift allowance ends the lease here too, not only when `state()` is read.
                    let wall = (st.h.wall_started, this.shared.engine.timer.wall_now());
                    if crate::time::suspended((st.h.round_started, now), wall, this.shared.drift())
                    {
                        drop(st);
                        return Poll::Ready(this.shared.mark_lost(LossReason::Suspended));
                    }
                }
                st.register(this.id, cx.waker());
                st.h.valid_until
            };
            let sleep = match &mut this.sleep {
                Some((at, sleep)) if *at == deadline => sleep,
                slot => {
                    let sleep = this.shared.engine.timer.sleep_until(deadline);
                    &mut slot.insert((deadline, sleep)).1
                }
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The deadline passed (or moved): re-check; `current` marks the expiry.
            this.sleep = None;
        }
    }
}

impl Drop for LossSignal {
    fn drop(&mut self) {
        self.shared.lock().deregister(self.id);
    }
}
