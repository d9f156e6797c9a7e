//! The implementations under test behind one enum, so every scenario drives them identically: connect,
//! one acquisition attempt, an acquisition that waits, release, and a lease that renews itself.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::Value;
use redis::aio::MultiplexedConnection;
use redlease::{Config, Lease, LockManager, Task};
use redlease_adapters::fred::ClientNode;
use redlease_adapters::fred::fred::prelude::{Builder, ClientLike};
use redlease_adapters::fred::fred::types::{ClusterHash, CustomCommand, Value as FredValue};
use redlease_adapters::redis::MultiplexedNode;
use redlease_adapters::{Commands, scripts};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Errors are reported as text: every client crate has its own error type.
pub(crate) type Res<T> = Result<T, String>;

/// `map_err` helper that prefixes a context.
pub(crate) fn ctx<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// An implementation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Impl {
    /// The floor: `SET NX PX`, then a compare-and-delete `EVALSHA`, on one redis-rs multiplexed connection per
    /// node (concurrently on all nodes for Redlock).
    Raw,
    /// The fred floor: the same two commands as [`Impl::Raw`] through one fred `Client` per node
    /// (`custom` commands: no per-command options, no capability check).
    RawFred,
    /// [`Impl::Raw`] whose release also passes the notification channel and `PUBLISH` to the release script,
    /// as redlease's release does (S1 and S3 only): the floor with the server-side cost of notifications.
    RawPublish,
    /// redlease over redis-rs (`MultiplexedNode`).
    RedleaseRedis,
    /// redlease over fred (`ClientNode`).
    RedleaseFred,
    /// redlease over the testkit's in-memory node (S7 only).
    RedleaseMemory,
    /// `RedleaseRedis` with an observer that does nothing (S1 only, `--observers`): the hook's own cost.
    RedleaseRedisNoop,
    /// `RedleaseRedis` with `redlease::metrics::MetricsObserver` over the `metrics` no-op recorder (S1 only).
    RedleaseRedisMetrics,
    /// `RedleaseMemory` with the no-op observer (S7 only).
    RedleaseMemoryNoop,
    /// `RedleaseMemory` with `MetricsObserver` over the no-op recorder (S7 only).
    RedleaseMemoryMetrics,
    /// rslock 0.10 (redis-rs, Redlock).
    Rslock,
    /// distributed-lock-redis 0.2 (fred 9, Redlock).
    Dlr,
    /// async-redis-lock 0.4 (redis-rs, one node).
    Arl,
    /// `RedleaseRedis` on Valkey 9.1 (`--valkey`), automatic mode: release `DELIFEQ`, extend by script.
    ValkeyRedisNative,
    /// `RedleaseRedis` on Valkey 9.1 (`--valkey`), pinned to scripts (`Commands::Scripts`).
    ValkeyRedisScripts,
    /// `RedleaseFred` on Valkey 9.1 (`--valkey`), automatic mode.
    ValkeyFredNative,
    /// `RedleaseFred` on Valkey 9.1 (`--valkey`), pinned to scripts.
    ValkeyFredScripts,
    /// `RedleaseRedis` with release notifications off: waiting polls (S5 and S8 only).
    RedleaseRedisPoll,
    /// `RedleaseFred` with release notifications off (S5 and S8 only).
    RedleaseFredPoll,
    /// `RedleaseRedis` with `max_retry_delay` 10 s (S8 only): what the insurance against lost notifications
    /// costs.
    RedleaseRedisCap10,
    /// `RedleaseRedis` on a primary with one replica (`--replication`, S1 only), no durability policy: the
    /// baseline of the two below, on the same server.
    ReplicatedRedis,
    /// `ReplicatedRedis` with `Durability::Required(ReplicaWait::new(1, 1 s))`: `WAIT 1` after each
    /// acquisition.
    ReplicatedRedisWait1,
    /// `ReplicatedRedis` with the restart quarantine off (no `run_id` lookup after the acquisition).
    ReplicatedRedisNoQuarantine,
    /// `RedleaseRedis` with renewal batching ([`BATCH_WINDOW`], [`BATCH_MAX`]; S6 only).
    RedleaseRedisBatch,
    /// `RedleaseFred` with renewal batching (S6 only).
    RedleaseFredBatch,
}

/// The renewal batching window of the `+batch` variants (`Config::with_renewal_batching`).
pub(crate) const BATCH_WINDOW: Duration = Duration::from_millis(5);
/// The largest batch of the `+batch` variants (the adapters' own limit per call is 100).
pub(crate) const BATCH_MAX: usize = 100;

impl Impl {
    /// Every implementation, in table order.
    pub(crate) const ALL: [Impl; 8] = [
        Impl::Raw,
        Impl::RawFred,
        Impl::RedleaseRedis,
        Impl::RedleaseFred,
        Impl::RedleaseMemory,
        Impl::Rslock,
        Impl::Dlr,
        Impl::Arl,
    ];

    /// The observer variants, added to S1 and S7 by `--observers`.
    pub(crate) const OBSERVED: [Impl; 4] = [
        Impl::RedleaseRedisNoop,
        Impl::RedleaseRedisMetrics,
        Impl::RedleaseMemoryNoop,
        Impl::RedleaseMemoryMetrics,
    ];

