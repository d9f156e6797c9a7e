//! Manager-wide configuration and its validation.

use std::time::Duration;

use crate::node::{ReplicaWait, Ttl};

/// Whether a single-mode lease waits for replicas to acknowledge its writes (see
/// [`Config::with_durability`]).
///
/// A primary acknowledges a write before its replicas have it; if it fails over (Sentinel, a managed
/// service) before they do, the new primary has never seen the lock, or the fence counter's last increment.
/// Waiting with `WAIT` (or `WAITAOF`) after the write narrows that window; it does not make Redis strongly
/// consistent (a replica that acknowledged may still not be the one promoted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Do not wait (the default): no extra round trip.
    #[default]
    Off,
    /// Wait after each acquisition and extension; when fewer replicas acknowledge in time (or the node
    /// cannot wait), report it with a [`NotReplicated`](crate::EventKind::NotReplicated) event and go on.
    BestEffort(ReplicaWait),
    /// Wait after each acquisition and extension; an acquisition that is not acknowledged releases its key
    /// and fails ([`NotAcquiredReason::NotReplicated`](crate::NotAcquiredReason::NotReplicated)), an
    /// extension that is not acknowledged counts as a failed extension (the lease is at risk).
    Required(ReplicaWait),
}

impl Durability {
    /// The wait, unless off.
    pub fn wait(&self) -> Option<ReplicaWait> {
        match self {
            Self::Off => None,
            Self::BestEffort(w) | Self::Required(w) => Some(*w),
        }
    }

    /// Whether an unacknowledged write fails the operation.
    pub fn is_required(&self) -> bool {
        matches!(self, Self::Required(_))
    }
}

/// How long a restarted node is kept out of quorums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quarantine {
    /// For the configured expiry (the default).
    Expiry,
    For(Duration),
    Off,
}

/// Timing and retry settings shared by every lock of a [`LockManager`](crate::LockManager).
///
/// Start from [`Config::default`] (the reference defaults) and adjust with the builder methods. Nothing is
/// checked until the manager is built ([`Config::validate`]); a lock's own [`expiry`](crate::Lock::expiry)
/// and renewal interval are checked again, against these settings, before its first command is sent.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`expiry`](Self::with_expiry) | 30 s | Redis TTL of a lease, and the TTL renewals set |
/// | [`attempts`](Self::with_attempts) | 3 | acquisition attempts of [`Lock::acquire`](crate::Lock::acquire) |
/// | [`retry_delay`](Self::with_retry_delay) | 200 ms | base pause between attempts |
/// | [`retry_jitter`](Self::with_retry_jitter) | 0.5 | a random 0–50 % of the delay is added to each pause |
/// | [`drift_factor`](Self::with_drift_factor) | 0.01 | share of the TTL reserved for clock drift (plus 2 ms) |
/// | [`operation_timeout`](Self::with_operation_timeout) | expiry / 5, within [min(50 ms, expiry / 2), 500 ms] | bound on one round of node calls |
/// | [`jitter_seed`](Self::with_jitter_seed) | from the OS | seed of the jitter generator, for reproducible tests |
/// | [`notifications`](Self::with_notifications) | on | waiting acquisitions are woken by releases where nodes can notify |
/// | [`max_retry_delay`](Self::with_max_retry_delay) | 1 s | longest wait between attempts of a notified acquisition |
/// | [`durability`](Self::with_durability) | off | single mode: wait for replicas after each write |
/// | [`restart_quarantine`](Self::with_restart_quarantine) | the expiry | Redlock: a restarted node is not counted for this long |
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, ConfigError};
///
/// let config = Config::default()
///     .with_expiry(Duration::from_secs(10))
///     .with_attempts(5)
///     .with_retry_delay(Duration::from_millis(50));
/// assert_eq!(config.expiry(), Duration::from_secs(10));
/// // Derived: expiry / 5, at most 500 ms, at least min(50 ms, expiry / 2).
/// assert_eq!(config.operation_timeout_for(config.expiry()), Duration::from_millis(500));
/// assert_eq!(config.validate(), Ok(()));
///
/// // Settings that cannot work are refused before anything is sent.
/// let bad = Config::default().with_expiry(Duration::from_millis(100)).with_operation_timeout(Duration::from_millis(100));
/// assert!(matches!(bad.validate(), Err(ConfigError::OperationTimeoutNotBelowExpiry { .. })));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    expiry: Duration,
    attempts: u32,
    retry_delay: Duration,
    retry_jitter: f64,
    drift_factor: f64,
    operation_timeout: Option<Duration>,
    jitter_seed: Option<u64>,
    notifications: bool,
    max_retry_delay: Duration,
    durability: Durability,
    quarantine: Quarantine,
    renewal_batching: Option<(Duration, usize)>,
    max_hold: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            expiry: Duration::from_secs(30),
            attempts: 3,
            retry_delay: Duration::from_millis(200),
            retry_jitter: 0.5,
            drift_factor: 0.01,
            operation_timeout: None,
            jitter_seed: None,
            notifications: true,
            max_retry_delay: Duration::from_secs(1),
            durability: Durability::Off,
            quarantine: Quarantine::Expiry,
            renewal_batching: None,
            max_hold: None,
        }
    }
}

