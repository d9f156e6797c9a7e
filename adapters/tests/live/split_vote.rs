//! Redlock split votes: many clients, each with its own connections to every server, race for one key round
//! after round. No two may ever believe they hold it at once, a non-atomic read-modify-write under the lock
//! must lose no update, and every round must end with a winner.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::LockManager;
use redlease_testkit::server::{Flavor, RedisServers};
use tokio::sync::Barrier;

use crate::common::{self, ALL_BACKENDS, config, on_every_server};

const KEY: &str = "race:{split}:lock";

/// What every client shares, to check from inside the process what Redis is supposed to guarantee.
#[derive(Default)]
struct Shared {
    /// How many clients currently believe they hold the lock.
    holders: AtomicU64,
    /// Moments at which a second holder showed up.
    overlaps: AtomicU64,
    /// Incremented with a deliberately non-atomic load / await / store under the lock.
    counter: AtomicU64,
    /// Successful acquisitions.
    wins: AtomicU64,
    /// Acquisition attempts, successful or not.
    attempts: AtomicU64,
    /// Rounds (acquisitions or releases) whose every node error was the operation timeout.
    stalls: AtomicU64,
}

/// Whether every node error of `err` is the operation timeout (a machine too loaded to answer in time).
fn only_timeouts(err: &redlease::Error) -> bool {
    let q = match err {
        redlease::Error::NotAcquired {
            last_error: Some(q),
            ..
        } => q,
        redlease::Error::Quorum(q) => q,
        _ => return false,
    };
    !q.errors.is_empty()
        && q.errors
            .iter()
            .all(|(_, e)| e.kind() == redlease::NodeErrorKind::Timeout)
}

/// A small per-client pseudo-random pause, so that losers do not retry in lockstep.
fn backoff(client: usize, attempt: u64) -> Duration {
    let mut x = (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ attempt;
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    Duration::from_micros(300 + x % 2_700)
}

async fn race(flavor: Flavor, n: usize, clients: usize, rounds: usize) {
    let servers = RedisServers::start_flavor(flavor, n);
    let started = Instant::now();
    // Each client has its own connections to every server, of one of the four adapter kinds in turn.
    let mut managers = Vec::with_capacity(clients);
    for c in 0..clients {
        let backend = ALL_BACKENDS[c % ALL_BACKENDS.len()];
        let mut nodes = Vec::with_capacity(n);
        for server in servers.iter() {
            nodes.push(common::node(backend, &server.url()).await);
        }
        // A 2 s TTL is far longer than any hold here; the default operation timeout applies (400 ms).
        let manager = LockManager::redlock_dyn(nodes, config(Duration::from_secs(2))).unwrap();
        managers.push(manager);
    }
    let connected = started.elapsed();

    let shared = Arc::new(Shared::default());
    let won: Arc<Vec<AtomicBool>> = Arc::new((0..rounds).map(|_| AtomicBool::new(false)).collect());
    let barrier = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = managers
        .into_iter()
        .enumerate()
        .map(|(c, manager)| {
            let (shared, won, barrier) =
                (Arc::clone(&shared), Arc::clone(&won), Arc::clone(&barrier));
            tokio::spawn(async move {
                let lock = manager.lock(KEY);
                let mut attempt = 0u64;
                for round in 0..rounds {
                    // Everyone starts the round at the same moment: the best chance for a split vote.
                    barrier.wait().await;
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !won[round].load(Ordering::SeqCst) {
                        attempt += 1;
                        shared.attempts.fetch_add(1, Ordering::Relaxed);
                        match lock.try_acquire().await {
                            Ok(lease) => {
                                if shared.holders.fetch_add(1, Ordering::SeqCst) != 0 {
                                    shared.overlaps.fetch_add(1, Ordering::SeqCst);
                                }
                                let value = shared.counter.load(Ordering::SeqCst);
                                // Let the other tasks run in the middle of the read-modify-write.
                                tokio::task::yield_now().await;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                shared.counter.store(value + 1, Ordering::SeqCst);
                                shared.wins.fetch_add(1, Ordering::SeqCst);
                                assert!(
                                    lease.is_held(),
                                    "client {c}: lease lapsed during a 1 ms hold"
                                );
                                won[round].store(true, Ordering::SeqCst);
                                // Stop believing before letting go in Redis.
                                shared.holders.fetch_sub(1, Ordering::SeqCst);
                                if let Err(e) = lease.release().await {
                                    // A release that timed out leaves the key to its 2 s TTL: the next
                                    // round waits for it, well within its 5 s.
                                    assert!(
                                        only_timeouts(&e),
                                        "client {c} round {round}: release failed: {e}"
                                    );
                                    shared.stalls.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(err) => {
                                // Without faults, losing a race is plain contention, or, on a machine so
                                // loaded that a round's replies came back after its 400 ms timeout, a round
                                // whose every node error is that timeout (a stall, not a failure; the
                                // no-overlap and lost-update checks hold all the same).
                                let stalled = only_timeouts(&err);
                                if stalled {
                                    shared.stalls.fetch_add(1, Ordering::Relaxed);
                                }
                                assert!(
                                    err.is_contended() || stalled,
                                    "client {c} round {round}: {}",
                                    common::chain(&err)
                                );
                                assert!(
                                    Instant::now() < deadline,
                                    "round {round}: nobody won within 5 s (client {c}: {err})"
                                );
                                tokio::time::sleep(backoff(c, attempt)).await;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let wins = shared.wins.load(Ordering::SeqCst);
    let attempts = shared.attempts.load(Ordering::SeqCst);
    assert_eq!(
        shared.overlaps.load(Ordering::SeqCst),
        0,
        "two clients held the lock at once"
    );
    assert_eq!(
        shared.counter.load(Ordering::SeqCst),
        wins,
        "the read-modify-write under the lock lost updates"
    );
    for (round, w) in won.iter().enumerate() {
        assert!(w.load(Ordering::SeqCst), "round {round} had no winner");
    }
    assert!(wins >= rounds as u64, "{wins} wins in {rounds} rounds");
    // Every winner released: nothing is left on any server (after a stalled round, its keys expire within
    // the TTL).
    let stalls = shared.stalls.load(Ordering::SeqCst);
    if stalls > 0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.cmd(&["EXISTS", KEY]),
            "0",
            "server {i} still holds the key"
        );
    }
    eprintln!(
        "split vote on {flavor}, {n} servers, {clients} clients: {rounds} rounds, {wins} wins in {attempts} \
         attempts, {stalls} stalled rounds (connect {connected:?}, total {:?})",
        started.elapsed()
    );
}

#[test]
fn redlock_split_vote_on_three_servers_never_has_two_holders_and_every_round_has_a_winner() {
    on_every_server(
        "redlock_split_vote_on_three_servers_never_has_two_holders_and_every_round_has_a_winner",
        |flavor| race(flavor, 3, 20, 15),
    );
}

#[test]
fn redlock_split_vote_on_five_servers_never_has_two_holders_and_every_round_has_a_winner() {
    on_every_server(
        "redlock_split_vote_on_five_servers_never_has_two_holders_and_every_round_has_a_winner",
        |flavor| race(flavor, 5, 30, 10),
    );
}
