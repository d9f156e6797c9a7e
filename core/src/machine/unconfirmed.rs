//! The record of a held lease's requests that may still be applied on a node after later ones.

use super::Tally;
use super::nodeset::NodeSet;
use crate::node::Ttl;

/// Per node, the requests of one lease whose outcome that node never confirmed, as far as a later extension
/// must care: the smallest TTL of such a request.
///
/// A request written to a socket may be applied long after the caller gave up on it, and after later
/// requests (a pool, a reconnect). An extension that lands late with a *shorter* TTL than a later round's
/// shortens the key that round's validity relies on; one with an equal or longer TTL can only lengthen it.
/// So a node with an unconfirmed request shorter than a round's TTL must not count toward that round.
///
/// The node contract now rules that out on its own: an extension never shortens a key
/// ([`RedisNode`](crate::RedisNode#extensions-never-shorten-a-key)), which also covers what this record
/// cannot — a *duplicate* of a request that was answered, landing after a later round. The record stays as a
/// second line for late requests (a node that does not honour that rule), at the cost of not counting such a
/// node until it confirms.
///
/// # Call protocol
/// 1. [`plan`](Self::plan) when an extension round is planned, **before its first request is sent**: it
///    records the round as sent to every node and returns the TTLs a yes of this round must be compared
///    with ([`counts`]).
/// 2. [`handle_round`](Self::handle_round) with the round's tally when it ends: the nodes that answered
///    (yes, no, or a definite "not applied") are confirmed; the others keep the round's TTL.
///
/// A round whose driver future is dropped between the two never reaches step 2: its record stays as planned,
/// as if no node had answered, and the next [`plan`](Self::plan) keeps it for good. Nothing a later round
/// relies on lives in the driver's future.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unconfirmed {
    /// Per node, the smallest TTL (ms) of a request from a round that has ended (or was dropped) that may
    /// still be applied there; 0 for none. Allocated on the first such request.
    settled: Option<Box<[u64]>>,
    /// The TTL (ms) of the round planned last, until its answers are handled, and the nodes it was sent to
    /// (`None`: every node).
    open: Option<(u64, Option<NodeSet>)>,
}

/// Whether a yes from node `index` may count toward a round with `ttl`, given the TTLs [`Unconfirmed::plan`]
/// returned: not if a shorter request may still land there after it.
pub(crate) fn counts(settled: Option<&[u64]>, index: usize, ttl: Ttl) -> bool {
    !settled
        .and_then(|s| s.get(index).copied())
        .is_some_and(|min| min != 0 && min < ttl.as_millis())
}

impl Unconfirmed {
    /// The record a new lease starts with: the nodes where its acquisition request may still land, with the
    /// acquisition's TTL (ms; 0 for none).
    pub(crate) fn from_acquisition(settled: Option<Box<[u64]>>) -> Self {
        Self {
            settled,
            open: None,
        }
    }

    /// Plans an extension round with `ttl` to all `n` nodes, before any of its requests is sent. Returns the
    /// per-node TTLs of earlier unconfirmed requests, for [`counts`].
    #[must_use]
    pub(crate) fn plan(&mut self, n: usize, ttl: Ttl) -> Option<Box<[u64]>> {
        self.plan_on(n, ttl, None);
        self.settled.clone()
    }

    /// Plans a round with `ttl` to the nodes in `targets` (`None`: all `n`), before any of its requests is
    /// sent; see [`plan`](Self::plan).
    pub(crate) fn plan_on(&mut self, n: usize, ttl: Ttl, targets: Option<NodeSet>) {
        if let Some((open, on)) = self.open.take() {
            // The previous round never handled its answers (its future was dropped): any node it was sent to
            // may still apply it.
            self.note(
                n,
                open,
                (0..n).filter(|&i| on.is_none_or(|t| t.contains(i))),
            );
        }
        self.open = Some((ttl.as_millis(), targets));
    }

    /// Per node (of `n`), the smallest TTL (ms) of a request that may still be applied there (0: none), the
    /// round planned last included: what a lease handed to another process carries.
    pub(crate) fn snapshot(&self, n: usize) -> Box<[u64]> {
        let mut copy = self.clone();
        if let Some((open, on)) = copy.open.take() {
            copy.note(
                n,
                open,
                (0..n).filter(|&i| on.is_none_or(|t| t.contains(i))),
            );
        }
        let mut slots = copy.settled.map(Vec::from).unwrap_or_default();
        slots.resize(n, 0);
        slots.into_boxed_slice()
    }

    /// The round planned last ended with `tally` (of `n` nodes): the nodes that did not confirm it keep its TTL.
    pub(crate) fn handle_round(&mut self, n: usize, tally: &Tally) {
        let Some((ttl, _)) = self.open.take() else {
            return;
        };
        let unconfirmed = tally
            .maybe_applied_indices()
            .filter(|i| !tally.is_yes(*i))
            .collect::<Vec<_>>();
        self.note(n, ttl, unconfirmed.into_iter());
    }

