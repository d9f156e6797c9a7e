//! Result rows: the stdout table, the JSON array and the target checks.

use std::fmt::Write as _;

/// The quantiles a row's `dist_us` holds.
pub(crate) const DIST_QUANTILES: [f64; 7] = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99];

/// One (scenario, implementation) result. `None` figures are `null` in JSON and `-` in the table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Row {
    /// `"S1"` … `"S7"`.
    pub(crate) scenario: &'static str,
    /// The implementation's name (`"raw"`, `"redlease/redis"`, …).
    pub(crate) imp: &'static str,
    /// Redis nodes involved (`None` for the in-memory node).
    pub(crate) nodes: Option<u32>,
    /// Median latency in µs (S5: release-to-next-acquisition gap).
    pub(crate) p50_us: Option<f64>,
    /// 99th percentile latency in µs (S5: gap).
    pub(crate) p99_us: Option<f64>,
    /// Operations per second (S3: acquire + release pairs; S5: handoffs).
    pub(crate) ops_per_s: Option<f64>,
    /// S4: the operation timeout bounding one acquisition round, in µs.
    pub(crate) bound_us: Option<f64>,
    /// S6: heap bytes per held, renewing lease.
    pub(crate) bytes_per_lease: Option<f64>,
    /// S6: process CPU time per renewal, in µs.
    pub(crate) cpu_us_per_renewal: Option<f64>,
    /// S3: process CPU time per acquire + release pair, in µs.
    pub(crate) cpu_us_per_op: Option<f64>,
    /// S7: heap allocations per acquire + release (S3: of the whole process, per pair).
    pub(crate) allocs_per_op: Option<f64>,
    /// The server the row ran on when it had one of its own (`--valkey`: `"valkey-9.1.2"`); `None` for the
    /// shared Redis servers.
    pub(crate) server: Option<&'static str>,
    /// On a server of its own: per lock command sent, its calls and the server's `usec_per_call`
    /// (`INFO commandstats`), over the scenario (S1: every pair, warm-ups included; S3: the measured
    /// window; S6: the renewal window).
    pub(crate) server_commands: Vec<(&'static str, u64, f64)>,
    /// The server's time (`usec` of those commands but `EVAL`, the once-per-connection check) per operation:
    /// per pair (S1, S3) or per renewal (S6).
    pub(crate) server_us_per_op: Option<f64>,
    /// S5: mean time a lease was held, in µs (acquisition returned to release returned).
    pub(crate) hold_us: Option<f64>,
    /// S5: commands the server executed per handoff (script-inner commands included).
    pub(crate) cmds_per_op: Option<f64>,
    /// S5 (redlease): node calls per handoff.
    pub(crate) calls_per_op: Option<f64>,
    /// S8: commands the server executed per second while the waiters waited.
    pub(crate) cmds_per_s: Option<f64>,
    /// S8 (redlease): node calls per second while the waiters waited.
    pub(crate) calls_per_s: Option<f64>,
    /// S6, S6L: leases held at once.
    pub(crate) leases: Option<u64>,
    /// S6, S6L: median lateness of a renewal round's start against its schedule, in µs.
    pub(crate) lateness_p50_us: Option<f64>,
    /// S6, S6L: 99th percentile of that lateness, in µs.
    pub(crate) lateness_p99_us: Option<f64>,
    /// S9: the spread of wins per task, (max − min) / mean, in %.
    pub(crate) spread_pct: Option<f64>,
    /// S1, S2, S3, S5: the latency distribution (S5: the gap) at [`DIST_QUANTILES`], in µs, for the charts.
    pub(crate) dist_us: Vec<f64>,
    /// How the figure was obtained, what bounds it, or why there is none.
    pub(crate) note: String,
}

impl Row {
    /// A row without figures.
    pub(crate) fn new(scenario: &'static str, imp: &'static str, nodes: Option<u32>) -> Self {
        Self {
            scenario,
            imp,
            nodes,
            ..Self::default()
        }
    }
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => {
            if x.fract() == 0.0 && x.abs() < 1e15 {
                format!("{x:.0}")
            } else {
                format!("{x:.3}")
            }
        }
        _ => "null".to_owned(),
    }
}

fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON object of one number per lock command (`null` when the row has no server of its own).
fn per_command(r: &Row, f: impl Fn(&(&'static str, u64, f64)) -> String) -> String {
    if r.server.is_none() {
        return "null".to_owned();
    }
    let fields: Vec<String> = r
        .server_commands
        .iter()
        .map(|c| format!("{}: {}", string(c.0), f(c)))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// The rows as a JSON array, one object per row, with the issue's keys.
pub(crate) fn to_json(rows: &[Row]) -> String {
    let mut out = String::from("[\n");
    for (i, r) in rows.iter().enumerate() {
        let nodes = r.nodes.map_or("null".to_owned(), |n| n.to_string());
        let server = r.server.map_or("null".to_owned(), string);
        let _ = write!(
            out,
            "  {{\"scenario\": {}, \"impl\": {}, \"nodes\": {nodes}, \"p50_us\": {}, \"p99_us\": {}, \
             \"ops_per_s\": {}, \"bound_us\": {}, \"bytes_per_lease\": {}, \"cpu_us_per_renewal\": {}, \
             \"cpu_us_per_op\": {}, \"allocs_per_op\": {}, \"server\": {server}, \"server_us_per_op\": {}, \
             \"server_usec_per_call\": {}, \"server_calls\": {}, \"hold_us\": {}, \"cmds_per_op\": {}, \
             \"calls_per_op\": {}, \"cmds_per_s\": {}, \"calls_per_s\": {}, \"leases\": {}, \
             \"lateness_p50_us\": {}, \"lateness_p99_us\": {}, \"spread_pct\": {}, \"dist_us\": {}, \"note\": {}}}",
            string(r.scenario),
            string(r.imp),
            num(r.p50_us),
            num(r.p99_us),
            num(r.ops_per_s),
            num(r.bound_us),
            num(r.bytes_per_lease),
            num(r.cpu_us_per_renewal),
            num(r.cpu_us_per_op),
            num(r.allocs_per_op),
            num(r.server_us_per_op),
            per_command(r, |c| num(Some(c.2))),
            per_command(r, |c| c.1.to_string()),
            num(r.hold_us),
            num(r.cmds_per_op),
            num(r.calls_per_op),
            num(r.cmds_per_s),
            num(r.calls_per_s),
            r.leases.map_or("null".to_owned(), |n| n.to_string()),
            num(r.lateness_p50_us),
            num(r.lateness_p99_us),
            num(r.spread_pct),
            if r.dist_us.is_empty() {
                "null".to_owned()
            } else {
                format!(
                    "{{{}}}",
                    DIST_QUANTILES
                        .iter()
                        .zip(&r.dist_us)
                        .map(|(q, v)| format!("\"p{}\": {}", q * 100.0, num(Some(*v))))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            string(&r.note),
        );
        out.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    out.push_str("]\n");
    out
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or("-".to_owned(), |x| format!("{x:.decimals$}"))
}

/// The rows as a fixed-width text table.
pub(crate) fn to_table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<33} {:>5} {:>7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>10} {:>9}  note",
        "",
        "impl",
        "nodes",
        "leases",
        "p50 µs",
        "p99 µs",
        "ops/s",
        "bound µs",
        "B/lease",
        "CPU µs/op",
        "allocs",
        "srv µs/op",
        "hold µs",
        "cmds/op",
        "calls/op",
        "cmds/s",
        "late p99"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<9} {:<33} {:>5} {:>7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>10} {:>9}  {}{}",
            r.scenario,
            r.imp,
            r.nodes.map_or("-".to_owned(), |n| n.to_string()),
            r.leases.map_or("-".to_owned(), |n| n.to_string()),
            cell(r.p50_us, 1),
            cell(r.p99_us, 1),
            cell(r.ops_per_s, 0),
            cell(r.bound_us, 0),
            cell(r.bytes_per_lease, 0),
            cell(r.cpu_us_per_renewal.or(r.cpu_us_per_op), 2),
            cell(r.allocs_per_op, 1),
            cell(r.server_us_per_op, 2),
            cell(r.hold_us, 0),
            cell(r.cmds_per_op, 2),
            cell(r.calls_per_op, 3),
            cell(r.cmds_per_s, 0),
            cell(r.lateness_p99_us, 0),
            r.note,
            server_line(r)
        );
    }
    out
}

/// `; on valkey-9.1.2: set 2000 × 1.02 µs, delifeq …` for a row with a server of its own.
fn server_line(r: &Row) -> String {
    let Some(server) = r.server else {
        return String::new();
    };
    let commands: Vec<String> = r
        .server_commands
        .iter()
        .map(|(c, calls, per)| format!("{c} {calls} × {per:.2} µs"))
        .collect();
    format!("; on {server} (commandstats): {}", commands.join(", "))
}

/// Native against scripts on Valkey, per scenario and adapter: latency, throughput and the server's time
/// per operation, as ratios within this run (`--valkey`).
pub(crate) fn valkey_comparison(rows: &[Row]) -> String {
    let mut out = String::new();
    for adapter in ["redis", "fred"] {
        let native = format!("redlease/{adapter}@valkey-9.1:native");
        let scripts = format!("redlease/{adapter}@valkey-9.1:scripts");
        for (scenario, what) in [
            ("S1", "pair p50"),
            ("S3", "ops/s"),
            ("S6", "CPU µs per renewal"),
        ] {
            let (n, s) = (
                find(rows, scenario, &native, Some(1)),
                find(rows, scenario, &scripts, Some(1)),
            );
            let figure = |r: Option<&Row>| {
                r.and_then(|r| match scenario {
                    "S1" => r.p50_us,
                    "S3" => r.ops_per_s,
                    _ => r.cpu_us_per_renewal,
                })
            };
            let server = |r: Option<&Row>| r.and_then(|r| r.server_us_per_op);
            let _ = writeln!(
                out,
                "{scenario} redlease/{adapter} on Valkey 9.1: {what} native {} / scripts {} = {}; server µs per op \
                 native {} / scripts {} = {}",
                cell(figure(n), 2),
                cell(figure(s), 2),
                fmt_ratio(ratio(figure(n), figure(s))),
                cell(server(n), 2),
                cell(server(s), 2),
                fmt_ratio(ratio(server(n), server(s)))
            );
        }
    }
    out
}

fn find<'a>(rows: &'a [Row], scenario: &str, imp: &str, nodes: Option<u32>) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.imp == imp && (nodes.is_none() || r.nodes == nodes))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "no data",
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".to_owned(), |r| format!("{r:.3}×"))
}

