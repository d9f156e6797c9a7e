//! Scenarios S1–S7. Each (scenario, implementation) runs on a fresh two-worker tokio runtime, so a peer's
//! leftover tasks (hung requests, renewal loops) cannot disturb the next measurement.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redlease::{Config, LockManager};
use redlease_testkit::MemoryNode;
use redlease_testkit::proxy::{FaultProxy, ProxyMode};
use redlease_testkit::server::{RedisServer, RedisServers};

use crate::clients::{self, Client, Held, Impl, Res, Setup, ctx};
use crate::measure::{self, CpuClock, Samples};
use crate::report::Row;

/// Sizes and durations of one run (`--quick` or full).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Warm-up iterations before latency measurements (connections, script caches).
    pub(crate) warmup: usize,
    /// S1 measured acquire + release pairs.
    pub(crate) s1_iters: usize,
    /// S2 measured pairs per node count.
    pub(crate) s2_iters: usize,
    /// S3 measuring time.
    pub(crate) s3_time: Duration,
    /// S4 most acquisitions measured.
    pub(crate) s4_iters: usize,
    /// S4 time budget per implementation (slow peers stop early; the note gives the sample count).
    pub(crate) s4_budget: Duration,
    /// S5 measuring time.
    pub(crate) s5_time: Duration,
    /// S8 window in which the waiting load is measured.
    pub(crate) s8_window: Duration,
    /// S6 held leases.
    pub(crate) s6_leases: usize,
    /// S6 CPU measuring window.
    pub(crate) s6_window: Duration,
    /// S6L held leases.
    pub(crate) s6l_leases: usize,
    /// S6L measuring window.
    pub(crate) s6l_window: Duration,
    /// S7 measured acquire + release pairs.
    pub(crate) s7_iters: usize,
    /// S1/S2 rounds over all implementations.
    pub(crate) rounds: usize,
}

impl Plan {
    /// The full run (`just bench`).
    pub(crate) const FULL: Plan = Plan {
        warmup: 1000,
        s1_iters: 20_000,
        s2_iters: 5_000,
        s3_time: Duration::from_secs(5),
        s4_iters: 2_000,
        s4_budget: Duration::from_secs(10),
        s5_time: Duration::from_secs(5),
        s8_window: Duration::from_secs(4),
        s6_leases: 10_000,
        s6_window: Duration::from_secs(6),
        s6l_leases: 100_000,
        s6l_window: Duration::from_secs(4),
        s7_iters: 20_000,
        rounds: 10,
    };

    /// The short run (`just bench-quick`, about three minutes with S6L's 100,000 leases).
    pub(crate) const QUICK: Plan = Plan {
        warmup: 200,
        s1_iters: 2_000,
        s2_iters: 1_000,
        s3_time: Duration::from_millis(1500),
        s4_iters: 300,
        s4_budget: Duration::from_secs(3),
        s5_time: Duration::from_secs(2),
        s8_window: Duration::from_secs(2),
        s6_leases: 10_000,
        // Longer than rslock's renewal cadence (~2.5 s), so its leases renew inside the window.
        s6_window: Duration::from_secs(3),
        s6l_leases: 100_000,
        s6l_window: Duration::from_millis(3500),
        s7_iters: 5_000,
        rounds: 3,
    };
}

/// Settings for latency and throughput scenarios: a TTL far longer than any run, so nothing renews or expires.
const STEADY: Setup = Setup {
    ttl: Duration::from_secs(10),
    op_timeout: Duration::from_millis(500),
    retry_delay: Duration::from_millis(5),
    renew_every: Duration::from_secs(3),
};

/// S4's operation timeout: the bound on one round of calls, and on the hung node's share of it.
pub(crate) const S4_OP_TIMEOUT: Duration = Duration::from_millis(100);
/// How long one S4 acquisition may take before the implementation is reported as hanging.
pub(crate) const HANG_BOUND: Duration = Duration::from_secs(2);
/// redis-rs 1.x's default response timeout, the only bound rslock has on a silent node.
const REDIS_RS_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// S6 settings: leases of 3 s renewed every second.
const RENEWING: Setup = Setup {
    ttl: Duration::from_secs(3),
    op_timeout: Duration::from_millis(500),
    retry_delay: Duration::from_millis(5),
    renew_every: Duration::from_secs(1),
};

/// S6L settings: leases of 9 s renewed every 3 s. 100,000 leases renewed every second would be 100,000
/// renewals a second, more than two shared cores carry for any client (the raw floor managed 42 % of them
/// in a run at load average 8, and acquisitions timed out meanwhile); every 3 s it is 33,000 a second.
const RENEWING_LARGE: Setup = Setup {
    ttl: Duration::from_secs(9),
    op_timeout: Duration::from_millis(500),
    retry_delay: Duration::from_millis(5),
    renew_every: Duration::from_secs(3),
};

/// Concurrent tasks in S3.
const S3_TASKS: usize = 64;
/// Contending tasks in S5.
const S5_TASKS: usize = 8;
/// S5's critical section.
const S5_CRITICAL: Duration = Duration::from_millis(1);

/// Runs `f` on a fresh two-worker tokio runtime and shuts it down without waiting for stragglers.
pub(crate) fn on_runtime<T, F, Fut>(f: F) -> Res<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Res<T>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ctx("tokio runtime"))?;
    let out = rt.block_on(f());
    rt.shutdown_timeout(Duration::from_millis(200));
    out
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The Redis servers of a run: five independent ones on free loopback ports, and servers of their own for
/// the implementations that run elsewhere (`--valkey`: one Valkey 9.1 server per variant, so that its
/// `INFO commandstats` counts that variant's commands alone).
pub(crate) struct Env {
    /// The servers (S1, S3, S5, S6 use the first; S2 the first three or all five; S4 the first three).
    pub(crate) servers: RedisServers,
    /// Implementations with a single server of their own.
    pub(crate) own: Vec<(Impl, RedisServer)>,
    /// `--replication`: a primary and its replica, shared by [`Impl::REPLICATION`].
    pub(crate) replicated: Option<(RedisServer, RedisServer)>,
}

impl Env {
    fn urls(&self, n: usize) -> Vec<String> {
        self.servers.urls().into_iter().take(n).collect()
    }

    fn own(&self, imp: Impl) -> Option<&RedisServer> {
        self.own.iter().find(|(i, _)| *i == imp).map(|(_, s)| s)
    }

    /// The URLs `imp` uses: its own server (or the replicated primary), or the first `n` shared ones.
    pub(crate) fn urls_for(&self, imp: Impl, n: usize) -> Vec<String> {
        if let Some((primary, _)) = self.replicated.as_ref().filter(|_| imp.replicated()) {
            return vec![primary.url()];
        }
        self.own(imp)
            .map_or_else(|| self.urls(n), |s| vec![s.url()])
    }

    /// The single server `imp` uses.
    fn server_for(&self, imp: Impl) -> &RedisServer {
        self.own(imp).unwrap_or(&self.servers[0])
    }
}

/// The lock commands whose server-side cost a row reports (scripts count their inner commands in their own
/// time; `exec` covers a Lua-less transaction).
const LOCK_COMMANDS: [&str; 5] = ["set", "delifeq", "evalsha", "eval", "exec"];

