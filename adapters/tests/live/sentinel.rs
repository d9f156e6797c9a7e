//! Sentinel on real processes (`redlease_testkit::sentinel::SentinelSet`: a primary, a replica behind a fault
//! proxy, three Sentinels), on Redis 7.0 and on Valkey 9.1: the Sentinel nodes of both adapters pass the
//! conformance suite before and after a failover, and a fenced lease held and renewing while the primary is
//! killed and the replica promoted.
//!
//! Replication is controlled, not raced: the replica's link is switched to
//! [`ProxyMode::DropReplies`] (the replication stream is thrown away, the replica's acknowledgements still
//! reach the primary), so exactly the writes made after that are missing on the replica when it is promoted.
//!
//! - With `Durability::Required` (`WAIT 1`) the lease was replicated when it was handed out; once the link
//!   drops its renewals are not acknowledged and it is at risk; after the failover (and a new replica for
//!   the new primary) a renewal succeeds there and the lease is kept — provided the failover took less than
//!   the validity left, which the test measures — and the next holder's fence is larger.
//! - With `Durability::Off` the leases acquired after the link dropped exist only on the old primary: after
//!   the failover the holder's renewal finds no key (lost, before its deadline), a second client gets a fence
//!   number already handed out (the history checker reports `FenceNotIncreasing`), and the first client's
//!   own manager refuses a regressed number (`NodeErrorKind::FenceRegressed`, and the event).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{
    Durability, EventKind as CoreEvent, Lease, LeaseEvent, LeaseState, LockManager, NodeErrorKind,
    Observer, RedisNode, ReplicaWait, SystemTimer,
};
use redlease_adapters::fred::fred::prelude::ClientLike;
use redlease_adapters::fred::{FredNode, sentinel_builder};
use redlease_adapters::redis::SentinelNode;
use redlease_adapters::redis::redis::AsyncConnectionConfig;
use redlease_testkit::proxy::ProxyMode;
use redlease_testkit::sentinel::SentinelSet;
use redlease_testkit::server::{Flavor, RedisServer};
use redlease_testkit::{ClientRecorder, History, Violation, conformance};

use crate::common::{self, config};
use crate::conformance::reader;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adapter {
    RedisRs,
    Fred,
}

const PROBE_KEY: &str = "probe:{warm-up}";

/// A Sentinel node of `adapter` for `set`, its capability check run.
async fn sentinel_node(adapter: Adapter, set: &SentinelSet) -> Arc<dyn RedisNode> {
    match adapter {
        Adapter::RedisRs => {
            let node = SentinelNode::new(set.sentinel_urls(), SentinelSet::MASTER_NAME)
                .unwrap()
                .with_config(
                    AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(Duration::from_millis(500)))
                        .set_response_timeout(Some(Duration::from_millis(1000))),
                );
            node.probe(PROBE_KEY).await.unwrap();
            Arc::new(node)
        }
        Adapter::Fred => {
            let client = sentinel_builder(set.sentinel_addrs(), SentinelSet::MASTER_NAME)
                .build()
                .unwrap();
            client.init().await.unwrap();
            let node = FredNode::new(client);
            node.probe(PROBE_KEY).await.unwrap();
            Arc::new(node)
        }
    }
}

