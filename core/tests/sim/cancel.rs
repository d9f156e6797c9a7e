//! Cancellation at every await point: each lease future is dropped after its k-th poll, for every k until it
//! completes (`redlease_testkit::cancel::each_poll`), on a fresh cluster each time, with faults that keep
//! rounds, late requests and clean-ups in flight at the cut. After each cut the cluster runs on and must
//! settle: no task left once the bounded clean-ups are done, no node traffic afterwards (no renewal of a
//! lease that ended), no lock key without a TTL, none outliving its TTL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redlease::{Lease, Timer};
use redlease_testkit::cancel::{Cut, SimHost, each_poll};
use redlease_testkit::{Delivery, Fault, Op, RandomFaults, Sim, for_each_seed};

use crate::support::*;

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A cluster and, for the cases that start from a held lease, that lease (moved into the future).
struct Env {
    c: Cluster,
    lease: Option<Lease>,
    /// A lease shared by the cut future and the check that uses it on afterwards.
    kept: Option<Arc<Lease>>,
}

impl SimHost for Env {
    fn sim(&mut self) -> &mut Sim {
        &mut self.c.sim
    }
}

/// Three nodes, expiry 30 s (operation timeout 500 ms). Acquisition faults: node 0 answers 50 ms late, node 1
/// loses its first reply (so its write needs a clean-up, which sits in the network past the operation
/// timeout and lands after the caller left), node 2 is held by someone else for `foreign_ms`.
fn contended(seed: u64, spawner: bool, foreign_ms: u64) -> Cluster {
    let cfg = config().with_expiry(secs(30));
    let c = if spawner {
        Cluster::with_spawner(3, seed, cfg)
    } else {
        Cluster::new(3, seed, cfg)
    };
    c.faults[0].script(Op::Acquire, [Fault::SlowReply(ms(50))]);
    c.faults[1].script(Op::Acquire, [Fault::ReplyLost]);
    c.faults[1].script(Op::Release, [Fault::Late(ms(700))]);
    c.faults[0].script(Op::Release, [Fault::SlowReply(ms(30))]);
    if foreign_ms > 0 {
        c.nodes[2].set("job", "someone-else", Some(ms(foreign_ms)));
    }
    c
}

/// A healthy three-node cluster with a lease on "job" already held (expiry 30 s, renewal every 1 s if
/// `renew`); then extension and release faults: node 0 slow, node 1 late past the timeout, node 2 loses
/// replies.
fn held(seed: u64, spawner: bool, renew: bool) -> Env {
    let cfg = config().with_expiry(secs(30));
    let mut c = if spawner {
        Cluster::with_spawner(3, seed, cfg)
    } else {
        Cluster::new(3, seed, cfg)
    };
    let mut lock = c.manager.lock("job");
    if renew {
        lock = lock.renew_every(secs(1));
    }
    let lease = c.try_acquire(&lock).unwrap();
    c.faults[0].script(Op::Extend, vec![Fault::SlowReply(ms(40)); 4]);
    c.faults[1].script(
        Op::Extend,
        [Fault::Late(ms(600)), Fault::LateAfterError(ms(900))],
    );
    c.faults[2].script(Op::Extend, [Fault::ReplyLost, Fault::Hang]);
    c.faults[1].script(Op::Release, [Fault::Late(ms(800))]);
    c.faults[2].script(Op::Release, [Fault::Hang]);
    Env {
        c,
        lease: Some(lease),
        kept: None,
    }
}

/// After a cut: everything settles within bounded clean-ups, then stays silent, and no key outlives its TTL.
/// With `cleaned`, the settled cluster holds no key of ours any more: a clean-up deleted it, well before its
/// 30 s TTL (only for cases whose clean-ups can reach every node).
fn settles(name: &str, env: &mut Env, cut: Cut, cleaned: bool) {
    let c = &mut env.c;
    c.assert_every_lock_key_has_ttl();
    // Clean-ups are bounded by a few operation timeouts, late requests by their delay (under 1 s).
    assert!(
        c.sim.run_until_idle(secs(10)),
        "{name}, {cut:?}: a task is still running 10 s after the cut ({} live)",
        c.sim.live_tasks()
    );
    if cleaned {
        for (i, node) in c.nodes.iter().enumerate() {
            let value = node.get("job");
            assert!(
                value.is_none() || value.as_deref() == Some(&b"someone-else"[..]),
                "{name}, {cut:?}: node {i} still holds our key after the clean-ups settled"
            );
        }
    }
    let calls = c.calls();
    let extends: u64 = c.faults.iter().map(|f| f.calls(Op::Extend)).sum();
    c.sim.run_for(secs(300));
    let extends_after: u64 = c.faults.iter().map(|f| f.calls(Op::Extend)).sum();
    assert_eq!(
        extends_after, extends,
        "{name}, {cut:?}: renewal traffic after the lease ended"
    );
    assert_eq!(
        c.calls(),
        calls,
        "{name}, {cut:?}: node traffic after settling"
    );
    c.assert_every_lock_key_has_ttl();
    for (i, node) in c.nodes.iter().enumerate() {
        assert_eq!(
            node.get("job"),
            None,
            "{name}, {cut:?}: node {i} still holds the lock key"
        );
    }
}

