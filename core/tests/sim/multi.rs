//! Several locks as one (`LockManager::lock_all`): all or nothing, a fixed order, renewed and lost as one.

use std::time::Duration;

use redlease::{
    ConfigError, Error, LeaseState, LossReason, MultiKeyItem, MultiKeyOp, MultiKeyReply, NodeError,
    NodeErrorKind, NodeWrapper, RedisNode, Timer,
};
use redlease_testkit::cancel::each_poll;
use redlease_testkit::{EventKind, Fault, History, Op};

use crate::support::*;

#[test]
fn all_keys_are_taken_or_none_are() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 101, config());
        let other = c.try_acquire(&c.manager.lock("b")).unwrap();
        let set = c.manager.lock_all(["c", "a", "b"]);
        assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        let r = c.sim.block_on({
            let set = set.clone();
            async move { set.try_acquire().await }
        });
        let e = r.unwrap_err();
        assert!(e.is_contended(), "n={n}: {e}");
        // "a" was taken before "b" failed: released again, and "c" never tried.
        for node in &c.nodes {
            assert_eq!(node.get("a"), None, "n={n}");
            assert_eq!(node.get("c"), None, "n={n}");
        }
        c.sim
            .block_on(async move { other.release().await })
            .unwrap();
        let start = c.now();
        let all = c
            .sim
            .block_on(async move { set.try_acquire().await })
            .unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        let earliest = all.leases().iter().map(|l| l.valid_until()).min();
        assert_eq!(Some(all.valid_until()), earliest);
        assert!(all.valid_until() > start + secs(29));
        for lease in all.leases() {
            assert_eq!(
                c.holders(lease.key(), lease.token().as_str()).len(),
                n,
                "each key holds its own part's token everywhere"
            );
        }
        c.sim.block_on(async move { all.release().await }).unwrap();
        for node in &c.nodes {
            for key in ["a", "b", "c"] {
                assert_eq!(node.get(key), None, "n={n} {key}: released");
            }
        }
    }
}

#[test]
fn a_set_waits_for_its_blocking_key_and_wins_when_it_is_released() {
    // One node takes the set in one step, three key by key: both wait for the blocking key alone.
    for n in [1, 3] {
        set_waits_for_its_blocking_key(n);
    }
}

fn set_waits_for_its_blocking_key(n: usize) {
    let mut c = Cluster::new(n, 102, config());
    let holder = c.try_acquire(&c.manager.lock("b")).unwrap();
    let clock = c.clock.clone();
    let set = c.manager.lock_all(["a", "b"]);
    let result = std::sync::Arc::new(std::sync::Mutex::new(None));
    c.sim.spawn({
        let result = result.clone();
        async move {
            let r = set.acquire_within(secs(20)).await;
            *result.lock().unwrap() = Some((r, clock.now()));
        }
    });
    c.sim.run_for(secs(3));
    // Waiting for "b" holds nothing else.
    assert!(c.nodes.iter().all(|n| n.get("a").is_none()));
    let released_at = c.now();
    c.sim
        .block_on(async move { holder.release().await })
        .unwrap();
    c.sim.run_for(secs(1));
    let (r, at) = result.lock().unwrap().take().expect("finished");
    let all = r.unwrap();
    assert!(all.is_held(), "n={n}");
    assert!(
        at - released_at < ms(300),
        "n={n}: won {:?} after the release",
        at - released_at
    );
}

#[test]
fn sets_taken_in_opposite_orders_never_deadlock_and_never_overlap() {
    let mut c = Cluster::with_spawner(3, 103, config().with_expiry(secs(2)));
    let history = History::new();
    let clock = c.clock.clone();
    for (id, keys) in [(1u64, ["x", "y"]), (2, ["y", "x"]), (3, ["y", "z"])] {
        let manager = c.client_manager(id).with_observer(history.recorder(id));
        let set = manager.lock_all(keys);
        let clock = clock.clone();
        c.sim.client(id).spawn(async move {
            let mut won = 0;
            for _ in 0..20 {
                let all = set.acquire_within(secs(10)).await.expect("never starved");
                clock.sleep_until(clock.now() + ms(150)).await;
                all.release().await.unwrap();
                won += 1;
            }
            assert_eq!(won, 20);
        });
    }
    assert!(c.sim.run_until_idle(secs(300)), "a set never finished");
    assert_eq!(history.check(), Ok(()));
    assert_eq!(history.acquisitions(), 120);
}

#[test]
fn losing_one_key_stops_the_work_and_the_set_reports_it() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 104, config().with_expiry(secs(3)));
        let set = c.manager.lock_all(["a", "b"]).renew_every(secs(1));
        let nodes = c.nodes.clone();
        let clock = c.clock.clone();
        let (r, state) = c.sim.block_on(async move {
            let all = set.try_acquire().await.unwrap();
            let r = all
                .run(async {
                    clock.sleep_until(clock.now() + ms(1_500)).await;
                    // Someone deletes "b" everywhere: the next renewal finds it gone.
                    for node in &nodes {
                        let _ = node.release("b", all.leases()[1].token()).await;
                    }
                    clock.sleep_until(clock.now() + secs(30)).await;
                })
                .await;
            let state = all.state();
            let _ = all.release().await;
            (r, state)
        });
        match r {
            Err(Error::Lost {
                reason: LossReason::NotHeld,
                ref key,
                ..
            }) if key == "b" => {}
            other => panic!("n={n}: {other:?}"),
        }
        assert_eq!(state, LeaseState::Lost(LossReason::NotHeld));
        for node in &c.nodes {
            assert_eq!(
                node.get("a"),
                None,
                "n={n}: the kept key was released with the set"
            );
        }
    }
}

#[test]
fn an_empty_set_or_a_repeated_key_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(1, 105, config());
    for set in [
        c.manager.lock_all(Vec::<String>::new()),
        c.manager.lock_all(["a", "b", "a"]),
        c.manager.lock_all(["a", ""]),
    ] {
        let r = c.sim.block_on(async move { set.try_acquire().await });
        assert!(
            matches!(r, Err(Error::Config(ConfigError::InvalidKey(_)))),
            "{r:?}"
        );
    }
    assert_eq!(c.calls(), 0);
}

