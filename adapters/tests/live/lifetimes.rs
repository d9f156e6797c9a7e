//! Lease lifetimes and composition on real servers (issue 24): several keys at once, a lease handed to
//! another manager, hold limits — on every single-server setup and on clusters, both clients.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlease::{
    Claim, ClaimRequest, Error, LeaseTicket, LockManager, LossReason, MultiKeyItem, MultiKeyOp,
    MultiKeyReply, NodeError, NodeWrapper, RedisNode, Token, Ttl, async_trait,
};
use redlease_testkit::server::{RedisCluster, RedisServer};

use crate::common::{self, ALL_BACKENDS, CLUSTERS, config, key, on_every_server, on_servers};

const TTL: Duration = Duration::from_millis(1_000);

#[test]
fn lock_all_handoff_and_hold_limits_work_on_every_server() {
    on_every_server(
        "lock_all_handoff_and_hold_limits_work_on_every_server",
        |flavor| async move {
            let server = RedisServer::start_flavor(flavor, &[]);
            for backend in ALL_BACKENDS {
                let manager =
                    LockManager::single(common::node(backend, &server.url()).await, config(TTL))
                        .unwrap();
                let worker =
                    LockManager::single(common::node(backend, &server.url()).await, config(TTL))
                        .unwrap();
                let (a, b, c) = (
                    key("all-a", backend),
                    key("all-b", backend),
                    key("all-c", backend),
                );

                // All or nothing: "b" is held, so a set over a, b, c takes none of them.
                server.cmd(&["SET", &b, "someone-else", "PX", "5000"]);
                let set = manager.lock_all([c.as_str(), a.as_str(), b.as_str()]);
                let e = set.try_acquire().await.unwrap_err();
                assert!(e.is_contended(), "{backend:?}: {e}");
                assert_eq!(
                    server.cmd(&["EXISTS", &a, &c]),
                    "0",
                    "{backend:?}: nothing left"
                );
                server.cmd(&["DEL", &b]);
                let all = set.try_acquire().await.unwrap();
                for lease in all.leases() {
                    assert_eq!(server.cmd(&["GET", lease.key()]), lease.token().as_str());
                }
                all.release().await.unwrap();
                assert_eq!(
                    server.cmd(&["EXISTS", &a, &b, &c]),
                    "0",
                    "{backend:?}: released"
                );

                // Handed to another manager (another connection), resumed with its own TTL.
                let lease = manager
                    .lock(&a)
                    .with_holder_info("dispatcher")
                    .try_acquire()
                    .await
                    .unwrap();
                let token = lease.token().as_str().to_owned();
                let wire = lease.handoff().unwrap().encode();
                let ticket: LeaseTicket = wire.parse().unwrap();
                let resumed = worker
                    .lock(&a)
                    .expiry(TTL * 5)
                    .resume(&ticket)
                    .await
                    .unwrap();
                assert_eq!(resumed.token().as_str(), token);
                let pttl: i64 = server.cmd(&["PTTL", &a]).parse().unwrap();
                assert!(
                    pttl > TTL.as_millis() as i64,
                    "{backend:?}: the worker's TTL, {pttl} ms"
                );
                let holder = manager.lock(&a).holder_info().await.unwrap().unwrap();
                assert_eq!(holder.info(), Some("dispatcher"));
                resumed.release().await.unwrap();
                // A ticket whose key is gone is refused as not held.
                let r = worker.lock(&a).resume(&ticket).await;
                assert!(
                    matches!(
                        r,
                        Err(Error::Lost {
                            reason: LossReason::NotHeld,
                            ..
                        })
                    ),
                    "{backend:?}: {r:?}"
                );

                // A hold limit ends renewed work at the limit and deletes the key.
                let limited = manager
                    .lock(&c)
                    .expiry(Duration::from_millis(600))
                    .renew_every(Duration::from_millis(200))
                    .max_hold(Duration::from_millis(1_500));
                let started = Instant::now();
                let lease = limited.try_acquire().await.unwrap();
                let r = lease.run(std::future::pending::<()>()).await;
                let took = started.elapsed();
                assert!(
                    matches!(
                        r,
                        Err(Error::Lost {
                            reason: LossReason::HoldLimit,
                            ..
                        })
                    ),
                    "{backend:?}: {r:?}"
                );
                // Renewed past one TTL, stopped by the limit (not before it; the acquisition round counts).
                assert!(
                    took >= Duration::from_millis(1_400),
                    "{backend:?}: ended after {took:?}"
                );
                assert_eq!(
                    server.cmd(&["EXISTS", &c]),
                    "0",
                    "{backend:?}: deleted at the limit"
                );
            }
        },
    );
}