    /// The Valkey 9.1 variants, added to S1, S3 and S6 by `--valkey`, each on a Valkey server of its own.
    pub(crate) const VALKEY: [Impl; 4] = [
        Impl::ValkeyRedisNative,
        Impl::ValkeyRedisScripts,
        Impl::ValkeyFredNative,
        Impl::ValkeyFredScripts,
    ];

    /// The command mode of a Valkey variant (`None` for the others, which run in the default mode).
    pub(crate) fn commands(self) -> Option<Commands> {
        match self {
            Impl::ValkeyRedisNative | Impl::ValkeyFredNative => Some(Commands::Automatic),
            Impl::ValkeyRedisScripts | Impl::ValkeyFredScripts => Some(Commands::Scripts),
            _ => None,
        }
    }

    /// redlease waiting by polling, next to the default (notified) one in S5 and S8.
    pub(crate) const POLLING: [Impl; 2] = [Impl::RedleaseRedisPoll, Impl::RedleaseFredPoll];

    /// redlease with a longer `max_retry_delay`, in S8 only.
    pub(crate) const LONG_CAP: [Impl; 1] = [Impl::RedleaseRedisCap10];

    /// The replication variants, added to S1 by `--replication`, on one primary with one replica.
    pub(crate) const REPLICATION: [Impl; 3] = [
        Impl::ReplicatedRedis,
        Impl::ReplicatedRedisWait1,
        Impl::ReplicatedRedisNoQuarantine,
    ];

    /// Whether it runs on the primary with a replica (`--replication`).
    pub(crate) fn replicated(self) -> bool {
        Self::REPLICATION.contains(&self)
    }

    /// redlease with renewal batching, in S6 and S6L only.
    pub(crate) const BATCHED: [Impl; 2] = [Impl::RedleaseRedisBatch, Impl::RedleaseFredBatch];

    /// The raw floor with the release's notification, in S1 and S3 only.
    pub(crate) const PUBLISHING: [Impl; 1] = [Impl::RawPublish];

    /// Whether it is one of the raw floors.
    pub(crate) fn raw(self) -> bool {
        matches!(self, Impl::Raw | Impl::RawFred | Impl::RawPublish)
    }

    /// Whether its manager batches renewals.
    pub(crate) fn batched(self) -> bool {
        Impl::BATCHED.contains(&self)
    }

    /// Whether it is redlease (which can count its node calls).
    pub(crate) fn redlease(self) -> bool {
        !matches!(
            self,
            Impl::Raw | Impl::RawFred | Impl::RawPublish | Impl::Rslock | Impl::Dlr | Impl::Arl
        )
    }

    /// The observer this implementation's manager gets.
    pub(crate) fn observer(self) -> Observed {
        match self {
            Impl::RedleaseRedisNoop | Impl::RedleaseMemoryNoop => Observed::Noop,
            Impl::RedleaseRedisMetrics | Impl::RedleaseMemoryMetrics => Observed::Metrics,
            _ => Observed::None,
        }
    }

    /// Whether it is redlease over the in-memory node (with or without an observer).
    pub(crate) fn memory(self) -> bool {
        matches!(
            self,
            Impl::RedleaseMemory | Impl::RedleaseMemoryNoop | Impl::RedleaseMemoryMetrics
        )
    }

    /// The name used in the table and the JSON `impl` key.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Impl::Raw => "raw",
            Impl::RawFred => "raw-fred",
            Impl::RawPublish => "raw+publish",
            Impl::RedleaseRedis => "redlease/redis",
            Impl::RedleaseFred => "redlease/fred",
            Impl::RedleaseMemory => "redlease/memory",
            Impl::RedleaseRedisNoop => "redlease/redis+noop-observer",
            Impl::RedleaseRedisMetrics => "redlease/redis+metrics",
            Impl::RedleaseMemoryNoop => "redlease/memory+noop-observer",
            Impl::RedleaseMemoryMetrics => "redlease/memory+metrics",
            Impl::Rslock => "rslock",
            Impl::Dlr => "distributed-lock-redis",
            Impl::Arl => "async-redis-lock",
            Impl::ValkeyRedisNative => "redlease/redis@valkey-9.1:native",
            Impl::ValkeyRedisScripts => "redlease/redis@valkey-9.1:scripts",
            Impl::ValkeyFredNative => "redlease/fred@valkey-9.1:native",
            Impl::ValkeyFredScripts => "redlease/fred@valkey-9.1:scripts",
            Impl::RedleaseRedisPoll => "redlease/redis+poll",
            Impl::RedleaseFredPoll => "redlease/fred+poll",
            Impl::RedleaseRedisCap10 => "redlease/redis, 10 s cap",
            Impl::ReplicatedRedis => "redlease/redis@replicated",
            Impl::ReplicatedRedisWait1 => "redlease/redis@replicated+wait1",
            Impl::ReplicatedRedisNoQuarantine => "redlease/redis@replicated-no-quarantine",
            Impl::RedleaseRedisBatch => "redlease/redis+batch",
            Impl::RedleaseFredBatch => "redlease/fred+batch",
        }
    }

    /// Whether it can lock over several independent nodes (Redlock).
    pub(crate) fn redlock(self) -> bool {
        !matches!(self, Impl::Arl) && !self.memory()
    }

    /// Whether it talks to Redis at all.
    pub(crate) fn networked(self) -> bool {
        !self.memory()
    }
}

