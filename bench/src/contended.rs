//! S9 (many contenders on one key) and S10 (uncontended Redlock cycles over many pairs), side by side with
//! the raw floor and the peers in one run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clients::{Client, Impl, Setup, ctx};
use crate::report::Row;
use crate::scenarios::{self, Env, Plan};

/// Settings of S9: a TTL far longer than the run, and the retry delay of every poller (as in S5).
const CONTENDED: Setup = Setup {
    ttl: Duration::from_secs(10),
    op_timeout: Duration::from_millis(500),
    retry_delay: Duration::from_millis(5),
    renew_every: Duration::from_secs(3),
};

/// S9's cases: (scenario name, contenders, hold).
pub(crate) const S9_CASES: [(&str, usize, Duration); 4] = [
    ("S9/8/0ms", 8, Duration::ZERO),
    ("S9/8/1ms", 8, Duration::from_millis(1)),
    ("S9/64/0ms", 64, Duration::ZERO),
    ("S9/64/1ms", 64, Duration::from_millis(1)),
];

/// How long one S9 case is measured.
fn s9_window(plan: &Plan) -> Duration {
    if plan.rounds >= 10 {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(1)
    }
}

/// S9: `contenders` tasks of one client take turns on one key (on `nodes` nodes: 1, or Redlock-3), holding
/// it `hold` each time (none: released at once): acquisitions per second (`ops_per_s`), the per-task spread
/// of wins ((max − min) / mean, `spread_pct`), and the mean hold (`hold_us`: acquisition returned to release
/// returned), whose inverse is the ideal handoff rate.
pub(crate) fn contended(
    env: &Env,
    plan: &Plan,
    imp: Impl,
    case: (&'static str, usize, Duration),
    nodes: usize,
) -> Row {
    let (scenario, contenders, hold) = case;
    let mut row = Row::new(scenario, imp.name(), Some(nodes as u32));
    if !imp.networked() {
        row.note = "not measured: the in-memory node is for S6 (memory) and S7".into();
        return row;
    }
    if nodes > 1 && !imp.redlock() {
        row.note = "not applicable: single-node lock, no Redlock mode".into();
        return row;
    }
    let urls = env.urls_for(imp, nodes);
    let window = s9_window(plan);
    let result = scenarios::on_runtime(|| async {
        let client = Arc::new(Client::connect(imp, &urls, CONTENDED).await?);
        let key = format!("bench:{scenario}:{nodes}:{}", imp.name());
        let holding = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        let held_ns = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + window;
        let mut tasks = Vec::with_capacity(contenders);
        for _ in 0..contenders {
            let (client, key, holding, overlaps, held_ns) = (
                Arc::clone(&client),
                key.clone(),
                Arc::clone(&holding),
                Arc::clone(&overlaps),
                Arc::clone(&held_ns),
            );
            tasks.push(tokio::spawn(async move {
                let mut wins = 0u64;
                while Instant::now() < end {
                    let Some(held) = client
                        .acquire_waiting(&key, Duration::from_secs(2), CONTENDED.retry_delay)
                        .await?
                    else {
                        continue;
                    };
                    let at = Instant::now();
                    if holding.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    wins += 1;
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    holding.store(false, Ordering::SeqCst);
                    client.release(held).await?;
                    held_ns.fetch_add(at.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
                Ok::<_, String>(wins)
            }));
        }
        let t0 = Instant::now();
        let mut wins = Vec::with_capacity(contenders);
        for task in tasks {
            wins.push(task.await.map_err(ctx("S9 task"))??);
        }
        Ok((
            wins,
            t0.elapsed(),
            overlaps.load(Ordering::SeqCst),
            held_ns.load(Ordering::Relaxed),
        ))
    });
    match result {
        Ok((wins, elapsed, overlaps, held_ns)) => {
            let total: u64 = wins.iter().sum();
            let mean = total as f64 / wins.len().max(1) as f64;
            let (min, max) = (
                wins.iter().min().copied().unwrap_or(0),
                wins.iter().max().copied().unwrap_or(0),
            );
            let hold_us = held_ns as f64 / 1e3 / total.max(1) as f64;
            row.ops_per_s = Some(total as f64 / elapsed.as_secs_f64());
            row.spread_pct = (mean > 0.0).then(|| 100.0 * (max - min) as f64 / mean);
            row.hold_us = Some(hold_us);
            row.note = format!(
                "{total} acquisitions by {contenders} tasks on one key ({}), holding {} ms, in {:.2} s; wins per \
                 task {min}–{max} (spread = (max − min) / mean); mean hold {hold_us:.0} µs (acquisition returned \
                 to release returned; ideal handoff rate 1 / mean hold); waiting: {}{}",
                if nodes == 1 {
                    "one node".to_owned()
                } else {
                    format!("Redlock, {nodes} nodes")
                },
                hold.as_millis(),
                elapsed.as_secs_f64(),
                scenarios::waiting_kind(imp, "5 ms"),
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

/// S10: S2's uncontended acquire + release pairs on Redlock-3 and -5, over 20,000 pairs (quick: 2,000).
pub(crate) fn redlock_cycles(env: &Env, plan: &Plan, impls: &[Impl]) -> Vec<Row> {
    let plan = Plan {
        s2_iters: if plan.rounds >= 10 { 20_000 } else { 2_000 },
        ..*plan
    };
    let mut rows = Vec::new();
    for nodes in [3, 5] {
        for mut row in scenarios::latency(env, &plan, impls, nodes) {
            row.scenario = "S10";
            rows.push(row);
        }
    }
    rows
}

fn find<'a>(rows: &'a [Row], scenario: &str, imp: &str, nodes: u32) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.imp == imp && r.nodes == Some(nodes))
}

/// Issue 26's S9 and S10 targets, checked on this run's rows.
pub(crate) fn targets(rows: &[Row]) -> String {
    let mut out = String::new();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for redlease in ["redlease/redis", "redlease/fred"] {
        for nodes in [1, 3] {
            for (scenario, _, hold) in S9_CASES {
                let (Some(ours), peer) = (
                    find(rows, scenario, redlease, nodes),
                    find(rows, scenario, "rslock", nodes),
                ) else {
                    continue;
                };
                let (Some(rate), Some(spread)) = (ours.ops_per_s, ours.spread_pct) else {
                    continue;
                };
                if hold.is_zero() {
                    let theirs = peer.and_then(|p| p.ops_per_s);
                    let ratio = theirs.map(|t| rate / t);
                    out.push_str(&format!(
                        "{redlease}: {scenario} {nodes} node(s): {rate:.0} acquisitions/s vs rslock {} = {} \
                         (target ≥ 1), spread {spread:.1} % (rslock {}; target ≤ 25 %): {}\n",
                        theirs.map_or("–".into(), |t| format!("{t:.0}")),
                        ratio.map_or("–".into(), |r| format!("{r:.3}")),
                        peer.and_then(|p| p.spread_pct)
                            .map_or("–".into(), |s| format!("{s:.1} %")),
                        verdict(ratio.is_some_and(|r| r >= 1.0) && spread <= 25.0)
                    ));
                } else if let Some(hold_us) = ours.hold_us {
                    let ideal = 1e6 / hold_us;
                    out.push_str(&format!(
                        "{redlease}: {scenario} {nodes} node(s): {rate:.0} handoffs/s = {:.3} of the ideal \
                         1 / mean hold = {ideal:.0}/s (target ≥ 0.9), spread {spread:.1} %: {}\n",
                        rate / ideal,
                        verdict(rate / ideal >= 0.9)
                    ));
                }
            }
        }
        for nodes in [3, 5] {
            let (Some(ours), Some(peer)) = (
                find(rows, "S10", redlease, nodes),
                find(rows, "S10", "rslock", nodes),
            ) else {
                continue;
            };
            if let (Some(a), Some(b)) = (ours.p50_us, peer.p50_us) {
                out.push_str(&format!(
                    "{redlease}: S10 {nodes} nodes p50 {a:.1} µs vs rslock {b:.1} µs = {:.3}; p99 {} vs {} µs \
                     (target: ahead of rslock, < 1): {}\n",
                    a / b,
                    ours.p99_us.map_or("–".into(), |v| format!("{v:.1}")),
                    peer.p99_us.map_or("–".into(), |v| format!("{v:.1}")),
                    verdict(a < b)
                ));
            }
        }
    }
    out
}
