//! Redundancy (issue 21): a Redlock acquisition wins at a quorum and lets the stragglers go; the lease then
//! writes its key, with its own token, on the nodes that never confirmed it, so that it is held on every
//! healthy node and survives a further node failure.

use redlease::{LeaseState, Timer};
use redlease_testkit::{Fault, Op};

use crate::support::*;

/// Node 2 never answers the acquisition (its request is lost in the network): the round wins on nodes 0
/// and 1 and abandons it.
fn straggler(spawner: bool) -> (Cluster, redlease::Lease) {
    let cfg = config().with_expiry(secs(30));
    let mut c = if spawner {
        Cluster::with_spawner(3, 5, cfg)
    } else {
        Cluster::new(3, 5, cfg)
    };
    c.faults[2].script(Op::Acquire, [Fault::Hang]);
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    (c, lease)
}

#[test]
fn a_lease_won_without_a_node_writes_its_key_there_right_after_the_acquisition() {
    let (mut c, lease) = straggler(true);
    let token = lease.token().as_str().to_owned();
    assert_eq!(c.holders("job", &token), [0, 1], "won by a bare majority");
    c.sim.run_for(ms(600));
    assert_eq!(
        c.holders("job", &token),
        [0, 1, 2],
        "the key on every healthy node"
    );
    let ttl = c.nodes[2].pttl("job").flatten().unwrap();
    assert!(ttl > secs(29), "{ttl:?}");
    // Two nodes may now fail and the lease's key is still on a node... and the lease still extends on a
    // majority after one failure.
    c.faults[0].script(
        Op::Extend,
        [Fault::Fail(redlease::NodeErrorKind::Connection)],
    );
    let lease = c.sim.block_on(async move {
        lease.extend(secs(30)).await.unwrap();
        lease
    });
    assert_eq!(lease.state(), LeaseState::Held);
}

#[test]
fn without_a_spawner_the_next_extension_writes_the_key_on_the_missing_node() {
    let (mut c, lease) = straggler(false);
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(ms(600));
    assert_eq!(
        c.holders("job", &token),
        [0, 1],
        "nothing runs in the background"
    );
    let lease = c.sim.block_on(async move {
        lease.extend(secs(30)).await.unwrap();
        lease
    });
    assert_eq!(c.holders("job", &token), [0, 1, 2]);
    assert_eq!(lease.state(), LeaseState::Held);
}

#[test]
fn the_repair_never_overwrites_another_owners_key() {
    let cfg = config().with_expiry(secs(30));
    let mut c = Cluster::with_spawner(3, 6, cfg);
    c.nodes[2].set("job", "someone-else", Some(secs(60)));
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    c.sim.run_for(ms(600));
    assert_eq!(c.nodes[2].get("job").as_deref(), Some(&b"someone-else"[..]));
    // Its extensions keep asking that node (it never confirmed the key) and never count it.
    let clock = c.clock.clone();
    let lease = c.sim.block_on(async move {
        clock.sleep_until(clock.now() + secs(1)).await;
        lease.extend(secs(30)).await.unwrap();
        lease
    });
    assert_eq!(c.nodes[2].get("job").as_deref(), Some(&b"someone-else"[..]));
    assert_eq!(lease.state(), LeaseState::Held);
}

#[test]
fn a_lease_renewed_in_the_background_gets_the_missing_node_from_its_first_renewal() {
    let cfg = config().with_expiry(secs(30));
    let mut c = Cluster::with_spawner(3, 7, cfg);
    c.faults[2].script(Op::Acquire, [Fault::Hang]);
    let lease = c
        .try_acquire(&c.manager.lock("job").auto_renew(secs(10)))
        .unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(secs(5));
    assert_eq!(
        c.holders("job", &token),
        [0, 1],
        "no repair round of its own"
    );
    c.sim.run_for(secs(6));
    assert_eq!(
        c.holders("job", &token),
        [0, 1, 2],
        "written by the first renewal"
    );
    assert_eq!(lease.state(), LeaseState::Held);
}