/// Cuts the future `start` builds after every poll; returns how many polls it needed.
fn cut_everywhere(
    name: &str,
    cleaned: impl Fn(Cut) -> bool,
    setup: impl FnMut() -> Env,
    start: impl FnMut(&mut Env) -> Boxed,
) -> usize {
    let polls = each_poll(setup, start, |env, cut| {
        settles(name, env, cut, cleaned(cut))
    });
    assert!(
        polls >= 2,
        "{name}: completed in {polls} polls: nothing was cut inside it"
    );
    polls
}

#[test]
fn cancelling_a_single_attempt_acquisition_at_every_await_point_leaves_nothing_behind() {
    for spawner in [true, false] {
        // Fails (only node 0 agrees): the clean-up of nodes 0 and 1 runs at the end, and is cut too.
        cut_everywhere(
            &format!("try_acquire contended, spawner {spawner}"),
            |_| spawner,
            || Env {
                c: contended(1, spawner, 60_000),
                lease: None,
                kept: None,
            },
            |env| {
                let lock = env.c.manager.lock("job");
                Box::pin(async move {
                    assert!(lock.try_acquire().await.is_err());
                })
            },
        );
        // Succeeds on nodes 0 and 2; the lease is released at the end.
        cut_everywhere(
            &format!("try_acquire won, spawner {spawner}"),
            |_| spawner,
            || Env {
                c: contended(2, spawner, 0),
                lease: None,
                kept: None,
            },
            |env| {
                let lock = env.c.manager.lock("job");
                Box::pin(async move {
                    let lease = lock.try_acquire().await.unwrap();
                    let _ = lease.release().await;
                })
            },
        );
    }
}

#[test]
fn cancelling_a_three_attempt_acquisition_at_every_await_point_leaves_nothing_behind() {
    for spawner in [true, false] {
        // The foreign key on node 2 expires after 300 ms: attempt 1 fails and is cleaned up, a later one wins.
        let polls = cut_everywhere(
            &format!("acquire with retries, spawner {spawner}"),
            |_| spawner,
            || Env {
                c: contended(3, spawner, 300),
                lease: None,
                kept: None,
            },
            |env| {
                let lock = env.c.manager.lock("job");
                Box::pin(async move {
                    let lease = lock.acquire().await.unwrap();
                    let _ = lease.release().await;
                })
            },
        );
        assert!(polls >= 4, "spawner {spawner}: only {polls} polls");
    }
}

#[test]
fn cancelling_extend_and_release_at_every_await_point_leaves_nothing_behind() {
    for spawner in [true, false] {
        cut_everywhere(
            &format!("extend, spawner {spawner}"),
            |_| false,
            || held(4, spawner, false),
            |env| {
                let lease = env.lease.take().unwrap();
                Box::pin(async move {
                    let _ = lease.extend(secs(3)).await;
                    let _ = lease.extend(secs(3)).await;
                    let _ = lease.release().await;
                })
            },
        );
        cut_everywhere(
            &format!("release, spawner {spawner}"),
            |_| false,
            || held(5, spawner, false),
            |env| {
                let lease = env.lease.take().unwrap();
                Box::pin(async move {
                    let _ = lease.release().await;
                })
            },
        );
    }
}