/// The issue's targets, checked against this run, for both adapters.
/// What an observer costs: S1 p50 and S7 allocations of the observer variants against plain redlease.
pub(crate) fn observer_costs(rows: &[Row]) -> String {
    let mut out = String::new();
    for variant in ["redlease/redis+noop-observer", "redlease/redis+metrics"] {
        let base = find(rows, "S1", "redlease/redis", Some(1));
        let with = find(rows, "S1", variant, Some(1));
        for (what, f) in [
            ("p50", (|r: &Row| r.p50_us) as fn(&Row) -> Option<f64>),
            ("p99", |r: &Row| r.p99_us),
        ] {
            let _ = writeln!(
                out,
                "S1 {what} {variant} / redlease/redis = {}",
                fmt_ratio(ratio(with.and_then(f), base.and_then(f)))
            );
        }
    }
    for variant in ["redlease/memory+noop-observer", "redlease/memory+metrics"] {
        let base = find(rows, "S7", "redlease/memory", None);
        let with = find(rows, "S7", variant, None);
        let allocs = |r: Option<&Row>| r.and_then(|r| r.allocs_per_op);
        let p50 = |r: Option<&Row>| r.and_then(|r| r.p50_us);
        let _ = writeln!(
            out,
            "S7 {variant}: {} allocations per pair (redlease/memory: {}); pair p50 {} µs / {} µs = {}",
            cell(allocs(with), 1),
            cell(allocs(base), 1),
            cell(p50(with), 2),
            cell(p50(base), 2),
            fmt_ratio(ratio(p50(with), p50(base)))
        );
    }
    out
}