/// A repair refused before it was sent (no connection yet) is tried again, a retry delay later.
#[test]
fn a_repair_refused_by_a_node_not_yet_connected_is_tried_again() {
    let cfg = config().with_expiry(secs(30));
    let mut c = Cluster::with_spawner(3, 8, cfg);
    // The acquisition's request is lost; the first repair is refused before it is sent (no connection yet).
    c.faults[2].script(
        Op::Acquire,
        [
            Fault::Hang,
            Fault::Fail(redlease::NodeErrorKind::Connection),
        ],
    );
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    let token = lease.token().as_str().to_owned();
    // Not at once: the refused node is asked again a retry delay later (a connection takes its time).
    c.sim.run_for(ms(1));
    assert_eq!(
        c.faults[2].calls(Op::Acquire),
        2,
        "the first repair was refused"
    );
    assert_eq!(c.holders("job", &token), [0, 1]);
    c.sim.run_for(secs(2));
    assert_eq!(c.holders("job", &token), [0, 1, 2]);
}

/// The first repair round is short (it holds the lease's extension permit, and a healthy node answers at
/// once): a node that answers only after that bound (a connection still being opened) is asked again with
/// the full operation timeout, a retry delay later.
#[test]
fn a_slow_first_repair_is_cut_short_and_asked_again_with_the_operation_timeout() {
    let cfg = config()
        .with_expiry(secs(30))
        .with_operation_timeout(ms(400));
    let mut c = Cluster::with_spawner(3, 9, cfg);
    // The acquisition's request is lost; the first repair is answered after 200 ms (past its 50 ms bound,
    // within the 400 ms operation timeout), the second at once.
    c.faults[2].script(Op::Acquire, [Fault::Hang, Fault::SlowReply(ms(200))]);
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(secs(2));
    assert_eq!(c.holders("job", &token), [0, 1, 2]);
    assert_eq!(
        c.faults[2].calls(Op::Acquire),
        3,
        "the lost acquisition, the cut first repair, the second"
    );
}

/// A lease dropped while its repair's write is still in the network: the drop's clean-up deletes the token
/// everywhere first (requests overtake one another on this node: a pool of connections), then the write
/// lands on the missing node, and the repair, seeing the lease ended when its round ends, deletes the token
/// there again — no key of a dropped lease is left until its TTL.
#[test]
fn a_repair_that_lands_after_the_lease_was_dropped_is_undone() {
    let cfg = config().with_expiry(secs(30));
    let mut c = Cluster::with_spawner(3, 10, cfg);
    c.faults[2].delivery(redlease_testkit::Delivery::Pool);
    c.faults[2].script(Op::Acquire, [Fault::Hang, Fault::Late(ms(20))]);
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(ms(5));
    assert_eq!(
        c.faults[2].calls(Op::Acquire),
        2,
        "the repair's write was sent"
    );
    drop(lease);
    c.sim.run_for(secs(1));
    assert!(
        c.holders("job", &token).is_empty(),
        "left on {:?}",
        c.holders("job", &token)
    );
    assert_eq!(
        c.faults[2].calls(Op::Release),
        2,
        "the clean-up, then the repair's undo"
    );
}

/// A release that waits for a repair round in flight (so that its deletion comes after the repair's write)
/// and is dropped while it waits still deletes the token from every node, on the spawner (the live
/// cancellation test found keys left behind).
#[test]
fn a_release_dropped_while_a_repair_holds_the_lease_still_cleans_up() {
    let mut c = Cluster::with_spawner(3, 131, config());
    c.faults[2].script(
        redlease_testkit::Op::Acquire,
        [
            redlease_testkit::Fault::Fail(redlease::NodeErrorKind::Connection),
            redlease_testkit::Fault::Hang,
        ],
    );
    let lease = c.try_acquire(&c.manager.lock("job")).unwrap();
    let token = lease.token().as_str().to_owned();
    c.sim.run_for(ms(1));
    assert_eq!(
        c.holders("job", &token),
        vec![0, 1],
        "the repair is in flight"
    );
    c.sim.block_on(async move {
        let mut release = Box::pin(lease.release());
        std::future::poll_fn(|cx| {
            let _ = release.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        drop(release);
    });
    c.sim.run_for(secs(2));
    assert!(
        c.holders("job", &token).is_empty(),
        "left on {:?}",
        c.holders("job", &token)
    );
}