/// Which observer a redlease manager gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    /// None (the default).
    None,
    /// One whose `event` does nothing: what the hook costs by itself (building each event, one dynamic call).
    Noop,
    /// `MetricsObserver` (no key label) over the recorder installed in `main` (the `metrics` no-op one).
    Metrics,
}

/// An observer that ignores every event.
struct NoopObserver;

impl redlease::Observer for NoopObserver {
    fn event(&self, _: &redlease::LeaseEvent<'_>) {}
}

/// `manager` with the observer `observed` asks for.
pub(crate) fn observe(manager: LockManager, observed: Observed) -> LockManager {
    match observed {
        Observed::None => manager,
        Observed::Noop => manager.with_observer(NoopObserver),
        Observed::Metrics => manager.with_observer(redlease::metrics::MetricsObserver::new()),
    }
}

/// Timing settings shared by every implementation in one scenario.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    /// Lease TTL.
    pub(crate) ttl: Duration,
    /// Bound on one round of node calls (where the implementation has one).
    pub(crate) op_timeout: Duration,
    /// Base pause between acquisition attempts while waiting for a held lock.
    pub(crate) retry_delay: Duration,
    /// Renewal interval of self-renewing leases.
    pub(crate) renew_every: Duration,
}

/// A process-unique token for the raw floor: random prefix plus counter (no syscall per acquisition).
struct TokenSource {
    prefix: String,
    next: AtomicU64,
}

impl TokenSource {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            prefix: format!("{:x}-{nanos:x}-", std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}{n:016x}", self.prefix)
    }
}

/// One node's connection of a raw floor: the same commands through either client.
#[derive(Clone)]
enum RawConn {
    /// A redis-rs multiplexed connection (cloned per command: an `Arc` handle).
    Redis(MultiplexedConnection),
    /// A fred client (one connection), commands sent with `custom` and the client's default options.
    Fred(redlease_adapters::fred::fred::prelude::Client),
}