#[test]
fn lock_all_across_slots_and_handoff_work_on_clusters() {
    let test = "lock_all_across_slots_and_handoff_work_on_clusters";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        let managers = [
            (
                "redis-rs",
                LockManager::single(crate::cluster::redis_rs_node(&cluster).await, config(TTL))
                    .unwrap(),
            ),
            (
                "fred",
                LockManager::single(crate::cluster::fred_node(&cluster).await, config(TTL))
                    .unwrap(),
            ),
        ];
        for (name, manager) in &managers {
            // Keys without a shared hash tag: different slots, each its own lease.
            let keys: Vec<String> = (0..4).map(|i| format!("lifetimes:{name}:{i}")).collect();
            let all = manager
                .lock_all(keys.iter().map(String::as_str))
                .try_acquire()
                .await
                .unwrap();
            assert_eq!(all.leases().len(), 4);
            assert!(all.is_held());
            all.extend(TTL * 3).await.unwrap();
            all.release().await.unwrap();
            let lease = manager.lock(&keys[0]).try_acquire().await.unwrap();
            let ticket = lease.handoff().unwrap();
            let (_, other) = &managers[usize::from(*name == "redis-rs")];
            let resumed = other.lock(&keys[0]).resume(&ticket).await.unwrap();
            resumed.release().await.unwrap();
            assert!(
                manager
                    .lock(&keys[0])
                    .holder_info()
                    .await
                    .unwrap()
                    .is_none(),
                "{flavor} {name}"
            );
        }
    });
}

/// Counts the acquisition, release, extension and one-step calls that reach the node (to tell the one-step
/// path from the key-by-key one).
struct Counting {
    inner: std::sync::Arc<dyn RedisNode>,
    one_step: AtomicUsize,
    per_key: AtomicUsize,
    /// The keys of the single-key extensions since the last `take_extended`, one entry per call.
    extended: std::sync::Mutex<Vec<String>>,
}

impl Counting {
    fn new(inner: std::sync::Arc<dyn RedisNode>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            inner,
            one_step: AtomicUsize::new(0),
            per_key: AtomicUsize::new(0),
            extended: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// (one-step calls, key-by-key acquisitions, releases and extensions) since the last call.
    fn take(&self) -> (usize, usize) {
        (
            self.one_step.swap(0, Ordering::SeqCst),
            self.per_key.swap(0, Ordering::SeqCst),
        )
    }

    /// How many single-key extensions each of `keys` got since the last call.
    fn take_extended(&self, keys: &[&str]) -> Vec<usize> {
        let extended = std::mem::take(&mut *self.extended.lock().unwrap());
        keys.iter()
            .map(|k| extended.iter().filter(|e| e == k).count())
            .collect()
    }
}

#[async_trait]
impl NodeWrapper for Counting {
    type Inner = dyn RedisNode;

    fn inner(&self) -> &(dyn RedisNode + 'static) {
        &*self.inner
    }

