//! A redlease client run as an OS process by the chaos tests.
//!
//! Configured by `--name value` arguments, each of which can also come from the environment variable
//! `REDLEASE_WORKER_<NAME>` (upper case, `-` as `_`):
//!
//! | argument | meaning | default |
//! |---|---|---|
//! | `--role` | `contend`, `pause-holder` or `fenced-writer` | `contend` |
//! | `--id` | a name for the output lines | the process id |
//! | `--mode` | `single` or `redlock` | `single` |
//! | `--nodes` | comma-separated `redis://` URLs (one for single, 3+ for Redlock) | required |
//! | `--key` | the lock key | `chaos:lock` |
//! | `--fence-key` | fence counter key (single mode; empty: unfenced) | `chaos:fence` |
//! | `--rounds` | acquisitions (`contend`) | `20` |
//! | `--ttl-ms` | lease TTL | `10000` |
//! | `--counter` | counter key on the first node (`contend`) | `chaos:counter` |
//! | `--store` | fenced store key on the first node (`pause-holder`, `fenced-writer`) | `chaos:store` |
//! | `--seed` | seed of the random pauses | the process id |
//! | `--unlocked` | `true`: `contend` without the lock (the control experiment) | `false` |
//! | `--tasks` | concurrent acquirers in this process (`contend`), each a tokio task with its own connection | `1` |
//!
//! Every worker prints `READY` once connected and then waits for a line on stdin (the start signal), so
//! that the test can start all processes at once. It reports on stdout, one line per event, `KEY=VALUE`
//! fields after a verb; times are nanoseconds of `CLOCK_REALTIME`, which all processes share. On any error
//! it prints `ERROR <message>` and exits with status 1.
//!
//! - `contend`: each of `tasks` tasks, `rounds` times: acquire, `GET` the counter, sleep 0–2 ms, `SET`
//!   counter+1, release. Prints `HOLD id= start= end= read= fence= held=` per round (`id` is `<id>.<task>`
//!   with more than one task; `start` after the acquisition returned, `end` before the release was sent,
//!   `held` whether the lease was still valid at `end`), then `DONE` once every task is done.
//! - `pause-holder`: acquires a fenced lock renewed in the background (`auto_renew` at a third of the TTL),
//!   watches its loss signal, writes to the fenced store (`WRITE`), prints `PAUSE_ME` and waits for a second
//!   stdin line. The test stops it meanwhile. After the line it reports whether the loss signal had fired
//!   (`SIGNAL fired= reason= after_deadline_ms=`), then makes the write a paused holder would make late, with
//!   its old token (`LATE_WRITE accepted= stored=`), and releases (`RELEASE ok=`).
//! - `fenced-writer`: acquires the fenced lock (waiting up to 30 s), writes to the fenced store, releases.

// A test binary: it reports failures as `ERROR` lines and a non-zero exit.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlease::{Config, Lease, LockManager, LossReason, RedisNode};
use redlease_adapters::redis::redis;
use redlease_chaos::{Rng, fenced_write, get_counter, multiplexed_node, wall_ns};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;

type Result<T> = std::result::Result<T, String>;

struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> Result<Self> {
        let mut map = HashMap::new();
        let mut it = std::env::args().skip(1);
        while let Some(name) = it.next() {
            let Some(name) = name.strip_prefix("--") else {
                return Err(format!("unexpected argument {name:?}"));
            };
            let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_owned(), value);
        }
        Ok(Self(map))
    }

    fn get(&self, name: &str, default: Option<&str>) -> Result<String> {
        if let Some(v) = self.0.get(name) {
            return Ok(v.clone());
        }
        let env = format!("REDLEASE_WORKER_{}", name.to_uppercase().replace('-', "_"));
        if let Ok(v) = std::env::var(&env) {
            return Ok(v);
        }
        default
            .map(str::to_owned)
            .ok_or_else(|| format!("missing --{name} (or ${env})"))
    }

    fn num(&self, name: &str, default: u64) -> Result<u64> {
        self.get(name, Some(&default.to_string()))?
            .parse()
            .map_err(|e| format!("--{name}: {e}"))
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Worker {
    id: String,
    nodes: Vec<String>,
    manager: LockManager,
    key: String,
    fence_key: Option<String>,
    ttl: Duration,
    store: String,
    rng: Rng,
}

async fn build(args: &Args) -> Result<Worker> {
    let id = args.get("id", Some(&std::process::id().to_string()))?;
    let nodes: Vec<String> = args
        .get("nodes", None)?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let ttl = Duration::from_millis(args.num("ttl-ms", 10_000)?);
    let config = Config::default()
        .with_expiry(ttl)
        .with_retry_delay(Duration::from_millis(5))
        .with_retry_jitter(1.0);
    let mut connected: Vec<Arc<dyn RedisNode>> = Vec::new();
    for url in &nodes {
        let node = multiplexed_node(url)
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        connected.push(Arc::new(node));
    }
    let mode = args.get("mode", Some("single"))?;
    let manager = match mode.as_str() {
        "single" => {
            let node = connected
                .pop()
                .filter(|_| connected.is_empty())
                .ok_or("single mode takes exactly one node")?;
            LockManager::single(node, config)
        }
        "redlock" => LockManager::redlock_dyn(connected, config),
        other => return Err(format!("unknown mode {other:?}")),
    }
    .map_err(|e| e.to_string())?
    .with_spawner(|task| {
        tokio::spawn(task);
    });
    let fence_key = Some(args.get("fence-key", Some("chaos:fence"))?)
        .filter(|k| !k.is_empty() && mode == "single");
    let seed = args.num("seed", u64::from(std::process::id()))?;
    Ok(Worker {
        id,
        nodes,
        manager,
        key: args.get("key", Some("chaos:lock"))?,
        fence_key,
        ttl,
        store: args.get("store", Some("chaos:store"))?,
        rng: Rng::new(seed),
    })
}

impl Worker {
    fn lock(&self) -> redlease::Lock {
        let lock = self.manager.lock(&self.key).expiry(self.ttl);
        match &self.fence_key {
            Some(f) => lock.fenced(f),
            None => lock,
        }
    }

    async fn first_node(&self) -> Result<redis::aio::MultiplexedConnection> {
        let url = self.nodes.first().ok_or("no nodes")?;
        redis::Client::open(url.as_str())
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect {url}: {e}"))
    }
}

fn fence_text(lease: &Lease) -> String {
    lease
        .fencing_token()
        .map_or_else(|| "-".to_owned(), |f| f.to_string())
}

async fn contend(w: Worker, args: &Args) -> Result<()> {
    let rounds = args.num("rounds", 20)?;
    let tasks = args.num("tasks", 1)?;
    let counter = args.get("counter", Some("chaos:counter"))?;
    // The control experiment: the same read-modify-write without the lock.
    let unlocked = args.get("unlocked", Some("false"))? == "true";
    let mut handles = Vec::new();
    for task in 0..tasks {
        let id = if tasks == 1 {
            w.id.clone()
        } else {
            format!("{}.{task}", w.id)
        };
        let conn = w.first_node().await?;
        let lock = w.lock();
        let rng = Rng::new(w.rng.clone().next_u64() ^ task.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let counter = counter.clone();
        handles.push(tokio::spawn(contend_task(
            id, conn, lock, rng, counter, rounds, unlocked,
        )));
    }
    for handle in handles {
        handle
            .await
            .map_err(|e| format!("a contending task failed: {e}"))??;
    }
    say(&format!("DONE id={} rounds={rounds} tasks={tasks}", w.id));
    Ok(())
}

/// One acquirer: `rounds` locked read-modify-writes of the counter.
async fn contend_task(
    id: String,
    mut conn: redis::aio::MultiplexedConnection,
    lock: redlease::Lock,
    mut rng: Rng,
    counter: String,
    rounds: u64,
    unlocked: bool,
) -> Result<()> {
    for round in 0..rounds {
        let lease = if unlocked {
            None
        } else {
            let lease = lock
                .acquire_within(Duration::from_secs(60))
                .await
                .map_err(|e| format!("{id} round {round}: acquire: {e}"))?;
            Some(lease)
        };
        let start = wall_ns();
        // A deliberately non-atomic read-modify-write: without mutual exclusion, updates get lost.
        let read = get_counter(&mut conn, &counter)
            .await
            .map_err(|e| format!("GET: {e}"))?;
        tokio::time::sleep(rng.millis(0, 2)).await;
        let () = redis::cmd("SET")
            .arg(&counter)
            .arg(read + 1)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("SET: {e}"))?;
        let end = wall_ns();
        let held = lease.as_ref().is_none_or(Lease::is_held);
        let fence = lease.as_ref().map_or_else(|| "-".to_owned(), fence_text);
        say(&format!(
            "HOLD id={id} start={start} end={end} read={read} fence={fence} held={held}"
        ));
        if let Some(lease) = lease {
            match lease.release().await {
                Ok(_) => {}
                // No node answered in time (a loaded machine): the hold above has ended all the same, and
                // the key expires with its TTL, after which the next holder takes it. Not an error of the
                // lock; reported, and the round goes on.
                Err(e @ redlease::Error::Quorum(_)) => {
                    say(&format!("RELEASE_UNCONFIRMED id={id} round={round}: {e}"));
                }
                Err(e) => return Err(format!("{id} round {round}: release: {e}")),
            }
        }
        // Step back briefly, so that the lock changes hands between processes.
        tokio::time::sleep(rng.millis(0, 3)).await;
    }
    Ok(())
}

fn reason_text(reason: LossReason) -> &'static str {
    match reason {
        LossReason::Expired => "expired",
        LossReason::NotHeld => "not-held",
        LossReason::ExtendFailed => "extend-failed",
        LossReason::Released => "released",
        _ => "other",
    }
}

