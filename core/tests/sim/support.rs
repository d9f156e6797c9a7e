use std::time::Duration;

use redlease::{Config, LockManager, RedisNode, Timer};
use redlease_testkit::cancel::SimHost;
use redlease_testkit::{Faults, FaultyNode, MemoryNode, Sim, SkewedClock, VirtualClock};

/// N in-memory nodes behind fault wrappers, a manager over them, all on one virtual clock.
pub(crate) struct Cluster {
    pub(crate) sim: Sim,
    pub(crate) clock: VirtualClock,
    pub(crate) nodes: Vec<MemoryNode>,
    pub(crate) faults: Vec<Faults>,
    pub(crate) manager: LockManager,
}

pub(crate) fn config() -> Config {
    Config::default().with_jitter_seed(1)
}

impl Cluster {
    pub(crate) fn new(n: usize, seed: u64, config: Config) -> Self {
        Self::build(n, seed, config, false)
    }

    /// Like `new`, with the simulation's spawner installed (detached renewal and background cleanup).
    pub(crate) fn with_spawner(n: usize, seed: u64, config: Config) -> Self {
        Self::build(n, seed, config, true)
    }

    /// Like `new` (`spawner`: like `with_spawner`), with node `i` expiring keys on a clock running
    /// `rates[i]` fast (negative: slow) relative to the clients' clock.
    pub(crate) fn with_node_rates(seed: u64, config: Config, rates: &[f64], spawner: bool) -> Self {
        Self::build_on(rates.len(), seed, config, spawner, |clock, i| {
            MemoryNode::with_timer(SkewedClock::new(clock.clone(), rates[i]))
        })
    }

    fn build(n: usize, seed: u64, config: Config, spawner: bool) -> Self {
        Self::build_on(n, seed, config, spawner, |clock, _| {
            MemoryNode::with_timer(clock.clone())
        })
    }

    fn build_on(
        n: usize,
        seed: u64,
        config: Config,
        spawner: bool,
        node: impl Fn(&VirtualClock, usize) -> MemoryNode,
    ) -> Self {
        let sim = Sim::new(seed);
        let clock = sim.clock();
        let mut nodes = Vec::new();
        let mut faults = Vec::new();
        let mut wrapped = Vec::new();
        for i in 0..n {
            let node = node(&clock, i);
            // Late requests run on the simulation's network spawner, never paused with a client.
            let (faulty, f) = FaultyNode::with_spawner(node.clone(), clock.clone(), sim.spawner());
            nodes.push(node);
            faults.push(f);
            wrapped.push(faulty);
        }
        let manager = if n == 1 {
            LockManager::single(wrapped.pop().unwrap(), config)
        } else {
            LockManager::redlock(wrapped, config)
        }
        .unwrap()
        .with_timer(clock.clone());
        let manager = if spawner {
            manager.with_spawner(sim.spawner())
        } else {
            manager
        };
        Self {
            sim,
            clock,
            nodes,
            faults,
            manager,
        }
    }

    /// One acquisition attempt of `lock`, run to completion on the simulation.
    pub(crate) fn try_acquire(
        &mut self,
        lock: &redlease::Lock,
    ) -> Result<redlease::Lease, redlease::Error> {
        let lock = lock.clone();
        self.sim.block_on(async move { lock.try_acquire().await })
    }

    pub(crate) fn now(&self) -> std::time::Instant {
        self.clock.now()
    }

    /// Every hostile condition at once, from `seed`: `n` nodes on clocks up to 0.6 % fast or slow (within the
    /// default 1 % drift allowance together with 0.2 % client clocks, see `hostile_client`), each with
    /// `RandomFaults::hostile` (late requests; pool, FIFO or reconnecting delivery by seed), and a network
    /// spawner.
    #[allow(dead_code)]
    pub(crate) fn hostile(n: usize, seed: u64, config: Config) -> Self {
        let mut rng = redlease::machine::Jitter::from_seed(seed ^ 0xABCD);
        let rates: Vec<f64> = (0..n)
            .map(|_| 0.006 * (2.0 * rng.next_unit() - 1.0))
            .collect();
        let c = Self::with_node_rates(seed, config, &rates, true);
        for (i, f) in c.faults.iter().enumerate() {
            f.random(redlease_testkit::RandomFaults::hostile(
                seed.wrapping_mul(7).wrapping_add(i as u64),
            ));
        }
        c
    }

    /// Like `hostile`, with node `i` built by `node` from its skewed clock (its rate drawn as in `hostile`)
    /// and `faults` as the random faults of node `i` (`RandomFaults::hostile` of the node's seed given).
    #[allow(dead_code)]
    pub(crate) fn hostile_with(
        n: usize,
        seed: u64,
        config: Config,
        node: impl Fn(SkewedClock, usize) -> MemoryNode,
        faults: impl Fn(redlease_testkit::RandomFaults) -> redlease_testkit::RandomFaults,
    ) -> Self {
        let mut rng = redlease::machine::Jitter::from_seed(seed ^ 0xABCD);
        let rates: Vec<f64> = (0..n)
            .map(|_| 0.006 * (2.0 * rng.next_unit() - 1.0))
            .collect();
        let c = Self::build_on(n, seed, config, true, |clock, i| {
            node(SkewedClock::new(clock.clone(), rates[i]), i)
        });
        for (i, f) in c.faults.iter().enumerate() {
            f.random(faults(redlease_testkit::RandomFaults::hostile(
                seed.wrapping_mul(7).wrapping_add(i as u64),
            )));
        }
        c
    }

