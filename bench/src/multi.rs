//! Scenario SM: `LockManager::lock_all` of 2 and 8 keys against the same number of single locks taken in
//! order — acquire + release cycles per second, one after the other, on one real redis-server.
//!
//! Both sides take the same keys (sorted, as `lock_all` takes them) with the same manager: the single locks
//! are acquired one after another and released one after another (what a user writes by hand without
//! `lock_all`), `lock_all` takes the whole set in one script call (`RedisNode::multi_key`) and releases it in
//! another. The note gives the server commands per cycle (`INFO stats`, script-inner commands included) and
//! the node calls per cycle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::{
    Claim, ClaimRequest, Config, LockManager, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    RedisNode, Token, Ttl,
};
use redlease_adapters::redis::MultiplexedNode;

use crate::clients::{Res, ctx};
use crate::measure::Samples;
use crate::report::Row;
use crate::scenarios::{Env, Plan};

/// Node calls made by SM's node.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Counts the lock calls made on a node (each one request to the server).
struct Calls<N>(N);

#[redlease::async_trait]
impl<N: RedisNode> redlease::NodeWrapper for Calls<N> {
    type Inner = N;

    fn inner(&self) -> &N {
        &self.0
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.claim(req).await
    }

    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.acquire(key, token, ttl).await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.release(key, token).await
    }

    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        CALLS.fetch_add(1, Ordering::Relaxed);
        self.0.multi_key(items, op).await
    }
}

/// The set sizes measured.
const SIZES: [usize; 2] = [2, 8];

/// What one row measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// `lock_all(keys)`, then `MultiLease::release`.
    LockAll,
    /// `lock(k).try_acquire()` for each key in order, then `release` for each.
    InOrder,
}

impl Way {
    fn name(self, size: usize) -> &'static str {
        match (self, size) {
            (Way::LockAll, 2) => "redlease/redis lock_all×2",
            (Way::InOrder, 2) => "redlease/redis 2 locks",
            (Way::LockAll, _) => "redlease/redis lock_all×8",
            (Way::InOrder, _) => "redlease/redis 8 locks",
        }
    }
}

/// One cycle: every key acquired, then every key released.
async fn cycle(manager: &LockManager, keys: &[String], way: Way) -> Res<()> {
    match way {
        Way::LockAll => {
            let all = manager
                .lock_all(keys.iter().map(String::as_str))
                .try_acquire()
                .await
                .map_err(ctx("lock_all"))?;
            all.release().await.map_err(ctx("lock_all release"))
        }
        Way::InOrder => {
            let mut held = Vec::with_capacity(keys.len());
            for key in keys {
                held.push(
                    manager
                        .lock(key.as_str())
                        .try_acquire()
                        .await
                        .map_err(ctx("try_acquire"))?,
                );
            }
            for lease in held {
                lease.release().await.map_err(ctx("release"))?;
            }
            Ok(())
        }
    }
}

/// Commands the server has executed so far (`INFO stats`; a script's inner commands count too).
fn commands(env: &Env) -> Res<u64> {
    let info = env.servers[0]
        .try_cmd(&["INFO", "stats"])
        .map_err(ctx("INFO stats"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO stats: no total_commands_processed".to_owned())
}

/// The SM rows: for 2 and 8 keys, `lock_all` and the single locks in order, alternating in `plan.rounds`
/// rounds (a slow phase of the machine is shared by both), each round measuring for a share of
/// `plan.s3_time`.
pub(crate) fn lock_all(env: &Env, plan: &Plan) -> Vec<Row> {
    let mut rows = Vec::new();
    for size in SIZES {
        let mut measured = measure(env, plan, size);
        for way in [Way::LockAll, Way::InOrder] {
            let mut row = Row::new("SM", way.name(size), Some(1));
            match &mut measured {
                Ok(results) => {
                    let Some((_, samples, time, cycles, cmds, calls)) =
                        results.iter_mut().find(|(w, ..)| *w == way)
                    else {
                        continue;
                    };
                    let (time, cycles, cmds, calls) = (*time, *cycles, *cmds, *calls);
                    row.ops_per_s = Some(cycles as f64 / time.as_secs_f64());
                    row.p50_us = samples.quantile_us(0.5);
                    row.p99_us = samples.quantile_us(0.99);
                    row.cmds_per_op = Some(cmds as f64 / cycles.max(1) as f64);
                    row.calls_per_op = Some(calls as f64 / cycles.max(1) as f64);
                    row.note = format!(
                        "{size} keys acquired and released per cycle, sequentially, one redis-rs connection: \
                         {cycles} cycles in {:.2} s; {:.1} server commands and {:.1} node calls per cycle",
                        time.as_secs_f64(),
                        cmds as f64 / cycles.max(1) as f64,
                        calls as f64 / cycles.max(1) as f64,
                    );
                }
                Err(e) => row.note = format!("failed: {e}"),
            }
            rows.push(row);
        }
    }
    rows
}

/// Per way: its samples, measuring time, cycles, server commands and node calls.
type Measured = Vec<(Way, Samples, Duration, u64, u64, u64)>;

fn measure(env: &Env, plan: &Plan, size: usize) -> Res<Measured> {
    let url = env.servers[0].url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ctx("tokio runtime"))?;
    let out = rt.block_on(async {
        let client = redis::Client::open(url.as_str()).map_err(ctx("redis: open"))?;
        let node = Calls(
            MultiplexedNode::connect(&client)
                .await
                .map_err(ctx("redis: connect"))?,
        );
        let config = Config::default()
            .with_expiry(Duration::from_secs(10))
            .with_operation_timeout(Duration::from_millis(500))
            .with_attempts(1);
        let manager = LockManager::single(node, config).map_err(ctx("redlease: manager"))?;
        let keys: Vec<String> = (0..size).map(|i| format!("bench:SM:{size}:{i}")).collect();
        let mut out: Measured = [Way::LockAll, Way::InOrder]
            .into_iter()
            .map(|w| (w, Samples::with_capacity(1024), Duration::ZERO, 0, 0, 0))
            .collect();
        for _ in 0..plan.warmup / size.max(1) {
            for (way, ..) in &out {
                cycle(&manager, &keys, *way).await?;
            }
        }
        let share = plan.s3_time / plan.rounds.max(1) as u32;
        for round in 0..plan.rounds {
            for i in 0..out.len() {
                // Rotate the order each round.
                let (way, samples, time, cycles, cmds, calls) = &mut out[(i + round) % 2];
                let (c0, n0) = (commands(env)?, CALLS.load(Ordering::SeqCst));
                let t0 = Instant::now();
                while t0.elapsed() < share {
                    let t = Instant::now();
                    cycle(&manager, &keys, *way).await?;
                    samples.push(t.elapsed());
                    *cycles += 1;
                }
                *time += t0.elapsed();
                // The INFO itself is one command.
                *cmds += commands(env)?.saturating_sub(c0 + 1);
                *calls += CALLS.load(Ordering::SeqCst) - n0;
            }
        }
        Ok::<_, String>(out)
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    out
}
