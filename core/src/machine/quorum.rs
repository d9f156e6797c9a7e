//! Counting the replies of one fan-out round.

use crate::node::NodeError;

/// The majority of `n` nodes: `floor(n / 2) + 1`.
pub const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// One node's answer in a round.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The node did what was asked (acquired, extended, deleted).
    Yes,
    /// The node definitively refused: held by another token (acquire) or not held by ours (extend, release).
    No,
    /// The node could not report an outcome.
    Failed(NodeError),
}

/// How long a round waits for replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// Stop as soon as the outcome is certain: a quorum said yes, or too many said no or failed for a quorum
    /// to remain possible (acquire, extend). After a quorum of a script round, the driver still lets
    /// stragglers answer for twice the time the quorum took, at least 50 ms (within the round's deadline) so healthy nodes
    /// get the write too; then calls still pending are abandoned.
    Decision,
    /// Wait for every node or the timeout (release and cleanup, which must reach every node they can).
    All,
}

/// The state of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// More replies could still change the outcome.
    Pending,
    /// At least a quorum said yes.
    Quorum,
    /// A quorum of yes is no longer possible.
    NoQuorum,
}

/// The tally of one round of calls to `n` nodes.
///
/// Call protocol: create it when the round's first request is sent; feed each reply to
/// [`handle_reply`](Self::handle_reply) (in any order, once per node); after each, ask
/// [`is_done`](Self::is_done) whether to stop waiting; at the round's deadline call
/// [`handle_timeout`](Self::handle_timeout), which turns every missing reply into an ambiguous timeout.
/// Then read the counts and [`verdict`](Self::verdict).
#[derive(Debug, Clone)]
pub struct Tally {
    replies: super::slots::Slots<Option<Reply>>,
    /// The counts are `u32` (no manager has 2³² nodes) so that they fit where a `usize` `required` was:
    /// a tally is kept across awaits in every acquisition future.
    required: u32,
    wait: WaitFor,
    /// `Yes` replies among `replies` (kept with them: the driver asks after every poll).
    yes: u32,
    /// Slots of `replies` that hold a reply.
    answered: u32,
}

impl Tally {
    /// A tally for `n` nodes needing `required` yes votes.
    pub fn new(n: usize, required: usize, wait: WaitFor) -> Self {
        Self {
            replies: super::slots::Slots::from_fn(n, |_| None),
            required: u32::try_from(required).unwrap_or(u32::MAX),
            wait,
            yes: 0,
            answered: 0,
        }
    }

    /// Records the reply of node `index`. A second reply for the same node, or an index out of range, is
    /// ignored (the first answer stands).
    pub fn handle_reply(&mut self, index: usize, reply: Reply) {
        if let Some(slot @ None) = self.replies.get_mut(index) {
            if matches!(reply, Reply::Yes) {
                self.yes += 1;
            }
            self.answered += 1;
            *slot = Some(reply);
        }
    }

    /// Marks every node that has not replied as failed with `error` (normally an ambiguous timeout).
    pub fn handle_timeout(&mut self, error: &NodeError) {
        for slot in self.replies.iter_mut() {
            if slot.is_none() {
                *slot = Some(Reply::Failed(error.clone()));
                self.answered += 1;
            }
        }
    }

    /// Nodes that answered yes.
    pub fn yes(&self) -> usize {
        self.yes as usize
    }

    /// Nodes that answered no.
    pub fn no(&self) -> usize {
        self.count(|r| matches!(r, Reply::No))
    }

    /// Nodes that refused in a way no retry can change ([`NodeError::is_permanent`]).
    pub fn permanent(&self) -> usize {
        self.count(|r| matches!(r, Reply::Failed(e) if e.is_permanent()))
    }

    /// Nodes that have not answered yet.
    pub fn pending(&self) -> usize {
        self.replies.len() - self.answered as usize
    }

    /// The yes votes needed.
    pub fn required(&self) -> usize {
        self.required as usize
    }

    /// Whether node `index` answered `Yes`.
    pub fn is_yes(&self, index: usize) -> bool {
        matches!(self.replies.get(index), Some(Some(Reply::Yes)))
    }