/// Issue 14's targets for waiting with notifications: S5 against the polling variant and the round trip, S8.
pub(crate) fn push_targets(rows: &[Row]) -> String {
    let mut out = String::new();
    // One round trip: half the raw floor's S1 pair (SET NX PX, then the release script).
    let rtt = find(rows, "S1", "raw", Some(1))
        .and_then(|r| r.p50_us)
        .map(|p| p / 2.0);
    for (push, poll) in [
        ("redlease/redis", "redlease/redis+poll"),
        ("redlease/fred", "redlease/fred+poll"),
    ] {
        let s5 = find(rows, "S5", push, Some(1));
        let s5p = find(rows, "S5", poll, Some(1));
        let gap = s5.and_then(|r| r.p50_us);
        let in_rtt = ratio(gap, rtt);
        let _ = writeln!(
            out,
            "{push}: S5 gap p50 {} µs = {} round trips (raw S1 p50 / 2 = {} µs; target ≤ 3): {}",
            cell(gap, 1),
            in_rtt.map_or("-".into(), |r| format!("{r:.2}")),
            cell(rtt, 1),
            verdict(in_rtt.map(|r| r <= 3.0))
        );
        let ideal = s5
            .and_then(|r| r.hold_us.zip(r.p50_us))
            .map(|(h, g)| 1e6 / (h + g));
        let r = ratio(s5.and_then(|r| r.ops_per_s), ideal);
        let _ = writeln!(
            out,
            "{push}: S5 {} handoffs/s = {} of the ideal 1 / (mean hold + gap p50) = {}/s (target ≥ 0.8×): {}",
            cell(s5.and_then(|r| r.ops_per_s), 0),
            fmt_ratio(r),
            cell(ideal, 0),
            verdict(r.map(|r| r >= 0.8))
        );
        let r = ratio(
            s5.and_then(|r| r.cmds_per_op),
            s5p.and_then(|r| r.cmds_per_op),
        );
        let _ = writeln!(
            out,
            "{push}: S5 server commands per handoff {} vs {poll} {} = {} (target ≤ 0.5×): {}; node calls per \
             handoff {} vs {}; gap p50 vs polling {}",
            cell(s5.and_then(|r| r.cmds_per_op), 2),
            cell(s5p.and_then(|r| r.cmds_per_op), 2),
            fmt_ratio(r),
            verdict(r.map(|r| r <= 0.5)),
            cell(s5.and_then(|r| r.calls_per_op), 2),
            cell(s5p.and_then(|r| r.calls_per_op), 2),
            fmt_ratio(ratio(gap, s5p.and_then(|r| r.p50_us))),
        );
        let p = find(rows, "S5p", push, Some(1));
        let pp = find(rows, "S5p", poll, Some(1));
        let _ = writeln!(
            out,
            "{push}: S5p (releaser pauses 1 ms) gap p50 {} µs vs {poll} {} µs = {}; p99 {} vs {} µs; handoffs/s {} \
             vs {}; server commands per handoff {} vs {} = {}",
            cell(p.and_then(|r| r.p50_us), 1),
            cell(pp.and_then(|r| r.p50_us), 1),
            fmt_ratio(ratio(p.and_then(|r| r.p50_us), pp.and_then(|r| r.p50_us))),
            cell(p.and_then(|r| r.p99_us), 1),
            cell(pp.and_then(|r| r.p99_us), 1),
            cell(p.and_then(|r| r.ops_per_s), 0),
            cell(pp.and_then(|r| r.ops_per_s), 0),
            cell(p.and_then(|r| r.cmds_per_op), 2),
            cell(pp.and_then(|r| r.cmds_per_op), 2),
            fmt_ratio(ratio(
                p.and_then(|r| r.cmds_per_op),
                pp.and_then(|r| r.cmds_per_op)
            )),
        );
        let s8 = find(rows, "S8", push, Some(1)).and_then(|r| r.cmds_per_s);
        let s8p = find(rows, "S8", poll, Some(1)).and_then(|r| r.cmds_per_s);
        let _ = writeln!(
            out,
            "{push}: S8 server commands/s while 1,000 wait {} vs {poll} {} = {}",
            cell(s8, 0),
            cell(s8p, 0),
            fmt_ratio(ratio(s8, s8p))
        );
    }
    let cap = find(rows, "S8", "redlease/redis, 10 s cap", Some(1)).and_then(|r| r.cmds_per_s);
    let poll = find(rows, "S8", "redlease/redis+poll", Some(1)).and_then(|r| r.cmds_per_s);
    let _ = writeln!(
        out,
        "redlease/redis with max_retry_delay 10 s: S8 server commands/s {} vs polling {} = {}",
        cell(cap, 0),
        cell(poll, 0),
        fmt_ratio(ratio(cap, poll))
    );
    out
}