/// Tickets of leases handed off between the clients, as text.
type Mailbox = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// One hostile client that takes random subsets of three keys as sets, single keys, and leases another
/// client handed off; holds them for a while (renewed in the background, by a set's `run`, or not) and
/// releases, drops or hands them off.
async fn mixing_client(
    manager: redlease::LockManager,
    clock: redlease_testkit::SkewedClock,
    mut rng: redlease::machine::Jitter,
    horizon: Duration,
    fenced: bool,
    mailbox: Mailbox,
) {
    let end = clock.now() + horizon;
    while clock.now() < end {
        if rng.next_u64() % 3 == 0 {
            let waiting = mailbox.lock().unwrap().pop();
            if let Some(text) = waiting {
                let ticket: redlease::LeaseTicket = text.parse().unwrap();
                let mut lock = manager.lock(ticket.key());
                if fenced {
                    lock = lock.fenced(format!("{}:fence", ticket.key()));
                }
                if rng.next_u64() % 2 == 0 {
                    lock = lock.auto_renew(ms(500));
                }
                if let Ok(lease) = lock.resume(&ticket).await {
                    let sleep = clock.sleep_until(clock.now() + ms(rng.next_u64() % 1_500));
                    race(lease.lost(), sleep).await;
                    let _ = lease.release().await;
                }
                continue;
            }
        }
        let keys: Vec<&str> = ["k1", "k2", "k3"]
            .into_iter()
            .filter(|_| rng.next_u64() % 2 == 0)
            .collect();
        let hold = ms(rng.next_u64() % 1_500);
        let patience = ms(200 + rng.next_u64() % 1_500);
        let renew = rng.next_u64() % 2 == 0;
        if keys.len() >= 2 {
            let mut set = manager.lock_all(keys);
            if renew {
                set = set.auto_renew(ms(500));
            }
            if fenced {
                set = set.fenced(|k| format!("{k}:fence"));
            }
            if let Ok(all) = set.acquire_within(patience).await {
                if rng.next_u64() % 3 == 0 {
                    // A manual extension of the whole set, longer or shorter than the TTL (one step on one
                    // node).
                    let _ = all.extend(ms(500 + rng.next_u64() % 3_000)).await;
                }
                let lost = all.lost();
                let sleep = clock.sleep_until(clock.now() + hold);
                if !renew && rng.next_u64() % 2 == 0 {
                    // Held by `run`: renewed meanwhile (on one node together, one step per round), and cut
                    // wherever the hold ends.
                    let _ = all.run(sleep).await;
                } else {
                    race(lost, sleep).await;
                }
                if rng.next_u64() % 4 == 0 {
                    drop(all);
                } else {
                    let _ = all.release().await;
                }
                continue;
            }
        } else if let Some(key) = keys.first().copied().or(Some("k2")) {
            let mut lock = manager.lock(key);
            if renew {
                lock = lock.auto_renew(ms(500));
            }
            if fenced {
                lock = lock.fenced(format!("{key}:fence"));
            }
            if let Ok(lease) = lock.acquire_within(patience).await {
                let sleep = clock.sleep_until(clock.now() + hold);
                race(lease.lost(), sleep).await;
                if rng.next_u64() % 3 == 0 {
                    if let Ok(ticket) = lease.handoff() {
                        mailbox.lock().unwrap().push(ticket.encode());
                    }
                } else {
                    let _ = lease.release().await;
                }
                continue;
            }
        }
        clock
            .sleep_until(clock.now() + ms(1 + rng.next_u64() % 200))
            .await;
    }
}

async fn race(a: impl std::future::Future, b: impl std::future::Future) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    std::future::poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    })
    .await
}

/// Sets, single locks and leases handed between clients over three keys, three hostile clients (skewed
/// clocks, pauses, late and reordered requests, every random fault): no key ever has two holders, whether a
/// set, a single or a resumed lease holds it, and
/// every loss is reported by its deadline — also of a part held while a set's later keys are tried (seed 87
/// found a part expiring during a client pause reported only when the attempt gave up).
/// `REDLEASE_MULTI_SEEDS` runs more seeds.
#[test]
fn sets_single_and_resumed_leases_never_overlap_on_a_key_under_hostile_faults() {
    let (mut total, mut resumed) = (0, 0);
    let seeds = hostile_seeds("REDLEASE_MULTI_SEEDS", 1000, |seed| {
        let mut c = hostile_cluster(seed);
        let n = c.nodes.len();
        let history = History::new();
        let horizon = secs(8);
        let mailbox = Mailbox::default();
        for id in 0..3u64 {
            let (manager, clock) = c.hostile_client(id, &history, horizon, 2);
            let rng = c.sim.rng();
            c.sim.client(id).spawn(mixing_client(
                manager,
                clock,
                rng,
                horizon,
                n == 1,
                mailbox.clone(),
            ));
        }
        assert!(
            c.sim.run_until_idle(secs(120)),
            "seed {seed}: clients stuck"
        );
        c.assert_every_lock_key_has_ttl();
        if let Err(v) = history.check() {
            panic!("seed {seed}: {v}");
        }
        total += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Acquired { .. }))
            .count();
        resumed += history
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Resumed { .. }))
            .count();
    });
    assert!(total > seeds as usize * 5, "only {total} acquisitions");
    assert!(
        resumed * 20 > total,
        "only {resumed} resumptions of {total}"
    );
}

/// A node whose `multi_key` is not implemented (a custom node of an older version): the default answer.
struct NoMultiKey(Box<dyn RedisNode>);

impl NodeWrapper for NoMultiKey {
    type Inner = dyn RedisNode;

    fn inner(&self) -> &(dyn RedisNode + 'static) {
        &*self.0
    }

    fn multi_key<'a, 'b, 'c, 'f>(
        &'a self,
        _items: &'b [MultiKeyItem<'c>],
        _op: MultiKeyOp,
    ) -> redlease::NodeFuture<'f, MultiKeyReply>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        Box::pin(std::future::ready(Err(NodeError::not_applied(
            NodeErrorKind::Unsupported,
            "not implemented",
        ))))
    }
}

/// On one node a set is one atomic step: a set refused for its last key writes nothing at all — no earlier
/// key, no fence — in one call; a won set gets every key and every fence in one call, and its release is
/// one call. A node without the step takes the keys one at a time (the first keys written and deleted
/// again, their fences spent), with the same outcome.
#[test]
fn on_one_node_a_set_is_one_step_and_a_refused_set_writes_nothing() {
    for one_step in [true, false] {
        let mut c = Cluster::new(1, 106, config());
        let (manager, faults) = if one_step {
            (c.manager.clone(), c.faults[0].clone())
        } else {
            let (faulty, faults) = redlease_testkit::FaultyNode::with_spawner(
                c.nodes[0].clone(),
                c.clock.clone(),
                c.sim.spawner(),
            );
            let manager = redlease::LockManager::single(NoMultiKey(Box::new(faulty)), config())
                .unwrap()
                .with_timer(c.clock.clone());
            (manager, faults)
        };
        let calls = || faults.calls(Op::AcquireFenced) + faults.calls(Op::Acquire);
        let node = c.nodes[0].clone();
        node.set("c", "someone-else", Some(secs(5)));
        let set = manager
            .lock_all(["b", "a", "c"])
            .fenced(|k| format!("{k}:fence"));
        let r = c.sim.block_on({
            let set = set.clone();
            async move { set.try_acquire().await }
        });
        assert!(r.unwrap_err().is_contended(), "one step {one_step}");
        if one_step {
            assert_eq!(calls(), 1, "one call for the whole set");
            assert_eq!(node.keys(), ["c"], "nothing written: no key, no fence");
        } else {
            assert_eq!(calls(), 3, "one call per key");
            assert_eq!(node.get("a"), None, "released again");
            assert_eq!(
                node.get("a:fence").as_deref(),
                Some(&b"1"[..]),
                "a fence spent"
            );
        }
        node.del("c");
        let before = (calls(), faults.calls(Op::Release));
        let all = c
            .sim
            .block_on({
                let set = set.clone();
                async move { set.try_acquire().await }
            })
            .unwrap();
        for lease in all.leases() {
            assert_eq!(
                node.get(lease.key()).as_deref(),
                Some(lease.token().as_str().as_bytes())
            );
            let fence = node.get(&format!("{}:fence", lease.key())).unwrap();
            assert_eq!(
                lease.fencing_token().map(|f| f.to_string().into_bytes()),
                Some(fence)
            );
        }
        let expected = if one_step { 1 } else { 3 };
        assert_eq!(
            calls() - before.0,
            expected,
            "one step {one_step}: acquisition calls"
        );
        // Extended as one: longer, then shorter (which never shortens a key).
        let extends = faults.calls(Op::Extend);
        let set_ttls = |all: &redlease::MultiLease| {
            all.leases()
                .iter()
                .map(|l| node.pttl(l.key()).flatten().unwrap())
                .collect::<Vec<_>>()
        };
        c.sim.block_on(all.extend(secs(60))).unwrap();
        assert_eq!(set_ttls(&all), vec![secs(60); 3]);
        c.sim.block_on(all.extend(secs(5))).unwrap();
        assert_eq!(set_ttls(&all), vec![secs(60); 3], "never shortened");
        assert!(
            all.remaining() <= secs(5),
            "the set believes the shorter TTL it asked for"
        );
        assert_eq!(
            faults.calls(Op::Extend) - extends,
            2 * expected,
            "one step {one_step}: extension calls"
        );
        c.sim.block_on(async move { all.release().await }).unwrap();
        assert_eq!(
            faults.calls(Op::Release) - before.1,
            expected,
            "one step {one_step}: release calls"
        );
        for key in ["a", "b", "c"] {
            assert_eq!(node.get(key), None, "{key} released");
        }
    }
}

