//! `redlease-bench`: redlease side by side with the raw Redis floor and peer lock crates.
//!
//! Starts its own `redis-server` processes on free loopback ports (never a server already running on the
//! machine), runs scenarios S1–S7 for every implementation, prints a table and the issue's target checks, and
//! writes a JSON array (one object per scenario and implementation) to `--out`, and SVG charts of S1/S2, S3,
//! S5 and S6 to `--charts` (default `target/bench/charts`).
//!
//! ```text
//! redlease-bench [--quick] [--out PATH] [--charts DIR | --no-charts] [--only S1,S4] [--impl raw,redlease/redis]
//!                [--redlease-timer runtime|system|tokio] [--no-restart-check] [--observers] [--valkey] [--replication]
//! ```
//!
//! `--replication` adds to S1 redlease/redis on a Redis 7.0 primary with one replica, without a durability
//! policy (`redlease/redis@replicated`), with `Durability::Required` of one replica (`…+wait1`: `WAIT 1`
//! after each acquisition) and with the restart quarantine off (`…-no-quarantine`: no `run_id` lookup), and
//! prints the server commands each sends per acquire + release pair.
//!
//! `--valkey` adds redlease on Valkey 9.1 (the testkit's `Flavor::Valkey91`; `scripts/fetch-valkey.sh`
//! fetches it) to S1, S3 and S6, on each adapter in the automatic mode (native `DELIFEQ` release; the
//! extension is the script there too, since an extension never shortens a key) and pinned to scripts, each on a Valkey server of its own, with the server's own
//! time per operation from `INFO commandstats` in the JSON (`server_us_per_op`, `server_usec_per_call`,
//! `server_calls`), and prints the server's time per release, extension and fenced acquisition on each path.
//!
//! `--observers` adds four implementations to S1 and S7 only: redlease with a no-op observer and with
//! `MetricsObserver` over the `metrics` no-op recorder (`redlease/redis+noop-observer`,
//! `redlease/redis+metrics`, `redlease/memory+noop-observer`, `redlease/memory+metrics`), to measure what
//! the lease event hook costs. `--no-restart-check` turns the Redlock restart check off for every redlease
//! manager (`Config::with_restart_quarantine(None)`), to measure what it costs: a fred node cannot name its
//! connection, so it reads `INFO` after each won attempt.
//!
//! - S1 uncontended acquire + release on one node (p50/p99);
//! - S2 the same on Redlock over 3 and 5 nodes;
//! - S3 64 tasks on distinct keys through one client (pairs per second);
//! - S4 three nodes, one blackholed by a fault proxy (acquisition p50/p99 against the operation timeout);
//! - S5 8 tasks contending for one key (handoffs per second, release-to-acquisition gap, server commands per
//!   handoff), redlease with and without release notifications;
//! - S5p the same with a 1 ms pause after each release (every handoff goes to a waiting task);
//! - S8 1,000 waiters on 100 held keys (server commands per second while they wait), redlease with and
//!   without notifications;
//! - S6 10,000 self-renewing leases (CPU µs per renewal, heap bytes per lease, server requests per renewal,
//!   lateness of renewals against their schedule), redlease also with renewal batching;
//! - S6L the same with 100,000 leases, for the raw floors and redlease with and without batching;
//! - S7 heap allocations per acquire + release on the in-memory node.
//!
//! The counting global allocator (`stats_alloc`) wraps the system allocator for the whole process, so every
//! implementation pays its (small, atomic-counter) overhead alike.

mod charts;
mod clients;
mod contended;
mod lateness;
mod measure;
mod multi;
mod primitives;
mod report;
mod scenarios;

use std::alloc::System;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use clients::Impl;
use report::Row;
use scenarios::{Env, Plan};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The peer crates and clients, exactly as pinned in `bench/Cargo.toml` / `Cargo.lock`.
const VERSIONS: &str = "redlease 0.1.0 (redis 1.8, fred 10.1); rslock =0.10.0; distributed-lock-redis =0.2.0 (fred 9); \
                        async-redis-lock =0.4.0; tokio 1.x";