/// The ceiling of the default operation timeout.
const DEFAULT_OPERATION_TIMEOUT_CAP: Duration = Duration::from_millis(500);
/// The least derived operation timeout (for a TTL of at least twice it): a fifth of a short TTL (4 ms for
/// 20 ms) is less than a first connection takes on a loaded machine.
const DEFAULT_OPERATION_TIMEOUT_FLOOR: Duration = Duration::from_millis(50);

impl Config {
    /// Sets the default lease TTL (also the TTL every renewal sets).
    #[must_use]
    pub fn with_expiry(mut self, expiry: Duration) -> Self {
        self.expiry = expiry;
        self
    }

    /// Sets how many acquisition rounds [`Lock::acquire`](crate::Lock::acquire) makes before giving up.
    #[must_use]
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Sets the base pause between acquisition attempts.
    #[must_use]
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// Sets the random extra pause, as a fraction of the retry delay, in `[0, 1]` (default 0.5: up to +50 %).
    #[must_use]
    pub fn with_retry_jitter(mut self, fraction: f64) -> Self {
        self.retry_jitter = fraction;
        self
    }

    /// Sets the share of the TTL reserved for clock drift between client and servers, in `[0, 1)`.
    ///
    /// Validity is `ttl - elapsed - (ceil(ttl * drift_factor) + 2 ms)`.
    #[must_use]
    pub fn with_drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Sets the bound on one round of node calls (acquire, extend or release on all nodes at once).
    ///
    /// By default it is derived from the lease TTL: `ttl / 5`, at most 500 ms, and at least 50 ms or half the
    /// TTL, whichever is less.
    #[must_use]
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = Some(timeout);
        self
    }

    /// Seeds the retry-jitter generator, making retry pauses reproducible (for tests and simulations).
    #[must_use]
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// Whether [`acquire_until`](crate::Lock::acquire_until) and [`acquire_within`](crate::Lock::acquire_within)
    /// wait for release notifications on nodes that offer them ([`RedisNode::notifier`](crate::RedisNode::notifier))
    /// instead of polling every [`retry_delay`](Self::with_retry_delay) (default `true`). See [`crate::notify`].
    #[must_use]
    pub fn with_notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// Sets the longest a waiting acquisition goes without an attempt while it can be notified (default 1 s).
    ///
    /// It waits for a notification, the holder's remaining TTL or its deadline, whichever comes first, and
    /// never longer than this: what a lost notification (a dropped subscription, a release by a client that
    /// does not publish, a key that expired) costs at most.
    #[must_use]
    pub fn with_max_retry_delay(mut self, delay: Duration) -> Self {
        self.max_retry_delay = delay;
        self
    }

    /// Whether waiting acquisitions use release notifications.
    pub fn notifications(&self) -> bool {
        self.notifications
    }

    /// The longest wait between attempts of a notified acquisition.
    pub fn max_retry_delay(&self) -> Duration {
        self.max_retry_delay
    }

    /// Waits for replicas after every acquisition and extension of a single-mode lease (`WAIT`, or
    /// `WAITAOF` with [`ReplicaWait::aof`]), on the connection that wrote, right after the write. See
    /// [`Durability`] for what each policy does when the replicas do not acknowledge in time. The wait is
    /// part of the operation's round: its timeout is added to the operation timeout, and the time it takes
    /// is subtracted from the lease's validity. Redlock managers refuse a policy (their nodes are
    /// independent primaries). With a policy, [renewal batching](Self::with_renewal_batching) is not used:
    /// each lease renews on its own, each extension followed by its wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::{Config, Durability, ReplicaWait};
    ///
    /// let config = Config::default()
    ///     .with_durability(Durability::Required(ReplicaWait::new(1, Duration::from_millis(100))));
    /// assert!(config.durability().is_required());
    /// ```
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Keeps a Redlock node whose server restarted (its [`RunId`](crate::RunId) changed since this manager
    /// last saw it) out of acquisition quorums for `quarantine` after the change was seen: a server restarted
    /// without persistence forgot the locks it held, and counting it could let a second client take a lock
    /// the first still holds. Set it to the longest lock TTL any client of these nodes uses; `None` turns it
    /// off. Default: the configured [`expiry`](Self::with_expiry). (The longer of this and the acquiring
    /// lock's own TTL applies.)
    ///
    /// Needs nodes that report [`run_id`](crate::RedisNode::run_id), and sees only changes this process
    /// observes: a process that first talks to a node after its restart cannot know it restarted. In
    /// single mode a changed run id is reported as a [`NodeRestarted`](crate::EventKind::NodeRestarted)
    /// event and nothing else.
    #[must_use]
    pub fn with_restart_quarantine(mut self, quarantine: Option<Duration>) -> Self {
        self.quarantine = match quarantine {
            Some(d) => Quarantine::For(d),
            None => Quarantine::Off,
        };
        self
    }

    /// The durability policy.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The restart quarantine, if on.
    pub fn restart_quarantine(&self) -> Option<Duration> {
        match self.quarantine {
            Quarantine::Expiry => Some(self.expiry),
            Quarantine::For(d) => Some(d),
            Quarantine::Off => None,
        }
    }

    /// Renews leases in the background in batches: one shared renewer per manager renews its leases, and
    /// those that fall due within `window` of the earliest go to each node as one call of up to `max_batch`
    /// leases ([`RedisNode::extend_many`](crate::RedisNode::extend_many); a Lua script over all the keys, per
    /// slot on a cluster). Off by default.
    ///
    /// It applies to background renewal ([`Lock::auto_renew`](crate::Lock::auto_renew), on the manager's
    /// spawner) and to the renewal [`Lease::run`](crate::Lease::run) does, when every node supports batches;
    /// otherwise each lease renews on its own. A batched lease has no task of its own. A renewal is never
    /// later than its schedule because of batching: the leases due within `window` after the earliest are
    /// renewed with it, up to `window` early (keep it small against the renewal interval: milliseconds), and
    /// from then on share their schedule. Each lease keeps its own validity, measured from its batch round's
    /// start, and its own at-risk and loss handling. `max_batch` must be in `1..=1000`.
    pub fn with_renewal_batching(mut self, window: Duration, max_batch: usize) -> Self {
        self.renewal_batching = Some((window, max_batch));
        self
    }

    /// Sets the default hold limit of every lease: renewal stops `max_hold` after the acquisition, and the
    /// lease ends there with [`LossReason::HoldLimit`](crate::LossReason::HoldLimit) (see
    /// [`Lock::max_hold`](crate::Lock::max_hold), which overrides it per lock). `None` (the default): no
    /// limit.
    #[must_use]
    pub fn with_max_hold(mut self, max_hold: Option<Duration>) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The default hold limit, if any.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The renewal batching window and batch size, if batching is on.
    pub fn renewal_batching(&self) -> Option<(Duration, usize)> {
        self.renewal_batching
    }

    /// The default lease TTL.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// The number of acquisition attempts.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The base retry delay.
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }

    /// The retry jitter fraction.
    pub fn retry_jitter(&self) -> f64 {
        self.retry_jitter
    }

    /// The drift factor.
    pub fn drift_factor(&self) -> f64 {
        self.drift_factor
    }

    /// The jitter seed, if one was set.
    pub fn jitter_seed(&self) -> Option<u64> {
        self.jitter_seed
    }

    /// The operation timeout, if one was set (otherwise it is derived per lease: see
    /// [`operation_timeout_for`](Self::operation_timeout_for)).
    pub fn operation_timeout(&self) -> Option<Duration> {
        self.operation_timeout
    }

    /// The operation timeout that applies to leases of TTL `expiry`: the configured one, or `expiry / 5`, at
    /// most 500 ms and at least `min(50 ms, expiry / 2)`.
    pub fn operation_timeout_for(&self, expiry: Duration) -> Duration {
        self.operation_timeout.unwrap_or_else(|| {
            (expiry / 5)
                .max(DEFAULT_OPERATION_TIMEOUT_FLOOR.min(expiry / 2))
                .min(DEFAULT_OPERATION_TIMEOUT_CAP)
        })
    }

    /// Checks the settings on their own and against the default expiry.
    ///
    /// # Errors
    /// The first problem found, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        nonzero("retry_delay", self.retry_delay)?;
        nonzero("max_retry_delay", self.max_retry_delay)?;
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(ConfigError::RetryJitter(self.retry_jitter));
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactor(self.drift_factor));
        }
        if let Some(timeout) = self.operation_timeout {
            nonzero("operation_timeout", timeout)?;
        }
        if let Some(wait) = self.durability.wait() {
            if wait.replicas == 0 {
                return Err(ConfigError::Durability(
                    "the durability policy waits for 0 replicas; use Durability::Off",
                ));
            }
            nonzero("durability timeout", wait.timeout)?;
        }
        if let Quarantine::For(d) = self.quarantine {
            nonzero("restart_quarantine", d)?;
        }
        if let Some(d) = self.max_hold {
            nonzero("max_hold", d)?;
        }
        if let Some((window, max)) = self.renewal_batching {
            if !(1..=1000).contains(&max) {
                return Err(ConfigError::RenewalBatch(format!(
                    "max_batch must be in 1..=1000, got {max}"
                )));
            }
            if window >= self.expiry {
                return Err(ConfigError::RenewalBatch(format!(
                    "the window ({window:?}) must be shorter than the expiry ({:?})",
                    self.expiry
                )));
            }
        }
        self.check_expiry(self.expiry).map(|_| ())
    }

    /// Checks a lease TTL against these settings and converts it for the wire.
    pub(crate) fn check_expiry(&self, expiry: Duration) -> Result<Ttl, ConfigError> {
        nonzero("expiry", expiry)?;
        let ttl = Ttl::from_duration(expiry).ok_or(ConfigError::TooLong {
            field: "expiry",
            value: expiry,
            max: Ttl::MAX.as_duration(),
        })?;
        let drift = drift(ttl, self.drift_factor);
        if drift >= ttl.as_duration() {
            return Err(ConfigError::ExpiryWithinDrift { expiry, drift });
        }
        let timeout = self.operation_timeout_for(expiry);
        if timeout.is_zero() {
            return Err(ConfigError::ZeroDuration {
                field: "operation_timeout",
            });
        }
        if timeout >= expiry {
            return Err(ConfigError::OperationTimeoutNotBelowExpiry {
                operation_timeout: timeout,
                expiry,
            });
        }
        if let Some(wait) = self.durability.wait() {
            if timeout.saturating_add(wait.timeout) >= expiry {
                return Err(ConfigError::DurabilityWaitNotBelowExpiry {
                    wait: wait.timeout,
                    operation_timeout: timeout,
                    expiry,
                });
            }
        }
        Ok(ttl)
    }

    /// Checks an automatic-renewal interval against a lease TTL.
    pub(crate) fn check_renewal(
        &self,
        interval: Duration,
        expiry: Duration,
    ) -> Result<(), ConfigError> {
        nonzero("auto_renew interval", interval)?;
        if interval >= expiry {
            return Err(ConfigError::RenewalIntervalNotBelowExpiry { interval, expiry });
        }
        Ok(())
    }
}