/// A set's one-step acquisition and release dropped at every await point (the step slow, so that a cut
/// lands while it is on its way): nothing is left behind once the background clean-up ran, and the set
/// can be taken again at once.
#[test]
fn a_one_step_set_cancelled_at_every_await_point_leaves_nothing_behind() {
    let polls = each_poll(
        || {
            let c = Cluster::with_spawner(1, 107, config().with_expiry(secs(30)));
            c.faults[0].script(Op::Acquire, [Fault::SlowReply(ms(40))]);
            c.faults[0].script(Op::Release, [Fault::SlowReply(ms(40))]);
            c
        },
        |c| {
            let set = c.manager.lock_all(["a", "b", "c"]);
            Box::pin(async move {
                let all = set.try_acquire().await.unwrap();
                all.release().await.unwrap();
            })
        },
        |c, cut| {
            c.sim.run_for(secs(1));
            for key in ["a", "b", "c"] {
                assert_eq!(c.nodes[0].get(key), None, "{cut:?}: {key} left behind");
            }
            let set = c.manager.lock_all(["a", "b", "c"]);
            let again = c
                .sim
                .block_on(async move { set.try_acquire().await })
                .unwrap();
            c.sim
                .block_on(async move { again.release().await })
                .unwrap();
        },
    );
    assert!(
        polls >= 3,
        "completed in {polls} polls: nothing was cut inside it"
    );
}

/// A refusal no retry can change (here an unusable fence counter of the last key) ends a waiting set's
/// acquisition at once, as it ends a single lock's: the set does not take its first key again and again
/// until the deadline.
#[test]
fn a_set_refused_for_good_ends_its_wait_at_once() {
    for n in [1, 3] {
        let mut c = Cluster::new(n, 108, config());
        for node in &c.nodes {
            node.set("c:fence", "not a number", None);
        }
        let set = c.manager.lock_all(["a", "c"]);
        let set = if n == 1 {
            set.fenced(|k| format!("{k}:fence"))
        } else {
            // Redlock has no fences: a key of another owner that never expires stands in for it.
            for node in &c.nodes {
                node.set("c", "someone-else", None);
            }
            set
        };
        let start = c.now();
        let r = c
            .sim
            .block_on(async move { set.acquire_within(secs(10)).await });
        let e = r.unwrap_err();
        if n == 1 {
            assert!(
                matches!(
                    e,
                    Error::NotAcquired {
                        reason: redlease::NotAcquiredReason::Refused,
                        ..
                    }
                ),
                "n={n}: {e}"
            );
            assert!(
                c.now() - start < secs(1),
                "n={n}: refused for good, yet it kept trying for {:?} ({} calls)",
                c.now() - start,
                c.calls()
            );
        }
        for node in &c.nodes {
            assert_eq!(node.get("a"), None, "n={n}: nothing left");
        }
    }
}

/// What a [`SetNode`] counted and how it behaves.
#[derive(Default)]
struct SetNetState {
    /// `extend` calls (one key each).
    extends: u64,
    /// `multi_key(Extend)` calls (the whole set in one step).
    joint_extends: u64,
    /// Answer every `multi_key(Extend)` with a definite `Unsupported`, sending nothing (a node that takes
    /// and releases a set in one step but cannot extend one so).
    unsupported: bool,
    /// `multi_key(Extend)` calls answered `Unsupported`.
    refused: u64,
    /// Keep the next this many `multi_key(Extend)` requests in the network: the caller never hears back,
    /// [`SetNet::deliver`] applies them later.
    hold: u32,
    /// Extensions set the TTL asked for even when the key had more left (a plain `PEXPIRE`): a node that
    /// breaks the never-shorten rule, so that only the core's records of requests in flight keep a lease
    /// safe from a late, shorter one.
    shortening: bool,
    /// Answer the next `multi_key(Extend)` with this many flags, every one `true`, applying nothing: a node
    /// (or a proxy in front of it) answering out of protocol.
    malformed: Option<usize>,
    /// Refuse every `multi_key(Extend)` with a definite (not applied) error of this kind while set.
    refuse: Option<NodeErrorKind>,
    /// Answer (and apply) every single-key `release` this long after it was sent, by this clock.
    slow_release: Option<(redlease_testkit::VirtualClock, Duration)>,
    held: Vec<Box<dyn FnOnce() + Send>>,
}

/// The control panel of a [`SetNode`].
#[derive(Clone, Default)]
struct SetNet(std::sync::Arc<std::sync::Mutex<SetNetState>>);

impl SetNet {
    fn with<T>(&self, f: impl FnOnce(&mut SetNetState) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    fn counts(&self) -> (u64, u64) {
        self.with(|s| (s.joint_extends, s.extends))
    }

    /// Applies every held request now, in the order they were sent.
    fn deliver(&self) -> usize {
        let held = self.with(|s| std::mem::take(&mut s.held));
        let n = held.len();
        for apply in held {
            apply();
        }
        n
    }
}

/// A [`MemoryNode`](redlease_testkit::MemoryNode) that counts extension requests by kind and can hold
/// one-step extensions in the network or apply extensions as a plain `PEXPIRE`.
struct SetNode {
    node: redlease_testkit::MemoryNode,
    net: SetNet,
}

impl SetNode {
    /// Extends `key` held by `token` to `ttl` as this node does; whether it held the token.
    fn apply_extend(
        node: &redlease_testkit::MemoryNode,
        shortening: bool,
        key: &str,
        token: &redlease::Token,
        ttl: redlease::Ttl,
    ) -> bool {
        if node.get(key).as_deref() != Some(token.as_str().as_bytes()) {
            return false;
        }
        if shortening {
            node.set(key, token.as_str(), Some(ttl.as_duration()));
            true
        } else {
            redlease_testkit::block_on(node.extend(key, token, ttl)).unwrap()
        }
    }
}

impl NodeWrapper for SetNode {
    type Inner = redlease_testkit::MemoryNode;

