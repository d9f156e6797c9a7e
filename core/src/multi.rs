//! Several locks taken as one: [`MultiLock`] and [`MultiLease`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::config::ConfigError;
use crate::error::{Error, LossReason};
use crate::lease::{Lease, LeaseState, LossSignal};
use crate::manager::Lock;

/// A description of several locks acquired all or nothing, held, renewed and released as one
/// [`MultiLease`]. Made by [`LockManager::lock_all`](crate::LockManager::lock_all); cheap to clone.
///
/// Moving stock between two warehouses, merging two accounts: every key must be held before the work
/// starts, and none may stay held when the acquisition fails.
///
/// # How it acquires
/// The keys are taken one lock at a time in one fixed order (sorted), so two acquisitions of overlapping
/// sets never wait for each other in a cycle. An attempt tries every key once; if one is held by another
/// owner (or fails), every key this attempt took is released at once, and the next attempt — if the limit
/// allows — first waits for that key the way [`Lock::acquire_until`] does (woken by its release where the
/// node can subscribe), holding nothing else, then tries the rest. Each key is its own lease with its own
/// token, TTL and renewal; the set is valid until the earliest of their deadlines. Fencing tokens, with
/// [`fenced`](Self::fenced), are issued per key, each in its own key's atomic step, not all in one step.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::time::Duration;
/// use redlease::{Config, LockManager};
///
/// # block_on(async {
/// let manager = LockManager::single(MapNode::default(), Config::default())?;
/// let transfer = manager.lock_all(["stock:{berlin}", "stock:{paris}"]);
/// let both = transfer.acquire_within(Duration::from_secs(5)).await?;
/// both.run(async { /* move the stock */ }).await?;
/// both.release().await?;
/// # Ok::<(), redlease::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// One lock per key, in acquisition (sorted) order.
    locks: Arc<[Lock]>,
    /// A key appeared more than once (refused at acquisition).
    duplicate: bool,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MultiLock {
    pub(crate) fn new(mut locks: Vec<Lock>) -> Self {
        locks.sort_by(|a, b| a.key().cmp(b.key()));
        let duplicate = locks.windows(2).any(|w| w[0].key() == w[1].key());
        Self {
            locks: locks.into(),
            duplicate,
        }
    }

    fn map(&self, f: impl Fn(Lock) -> Lock) -> Self {
        Self {
            locks: self.locks.iter().cloned().map(f).collect(),
            duplicate: self.duplicate,
        }
    }

    /// The keys, in the order they are acquired.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Lock::key)
    }

    /// Sets the TTL of every key's lease; see [`Lock::expiry`].
    #[must_use]
    pub fn expiry(&self, expiry: Duration) -> Self {
        self.map(|l| l.expiry(expiry))
    }

    /// Sets how often [`MultiLease::run`] renews each key; see [`Lock::renew_every`].
    #[must_use]
    pub fn renew_every(&self, interval: Duration) -> Self {
        self.map(|l| l.renew_every(interval))
    }

    /// Renews every key in the background; see [`Lock::auto_renew`].
    #[must_use]
    pub fn auto_renew(&self, interval: Duration) -> Self {
        self.map(|l| l.auto_renew(interval))
    }

    /// Limits the whole hold of every key; see [`Lock::max_hold`].
    #[must_use]
    pub fn max_hold(&self, max_hold: Duration) -> Self {
        self.map(|l| l.max_hold(max_hold))
    }

    /// Stores `info` with every key; see [`Lock::with_holder_info`].
    #[must_use]
    pub fn with_holder_info(&self, info: &str) -> Self {
        self.map(|l| l.with_holder_info(info))
    }

    /// Issues a fencing token for every key from the counter `fence_key(key)` (single mode only); see
    /// [`Lock::fenced`]. Each key's token comes from its own acquisition step.
    #[must_use]
    pub fn fenced(&self, fence_key: impl Fn(&str) -> String) -> Self {
        self.map(|l| {
            let fence = fence_key(l.key());
            l.fenced(fence)
        })
    }

    /// Checks every key's description without sending anything; see [`Lock::validate`].
    ///
    /// # Errors
    /// [`Error::Config`] for an empty set or a key given twice, or the first key's own error.
    pub fn validate(&self) -> Result<(), Error> {
        if self.locks.is_empty() {
            return Err(ConfigError::InvalidKey("lock_all needs at least one key").into());
        }
        if self.duplicate {
            return Err(ConfigError::InvalidKey("lock_all was given a key twice").into());
        }
        self.locks.iter().try_for_each(Lock::validate)
    }

    /// One attempt: every key tried once, in order; all held, or none.
    ///
    /// # Errors
    /// The first key's failure, as [`Lock::try_acquire`] reports it ([`Error::is_contended`] for a key held
    /// by another owner); every key taken meanwhile has been released.
    pub async fn try_acquire(&self) -> Result<MultiLease, Error> {
        self.validate()?;
        match self.attempt(None).await {
            Ok(lease) => Ok(lease),
            Err((_, e)) => Err(e),
        }
    }

    /// Keeps trying for `patience` from now; see [`acquire_until`](Self::acquire_until).
    ///
    /// # Errors
    /// As [`acquire_until`](Self::acquire_until).
    pub async fn acquire_within(&self, patience: Duration) -> Result<MultiLease, Error> {
        let Some(first) = self.locks.first() else {
            return Err(ConfigError::InvalidKey("lock_all needs at least one key").into());
        };
        let deadline = crate::time::add(first.now(), patience);
        self.acquire_until(deadline).await
    }

    /// Keeps trying until `deadline` (an instant of the manager's timer): after an attempt failed on a key,
    /// waits for that key as [`Lock::acquire_until`] does, holding no other, then tries the rest.
    ///
    /// # Errors
    /// The last attempt's failure, as [`Lock::acquire_until`] reports it; nothing is held.
    pub async fn acquire_until(&self, deadline: Instant) -> Result<MultiLease, Error> {
        self.validate()?;
        let mut first: Option<Lease> = None;
        loop {
            let blocked = match self.attempt(first.take()).await {
                Ok(lease) => return Ok(lease),
                Err((blocked, e)) => match self.locks.get(blocked) {
                    Some(lock) if lock.now() < deadline => lock,
                    _ => return Err(e),
                },
            };
            // Wait for the key that stopped the attempt, holding nothing else; the next attempt starts with
            // it held.
            first = Some(blocked.acquire_until(deadline).await?);
        }
    }

    /// One pass over the keys in order, starting with `held` (a key already taken by waiting for it). On
    /// failure, releases everything it took and returns the index of the key that failed with its error.
    ///
    /// The parts already held are watched while later keys are tried: one that is lost meanwhile (its
    /// deadline passed during a slow round or a pause) ends the attempt at once, reported by its loss signal
    /// at its deadline, and the set is never handed out with a part already gone.
    async fn attempt(&self, held: Option<Lease>) -> Result<MultiLease, (usize, Error)> {
        let Some(first) = self.locks.first() else {
            return Err((
                0,
                ConfigError::InvalidKey("lock_all needs at least one key").into(),
            ));
        };
        let mut slots: Vec<Option<Lease>> = self.locks.iter().map(|_| None).collect();
        if let Some(lease) = held {
            match self.locks.iter().position(|l| l.key() == lease.key()) {
                Some(i) => slots[i] = Some(lease),
                None => drop(lease),
            }
        }
        for (i, lock) in self.locks.iter().enumerate() {
            if slots[i].is_some() {
                continue;
            }
            let outcome = watch_parts(&slots, lock.try_acquire()).await;
            let failed = match outcome {
                Ok(Ok(lease)) => {
                    slots[i] = Some(lease);
                    continue;
                }
                Ok(Err(e)) => (i, e),
                Err(part) => {
                    let lost = slots[part].as_ref().map(|l| l.state());
                    let reason = match lost {
                        Some(LeaseState::Lost(reason)) => reason,
                        _ => LossReason::Expired,
                    };
                    (
                        part,
                        Error::Lost {
                            key: self.locks[part].key().to_owned(),
                            reason,
                            source: None,
                        },
                    )
                }
            };
            release_all(slots.into_iter().flatten().collect()).await;
            return Err(failed);
        }
        let leases: Vec<Lease> = slots.into_iter().flatten().collect();
        // A part whose deadline passed with the last round is not handed out.
        if let Some(part) = leases.iter().position(|l| !l.is_held()) {
            let reason = match leases[part].state() {
                LeaseState::Lost(reason) => reason,
                _ => LossReason::Expired,
            };
            let key = leases[part].key().to_owned();
            release_all(leases).await;
            return Err((
                part,
                Error::Lost {
                    key,
                    reason,
                    source: None,
                },
            ));
        }
        Ok(MultiLease {
            leases,
            acquired_at: first.now(),
        })
    }

    /// Reads the holder of every key; see [`Lock::holder_info`].
    ///
    /// # Errors
    /// The first key's error.
    pub async fn holder_info(&self) -> Result<Vec<Option<crate::HolderInfo>>, Error> {
        let mut out = Vec::with_capacity(self.locks.len());
        for lock in self.locks.iter() {
            out.push(lock.holder_info().await?);
        }
        Ok(out)
    }
}