    /// Client `id` of a hostile run: its manager runs on its own clock (up to 0.2 % fast or slow, offset up to
    /// 5 s), in its own task group, paused `pauses` times (up to 3 s each) within `horizon`, and reports to
    /// `history` as client `id` on its own clock (pauses recorded too). Returns the manager and the client's
    /// clock (sleep on it: the client's work runs on its own clock as well).
    #[allow(dead_code)]
    pub(crate) fn hostile_client(
        &mut self,
        id: u64,
        history: &redlease_testkit::History,
        horizon: Duration,
        pauses: usize,
    ) -> (LockManager, SkewedClock) {
        let seed = self.sim.seed();
        let mut rng = redlease::machine::Jitter::from_seed(seed ^ id.wrapping_mul(0x9E37_79B9));
        let clock =
            SkewedClock::random(self.clock.clone(), &mut rng, 0.002, Duration::from_secs(5));
        let manager = self
            .client_manager(id)
            .with_timer(clock.clone())
            .with_observer(history.recorder(id).on_clock(clock.clone()));
        let windows =
            self.sim
                .random_pauses(id, rng.next_u64(), horizon, pauses, Duration::from_secs(3));
        for (at, d) in windows {
            history.record(
                id,
                "",
                at,
                redlease_testkit::EventKind::Paused { until: at + d },
            );
        }
        (manager, clock)
    }

    /// A manager for client `id` over the same nodes, whose background tasks (renewal, clean-ups) run in that
    /// client's task group, paused with it (`Sim::pause`).
    #[allow(dead_code)]
    pub(crate) fn client_manager(&self, id: u64) -> LockManager {
        self.manager.clone().with_spawner(self.sim.client(id))
    }

    /// Which nodes hold `key` with the value `value`.
    pub(crate) fn holders(&self, key: &str, value: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].get(key).as_deref() == Some(value.as_bytes()))
            .collect()
    }

    /// Total node calls so far.
    pub(crate) fn calls(&self) -> u64 {
        self.faults.iter().map(Faults::total_calls).sum()
    }

    /// Asserts that every live key on every node except fence counters has a TTL.
    pub(crate) fn assert_every_lock_key_has_ttl(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            for key in node.keys_without_ttl() {
                assert!(key.contains("fence"), "node {i}: key {key:?} has no TTL");
            }
        }
    }
}

impl SimHost for Cluster {
    fn sim(&mut self) -> &mut Sim {
        &mut self.sim
    }
}

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Reads a node's value through the trait, to be sure the in-memory view and the trait agree.
#[allow(dead_code)]
pub(crate) async fn value_of(node: &dyn RedisNode, key: &str) -> Option<Vec<u8>> {
    node.inspect(key).await.unwrap().map(|s| s.value)
}

#[allow(dead_code)]
pub(crate) fn sleep(clock: &VirtualClock, d: Duration) -> redlease::Sleep {
    clock.sleep_until(clock.now() + d)
}

/// An error printed with all its sources, as a logger that walks `source()` prints it: each level says only
/// what it adds, so a message's cause is in the chain, not repeated at the top.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// Runs `run(seed)` for every seed of a hostile simulation: `default` seeds, or as many as the environment
/// variable `var` says (for longer runs by hand).
pub(crate) fn hostile_seeds(var: &str, default: u64, run: impl FnMut(u64)) -> u64 {
    let seeds = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    redlease_testkit::for_each_seed(0..seeds, run);
    seeds
}

/// The cluster of a hostile run from `seed`: 1, 3 or 5 nodes with every hostile condition
/// ([`Cluster::hostile`]), 2 s leases, 50 ms retry delay.
#[allow(dead_code)]
pub(crate) fn hostile_cluster(seed: u64) -> Cluster {
    let n = [1usize, 3, 5][(seed % 3) as usize];
    let config = config()
        .with_expiry(secs(2))
        .with_retry_delay(ms(50))
        .with_jitter_seed(seed);
    Cluster::hostile(n, seed, config)
}

/// Waits until `d` has passed on `clock` or the lease is lost, whichever comes first (a careful holder's
/// work); `true` if it was lost.
#[allow(dead_code)]
pub(crate) async fn hold_or_lost(lease: &redlease::Lease, clock: &impl Timer, d: Duration) -> bool {
    let mut lost = std::pin::pin!(lease.lost());
    let mut sleep = clock.sleep_until(clock.now() + d);
    std::future::poll_fn(|cx| {
        if lost.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// The simulation's clock, counting the sleeps armed on it.
#[derive(Clone)]
pub(crate) struct CountingTimer {
    pub(crate) clock: VirtualClock,
    pub(crate) sleeps: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl redlease::Timer for CountingTimer {
    fn now(&self) -> std::time::Instant {
        self.clock.now()
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> redlease::Sleep {
        self.sleeps
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.clock.sleep_until(deadline)
    }

    fn wall_now(&self) -> Option<std::time::SystemTime> {
        self.clock.wall_now()
    }
}