    fn inner(&self) -> &redlease_testkit::MemoryNode {
        &self.node
    }

    fn extend<'a, 'b, 'c, 'f>(
        &'a self,
        key: &'b str,
        token: &'c redlease::Token,
        ttl: redlease::Ttl,
    ) -> redlease::NodeFuture<'f, bool>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        let shortening = self.net.with(|s| {
            s.extends += 1;
            s.shortening
        });
        let done = Self::apply_extend(&self.node, shortening, key, token, ttl);
        Box::pin(std::future::ready(Ok(done)))
    }

    fn release<'a, 'b, 'c, 'f>(
        &'a self,
        key: &'b str,
        token: &'c redlease::Token,
    ) -> redlease::NodeFuture<'f, bool>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        let slow = self.net.with(|s| s.slow_release.clone());
        Box::pin(async move {
            if let Some((clock, after)) = slow {
                clock.sleep_until(clock.now() + after).await;
            }
            self.node.release(key, token).await
        })
    }

    fn multi_key<'a, 'b, 'c, 'f>(
        &'a self,
        items: &'b [MultiKeyItem<'c>],
        op: MultiKeyOp,
    ) -> redlease::NodeFuture<'f, MultiKeyReply>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
        Self: 'f,
    {
        let mut st = self.net.0.lock().unwrap();
        let MultiKeyOp::Extend { ttl } = op else {
            drop(st);
            return self.node.multi_key(items, op);
        };
        if st.unsupported {
            st.refused += 1;
            return Box::pin(std::future::ready(Err(NodeError::not_applied(
                NodeErrorKind::Unsupported,
                "not implemented",
            ))));
        }
        st.joint_extends += 1;
        if let Some(kind) = st.refuse {
            return Box::pin(std::future::ready(Err(NodeError::not_applied(
                kind,
                "refused (nothing applied)",
            ))));
        }
        if let Some(n) = st.malformed.take() {
            return Box::pin(std::future::ready(Ok(MultiKeyReply::Done(vec![true; n]))));
        }
        let owned: Vec<(String, redlease::Token)> = items
            .iter()
            .map(|i| (i.key.to_owned(), i.token.clone()))
            .collect();
        let node = self.node.clone();
        let shortening = st.shortening;
        let apply = move || -> Vec<bool> {
            owned
                .iter()
                .map(|(key, token)| Self::apply_extend(&node, shortening, key, token, ttl))
                .collect()
        };
        if st.hold > 0 {
            st.hold -= 1;
            st.held.push(Box::new(move || {
                let _ = apply();
            }));
            return Box::pin(std::future::pending());
        }
        drop(st);
        Box::pin(std::future::ready(Ok(MultiKeyReply::Done(apply()))))
    }
}

/// A manager over one [`SetNode`] on `sim`'s clock (with its spawner), reporting to `history` as client 1.
fn set_node_manager(
    sim: &redlease_testkit::Sim,
    node: &redlease_testkit::MemoryNode,
    net: &SetNet,
    history: &History,
    config: redlease::Config,
) -> redlease::LockManager {
    let set_node = SetNode {
        node: node.clone(),
        net: net.clone(),
    };
    redlease::LockManager::single(set_node, config)
        .unwrap()
        .with_timer(sim.clock())
        .with_spawner(sim.spawner())
        .with_observer(history.recorder(1))
}

/// A simulation with one [`SetNode`] (its [`SetNet`] set up by `setup`) and a manager over it
/// ([`set_node_manager`]) reporting to a fresh history.
fn set_rig(
    seed: u64,
    config: redlease::Config,
    setup: impl FnOnce(&mut SetNetState),
) -> (
    redlease_testkit::Sim,
    redlease_testkit::VirtualClock,
    redlease_testkit::MemoryNode,
    SetNet,
    History,
    redlease::LockManager,
) {
    let sim = redlease_testkit::Sim::new(seed);
    let clock = sim.clock();
    let node = redlease_testkit::MemoryNode::with_timer(clock.clone());
    let (net, history) = (SetNet::default(), History::new());
    net.with(setup);
    let manager = set_node_manager(&sim, &node, &net, &history, config);
    (sim, clock, node, net, history, manager)
}

const SET_OF_FOUR: [&str; 4] = ["a", "b", "c", "d"];

/// A [`set_rig`] on `config` with [`SET_OF_FOUR`] held by its manager, described by `describe` (a renewal,
/// or none).
fn holding_four(
    seed: u64,
    config: redlease::Config,
    describe: impl FnOnce(redlease::MultiLock) -> redlease::MultiLock,
) -> (
    redlease_testkit::Sim,
    redlease_testkit::VirtualClock,
    redlease_testkit::MemoryNode,
    SetNet,
    History,
    redlease::MultiLease,
) {
    let (mut sim, clock, node, net, history, manager) = set_rig(seed, config, |_| {});
    let all = sim
        .block_on(describe(manager.lock_all(SET_OF_FOUR)).try_acquire())
        .unwrap();
    (sim, clock, node, net, history, all)
}