/// Drives `fut` while watching the loss signals of the parts already held in `slots`: `Err(index)` of the
/// first part lost before `fut` finished (which is then dropped: an acquisition future cleans up after
/// itself).
async fn watch_parts<F: Future>(slots: &[Option<Lease>], fut: F) -> Result<F::Output, usize> {
    let mut signals: Vec<(usize, LossSignal)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.as_ref().map(|l| (i, l.lost())))
        .collect();
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        for (i, signal) in &mut signals {
            if Pin::new(signal).poll(cx).is_ready() {
                return Poll::Ready(Err(*i));
            }
        }
        fut.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// Releases `leases` concurrently, ignoring the outcome (a failed acquisition's partial set: whatever a
/// node could not delete expires by its TTL).
async fn release_all(leases: Vec<Lease>) {
    let _ = join_all(leases.into_iter().map(Lease::release)).await;
}

/// Polls every future concurrently; their outputs in order.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => all = false,
                }
            }
        }
        if all { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// Several leases held as one: the result of a [`MultiLock`] acquisition.
///
/// Valid while every part is; [lost](Self::state) as soon as any part is lost (the others stay held until
/// the `MultiLease` is released or dropped: release it). Dropping it drops every part.
pub struct MultiLease {
    /// In key order; never empty.
    leases: Vec<Lease>,
    /// When the acquisition that made it ended (on the manager's timer).
    acquired_at: Instant,
}

impl fmt::Debug for MultiLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLease")
            .field("leases", &self.leases)
            .finish()
    }
}