/// Starts counting `imp`'s commands on its own server (`CONFIG RESETSTAT`); nothing for shared servers, whose
/// counters mix implementations.
fn reset_own_stats(env: &Env, imp: Impl) -> Res<()> {
    if let Some(server) = env.own(imp) {
        server.try_cmd(&["CONFIG", "RESETSTAT"])?;
    }
    Ok(())
}

/// `INFO commandstats` of `imp`'s own server, if it has one.
fn own_stats(env: &Env, imp: Impl) -> Option<Res<String>> {
    env.own(imp)
        .map(|server| server.try_cmd(&["INFO", "commandstats"]))
}

/// What `imp`'s own server spent on the lock commands since [`reset_own_stats`]: the server's name, each
/// command's calls and `usec_per_call`, and the `usec` per operation for `ops` operations, from `info` (read
/// now when `None`). `EVAL` is listed but left out of the time per operation: it is each connection's
/// capability check and a script's first use, once per connection, not the steady state (`EVALSHA`).
fn record_own_stats(env: &Env, imp: Impl, row: &mut Row, ops: u64, info: Option<Res<String>>) {
    let Some(server) = env.own(imp) else { return };
    let Some(Ok(info)) = info.or_else(|| own_stats(env, imp)) else {
        row.note.push_str("; INFO commandstats failed");
        return;
    };
    row.server = Some(server.flavor().name());
    let mut total_usec = 0.0;
    for command in LOCK_COMMANDS {
        let Some(line) = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        else {
            continue;
        };
        let field = |name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        if let (Some(calls), Some(usec), Some(per_call)) =
            (field("calls"), field("usec"), field("usec_per_call"))
            && calls > 0.0
        {
            if command != "eval" {
                total_usec += usec;
            }
            row.server_commands.push((command, calls as u64, per_call));
        }
    }
    if ops > 0 {
        row.server_us_per_op = Some(total_usec / ops as f64);
    }
}

/// Acquire + release pairs, one after the other, on one key: the latency of the pair.
async fn pairs(client: &Client, key: &str, warmup: usize, iters: usize) -> Res<Samples> {
    let mut samples = Samples::with_capacity(iters);
    for i in 0..warmup + iters {
        let t = Instant::now();
        let held = client
            .try_acquire(key)
            .await?
            .ok_or_else(|| format!("{key} unexpectedly held"))?;
        client.release(held).await?;
        if i >= warmup {
            samples.push(t.elapsed());
        }
    }
    Ok(samples)
}

/// S1 (`nodes == 1`) and S2: uncontended acquire + release latency, for every implementation in `impls`.
///
/// The pairs are measured in `plan.rounds` rounds that visit the implementations in rotating order, so a
/// slow phase of the machine (another process, frequency changes) is shared by all of them rather than
/// landing on one.
pub(crate) fn latency(env: &Env, plan: &Plan, impls: &[Impl], nodes: usize) -> Vec<Row> {
    let scenario = if nodes == 1 { "S1" } else { "S2" };
    let total = if nodes == 1 {
        plan.s1_iters
    } else {
        plan.s2_iters
    };
    let per_round = total.div_ceil(plan.rounds);
    for &imp in impls {
        if let Err(e) = reset_own_stats(env, imp) {
            eprintln!("CONFIG RESETSTAT for {}: {e}", imp.name());
        }
    }
    let mut results: Vec<(Impl, Result<Samples, String>)> = impls
        .iter()
        .map(|&imp| (imp, Ok(Samples::with_capacity(per_round * plan.rounds))))
        .collect();
    for round in 0..plan.rounds {
        let len = results.len();
        for k in 0..len {
            let (imp, acc) = &mut results[(k + round) % len];
            let imp = *imp;
            if !imp.networked() || (nodes > 1 && !imp.redlock()) {
                continue;
            }
            let Ok(samples) = acc else { continue };
            let key = format!("bench:{scenario}:{nodes}:{}", imp.name());
            let warmup = if round == 0 {
                plan.warmup
            } else {
                plan.warmup / 10
            };
            let urls = env.urls_for(imp, nodes);
            match on_runtime(|| async {
                let client = Client::connect(imp, &urls, STEADY).await?;
                pairs(&client, &key, warmup, per_round).await
            }) {
                Ok(s) => samples.merge(s),
                Err(e) => *acc = Err(e),
            }
        }
    }
    results
        .into_iter()
        .map(|(imp, result)| {
            let mut row = Row::new(scenario, imp.name(), Some(nodes as u32));
            if !imp.networked() {
                row.note = "not measured: the in-memory node is for S6 (memory) and S7".into();
            } else if nodes > 1 && !imp.redlock() {
                row.note = "not applicable: single-node lock, no Redlock mode".into();
            } else {
                match result {
                    Ok(mut s) => {
                        row.p50_us = s.quantile_us(0.5);
                        row.p99_us = s.quantile_us(0.99);
                        row.dist_us = s.dist_us();
                        row.note = format!(
                            "{} sequential acquire+release pairs on one key in {} interleaved rounds after {} \
                             warm-up; latency of the pair",
                            s.len(),
                            plan.rounds,
                            plan.warmup
                        );
                        // Every pair since the reset, warm-ups included.
                        let warmups = plan.warmup + (plan.rounds - 1) * (plan.warmup / 10);
                        record_own_stats(env, imp, &mut row, (s.len() + warmups) as u64, None);
                    }
                    Err(e) => row.note = format!("failed: {e}"),
                }
            }
            row
        })
        .collect()
}