#[test]
fn cancelling_run_with_renewal_at_every_await_point_leaves_nothing_behind() {
    for spawner in [true, false] {
        let polls = cut_everywhere(
            &format!("run with renewal, spawner {spawner}"),
            |_| false,
            || held(6, spawner, true),
            |env| {
                let lease = env.lease.take().unwrap();
                let clock = env.c.clock.clone();
                Box::pin(async move {
                    let _ = lease.run(clock.sleep_until(clock.now() + secs(6))).await;
                    let _ = lease.release().await;
                })
            },
        );
        assert!(polls >= 6, "spawner {spawner}: only {polls} polls");
    }
}

#[test]
fn cancelling_a_lease_with_background_renewal_at_every_await_point_leaves_nothing_behind() {
    // Acquire with auto-renewal on a spawner (renewal runs detached), hold it across several renewals with a
    // manual extension in between, then release; every cut drops the lease wherever it is.
    cut_everywhere(
        "background renewal",
        |_| true,
        || {
            let mut env = held(7, true, false);
            env.lease = None;
            env.c.faults[1].clear();
            env.c.faults[2].clear();
            env.c.faults[1].script(Op::Extend, [Fault::Late(ms(700)), Fault::ReplyLost]);
            env
        },
        |env| {
            let lock = env.c.manager.lock("job").auto_renew(secs(1));
            let clock = env.c.clock.clone();
            Box::pin(async move {
                let lease = lock.acquire().await.unwrap();
                clock.sleep_until(clock.now() + secs(2)).await;
                let _ = lease.extend(secs(3)).await;
                clock.sleep_until(clock.now() + secs(2)).await;
                let _ = lease.release().await;
            })
        },
    );
}

/// One of the lease futures of the random variant.
fn victim(c: &Cluster, kind: u64, fenced: bool, spawner: bool) -> Boxed {
    let lock = c.manager.lock("job").expiry(secs(10));
    // Background renewal where the manager can run it; otherwise only `run` renews (kind 1).
    let mut lock = if spawner {
        lock.auto_renew(secs(3))
    } else {
        lock.renew_every(secs(3))
    };
    if fenced {
        lock = lock.fenced("job:fence");
    }
    let clock = c.clock.clone();
    match kind {
        0 => Box::pin(async move {
            if let Ok(lease) = lock.acquire().await {
                let _ = lease.release().await;
            }
        }),
        1 => Box::pin(async move {
            if let Ok(lease) = lock.acquire().await {
                let _ = lease.run(clock.sleep_until(clock.now() + secs(12))).await;
                let _ = lease.release().await;
            }
        }),
        2 => Box::pin(async move {
            if let Ok(lease) = lock.acquire().await {
                for _ in 0..4 {
                    if lease.extend(secs(10)).await.is_err() {
                        break;
                    }
                    clock.sleep_until(clock.now() + secs(2)).await;
                }
                let _ = lease.release().await;
            }
        }),
        _ => Box::pin(async move {
            if let Ok(lease) = lock.acquire().await {
                let signal = lease.lost();
                clock.sleep_until(clock.now() + secs(8)).await;
                drop(signal);
                drop(lease);
            }
        }),
    }
}

#[test]
fn cancelling_any_lease_future_at_every_await_point_under_hostile_faults_leaves_nothing_behind() {
    for_each_seed(0..96, |seed| {
        let n = [1usize, 3, 5][(seed % 3) as usize];
        let spawner = seed % 2 == 0;
        let kind = (seed / 2) % 4;
        let fenced = n == 1 && (seed / 8) % 2 == 0;
        let name = format!("seed {seed} (kind {kind}, n {n}, spawner {spawner}, fenced {fenced})");
        cut_everywhere(
            &name,
            |_| false,
            || {
                let c = if spawner {
                    Cluster::with_spawner(n, seed, config())
                } else {
                    Cluster::new(n, seed, config())
                };
                for (i, f) in c.faults.iter().enumerate() {
                    // Duplicated requests too: a copy may land after the cut and after the clean-ups.
                    f.random(RandomFaults::hostile(seed * 31 + i as u64).duplicate(0.05));
                }
                Env {
                    c,
                    lease: None,
                    kept: None,
                }
            },
            |env| victim(&env.c, kind, fenced, spawner),
        );
    });
}