/// Command-line options.
struct Args {
    quick: bool,
    out: Option<PathBuf>,
    only: Option<Vec<String>>,
    impls: Option<Vec<String>>,
    timer: clients::TimerChoice,
    observers: bool,
    no_restart_check: bool,
    valkey: bool,
    replication: bool,
    charts: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        quick: false,
        out: None,
        only: None,
        impls: None,
        timer: clients::TimerChoice::Runtime,
        observers: false,
        no_restart_check: false,
        valkey: false,
        replication: false,
        charts: Some(PathBuf::from("target/bench/charts")),
    };
    let mut it = std::env::args().skip(1);
    let list = |v: Option<String>, flag: &str| -> Result<Vec<String>, String> {
        v.map(|s| s.split(',').map(|x| x.trim().to_owned()).collect())
            .ok_or_else(|| format!("{flag} needs a value"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--observers" => args.observers = true,
            "--no-restart-check" => args.no_restart_check = true,
            "--valkey" => args.valkey = true,
            "--replication" => args.replication = true,
            "--out" => args.out = Some(it.next().ok_or("--out needs a path")?.into()),
            "--charts" => args.charts = Some(it.next().ok_or("--charts needs a directory")?.into()),
            "--no-charts" => args.charts = None,
            "--only" => args.only = Some(list(it.next(), "--only")?),
            "--impl" => args.impls = Some(list(it.next(), "--impl")?),
            "--redlease-timer" => match it.next().as_deref() {
                Some("runtime") => args.timer = clients::TimerChoice::Runtime,
                Some("tokio") => args.timer = clients::TimerChoice::Tokio,
                Some("system") => args.timer = clients::TimerChoice::System,
                _ => {
                    return Err(
                        "--redlease-timer takes `runtime` (the default), `system` or `tokio`"
                            .into(),
                    );
                }
            },
            "-h" | "--help" => {
                return Err(
                    "usage: redlease-bench [--quick] [--out PATH] [--charts DIR | --no-charts] [--only S1,S2,…] [--impl raw,redlease/redis,…] [--redlease-timer runtime|system|tokio] [--no-restart-check] [--observers] [--valkey] [--replication]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{model}, {cores} cores, Linux {}", kernel.trim())
}

fn run(args: &Args) -> Result<Vec<Row>, String> {
    let plan = if args.quick { Plan::QUICK } else { Plan::FULL };
    let wanted = |s: &str| args.only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let named = |i: &Impl| {
        args.impls
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == i.name()))
    };
    let impls: Vec<Impl> = Impl::ALL.into_iter().filter(named).collect();
    // S1 and S7 also measure the observer variants with `--observers`.
    let observed: Vec<Impl> = if args.observers {
        if metrics::set_global_recorder(metrics::NoopRecorder).is_err() {
            return Err("a metrics recorder was already installed".into());
        }
        Impl::ALL
            .into_iter()
            .chain(Impl::OBSERVED)
            .filter(named)
            .collect()
    } else {
        impls.clone()
    };
    let mut rows = Vec::new();

    // S7 first, before any runtime or server thread exists to allocate concurrently.
    let mut s7 = Vec::new();
    if wanted("S7") {
        for &imp in &observed {
            s7.push(scenarios::allocations(&plan, imp));
        }
    }

    if redlease_testkit::server::find_redis_server().is_none() {
        return Err("redis-server not found (set $REDIS_SERVER or PATH)".into());
    }
    // `--valkey`: a Valkey 9.1 server of its own per variant (its commandstats count that variant alone).
    let valkey: Vec<Impl> = if args.valkey {
        if redlease_testkit::server::Flavor::Valkey91
            .binary()
            .is_none()
        {
            return Err(
                "--valkey: valkey-server 9.1 not found (run scripts/fetch-valkey.sh, or set $REDLEASE_VALKEY_9_1)"
                    .into(),
            );
        }
        Impl::VALKEY.into_iter().filter(named).collect()
    } else {
        Vec::new()
    };
    let replicated = args.replication.then(|| {
        let primary = redlease_testkit::server::RedisServer::start();
        let replica = primary.start_replica(&[]);
        (primary, replica)
    });
    let env = Env {
        replicated,
        servers: redlease_testkit::server::RedisServers::start(5),
        own: valkey
            .iter()
            .map(|&imp| {
                (
                    imp,
                    redlease_testkit::server::RedisServer::start_flavor(
                        redlease_testkit::server::Flavor::Valkey91,
                        &[],
                    ),
                )
            })
            .collect(),
    };
    // S1, S3 and S6 also measure the Valkey variants.
    let with_valkey: Vec<Impl> = impls.iter().chain(&valkey).copied().collect();
    // S1 and S3 also measure the raw floor with the release's notification.
    let publishing: Vec<Impl> = Impl::PUBLISHING.into_iter().filter(named).collect();
    let observed: Vec<Impl> = observed
        .into_iter()
        .chain(publishing.iter().copied())
        .chain(valkey.iter().copied())
        .collect();
    // S1 also measures the replication variants with `--replication`.
    let observed: Vec<Impl> = if args.replication {
        observed
            .into_iter()
            .chain(Impl::REPLICATION.into_iter().filter(named))
            .collect()
    } else {
        observed
    };
    let redis_version = env.servers[0]
        .try_cmd(&["INFO", "server"])
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("machine: {}", machine());
    println!(
        "load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "redis-server {redis_version} ×5 on ports {:?}",
        env.servers.iter().map(|s| s.port()).collect::<Vec<_>>()
    );
    if !env.own.is_empty() {
        println!(
            "valkey-server 9.1.2 ×{} on ports {:?}",
            env.own.len(),
            env.own.iter().map(|(_, s)| s.port()).collect::<Vec<_>>()
        );
    }
    println!("versions: {VERSIONS}");
    println!("plan: {}", if args.quick { "quick" } else { "full" });
    println!(
        "redlease timer: {}",
        match args.timer {
            clients::TimerChoice::Runtime => {
                "RuntimeTimer (what the adapters' one-line managers choose: tokio's timer on tokio)"
            }
            clients::TimerChoice::Tokio =>
                "tokio's timer without a wall clock (no suspend detection)",
            clients::TimerChoice::System => "SystemTimer (core's default: redlease's timer thread)",
        }
    );
    if args.no_restart_check {
        println!(
            "redlease restart check: off (--no-restart-check: Config::with_restart_quarantine(None))"
        );
    }

    let cpu = measure::CpuClock::new();
    let mut step = |row: Row| {
        eprintln!("  {} {:<23} done", row.scenario, row.imp);
        rows.push(row);
    };
    if wanted("S1") {
        scenarios::latency(&env, &plan, &observed, 1)
            .into_iter()
            .for_each(&mut step);
    }
    if wanted("S2") {
        for nodes in [3, 5] {
            scenarios::latency(&env, &plan, &impls, nodes)
                .into_iter()
                .for_each(&mut step);
        }
    }
    if wanted("S3") {
        for &imp in with_valkey.iter().chain(&publishing) {
            step(scenarios::throughput(&env, &plan, imp));
        }
    }
    // The fred floor is for S1–S3 and S6 (where redlease/fred is compared with its own client).
    let peers: Vec<Impl> = impls
        .iter()
        .copied()
        .filter(|&i| i != Impl::RawFred)
        .collect();
    if wanted("S4") {
        for &imp in &peers {
            step(scenarios::hung_node(&env, &plan, imp));
        }
    }
    // S5 and S8 also measure redlease with notifications off (waiting by polling).
    let waiting: Vec<Impl> = peers
        .iter()
        .copied()
        .chain(Impl::POLLING.into_iter().filter(named))
        .collect();
    if wanted("S5") {
        for &imp in &waiting {
            step(scenarios::contention(&env, &plan, imp, None));
        }
    }
    if wanted("S5p") {
        let pause = Some(std::time::Duration::from_millis(1));
        for &imp in waiting
            .iter()
            .filter(|i| i.redlease() || matches!(i, Impl::Raw))
        {
            step(scenarios::contention(&env, &plan, imp, pause));
        }
    }
    if wanted("S8") {
        let s8: Vec<Impl> = waiting
            .iter()
            .copied()
            .filter(|i| i.redlease())
            .chain(Impl::LONG_CAP.into_iter().filter(named))
            .collect();
        for imp in s8 {
            step(scenarios::waiting(&env, &plan, imp));
        }
    }
    // S6 also measures redlease with renewal batching; S6L (100,000 leases) the floors and redlease with and
    // without batching.
    let batched: Vec<Impl> = Impl::BATCHED.into_iter().filter(named).collect();
    if wanted("S6") {
        for &imp in with_valkey.iter().chain(&batched) {
            step(scenarios::renewal(&env, &plan, imp, cpu, plan.s6()));
        }
    }
    // S9 and S10 (issue 26): many contenders on one key, and uncontended Redlock cycles over many pairs.
    for case in contended::S9_CASES {
        if !(wanted("S9") || wanted(case.0)) {
            continue;
        }
        // The polling variants only when named (`--impl redlease/redis+poll`): what notifications cost or
        // give under contention, without lengthening the full plan.
        let polling = Impl::POLLING.into_iter().filter(|i| {
            args.impls
                .as_ref()
                .is_some_and(|o| o.iter().any(|x| x == i.name()))
        });
        for nodes in [1, 3] {
            for imp in peers.iter().copied().chain(polling.clone()) {
                step(contended::contended(&env, &plan, imp, case, nodes));
            }
        }
    }
    if wanted("S10") {
        contended::redlock_cycles(&env, &plan, &peers)
            .into_iter()
            .for_each(&mut step);
    }
    if wanted("S6L") {
        let large = [
            Impl::Raw,
            Impl::RawFred,
            Impl::RedleaseRedis,
            Impl::RedleaseRedisBatch,
            Impl::RedleaseFred,
            Impl::RedleaseFredBatch,
        ];
        for imp in large.into_iter().filter(named) {
            step(scenarios::renewal(&env, &plan, imp, cpu, plan.s6l()));
        }
    }
    // Issue 25's primitives (semaphore, read/write and fair locks): own scenario ids.
    if wanted("SEM") || wanted("RW") {
        primitives::cycles(&env, &plan)
            .into_iter()
            .filter(|r| wanted(r.scenario))
            .for_each(&mut step);
    }
    if wanted("FAIR") {
        primitives::fair(&env, &plan)
            .into_iter()
            .for_each(&mut step);
    }
    if wanted("SM") {
        multi::lock_all(&env, &plan).into_iter().for_each(&mut step);
    }
    if args.valkey {
        match scenarios::valkey_costs(&plan) {
            Ok(lines) => {
                println!(
                    "server cost per operation on Valkey 9.1 (one redis-rs node, sequential):"
                );
                for line in lines {
                    println!("  {line}");
                }
            }
            Err(e) => println!("valkey costs failed: {e}"),
        }
    }
    if args.replication && wanted("S1") {
        match scenarios::replication_costs(&env, &plan) {
            Ok(lines) => {
                println!("server commands per pair on the replicated primary (--replication):");
                for line in lines {
                    println!("  {line}");
                }
            }
            Err(e) => println!("replication costs failed: {e}"),
        }
    }
    if wanted("S1") {
        match scenarios::attribution(&env, &plan) {
            Ok(lines) => {
                println!("attribution (one redis-rs connection, sequential):");
                for line in lines {
                    println!("  {line}");
                }
            }
            Err(e) => println!("attribution failed: {e}"),
        }
    }
    rows.extend(s7);
    Ok(rows)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    clients::TIMER.store(args.timer as u8, std::sync::atomic::Ordering::Relaxed);
    clients::NO_RESTART_CHECK.store(args.no_restart_check, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let rows = match run(&args) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!();
    print!("{}", report::to_table(&rows));
    println!();
    println!("targets (issue 5):");
    print!("{}", report::targets(&rows));
    println!("targets (issue 14, waiting):");
    print!("{}", report::push_targets(&rows));
    println!("targets (issue 15, scale):");
    print!("{}", report::scale_targets(&rows));
    println!("targets (issue 26, S9 and S10):");
    print!("{}", contended::targets(&rows));
    if args.observers {
        println!("lease event hook (--observers):");
        print!("{}", report::observer_costs(&rows));
    }
    if args.valkey {
        println!("native against scripts on Valkey 9.1 (--valkey):");
        print!("{}", report::valkey_comparison(&rows));
    }
    if let Some(dir) = &args.charts {
        match charts::write_all(&rows, dir) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("charts: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("total time: {:.1} s", started.elapsed().as_secs_f64());
    let json = report::to_json(&rows);
    match &args.out {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && let Err(e) = std::fs::create_dir_all(dir)
            {
                eprintln!("create {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
            if let Err(e) = std::fs::write(path, json) {
                eprintln!("write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", path.display());
        }
        None => print!("{json}"),
    }
    ExitCode::SUCCESS
}