impl RawConn {
    async fn connect(url: &str, fred: bool) -> Res<Self> {
        if fred {
            let config = redlease_adapters::fred::fred::prelude::Config::from_url(url)
                .map_err(ctx("raw-fred: config"))?;
            let client = Builder::from_config(config)
                .build()
                .map_err(ctx("raw-fred: build"))?;
            client.init().await.map_err(ctx("raw-fred: connect"))?;
            return Ok(RawConn::Fred(client));
        }
        let client = redis::Client::open(url).map_err(ctx("raw: open"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(ctx("raw: connect"))?;
        Ok(RawConn::Redis(conn))
    }

    /// `SCRIPT LOAD`: the script's digest.
    async fn load(&self, source: &str) -> Res<String> {
        match self {
            RawConn::Redis(conn) => redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query_async(&mut conn.clone())
                .await
                .map_err(ctx("raw: SCRIPT LOAD")),
            RawConn::Fred(client) => client
                .custom::<String, &str>(fred_cmd("SCRIPT"), vec!["LOAD", source])
                .await
                .map_err(ctx("raw-fred: SCRIPT LOAD")),
        }
    }

    /// `SET key token NX PX ttl`: whether it was set.
    async fn set_nx(&self, key: &str, token: &str, ttl_ms: &str) -> bool {
        match self {
            RawConn::Redis(conn) => matches!(
                redis::cmd("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async::<Value>(&mut conn.clone())
                    .await,
                Ok(Value::Okay)
            ),
            RawConn::Fred(client) => client
                .custom::<FredValue, &str>(fred_cmd("SET"), vec![key, token, "NX", "PX", ttl_ms])
                .await
                .is_ok_and(|v| v.as_str().is_some_and(|s| s == "OK")),
        }
    }

    /// `EVALSHA sha 1 key args…`: the script's integer reply.
    async fn evalsha(&self, sha: &'static str, key: &str, args: &[&str]) -> Res<i64> {
        match self {
            RawConn::Redis(conn) => redis_evalsha(conn, sha, key, args).await,
            RawConn::Fred(client) => fred_evalsha(client, sha, key, args).await,
        }
    }
}

/// `EVALSHA` through redis-rs.
async fn redis_evalsha(
    conn: &MultiplexedConnection,
    sha: &'static str,
    key: &str,
    args: &[&str],
) -> Res<i64> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key);
    for a in args {
        cmd.arg(*a);
    }
    cmd.query_async::<i64>(&mut conn.clone())
        .await
        .map_err(ctx("raw: EVALSHA"))
}

/// `EVALSHA` through fred.
async fn fred_evalsha(
    client: &redlease_adapters::fred::fred::prelude::Client,
    sha: &'static str,
    key: &str,
    args: &[&str],
) -> Res<i64> {
    let mut values = Vec::with_capacity(3 + args.len());
    values.extend([sha, "1", key]);
    values.extend_from_slice(args);
    client
        .custom::<i64, &str>(fred_cmd("EVALSHA"), values)
        .await
        .map_err(ctx("raw-fred: EVALSHA"))
}

/// A raw floor's renewal loop: every `every`, the extend script, until it fails. Each client gets a loop of
/// its own, so that a redis-rs lease's task does not carry the (much larger) state of a fred call. With
/// `lateness`, each renewal records how late it woke against its schedule (the previous send plus `every`).
async fn raw_renewal<F, Fut>(
    every: Duration,
    lateness: Option<Arc<crate::lateness::Lateness>>,
    mut extend: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut due = Instant::now() + every;
    loop {
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        if let Some(l) = &lateness {
            l.record(now.saturating_duration_since(due));
        }
        due = now + every;
        if !extend().await {
            return;
        }
    }
}

/// A fred command by its static name (no allocation for the name), routed by its first key.
fn fred_cmd(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

/// A raw floor's client: one connection per node (redis-rs or fred) and the preloaded scripts' digests.
pub(crate) struct RawClient {
    conns: Vec<RawConn>,
    setup: Setup,
    ttl_ms: String,
    tokens: TokenSource,
    /// S6: where the renewal loops record their lateness (see [`LATENESS`]).
    lateness: Option<Arc<crate::lateness::Lateness>>,
    /// Whether a release passes the notification channel and `PUBLISH` (see [`Impl::RawPublish`]).
    publish: bool,
}

/// A raw lock: where it was written and (S6) its renewal task.
pub(crate) struct RawHeld {
    key: String,
    token: String,
    renewal: Option<JoinHandle<()>>,
}

impl RawClient {
    async fn connect(urls: &[String], setup: Setup, fred: bool, publish: bool) -> Res<Self> {
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            let conn = RawConn::connect(url, fred).await?;
            for script in [scripts::RELEASE, scripts::EXTEND] {
                let sha = conn.load(script.source).await?;
                if sha != script.sha1 {
                    return Err(format!(
                        "raw: {} digest {sha} ≠ {}",
                        script.name, script.sha1
                    ));
                }
            }
            conns.push(conn);
        }
        Ok(Self {
            conns,
            setup,
            ttl_ms: setup.ttl.as_millis().to_string(),
            tokens: TokenSource::new(),
            lateness: lateness(),
            publish,
        })
    }

    fn quorum(&self) -> usize {
        self.conns.len() / 2 + 1
    }

    /// One attempt: `SET NX PX` on every node at once; done at a majority of OKs, at a majority that can no
    /// longer be reached, or at the operation timeout. On failure the partial writes are deleted.
    async fn try_acquire(&self, key: &str) -> Res<Option<RawHeld>> {
        let token = self.tokens.next();
        let ok = if let [conn] = self.conns.as_slice() {
            conn.set_nx(key, &token, &self.ttl_ms).await
        } else {
            let quorum = self.quorum();
            let n = self.conns.len();
            let mut calls: FuturesUnordered<_> = self
                .conns
                .iter()
                .map(|c| c.set_nx(key, &token, &self.ttl_ms))
                .collect();
            let tally = async {
                let (mut yes, mut no) = (0, 0);
                while let Some(ok) = calls.next().await {
                    if ok {
                        yes += 1;
                    } else {
                        no += 1;
                    }
                    if yes >= quorum || no > n - quorum {
                        break;
                    }
                }
                yes >= quorum
            };
            tokio::time::timeout(self.setup.op_timeout, tally)
                .await
                .unwrap_or(false)
        };
        let held = RawHeld {
            key: key.to_owned(),
            token,
            renewal: None,
        };
        if ok {
            Ok(Some(held))
        } else {
            if self.conns.len() > 1 {
                let _ = self.release(held).await;
            }
            Ok(None)
        }
    }

    /// Compare-and-delete on every node at once, each bounded by the operation timeout.
    async fn release(&self, held: RawHeld) -> Res<()> {
        if let Some(task) = held.renewal {
            task.abort();
        }
        let token = held.token.as_str();
        let channel = self.publish.then(|| redlease::notify::channel(&held.key));
        let with_publish;
        let args: &[&str] = match &channel {
            Some(channel) => {
                with_publish = [token, channel.as_str(), "PUBLISH"];
                &with_publish
            }
            None => std::slice::from_ref(&token),
        };
        if let [conn] = self.conns.as_slice() {
            return conn
                .evalsha(scripts::RELEASE.sha1, &held.key, args)
                .await
                .map(drop);
        }
        let calls = self.conns.iter().map(|c| {
            tokio::time::timeout(
                self.setup.op_timeout,
                c.evalsha(scripts::RELEASE.sha1, &held.key, args),
            )
        });
        futures::future::join_all(calls).await;
        Ok(())
    }

    /// The floor of automatic renewal: one task per lease, sleeping and sending a compare-and-pexpire. In
    /// S6, each renewal records how late it was sent against its schedule (the previous one's send
    /// plus the interval).
    async fn hold_renewing(&self, key: &str) -> Res<Option<RawHeld>> {
        let Some(mut held) = self.try_acquire(key).await? else {
            return Ok(None);
        };
        let conn = self.conns.first().cloned().ok_or("raw: no node")?;
        let (key, token) = (held.key.clone(), held.token.clone());
        let (every, ttl) = (self.setup.renew_every, self.ttl_ms.clone());
        let lateness = self.lateness.clone();
        let sha = scripts::EXTEND.sha1;
        held.renewal = Some(match conn {
            RawConn::Redis(conn) => tokio::spawn(async move {
                let args = [token.as_str(), ttl.as_str()];
                raw_renewal(every, lateness, || async {
                    redis_evalsha(&conn, sha, &key, &args).await == Ok(1)
                })
                .await;
            }),
            RawConn::Fred(client) => tokio::spawn(async move {
                let args = [token.as_str(), ttl.as_str()];
                raw_renewal(every, lateness, || async {
                    fred_evalsha(&client, sha, &key, &args).await == Ok(1)
                })
                .await;
            }),
        });
        Ok(Some(held))
    }
}

/// A connected implementation.
#[expect(
    clippy::large_enum_variant,
    reason = "one per measurement; boxing would add an indirection to every measured call of one variant"
)]
pub(crate) enum Client {
    /// The raw floor.
    Raw(RawClient),
    /// redlease over either adapter (or the in-memory node).
    Redlease(LockManager),
    /// rslock: `once` makes a single attempt, `patient` retries until its attempts run out.
    Rslock {
        /// One attempt per call.
        once: rslock::LockManager,
        /// Many attempts, `retry_delay` apart (randomised by rslock).
        patient: rslock::LockManager,
        /// TTL of its locks.
        ttl: Duration,
    },
    /// distributed-lock-redis.
    Dlr(distributed_lock_redis::RedisLockProvider),
    /// async-redis-lock.
    Arl {
        /// The locker (one reconnecting redis-rs connection).
        locker: async_redis_lock::Locker,
        /// Options with `timeout = 0`: one attempt.
        once: async_redis_lock::Options,
        /// Options with `timeout = patience`: waits, polling every `retry_delay`.
        patient: async_redis_lock::Options,
    },
}

