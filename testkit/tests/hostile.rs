//! The simulator's hostile modes do what their docs say: late applies after the caller left, FIFO order vs
//! pool reordering, client pauses, cancellation after each poll.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use redlease::{NodeErrorKind, RedisNode, Timer, Token, Ttl};
use redlease_testkit::cancel::{Cut, each_poll};
use redlease_testkit::{
    Delivery, Fault, Faults, FaultyNode, MemoryNode, Op, RandomFaults, Sim, VirtualClock,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ttl(d: Duration) -> Ttl {
    Ttl::from_duration(d).unwrap()
}

/// Runs `call` until it completes or `limit` passes; `None` if the caller gave up (and dropped the call).
async fn within<F: Future>(clock: &VirtualClock, limit: Duration, call: F) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let mut stop = clock.sleep_until(clock.now() + limit);
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

struct Net {
    sim: Sim,
    clock: VirtualClock,
    memory: MemoryNode,
    node: Arc<FaultyNode<MemoryNode>>,
    faults: Faults,
}

fn net(seed: u64, delivery: Delivery) -> Net {
    let sim = Sim::new(seed);
    let clock = sim.clock();
    let memory = MemoryNode::with_timer(clock.clone());
    let (node, faults) = FaultyNode::with_spawner(memory.clone(), clock.clone(), sim.spawner());
    faults.delivery(delivery);
    Net {
        sim,
        clock,
        memory,
        node: Arc::new(node),
        faults,
    }
}

#[test]
fn a_late_request_is_applied_after_its_caller_timed_out() {
    let mut n = net(1, Delivery::Fifo);
    n.faults.script(Op::Acquire, [Fault::Late(ms(800))]);
    let token = Token::random().unwrap();
    let (node, clock, t) = (n.node.clone(), n.clock.clone(), token.clone());
    let start = n.clock.now();
    let reply = n.sim.block_on(async move {
        within(&clock, ms(500), node.acquire("k", &t, ttl(ms(10_000)))).await
    });
    assert!(reply.is_none(), "the caller timed out");
    assert_eq!(n.clock.now() - start, ms(500));
    assert_eq!(n.memory.get("k"), None);
    assert_eq!(n.faults.in_flight(), 1);
    n.sim.run_for(ms(299));
    assert_eq!(n.memory.get("k"), None, "still in the network");
    n.sim.run_for(ms(1));
    assert_eq!(
        n.memory.get("k").as_deref(),
        Some(token.as_str().as_bytes())
    );
    assert_eq!(n.faults.applied_after_caller_left(Op::Acquire), 1);
    assert_eq!(n.faults.in_flight(), 0);
    assert!(n.sim.run_until_idle(ms(1)), "no task left behind");
}

#[test]
fn a_waiting_caller_gets_the_late_reply() {
    let mut n = net(2, Delivery::Pool);
    n.faults.script(Op::Acquire, [Fault::Late(ms(300))]);
    let token = Token::random().unwrap();
    let (node, clock) = (n.node.clone(), n.clock.clone());
    let start = n.clock.now();
    let reply = n.sim.block_on(async move {
        within(&clock, ms(500), node.acquire("k", &token, ttl(ms(10_000)))).await
    });
    assert_eq!(reply.map(Result::unwrap), Some(true));
    assert_eq!(n.clock.now() - start, ms(300));
    assert_eq!(n.faults.applied_after_caller_left(Op::Acquire), 0);
}

/// A late compare-and-delete followed by a fresh SET of the same token: the defect-1 pattern.
fn late_delete_then_set(delivery: Delivery) -> (Net, Token) {
    let mut n = net(3, delivery);
    let token = Token::random().unwrap();
    n.memory.set("k", token.as_str(), Some(ms(10_000)));
    n.faults.script(Op::Release, [Fault::Late(ms(1_000))]);
    let (node, clock, t) = (n.node.clone(), n.clock.clone(), token.clone());
    n.sim.block_on(async move {
        // The delete times out at 500 ms; the retry's SET follows at once.
        assert!(
            within(&clock, ms(500), node.release("k", &t))
                .await
                .is_none()
        );
        let _ = within(&clock, ms(5_000), node.acquire("k", &t, ttl(ms(10_000)))).await;
    });
    (n, token)
}

#[test]
fn a_fifo_connection_applies_in_send_order_and_a_late_request_holds_back_the_next() {
    let (mut n, token) = late_delete_then_set(Delivery::Fifo);
    // The SET waited behind the delete (applied at 1 s) and then re-created the key: nothing reordered.
    assert_eq!(n.faults.reordered(), 0);
    assert_eq!(
        n.memory.get("k").as_deref(),
        Some(token.as_str().as_bytes())
    );
    assert!(n.sim.run_until_idle(ms(1)));
}

#[test]
fn a_pool_reorders_a_late_request_after_a_later_one() {
    let (mut n, token) = late_delete_then_set(Delivery::Pool);
    assert_eq!(
        n.memory.get("k").as_deref(),
        Some(token.as_str().as_bytes())
    );
    n.sim.run_for(ms(600));
    // The SET overtook the delete, which then landed and deleted the key the SET relied on.
    assert_eq!(n.faults.reordered(), 1);
    assert_eq!(n.memory.get("k"), None);
    assert_eq!(n.faults.applied_after_caller_left(Op::Release), 1);
}

#[test]
fn a_reconnecting_connection_keeps_order_until_a_reset_and_reorders_across_it() {
    // A late request without a reset holds the connection: the next one waits behind it.
    let (n, _) = late_delete_then_set(Delivery::Reconnecting);
    assert_eq!(n.faults.reordered(), 0);
    // After a reset the next request goes over a new connection and overtakes the one left on the old.
    let mut n = net(8, Delivery::Reconnecting);
    let token = Token::random().unwrap();
    n.memory.set("k", token.as_str(), Some(ms(10_000)));
    n.faults
        .script(Op::Release, [Fault::LateAfterError(ms(1_000))]);
    let (node, t) = (n.node.clone(), token.clone());
    let start = n.clock.now();
    n.sim.block_on(async move {
        assert!(node.release("k", &t).await.unwrap_err().is_ambiguous());
        assert!(node.acquire("k", &t, ttl(ms(10_000))).await.unwrap());
    });
    assert_eq!(n.clock.now(), start, "the new connection is not held back");
    assert_eq!(
        n.memory.get("k").as_deref(),
        Some(token.as_str().as_bytes())
    );
    n.sim.run_for(ms(1_001));
    assert_eq!(n.faults.reordered(), 1);
    assert_eq!(
        n.memory.get("k"),
        None,
        "the old connection's delete landed last"
    );
}

#[test]
fn late_after_error_reports_an_ambiguous_error_at_once_and_applies_later() {
    let mut n = net(4, Delivery::Pool);
    n.faults
        .script(Op::Extend, [Fault::LateAfterError(ms(700))]);
    let token = Token::random().unwrap();
    n.memory.set("k", token.as_str(), Some(ms(1_000)));
    let (node, t) = (n.node.clone(), token.clone());
    let start = n.clock.now();
    let err = n
        .sim
        .block_on(async move { node.extend("k", &t, ttl(ms(5_000))).await })
        .unwrap_err();
    assert!(err.is_ambiguous());
    assert_eq!(n.clock.now(), start);
    assert_eq!(n.memory.pttl("k"), Some(Some(ms(1_000))));
    n.sim.run_for(ms(699));
    assert_eq!(n.memory.pttl("k"), Some(Some(ms(301))));
    n.sim.run_for(ms(2));
    assert_eq!(
        n.memory.pttl("k"),
        Some(Some(ms(4_999))),
        "extended at 700 ms"
    );
}

#[test]
fn a_late_fault_without_a_spawner_fails_with_a_clear_not_applied_error() {
    let clock = VirtualClock::new();
    let (node, faults) = FaultyNode::new(MemoryNode::with_timer(clock.clone()), clock);
    faults.script(Op::Acquire, [Fault::Late(ms(10))]);
    let token = Token::random().unwrap();
    let err = redlease_testkit::block_on(node.acquire("k", &token, ttl(ms(1_000)))).unwrap_err();
    assert!(!err.is_ambiguous());
    assert_eq!(err.kind(), NodeErrorKind::Other);
    assert!(err.to_string().contains("with_spawner"), "{err}");
}

#[test]
fn hostile_random_faults_really_apply_late_and_reorder() {
    for (seed, delivery) in [
        (9u64, Delivery::Pool),
        (10, Delivery::Fifo),
        (11, Delivery::Reconnecting),
    ] {
        let mut n = net(seed, delivery);
        let random = RandomFaults::hostile(seed);
        assert_eq!(random.delivery, delivery);
        n.faults.random(random);
        let (node, clock) = (n.node.clone(), n.clock.clone());
        n.sim.block_on(async move {
            let token = Token::random().unwrap();
            for i in 0..2_000u64 {
                let key = format!("k{}", i % 7);
                let _ = within(&clock, ms(500), node.extend(&key, &token, ttl(ms(1_000)))).await;
            }
        });
        assert!(n.sim.run_until_idle(ms(2_000)), "late requests drain");
        let late = n.faults.applied_after_caller_left(Op::Extend);
        assert!(
            late > 20,
            "{delivery:?}: only {late} applies after the caller left"
        );
        if delivery == Delivery::Fifo {
            assert_eq!(n.faults.reordered(), 0);
        } else {
            assert!(
                n.faults.reordered() > 20,
                "{delivery:?}: {}",
                n.faults.reordered()
            );
        }
        assert_eq!(n.faults.in_flight(), 0);
    }
}

#[test]
fn a_paused_client_runs_nothing_while_others_and_time_go_on() {
    let mut sim = Sim::new(5);
    let clock = sim.clock();
    let t0 = clock.now();
    let ticks: Arc<Mutex<Vec<(u64, Duration)>>> = Arc::default();
    for client in [1u64, 2] {
        let (clock, ticks) = (clock.clone(), ticks.clone());
        sim.client(client).spawn(async move {
            for _ in 0..10 {
                clock.sleep_until(clock.now() + ms(100)).await;
                ticks.lock().unwrap().push((client, clock.now() - t0));
            }
        });
    }
    sim.run_for(ms(250));
    sim.pause(1, ms(500)); // 250..750 ms
    assert!(sim.is_paused(1) && !sim.is_paused(2));
    assert!(sim.run_until_idle(ms(5_000)));
    let ticks = ticks.lock().unwrap();
    let of = |c: u64| -> Vec<Duration> { ticks.iter().filter(|t| t.0 == c).map(|t| t.1).collect() };
    let two: Vec<Duration> = (1..=10).map(|i| ms(100 * i)).collect();
    assert_eq!(of(2), two, "client 2 is not disturbed");
    // Client 1 sleeps until 300 ms, is stopped until 750 ms, then goes on from there.
    let one: Vec<Duration> = [100, 200, 750, 850, 950, 1050, 1150, 1250, 1350, 1450]
        .into_iter()
        .map(ms)
        .collect();
    assert_eq!(of(1), one);
}

#[test]
fn tasks_spawned_into_a_paused_client_wait_and_random_pauses_replay() {
    let mut sim = Sim::new(6);
    let clock = sim.clock();
    let t0 = clock.now();
    sim.pause(3, ms(400));
    let ran = Arc::new(Mutex::new(None));
    let (c, r) = (clock.clone(), ran.clone());
    sim.client(3).spawn(async move {
        *r.lock().unwrap() = Some(c.now() - t0);
    });
    assert!(sim.run_until_idle(ms(1_000)));
    assert_eq!(*ran.lock().unwrap(), Some(ms(400)));

    let plan = |seed| {
        let mut sim = Sim::new(0);
        let t = sim.clock().now();
        sim.random_pauses(1, seed, ms(10_000), 5, ms(300))
            .into_iter()
            .map(|(at, d)| (at - t, d))
            .collect::<Vec<_>>()
    };
    assert_eq!(plan(9), plan(9));
    assert_ne!(plan(9), plan(10));
    assert!(
        plan(9)
            .iter()
            .all(|&(at, d)| at <= ms(10_000) && d <= ms(300))
    );
}

#[test]
fn each_poll_cuts_a_multi_step_future_at_every_await_point() {
    struct Env {
        sim: Sim,
        memory: MemoryNode,
        node: Arc<FaultyNode<MemoryNode>>,
    }
    impl redlease_testkit::cancel::SimHost for Env {
        fn sim(&mut self) -> &mut Sim {
            &mut self.sim
        }
    }
    let mut seen: Vec<Cut> = Vec::new();
    let polls = each_poll(
        || {
            let n = net(7, Delivery::Fifo);
            n.faults.script(Op::Acquire, [Fault::Delay(ms(10))]);
            n.faults.script(Op::Extend, [Fault::SlowReply(ms(10))]);
            Env {
                sim: n.sim,
                memory: n.memory,
                node: n.node,
            }
        },
        |env| {
            let node = env.node.clone();
            async move {
                let token = Token::random().unwrap();
                node.acquire("k", &token, ttl(ms(1_000))).await.unwrap();
                node.extend("k", &token, ttl(ms(2_000))).await.unwrap();
                node.release("k", &token).await.unwrap();
            }
        },
        |env, cut| {
            seen.push(cut);
            env.sim.run_for(ms(100));
            let present = env.memory.get("k").is_some();
            // Cut before the SET was sent (k = 0, 1), after it (k = 2: SET applied, reply slow), and done.
            match cut.polls {
                0 | 1 => assert!(!present, "{cut:?}"),
                2 => assert!(present, "{cut:?}"),
                _ => assert!(cut.completed && !present, "{cut:?}"),
            }
        },
    );
    assert_eq!(polls, 3);
    assert_eq!(seen.iter().filter(|c| c.completed).count(), 1);
    assert_eq!(seen.len(), 4);
}

#[test]
fn a_loss_signalled_at_a_fast_clocks_first_reading_past_the_deadline_is_on_time() {
    // A clock running 50 % fast advances 1 or 2 of its nanoseconds per base nanosecond, so a sleep until a
    // deadline may end at a reading 1 ns past it: the earliest the client can possibly learn of the loss.
    use redlease::{Config, LockManager};
    use redlease_testkit::{History, SkewedClock};
    let mut sim = Sim::new(9);
    let clock = SkewedClock::new(sim.clock(), 0.5);
    let history = History::new();
    let manager = LockManager::single(MemoryNode::with_timer(clock.clone()), Config::default())
        .unwrap()
        .with_timer(clock.clone())
        .with_observer(history.recorder(1).on_clock(clock.clone()));
    let mut skipped = 0;
    for i in 0..40u64 {
        let lock = manager.lock(format!("k{i}")).expiry(ms(1_000 + i));
        let lease = sim.block_on(lock.try_acquire()).unwrap();
        let deadline = lease.valid_until();
        sim.block_on(lease.lost());
        if clock.now() > deadline {
            skipped += 1;
        }
    }
    assert!(
        skipped > 0,
        "no deadline fell between two readings: the test shows nothing"
    );
    assert_eq!(history.check(), Ok(()));
}