impl MultiLease {
    /// The parts, one lease per key, in key order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases.iter().map(Lease::key)
    }

    /// Every key's fencing token, in key order (`None` for unfenced keys).
    pub fn fencing_tokens(&self) -> Vec<Option<u64>> {
        self.leases.iter().map(Lease::fencing_token).collect()
    }

    /// The earliest validity deadline of the parts.
    pub fn valid_until(&self) -> Instant {
        self.leases
            .iter()
            .map(Lease::valid_until)
            .min()
            .unwrap_or(self.acquired_at)
    }

    /// Validity left now: the least of the parts'; zero once any is lost.
    pub fn remaining(&self) -> Duration {
        self.leases
            .iter()
            .map(Lease::remaining)
            .min()
            .unwrap_or_default()
    }

    /// The worst state of the parts: lost if any is lost (with its reason), at risk if any is at risk.
    pub fn state(&self) -> LeaseState {
        let mut worst = LeaseState::Held;
        for lease in &self.leases {
            match lease.state() {
                LeaseState::Lost(reason) => return LeaseState::Lost(reason),
                LeaseState::AtRisk => worst = LeaseState::AtRisk,
                LeaseState::Held => {}
            }
        }
        worst
    }

    /// `true` while every part is held (including while at risk).
    pub fn is_held(&self) -> bool {
        !matches!(self.state(), LeaseState::Lost(_))
    }

    /// A future that resolves, with the reason, once any part is lost, released or dropped.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut signals: Vec<LossSignal> = self.leases.iter().map(Lease::lost).collect();
        std::future::poll_fn(move |cx| {
            for s in &mut signals {
                if let Poll::Ready(reason) = Pin::new(s).poll(cx) {
                    return Poll::Ready(reason);
                }
            }
            Poll::Pending
        })
    }

    /// Extends every part to `ttl` from now, concurrently; see [`Lease::extend`].
    ///
    /// # Errors
    /// The first part's error, in key order (every part was tried).
    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        join_all(self.leases.iter().map(|l| l.extend(ttl)))
            .await
            .into_iter()
            .collect()
    }

    /// Runs `work` while holding every part, renewing each meanwhile, and stops it as soon as any part is
    /// lost; see [`Lease::run`]. The parts stay held when it returns: release the `MultiLease` afterwards.
    ///
    /// # Errors
    /// [`Error::Lost`] for the first part found lost, with its cause.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        crate::lease::run_all(&self.leases, work).await
    }

    /// Releases every part concurrently; see [`Lease::release`].
    ///
    /// # Errors
    /// The first part's error, in key order ([`Error::Lost`] if it had been lost: work done under the set
    /// may have overlapped another holder of that key). Every part was released whatever the errors.
    pub async fn release(self) -> Result<(), Error> {
        join_all(self.leases.into_iter().map(Lease::release))
            .await
            .into_iter()
            .try_for_each(|r| r.map(|_| ()))
    }
}