/// A held lock of any implementation.
#[expect(
    clippy::large_enum_variant,
    reason = "boxing would add one allocation per acquisition to some implementations and not to others"
)]
pub(crate) enum Held {
    /// Raw.
    Raw(RawHeld),
    /// redlease.
    Redlease(Lease),
    /// rslock.
    Rslock(rslock::Lock),
    /// rslock inside `LockManager::using`, which renews it: stop it by sending on `stop`.
    RslockUsing {
        /// Ends the routine, so `using` releases the lock.
        stop: oneshot::Sender<()>,
        /// The task running `using`.
        task: JoinHandle<Res<()>>,
    },
    /// distributed-lock-redis.
    Dlr(distributed_lock_redis::RedisLockHandle),
    /// async-redis-lock.
    Arl(async_redis_lock::Lock),
}

impl Held {
    /// The inline size of the lock object a user would hold (heap parts are counted by the allocator).
    pub(crate) fn inline_size(&self) -> usize {
        match self {
            Held::Raw(h) => std::mem::size_of_val(h),
            Held::Redlease(h) => std::mem::size_of_val(h),
            Held::Rslock(h) => std::mem::size_of_val(h),
            Held::RslockUsing { stop, task } => {
                std::mem::size_of_val(stop) + std::mem::size_of_val(task)
            }
            Held::Dlr(h) => std::mem::size_of_val(h),
            Held::Arl(h) => std::mem::size_of_val(h),
        }
    }
}

/// A redlease configuration for `setup`, with a spawner on the current tokio runtime.
fn redlease_config(setup: Setup) -> Config {
    Config::default()
        .with_expiry(setup.ttl)
        .with_operation_timeout(setup.op_timeout)
        .with_retry_delay(setup.retry_delay)
}

/// Node calls made by redlease nodes built while [`COUNTING`] is on (S5, S8), through [`Counted`].
pub(crate) static NODE_CALLS: AtomicU64 = AtomicU64::new(0);

/// Whether redlease nodes are wrapped in [`Counted`] (set by S5 and S8 around their connects).
pub(crate) static COUNTING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A node that counts the calls made on it: one request to the server each on Redis 7.0, except a fresh
/// waiting attempt that finds the lock held (`SET NX GET`, then `PTTL`).
pub(crate) struct Counted<N>(N);

#[redlease::async_trait]
impl<N: redlease::RedisNode> redlease::NodeWrapper for Counted<N> {
    type Inner = N;

    fn inner(&self) -> &N {
        &self.0
    }

    async fn acquire(
        &self,
        key: &str,
        token: &redlease::Token,
        ttl: redlease::Ttl,
    ) -> Result<bool, redlease::NodeError> {
        NODE_CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.acquire(key, token, ttl).await
    }

    async fn claim(
        &self,
        req: redlease::ClaimRequest<'_>,
    ) -> Result<redlease::Claim, redlease::NodeError> {
        NODE_CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.claim(req).await
    }

    async fn release(
        &self,
        key: &str,
        token: &redlease::Token,
    ) -> Result<bool, redlease::NodeError> {
        NODE_CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.release(key, token).await
    }

    async fn extend(
        &self,
        key: &str,
        token: &redlease::Token,
        ttl: redlease::Ttl,
    ) -> Result<bool, redlease::NodeError> {
        NODE_CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.extend(key, token, ttl).await
    }
}