/// Only node 1 is free, and every compare-and-delete sent to it while the acquisition runs is blackholed:
/// each clean-up round times out on it. With a spawner, a background clean-up once the acquisition gave up
/// must delete our key rather than leave it for its whole 30 s TTL.
fn blackholed_clean_up(attempts: u32) {
    cut_everywhere(
        &format!("acquire ({attempts} attempts), blackholed clean-up"),
        // A cut spawns one best-effort clean-up, which the blackhole may swallow; a completed acquisition
        // must leave nothing behind.
        |cut| cut.completed,
        || {
            let c = contended(8, true, 60_000);
            c.nodes[0].set("job", "someone-else", Some(secs(60)));
            c.faults[1].clear();
            c.faults[1].always(Op::Release, Fault::Hang);
            Env {
                c,
                lease: None,
                kept: None,
            }
        },
        |env| {
            let lock = env.c.manager.lock("job");
            let faults = env.c.faults[1].clone();
            Box::pin(async move {
                let r = if attempts == 1 {
                    lock.try_acquire().await
                } else {
                    lock.acquire().await
                };
                assert!(r.is_err());
                // The network heals as the acquisition returns: what it left behind can now be deleted.
                faults.clear();
            })
        },
    );
}

#[test]
fn a_single_attempt_whose_clean_up_is_blackholed_is_cleaned_up_in_the_background_cut_or_completed()
{
    blackholed_clean_up(1);
}

#[test]
fn three_attempts_whose_clean_ups_are_blackholed_are_cleaned_up_in_the_background_cut_or_completed()
{
    blackholed_clean_up(3);
}

/// A lease believed held must be backed: its token on a quorum of nodes, each for at least as long as the
/// lease believes it holds (the nodes here share the client's clock).
fn assert_backed(name: &str, c: &Cluster, lease: &Lease) {
    if !lease.is_held() {
        return;
    }
    let remaining = lease.remaining();
    let token = lease.token().as_str();
    let backing = c
        .nodes
        .iter()
        .filter(|node| {
            node.get("job").as_deref() == Some(token.as_bytes())
                && node
                    .pttl("job")
                    .flatten()
                    .is_some_and(|ttl| ttl >= remaining)
        })
        .count();
    let quorum = c.nodes.len() / 2 + 1;
    assert!(
        backing >= quorum,
        "{name}: the lease believes it holds for {remaining:?}, but only {backing} node(s) back that"
    );
}

/// Cancellation at every poll point, then the lock used on (issue 21): a shorter extension is cut at each
/// of its await points while its requests are late or lost on some nodes; the lease is then extended
/// longer, the late requests land, and whatever the lease believes must still be backed by a quorum.
#[test]
fn a_lease_used_on_after_a_shorter_extension_was_cut_anywhere_is_backed_by_a_quorum() {
    for (n, spawner) in [(1usize, false), (3, false), (3, true)] {
        let name = format!("n {n}, spawner {spawner}");
        let polls = each_poll(
            || {
                let cfg = config().with_expiry(secs(30));
                let mut c = if spawner {
                    Cluster::with_spawner(n, 11, cfg)
                } else {
                    Cluster::new(n, 11, cfg)
                };
                let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
                // Nodes that apply a late shorter extension as it is (a plain `PEXPIRE`): with the
                // never-shorten rule it could change nothing, and the test could not fail.
                for node in &c.nodes {
                    node.set_shortening_extensions(true);
                }
                // The short extension: late on the last node (applied 2 s after it was sent, after requests
                // sent later: a pool), slow elsewhere.
                let last = n - 1;
                c.faults[last].delivery(Delivery::Pool);
                c.faults[last].script(Op::Extend, [Fault::Late(secs(2))]);
                for f in &c.faults[..last] {
                    f.script(Op::Extend, [Fault::SlowReply(ms(40))]);
                }
                Env {
                    c,
                    lease: Some(lease),
                    kept: None,
                }
            },
            |env| {
                let lease = Arc::new(env.lease.take().unwrap());
                env.kept = Some(Arc::clone(&lease));
                Box::pin(async move {
                    let _ = lease.extend(secs(3)).await;
                }) as Boxed
            },
            |env, cut| {
                let lease = env.kept.take().unwrap();
                let c = &mut env.c;
                let clock = c.clock.clone();
                let longer = Arc::clone(&lease);
                c.sim.block_on(async move {
                    clock.sleep_until(clock.now() + ms(100)).await;
                    let _ = longer.extend(secs(30)).await;
                });
                // The late short extension lands (2 s after it was sent).
                c.sim.run_for(secs(3));
                assert_backed(&format!("{name}, {cut:?}"), c, &lease);
            },
        );
        assert!(polls >= 2, "{name}: the extension completed at once");
    }
}
