//! Several workers contend for one lock and print who holds it.
//!
//! Without configuration it runs on the embedded in-memory backend: no Redis needed. Each worker is then an
//! OS thread driving its own futures with a minimal executor, which shows that redlease needs no async
//! runtime.
//!
//! With `REDLEASE_NODES` set to a comma-separated list of Redis URLs it uses real Redis through the redis-rs
//! adapter (on a tokio runtime):
//!
//! - one URL: a single Redis authority with fencing tokens, as in the in-memory mode;
//! - an odd number ≥ 3 of URLs: Redlock over independent servers, which issues no fencing tokens, so each
//!   line shows the first characters of the lease's random token instead.
//!
//! Everything printed is measured or checked while the demo runs: fencing tokens must increase, and no two
//! workers of this process may believe they hold the lock at the same time. The exit code is 1 when a check
//! fails or a worker fails, and 2 when the demo cannot start (bad configuration, unreachable server).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{Config, Error, Lock, LockManager, SystemTimer, Timer};
use redlease_adapters::redis::{MultiplexedNode, RedisRsNode, redis};
use redlease_testkit::{MemoryNode, block_on};

const WORKERS: u64 = 4;
const ROUNDS: u64 = 3;
const NODES_ENV: &str = "REDLEASE_NODES";
const LOCK_KEY: &str = "demo:{report}:lock";
const FENCE_KEY: &str = "demo:{report}:fence";
const EXPIRY: Duration = Duration::from_secs(2);
const RENEW_EVERY: Duration = Duration::from_millis(600);
const HOLD: Duration = Duration::from_millis(150);

fn main() -> ExitCode {
    let urls = match std::env::var(NODES_ENV) {
        Ok(value) if !value.trim().is_empty() => match parse_nodes(&value) {
            Ok(urls) => Some(urls),
            Err(message) => {
                eprintln!("redlease demo: {NODES_ENV}: {message}");
                return ExitCode::from(2);
            }
        },
        Ok(_) | Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            eprintln!("redlease demo: {NODES_ENV} is not valid UTF-8");
            return ExitCode::from(2);
        }
    };
    let config = Config::default()
        .with_expiry(EXPIRY)
        .with_retry_delay(Duration::from_millis(40));
    let outcome = match urls {
        None => run_in_memory(config),
        Some(urls) => run_on_redis(&urls, config),
    };
    match outcome {
        Ok(summary) => summary.report(),
        Err(message) => {
            eprintln!("redlease demo: {message}");
            ExitCode::from(2)
        }
    }
}

/// Splits and checks `REDLEASE_NODES`: one URL (single Redis) or an odd number of at least three (Redlock).
fn parse_nodes(value: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = value.split(',').map(|s| s.trim().to_owned()).collect();
    if let Some(i) = urls.iter().position(String::is_empty) {
        return Err(format!(
            "entry {} of {} is empty (expected comma-separated URLs like redis://127.0.0.1:6379)",
            i + 1,
            urls.len()
        ));
    }
    for (i, url) in urls.iter().enumerate() {
        if let Err(e) = redis::Client::open(url.as_str()) {
            return Err(format!("entry {} is not a valid Redis URL: {e}", i + 1));
        }
    }
    match urls.len() {
        1 => Ok(urls),
        n if n >= 3 && n % 2 == 1 => Ok(urls),
        n => Err(format!(
            "{n} URLs given; use one (a single Redis, with fencing tokens) or an odd number of at least \
             three independent servers (Redlock)"
        )),
    }
}

/// What the workers observed, shared between them.
struct Observed {
    started: Instant,
    fenced: bool,
    acquisitions: AtomicU64,
    /// Workers that currently believe they hold the lock.
    holders: AtomicU64,
    /// Acquisitions that began while another worker of this process still held the lock.
    overlaps: AtomicU64,
    /// The largest fencing token seen so far (0: none yet).
    last_fence: AtomicU64,
    /// Fencing tokens that were not larger than the previous one.
    stale: AtomicU64,
}

impl Observed {
    fn new(fenced: bool) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            fenced,
            acquisitions: AtomicU64::new(0),
            holders: AtomicU64::new(0),
            overlaps: AtomicU64::new(0),
            last_fence: AtomicU64::new(0),
            stale: AtomicU64::new(0),
        })
    }
}

/// The outcome of a run.
struct Summary {
    observed: Arc<Observed>,
    failures: Vec<String>,
}

impl Summary {
    fn report(self) -> ExitCode {
        let o = &self.observed;
        let acquisitions = o.acquisitions.load(Ordering::SeqCst);
        let overlaps = o.overlaps.load(Ordering::SeqCst);
        let stale = o.stale.load(Ordering::SeqCst);
        println!(
            "\n{acquisitions} acquisitions in {:.2}s; {overlaps} while another worker held the lock",
            o.started.elapsed().as_secs_f64()
        );
        if o.fenced {
            println!("{stale} with a fencing token that did not increase");
        }
        for failure in &self.failures {
            eprintln!("redlease demo: {failure}");
        }
        if overlaps > 0 || stale > 0 || !self.failures.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

fn describe_lock(manager: &LockManager, fenced: bool) -> Lock {
    let lock = manager.lock(LOCK_KEY).renew_every(RENEW_EVERY);
    if fenced { lock.fenced(FENCE_KEY) } else { lock }
}

/// The in-memory backend: one OS thread per worker, no async runtime.
fn run_in_memory(config: Config) -> Result<Summary, String> {
    let manager = LockManager::single(MemoryNode::new(), config).map_err(|e| e.to_string())?;
    println!(
        "redlease demo: {WORKERS} workers, one fenced lock, in-memory backend \
         (set {NODES_ENV}=redis://host:port[,…] to use Redis)\n"
    );
    let observed = Observed::new(true);
    let threads: Vec<_> = (1..=WORKERS)
        .map(|id| {
            let lock = describe_lock(&manager, true);
            let observed = Arc::clone(&observed);
            std::thread::spawn(move || block_on(worker(id, lock, observed)))
        })
        .collect();
    let failures = threads
        .into_iter()
        .enumerate()
        .filter_map(|(i, thread)| match thread.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("worker {}: {}", i + 1, chain(&e))),
            Err(_) => Some(format!("worker {} panicked", i + 1)),
        })
        .collect();
    Ok(Summary { observed, failures })
}

