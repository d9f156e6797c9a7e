//! Multi-process contention: several `redlease-worker` OS processes contend for one lock on the same
//! temporary servers, each doing a non-atomic read-modify-write of a counter under the lock.
//!
//! Must hold: every round has exactly one holder (every counter value is read by exactly one holder), no update
//! is lost (final counter = total rounds), the reported holder intervals (`CLOCK_REALTIME`, shared by all
//! processes) never overlap, and in single mode the fencing tokens increase in holding order. The hundred-
//! acquirer runs put 25 acquiring tasks in each of four processes. A control run without the lock shows that
//! the counter check does detect lost updates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use redlease_testkit::server::{Flavor, RedisServers, on_each_flavor};
use support::{Worker, field};

#[derive(Debug, Clone)]
struct Hold {
    id: String,
    start: u128,
    end: u128,
    read: i64,
    fence: Option<u64>,
    held: bool,
}

fn parse_hold(line: &str) -> Hold {
    let fence: String = field(line, "fence");
    Hold {
        id: field(line, "id"),
        start: field(line, "start"),
        end: field(line, "end"),
        read: field(line, "read"),
        fence: fence.parse().ok(),
        held: field(line, "held"),
    }
}

/// Runs `procs` workers of `tasks` acquirers each for `rounds` rounds per acquirer and returns their holds and
/// the final counter.
fn run_workers(
    servers: &RedisServers,
    mode: &str,
    procs: usize,
    tasks: u64,
    rounds: u64,
    unlocked: bool,
) -> (Vec<Hold>, i64) {
    let urls = servers.urls().join(",");
    let fence_key = if mode == "single" { "chaos:fence" } else { "" };
    let rounds_text = rounds.to_string();
    let tasks_text = tasks.to_string();
    let mut workers: Vec<Worker> = (0..procs)
        .map(|i| {
            let seed = (i + 1).to_string();
            Worker::spawn(
                &format!("p{i}"),
                &[
                    "--role",
                    "contend",
                    "--mode",
                    mode,
                    "--nodes",
                    &urls,
                    "--rounds",
                    &rounds_text,
                    "--fence-key",
                    fence_key,
                    "--seed",
                    &seed,
                    "--unlocked",
                    if unlocked { "true" } else { "false" },
                    "--tasks",
                    &tasks_text,
                ],
            )
        })
        .collect();
    // Start them together, so that they really contend.
    for w in &mut workers {
        w.expect("READY", Duration::from_secs(30));
    }
    for w in &mut workers {
        w.send("go");
    }
    let mut holds = Vec::new();
    for w in &mut workers {
        w.expect("DONE", Duration::from_secs(180));
        w.wait_success(Duration::from_secs(10));
        let mine: Vec<Hold> = w
            .seen
            .iter()
            .filter(|l| l.starts_with("HOLD"))
            .map(|l| parse_hold(l))
            .collect();
        assert_eq!(
            mine.len() as u64,
            tasks * rounds,
            "worker {} reported {} rounds",
            w.name,
            mine.len()
        );
        holds.extend(mine);
    }
    let counter: i64 = servers[0]
        .cmd(&["GET", "chaos:counter"])
        .parse()
        .unwrap_or(0);
    (holds, counter)
}

fn show(h: &Hold, origin: u128) -> String {
    format!(
        "{} [{:.3} ms, {:.3} ms) read {} fence {:?}",
        h.id,
        (h.start - origin) as f64 / 1e6,
        (h.end - origin) as f64 / 1e6,
        h.read,
        h.fence
    )
}

/// [`contention_on`] on every server of the matrix (concurrently, see `on_each_flavor`).
fn contention(test: &str, mode: &str, n_servers: usize, procs: usize, tasks: u64, rounds: u64) {
    on_each_flavor(test, &Flavor::ALL, |flavor| {
        contention_on(test, flavor, mode, n_servers, procs, tasks, rounds);
    });
}