/// A redlease manager over `nodes` configured for `imp`, counting node calls when [`COUNTING`] is on.
fn redlease_client<N: redlease::RedisNode + 'static>(
    nodes: Vec<N>,
    setup: Setup,
    imp: Impl,
) -> Res<LockManager> {
    if COUNTING.load(Ordering::Relaxed) {
        redlease_manager_with(nodes.into_iter().map(Counted).collect(), setup, imp)
    } else {
        redlease_manager_with(nodes, setup, imp)
    }
}

/// Where S6 collects renewal lateness: set around its connect, like [`COUNTING`]; a client connected
/// meanwhile records into it (redlease through a [`LatenessObserver`](crate::lateness::LatenessObserver),
/// the raw floors from their renewal loops).
pub(crate) static LATENESS: std::sync::Mutex<Option<Arc<crate::lateness::Lateness>>> =
    std::sync::Mutex::new(None);

fn lateness() -> Option<Arc<crate::lateness::Lateness>> {
    LATENESS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A [`redlease::Timer`] on tokio's timer wheel, to compare with the default [`redlease::SystemTimer`]
/// (redlease's own shared timer thread).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioTimer;

impl redlease::Timer for TokioTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> redlease::Sleep {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}

/// The inline size of the last future redlease handed to the spawn hook (S6: the renewal task).
pub(crate) static LAST_TASK_SIZE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The timer redlease managers get (`--redlease-timer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum TimerChoice {
    /// [`RuntimeTimer`](redlease_adapters::runtime::RuntimeTimer): tokio's timer on a tokio runtime, what
    /// the adapters' one-line managers choose (the default here).
    Runtime = 0,
    /// [`TokioTimer`] above: tokio's timer, no wall clock (so no suspend detection).
    Tokio = 1,
    /// Core's default, [`redlease::SystemTimer`]: redlease's own timer thread, for any executor.
    System = 2,
}

/// The [`TimerChoice`] of this run, as its `u8`.
pub(crate) static TIMER: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn with_tokio_spawner(manager: LockManager) -> LockManager {
    let handle = tokio::runtime::Handle::current();
    let manager = manager.with_spawner(move |task: Task| {
        LAST_TASK_SIZE.store(std::mem::size_of_val(&*task), Ordering::Relaxed);
        handle.spawn(task);
    });
    match TIMER.load(Ordering::Relaxed) {
        0 => manager.with_timer(redlease_adapters::runtime::RuntimeTimer),
        1 => manager.with_timer(TokioTimer),
        _ => manager,
    }
}

fn redlease_manager<N: redlease::RedisNode + 'static>(
    nodes: Vec<N>,
    setup: Setup,
    imp: Impl,
) -> Res<LockManager> {
    redlease_manager_with(nodes, setup, imp)
}

/// Whether redlease managers skip the restart check (`--no-restart-check`: what reading each node's run id
/// after a won Redlock attempt costs; fred nodes cannot name their connection, so they send `INFO` each
/// time).
pub(crate) static NO_RESTART_CHECK: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// `imp`'s configuration: notifications unless it polls, its `max_retry_delay` and renewal batching.
fn redlease_config_for(setup: Setup, imp: Impl) -> Config {
    let poll = matches!(imp, Impl::RedleaseRedisPoll | Impl::RedleaseFredPoll);
    let mut config = redlease_config(setup).with_notifications(!poll);
    if NO_RESTART_CHECK.load(Ordering::Relaxed) {
        config = config.with_restart_quarantine(None);
    }
    if imp == Impl::RedleaseRedisCap10 {
        config = config.with_max_retry_delay(Duration::from_secs(10));
    }
    if imp.batched() {
        config = config.with_renewal_batching(BATCH_WINDOW, BATCH_MAX);
    }
    config
}

fn redlease_manager_with<N: redlease::RedisNode + 'static>(
    mut nodes: Vec<N>,
    setup: Setup,
    imp: Impl,
) -> Res<LockManager> {
    let config = redlease_config_for(setup, imp);
    let manager = if nodes.len() == 1 {
        let node = nodes.pop().ok_or("no node")?;
        LockManager::single(node, config)
    } else {
        LockManager::redlock(nodes, config)
    }
    .map_err(ctx("redlease: manager"))?;
    let manager = with_tokio_spawner(manager);
    Ok(match lateness() {
        Some(l) => manager.with_observer(crate::lateness::LatenessObserver(l)),
        None => observe(manager, imp.observer()),
    })
}

/// A small, fast pseudo-random jitter source for the harness's own retry loops.
fn jitter(base: Duration) -> Duration {
    static STATE: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    // base × (1 + U[0, 0.5)), like redlease's default jitter.
    base + base.mul_f64((x % 1000) as f64 / 2000.0)
}

impl Client {
    /// Connects `imp` to `urls` (one URL: single node; several: Redlock).
    pub(crate) async fn connect(imp: Impl, urls: &[String], setup: Setup) -> Res<Client> {
        match imp {
            Impl::Raw | Impl::RawFred | Impl::RawPublish => Ok(Client::Raw(
                RawClient::connect(urls, setup, imp == Impl::RawFred, imp == Impl::RawPublish)
                    .await?,
            )),
            Impl::RedleaseRedis
            | Impl::RedleaseRedisNoop
            | Impl::RedleaseRedisMetrics
            | Impl::ValkeyRedisNative
            | Impl::ValkeyRedisScripts
            | Impl::RedleaseRedisPoll
            | Impl::RedleaseRedisCap10
            | Impl::RedleaseRedisBatch => {
                let mut nodes = Vec::with_capacity(urls.len());
                for url in urls {
                    let client = redis::Client::open(url.as_str()).map_err(ctx("redis: open"))?;
                    nodes.push(
                        MultiplexedNode::connect(&client)
                            .await
                            .map_err(ctx("redis: connect"))?
                            .with_commands(imp.commands().unwrap_or_default()),
                    );
                }
                Ok(Client::Redlease(redlease_client(nodes, setup, imp)?))
            }
            Impl::ReplicatedRedis
            | Impl::ReplicatedRedisWait1
            | Impl::ReplicatedRedisNoQuarantine => {
                let [url] = urls else {
                    return Err("the replication variants lock on their one primary".into());
                };
                let client = redis::Client::open(url.as_str()).map_err(ctx("redis: open"))?;
                let node = MultiplexedNode::connect(&client)
                    .await
                    .map_err(ctx("redis: connect"))?;
                let mut config = redlease_config(setup);
                if imp == Impl::ReplicatedRedisWait1 {
                    config = config.with_durability(redlease::Durability::Required(
                        redlease::ReplicaWait::new(1, Duration::from_secs(1)),
                    ));
                }
                if imp == Impl::ReplicatedRedisNoQuarantine {
                    config = config.with_restart_quarantine(None);
                }
                let manager =
                    LockManager::single(node, config).map_err(ctx("redlease: manager"))?;
                Ok(Client::Redlease(with_tokio_spawner(manager)))
            }
            Impl::RedleaseFred
            | Impl::ValkeyFredNative
            | Impl::ValkeyFredScripts
            | Impl::RedleaseFredPoll
            | Impl::RedleaseFredBatch => {
                let mut nodes = Vec::with_capacity(urls.len());
                for url in urls {
                    let config = redlease_adapters::fred::fred::prelude::Config::from_url(url)
                        .map_err(ctx("fred: config"))?;
                    let client = Builder::from_config(config)
                        .build()
                        .map_err(ctx("fred: build"))?;
                    client.init().await.map_err(ctx("fred: connect"))?;
                    nodes.push(
                        ClientNode::new(client).with_commands(imp.commands().unwrap_or_default()),
                    );
                }
                Ok(Client::Redlease(redlease_client(nodes, setup, imp)?))
            }
            Impl::RedleaseMemory | Impl::RedleaseMemoryNoop | Impl::RedleaseMemoryMetrics => {
                Ok(Client::Redlease(redlease_manager(
                    vec![redlease_testkit::MemoryNode::new()],
                    setup,
                    imp,
                )?))
            }
            Impl::Rslock => {
                let mut once = rslock::LockManager::new(urls.to_vec());
                once.set_retry(1, setup.retry_delay);
                let mut patient = once.clone();
                patient.set_retry(u32::MAX, setup.retry_delay);
                Ok(Client::Rslock {
                    once,
                    patient,
                    ttl: setup.ttl,
                })
            }
            Impl::Dlr => {
                let provider = distributed_lock_redis::RedisLockProvider::builder()
                    .urls(urls)
                    .expiry(setup.ttl)
                    .extension_cadence(setup.renew_every)
                    // Its acquisition timeout is expiry − min_validity: make it the operation timeout.
                    .min_validity(setup.ttl.saturating_sub(setup.op_timeout))
                    .build()
                    .await
                    .map_err(ctx("distributed-lock-redis: connect"))?;
                Ok(Client::Dlr(provider))
            }
            Impl::Arl => {
                let url = match urls {
                    [url] => url,
                    _ => return Err("async-redis-lock locks on one node only".into()),
                };
                let locker = async_redis_lock::Locker::from_redis_url(url)
                    .await
                    .map_err(ctx("async-redis-lock: connect"))?;
                let base = async_redis_lock::Options::new()
                    .ttl(setup.ttl)
                    .extend(setup.renew_every)
                    .operation_timeout(setup.op_timeout)
                    .retry(setup.retry_delay);
                Ok(Client::Arl {
                    locker,
                    once: base.clone().timeout(Some(Duration::ZERO)),
                    patient: base,
                })
            }
        }
    }

    /// One acquisition attempt on `key`: `Ok(None)` when the lock is held by someone else.
    pub(crate) async fn try_acquire(&self, key: &str) -> Res<Option<Held>> {
        match self {
            Client::Raw(raw) => Ok(raw.try_acquire(key).await?.map(Held::Raw)),
            Client::Redlease(manager) => match manager.lock(key).try_acquire().await {
                Ok(lease) => Ok(Some(Held::Redlease(lease))),
                Err(e) if e.is_contended() => Ok(None),
                Err(e) => Err(format!("redlease: {e}")),
            },
            Client::Rslock { once, ttl, .. } => match once.lock(key.as_bytes(), *ttl).await {
                Ok(lock) => Ok(Some(Held::Rslock(lock))),
                Err(rslock::LockError::Unavailable) => Ok(None),
                Err(e) => Err(format!("rslock: {e}")),
            },
            Client::Dlr(provider) => provider
                .create_lock(key)
                .try_acquire()
                .await
                .map(|h| h.map(Held::Dlr))
                .map_err(ctx("distributed-lock-redis")),
            Client::Arl { locker, once, .. } => {
                match locker.acquire_with_options(once, key).await {
                    Ok(lock) => Ok(Some(Held::Arl(lock))),
                    Err(async_redis_lock::Error::Timeout) => Ok(None),
                    Err(e) => Err(format!("async-redis-lock: {e}")),
                }
            }
        }
    }

    /// Waits up to `patience` for `key`, with the implementation's own retry loop where it has one (redlease,
    /// rslock, async-redis-lock) and otherwise attempts `retry_delay` × (1 + U[0, ½)) apart.
    pub(crate) async fn acquire_waiting(
        &self,
        key: &str,
        patience: Duration,
        retry_delay: Duration,
    ) -> Res<Option<Held>> {
        match self {
            Client::Redlease(manager) => match manager.lock(key).acquire_within(patience).await {
                Ok(lease) => Ok(Some(Held::Redlease(lease))),
                Err(e) if e.is_contended() => Ok(None),
                Err(e) => Err(format!("redlease: {e}")),
            },
            Client::Rslock { patient, ttl, .. } => {
                match tokio::time::timeout(patience, patient.lock(key.as_bytes(), *ttl)).await {
                    Ok(Ok(lock)) => Ok(Some(Held::Rslock(lock))),
                    Ok(Err(rslock::LockError::Unavailable)) | Err(_) => Ok(None),
                    Ok(Err(e)) => Err(format!("rslock: {e}")),
                }
            }
            Client::Arl {
                locker, patient, ..
            } => {
                let opts = patient.clone().timeout(Some(patience));
                match locker.acquire_with_options(&opts, key).await {
                    Ok(lock) => Ok(Some(Held::Arl(lock))),
                    Err(async_redis_lock::Error::Timeout) => Ok(None),
                    Err(e) => Err(format!("async-redis-lock: {e}")),
                }
            }
            Client::Raw(_) | Client::Dlr(_) => {
                let deadline = Instant::now() + patience;
                loop {
                    if let Some(held) = self.try_acquire(key).await? {
                        return Ok(Some(held));
                    }
                    let pause = jitter(retry_delay);
                    if Instant::now() + pause >= deadline {
                        return Ok(None);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Releases `held` (which must come from this client).
    pub(crate) async fn release(&self, held: Held) -> Res<()> {
        match (self, held) {
            (Client::Raw(raw), Held::Raw(h)) => raw.release(h).await,
            (_, Held::Redlease(lease)) => lease
                .release()
                .await
                .map(drop)
                .map_err(ctx("redlease: release")),
            (_, Held::Rslock(lock)) => {
                lock.release().await;
                Ok(())
            }
            (_, Held::RslockUsing { stop, task }) => {
                let _ = stop.send(());
                task.await.map_err(ctx("rslock: using task"))?
            }
            (_, Held::Dlr(handle)) => handle
                .release()
                .await
                .map_err(ctx("distributed-lock-redis: release")),
            (_, Held::Arl(lock)) => lock
                .release()
                .await
                .map_err(ctx("async-redis-lock: release")),
            (_, Held::Raw(_)) => Err("a raw lock released through another client".into()),
        }
    }

    /// Acquires `key` as a lease that renews itself every `setup.renew_every` until released.
    ///
    /// redlease: `Lock::auto_renew` with the tokio spawner; raw: one task per lease; distributed-lock-redis and
    /// async-redis-lock: their own background extension; rslock: `LockManager::using`, which extends when the
    /// validity is down to 500 ms.
    pub(crate) async fn hold_renewing(self: &Arc<Self>, key: &str, setup: Setup) -> Res<Held> {
        let held = match &**self {
            Client::Raw(raw) => raw.hold_renewing(key).await?.map(Held::Raw),
            Client::Redlease(manager) => {
                match manager
                    .lock(key)
                    .auto_renew(setup.renew_every)
                    .try_acquire()
                    .await
                {
                    Ok(lease) => Some(Held::Redlease(lease)),
                    Err(e) if e.is_contended() => None,
                    Err(e) => return Err(format!("redlease: {e}")),
                }
            }
            Client::Rslock { once, ttl, .. } => {
                let (manager, ttl) = (once.clone(), *ttl);
                let (stop, stopped) = oneshot::channel::<()>();
                let (acquired, on_acquired) = oneshot::channel::<()>();
                let key = key.as_bytes().to_vec();
                let task = tokio::spawn(async move {
                    manager
                        .using(&key, ttl, async move || {
                            let _ = acquired.send(());
                            let _ = stopped.await;
                        })
                        .await
                        .map_err(ctx("rslock: using"))
                });
                on_acquired
                    .await
                    .map_err(|_| "rslock: using ended before acquiring".to_owned())?;
                Some(Held::RslockUsing { stop, task })
            }
            Client::Dlr(_) | Client::Arl { .. } => self.try_acquire(key).await?,
        };
        held.ok_or_else(|| format!("{key} is unexpectedly held by someone else"))
    }
}