    /// Records a request with `ttl_ms` that may still be applied on `nodes` (of `n`): each keeps the smallest.
    fn note(&mut self, n: usize, ttl_ms: u64, nodes: impl Iterator<Item = usize>) {
        for i in nodes {
            let slots = self
                .settled
                .get_or_insert_with(|| vec![0; n].into_boxed_slice());
            if let Some(slot) = slots.get_mut(i) {
                *slot = if *slot == 0 {
                    ttl_ms
                } else {
                    (*slot).min(ttl_ms)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Reply, WaitFor};
    use crate::node::{NodeError, NodeErrorKind};

    fn ttl(ms: u64) -> Ttl {
        Ttl::from_millis(ms).unwrap_or(Ttl::MAX)
    }

    /// A tally of 3 nodes with `replies` (node index, reply), the rest timed out.
    fn tally(replies: &[(usize, Reply)]) -> Tally {
        let mut t = Tally::new(3, 2, WaitFor::Decision);
        for (i, r) in replies {
            t.handle_reply(*i, r.clone());
        }
        t.handle_timeout(&NodeError::ambiguous(NodeErrorKind::Timeout, "timed out"));
        t
    }

    fn ambiguous() -> Reply {
        Reply::Failed(NodeError::ambiguous(NodeErrorKind::Io, "reply lost"))
    }

    fn refused() -> Reply {
        Reply::Failed(NodeError::not_applied(NodeErrorKind::Connection, "refused"))
    }

    #[test]
    fn a_snapshot_includes_the_round_still_open() {
        let mut u = Unconfirmed::default();
        assert_eq!(&*u.snapshot(3), &[0, 0, 0]);
        let _ = u.plan(3, ttl(30_000));
        u.handle_round(3, &tally(&[(0, Reply::Yes)]));
        assert_eq!(&*u.snapshot(3), &[0, 30_000, 30_000]);
        // A round planned and not (yet) answered may land anywhere it was sent.
        u.plan_on(3, ttl(5_000), Some(NodeSet::of([0])));
        assert_eq!(&*u.snapshot(3), &[5_000, 30_000, 30_000]);
    }

    #[test]
    fn a_new_lease_without_unsettled_acquisition_requests_counts_every_node() {
        let mut u = Unconfirmed::default();
        let s = u.plan(3, ttl(30_000));
        assert!((0..3).all(|i| counts(s.as_deref(), i, ttl(30_000))));
    }

    #[test]
    fn the_rows_of_a_finished_round() {
        // (replies, which nodes keep the 5 s TTL afterwards)
        type Row<'a> = (&'a [(usize, Reply)], [bool; 3]);
        let rows: [Row<'_>; 5] = [
            (
                &[(0, Reply::Yes), (1, Reply::Yes), (2, Reply::Yes)],
                [false; 3],
            ),
            (&[(0, Reply::Yes), (1, Reply::No)], [false, false, true]),
            (&[(0, ambiguous()), (1, refused())], [true, false, true]),
            (
                &[(0, Reply::No), (1, Reply::No), (2, Reply::No)],
                [false; 3],
            ),
            (&[], [true; 3]),
        ];
        for (replies, keeps) in rows {
            let mut u = Unconfirmed::default();
            let _ = u.plan(3, ttl(5_000));
            u.handle_round(3, &tally(replies));
            let s = u.plan(3, ttl(30_000));
            for (i, keep) in keeps.iter().enumerate() {
                assert_eq!(
                    !counts(s.as_deref(), i, ttl(30_000)),
                    *keep,
                    "{replies:?}, node {i}"
                );
                // An equal or shorter TTL is never held back: a late request can only lengthen the key.
                assert!(counts(s.as_deref(), i, ttl(5_000)));
            }
        }
    }

    #[test]
    fn a_round_dropped_before_its_answers_is_kept_on_every_node_by_the_next_plan() {
        let mut u = Unconfirmed::default();
        let _ = u.plan(3, ttl(5_000));
        // The round's future is dropped here: no handle_round.
        let s = u.plan(3, ttl(30_000));
        assert!((0..3).all(|i| !counts(s.as_deref(), i, ttl(30_000))));
        // And for good: a later round that confirms every node does not clear an earlier round's request.
        u.handle_round(
            3,
            &tally(&[(0, Reply::Yes), (1, Reply::Yes), (2, Reply::Yes)]),
        );
        let s = u.plan(3, ttl(30_000));
        assert!((0..3).all(|i| !counts(s.as_deref(), i, ttl(30_000))));
    }

    #[test]
    fn a_dropped_round_to_some_nodes_is_kept_on_those_only() {
        let mut u = Unconfirmed::default();
        u.plan_on(3, ttl(5_000), Some(NodeSet::of([2])));
        let s = u.plan(3, ttl(30_000));
        assert_eq!(
            (0..3)
                .map(|i| counts(s.as_deref(), i, ttl(30_000)))
                .collect::<Vec<_>>(),
            [true, true, false]
        );
    }

    #[test]
    fn each_node_keeps_the_smallest_unconfirmed_ttl() {
        let mut u = Unconfirmed::default();
        let _ = u.plan(3, ttl(20_000));
        u.handle_round(3, &tally(&[(1, Reply::Yes), (2, Reply::Yes)]));
        let _ = u.plan(3, ttl(10_000));
        u.handle_round(3, &tally(&[(0, Reply::Yes), (2, Reply::Yes)]));
        let s = u.plan(3, ttl(15_000));
        // Node 0: 20 s unconfirmed (longer than 15 s: harmless); node 1: 10 s (shorter: held back).
        assert!(counts(s.as_deref(), 0, ttl(15_000)));
        assert!(!counts(s.as_deref(), 1, ttl(15_000)));
        assert!(counts(s.as_deref(), 2, ttl(15_000)));
    }

    #[test]
    fn an_acquisition_request_that_may_still_land_is_kept() {
        let mut u = Unconfirmed::from_acquisition(Some(vec![0, 8_000, 0].into_boxed_slice()));
        let s = u.plan(3, ttl(30_000));
        assert_eq!(
            (0..3)
                .map(|i| counts(s.as_deref(), i, ttl(30_000)))
                .collect::<Vec<_>>(),
            [true, false, true]
        );
    }
}