fn nonzero(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::ZeroDuration { field })
    } else {
        Ok(())
    }
}

/// The longest lock or fence key redlease sends, in bytes: a longer one is refused with
/// [`ConfigError::KeyTooLong`] before any command is sent. (Redis accepts keys up to 512 MB, but every
/// command of a lease carries its key, and a lock name that long is a bug.)
pub const MAX_KEY_BYTES: usize = 4096;

/// Checks a lock or fence key (`which`) before anything is sent: not empty, at most [`MAX_KEY_BYTES`].
pub(crate) fn check_key(which: &'static str, key: &str) -> Result<(), ConfigError> {
    if key.is_empty() {
        return Err(ConfigError::InvalidKey(match which {
            "fence" => "the fence key is empty",
            _ => "the lock key is empty",
        }));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ConfigError::KeyTooLong {
            which,
            len: key.len(),
            max: MAX_KEY_BYTES,
        });
    }
    Ok(())
}

/// A setting, lock name or topology that cannot work. Raised before any command is sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A duration that must be positive is zero.
    #[error("{field} must be greater than zero")]
    ZeroDuration {
        /// The setting's name.
        field: &'static str,
    },
    /// A duration is longer than redlease can send to Redis.
    #[error("{field} of {value:?} exceeds the maximum of {max:?}")]
    TooLong {
        /// The setting's name.
        field: &'static str,
        /// The rejected value.
        value: Duration,
        /// The largest accepted value.
        max: Duration,
    },
    /// `attempts` is zero: no acquisition would ever be tried.
    #[error("attempts must be at least 1")]
    ZeroAttempts,
    /// The drift factor is not in `[0, 1)`.
    #[error("drift_factor must be in [0, 1), got {0}")]
    DriftFactor(f64),
    /// The retry jitter is not in `[0, 1]`.
    #[error("retry_jitter must be in [0, 1], got {0}")]
    RetryJitter(f64),
    /// The drift allowance consumes the whole TTL, so no lease could ever be valid.
    #[error("expiry of {expiry:?} leaves no validity after the drift allowance of {drift:?}")]
    ExpiryWithinDrift {
        /// The lease TTL.
        expiry: Duration,
        /// `ceil(expiry * drift_factor) + 2 ms`.
        drift: Duration,
    },
    /// The operation timeout is not shorter than the lease TTL.
    #[error(
        "operation_timeout ({operation_timeout:?}) must be shorter than the expiry ({expiry:?})"
    )]
    OperationTimeoutNotBelowExpiry {
        /// The effective operation timeout.
        operation_timeout: Duration,
        /// The lease TTL.
        expiry: Duration,
    },
    /// The automatic-renewal interval is not shorter than the lease TTL.
    #[error("auto_renew interval ({interval:?}) must be shorter than the expiry ({expiry:?})")]
    RenewalIntervalNotBelowExpiry {
        /// The renewal interval.
        interval: Duration,
        /// The lease TTL.
        expiry: Duration,
    },
    /// [`Lock::auto_renew`](crate::Lock::auto_renew) asks for background renewal, but the manager has no
    /// spawner to run it on.
    #[error(
        "auto_renew needs a spawner to renew in the background (LockManager::with_spawner); without one, do \
         the work inside Lease::run, which renews by itself"
    )]
    AutoRenewWithoutSpawner,
    /// The renewal batching settings cannot work.
    #[error("renewal batching: {0}")]
    RenewalBatch(String),
    /// A fence value no Redis counter can exceed (`i64::MAX` or more).
    #[error("fence value {0} leaves no larger fence below i64::MAX")]
    FenceOutOfRange(u64),
    /// The durability policy cannot work (e.g. it waits for no replica, or the manager is a Redlock one).
    #[error("invalid durability policy: {0}")]
    Durability(&'static str),
    /// The operation timeout plus the durability wait is not shorter than the lease TTL.
    #[error(
        "operation_timeout ({operation_timeout:?}) plus the durability wait ({wait:?}) must be shorter than \
         the expiry ({expiry:?})"
    )]
    DurabilityWaitNotBelowExpiry {
        /// The durability policy's wait timeout.
        wait: Duration,
        /// The effective operation timeout.
        operation_timeout: Duration,
        /// The lease TTL.
        expiry: Duration,
    },
    /// A lock or fence key is unusable.
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    /// A lock or fence key is longer than [`MAX_KEY_BYTES`]. Checked before anything is sent, so that a key
    /// built by mistake from a payload never reaches the servers (nor, whole, a log line).
    #[error("the {which} key is {len} bytes long; the limit is {max} bytes")]
    KeyTooLong {
        /// `"lock"` or `"fence"`.
        which: &'static str,
        /// The key's length in bytes.
        len: usize,
        /// [`MAX_KEY_BYTES`].
        max: usize,
    },
    /// A [`Semaphore`](crate::Semaphore) that cannot work: zero permits, or no quorum of the nodes bounds
    /// its holders.
    #[error("invalid semaphore: {0}")]
    Semaphore(&'static str),
    /// [Holder info](crate::Lock::with_holder_info) longer than
    /// [`MAX_HOLDER_INFO_BYTES`](crate::MAX_HOLDER_INFO_BYTES).
    #[error("the holder info is {len} bytes long; the limit is {max} bytes")]
    HolderInfoTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A [`LeaseTicket`](crate::LeaseTicket) given to [`Lock::resume`](crate::Lock::resume) does not fit the
    /// lock: another key, another mode or node count, or a fenced lock without a fence (or the reverse).
    #[error("the lease ticket does not fit this lock: {0}")]
    TicketMismatch(&'static str),
    /// The node list does not form a valid topology for the chosen algorithm.
    #[error("invalid topology: {0}")]
    Topology(String),
}

/// The fixed part of the drift allowance (Redis' own expiry granularity and timer resolution).
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// The drift allowance for a TTL: `ceil(ttl_ms × factor) ms + 2 ms`.
///
/// A factor outside `[0, 1)` is clamped (config validation rejects it earlier).
pub fn drift(ttl: Ttl, factor: f64) -> Duration {
    let factor = if factor.is_nan() {
        0.0
    } else {
        factor.clamp(0.0, 1.0)
    };
    // ttl_ms ≤ 2^46, so the product is exact enough in f64 and fits in u64.
    let scaled = (ttl.as_millis() as f64 * factor).ceil() as u64;
    Duration::from_millis(scaled).saturating_add(DRIFT_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_reference() {
        let c = Config::default();
        assert_eq!(c.expiry(), Duration::from_secs(30));
        assert_eq!(c.attempts(), 3);
        assert_eq!(c.retry_delay(), Duration::from_millis(200));
        assert_eq!(c.retry_jitter(), 0.5);
        assert_eq!(c.drift_factor(), 0.01);
        assert_eq!(
            c.operation_timeout_for(Duration::from_secs(30)),
            Duration::from_millis(500)
        );
        assert_eq!(
            c.operation_timeout_for(Duration::from_secs(1)),
            Duration::from_millis(200)
        );
        // Short TTLs: at least 50 ms, or half the TTL (never the whole of it).
        for (ttl, op) in [(250, 50), (100, 50), (20, 10), (2, 1)] {
            assert_eq!(
                c.operation_timeout_for(Duration::from_millis(ttl)),
                Duration::from_millis(op),
                "{ttl} ms"
            );
        }
        assert_eq!(
            c.operation_timeout_for(Duration::from_millis(1)),
            Duration::from_micros(500)
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn zero_durations_are_rejected() {
        let err = |c: Config| c.validate().unwrap_err();
        assert_eq!(
            err(Config::default().with_expiry(Duration::ZERO)),
            ConfigError::ZeroDuration { field: "expiry" }
        );
        assert_eq!(
            err(Config::default().with_retry_delay(Duration::ZERO)),
            ConfigError::ZeroDuration {
                field: "retry_delay"
            }
        );
        assert_eq!(
            err(Config::default().with_operation_timeout(Duration::ZERO)),
            ConfigError::ZeroDuration {
                field: "operation_timeout"
            }
        );
        assert_eq!(
            err(Config::default().with_attempts(0)),
            ConfigError::ZeroAttempts
        );
    }

    #[test]
    fn drift_factor_outside_unit_interval_is_rejected() {
        for bad in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                Config::default().with_drift_factor(bad).validate(),
                Err(ConfigError::DriftFactor(_))
            ));
        }
        assert_eq!(Config::default().with_drift_factor(0.0).validate(), Ok(()));
        assert_eq!(Config::default().with_drift_factor(0.5).validate(), Ok(()));
    }

    #[test]
    fn jitter_outside_unit_interval_is_rejected() {
        for bad in [-0.01, 1.01, f64::NAN] {
            assert!(matches!(
                Config::default().with_retry_jitter(bad).validate(),
                Err(ConfigError::RetryJitter(_))
            ));
        }
    }

    #[test]
    fn operation_timeout_must_be_below_expiry() {
        let c = Config::default()
            .with_expiry(Duration::from_millis(400))
            .with_operation_timeout(Duration::from_millis(400));
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OperationTimeoutNotBelowExpiry { .. })
        ));
    }

    #[test]
    fn renewal_interval_must_be_below_expiry() {
        let c = Config::default();
        let expiry = Duration::from_secs(10);
        assert!(c.check_renewal(Duration::from_secs(3), expiry).is_ok());
        assert!(matches!(
            c.check_renewal(expiry, expiry),
            Err(ConfigError::RenewalIntervalNotBelowExpiry { .. })
        ));
        assert!(matches!(
            c.check_renewal(Duration::ZERO, expiry),
            Err(ConfigError::ZeroDuration { .. })
        ));
    }

    #[test]
    fn ttl_edges_give_errors_not_panics() {
        // 1-3 ms: the drift allowance (ceil(ttl * 0.01) + 2 ms = 3 ms) leaves nothing.
        for ms in 1..=3 {
            assert!(matches!(
                Config::default()
                    .with_expiry(Duration::from_millis(ms))
                    .validate(),
                Err(ConfigError::ExpiryWithinDrift { .. })
            ));
        }
        for ms in 4..=5 {
            assert_eq!(
                Config::default()
                    .with_expiry(Duration::from_millis(ms))
                    .validate(),
                Ok(())
            );
        }
        assert!(matches!(
            Config::default().with_expiry(Duration::MAX).validate(),
            Err(ConfigError::TooLong { .. })
        ));
        assert_eq!(
            Config::default()
                .with_expiry(Ttl::MAX.as_duration())
                .validate(),
            Ok(())
        );
    }
}