/// Real Redis through redis-rs: one node (fenced) or Redlock; one tokio task per worker.
fn run_on_redis(urls: &[String], config: Config) -> Result<Summary, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    runtime.block_on(async {
        let mut nodes = Vec::with_capacity(urls.len());
        let mut endpoints = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            let (node, endpoint) = connect(url)
                .await
                .map_err(|e| format!("node {} of {}: {e}", i + 1, urls.len()))?;
            nodes.push(node);
            endpoints.push(endpoint);
        }
        let fenced = nodes.len() == 1;
        let manager = if fenced {
            let node = nodes.pop().ok_or("no node")?;
            LockManager::single(node, config)
        } else {
            LockManager::redlock(nodes, config)
        }
        .map_err(|e| e.to_string())?;
        if fenced {
            println!(
                "redlease demo: {WORKERS} workers, one fenced lock, Redis backend (redis-rs), single node {}\n",
                endpoints.join("")
            );
        } else {
            println!(
                "redlease demo: {WORKERS} workers, one lock, Redis backend (redis-rs), Redlock over {} nodes \
                 (quorum {}): {}",
                manager.nodes(),
                manager.quorum(),
                endpoints.join(", ")
            );
            println!(
                "Redlock issues no fencing tokens: each line shows the first characters of the lease's random \
                 token instead\n"
            );
        }
        let observed = Observed::new(fenced);
        let tasks: Vec<_> = (1..=WORKERS)
            .map(|id| tokio::spawn(worker(id, describe_lock(&manager, fenced), Arc::clone(&observed))))
            .collect();
        let mut failures = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("worker {}: {}", i + 1, chain(&e))),
                Err(e) => failures.push(format!("worker {}: {e}", i + 1)),
            }
        }
        Ok(Summary { observed, failures })
    })
}

/// Connects to one server with short client timeouts; returns the node and its URL without credentials.
async fn connect(url: &str) -> Result<(MultiplexedNode, String), String> {
    let client = redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))?;
    let info = client.get_connection_info();
    let endpoint = format!("redis://{}/{}", info.addr(), info.redis_settings().db());
    // redlease cuts every round at its operation timeout (400 ms for the 2 s expiry used here); the client's
    // timeouts are a second line of defence, and make an unreachable server fail fast.
    let settings = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_millis(500)));
    let conn = client
        .get_multiplexed_async_connection_with_config(&settings)
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    Ok((
        RedisRsNode::new(conn).with_endpoint(endpoint.clone()),
        endpoint,
    ))
}

/// One worker: acquire, report, hold (renewed), release; `ROUNDS` times.
async fn worker(id: u64, lock: Lock, observed: Arc<Observed>) -> Result<(), Error> {
    for _ in 0..ROUNDS {
        let lease = lock.acquire_within(Duration::from_secs(30)).await?;
        if observed.holders.fetch_add(1, Ordering::SeqCst) > 0 {
            observed.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        observed.acquisitions.fetch_add(1, Ordering::SeqCst);
        let what = match lease.fencing_token() {
            Some(fence) => {
                // A fenced store accepts only growing tokens; the demo checks the same property.
                let previous = observed.last_fence.swap(fence, Ordering::SeqCst);
                let order = if fence > previous {
                    "ok"
                } else {
                    observed.stale.fetch_add(1, Ordering::SeqCst);
                    "STALE"
                };
                let previous = match previous {
                    0 => "first of this run".to_owned(),
                    p => format!("previous {p}"),
                };
                format!("fencing token {fence:>2} ({order}, {previous})")
            }
            None if observed.fenced => {
                observed.stale.fetch_add(1, Ordering::SeqCst);
                "NO fencing token on a fenced lock".to_owned()
            }
            None => format!(
                "token {:<5} valid for {:.2}s",
                lease.token().to_string(),
                lease.remaining().as_secs_f64()
            ),
        };
        println!(
            "{:>6.2}s  worker {id} holds the lock  {what}",
            observed.started.elapsed().as_secs_f64()
        );
        let held = lease.run(pause(HOLD)).await;
        observed.holders.fetch_sub(1, Ordering::SeqCst);
        held?;
        lease.release().await?;
        // Give the others a chance before trying again.
        pause(Duration::from_millis(60)).await;
    }
    Ok(())
}

/// An error with its sources.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// A runtime-free sleep: redlease's default timer (its own timer thread) works on any executor.
async fn pause(d: Duration) {
    SystemTimer.sleep_until(Instant::now() + d).await;
}
