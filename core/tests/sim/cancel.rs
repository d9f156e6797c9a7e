use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use redlease::Timer;
use redlease::machine::Jitter;
use redlease_testkit::{RandomFaults, for_each_seed};

use crate::support::*;

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Builds one of the lease futures, to be dropped at an arbitrary point.
fn victim(c: &Cluster, kind: u64, fenced: bool) -> Boxed {
    let mut lock = c.manager.lock("job").expiry(secs(10)).auto_renew(secs(3));
    if fenced {
        lock = lock.fenced("job:fence");
    }
    let clock = c.clock.clone();
    match kind {
        // Acquisition with retries.
        0 => Box::pin(async move {
            let _ = lock.acquire_within(secs(20)).await;
        }),
        // Scoped renewal around long work.
        1 => Box::pin(async move {
            if let Ok(lease) = lock.acquire_within(secs(20)).await {
                let _ = lease.run(clock.sleep_until(clock.now() + secs(120))).await;
                let _ = lease.release().await;
            }
        }),
        // Manual extensions.
        2 => Box::pin(async move {
            if let Ok(lease) = lock.acquire_within(secs(20)).await {
                for _ in 0..20 {
                    if lease.extend(secs(10)).await.is_err() {
                        break;
                    }
                    clock.sleep_until(clock.now() + secs(2)).await;
                }
            }
        }),
        // Release.
        3 => Box::pin(async move {
            if let Ok(lease) = lock.acquire_within(secs(20)).await {
                clock.sleep_until(clock.now() + secs(1)).await;
                let _ = lease.release().await;
            }
        }),
        // A held lease (renewed in the background when a spawner is set) dropped while held.
        _ => Box::pin(async move {
            if let Ok(lease) = lock.acquire_within(secs(20)).await {
                let signal = lease.lost();
                clock.sleep_until(clock.now() + secs(60)).await;
                drop(signal);
                drop(lease);
            }
        }),
    }
}

#[test]
fn cancelling_any_lease_future_at_any_point_leaves_no_renewal_running() {
    for_each_seed(0..1000, |seed| {
        let mut rng = Jitter::from_seed(seed ^ 0xC0FFEE);
        let n = [1usize, 3, 5][(rng.next_u64() % 3) as usize];
        let spawner = rng.next_u64() % 2 == 0;
        let mut c = if spawner {
            Cluster::with_spawner(n, seed, config())
        } else {
            Cluster::new(n, seed, config())
        };
        for (i, f) in c.faults.iter().enumerate() {
            f.random(RandomFaults::new(
                seed * 31 + i as u64,
                0.05,
                0.03,
                0.05,
                ms(40),
            ));
        }
        let kind = rng.next_u64() % 5;
        let fenced = n == 1 && rng.next_u64() % 2 == 0;
        let drop_after = ms(rng.next_u64() % 20_000);
        let mut fut = victim(&c, kind, fenced);
        let clock = c.clock.clone();
        let mut stop = clock.sleep_until(clock.now() + drop_after);
        c.sim.block_on(std::future::poll_fn(move |cx| {
            if fut.as_mut().poll(cx).is_ready() || stop.as_mut().poll(cx).is_ready() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        // Background clean-ups finish within a few operation timeouts; then nothing may talk to the nodes.
        c.sim.run_for(secs(5));
        assert!(
            c.sim.run_until_idle(secs(60)),
            "seed {seed}: a background task is still running"
        );
        let calls = c.calls();
        c.sim.run_for(secs(300));
        assert_eq!(
            c.calls(),
            calls,
            "seed {seed} (kind {kind}, n {n}): node traffic after cancellation"
        );
        c.assert_every_lock_key_has_ttl();
        for node in &c.nodes {
            assert_eq!(
                node.get("job"),
                None,
                "seed {seed}: the lock key outlived its TTL"
            );
        }
    });
}
