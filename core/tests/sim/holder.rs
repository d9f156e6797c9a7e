//! Holder info (`Lock::with_holder_info`, `Lock::holder_info`): stored in the lock's value after the token,
//! written, extended and deleted with it, readable without the token.

use redlease::{ConfigError, Error, LeaseState, LeaseTicket, MAX_HOLDER_INFO_BYTES};

use crate::support::*;

#[test]
fn holder_info_is_written_with_the_lease_renewed_with_it_and_deleted_with_it() {
    for (n, fenced) in [(1, false), (1, true), (3, false), (5, false)] {
        let mut c = Cluster::with_spawner(n, 91, config());
        let mut lock = c
            .manager
            .lock("job")
            .with_holder_info("host=web-3 pid=4242")
            .auto_renew(secs(10));
        if fenced {
            lock = lock.fenced("job:fence");
        }
        let lease = c.try_acquire(&lock).unwrap();
        assert_eq!(lease.token().info(), Some("host=web-3 pid=4242"));
        let reader = c.manager.lock("job");
        let holder = c
            .sim
            .block_on({
                let reader = reader.clone();
                async move { reader.holder_info().await }
            })
            .unwrap()
            .expect("held");
        assert_eq!(holder.info(), Some("host=web-3 pid=4242"), "n={n}");
        assert_eq!(holder.nodes(), n);
        assert_eq!(holder.remaining(), Some(secs(30)));
        let shown = format!("{holder:?}");
        assert!(
            !shown.contains(&lease.token().as_str()[..40]),
            "the token is never shown: {shown}"
        );
        // Renewed (compare-and-expire of the whole value) for a minute.
        c.sim.run_for(secs(60));
        assert_eq!(lease.state(), LeaseState::Held, "n={n}");
        let holder = c
            .sim
            .block_on({
                let reader = reader.clone();
                async move { reader.holder_info().await }
            })
            .unwrap()
            .expect("still held");
        assert!(holder.remaining().unwrap() > secs(19));
        // Released (compare-and-delete of the whole value): nothing left.
        c.sim
            .block_on(async move { lease.release().await })
            .unwrap();
        let after = c
            .sim
            .block_on(async move { reader.holder_info().await })
            .unwrap();
        assert_eq!(after, None, "n={n}");
    }
}

#[test]
fn a_value_split_between_owners_or_written_by_someone_else_shows_no_info() {
    let mut c = Cluster::new(3, 92, config());
    // A foreign value on a majority: held, but by nobody who stored info.
    c.nodes[0].set("job", "someone-else", Some(secs(5)));
    c.nodes[1].set("job", "someone-else", Some(secs(5)));
    let reader = c.manager.lock("job");
    let holder = c
        .sim
        .block_on({
            let reader = reader.clone();
            async move { reader.holder_info().await }
        })
        .unwrap()
        .expect("a quorum holds one value");
    assert_eq!(holder.info(), None);
    assert_eq!(holder.nodes(), 2);
    // Split three ways: no holder.
    c.nodes[1].set("job", "a-third-value", Some(secs(5)));
    let holder = c
        .sim
        .block_on(async move { reader.holder_info().await })
        .unwrap();
    assert_eq!(holder, None);
}

#[test]
fn holder_info_over_the_limit_is_refused_before_anything_is_sent() {
    let mut c = Cluster::new(1, 93, config());
    let lock = c
        .manager
        .lock("job")
        .with_holder_info("x".repeat(MAX_HOLDER_INFO_BYTES + 1));
    match c.try_acquire(&lock) {
        Err(Error::Config(ConfigError::HolderInfoTooLong { len, max })) => {
            assert_eq!(
                (len, max),
                (MAX_HOLDER_INFO_BYTES + 1, MAX_HOLDER_INFO_BYTES)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.calls(), 0);
    let ok = c
        .manager
        .lock("job")
        .with_holder_info("x".repeat(MAX_HOLDER_INFO_BYTES));
    assert!(c.try_acquire(&ok).is_ok());
}

#[test]
fn a_ticket_carries_the_holder_info_and_the_resumed_lease_keeps_it() {
    let mut c = Cluster::new(3, 94, config());
    let lock = c
        .manager
        .lock("job")
        .with_holder_info("dispatcher: job.42 (stage 1)");
    let lease = c.try_acquire(&lock).unwrap();
    let text = lease.handoff().unwrap().encode();
    let ticket: LeaseTicket = text.parse().unwrap();
    assert_eq!(ticket.token().info(), Some("dispatcher: job.42 (stage 1)"));
    let resume = c.manager.lock("job");
    let resumed = c
        .sim
        .block_on(async move { resume.resume(&ticket).await })
        .unwrap();
    assert_eq!(resumed.token().info(), Some("dispatcher: job.42 (stage 1)"));
    c.sim
        .block_on(async move { resumed.release().await })
        .unwrap();
    for node in &c.nodes {
        assert_eq!(node.get("job"), None, "released: the whole value matched");
    }
}