    /// Indices of the nodes that answered `Yes`.
    pub fn yes_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| matches!(r, Some(Reply::Yes)).then_some(i))
    }

    /// Indices of the nodes where the operation may have taken effect: those that answered `Yes`, failed
    /// ambiguously, or have not answered. A definite `No` or a definitely-not-applied failure is excluded.
    pub fn maybe_applied_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::No) => None,
                Some(Reply::Failed(e)) if !e.is_ambiguous() => None,
                _ => Some(i),
            })
    }

    /// Indices of the nodes whose request may still be carried out later: they failed ambiguously or have
    /// not answered (a `Yes` or `No` means the request was carried out already).
    pub fn unsettled_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                None => Some(i),
                Some(Reply::Failed(e)) if e.is_ambiguous() => Some(i),
                _ => None,
            })
    }

    /// The failures, by node index.
    pub fn errors(&self) -> Vec<(usize, NodeError)> {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::Failed(e)) => Some((i, e.clone())),
                _ => None,
            })
            .collect()
    }

    /// Whether any node failed with an outcome that may have been applied.
    pub fn any_ambiguous(&self) -> bool {
        self.replies
            .iter()
            .any(|r| matches!(r, Some(Reply::Failed(e)) if e.is_ambiguous()))
    }

    /// The verdict so far.
    pub fn verdict(&self) -> Verdict {
        let (yes, required) = (self.yes(), self.required());
        if yes >= required {
            Verdict::Quorum
        } else if yes + self.pending() < required {
            Verdict::NoQuorum
        } else {
            Verdict::Pending
        }
    }

    /// Every node's reply so far, by index (`None`: no reply yet, or abandoned). Read by the lease event hook.
    pub(crate) fn replies(&self) -> &[Option<Reply>] {
        &self.replies
    }

    /// Whether enough nodes definitively said no that a quorum of yes is impossible whatever the others
    /// answer: held by another owner (acquire), not held by ours (extend, release). Unlike
    /// [`Verdict::NoQuorum`], failures and missing replies do not count: they say nothing about the key.
    pub fn refused(&self) -> bool {
        self.no() > self.replies.len().saturating_sub(self.required())
    }

    /// Whether the driver may stop waiting for replies.
    pub fn is_done(&self) -> bool {
        match self.wait {
            WaitFor::All => self.pending() == 0,
            WaitFor::Decision => self.pending() == 0 || self.verdict() != Verdict::Pending,
        }
    }

    fn count(&self, f: impl Fn(&Reply) -> bool) -> usize {
        self.replies.iter().flatten().filter(|r| f(r)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_counts_only_definite_noes() {
        let timeout = NodeError::timed_out(std::time::Duration::from_millis(1));
        // (replies of 3 nodes, quorum 2; refused?)
        let rows: [(&[Reply], bool); 4] = [
            (&[Reply::No, Reply::No], true),
            (&[Reply::No, Reply::Yes, Reply::No], true),
            (&[Reply::No, Reply::Failed(timeout.clone())], false),
            (&[Reply::No], false),
        ];
        for (replies, refused) in rows {
            let mut t = Tally::new(3, 2, WaitFor::Decision);
            for (i, r) in replies.iter().enumerate() {
                t.handle_reply(i, r.clone());
            }
            t.handle_timeout(&timeout);
            assert_eq!(t.refused(), refused, "{replies:?}");
        }
    }
    use crate::node::NodeErrorKind;
    use proptest::prelude::*;

    fn err() -> NodeError {
        NodeError::not_applied(NodeErrorKind::Connection, "refused")
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn unsettled_nodes_are_those_unanswered_or_failed_ambiguously() {
        let mut t = Tally::new(5, 3, WaitFor::All);
        t.handle_reply(0, Reply::Yes);
        t.handle_reply(1, Reply::No);
        t.handle_reply(2, Reply::Failed(err()));
        t.handle_reply(
            3,
            Reply::Failed(NodeError::ambiguous(NodeErrorKind::Io, "cut")),
        );
        // Node 4 has not answered.
        assert_eq!(t.unsettled_indices().collect::<Vec<_>>(), [3, 4]);
        assert!(t.any_ambiguous());
        let replies = t.replies();
        assert_eq!(replies.len(), 5);
        assert!(matches!(replies[0], Some(Reply::Yes)) && matches!(replies[1], Some(Reply::No)));
        assert!(replies[4].is_none());
        // Definite failures only: nothing ambiguous, and every answered node settled.
        let mut t = Tally::new(3, 2, WaitFor::All);
        t.handle_reply(0, Reply::Failed(err()));
        t.handle_reply(1, Reply::No);
        t.handle_reply(2, Reply::Yes);
        assert!(!t.any_ambiguous());
        assert_eq!(t.unsettled_indices().count(), 0);
    }

    #[test]
    fn a_tally_reports_the_votes_it_requires() {
        for (n, required) in [(1, 1), (3, 2), (5, 3), (5, 5)] {
            assert_eq!(Tally::new(n, required, WaitFor::All).required(), required);
        }
    }

    #[test]
    fn decision_round_stops_at_quorum() {
        let mut t = Tally::new(5, 3, WaitFor::Decision);
        t.handle_reply(0, Reply::Yes);
        t.handle_reply(3, Reply::Yes);
        assert!(!t.is_done());
        t.handle_reply(4, Reply::Yes);
        assert!(t.is_done());
        assert_eq!(t.verdict(), Verdict::Quorum);
        assert_eq!(t.yes_indices().collect::<Vec<_>>(), vec![0, 3, 4]);
    }

    #[test]
    fn decision_round_stops_when_quorum_is_impossible() {
        let mut t = Tally::new(3, 2, WaitFor::Decision);
        t.handle_reply(1, Reply::No);
        assert!(!t.is_done());
        t.handle_reply(2, Reply::Failed(err()));
        assert!(t.is_done());
        assert_eq!(t.verdict(), Verdict::NoQuorum);
        // Node 0 has not answered, node 2 failed definitely: only node 0 may hold our write.
        assert_eq!(t.maybe_applied_indices().collect::<Vec<_>>(), vec![0]);
        let mut t = Tally::new(3, 2, WaitFor::All);
        t.handle_reply(0, Reply::Yes);
        t.handle_reply(
            1,
            Reply::Failed(NodeError::timed_out(std::time::Duration::from_millis(1))),
        );
        t.handle_reply(2, Reply::No);
        assert_eq!(t.maybe_applied_indices().collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn all_round_waits_for_everyone() {
        let mut t = Tally::new(3, 2, WaitFor::All);
        t.handle_reply(0, Reply::Yes);
        t.handle_reply(1, Reply::Yes);
        assert!(!t.is_done());
        t.handle_timeout(&NodeError::timed_out(std::time::Duration::from_millis(5)));
        assert!(t.is_done());
        assert!(t.any_ambiguous());
        assert_eq!(t.errors().len(), 1);
        assert_eq!(t.errors()[0].0, 2);
    }

    #[test]
    fn duplicate_and_out_of_range_replies_are_ignored() {
        let mut t = Tally::new(1, 1, WaitFor::Decision);
        t.handle_reply(0, Reply::No);
        t.handle_reply(0, Reply::Yes);
        t.handle_reply(7, Reply::Yes);
        assert_eq!(t.yes(), 0);
        assert_eq!(t.verdict(), Verdict::NoQuorum);
    }

    proptest! {
        /// The counts kept as replies arrive are those of the replies themselves, whatever the order, with
        /// second replies, indices out of range and a timeout among them.
        #[test]
        fn kept_counts_equal_a_recount(
            n in 1usize..7,
            steps in proptest::collection::vec((0usize..8, 0u8..4), 0..16),
            timeout_at in proptest::option::of(0usize..16),
        ) {
            let mut t = Tally::new(n, quorum(n), WaitFor::All);
            for (k, (i, r)) in steps.iter().enumerate() {
                if timeout_at == Some(k) {
                    t.handle_timeout(&NodeError::timed_out(std::time::Duration::from_millis(1)));
                }
                t.handle_reply(*i, match r {
                    0 => Reply::Yes,
                    1 => Reply::No,
                    _ => Reply::Failed(err()),
                });
                let recount = |f: fn(&Reply) -> bool| t.replies().iter().flatten().filter(|r| f(r)).count();
                prop_assert_eq!(t.yes(), recount(|r| matches!(r, Reply::Yes)));
                prop_assert_eq!(t.no(), recount(|r| matches!(r, Reply::No)));
                prop_assert_eq!(t.pending(), t.replies().iter().filter(|r| r.is_none()).count());
            }
        }

        #[test]
        fn verdict_agrees_with_counts(replies in proptest::collection::vec(0u8..4, 1..9)) {
            let n = replies.len();
            let mut t = Tally::new(n, quorum(n), WaitFor::Decision);
            for (i, r) in replies.iter().enumerate() {
                match r {
                    0 => t.handle_reply(i, Reply::Yes),
                    1 => t.handle_reply(i, Reply::No),
                    2 => t.handle_reply(i, Reply::Failed(err())),
                    _ => {}
                }
            }
            prop_assert_eq!(t.yes() + t.no() + t.errors().len() + t.pending(), n);
            match t.verdict() {
                Verdict::Quorum => prop_assert!(t.yes() >= quorum(n)),
                Verdict::NoQuorum => prop_assert!(t.yes() + t.pending() < quorum(n)),
                Verdict::Pending => prop_assert!(t.yes() < quorum(n) && t.yes() + t.pending() >= quorum(n)),
            }
        }
    }
}