fn contention_on(
    test: &str,
    flavor: Flavor,
    mode: &str,
    n_servers: usize,
    procs: usize,
    tasks: u64,
    rounds: u64,
) {
    let servers = RedisServers::start_flavor(flavor, n_servers);
    let t0 = std::time::Instant::now();
    let (mut holds, counter) = run_workers(&servers, mode, procs, tasks, rounds, false);
    let total = procs as i64 * tasks as i64 * rounds as i64;
    holds.sort_by_key(|h| h.start);
    let origin = holds[0].start;

    // Every holder still believed it held the lease when it finished its update (the TTL is 10 s, the work
    // a few ms): the non-overlap below is promised only for believed intervals.
    for h in &holds {
        assert!(h.held, "{mode}: the lease lapsed during a round: {h:?}");
    }
    // Holder intervals from different processes never overlap.
    for pair in holds.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "{mode}: two holders at once:\n  {}\n  {}",
            show(&pair[0], origin),
            show(&pair[1], origin)
        );
    }
    // Exactly one holder per round: each counter value was read by exactly one holder, in holding order.
    let reads: Vec<i64> = holds.iter().map(|h| h.read).collect();
    let expected: Vec<i64> = (0..total).collect();
    assert_eq!(
        reads, expected,
        "{mode}: counter values read in holding order"
    );
    // No update lost.
    assert_eq!(counter, total, "{mode}: lost updates");
    // Fencing tokens (single mode) strictly increase in holding order.
    if mode == "single" {
        for pair in holds.windows(2) {
            let (a, b) = (pair[0].fence.unwrap(), pair[1].fence.unwrap());
            assert!(b > a, "{mode}: fence {b} after {a}");
        }
    }
    // The processes really contended: the lock changed hands between processes many times.
    let process = |h: &Hold| h.id.split('.').next().unwrap_or_default().to_owned();
    let handovers = holds
        .windows(2)
        .filter(|p| process(&p[0]) != process(&p[1]))
        .count();
    assert!(
        handovers >= procs,
        "{mode}: only {handovers} handovers between processes; no real contention"
    );
    // Every acquirer won its rounds.
    let acquirers: std::collections::BTreeSet<&str> = holds.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(
        acquirers.len() as u64,
        procs as u64 * tasks,
        "{mode}: acquirers that held"
    );
    // Every lease was released: nothing is left on any server.
    for s in servers.iter() {
        assert_eq!(
            s.cmd(&["EXISTS", "chaos:lock"]),
            "0",
            "{mode}: a lock key left"
        );
    }
    eprintln!(
        "{test} on {flavor}: {procs} processes x {tasks} tasks x {rounds} rounds, {handovers} handovers between \
         processes, {:?}",
        t0.elapsed()
    );
}

#[test]
fn single_mode_processes_hold_one_at_a_time_and_lose_no_counter_update() {
    contention(
        "single_mode_processes_hold_one_at_a_time_and_lose_no_counter_update",
        "single",
        1,
        4,
        1,
        100,
    );
}

#[test]
fn redlock_processes_on_three_servers_hold_one_at_a_time_and_lose_no_counter_update() {
    contention(
        "redlock_processes_on_three_servers_hold_one_at_a_time_and_lose_no_counter_update",
        "redlock",
        3,
        4,
        1,
        50,
    );
}

#[test]
fn a_hundred_acquirers_in_tasks_of_four_processes_hold_one_at_a_time_and_lose_no_counter_update() {
    contention(
        "a_hundred_acquirers_in_tasks_of_four_processes_hold_one_at_a_time_and_lose_no_counter_update",
        "single",
        1,
        4,
        25,
        3,
    );
}

#[test]
fn a_hundred_redlock_acquirers_in_tasks_of_four_processes_hold_one_at_a_time_and_lose_no_update() {
    contention(
        "a_hundred_redlock_acquirers_in_tasks_of_four_processes_hold_one_at_a_time_and_lose_no_update",
        "redlock",
        3,
        4,
        25,
        2,
    );
}

#[test]
fn without_the_lock_the_same_processes_lose_counter_updates() {
    // The control experiment: the checks above are able to fail.
    let test = "without_the_lock_the_same_processes_lose_counter_updates";
    on_each_flavor(test, &Flavor::ALL, |flavor| {
        let servers = RedisServers::start_flavor(flavor, 1);
        let (mut holds, counter) = run_workers(&servers, "single", 4, 1, 50, true);
        holds.sort_by_key(|h| h.start);
        let overlaps = holds.windows(2).filter(|p| p[1].start < p[0].end).count();
        assert!(
            counter < 200,
            "4 unlocked processes x 50 read-modify-writes lost no update (counter {counter})"
        );
        assert!(overlaps > 0, "unlocked intervals never overlapped");
    });
}
