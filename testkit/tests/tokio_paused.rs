//! `TokioTestTimer` on tokio's paused clock: leases renew and expire on tokio's virtual time, moved by
//! `advance` or tokio's auto-advance, and real time passing under a paused clock is not a suspend.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use redlease::{Config, LeaseState, LockManager, LossReason, Task, Timer};
use redlease_testkit::{MemoryNode, TokioTestTimer};

fn manager(node: MemoryNode) -> LockManager {
    LockManager::single(node, Config::default().with_expiry(Duration::from_secs(30)))
        .unwrap()
        .with_timer(TokioTestTimer)
        .with_spawner(|task: Task| drop(tokio::spawn(task)))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn renewals_keep_a_lease_for_an_hour_of_paused_tokio_time_and_a_deleted_key_is_lost_at_the_next()
 {
    let node = MemoryNode::with_timer(TokioTestTimer);
    let lease = manager(node.clone())
        .lock("job")
        .auto_renew(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let start = TokioTestTimer.now();
    for _ in 0..360 {
        tokio::time::advance(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
    }
    assert_eq!(TokioTestTimer.now() - start, Duration::from_secs(3600));
    assert_eq!(lease.state(), LeaseState::Held);
    // The key's TTL on the node's (tokio) clock was set by a renewal within the last interval or so.
    let ttl = node.pttl("job").unwrap().unwrap();
    assert!(ttl > Duration::from_secs(15), "{ttl:?}");

    // The key vanishes: the next renewal, at most one interval later, finds it gone.
    assert!(node.del("job"));
    let before = TokioTestTimer.now();
    let reason = lease.lost().await; // auto-advanced
    assert_eq!(reason, LossReason::NotHeld);
    assert!(TokioTestTimer.now() - before <= Duration::from_secs(11));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn real_time_passing_while_tokios_clock_is_paused_is_not_taken_for_a_suspend() {
    let node = MemoryNode::with_timer(TokioTestTimer);
    // A 200 ms lease: its drift allowance is 4 ms.
    let lease = manager(node)
        .lock("job")
        .expiry(Duration::from_millis(200))
        .try_acquire()
        .await
        .unwrap();
    // Real time passes (a blocking call, a slow machine), tokio's paused clock does not.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(lease.state(), LeaseState::Held);
    lease.release().await.unwrap();
}