async fn pause_holder(
    w: Worker,
    stdin: &mut tokio::io::Lines<BufReader<tokio::io::Stdin>>,
) -> Result<()> {
    let store = w.store.clone();
    let mut conn = w.first_node().await?;
    let lock = w.lock().auto_renew(w.ttl / 3);
    let lease = lock.acquire().await.map_err(|e| format!("acquire: {e}"))?;
    let fence = lease.fencing_token().ok_or("the lock is not fenced")?;
    say(&format!("ACQUIRED id={} fence={fence}", w.id));
    // Watch the loss signal from a task of its own, as a holder's supervisor would.
    let (tx, mut fired) = oneshot::channel::<(LossReason, Instant)>();
    let signal = lease.lost();
    tokio::spawn(async move {
        let reason = signal.await;
        let _ = tx.send((reason, Instant::now()));
    });
    let write = fenced_write(&mut conn, &store, fence, &format!("{}-first", w.id))
        .await
        .map_err(|e| format!("fenced write: {e}"))?;
    say(&format!(
        "WRITE id={} fence={fence} accepted={} stored={}",
        w.id, write.accepted, write.stored
    ));
    say("PAUSE_ME");
    // The test stops this process here for longer than the TTL, lets another process take the lock, resumes
    // this one and then sends the line.
    let _ = stdin.next_line().await;
    match fired.try_recv() {
        Ok((reason, at)) => {
            let deadline = lease.valid_until();
            let after = at.saturating_duration_since(deadline).as_millis();
            let before = deadline.saturating_duration_since(at).as_millis();
            say(&format!(
                "SIGNAL fired=true reason={} after_deadline_ms={after} before_deadline_ms={before}",
                reason_text(reason)
            ));
        }
        Err(_) => say("SIGNAL fired=false"),
    }
    say(&format!("STATE held={}", lease.is_held()));
    // The write a paused holder makes when it resumes in the middle of its work, with its old token.
    let late = fenced_write(&mut conn, &store, fence, &format!("{}-late", w.id))
        .await
        .map_err(|e| format!("late fenced write: {e}"))?;
    say(&format!(
        "LATE_WRITE id={} fence={fence} accepted={} stored={}",
        w.id, late.accepted, late.stored
    ));
    let released = lease.release().await;
    say(&format!("RELEASE ok={}", released.is_ok()));
    Ok(())
}

async fn fenced_writer(w: Worker) -> Result<()> {
    let store = w.store.clone();
    let mut conn = w.first_node().await?;
    let lease = w
        .lock()
        .acquire_within(Duration::from_secs(30))
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    let fence = lease.fencing_token().ok_or("the lock is not fenced")?;
    say(&format!(
        "ACQUIRED id={} fence={fence} at={}",
        w.id,
        wall_ns()
    ));
    let write = fenced_write(&mut conn, &store, fence, &w.id)
        .await
        .map_err(|e| format!("fenced write: {e}"))?;
    say(&format!(
        "WRITE id={} fence={fence} accepted={} stored={}",
        w.id, write.accepted, write.stored
    ));
    lease.release().await.map_err(|e| format!("release: {e}"))?;
    say(&format!("DONE id={}", w.id));
    Ok(())
}

async fn run() -> Result<()> {
    let args = Args::parse()?;
    let role = args.get("role", Some("contend"))?;
    let worker = build(&args).await?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    say("READY");
    stdin
        .next_line()
        .await
        .map_err(|e| format!("stdin: {e}"))?
        .ok_or("stdin closed before the start signal")?;
    match role.as_str() {
        "contend" => contend(worker, &args).await,
        "pause-holder" => pause_holder(worker, &mut stdin).await,
        "fenced-writer" => fenced_writer(worker).await,
        other => Err(format!("unknown role {other:?}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        say(&format!("ERROR {e}"));
        std::process::exit(1);
    }
}