    async fn acquire(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.per_key.fetch_add(1, Ordering::SeqCst);
        RedisNode::acquire(&*self.inner, key, token, ttl).await
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, NodeError> {
        self.per_key.fetch_add(1, Ordering::SeqCst);
        RedisNode::claim(&*self.inner, req).await
    }

    async fn acquire_fenced(
        &self,
        key: &str,
        fence_key: &str,
        token: &Token,
        ttl: Ttl,
    ) -> Result<Option<u64>, NodeError> {
        self.per_key.fetch_add(1, Ordering::SeqCst);
        RedisNode::acquire_fenced(&*self.inner, key, fence_key, token, ttl).await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<bool, NodeError> {
        self.per_key.fetch_add(1, Ordering::SeqCst);
        RedisNode::release(&*self.inner, key, token).await
    }

    async fn extend(&self, key: &str, token: &Token, ttl: Ttl) -> Result<bool, NodeError> {
        self.per_key.fetch_add(1, Ordering::SeqCst);
        self.extended.lock().unwrap().push(key.to_owned());
        RedisNode::extend(&*self.inner, key, token, ttl).await
    }

    async fn multi_key(
        &self,
        items: &[MultiKeyItem<'_>],
        op: MultiKeyOp,
    ) -> Result<MultiKeyReply, NodeError> {
        self.one_step.fetch_add(1, Ordering::SeqCst);
        RedisNode::multi_key(&*self.inner, items, op).await
    }
}

/// What one `lock_all` of `keys` (fenced by `<key>:fence`) sends, and that it is all or nothing: with the
/// last key held by another owner nothing is written, then every key is taken and released. `one_step`:
/// whether the node takes them in one step (one call for the failed attempt, one for the won one, one per
/// renewal round of `run`, one for the release, and no key-by-key call) or key by key (its `multi_key`
/// answers unsupported, asked once for the renewal too).
async fn lock_all_in_one_step_or_key_by_key(
    what: &str,
    node: std::sync::Arc<Counting>,
    keys: [&str; 3],
    one_step: bool,
    cmd: impl Fn(&[&str]) -> String,
) {
    let manager = LockManager::single(node.clone(), config(TTL)).unwrap();
    let set = manager
        .lock_all(keys)
        .fenced(|k| format!("{k}:fence"))
        .renew_every(TTL * 3 / 10);
    let last = keys[2];
    cmd(&["SET", last, "someone-else", "PX", "5000"]);
    let e = set.try_acquire().await.unwrap_err();
    assert!(e.is_contended(), "{what}: {e}");
    let calls = node.take();
    for key in &keys[..2] {
        assert_eq!(cmd(&["EXISTS", key]), "0", "{what}: {key} left behind");
        let fence = format!("{key}:fence");
        if one_step {
            // Nothing was written, not even a fence: the refusal came before any write.
            assert_eq!(cmd(&["EXISTS", &fence]), "0", "{what}: {fence} issued");
        }
    }
    if one_step {
        assert_eq!(calls, (1, 0), "{what}: one step, no key-by-key call");
    } else {
        // Unsupported (nothing sent), then the keys one at a time: two taken and released, one refused.
        assert_eq!(calls.1, 5, "{what}: key by key ({calls:?})");
    }
    cmd(&["DEL", last]);
    let all = set.try_acquire().await.unwrap();
    for lease in all.leases() {
        assert_eq!(cmd(&["GET", lease.key()]), lease.token().as_str(), "{what}");
        let pttl: u64 = cmd(&["PTTL", lease.key()]).parse().unwrap();
        assert!(
            pttl > 0 && pttl <= TTL.as_millis() as u64,
            "{what}: PTTL {pttl}"
        );
        let fence = format!("{}:fence", lease.key());
        assert_eq!(
            cmd(&["GET", &fence]),
            lease.fencing_token().unwrap().to_string(),
            "{what}: {fence}"
        );
    }
    let calls = node.take();
    assert_eq!(
        calls,
        if one_step { (1, 0) } else { (1, 3) },
        "{what}: the winning attempt"
    );
    // Held by `run` for 1.5 TTLs: it survives only if renewed.
    let held = all.run(tokio::time::sleep(TTL * 3 / 2)).await;
    assert!(held.is_ok(), "{what}: {held:?}");
    for lease in all.leases() {
        let pttl: i64 = cmd(&["PTTL", lease.key()]).parse().unwrap();
        assert!(pttl > 0, "{what}: {} has PTTL {pttl}", lease.key());
    }
    let (joint, single) = node.take();
    let per_key = node.take_extended(&keys);
    if one_step {
        assert!(
            joint >= 1 && single == 0,
            "{what}: renewed in one step per round ({joint} steps, {single} extensions of one key)"
        );
    } else {
        // Each part renews on its own schedule, from its own acquisition: the work's end can fall between
        // two parts' rounds, so the counts may differ by one (4, 4, 5 under load), but every key is renewed.
        assert!(
            joint == 1
                && single == per_key.iter().sum::<usize>()
                && per_key.iter().all(|&n| n >= 1),
            "{what}: renewed key by key after one refused step ({joint} steps, extensions per key {per_key:?})"
        );
    }
    all.release().await.unwrap();
    for key in keys {
        assert_eq!(cmd(&["EXISTS", key]), "0", "{what}: {key} released");
    }
    let calls = node.take();
    assert_eq!(
        calls,
        if one_step { (1, 0) } else { (1, 3) },
        "{what}: the release"
    );
}

#[test]
fn lock_all_takes_and_releases_every_key_in_one_step_where_the_server_runs_scripts() {
    let test = "lock_all_takes_and_releases_every_key_in_one_step_where_the_server_runs_scripts";
    on_every_server(test, |flavor| async move {
        let server = RedisServer::start_flavor(flavor, &[]);
        for backend in ALL_BACKENDS {
            let node = Counting::new(common::node(backend, &server.url()).await);
            let (a, b, c) = (
                key("one-a", backend),
                key("one-b", backend),
                key("one-c", backend),
            );
            lock_all_in_one_step_or_key_by_key(
                &format!("{flavor} {backend:?}"),
                node,
                [a.as_str(), b.as_str(), c.as_str()],
                common::has_lua(flavor),
                |args| server.cmd(args),
            )
            .await;
        }
    });
}

#[test]
fn lock_all_is_one_step_within_a_cluster_slot_and_key_by_key_across_slots() {
    let test = "lock_all_is_one_step_within_a_cluster_slot_and_key_by_key_across_slots";
    on_servers(test, &CLUSTERS, |flavor| async move {
        let Some(cluster) = RedisCluster::start_flavor_or_skip(test, flavor) else {
            return;
        };
        let nodes: [(&str, std::sync::Arc<dyn RedisNode>); 2] = [
            (
                "redis-rs",
                std::sync::Arc::new(crate::cluster::redis_rs_node(&cluster).await),
            ),
            (
                "fred",
                std::sync::Arc::new(crate::cluster::fred_node(&cluster).await),
            ),
        ];
        for (name, node) in nodes {
            let node = Counting::new(node);
            // One hash tag: one slot (the fence counters too), one step.
            let same: Vec<String> = (0..3).map(|i| format!("{{multi:{name}}}:{i}")).collect();
            lock_all_in_one_step_or_key_by_key(
                &format!("{flavor} {name} one slot"),
                node.clone(),
                [same[0].as_str(), same[1].as_str(), same[2].as_str()],
                true,
                |args| cluster.cmd_for_key(args[1], args),
            )
            .await;
            // Three hash tags: three slots, key by key (each fence counter in its key's slot).
            let apart: Vec<String> = ["x", "y", "z"]
                .iter()
                .map(|t| format!("{{multi:{name}:{t}}}:k"))
                .collect();
            lock_all_in_one_step_or_key_by_key(
                &format!("{flavor} {name} three slots"),
                node,
                [apart[0].as_str(), apart[1].as_str(), apart[2].as_str()],
                false,
                |args| cluster.cmd_for_key(args[1], args),
            )
            .await;
        }
    });
}