/// S3: 64 tasks on distinct keys through one client; acquire + release pairs per second.
pub(crate) fn throughput(env: &Env, plan: &Plan, imp: Impl) -> Row {
    let mut row = Row::new("S3", imp.name(), Some(1));
    if !imp.networked() {
        row.note = "not measured: the in-memory node is for S6 (memory) and S7".into();
        return row;
    }
    let urls = env.urls_for(imp, 1);
    let result = on_runtime(|| async {
        let client = Arc::new(Client::connect(imp, &urls, STEADY).await?);
        let warm_per_task = (plan.warmup / S3_TASKS).max(2);
        let mut tasks = Vec::with_capacity(S3_TASKS);
        let start = Arc::new(tokio::sync::Barrier::new(S3_TASKS + 1));
        // Every task warmed up, before the server's counters are reset and the window starts.
        let warmed = Arc::new(tokio::sync::Barrier::new(S3_TASKS + 1));
        let stop = Arc::new(AtomicBool::new(false));
        for t in 0..S3_TASKS {
            let (client, start, stop, warmed) = (
                Arc::clone(&client),
                Arc::clone(&start),
                Arc::clone(&stop),
                Arc::clone(&warmed),
            );
            let key = format!("bench:S3:{}:{t}", imp.name());
            tasks.push(tokio::spawn(async move {
                pairs(&client, &key, warm_per_task, 0).await?;
                warmed.wait().await;
                start.wait().await;
                let mut samples = Samples::with_capacity(1 << 14);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let held = client
                        .try_acquire(&key)
                        .await?
                        .ok_or_else(|| format!("{key} unexpectedly held"))?;
                    client.release(held).await?;
                    samples.push(t.elapsed());
                }
                Ok::<_, String>(samples)
            }));
        }
        warmed.wait().await;
        reset_own_stats(env, imp)?;
        let cpu = CpuClock::new();
        start.wait().await;
        let (heap0, cpu0) = (measure::heap(), cpu.now()?);
        let t0 = Instant::now();
        tokio::time::sleep(plan.s3_time).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Samples::default();
        let mut ops = 0usize;
        let mut results = Vec::with_capacity(S3_TASKS);
        for task in tasks {
            results.push(task.await.map_err(ctx("S3 task"))?);
        }
        // Operations finished after the stop flag are counted, and so is the time they took.
        let elapsed = t0.elapsed();
        let (heap1, cpu1) = (measure::heap(), cpu.now()?);
        for s in results {
            let s = s?;
            ops += s.len();
            all.merge(s);
        }
        let allocations = heap1.allocations.saturating_sub(heap0.allocations);
        Ok((ops, elapsed, all, allocations, cpu1.saturating_sub(cpu0)))
    });
    match result {
        Ok((ops, elapsed, mut all, allocations, cpu_time)) => {
            row.ops_per_s = Some(ops as f64 / elapsed.as_secs_f64());
            row.allocs_per_op = Some(allocations as f64 / ops.max(1) as f64);
            row.cpu_us_per_op = Some(us(cpu_time) / ops.max(1) as f64);
            row.p50_us = all.quantile_us(0.5);
            row.p99_us = all.quantile_us(0.99);
            row.dist_us = all.dist_us();
            row.note = format!(
                "{ops} acquire+release pairs by {S3_TASKS} tasks on distinct keys through one client in {:.2} s; \
                 p50/p99 = latency of one pair under this load; allocs_per_op = heap allocations of the whole \
                 process per pair, cpu_us_per_op = its CPU time (utime + stime, all threads: the client's share \
                 of the 2 cores) per pair",
                elapsed.as_secs_f64()
            );
            record_own_stats(env, imp, &mut row, ops as u64, None);
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// S4: three nodes, the first behind a blackholing proxy (accepts, never answers); acquisition latency.
pub(crate) fn hung_node(env: &Env, plan: &Plan, imp: Impl) -> Row {
    let mut row = Row::new("S4", imp.name(), Some(3));
    if !imp.networked() {
        row.note = "not measured: the in-memory node is for S6 (memory) and S7".into();
        return row;
    }
    if !imp.redlock() {
        row.note = "not applicable: single-node lock, no Redlock mode".into();
        return row;
    }
    let bound = match imp {
        Impl::Rslock => REDIS_RS_RESPONSE_TIMEOUT,
        _ => S4_OP_TIMEOUT,
    };
    row.bound_us = Some(us(bound));
    let setup = Setup {
        op_timeout: S4_OP_TIMEOUT,
        ..STEADY
    };
    let result = (|| {
        let upstream = env.servers[0]
            .addr()
            .parse()
            .map_err(ctx("server address"))?;
        let proxy = FaultProxy::start(upstream).map_err(ctx("fault proxy"))?;
        let mut urls = env.urls(3);
        urls[0] = format!("{}/0", proxy.url());
        let out = on_runtime(|| async {
            let client = Arc::new(Client::connect(imp, &urls, setup).await?);
            let key = format!("bench:S4:{}:warm", imp.name());
            pairs(&client, &key, plan.warmup.min(100), 0).await?;
            proxy.set_mode(ProxyMode::Blackhole);
            let mut samples = Samples::with_capacity(plan.s4_iters);
            let (mut not_acquired, mut errors, mut hung) = (0usize, 0usize, false);
            let t0 = Instant::now();
            for i in 0..plan.s4_iters {
                if t0.elapsed() >= plan.s4_budget {
                    break;
                }
                let key = format!("bench:S4:{}:{i}", imp.name());
                let t = Instant::now();
                let attempt = tokio::time::timeout(HANG_BOUND, client.try_acquire(&key)).await;
                let took = t.elapsed();
                match attempt {
                    Err(_) => {
                        hung = true;
                        break;
                    }
                    Ok(Ok(Some(held))) => {
                        samples.push(took);
                        // Release in the background: S4 measures acquisition, and a release must wait for
                        // the silent node up to its own bound.
                        let client = Arc::clone(&client);
                        tokio::spawn(async move {
                            let _ = client.release(held).await;
                        });
                    }
                    Ok(Ok(None)) => {
                        samples.push(took);
                        not_acquired += 1;
                    }
                    Ok(Err(_)) => {
                        samples.push(took);
                        errors += 1;
                    }
                }
            }
            Ok((samples, not_acquired, errors, hung))
        });
        drop(proxy);
        out
    })();
    match result {
        Ok((mut s, not_acquired, errors, hung)) => {
            row.p50_us = s.quantile_us(0.5);
            row.p99_us = s.quantile_us(0.99);
            let bound_what = match imp {
                Impl::Rslock => {
                    "bound: redis-rs's default 500 ms response timeout (rslock has no timeout of its own)"
                }
                Impl::Dlr => "bound: its acquire timeout, expiry − min_validity = 100 ms",
                _ => "bound: the 100 ms operation timeout",
            };
            row.note = format!(
                "{} acquisitions with node 0 blackholed ({not_acquired} not acquired, {errors} errors){}; {bound_what}",
                s.len(),
                if hung {
                    format!(
                        "; HUNG: an acquisition did not return within {} s, stopped waiting",
                        HANG_BOUND.as_secs()
                    )
                } else {
                    String::new()
                }
            );
            if hung && s.len() == 0 {
                row.p50_us = None;
                row.p99_us = None;
            }
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// Commands the server has executed so far (`INFO stats total_commands_processed`; commands a script runs
/// count too), and the `INFO` itself.
fn server_commands(env: &Env) -> Res<u64> {
    let info = env.servers[0]
        .try_cmd(&["INFO", "stats"])
        .map_err(ctx("INFO stats"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO stats: no total_commands_processed".to_owned())
}

/// How waiting works for `imp` in S5 and S8 (the note's wording), with the retry delay `delay`.
pub(crate) fn waiting_kind(imp: Impl, delay: &str) -> String {
    let how = match imp {
        Impl::RedleaseRedis
        | Impl::RedleaseFred
        | Impl::RedleaseMemory
        | Impl::RedleaseRedisNoop
        | Impl::RedleaseRedisMetrics
        | Impl::RedleaseMemoryNoop
        | Impl::RedleaseMemoryMetrics
        | Impl::ValkeyRedisNative
        | Impl::ValkeyRedisScripts
        | Impl::ValkeyFredNative
        | Impl::ValkeyFredScripts
        | Impl::ReplicatedRedis
        | Impl::ReplicatedRedisWait1
        | Impl::ReplicatedRedisNoQuarantine
        | Impl::RedleaseRedisBatch
        | Impl::RedleaseFredBatch => {
            "acquire_within, woken by release notifications (at most max_retry_delay 1 s apart; polling at \
             the retry delay DELAY until subscribed)"
        }
        Impl::RedleaseRedisCap10 => {
            "acquire_within, woken by release notifications, max_retry_delay 10 s (polling at the retry \
             delay DELAY until subscribed)"
        }
        Impl::RedleaseRedisPoll | Impl::RedleaseFredPoll => {
            "acquire_within with notifications off: retry delay DELAY + 0–50 % jitter"
        }
        Impl::Rslock => "lock() with set_retry(∞, DELAY): pauses U[0, DELAY)",
        Impl::Arl => "its own retry loop, DELAY apart",
        Impl::Raw | Impl::RawFred | Impl::RawPublish | Impl::Dlr => {
            "harness loop: try, then DELAY + 0–50 % jitter"
        }
    };
    how.replace("DELAY", delay)
}

/// S5: 8 tasks contend for one key, holding it 1 ms each time; handoffs per second, the gap from one
/// holder's release (returned) to the next holder's acquisition (returned), the time each lease was held,
/// and what the server executed per handoff.
///
/// With `pause` (S5p), a task pauses that long after its release before it waits again, so every handoff
/// goes to a waiting task: the gap is then how long a released lock waits for its next holder.
pub(crate) fn contention(env: &Env, plan: &Plan, imp: Impl, pause: Option<Duration>) -> Row {
    let scenario = if pause.is_some() { "S5p" } else { "S5" };
    let mut row = Row::new(scenario, imp.name(), Some(1));
    if !imp.networked() {
        row.note = "not measured: the in-memory node is for S6 (memory) and S7".into();
        return row;
    }
    let urls = env.urls(1);
    let result = on_runtime(|| async {
        clients::COUNTING.store(true, Ordering::SeqCst);
        let client = Client::connect(imp, &urls, STEADY).await;
        clients::COUNTING.store(false, Ordering::SeqCst);
        let client = Arc::new(client?);
        let key = format!("bench:S5:{}", imp.name());
        pairs(&client, &key, plan.warmup.min(100), 0).await?;
        let seq = Arc::new(AtomicU64::new(0));
        let holding = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        // Per handoff index: when the acquisition returned (and by which task), and when its release
        // returned.
        let acquired: Arc<Mutex<Vec<(u64, Instant, usize)>>> = Arc::default();
        let released: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let (commands, calls) = (
            server_commands(env)?,
            clients::NODE_CALLS.load(Ordering::SeqCst),
        );
        let end = Instant::now() + plan.s5_time;
        let mut tasks = Vec::with_capacity(S5_TASKS);
        for task in 0..S5_TASKS {
            let (client, key, seq, holding, overlaps, acquired, released) = (
                Arc::clone(&client),
                key.clone(),
                Arc::clone(&seq),
                Arc::clone(&holding),
                Arc::clone(&overlaps),
                Arc::clone(&acquired),
                Arc::clone(&released),
            );
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let Some(held) = client
                        .acquire_waiting(&key, Duration::from_secs(2), STEADY.retry_delay)
                        .await?
                    else {
                        continue;
                    };
                    let at = Instant::now();
                    let n = seq.fetch_add(1, Ordering::SeqCst);
                    if holding.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    lock(&acquired).push((n, at, task));
                    tokio::time::sleep(S5_CRITICAL).await;
                    holding.store(false, Ordering::SeqCst);
                    client.release(held).await?;
                    lock(&released).push((n, Instant::now()));
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
                Ok::<_, String>(())
            }));
        }
        let t0 = Instant::now();
        for task in tasks {
            task.await.map_err(ctx("S5 task"))??;
        }
        let elapsed = t0.elapsed();
        // The harness's own INFO (the first one) is counted in the second reading.
        let commands = server_commands(env)?.saturating_sub(commands + 1);
        let calls = clients::NODE_CALLS.load(Ordering::SeqCst) - calls;
        let mut acquired = std::mem::take(&mut *lock(&acquired));
        let mut released = std::mem::take(&mut *lock(&released));
        acquired.sort_unstable_by_key(|(n, _, _)| *n);
        released.sort_unstable_by_key(|(n, _)| *n);
        let mut gaps = Samples::with_capacity(acquired.len());
        for (r, a) in released.iter().zip(acquired.iter().skip(1)) {
            gaps.push(a.1.saturating_duration_since(r.1));
        }
        // Handoffs to another task (not the releaser taking the lock again), and wins per task.
        let switches = acquired.windows(2).filter(|w| w[0].2 != w[1].2).count();
        let mut wins = [0usize; S5_TASKS];
        for a in &acquired {
            wins[a.2] += 1;
        }
        // How long each lease was held: acquisition returned to release returned (1 ms asked for; the
        // tokio timer and the release's round trip add to it).
        let held: Vec<Duration> = acquired
            .iter()
            .zip(released.iter())
            .map(|(a, r)| r.1.saturating_duration_since(a.1))
            .collect();
        let hold_mean =
            held.iter().sum::<Duration>() / u32::try_from(held.len().max(1)).unwrap_or(1);
        Ok((
            acquired.len(),
            elapsed,
            gaps,
            overlaps.load(Ordering::SeqCst),
            hold_mean,
            (commands, calls),
            (switches, wins),
        ))
    });
    match result {
        Ok((handoffs, elapsed, mut gaps, overlaps, hold, (commands, calls), (switches, wins))) => {
            let per = |n: u64| n as f64 / handoffs.max(1) as f64;
            row.ops_per_s = Some(handoffs as f64 / elapsed.as_secs_f64());
            row.p50_us = gaps.quantile_us(0.5);
            row.p99_us = gaps.quantile_us(0.99);
            row.dist_us = gaps.dist_us();
            row.hold_us = Some(us(hold));
            row.cmds_per_op = Some(per(commands));
            if imp.redlease() {
                row.calls_per_op = Some(per(calls));
            }
            let (min, max) = (
                wins.iter().min().copied().unwrap_or(0),
                wins.iter().max().copied().unwrap_or(0),
            );
            row.note = format!(
                "{handoffs} handoffs among {S5_TASKS} tasks holding 1 ms each{} in {:.2} s (mean hold {:.0} µs: \
                 acquisition returned to release returned; {:.1} % to another task than the releaser, wins per \
                 task {min}–{max}); p50/p99 = gap from a release returning to the next acquisition returning; \
                 {commands} server commands (INFO total_commands_processed, script-inner commands included){}; \
                 waiting: {}{}",
                if pause.is_some() {
                    " and pausing 1 ms after each release"
                } else {
                    ""
                },
                elapsed.as_secs_f64(),
                us(hold),
                100.0 * switches as f64 / handoffs.saturating_sub(1).max(1) as f64,
                if imp.redlease() {
                    format!(", {calls} node calls")
                } else {
                    String::new()
                },
                waiting_kind(imp, "5 ms"),
                if overlaps > 0 {
                    format!("; {overlaps} OVERLAPPING holds observed")
                } else {
                    String::new()
                }
            );
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// S8's waiters and keys.
const S8_WAITERS: usize = 1000;
const S8_KEYS: usize = 100;

/// S8 settings: the default retry delay (200 ms) and a TTL far longer than the run.
const WAITING: Setup = Setup {
    ttl: Duration::from_secs(30),
    op_timeout: Duration::from_millis(500),
    retry_delay: Duration::from_millis(200),
    renew_every: Duration::from_secs(10),
};

/// S8: 1,000 waiters on 100 held keys through one client: server commands per second while they wait; then
/// the keys are released and every waiter takes its key once.
pub(crate) fn waiting(env: &Env, plan: &Plan, imp: Impl) -> Row {
    let mut row = Row::new("S8", imp.name(), Some(1));
    if !imp.networked() {
        row.note = "not measured: the in-memory node".into();
        return row;
    }
    let urls = env.urls(1);
    let result = on_runtime(|| async {
        clients::COUNTING.store(true, Ordering::SeqCst);
        let client = Client::connect(imp, &urls, WAITING).await;
        clients::COUNTING.store(false, Ordering::SeqCst);
        let client = Arc::new(client?);
        let holder = Client::connect(imp, &urls, WAITING).await?;
        let keys: Vec<String> = (0..S8_KEYS)
            .map(|i| format!("bench:S8:{}:{i}", imp.name()))
            .collect();
        let mut held = Vec::with_capacity(S8_KEYS);
        for k in &keys {
            held.push(
                holder
                    .try_acquire(k)
                    .await?
                    .ok_or_else(|| format!("{k} unexpectedly held"))?,
            );
        }
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::with_capacity(S8_WAITERS);
        for j in 0..S8_WAITERS {
            let (client, key, done) = (
                Arc::clone(&client),
                keys[j % S8_KEYS].clone(),
                Arc::clone(&done),
            );
            tasks.push(tokio::spawn(async move {
                let got = client
                    .acquire_waiting(&key, Duration::from_secs(120), WAITING.retry_delay)
                    .await?;
                if let Some(h) = got {
                    client.release(h).await?;
                    done.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, String>(())
            }));
        }
        // Settle (first attempts, subscriptions), then measure while everyone waits.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (commands, calls) = (
            server_commands(env)?,
            clients::NODE_CALLS.load(Ordering::SeqCst),
        );
        let t0 = Instant::now();
        // A longer max_retry_delay needs a window that spans it.
        let window = if imp == Impl::RedleaseRedisCap10 {
            plan.s8_window.max(Duration::from_secs(11))
        } else {
            plan.s8_window
        };
        tokio::time::sleep(window).await;
        let window = t0.elapsed();
        let commands = server_commands(env)?.saturating_sub(commands + 1);
        let calls = clients::NODE_CALLS.load(Ordering::SeqCst) - calls;
        // Release every key: the waiters take them in turn.
        let released = Instant::now();
        for h in held {
            holder.release(h).await?;
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(120), task)
                .await
                .map_err(|_| "S8: a waiter did not finish".to_owned())?
                .map_err(ctx("S8 task"))??;
        }
        Ok((
            window,
            commands,
            calls,
            released.elapsed(),
            done.load(Ordering::SeqCst),
        ))
    });
    match result {
        Ok((window, commands, calls, drained, done)) => {
            let secs = window.as_secs_f64();
            row.cmds_per_s = Some(commands as f64 / secs);
            if imp.redlease() {
                row.calls_per_s = Some(calls as f64 / secs);
            }
            row.note = format!(
                "{S8_WAITERS} waiters on {S8_KEYS} held keys, one client: {commands} server commands in a {secs:.2} \
                 s window while all waited{}; then every key released: {done} acquisitions in {:.2} s; waiting: {}",
                if imp.redlease() {
                    format!(" ({calls} node calls)")
                } else {
                    String::new()
                },
                drained.as_secs_f64(),
                waiting_kind(imp, "200 ms"),
            );
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One size of S6: the scenario's name, the leases held and the CPU window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fleet {
    /// `"S6"` (10,000 leases) or `"S6L"` (100,000).
    pub(crate) scenario: &'static str,
    /// Leases held at once.
    pub(crate) leases: usize,
    /// The window over which CPU, renewals and lateness are measured (longer than the renewal interval).
    pub(crate) window: Duration,
    /// TTL and renewal interval.
    pub(crate) setup: Setup,
}

impl Plan {
    /// S6: `s6_leases` leases over `s6_window`.
    pub(crate) fn s6(&self) -> Fleet {
        Fleet {
            scenario: "S6",
            leases: self.s6_leases,
            window: self.s6_window,
            setup: RENEWING,
        }
    }

    /// S6L: `s6l_leases` leases over `s6l_window`.
    pub(crate) fn s6l(&self) -> Fleet {
        Fleet {
            scenario: "S6L",
            leases: self.s6l_leases,
            window: self.s6l_window,
            setup: RENEWING_LARGE,
        }
    }
}

/// Renewals, the requests that carried them and every command the server executed, between two
/// `INFO commandstats` readings (see [`measure::Commandstats::renewal_counters`]). A renewal is a command
/// that moved a key's expiry (`PEXPIRE`/`EXPIRE`, or `SET`: rslock's script, Valkey's native `SET … IFEQ`);
/// the requests are the scripts, or where there were none, the native `SET`s.
fn renewal_counts(before: &str, after: &str) -> (u64, u64, u64) {
    let [e0, s0, x0, t0] = measure::Commandstats::parse(before).renewal_counters();
    let [e1, s1, x1, t1] = measure::Commandstats::parse(after).renewal_counters();
    let (expiries, sets, scripts) = (e1 - e0.min(e1), s1 - s0.min(s1), x1 - x0.min(x1));
    let requests = if scripts > 0 { scripts } else { sets };
    (expiries + sets, requests, t1.saturating_sub(t0))
}

/// S6 and S6L: `fleet.leases` held leases renewing themselves (S6: TTL 3 s, every second; S6L: TTL 9 s, every
/// 3 s): heap bytes per lease,
/// client CPU per renewal, server requests and commands per renewal, and how late renewals started against
/// their schedule.
pub(crate) fn renewal(env: &Env, plan: &Plan, imp: Impl, cpu: CpuClock, fleet: Fleet) -> Row {
    if !imp.networked() {
        return renewal_memory(plan, imp);
    }
    let mut row = Row::new(fleet.scenario, imp.name(), Some(1));
    row.leases = Some(fleet.leases as u64);
    let urls = env.urls_for(imp, 1);
    let server = env.server_for(imp);
    let n = fleet.leases;
    // Allocated before any heap reading; fed by redlease's observer or the raw floors' loops.
    let setup = fleet.setup;
    let lateness = crate::lateness::Lateness::new(n, setup.renew_every);
    let measures_lateness = imp.redlease() || imp.raw();
    let result = on_runtime(|| async {
        if measures_lateness {
            *lock(&clients::LATENESS) = Some(Arc::clone(&lateness));
        }
        let client = Client::connect(imp, &urls, setup).await;
        *lock(&clients::LATENESS) = None;
        let client = Arc::new(client?);
        for i in 0..64 {
            let held = client
                .hold_renewing(
                    &format!("bench:{}:{}:warm{i}", fleet.scenario, imp.name()),
                    RENEWING,
                )
                .await?;
            client.release(held).await?;
        }
        let acquiring = Instant::now();
        let (bytes, rss, mut held, failures) = hold_many(&client, n, imp, Some(setup)).await?;
        let acquire_time = acquiring.elapsed();

        reset_own_stats(env, imp)?;
        let info0 = server.try_cmd(&["INFO", "commandstats"])?;
        let cpu0 = cpu.now()?;
        lateness.set_recording(true);
        let t0 = Instant::now();
        tokio::time::sleep(fleet.window).await;
        lateness.set_recording(false);
        let cpu1 = cpu.now()?;
        let window = t0.elapsed();
        let info1 = server.try_cmd(&["INFO", "commandstats"])?;
        let counts = renewal_counts(&info0, &info1);

        let still = held.len();
        let release_errors = release_all(&client, std::mem::take(&mut held)).await;
        Ok((
            (bytes, rss),
            cpu1.saturating_sub(cpu0),
            window,
            counts,
            acquire_time,
            (still, release_errors, failures),
            info1,
        ))
    });
    match result {
        Ok((
            (bytes, rss),
            cpu_time,
            window,
            (renewals, requests, commands),
            acquire_time,
            (still, release_errors, failures),
            info1,
        )) => {
            row.bytes_per_lease = Some(bytes);
            let per = |x: u64| (renewals > 0).then(|| x as f64 / renewals as f64);
            row.cpu_us_per_renewal = (renewals > 0).then(|| us(cpu_time) / renewals as f64);
            row.calls_per_op = per(requests);
            row.cmds_per_op = per(commands);
            if measures_lateness {
                row.lateness_p50_us = lateness.quantile_us(0.5);
                row.lateness_p99_us = lateness.quantile_us(0.99);
            }
            // The renewal window alone (read before the releases).
            record_own_stats(env, imp, &mut row, renewals, Some(Ok(info1)));
            let expected = n as f64 * window.as_secs_f64() / setup.renew_every.as_secs_f64();
            row.note = format!(
                "{still} leases (TTL {} s, renewed every {} s) acquired in {:.2} s ({failures} failed acquisitions tried again on \
                 another key); {renewals} renewals (PEXPIRE, or SET: rslock's script, Valkey's \
                 SET … IFEQ; INFO commandstats; {:.1} % of one per lease and interval) in a {:.2} s window, by \
                 {requests} requests (EVALSHA/EVAL, or native SETs: calls_per_op) and {commands} server commands in all \
                 (script-inner ones included: cmds_per_op); process CPU {:.0} ms (tick {} ms); heap delta per \
                 lease incl. the lease object; RSS delta {rss:.0} B/lease; {}; {release_errors} release \
                 errors; cadence: {}{}",
                setup.ttl.as_secs(),
                setup.renew_every.as_secs(),
                acquire_time.as_secs_f64(),
                100.0 * renewals as f64 / expected.max(1.0),
                window.as_secs_f64(),
                cpu_time.as_secs_f64() * 1e3,
                cpu.resolution().as_millis(),
                if measures_lateness {
                    format!(
                        "lateness against the schedule (round start − previous round start − {} s; 10 µs \
                         buckets) over {} renewals: max {:.1} ms, {} rounds early (retries, and batched renewals taken up to the window early)",
                        setup.renew_every.as_secs(),
                        lateness.count(),
                        lateness.max().as_secs_f64() * 1e3,
                        lateness.early()
                    )
                } else {
                    "lateness not measured (its renewal is inside the peer)".to_owned()
                },
                match imp {
                    Impl::Rslock => "rslock's `using` extends at validity − 500 ms".to_owned(),
                    _ => format!("every {} s", setup.renew_every.as_secs()),
                },
                if imp.batched() {
                    format!(
                        "; batched: Config::with_renewal_batching({} ms, {})",
                        clients::BATCH_WINDOW.as_millis(),
                        clients::BATCH_MAX
                    )
                } else {
                    String::new()
                }
            );
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// Acquires `n` leases (with `renewing`, self-renewing ones with its TTL and interval) with 64 acquisitions in flight, and returns the heap
/// bytes per lease (including the inline size of the lease object), the RSS growth per lease, the leases and
/// the failed acquisitions. An acquisition that fails (on a saturated machine an operation times out: 100,000
/// leases renewing one by one keep both cores busy) is tried again on a new key, at most twice; the row
/// reports the failures (and measures the leases it holds), and more than 10 % failures fail it.
async fn hold_many(
    client: &Arc<Client>,
    n: usize,
    imp: Impl,
    renewing: Option<Setup>,
) -> Res<(f64, f64, Vec<Held>, usize)> {
    let mut held: Vec<Held> = Vec::with_capacity(n);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heap0 = measure::live_bytes(&measure::heap());
    let rss0 = measure::resident_bytes()?;
    let mut stream = futures::stream::iter(0..n)
        .map(|i| {
            let client = Arc::clone(client);
            async move {
                let mut failed = 0;
                loop {
                    let key = format!(
                        "bench:S6:{}:{n}:{}:{i}:{failed}",
                        imp.name(),
                        renewing.is_some()
                    );
                    let got = if let Some(setup) = renewing {
                        client.hold_renewing(&key, setup).await
                    } else {
                        client
                            .try_acquire(&key)
                            .await
                            .and_then(|h| h.ok_or_else(|| format!("{key} unexpectedly held")))
                    };
                    match got {
                        Ok(h) => return (Ok(h), failed),
                        Err(e) if failed == 2 => return (Err(e), failed + 1),
                        Err(_) => failed += 1,
                    }
                }
            }
        })
        .buffer_unordered(64);
    let mut failures = 0;
    let mut last_error = None;
    while let Some((h, failed)) = stream.next().await {
        failures += failed;
        match h {
            Ok(h) => held.push(h),
            Err(e) => last_error = Some(e),
        }
    }
    drop(stream);
    if failures * 10 > n {
        return Err(format!(
            "{failures} of {n} acquisitions failed; the last: {}",
            last_error.unwrap_or_default()
        ));
    }
    // Let the acquisitions' transient buffers go before reading the heap.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let heap1 = measure::live_bytes(&measure::heap());
    let rss1 = measure::resident_bytes()?;
    let inline: usize = held.iter().map(Held::inline_size).sum();
    let count = held.len().max(1) as f64;
    let bytes = ((heap1 - heap0) as f64 + inline as f64) / count;
    let rss = (rss1 as f64 - rss0 as f64) / count;
    Ok((bytes, rss, held, failures))
}

/// Releases every lease in `held`, 64 at a time; returns the number of failed releases.
async fn release_all(client: &Arc<Client>, held: Vec<Held>) -> usize {
    let mut releasing = futures::stream::iter(held)
        .map(|h| {
            let client = Arc::clone(client);
            async move { client.release(h).await }
        })
        .buffer_unordered(64);
    let mut errors = 0usize;
    while let Some(r) = releasing.next().await {
        errors += usize::from(r.is_err());
    }
    errors
}

/// S6 on the in-memory node: the heap cost of a lease without any network client, with and without its
/// renewal task (no CPU figure: there is no server to count renewals).
fn renewal_memory(plan: &Plan, imp: Impl) -> Row {
    let mut row = Row::new("S6", imp.name(), None);
    let n = plan.s6_leases;
    let result = on_runtime(|| async {
        let client = Arc::new(Client::connect(imp, &[], RENEWING).await?);
        let (renewing, _, held, _) = hold_many(&client, n, imp, Some(RENEWING)).await?;
        let task = crate::clients::LAST_TASK_SIZE.load(Ordering::Relaxed);
        let errors = release_all(&client, held).await;
        let (plain, _, held, _) = hold_many(&client, n, imp, None).await?;
        let errors = errors + release_all(&client, held).await;
        Ok((renewing, plain, errors, task))
    });
    match result {
        Ok((renewing, plain, errors, task)) => {
            row.bytes_per_lease = Some(renewing);
            row.note = format!(
                "{n} self-renewing leases on MemoryNode (no client buffers): {renewing:.0} B each, of which the \
                 lease without auto_renew is {plain:.0} B and the spawned renewal task the rest (its future alone: \
                 {task} B inline, boxed by redlease, then moved into a tokio task); {errors} release \
                 errors; CPU not measured (no server to count renewals)"
            );
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// S7: heap allocations per acquire + release of redlease on the in-memory node (single mode, no spawner).
pub(crate) fn allocations(plan: &Plan, imp: Impl) -> Row {
    let mut row = Row::new("S7", imp.name(), None);
    if !imp.memory() {
        row.note = "not applicable: no in-memory backend".into();
        return row;
    }
    let result = (|| {
        let manager = LockManager::single(MemoryNode::new(), Config::default())
            .map_err(ctx("redlease: manager"))?;
        let manager = crate::clients::observe(manager, imp.observer());
        let lock = manager.lock("bench:S7");
        let run = |iters: usize| {
            redlease_testkit::block_on(async {
                for _ in 0..iters {
                    let lease = lock.try_acquire().await.map_err(ctx("acquire"))?;
                    lease.release().await.map_err(ctx("release"))?;
                }
                Ok::<(), String>(())
            })
        };
        run(plan.warmup)?;
        let before = measure::heap();
        run(plan.s7_iters)?;
        let after = measure::heap();
        // Then the CPU cost: the latency of each pair (no I/O: all of it is redlease's own work, so this is
        // where an observer's cost shows, if anywhere).
        let mut samples = Samples::with_capacity(plan.s7_iters);
        redlease_testkit::block_on(async {
            for _ in 0..plan.s7_iters {
                let t = Instant::now();
                let lease = lock.try_acquire().await.map_err(ctx("acquire"))?;
                lease.release().await.map_err(ctx("release"))?;
                samples.push(t.elapsed());
            }
            Ok::<(), String>(())
        })?;
        // The inline sizes of redlease's public futures: what a task awaiting them (or a renewal loop nesting
        // the same rounds) carries, before any allocation of its own.
        let sizes = redlease_testkit::block_on(async {
            let lease = lock.try_acquire().await.map_err(ctx("acquire"))?;
            let sizes = (
                std::mem::size_of_val(&lock.try_acquire()),
                std::mem::size_of_val(&lease.extend(Duration::from_secs(30))),
                std::mem::size_of_val(&lease.lost()),
            );
            let release = lease.release();
            let sizes = (sizes.0, sizes.1, sizes.2, std::mem::size_of_val(&release));
            release.await.map_err(ctx("release"))?;
            Ok::<_, String>(sizes)
        })?;
        Ok::<_, String>((before, after, sizes, samples))
    })();
    match result {
        Ok((before, after, (acquire, extend, lost, release), mut samples)) => {
            let per = |a: usize, b: usize| (b.saturating_sub(a)) as f64 / plan.s7_iters as f64;
            row.allocs_per_op = Some(per(before.allocations, after.allocations));
            row.p50_us = samples.quantile_us(0.5);
            row.p99_us = samples.quantile_us(0.99);
            row.note = format!(
                "{} try_acquire+release pairs on MemoryNode (one Lock reused, testkit block_on), then as many \
                 timed (p50/p99 of one pair); also {:.1} \
                 reallocations and {:.0} bytes allocated per pair; future sizes: try_acquire {acquire} B, \
                 extend {extend} B, release {release} B, LossSignal {lost} B",
                plan.s7_iters,
                per(before.reallocations, after.reallocations),
                per(before.bytes_allocated, after.bytes_allocated)
            );
        }
        Err(e) => row.note = format!("failed: {e}"),
    }
    row
}

/// `usec_per_call` of `command` in an `INFO commandstats` text.
fn usec_per_call(info: &str, command: &str) -> Option<f64> {
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// Attribution of the S1 gap: the raw floor's pair (`SET NX PX` + release script) against the same pair with
/// redlease's acquire script instead of `SET NX PX`, on one redis-rs connection, with Redis' own CPU time
/// per command. Separates what the server spends on the script from what the client spends.
pub(crate) fn attribution(env: &Env, plan: &Plan) -> Res<Vec<String>> {
    let url = env.urls(1).pop().ok_or("no server")?;
    let iters = plan.s1_iters / 2;
    on_runtime(|| async {
        let client = redis::Client::open(url.as_str()).map_err(ctx("open"))?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(ctx("connect"))?;
        for script in [
            redlease_adapters::scripts::ACQUIRE,
            redlease_adapters::scripts::RELEASE,
        ] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script.source)
                .query_async(&mut conn)
                .await
                .map_err(ctx("SCRIPT LOAD"))?;
        }
        let mut lines = Vec::new();
        let mut release_us = None;
        for script_acquire in [false, true] {
            let mut samples = Samples::with_capacity(iters);
            for i in 0..plan.warmup + iters {
                if i == plan.warmup {
                    let _: String = redis::cmd("CONFIG")
                        .arg("RESETSTAT")
                        .query_async(&mut conn)
                        .await
                        .map_err(ctx("CONFIG RESETSTAT"))?;
                }
                let token = format!("attribution-token-{i:024}");
                let t = Instant::now();
                let acquired = if script_acquire {
                    redis::cmd("EVALSHA")
                        .arg(redlease_adapters::scripts::ACQUIRE.sha1)
                        .arg(1)
                        .arg("bench:attribution")
                        .arg(&token)
                        .arg(10_000)
                        .query_async::<i64>(&mut conn)
                        .await
                        .map_err(ctx("EVALSHA acquire"))?
                        == 1
                } else {
                    redis::cmd("SET")
                        .arg("bench:attribution")
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async::<redis::Value>(&mut conn)
                        .await
                        .map_err(ctx("SET"))?
                        == redis::Value::Okay
                };
                let released = redis::cmd("EVALSHA")
                    .arg(redlease_adapters::scripts::RELEASE.sha1)
                    .arg(1)
                    .arg("bench:attribution")
                    .arg(&token)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map_err(ctx("EVALSHA release"))?;
                if !acquired || released != 1 {
                    return Err("attribution: the key was not free".into());
                }
                if i >= plan.warmup {
                    samples.push(t.elapsed());
                }
            }
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .map_err(ctx("INFO"))?;
            let evalsha = usec_per_call(&info, "evalsha");
            let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            let p50 = samples.quantile_us(0.5);
            if script_acquire {
                // EVALSHA's average now covers acquire and release scripts in equal numbers.
                let acquire = evalsha.zip(release_us).map(|(avg, rel)| 2.0 * avg - rel);
                lines.push(format!(
                    "raw pair with redlease's acquire script instead of SET NX PX: p50 {} µs; Redis CPU per acquire \
                     script ≈ {} µs",
                    fmt(p50),
                    fmt(acquire)
                ));
            } else {
                release_us = evalsha;
                lines.push(format!(
                    "raw pair (SET NX PX + release script): p50 {} µs; Redis CPU per SET {} µs, per release script {} µs",
                    fmt(p50),
                    fmt(usec_per_call(&info, "set")),
                    fmt(evalsha)
                ));
            }
        }
        Ok(lines)
    })
}

/// The server's own time per lease operation on Valkey 9.1 (`--valkey`), native against scripts: release,
/// extension and fenced acquisition, each `plan.s1_iters / 4` times in a row on a fresh server through one
/// redis-rs node (`Commands::Native`: `DELIFEQ`, `SET … IFEQ`, the three-step fenced acquisition;
/// `Commands::Scripts`: the scripts), from `INFO commandstats` (`usec` of the lock commands per operation).
pub(crate) fn valkey_costs(plan: &Plan) -> Res<Vec<String>> {
    use redlease::{RedisNode, Token, Ttl};
    use redlease_adapters::Commands;
    use redlease_adapters::redis::MultiplexedNode;
    let n = (plan.s1_iters / 4).max(100);
    let mut lines = Vec::new();
    for mode in [Commands::Native, Commands::Scripts] {
        let server = RedisServer::start_flavor(redlease_testkit::server::Flavor::Valkey91, &[]);
        let url = server.url();
        let per_op = on_runtime(|| async {
            let client = redis::Client::open(url.as_str()).map_err(ctx("open"))?;
            let node = MultiplexedNode::connect(&client)
                .await
                .map_err(ctx("connect"))?
                .with_commands(mode);
            node.probe("bench:costs").await.map_err(ctx("probe"))?;
            let ttl = Ttl::from_millis(60_000).ok_or("ttl")?;
            let usec = || -> Res<f64> {
                let info = server.try_cmd(&["INFO", "commandstats"])?;
                Ok(LOCK_COMMANDS
                    .iter()
                    .filter_map(|c| {
                        info.lines()
                            .find_map(|l| l.strip_prefix(&format!("cmdstat_{c}:")))
                            .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("usec=")))
                            .and_then(|v| v.trim().parse::<f64>().ok())
                    })
                    .sum())
            };
            let reset = || server.try_cmd(&["CONFIG", "RESETSTAT"]).map(drop);
            let mut costs = Vec::new();
            // Release: n held keys, then n releases.
            let tokens: Vec<Token> = (0..n)
                .map(|_| Token::random().map_err(ctx("token")))
                .collect::<Res<_>>()?;
            for (i, t) in tokens.iter().enumerate() {
                let k = format!("bench:costs:release:{i}");
                if !node
                    .claim(redlease::ClaimRequest::new(&k, t, ttl).fresh(true))
                    .await
                    .map(redlease::Claim::is_taken)
                    .map_err(ctx("acquire"))?
                {
                    return Err(format!("{k} held"));
                }
            }
            reset()?;
            for (i, t) in tokens.iter().enumerate() {
                let k = format!("bench:costs:release:{i}");
                if !node.release(&k, t).await.map_err(ctx("release"))? {
                    return Err(format!("{k} not released"));
                }
            }
            costs.push(("release", usec()? / n as f64));
            // Extension: one held key, extended n times.
            let t = &tokens[0];
            if !node
                .claim(redlease::ClaimRequest::new("bench:costs:extend", t, ttl).fresh(true))
                .await
                .map(redlease::Claim::is_taken)
                .map_err(ctx("acquire"))?
            {
                return Err("bench:costs:extend held".into());
            }
            reset()?;
            for _ in 0..n {
                if !node
                    .extend("bench:costs:extend", t, ttl)
                    .await
                    .map_err(ctx("extend"))?
                {
                    return Err("bench:costs:extend lost".into());
                }
            }
            costs.push(("extend", usec()? / n as f64));
            // Fenced acquisition: n free keys, each with a counter of its own (same hash tag).
            reset()?;
            for (i, t) in tokens.iter().enumerate() {
                let k = format!("bench:costs:{{f{i}}}:lock");
                let f = format!("bench:costs:{{f{i}}}:fence");
                if node
                    .acquire_fenced(&k, &f, t, ttl)
                    .await
                    .map_err(ctx("fenced"))?
                    .is_none()
                {
                    return Err(format!("{k} held"));
                }
            }
            costs.push(("fenced acquisition", usec()? / n as f64));
            Ok(costs)
        })?;
        lines.push(format!(
            "valkey-9.1.2 server µs per operation ({mode:?}, {n} each, commandstats usec / operations): {}",
            per_op
                .iter()
                .map(|(op, us)| format!("{op} {us:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(lines)
}

/// `--replication`: what each replication variant sends per acquire + release pair, from the primary's
/// `INFO commandstats` around `n` pairs on one fresh client (so its once-per-connection commands, the
/// capability check's `EVAL` and the `run_id` lookup's `INFO`, appear once in `n`), less what the
/// measurement itself sends (the same reset and read with no client in between: the test harness checks a
/// server's identity with `INFO server` before each command).
pub(crate) fn replication_costs(env: &Env, plan: &Plan) -> Res<Vec<String>> {
    fn counts(info: &str) -> Vec<(String, u64)> {
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                // The replica's `REPLCONF ACK`s are not the client's.
                if name.starts_with("config") || name == "replconf" {
                    return None;
                }
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.trim().parse().ok()?))
            })
            .collect()
    }
    let (primary, _) = env.replicated.as_ref().ok_or("no replicated primary")?;
    let n = plan.s1_iters.max(100);
    let url = primary.url();
    primary.try_cmd(&["CONFIG", "RESETSTAT"])?;
    let baseline = counts(&primary.try_cmd(&["INFO", "commandstats"])?);
    let mut lines = vec![format!(
        "the measurement's own, subtracted below: {baseline:?}"
    )];
    for imp in Impl::REPLICATION {
        primary.try_cmd(&["CONFIG", "RESETSTAT"])?;
        on_runtime(|| async {
            let client = Client::connect(imp, std::slice::from_ref(&url), STEADY).await?;
            pairs(&client, &format!("bench:replication:{}", imp.name()), 0, n).await
        })?;
        let mut per_pair: Vec<String> = counts(&primary.try_cmd(&["INFO", "commandstats"])?)
            .into_iter()
            .filter_map(|(name, calls)| {
                let own = baseline.iter().find(|(b, _)| *b == name).map_or(0, |b| b.1);
                let calls = calls.saturating_sub(own);
                (calls > 0).then(|| format!("{name} {calls} ({:.4}/pair)", calls as f64 / n as f64))
            })
            .collect();
        per_pair.sort();
        lines.push(format!(
            "{}: {n} pairs: {}",
            imp.name(),
            per_pair.join(", ")
        ));
    }
    Ok(lines)
}
