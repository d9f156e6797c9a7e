//! Scenarios of issue 25's primitives, redlease over redis-rs on one server (the first of the run's servers):
//!
//! - `SEM`: a semaphore permit's cycle (`try_acquire` + `release`, sequential), beside the plain lock's pair;
//! - `RW`: a read share's and the write share's cycle (sequential, nobody else holding);
//! - `FAIR`: 8 tasks contend for one key, holding it 1 ms each time, as S5 does — a fair lock (server-side
//!   queue, woken by the release's notification) against the plain lock's push handoff: handoffs per second
//!   and the gap from a release returning to the next acquisition returning.
//!
//! Each (scenario, variant) runs on a fresh two-worker tokio runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Config, Lease, LockManager};
use redlease_adapters::redis::MultiplexedNode;
use redlease_adapters::runtime::TokioSpawner;

use crate::clients::{Res, ctx};
use crate::measure::Samples;
use crate::report::Row;
use crate::scenarios::{Env, Plan};

/// A TTL far longer than any run, so nothing renews or expires; a 5 ms retry delay, as S5.
fn config() -> Config {
    Config::default()
        .with_expiry(Duration::from_secs(10))
        .with_operation_timeout(Duration::from_millis(500))
        .with_retry_delay(Duration::from_millis(5))
}

/// Runs `f` on a fresh two-worker tokio runtime.
fn on_runtime<T, Fut: std::future::Future<Output = Res<T>>>(f: impl FnOnce() -> Fut) -> Res<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ctx("tokio runtime"))?;
    let out = rt.block_on(f());
    rt.shutdown_background();
    out
}

/// A single-node manager over redis-rs at the run's first server, with a tokio spawner.
async fn manager(env: &Env) -> Res<LockManager> {
    let url = env.servers.urls().into_iter().next().ok_or("no server")?;
    let client = redis::Client::open(url.as_str()).map_err(ctx("redis: open"))?;
    let node = MultiplexedNode::connect(&client)
        .await
        .map_err(ctx("redis: connect"))?;
    let spawner = TokioSpawner::current().map_err(ctx("tokio spawner"))?;
    Ok(LockManager::single(node, config())
        .map_err(ctx("redlease: manager"))?
        .with_spawner(spawner))
}

/// What one cycle acquires.
#[derive(Clone, Copy)]
enum Cycle {
    Plain,
    Permit,
    Read,
    Write,
}

/// `iters` sequential acquire + release cycles of `what` (after `warmup` more): their latencies and rate.
fn cycles_of(env: &Env, plan: &Plan, what: Cycle) -> Res<(Samples, f64)> {
    on_runtime(|| async {
        let manager = manager(env).await?;
        let key = "bench:primitives:cycle";
        let lock = match what {
            Cycle::Plain => manager.lock(key),
            Cycle::Read => manager.rw_lock(key).read().clone(),
            Cycle::Write => manager.rw_lock(key).write().clone(),
            Cycle::Permit => manager.lock(key),
        };
        let semaphore = manager
            .semaphore(format!("{key}:sem"), 5)
            .map_err(ctx("semaphore"))?;
        let mut samples = Samples::with_capacity(plan.s1_iters);
        let mut spent = Duration::ZERO;
        for i in 0..plan.warmup + plan.s1_iters {
            let start = Instant::now();
            let lease = match what {
                Cycle::Permit => semaphore.try_acquire().await,
                _ => lock.try_acquire().await,
            }
            .map_err(ctx("acquire"))?;
            lease.release().await.map_err(ctx("release"))?;
            if i >= plan.warmup {
                let took = start.elapsed();
                samples.push(took);
                spent += took;
            }
        }
        let rate = plan.s1_iters as f64 / spent.as_secs_f64().max(f64::MIN_POSITIVE);
        Ok((samples, rate))
    })
}

/// `SEM` and `RW` rows: the plain lock's pair for reference, a permit's, a read share's and the write share's.
pub(crate) fn cycles(env: &Env, plan: &Plan) -> Vec<Row> {
    let variants = [
        ("SEM", "redlease/redis plain lock", Cycle::Plain),
        ("SEM", "redlease/redis permit", Cycle::Permit),
        ("RW", "redlease/redis read", Cycle::Read),
        ("RW", "redlease/redis write", Cycle::Write),
    ];
    variants
        .into_iter()
        .map(|(scenario, imp, what)| {
            let mut row = Row::new(scenario, imp, Some(1));
            match cycles_of(env, plan, what) {
                Ok((mut samples, rate)) => {
                    row.p50_us = samples.quantile_us(0.5);
                    row.p99_us = samples.quantile_us(0.99);
                    row.dist_us = samples.dist_us();
                    row.ops_per_s = Some(rate);
                    row.note = format!(
                        "{} sequential try_acquire + release cycles on one connection (after {} warm-up); \
                         p50/p99 per cycle; ops/s = cycles per second of cycle time",
                        samples.len(),
                        plan.warmup
                    );
                }
                Err(e) => row.note = format!("failed: {e}"),
            }
            row
        })
        .collect()
}