/// Renewal of a set on one node is one step per round, like its acquisition, extension and release: a set
/// of four keys held by `run` over ten renewal intervals sends one `multi_key` extension per round and no
/// extension of a single key, and every part is renewed in each round (its own `Extended` event).
#[test]
fn a_set_renewed_by_run_extends_every_key_in_one_step_per_round() {
    let (mut sim, clock, node, net, history, manager) =
        set_rig(121, config().with_expiry(secs(3)), |_| {});
    let set = manager.lock_all(SET_OF_FOUR).renew_every(secs(1));
    let all = sim.block_on(set.try_acquire()).unwrap();
    let held = sim.block_on(all.run(clock.sleep_until(clock.now() + ms(10_500))));
    assert!(held.is_ok(), "{held:?}");
    let (joint, single) = net.counts();
    assert_eq!(single, 0, "no key was extended on its own");
    assert_eq!(
        joint, 10,
        "one step per renewal round (every second for 10.5 s)"
    );
    for key in SET_OF_FOUR {
        let renewed = history
            .events()
            .iter()
            .filter(|e| e.lock == key && matches!(e.kind, EventKind::Extended { .. }))
            .count();
        assert_eq!(renewed, 10, "{key}: renewed in every round");
        assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
    }
    sim.block_on(all.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// The same for a set renewed in the background ([`MultiLock::auto_renew`](redlease::MultiLock)): one
/// step per round, no extension of a single key, until the set is released; nothing after it.
#[test]
fn a_set_renewed_in_the_background_extends_every_key_in_one_step_per_round() {
    let (mut sim, _clock, node, net, history, manager) =
        set_rig(122, config().with_expiry(secs(3)), |_| {});
    let set = manager.lock_all(SET_OF_FOUR).auto_renew(secs(1));
    let all = sim.block_on(set.try_acquire()).unwrap();
    sim.run_for(ms(10_500));
    assert!(all.is_held());
    let (joint, single) = net.counts();
    assert_eq!(single, 0, "no key was extended on its own");
    assert_eq!(
        joint, 10,
        "one step per renewal round (every second for 10.5 s)"
    );
    for key in SET_OF_FOUR {
        assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
    }
    sim.block_on(all.release()).unwrap();
    sim.run_for(secs(5));
    assert_eq!(net.counts(), (10, 0), "no renewal after the release");
    assert_eq!(history.check(), Ok(()));
}

/// Waits until `d` has passed on `clock`; `fut` is dropped then if it has not finished. `true` if it did.
async fn within(clock: &impl Timer, d: Duration, fut: impl std::future::Future) -> bool {
    let mut fut = std::pin::pin!(fut);
    let mut sleep = clock.sleep_until(clock.now() + d);
    std::future::poll_fn(|cx| {
        if fut.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// A second client over `node` that tries to take `key` at `at` (reporting to `history` as client 2) and
/// holds it for a while if it can.
fn other_client_tries(
    sim: &redlease_testkit::Sim,
    node: &redlease_testkit::MemoryNode,
    history: &History,
    key: &'static str,
    at: std::time::Instant,
) {
    let clock = sim.clock();
    let other = redlease::LockManager::single(node.clone(), config())
        .unwrap()
        .with_timer(clock.clone())
        .with_observer(history.recorder(2));
    sim.spawn(async move {
        clock.sleep_until(at).await;
        if let Ok(lease) = other.lock(key).expiry(secs(30)).try_acquire().await {
            clock.sleep_until(clock.now() + secs(5)).await;
            drop(lease);
        }
    });
}

/// Whether client 2 acquired a lock.
fn took(history: &History) -> bool {
    history
        .events()
        .iter()
        .any(|e| e.client == 2 && matches!(e.kind, EventKind::Acquired { .. }))
}

/// A joint renewal round dropped with its request still in the network (`run` returned mid-round) must stay
/// on record: a longer manual extension right after it must not count the node, because the stale renewal
/// (10 s) may land after it. On a node that applies a late extension as a plain `PEXPIRE` (shortening the
/// key), counting it would have the set believe 60 s while the key expires 10 s after the late request
/// lands, and another client take it.
#[test]
fn a_dropped_joint_renewal_round_stays_on_record_for_a_later_longer_extension() {
    let (mut sim, clock, node, net, history, manager) =
        set_rig(123, config().with_expiry(secs(10)), |s| s.shortening = true);
    let set = manager.lock_all(SET_OF_FOUR).renew_every(secs(3));
    let start = clock.now();
    let all = sim.block_on(set.try_acquire()).unwrap();
    let lost = all.lost();
    sim.spawn(async move {
        lost.await;
    });
    // The renewal round at 3 s is held in the network; `run` returns at 3.1 s and drops it.
    net.with(|s| s.hold = 1);
    let work = clock.sleep_until(start + ms(3_100));
    assert!(sim.block_on(all.run(work)).is_ok());
    assert_eq!(
        net.counts(),
        (1, 0),
        "one joint renewal round, cut in flight"
    );
    // A longer manual extension of the set: applied, but the node may still apply the stale 10 s after it.
    let extended = sim.block_on(all.extend(secs(60)));
    // The stale renewal lands: the keys expire 10 s from now (shortened from 60 s).
    assert_eq!(net.deliver(), 1);
    let landed = clock.now();
    other_client_tries(&sim, &node, &history, "a", landed + ms(10_500));
    sim.run_for(secs(20));
    assert!(took(&history), "the other client took the expired key");
    assert_eq!(
        history.check(),
        Ok(()),
        "two holders of a key (the extension: {extended:?})"
    );
    assert!(
        matches!(extended, Err(Error::Quorum(_))),
        "the node counted although a shorter renewal may still land after it: {extended:?}"
    );
    assert!(!all.is_held());
    drop(all);
}

/// A shorter manual extension of the set (2 s) cut with its request in the network must keep the next joint
/// renewal round (10 s) from counting the node: on a node that applies a late extension as a plain `PEXPIRE`,
/// the stale 2 s landing after the renewal shortens every key under the set's belief. The set is lost at the
/// capped deadline instead, and the other client's acquisition never overlaps it.
#[test]
fn a_joint_renewal_does_not_count_a_node_where_a_shorter_extension_may_still_land() {
    let (mut sim, clock, node, net, history, manager) =
        set_rig(124, config().with_expiry(secs(10)), |s| s.shortening = true);
    let set = manager.lock_all(SET_OF_FOUR).renew_every(secs(3));
    let start = clock.now();
    let all = sim.block_on(set.try_acquire()).unwrap();
    // The stale 2 s extension lands at 3.2 s, after the renewal rounds planned for the capped deadline
    // (2.48 s on) and before the next renewal a round counted at 2.48 s would plan (5.48 s): the keys expire
    // at 5.2 s, and the other client tries at 5.3 s.
    {
        let (net, clock) = (net.clone(), clock.clone());
        sim.spawn(async move {
            clock.sleep_until(start + ms(3_200)).await;
            net.deliver();
        });
    }
    other_client_tries(&sim, &node, &history, "a", start + ms(5_300));
    let work = async {
        clock.sleep_until(start + secs(1)).await;
        net.with(|s| s.hold = 1);
        let done = within(&clock, ms(10), all.extend(secs(2))).await;
        assert!(!done, "the extension was cut before any reply");
        clock.sleep_until(start + secs(8)).await;
    };
    let r = sim.block_on(all.run(work));
    assert!(
        matches!(r, Err(Error::Lost { .. })),
        "the set's renewal counted the node: {r:?}"
    );
    sim.run_for(secs(10));
    assert_eq!(history.check(), Ok(()), "two holders of a key");
    assert!(took(&history), "the other client took the key");
    assert!(net.counts().0 >= 2, "joint renewal rounds ran");
    drop(all);
}

/// A node that takes and releases a set in one step but cannot extend one (`Unsupported`, nothing sent):
/// the set's renewal falls back to one extension per key for the rest of its hold — asked once, not again
/// by a later `run` — and the set stays held, never at risk.
#[test]
fn a_set_whose_node_cannot_extend_it_in_one_step_is_renewed_key_by_key() {
    for background in [false, true] {
        let (mut sim, clock, node, net, history, manager) =
            set_rig(125, config().with_expiry(secs(3)), |s| s.unsupported = true);
        let set = manager.lock_all(SET_OF_FOUR);
        let set = if background {
            set.auto_renew(secs(1))
        } else {
            set.renew_every(secs(1))
        };
        let all = sim.block_on(set.try_acquire()).unwrap();
        let mut states = Vec::new();
        for _ in 0..2 {
            if background {
                sim.run_for(ms(5_250));
            } else {
                let start = clock.now();
                let held = sim.block_on(all.run(async {
                    while clock.now() < start + ms(5_250) {
                        clock.sleep_until(clock.now() + ms(50)).await;
                        states.push(all.state());
                    }
                }));
                assert!(held.is_ok(), "{held:?}");
            }
        }
        assert!(
            states.iter().all(|s| *s == LeaseState::Held),
            "background {background}: {states:?}"
        );
        assert_eq!(all.state(), LeaseState::Held, "background {background}");
        let (joint, single) = net.counts();
        assert_eq!(joint, 0, "background {background}");
        assert_eq!(
            net.with(|s| s.refused),
            1,
            "background {background}: the step asked for once"
        );
        assert!(
            (36..=44).contains(&single),
            "background {background}: {single} extensions of one key (4 keys, every second for 10.5 s)"
        );
        for key in SET_OF_FOUR {
            assert!(node.pttl(key).flatten().unwrap() > secs(1), "{key}");
        }
        sim.block_on(all.release()).unwrap();
        assert_eq!(history.check(), Ok(()));
    }
}

/// One part of a set renewed together is deleted by someone else: the next joint round finds it gone. `run`
/// stops the work with `Error::Lost` naming that part; the other parts stay held (until the set is
/// released). Renewed in the background, the other parts go on being renewed together.
#[test]
fn a_part_lost_from_a_joint_renewal_is_reported_and_the_others_stay_held() {
    for background in [false, true] {
        let (mut sim, clock, node, net, history, manager) =
            set_rig(126, config().with_expiry(secs(3)), |_| {});
        let set = manager.lock_all(SET_OF_FOUR);
        let set = if background {
            set.auto_renew(secs(1))
        } else {
            set.renew_every(secs(1))
        };
        let all = sim.block_on(set.try_acquire()).unwrap();
        let start = clock.now();
        let c = all.leases()[2].token().clone();
        let deleted = {
            let (node, clock) = (node.clone(), clock.clone());
            async move {
                clock.sleep_until(start + ms(1_500)).await;
                assert!(node.release("c", &c).await.unwrap());
            }
        };
        if background {
            sim.block_on(deleted);
            sim.run_for(secs(10));
            assert_eq!(
                all.leases()[2].state(),
                LeaseState::Lost(LossReason::NotHeld)
            );
            let (joint, single) = net.counts();
            assert_eq!(single, 0);
            assert!(joint >= 10, "{joint} joint rounds");
        } else {
            let r = sim.block_on(all.run(async {
                deleted.await;
                clock.sleep_until(clock.now() + secs(30)).await;
            }));
            match r {
                Err(Error::Lost {
                    reason: LossReason::NotHeld,
                    ref key,
                    ..
                }) if key == "c" => {}
                other => panic!("{other:?}"),
            }
            assert!(
                clock.now() < start + ms(2_500),
                "stopped at the first round after the deletion"
            );
            assert_eq!(net.counts(), (2, 0));
        }
        assert_eq!(all.state(), LeaseState::Lost(LossReason::NotHeld));
        for (i, lease) in all.leases().iter().enumerate() {
            if i == 2 {
                continue;
            }
            assert_eq!(lease.state(), LeaseState::Held, "background {background}");
            assert_eq!(
                node.get(lease.key()).as_deref(),
                Some(lease.token().as_str().as_bytes())
            );
        }
        let released = sim.block_on(all.release());
        assert!(
            matches!(released, Err(Error::Lost { ref key, .. }) if key == "c"),
            "{released:?}"
        );
        for key in SET_OF_FOUR {
            assert_eq!(node.get(key), None, "{key} released");
        }
        assert_eq!(history.check(), Ok(()));
    }
}

/// A set held by `run` with its parts renewed together, on one node, `run` dropped after each of its polls
/// (the joint rounds' requests applied at once and answered 40 ms later, one of them held in the network for
/// 500 ms): afterwards no part believes it is held longer than its key lives, a shorter and then a longer
/// manual extension keep that true, and another client that takes each key once the set's belief ends never
/// overlaps it.
#[test]
fn a_set_run_cut_at_every_poll_never_believes_more_than_its_keys_hold() {
    struct Env {
        c: Cluster,
        all: std::sync::Arc<redlease::MultiLease>,
        history: History,
    }
    impl redlease_testkit::cancel::SimHost for Env {
        fn sim(&mut self) -> &mut redlease_testkit::Sim {
            &mut self.c.sim
        }
    }
    let believes_no_more_than_its_keys = |env: &Env, when: &str| {
        for lease in env.all.leases() {
            if lease.is_held() {
                let left = env.c.nodes[0].pttl(lease.key()).flatten();
                assert!(
                    left.is_some_and(|left| left >= lease.remaining()),
                    "{when}: {} believes {:?}, its key has {left:?}",
                    lease.key(),
                    lease.remaining()
                );
            }
        }
    };
    let polls = each_poll(
        || {
            let mut c = Cluster::with_spawner(1, 127, config().with_expiry(secs(3)));
            let history = History::new();
            c.manager = c.manager.clone().with_observer(history.recorder(1));
            let set = c.manager.lock_all(SET_OF_FOUR).renew_every(secs(1));
            let all = std::sync::Arc::new(c.sim.block_on(set.try_acquire()).unwrap());
            c.faults[0].script(
                Op::Extend,
                [
                    Fault::SlowReply(ms(40)),
                    Fault::Late(ms(500)),
                    Fault::SlowReply(ms(40)),
                ],
            );
            Env { c, all, history }
        },
        |env| {
            let (all, clock) = (env.all.clone(), env.c.clock.clone());
            async move {
                let held = all.run(clock.sleep_until(clock.now() + ms(3_500))).await;
                assert!(held.is_ok(), "{held:?}");
            }
        },
        |env, cut| {
            believes_no_more_than_its_keys(env, &format!("{cut:?}"));
            let all = env.all.clone();
            let _ = env.c.sim.block_on(async move { all.extend(secs(1)).await });
            believes_no_more_than_its_keys(env, &format!("{cut:?}, extended to 1 s"));
            let all = env.all.clone();
            let _ = env.c.sim.block_on(async move { all.extend(secs(5)).await });
            believes_no_more_than_its_keys(env, &format!("{cut:?}, extended to 5 s"));
            // Another client takes each key as soon as it can (polling every 100 ms) and holds it a while.
            let clock = env.c.clock.clone();
            let other = redlease::LockManager::single(env.c.nodes[0].clone(), config())
                .unwrap()
                .with_timer(clock.clone())
                .with_observer(env.history.recorder(2));
            for key in SET_OF_FOUR {
                let (other, clock) = (other.clone(), clock.clone());
                env.c.sim.spawn(async move {
                    let lock = other.lock(key).expiry(secs(3));
                    for _ in 0..100 {
                        if let Ok(lease) = lock.try_acquire().await {
                            clock.sleep_until(clock.now() + secs(1)).await;
                            drop(lease);
                            return;
                        }
                        clock.sleep_until(clock.now() + ms(100)).await;
                    }
                    panic!("{key} never came free");
                });
            }
            env.c.sim.run_for(secs(12));
            if let Err(v) = env.history.check() {
                panic!("{cut:?}: {v}");
            }
        },
    );
    assert!(
        polls >= 5,
        "completed in {polls} polls: nothing was cut inside it"
    );
}

/// A set renewed in the background that first waited for one of its keys (taken on its own, then the rest
/// in one step) renews all of them together too: the waited-for key is not left with a renewal of its own.
#[test]
fn a_set_that_waited_for_a_key_renews_every_key_in_one_step() {
    let (mut sim, _clock, _node, net, history, manager) =
        set_rig(128, config().with_expiry(secs(3)), |_| {});
    let holder = sim
        .block_on(manager.lock("b").expiry(secs(3)).try_acquire())
        .unwrap();
    let set = manager.lock_all(SET_OF_FOUR).auto_renew(secs(1));
    let won = std::sync::Arc::new(std::sync::Mutex::new(None));
    sim.spawn({
        let won = won.clone();
        async move {
            *won.lock().unwrap() = Some(set.acquire_within(secs(20)).await);
        }
    });
    sim.run_for(ms(500));
    sim.block_on(holder.release()).unwrap();
    sim.run_for(ms(100));
    let all = won.lock().unwrap().take().expect("won").unwrap();
    let before = net.counts();
    sim.run_for(ms(10_500));
    assert!(all.is_held());
    let (joint, single) = net.counts();
    assert_eq!(single - before.1, 0, "no key was extended on its own");
    assert!(
        (9..=11).contains(&(joint - before.0)),
        "{} joint rounds in 10.5 s",
        joint - before.0
    );
    sim.block_on(all.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// A set on a node whose manager batches renewals ([`Config::with_renewal_batching`]) is renewed through
/// the batches, as its keys would be if each were held alone: a key's extension rides in its node's batch
/// (`extend_many`, each key's own compare-and-expire), and the set is never extended as one step, although
/// the node could take one and every part's renewal claim was free.
#[test]
fn a_set_under_batched_renewal_is_renewed_through_the_batches() {
    let mut sim = redlease_testkit::Sim::new(130);
    let clock = sim.clock();
    let node = redlease_testkit::MemoryNode::with_timer(clock.clone());
    let (net, history) = (SetNet::default(), History::new());
    let config = config()
        .with_expiry(secs(3))
        .with_renewal_batching(ms(50), 64);
    let manager = set_node_manager(&sim, &node, &net, &history, config);
    let set = manager.lock_all(SET_OF_FOUR).auto_renew(secs(1));
    let all = sim.block_on(set.try_acquire()).unwrap();
    sim.run_for(ms(10_500));
    assert!(all.is_held());
    assert_eq!(net.counts(), (0, 0), "neither as one step nor key by key");
    for key in SET_OF_FOUR {
        let renewed = history
            .events()
            .iter()
            .filter(|e| e.lock == key && matches!(e.kind, EventKind::Extended { .. }))
            .count();
        assert!(renewed >= 9, "{key}: renewed {renewed} times in 10.5 s");
        assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
    }
    sim.block_on(all.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// A set whose parts cannot be renewed in one step — here a Redlock set, whose keys are taken key by key —
/// is renewed key by key in the background: one `extend` per key, node and round, and never a joint step,
/// even though every part's renewal claim was free.
#[test]
fn a_redlock_set_renewed_in_the_background_extends_key_by_key() {
    let mut sim = redlease_testkit::Sim::new(129);
    let clock = sim.clock();
    let net = SetNet::default();
    let nodes: Vec<SetNode> = (0..3)
        .map(|_| SetNode {
            node: redlease_testkit::MemoryNode::with_timer(clock.clone()),
            net: net.clone(),
        })
        .collect();
    let memory: Vec<redlease_testkit::MemoryNode> = nodes.iter().map(|n| n.node.clone()).collect();
    let manager = redlease::LockManager::redlock(nodes, config().with_expiry(secs(3)))
        .unwrap()
        .with_timer(sim.clock())
        .with_spawner(sim.spawner());
    let set = manager.lock_all(SET_OF_FOUR).auto_renew(secs(1));
    let all = sim.block_on(set.try_acquire()).unwrap();
    sim.run_for(ms(10_500));
    assert!(all.is_held());
    let (joint, single) = net.counts();
    assert_eq!(joint, 0, "a Redlock set is never extended in one step");
    assert_eq!(
        single,
        4 * 3 * 10,
        "every key on every node in every round (every second for 10.5 s)"
    );
    for node in &memory {
        for key in SET_OF_FOUR {
            assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
        }
    }
    sim.block_on(all.release()).unwrap();
}

/// `run` started on a set whose renewal is already due, on a node that cannot extend it in one step and
/// answers at once: the joint renewal gives the parts back before `run` is polled again, and each is then
/// renewed on its own — none is left claimed and unrenewed to expire under the work.
#[test]
fn a_set_run_late_on_a_node_without_the_joint_step_renews_every_key_on_its_own() {
    let (mut sim, clock, node, net, history, manager) =
        set_rig(131, config().with_expiry(secs(3)), |s| s.unsupported = true);
    let all = sim
        .block_on(
            manager
                .lock_all(SET_OF_FOUR)
                .renew_every(secs(1))
                .try_acquire(),
        )
        .unwrap();
    // Past the first renewal's plan, well before the expiry.
    sim.run_for(ms(1_500));
    let start = clock.now();
    let held = sim.block_on(all.run(clock.sleep_until(start + secs(6))));
    assert!(held.is_ok(), "{held:?}");
    assert_eq!(all.state(), LeaseState::Held);
    assert_eq!(net.with(|s| s.refused), 1, "the step asked for once");
    let (joint, single) = net.counts();
    assert_eq!(joint, 0);
    assert!(single >= 4 * 5, "{single} extensions of one key in 6 s");
    for key in SET_OF_FOUR {
        assert!(node.pttl(key).flatten().unwrap() > secs(1), "{key}");
    }
    sim.block_on(all.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// `run` on a lease that its background renewal already renews ([`Lock::auto_renew`](redlease::Lock))
/// leaves the renewal to it: one extension per renewal interval, not two (one renewer per lease, however
/// many `run`s watch it).
#[test]
fn run_on_a_lease_renewed_in_the_background_adds_no_second_renewal() {
    let (mut sim, clock, _node, net, history, manager) =
        set_rig(132, config().with_expiry(secs(3)), |_| {});
    let lease = sim
        .block_on(manager.lock("a").auto_renew(secs(1)).try_acquire())
        .unwrap();
    let start = clock.now();
    let held = sim.block_on(lease.run(clock.sleep_until(start + ms(10_500))));
    assert!(held.is_ok(), "{held:?}");
    let (_, single) = net.counts();
    assert!(
        (10..=11).contains(&single),
        "{single} extensions in 10.5 s of renewal every second"
    );
    sim.block_on(lease.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// A joint extension answered with a flag per key — but one too many or one too few (a node or proxy out of
/// protocol, which applied nothing) — is not believed for any part: the extension fails as ambiguous, the
/// set's deadline stays where the node's keys put it, and no part is taken for lost on a flag it never got.
#[test]
fn a_joint_extension_answered_with_the_wrong_number_of_flags_is_believed_for_no_part() {
    for flags in [SET_OF_FOUR.len() + 1, SET_OF_FOUR.len() - 1] {
        let (mut sim, clock, node, net, history, all) =
            holding_four(126, config().with_expiry(secs(10)), |set| set);
        let before = all.valid_until();
        net.with(|s| s.malformed = Some(flags));
        let extended = sim.block_on(all.extend(secs(60)));
        assert!(
            matches!(extended, Err(Error::Quorum(_))),
            "{flags} flags for 4 keys: {extended:?}"
        );
        assert_eq!(net.counts(), (1, 0), "one joint step, nothing else");
        assert!(all.valid_until() <= before, "{flags} flags: believed");
        assert!(all.is_held(), "{flags} flags: a part taken for lost");
        for key in SET_OF_FOUR {
            let pttl = node.pttl(key).flatten().unwrap();
            assert!(
                clock.now() + pttl >= all.valid_until(),
                "{flags} flags, {key}: the set believes more than the key has"
            );
        }
        sim.block_on(all.release()).unwrap();
        assert_eq!(history.check(), Ok(()));
    }
}

/// Only a definite `Unsupported` makes a set fall back to extending its keys one by one. A joint extension
/// the node refused for another reason (out of memory, a connection refused: nothing applied) is a failed
/// round like any other, not a cue to send each key its own extension.
#[test]
fn a_joint_extension_refused_for_another_reason_than_unsupported_is_a_failed_round() {
    for kind in [NodeErrorKind::OutOfMemory, NodeErrorKind::Connection] {
        let (mut sim, _clock, _node, net, history, all) =
            holding_four(127, config().with_expiry(secs(10)), |set| set);
        net.with(|s| s.refuse = Some(kind));
        let extended = sim.block_on(all.extend(secs(60)));
        net.with(|s| s.refuse = None);
        assert!(
            matches!(extended, Err(Error::Quorum(_))),
            "{kind:?}: {extended:?}"
        );
        assert_eq!(
            net.counts(),
            (1, 0),
            "{kind:?}: one joint step, no key on its own"
        );
        assert!(all.is_held());
        // The next extension is one step again.
        sim.block_on(all.extend(secs(60))).unwrap();
        assert_eq!(net.counts(), (2, 0), "{kind:?}");
        sim.block_on(all.release()).unwrap();
        assert_eq!(history.check(), Ok(()));
    }
}

/// A set's joint renewal that gave up (its rounds refused until no retry could finish before the deadline:
/// it waits for the deadline to report the loss) and whose deadline a manual extension then moved later
/// takes up renewing again when it wakes at the old deadline.
#[test]
fn a_set_given_up_by_its_joint_renewal_and_then_extended_by_hand_is_renewed_again() {
    let (mut sim, clock, node, net, history, all) =
        holding_four(128, config().with_expiry(secs(3)), |set| {
            set.auto_renew(secs(1))
        });
    let deadline = all.valid_until();
    // Every renewal round is refused; its retries (every retry delay, 200 ms, from 1 s) stop once the
    // next one would come after the deadline (2.8 s + 200 ms): it waits for the deadline.
    net.with(|s| s.refuse = Some(NodeErrorKind::OutOfMemory));
    sim.run_for(deadline - ms(60) - clock.now());
    let (refused, _) = net.counts();
    assert_eq!(refused, 10, "renewal rounds refused from 1 s to 2.8 s");
    net.with(|s| s.refuse = None);
    sim.block_on(all.extend(secs(30))).unwrap();
    assert!(all.valid_until() > deadline + secs(20));
    let (by_hand, _) = net.counts();
    sim.run_for(secs(10));
    let (joint, single) = net.counts();
    assert_eq!(single, 0);
    assert!(
        joint - by_hand >= 9,
        "renewed again every second after the old deadline: {} rounds in 10 s",
        joint - by_hand
    );
    assert!(all.is_held());
    for key in SET_OF_FOUR {
        assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
    }
    sim.block_on(all.release()).unwrap();
    assert_eq!(history.check(), Ok(()));
}

/// A part lost from a joint background renewal is let go of on the node too: when its renewal's answers
/// never came although the node applied it (the key outlives what the lease believes), the lost parts'
/// tokens are deleted right after the loss instead of lingering on the node until their TTL runs out.
#[test]
fn parts_lost_from_a_joint_background_renewal_have_their_tokens_deleted() {
    let (mut sim, clock, node, net, history, all) =
        holding_four(129, config().with_expiry(secs(3)), |set| {
            set.auto_renew(secs(1))
        });
    let deadline = all.valid_until();
    // Every renewal request stays in the network: no answer comes back.
    net.with(|s| s.hold = u32::MAX);
    sim.run_for(ms(1_500));
    // The first one (sent at 1 s) is applied now, unanswered: the keys live until 4.5 s.
    assert!(net.deliver() >= 1);
    for key in SET_OF_FOUR {
        assert!(node.pttl(key).flatten().unwrap() > secs(2), "{key}");
    }
    sim.run_for(deadline + ms(100) - clock.now());
    assert!(!all.is_held(), "lost at its deadline");
    assert!(
        node.keys().is_empty(),
        "the lost parts' tokens were left on the node: {:?}",
        node.keys()
    );
    drop(all);
    assert_eq!(history.check(), Ok(()));
}

/// `run` of a set stops the work as soon as a part is lost and, as its documentation says, finishes
/// deleting the lost parts' tokens before it returns (even with a spawner that could do it later): when it
/// returns, no node keeps a key of the set for the rest of a TTL.
#[test]
fn run_of_a_set_returns_after_the_lost_parts_tokens_are_deleted() {
    let (mut sim, clock, node, net, history, all) =
        holding_four(130, config().with_expiry(secs(3)), |set| {
            set.renew_every(secs(1))
        });
    // Every renewal request stays in the network; the first is applied unanswered at 1.5 s, so the keys
    // outlive the lease; the clean-up's deletions take 200 ms each.
    net.with(|s| {
        s.hold = u32::MAX;
        s.slow_release = Some((clock.clone(), ms(200)));
    });
    let deliver = net.clone();
    let at = clock.clone();
    sim.spawn(async move {
        at.sleep_until(at.now() + ms(1_500)).await;
        assert!(deliver.deliver() >= 1);
    });
    let work = clock.sleep_until(clock.now() + secs(60));
    let ran = sim.block_on(all.run(work));
    assert!(matches!(ran, Err(Error::Lost { .. })), "{ran:?}");
    assert!(
        node.keys().is_empty(),
        "run returned with the lost parts' tokens still on the node: {:?}",
        node.keys()
    );
    drop(all);
    assert_eq!(history.check(), Ok(()));
}