/// Polls `f` every 20 ms until it is true; false after `timeout`.
async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Runs `body` until it succeeds (a node may need a call or two to find the new primary).
async fn retry<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    timeout: Duration,
    mut body: impl FnMut() -> F,
) -> T {
    let until = Instant::now() + timeout;
    loop {
        match body().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: still failing after {timeout:?}: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_nodes_pass_the_conformance_suite_before_and_after_a_failover() {
    conformance_before_and_after_a_failover(Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_nodes_pass_the_conformance_suite_before_and_after_a_failover_valkey_9_1() {
    conformance_before_and_after_a_failover(Flavor::Valkey91).await;
}

async fn conformance_before_and_after_a_failover(flavor: Flavor) {
    let test =
        format!("sentinel_nodes_pass_the_conformance_suite_before_and_after_a_failover ({flavor})");
    let Some(mut set) = SentinelSet::start_or_skip(&test, flavor) else {
        return;
    };
    let nodes = [
        (
            Adapter::RedisRs,
            sentinel_node(Adapter::RedisRs, &set).await,
        ),
        (Adapter::Fred, sentinel_node(Adapter::Fred, &set).await),
    ];
    let before = reader(&set.primary().url()).await;
    for (adapter, node) in &nodes {
        assert!(
            node.profile()
                .endpoint
                .is_some_and(|e| e.starts_with("redis-sentinel://")
                    && e.ends_with(&format!("/{}/0", SentinelSet::MASTER_NAME))),
            "{adapter:?}: {:?}",
            node.profile().endpoint
        );
        if let Err(failure) = conformance::run_with_reader(&**node, &before, &SystemTimer).await {
            panic!("{flavor} {adapter:?} before the failover: {failure}");
        }
    }
    assert_eq!(nodes[0].1.profile().endpoint, nodes[1].1.profile().endpoint);
    let old_run_id = set.primary().run_id().unwrap().to_owned();
    set.kill_primary();
    set.wait_for_failover(FAILOVER).unwrap();
    let after = reader(&set.replica().url()).await;
    let new_run_id = set.replica().run_id().unwrap().to_owned();
    for (adapter, node) in &nodes {
        // The first calls fail while the node finds the new primary; then it reports the new server.
        let id = retry(
            &format!("{adapter:?} run_id"),
            Duration::from_secs(10),
            || async {
                let _ = node.inspect("probe").await;
                match node.run_id("probe").await {
                    Ok(id) if id.as_str() == new_run_id => Ok(id),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert_ne!(id.as_str(), old_run_id);
        if let Err(failure) = conformance::run_with_reader(&**node, &after, &SystemTimer).await {
            panic!("{flavor} {adapter:?} after the failover: {failure}");
        }
    }
}

/// Records into a [`History`] and keeps the fence regressions the manager reported.
#[derive(Clone)]
struct Watch {
    history: ClientRecorder,
    regressed: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Watch {
    fn new(history: &History, client: u64) -> Self {
        Self {
            history: history.recorder(client),
            regressed: Arc::default(),
        }
    }
}

impl Observer for Watch {
    fn event(&self, event: &LeaseEvent<'_>) {
        if let CoreEvent::FenceRegressed {
            fence, previous, ..
        } = event.kind
        {
            self.regressed.lock().unwrap().push((fence, previous));
        }
        self.history.event(event);
    }
}

const TTL: Duration = Duration::from_secs(8);
const RENEW: Duration = Duration::from_millis(250);
/// A bound, not an expectation (a failover takes about 2-3 s): the set's Sentinels leave TILT mode (entered
/// when starved for 2 s) after `SentinelSet::TILT_PERIOD`, and the set forces a failover
/// `SentinelSet::FORCE_AFTER` the kill if none has started (several failed elections on a loaded machine).
const FAILOVER: Duration = Duration::from_secs(30);

fn managers(
    a: Arc<dyn RedisNode>,
    b: Arc<dyn RedisNode>,
    durability: Durability,
    history: &History,
) -> (LockManager, Watch, LockManager) {
    let cfg = config(TTL).with_durability(durability);
    let watch = Watch::new(history, 1);
    let one = LockManager::single(a, cfg.clone())
        .unwrap()
        .with_spawner(|task| {
            tokio::spawn(task);
        })
        .with_observer(watch.clone());
    let two = LockManager::single(b, cfg)
        .unwrap()
        .with_observer(Watch::new(history, 2));
    (one, watch, two)
}

const KEY: &str = "sentinel:{job}:lock";
const FENCE: &str = "sentinel:{job}:fence";

fn required() -> Durability {
    Durability::Required(ReplicaWait::new(1, Duration::from_millis(300)))
}

async fn acquire_renewing(manager: &LockManager) -> Lease {
    manager
        .lock(KEY)
        .fenced(FENCE)
        .auto_renew(RENEW)
        .try_acquire()
        .await
        .unwrap()
}

/// Required durability: the replicated lease is at risk while its renewals are not replicated, survives the
/// failover when that is shorter than its remaining validity, and the next fence is larger.
async fn failover_with_required_durability(adapter: Adapter, flavor: Flavor) {
    let test =
        format!("a_failover_keeps_a_replicated_lease_and_its_fence_order_{adapter:?} ({flavor})");
    let Some(mut set) = SentinelSet::start_or_skip(&test, flavor) else {
        return;
    };
    let history = History::new();
    let (one, _, two) = managers(
        sentinel_node(adapter, &set).await,
        sentinel_node(adapter, &set).await,
        required(),
        &history,
    );
    let lease = acquire_renewing(&one).await;
    let first = lease.fencing_token().unwrap();
    // Handed out only after the replica acknowledged: the replica has the lock and the fence.
    assert_eq!(set.replica().cmd(&["GET", KEY]), lease.token().as_str());
    assert_eq!(set.replica().cmd(&["GET", FENCE]), first.to_string());
    assert!(
        two.lock(KEY)
            .fenced(FENCE)
            .try_acquire()
            .await
            .unwrap_err()
            .is_contended()
    );

    // From now on nothing reaches the replica: renewals are extended on the primary but not acknowledged.
    set.replication_link().set_mode(ProxyMode::DropReplies);
    assert!(
        eventually(TTL / 4, || lease.state() == LeaseState::AtRisk).await,
        "{adapter:?}: {:?}",
        lease.state()
    );
    let left_at_kill = lease.remaining();
    let killed = Instant::now();
    set.kill_primary();
    set.wait_for_failover(FAILOVER).unwrap();
    // The new primary needs a replica of its own to acknowledge anything.
    let _new_replica: RedisServer = set.replica().start_replica(&[]);
    let recovered = eventually(TTL, || lease.state() != LeaseState::AtRisk).await;
    let took = killed.elapsed();
    assert!(recovered, "{adapter:?}: still at risk after {took:?}");
    match lease.state() {
        LeaseState::Held => {
            // Kept: the promoted replica had the lock (replicated at acquisition), and now has it renewed.
            assert_eq!(set.replica().cmd(&["GET", KEY]), lease.token().as_str());
            let pttl: u64 = set.replica().cmd(&["PTTL", KEY]).parse().unwrap();
            assert!(
                pttl > (TTL / 2).as_millis() as u64,
                "{adapter:?}: PTTL {pttl}"
            );
            // A second client still sees it held.
            let err = retry("contended", Duration::from_secs(5), || async {
                match two.lock(KEY).fenced(FENCE).try_acquire().await {
                    Err(e) if e.is_contended() => Ok(e),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            assert!(err.is_contended());
            lease.release().await.unwrap();
        }
        LeaseState::Lost(reason) => {
            // Lost only if the failover outlasted the validity left when the primary died.
            assert!(
                took + Duration::from_millis(500) >= left_at_kill,
                "{adapter:?}: lost ({reason:?}) after {took:?}, with {left_at_kill:?} left at the kill"
            );
        }
        other => panic!("{adapter:?}: {other:?}"),
    }
    // The next holder's fence is larger than every fence handed out before the failover.
    let next = retry("second holder", Duration::from_secs(10), || async {
        two.lock(KEY).fenced(FENCE).try_acquire().await
    })
    .await;
    let second = next.fencing_token().unwrap();
    assert!(second > first, "{adapter:?}: {second} after {first}");
    next.release().await.unwrap();
    assert_eq!(history.check(), Ok(()), "{adapter:?}");
    eprintln!(
        "{flavor} {adapter:?}: kept across a failover with {left_at_kill:?} left at the kill, recovered in {took:?}; \
         fences {first} then {second}"
    );
}

/// No durability policy: the leases handed out after the link dropped are lost with the old primary, and
/// fence numbers are handed out twice — reported by the history checker and by the manager that saw them.
async fn failover_without_durability(adapter: Adapter, flavor: Flavor) {
    let test = format!(
        "a_failover_without_durability_loses_the_lease_and_repeats_fences_{adapter:?} ({flavor})"
    );
    let Some(mut set) = SentinelSet::start_or_skip(&test, flavor) else {
        return;
    };
    let history = History::new();
    let (one, watch, two) = managers(
        sentinel_node(adapter, &set).await,
        sentinel_node(adapter, &set).await,
        Durability::Off,
        &history,
    );
    // One replicated acquisition by the second client.
    let warm = two.lock(KEY).fenced(FENCE).try_acquire().await.unwrap();
    let replicated = warm.fencing_token().unwrap();
    warm.release().await.unwrap();
    set.wait_replicated(Duration::from_secs(5)).unwrap();

    set.replication_link().set_mode(ProxyMode::DropReplies);
    // Three acquisitions the replica never sees; the last one is held and renewing.
    for _ in 0..2 {
        let lease = one.lock(KEY).fenced(FENCE).try_acquire().await.unwrap();
        lease.release().await.unwrap();
    }
    let lease = acquire_renewing(&one).await;
    let last = lease.fencing_token().unwrap();
    assert_eq!(last, replicated + 3);
    assert!(set.wait_replicated(Duration::from_millis(300)).is_err());
    assert_eq!(set.replica().cmd(&["GET", FENCE]), replicated.to_string());

    set.kill_primary();
    set.wait_for_failover(FAILOVER).unwrap();
    // The holder's next renewal on the new primary finds no key: lost for good (not only at risk), and
    // before its deadline (the history checker checks that too).
    assert!(
        eventually(TTL, || matches!(lease.state(), LeaseState::Lost(_))).await,
        "{adapter:?}: {:?}",
        lease.state()
    );
    // A second client gets a number the first was already given.
    let second = retry("second holder", Duration::from_secs(10), || async {
        two.lock(KEY).fenced(FENCE).try_acquire().await
    })
    .await;
    let repeated = second.fencing_token().unwrap();
    assert_eq!(repeated, replicated + 1, "{adapter:?}");
    second.release().await.unwrap();
    match history.check() {
        Err(Violation::FenceNotIncreasing {
            lock,
            previous,
            next,
        }) => {
            assert_eq!(
                (lock.as_str(), previous, next),
                (KEY, last, repeated),
                "{adapter:?}"
            );
        }
        other => panic!("{adapter:?}: the checker found {other:?}"),
    }
    // The first client's manager has seen `last`: it refuses the next number (lower) and says why.
    let err = one.lock(KEY).fenced(FENCE).try_acquire().await.unwrap_err();
    let node_err = common::first_node_error(&err);
    assert_eq!(
        node_err.as_ref().map(|e| e.kind()),
        Some(NodeErrorKind::FenceRegressed),
        "{adapter:?}: {err}"
    );
    assert_eq!(
        watch.regressed.lock().unwrap().as_slice(),
        [(replicated + 2, last)],
        "{adapter:?}"
    );
    // The refused lock was taken back at once.
    assert_eq!(set.replica().cmd(&["EXISTS", KEY]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_redis_rs() {
    failover_with_required_durability(Adapter::RedisRs, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_fred() {
    failover_with_required_durability(Adapter::Fred, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_redis_rs() {
    failover_without_durability(Adapter::RedisRs, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_fred() {
    failover_without_durability(Adapter::Fred, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_redis_rs_valkey_9_1() {
    failover_with_required_durability(Adapter::RedisRs, Flavor::Valkey91).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_fred_valkey_9_1() {
    failover_with_required_durability(Adapter::Fred, Flavor::Valkey91).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_redis_rs_valkey_9_1() {
    failover_without_durability(Adapter::RedisRs, Flavor::Valkey91).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_fred_valkey_9_1() {
    failover_without_durability(Adapter::Fred, Flavor::Valkey91).await;
}

/// A primary that stops answering with its connections open (`SIGSTOP`): the Sentinels fail over to the
/// replica, and the node, whose calls on the stopped primary time out, asks them again and follows, within
/// a few operation timeouts of the failover. When the old primary comes back (the Sentinels demote it to a
/// replica of the new one), the node stays on the new primary: every acquisition succeeds there.
async fn a_stopped_primary_is_left_for_the_new_one(adapter: Adapter, flavor: Flavor) {
    let test = format!("a_sentinel_node_leaves_a_stopped_primary ({adapter:?}, {flavor})");
    let Some(set) = SentinelSet::start_or_skip(&test, flavor) else {
        return;
    };
    let node = sentinel_node(adapter, &set).await;
    let cfg = config(Duration::from_secs(5));
    let op = cfg.operation_timeout_for(Duration::from_secs(5));
    let manager = LockManager::single(Arc::clone(&node), cfg).unwrap();
    let k = "stop:{primary}:lock";
    manager
        .lock(k)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    set.primary().pause();
    let paused = Instant::now();
    // Calls meanwhile time out (the primary holds them); the Sentinels notice and promote the replica.
    let _ = manager.lock(k).try_acquire().await;
    let failover = set.wait_for_failover(FAILOVER);
    if let Err(e) = failover {
        set.primary().resume();
        panic!("{test}: no failover: {e}");
    }
    let promoted = Instant::now();
    // Within a few operation timeouts of the promotion (each attempt is bounded by one; the first may
    // still go to the stopped primary and be cut).
    let bound = 10 * op + Duration::from_secs(2);
    let lock = manager.lock(k);
    let lease = retry(
        &format!("{test}: acquire on the new primary"),
        bound,
        || lock.try_acquire(),
    )
    .await;
    eprintln!(
        "{test}: the failover took {:?}; the node acquired on the new primary {:?} after it",
        promoted - paused,
        promoted.elapsed()
    );
    assert_eq!(
        set.replica().cmd(&["GET", k]),
        lease.token().as_str(),
        "{test}"
    );
    lease.release().await.unwrap();

    // The old primary comes back and is demoted; the node never goes back to it.
    set.primary().resume();
    let demoted = eventually(Duration::from_secs(30), || {
        set.primary()
            .try_cmd(&["ROLE"])
            .is_ok_and(|role| role.starts_with("slave"))
    })
    .await;
    assert!(demoted, "{test}: the old primary was not demoted");
    for i in 0..5 {
        let k = format!("stop:{{after-{i}}}:lock");
        let lease = manager.lock(&k).try_acquire().await.unwrap();
        assert_eq!(
            set.replica().cmd(&["GET", &k]),
            lease.token().as_str(),
            "{test}"
        );
        lease.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_redis_rs() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::RedisRs, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_redis_rs_valkey_9_1() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::RedisRs, Flavor::Valkey91).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_fred() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::Fred, Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_fred_valkey_9_1() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::Fred, Flavor::Valkey91).await;
}

/// A Sentinel node's durability waits run on connections of their own to the primary (see
/// `waits::never_held_up`): with the replica stopped, 20 `BestEffort` leases and an unrelated lock on the
/// node are never held up. (redis-rs: a wait connection to the address of the write's connection; fred: a
/// wait client whose `INFO server` names the server the write's connection reaches.)
async fn sentinel_waits_never_hold_up(adapter: Adapter, test: &str) {
    let Some(set) = SentinelSet::start_or_skip(test, Flavor::Redis) else {
        return;
    };
    set.wait_replicated(Duration::from_secs(10)).unwrap();
    let node = sentinel_node(adapter, &set).await;
    let what = format!("sentinel {adapter:?}");
    crate::waits::never_held_up(&what, "sentinel", node, set.replica()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_nodes_durability_waits_never_hold_up_other_leases_redis_rs() {
    sentinel_waits_never_hold_up(
        Adapter::RedisRs,
        "a_sentinel_nodes_durability_waits_never_hold_up_other_leases_redis_rs",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_nodes_durability_waits_never_hold_up_other_leases_fred() {
    sentinel_waits_never_hold_up(
        Adapter::Fred,
        "a_sentinel_nodes_durability_waits_never_hold_up_other_leases_fred",
    )
    .await;
}

// Valkey 8.1 too (its server binary run as a Sentinel, as for the other setups).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_nodes_pass_the_conformance_suite_before_and_after_a_failover_valkey_8_1() {
    conformance_before_and_after_a_failover(Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_redis_rs_valkey_8_1() {
    failover_with_required_durability(Adapter::RedisRs, Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lease_and_its_fence_order_fred_valkey_8_1() {
    failover_with_required_durability(Adapter::Fred, Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_redis_rs_valkey_8_1() {
    failover_without_durability(Adapter::RedisRs, Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_durability_loses_the_lease_and_repeats_fences_fred_valkey_8_1() {
    failover_without_durability(Adapter::Fred, Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_redis_rs_valkey_8_1() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::RedisRs, Flavor::Valkey81).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_leaves_a_stopped_primary_for_the_new_one_fred_valkey_8_1() {
    a_stopped_primary_is_left_for_the_new_one(Adapter::Fred, Flavor::Valkey81).await;
}