/// Tasks contending in `FAIR`, and their critical section (as S5).
const FAIR_TASKS: usize = 8;
const FAIR_CRITICAL: Duration = Duration::from_millis(1);

/// `FAIR` rows: the fair lock's handoffs against the plain lock's push handoff.
pub(crate) fn fair(env: &Env, plan: &Plan) -> Vec<Row> {
    [("redlease/redis fair", true), ("redlease/redis plain", false)]
        .into_iter()
        .map(|(imp, fair)| {
            let mut row = Row::new("FAIR", imp, Some(1));
            match handoffs(env, plan, fair) {
                Ok((n, elapsed, mut gaps, in_order, switches)) => {
                    row.ops_per_s = Some(n as f64 / elapsed.as_secs_f64());
                    row.p50_us = gaps.quantile_us(0.5);
                    row.p99_us = gaps.quantile_us(0.99);
                    row.dist_us = gaps.dist_us();
                    row.note = format!(
                        "{n} handoffs among {FAIR_TASKS} tasks holding 1 ms each in {:.2} s; p50/p99 = gap from a \
                         release returning to the next acquisition returning; {:.1} % to another task than the \
                         releaser; {:.1} % of handoffs to the waiter that had waited longest (by when its \
                         acquire_within began)",
                        elapsed.as_secs_f64(),
                        100.0 * switches as f64 / n.saturating_sub(1).max(1) as f64,
                        100.0 * in_order as f64 / n.saturating_sub(1).max(1) as f64,
                    );
                }
                Err(e) => row.note = format!("failed: {e}"),
            }
            row
        })
        .collect()
}

/// One acquisition's record: sequence number, when its wait began, when it returned, which task.
type Won = (u64, Instant, Instant, usize);

/// 8 tasks contend for `plan.s5_time`: handoffs, elapsed, gaps, handoffs to the longest waiter, handoffs to
/// another task.
fn handoffs(env: &Env, plan: &Plan, fair: bool) -> Res<(usize, Duration, Samples, usize, usize)> {
    on_runtime(|| async {
        let manager = manager(env).await?;
        let key = if fair {
            "bench:primitives:fair"
        } else {
            "bench:primitives:plain"
        };
        let lock = if fair {
            manager.lock(key).fair()
        } else {
            manager.lock(key)
        };
        // Warm up the connection, the scripts and the subscription.
        for _ in 0..plan.warmup.min(100) {
            let lease = lock.try_acquire().await.map_err(ctx("warm-up"))?;
            lease.release().await.map_err(ctx("warm-up release"))?;
        }
        let seq = Arc::new(AtomicU64::new(0));
        let won: Arc<Mutex<Vec<Won>>> = Arc::default();
        let released: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let end = Instant::now() + plan.s5_time;
        let t0 = Instant::now();
        let mut tasks = Vec::with_capacity(FAIR_TASKS);
        for task in 0..FAIR_TASKS {
            let (lock, seq, won, released) = (
                lock.clone(),
                Arc::clone(&seq),
                Arc::clone(&won),
                Arc::clone(&released),
            );
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let began = Instant::now();
                    let lease: Lease = match lock.acquire_within(Duration::from_secs(2)).await {
                        Ok(lease) => lease,
                        Err(e) if e.is_contended() => continue,
                        Err(e) => return Err(format!("acquire: {e}")),
                    };
                    let at = Instant::now();
                    let n = seq.fetch_add(1, Ordering::SeqCst);
                    won.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((n, began, at, task));
                    tokio::time::sleep(FAIR_CRITICAL).await;
                    lease.release().await.map_err(|e| format!("release: {e}"))?;
                    released
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((n, Instant::now()));
                }
                Ok::<_, String>(())
            }));
        }
        for task in tasks {
            task.await.map_err(ctx("FAIR task"))??;
        }
        let elapsed = t0.elapsed();
        let mut won = std::mem::take(&mut *won.lock().unwrap_or_else(|p| p.into_inner()));
        let mut released = std::mem::take(&mut *released.lock().unwrap_or_else(|p| p.into_inner()));
        won.sort_unstable_by_key(|w| w.0);
        released.sort_unstable_by_key(|r| r.0);
        let mut gaps = Samples::with_capacity(won.len());
        let mut in_order = 0;
        for (i, (r, next)) in released.iter().zip(won.iter().skip(1)).enumerate() {
            gaps.push(next.2.saturating_duration_since(r.1));
            // Among the acquisitions waiting when the lock was released (began before the release and won
            // after it), did the one that began first win?
            let waiting = won[i + 1..]
                .iter()
                .filter(|w| w.1 <= r.1)
                .map(|w| w.1)
                .min();
            if waiting.is_none_or(|first| next.1 <= first) {
                in_order += 1;
            }
        }
        let switches = won.windows(2).filter(|w| w[0].3 != w[1].3).count();
        Ok((won.len(), elapsed, gaps, in_order, switches))
    })
}