/// Issue 15's targets: S3 against raw, redlease/fred against the fred floor in S1–S3, and S6/S6L with and
/// without renewal batching (bytes per lease, client CPU per renewal against the floor's per-key script
/// call, server requests per renewal, p99 lateness against the batching window).
pub(crate) fn scale_targets(rows: &[Row]) -> String {
    let mut out = String::new();
    let ops = |imp: &str| find(rows, "S3", imp, Some(1)).and_then(|r| r.ops_per_s);
    for imp in ["redlease/redis", "redlease/fred"] {
        let r = ratio(ops(imp), ops("raw"));
        let _ = writeln!(
            out,
            "{imp}: S3 {} / raw {} ops/s = {} (target ≥ 0.95× for redlease/redis): {}",
            cell(ops(imp), 0),
            cell(ops("raw"), 0),
            fmt_ratio(r),
            if imp == "redlease/redis" {
                verdict(r.map(|r| r >= 0.95))
            } else {
                "-"
            }
        );
    }
    let r = ratio(ops("redlease/redis"), ops("raw+publish"));
    let _ = writeln!(
        out,
        "redlease/redis: S3 {} / raw+publish {} ops/s = {} (the floor with the release's notification)",
        cell(ops("redlease/redis"), 0),
        cell(ops("raw+publish"), 0),
        fmt_ratio(r)
    );
    // Higher is better for the floor ÷ redlease/fred latency ratio and for the throughput ratio.
    for (scenario, nodes) in [("S1", 1), ("S2", 3), ("S2", 5)] {
        let p50 = |imp: &str| find(rows, scenario, imp, Some(nodes)).and_then(|r| r.p50_us);
        let r = ratio(p50("raw-fred"), p50("redlease/fred"));
        let _ = writeln!(
            out,
            "redlease/fred: {scenario} {nodes}-node p50 {} µs vs raw-fred {} µs: raw-fred / redlease/fred = {} \
             (target ≥ 0.9×): {}",
            cell(p50("redlease/fred"), 1),
            cell(p50("raw-fred"), 1),
            fmt_ratio(r),
            verdict(r.map(|r| r >= 0.9))
        );
    }
    let r = ratio(ops("redlease/fred"), ops("raw-fred"));
    let _ = writeln!(
        out,
        "redlease/fred: S3 {} / raw-fred {} ops/s = {} (target ≥ 0.9×): {}",
        cell(ops("redlease/fred"), 0),
        cell(ops("raw-fred"), 0),
        fmt_ratio(r),
        verdict(r.map(|r| r >= 0.9))
    );
    let window_us = crate::clients::BATCH_WINDOW.as_secs_f64() * 1e6;
    for scenario in ["S6", "S6L"] {
        let floor_cpu =
            |imp: &str| find(rows, scenario, imp, Some(1)).and_then(|r| r.cpu_us_per_renewal);
        for (imp, floor) in [
            ("redlease/redis", "raw"),
            ("redlease/redis+batch", "raw"),
            ("redlease/fred", "raw-fred"),
            ("redlease/fred+batch", "raw-fred"),
        ] {
            let Some(row) = find(rows, scenario, imp, Some(1)) else {
                continue;
            };
            let leases = row.leases.map_or("-".to_owned(), |n| n.to_string());
            let bytes = row.bytes_per_lease;
            let cpu = ratio(row.cpu_us_per_renewal, floor_cpu(floor));
            let cpu_raw = ratio(row.cpu_us_per_renewal, floor_cpu("raw"));
            let calls = row.calls_per_op;
            let late = row.lateness_p99_us;
            let batched = imp.ends_with("+batch");
            let _ = writeln!(
                out,
                "{imp}: {scenario} {leases} leases: {} B/lease (target ≤ 1024): {}; CPU {} µs/renewal = {} of \
                 {floor}'s {} µs ({} of raw's; target ≤ 0.5×): {}; {} requests/renewal (target ≤ 0.05): {}; \
                 lateness p50 {} / p99 {} µs{}",
                cell(bytes, 1),
                verdict(bytes.map(|b| b <= 1024.0)),
                cell(row.cpu_us_per_renewal, 2),
                fmt_ratio(cpu),
                cell(floor_cpu(floor), 2),
                fmt_ratio(cpu_raw),
                verdict(cpu.map(|r| r <= 0.5)),
                cell(calls, 4),
                verdict(calls.map(|c| c <= 0.05)),
                cell(row.lateness_p50_us, 0),
                cell(late, 0),
                if batched {
                    format!(
                        " (target ≤ the {window_us:.0} µs window): {}",
                        verdict(late.map(|l| l <= window_us))
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    out
}

pub(crate) fn targets(rows: &[Row]) -> String {
    let mut out = String::new();
    for imp in ["redlease/redis", "redlease/fred"] {
        let s1 = find(rows, "S1", imp, Some(1)).and_then(|r| r.p50_us);
        let raw1 = find(rows, "S1", "raw", Some(1)).and_then(|r| r.p50_us);
        let r = ratio(s1, raw1);
        let _ = writeln!(
            out,
            "{imp}: S1 p50 / raw p50 = {} (target ≤ 1.10×): {}",
            fmt_ratio(r),
            verdict(r.map(|r| r <= 1.10))
        );
        let s2 = find(rows, "S2", imp, Some(3)).and_then(|r| r.p50_us);
        let rs = find(rows, "S2", "rslock", Some(3)).and_then(|r| r.p50_us);
        let r = ratio(s2, s1);
        let _ = writeln!(
            out,
            "{imp}: S2 3-node p50 / own S1 p50 = {} (target ≤ 1.3×): {}; vs rslock 3-node p50 {} µs: {}",
            fmt_ratio(r),
            verdict(r.map(|r| r <= 1.3)),
            cell(rs, 1),
            verdict(s2.zip(rs).map(|(a, b)| a < b))
        );
        let s3 = find(rows, "S3", imp, Some(1)).and_then(|r| r.ops_per_s);
        let raw3 = find(rows, "S3", "raw", Some(1)).and_then(|r| r.ops_per_s);
        let r = ratio(s3, raw3);
        let _ = writeln!(
            out,
            "{imp}: S3 ops/s / raw ops/s = {} (target ≥ 0.9×): {}",
            fmt_ratio(r),
            verdict(r.map(|r| r >= 0.9))
        );
        let s4 = find(rows, "S4", imp, Some(3));
        let p99 = s4.and_then(|r| r.p99_us);
        let bound = s4.and_then(|r| r.bound_us);
        let _ = writeln!(
            out,
            "{imp}: S4 p99 {} µs vs operation timeout {} µs + 5 ms: {}",
            cell(p99, 1),
            cell(bound, 0),
            verdict(p99.zip(bound).map(|(p, b)| p <= b + 5000.0))
        );
        let s6 = find(rows, "S6", imp, Some(1)).and_then(|r| r.bytes_per_lease);
        let _ = writeln!(
            out,
            "{imp}: S6 {} bytes per held lease (target ≤ 1024): {}",
            cell(s6, 0),
            verdict(s6.map(|b| b <= 1024.0))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_key_and_nulls() {
        let mut row = Row::new("S1", "raw", Some(1));
        row.p50_us = Some(12.5);
        row.note = "a \"quoted\" note".into();
        let json = to_json(&[row, Row::new("S7", "rslock", None)]);
        for key in [
            "scenario",
            "impl",
            "nodes",
            "p50_us",
            "p99_us",
            "ops_per_s",
            "bound_us",
            "bytes_per_lease",
            "cpu_us_per_renewal",
            "cpu_us_per_op",
            "allocs_per_op",
            "server",
            "server_us_per_op",
            "server_usec_per_call",
            "server_calls",
            "hold_us",
            "cmds_per_op",
            "calls_per_op",
            "cmds_per_s",
            "calls_per_s",
            "leases",
            "lateness_p50_us",
            "lateness_p99_us",
            "spread_pct",
            "dist_us",
            "note",
        ] {
            assert_eq!(json.matches(&format!("\"{key}\":")).count(), 2, "{key}");
        }
        assert!(json.contains("\"p50_us\": 12.500"));
        assert!(json.contains("\"nodes\": null"));
        assert!(json.contains("a \\\"quoted\\\" note"));
        assert!(json.contains("\"server\": null"));
    }

    #[test]
    fn json_has_the_server_cost_of_a_row_with_a_server_of_its_own() {
        let mut row = Row::new("S1", "redlease/redis@valkey-9.1:native", Some(1));
        row.server = Some("valkey-9.1.2");
        row.server_commands = vec![("set", 10, 1.25), ("delifeq", 10, 0.5)];
        row.server_us_per_op = Some(1.75);
        let json = to_json(&[row]);
        assert!(json.contains("\"server\": \"valkey-9.1.2\""), "{json}");
        assert!(
            json.contains("\"server_usec_per_call\": {\"set\": 1.250, \"delifeq\": 0.500}"),
            "{json}"
        );
        assert!(
            json.contains("\"server_calls\": {\"set\": 10, \"delifeq\": 10}"),
            "{json}"
        );
        assert!(json.contains("\"server_us_per_op\": 1.750"), "{json}");
    }
}
