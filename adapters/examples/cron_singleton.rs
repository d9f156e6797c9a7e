//! A scheduled job that runs on exactly one instance per tick.
//!
//! Three instances (tokio tasks here, each with its own Redis connection, standing in for three processes)
//! wake up at every tick of a schedule. Each tries once to take the job's lease; the winner runs the job
//! inside [`Lease::run`](redlease::Lease::run), which renews the lease while the job runs (the job takes
//! longer than the lease's TTL), records the tick as done, and releases. The others skip the tick. An
//! instance that acquires after the winner released sees the tick recorded as done and skips it too.
//!
//! ```sh
//! cargo run -p redlease-adapters --features redis,tokio --example cron_singleton
//! REDIS_URL=redis://127.0.0.1:7001 cargo run -p redlease-adapters --features redis,tokio --example cron_singleton
//! ```
//!
//! Without `REDIS_URL` (or `REDLEASE_NODES` with one URL) it starts a temporary `redis-server`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlease::{Config, Lease, LockManager};
use redlease_adapters::redis::redis;

#[path = "common/mod.rs"]
mod common;
use common::BoxError;

const INSTANCES: usize = 3;
const TICKS: u64 = 2;
const JOB_KEY: &str = "cron:{nightly-report}:lock";
/// Prefix of the per-tick "done" markers.
const DONE_PREFIX: &str = "cron:{nightly-report}:done";
const TTL: Duration = Duration::from_millis(400);
const RENEW_EVERY: Duration = Duration::from_millis(120);
/// The job takes 2.5 times the TTL: without renewal the lease would lapse halfway.
const JOB_STEP: Duration = Duration::from_millis(250);
const JOB_STEPS: u32 = 4;
const TICK_EVERY: Duration = Duration::from_millis(1_300);

/// What happened at one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TickOutcome {
    pub(crate) tick: u64,
    /// The instances that ran the job (exactly one when all is well).
    pub(crate) ran_on: Vec<usize>,
    /// The instances that skipped it (lease held elsewhere, or tick already done).
    pub(crate) skipped: usize,
}

/// Runs `TICKS` ticks of the schedule against the Redis at `url`; fails if a tick ran other than once or the
/// lease lapsed while the job ran.
pub(crate) async fn run(url: &str) -> Result<Vec<TickOutcome>, BoxError> {
    let outcomes: Arc<Mutex<Vec<TickOutcome>>> = Arc::new(Mutex::new(
        (1..=TICKS)
            .map(|tick| TickOutcome {
                tick,
                ran_on: Vec::new(),
                skipped: 0,
            })
            .collect(),
    ));
    let start = Instant::now();
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let mut instances = Vec::new();
    for instance in 1..=INSTANCES {
        // Each instance has its own connections, like a separate process would.
        let manager = LockManager::single(
            common::node(url).await?,
            Config::default().with_expiry(TTL).with_attempts(1),
        )?;
        let mut conn = common::connection(url).await?;
        let outcomes = Arc::clone(&outcomes);
        instances.push(tokio::spawn(async move {
            let lock = manager.lock(JOB_KEY).renew_every(RENEW_EVERY);
            for tick in 1..=TICKS {
                tokio::time::sleep_until((start + TICK_EVERY * (tick as u32 - 1)).into()).await;
                // Every instance names a tick the same way: by the schedule's slot (here: this run's start time
                // and the tick number; a real schedule would use the wall-clock slot).
                let slot = format!("{run_id}:{tick}");
                let ran: bool = match lock.try_acquire().await {
                    Ok(lease) => {
                        let ran = run_once(instance, tick, &slot, &lease, &mut conn, start).await;
                        // Release at the end, whatever happened; report a lease lost meanwhile.
                        let released = lease.release().await;
                        let ran = ran?;
                        released?;
                        ran
                    }
                    Err(e) if e.is_contended() => {
                        println!("tick {tick}: instance {instance} skips: another instance holds the job's lease");
                        false
                    }
                    Err(e) => return Err(e.into()),
                };
                let mut outcomes = outcomes.lock().map_err(|_| "poisoned")?;
                let outcome = &mut outcomes[tick as usize - 1];
                if ran {
                    outcome.ran_on.push(instance);
                } else {
                    outcome.skipped += 1;
                }
            }
            Ok::<(), BoxError>(())
        }));
    }
    for instance in instances {
        instance.await??;
    }
    let outcomes = outcomes.lock().map_err(|_| "poisoned")?.clone();
    for o in &outcomes {
        println!(
            "tick {}: ran on instance(s) {:?}, skipped by {}",
            o.tick, o.ran_on, o.skipped
        );
        if o.ran_on.len() != 1 {
            return Err(format!("tick {} ran {} times", o.tick, o.ran_on.len()).into());
        }
    }
    Ok(outcomes)
}

/// Holding the lease: skip if the tick is already done, else run the job under `Lease::run` and mark the tick
/// done. Returns whether the job ran here.
async fn run_once(
    instance: usize,
    tick: u64,
    slot: &str,
    lease: &Lease,
    conn: &mut redis::aio::MultiplexedConnection,
    start: Instant,
) -> Result<bool, BoxError> {
    let done_key = format!("{DONE_PREFIX}:{slot}");
    let done: bool = redis::cmd("EXISTS")
        .arg(&done_key)
        .query_async(&mut *conn)
        .await?;
    if done {
        println!(
            "tick {tick}: instance {instance} got the lease but the tick is already done; skips"
        );
        return Ok(false);
    }
    println!(
        "tick {tick}: instance {instance} runs the job ({:.2}s after start; lease TTL {TTL:?}, renewed every {RENEW_EVERY:?})",
        start.elapsed().as_secs_f64()
    );
    let first_deadline = lease.valid_until();
    let job_started = Instant::now();
    // The job. `run` renews the lease meanwhile and drops the job if the lease is lost.
    lease
        .run(async {
            for step in 1..=JOB_STEPS {
                tokio::time::sleep(JOB_STEP).await;
                println!(
                    "tick {tick}: instance {instance} job step {step}/{JOB_STEPS}; lease valid for another {} ms",
                    lease.remaining().as_millis()
                );
            }
        })
        .await?;
    let took = job_started.elapsed();
    if !lease.is_held() || lease.valid_until() <= first_deadline {
        return Err(format!("tick {tick}: the lease was not renewed while the job ran").into());
    }
    println!(
        "tick {tick}: instance {instance} finished after {} ms, {:.1}× the TTL; renewals moved the lease's \
         deadline {} ms later",
        took.as_millis(),
        took.as_secs_f64() / TTL.as_secs_f64(),
        (lease.valid_until() - first_deadline).as_millis()
    );
    let _: () = redis::cmd("SET")
        .arg(&done_key)
        .arg(instance)
        .arg("EX")
        .arg(3600)
        .query_async(&mut *conn)
        .await?;
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let servers = common::servers(1)?;
    run(&servers.urls[0]).await?;
    Ok(())
}
