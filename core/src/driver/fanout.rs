//! The one round loop: a fan-out of one call per node whose answers feed one or more *parties* — the lease
//! of a round of its own, or each lease of a batched renewal — each with its own [`Tally`] and deadline.
//!
//! Used by [`Engine::round`](super::Engine::round) (one party) and the shared renewer's batched rounds
//! (`super::batch`, a party per lease). What a reply means for a party and what happens when a party's
//! round fails are the caller's; the loop only decides when each party's round is over:
//!
//! - a party whose tally is decided against it (refused, or failed beyond a quorum) is *closed* at once and
//!   handed to the caller, while the calls go on for the others;
//! - a party still undecided at its deadline gets the timeout for its pending nodes, and is closed if that
//!   decides it against it;
//! - once every open party won, the stragglers get a grace — twice as long again as the round took so far,
//!   at least [`grace_floor`] of the latest deadline — if the caller asked for one (a script may need a
//!   second request, `EVAL` after `NOSCRIPT`, that only happens while its future is polled), and the round
//!   ends when it is over; without a grace the round ends at once;
//! - the round ends too when every node answered or no party is open.
//!
//! Parties still open at the end (they won) are the caller's to handle; calls still in flight are dropped
//! with the [`Fanout`].

use std::task::{Context, Poll};
use std::time::Instant;

use super::{BoxFuture, grace_floor};
use crate::machine::slots::Slots;
use crate::machine::{Tally, Verdict};
use crate::node::NodeError;
use crate::time::{SharedTimer, Sleep};

/// The calls of one round and its timers (armed only when a first poll leaves the round undecided: an
/// in-memory node answers at once).
pub(crate) struct Fanout<'a, R> {
    calls: Slots<Option<BoxFuture<'a, Result<R, NodeError>>>>,
    /// The timer for the earliest deadline of a party still waiting for replies, and that deadline.
    sleep: Option<(Instant, Sleep)>,
    /// The stragglers' grace, once every open party won.
    grace: Option<Sleep>,
}

/// When a round started, and whether its stragglers get a grace after every party won (see the module
/// docs).
#[derive(Clone, Copy)]
pub(crate) struct Pace {
    pub(crate) started: Instant,
    pub(crate) grace: bool,
}

/// What the parties of one round are: their tallies, deadlines and which are still open.
pub(crate) struct Parties<'p, D> {
    pub(crate) tallies: &'p mut [Tally],
    /// Party `j`'s deadline.
    pub(crate) deadline: D,
    /// Per party, whether its round is still going on (not closed by [`Fanout::poll`]).
    pub(crate) open: &'p mut [bool],
}

impl<'a, R> Fanout<'a, R> {
    /// A round of `n` calls, `call(i)` for node `i`, sent when first polled.
    pub(crate) fn new(
        n: usize,
        mut call: impl FnMut(usize) -> BoxFuture<'a, Result<R, NodeError>>,
    ) -> Self {
        Self {
            calls: Slots::from_fn(n, |i| Some(call(i))),
            sleep: None,
            grace: None,
        }
    }

    /// Drives the round one step: polls the calls still in flight (each answer goes to `reply(i, answer,
    /// tallies)`), times out parties past their deadline, closes parties decided against them
    /// (`closed(j, tally)`), and arms the timers. Ready when the round is over (see the module docs).
    pub(crate) fn poll<D: Fn(usize) -> Instant>(
        &mut self,
        cx: &mut Context<'_>,
        timer: &SharedTimer,
        Pace { started, grace }: Pace,
        parties: &mut Parties<'_, D>,
        mut reply: impl FnMut(usize, Result<R, NodeError>, &mut [Tally]),
        mut closed: impl FnMut(usize, &Tally),
    ) -> Poll<()> {
        let mut answered = true;
        for (i, slot) in self.calls.iter_mut().enumerate() {
            let Some(call) = slot else { continue };
            if let Poll::Ready(result) = call.as_mut().poll(cx) {
                *slot = None;
                reply(i, result, parties.tallies);
            } else {
                answered = false;
            }
        }
        loop {
            // Read only where a deadline may matter: a round answered in its first poll reads no clock.
            let mut now = None;
            for (j, tally) in parties.tallies.iter_mut().enumerate() {
                if !parties.open[j] {
                    continue;
                }
                if !tally.is_done() {
                    let deadline = (parties.deadline)(j);
                    if *now.get_or_insert_with(|| timer.now()) >= deadline {
                        tally.handle_timeout(&NodeError::timed_out(
                            deadline.saturating_duration_since(started),
                        ));
                    }
                }
                if tally.is_done() && tally.verdict() != Verdict::Quorum {
                    parties.open[j] = false;
                    closed(j, tally);
                }
            }
            if answered || !parties.open.contains(&true) {
                return Poll::Ready(());
            }
            let waiting = parties
                .tallies
                .iter()
                .zip(parties.open.iter())
                .enumerate()
                .filter(|(_, (t, open))| **open && !t.is_done())
                .map(|(j, _)| (parties.deadline)(j))
                .min();
            let Some(at) = waiting else {
                // Every open party won.
                if !grace {
                    return Poll::Ready(());
                }
                let grace = self.grace.get_or_insert_with(|| {
                    let now = now.unwrap_or_else(|| timer.now());
                    let latest = (0..parties.tallies.len())
                        .filter(|&j| parties.open[j])
                        .map(|j| (parties.deadline)(j))
                        .max()
                        .unwrap_or(now);
                    let took = now.saturating_duration_since(started);
                    let wait = took
                        .saturating_mul(2)
                        .max(grace_floor(latest.saturating_duration_since(started)));
                    timer.sleep_until(crate::time::add(now, wait).min(latest))
                });
                return grace.as_mut().poll(cx);
            };
            let sleep = match &mut self.sleep {
                Some((until, sleep)) if *until == at => sleep,
                slot => &mut slot.insert((at, timer.sleep_until(at))).1,
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Past that deadline: time its party out (above), and arm the next one.
            self.sleep = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::machine::{Reply, WaitFor};
    use crate::time::hand::HandClock;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A node's answer the test hands over when it likes: `None` until then.
    type Answers = Arc<Mutex<Vec<Option<Result<bool, NodeError>>>>>;

    struct Round {
        clock: HandClock,
        timer: SharedTimer,
        t0: Instant,
        answers: Answers,
    }

    impl Round {
        fn new(n: usize) -> Self {
            let t0 = Instant::now();
            let clock = HandClock::at(t0);
            Self {
                timer: clock.timer(),
                clock,
                t0,
                answers: Arc::new(Mutex::new(vec![None; n])),
            }
        }

        fn fanout(&self) -> Fanout<'static, bool> {
            let n = self.answers.lock().unwrap().len();
            Fanout::new(n, |i| {
                let answers = Arc::clone(&self.answers);
                Box::pin(std::future::poll_fn(move |_| {
                    match answers.lock().unwrap()[i].take() {
                        Some(answer) => Poll::Ready(answer),
                        None => Poll::Pending,
                    }
                }))
            })
        }

        fn answer(&self, i: usize, answer: Result<bool, NodeError>) {
            self.answers.lock().unwrap()[i] = Some(answer);
        }

        fn at(&self, after: Duration) {
            self.clock.set(self.t0 + after);
        }

        fn sleeps(&self) -> usize {
            self.clock.sleeps()
        }
    }

    /// One poll of a round whose parties all take each node's yes/no; returns whether it is over and the
    /// parties closed in this poll.
    fn step(
        round: &Round,
        fanout: &mut Fanout<'static, bool>,
        grace: bool,
        tallies: &mut [Tally],
        deadlines: &[Instant],
        open: &mut [bool],
    ) -> (bool, Vec<usize>) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut closed = Vec::new();
        let ready = fanout
            .poll(
                &mut cx,
                &round.timer,
                Pace {
                    started: round.t0,
                    grace,
                },
                &mut Parties {
                    tallies,
                    deadline: |j: usize| deadlines[j],
                    open,
                },
                |i, answer, tallies| {
                    for t in tallies.iter_mut() {
                        t.handle_reply(
                            i,
                            match &answer {
                                Ok(true) => Reply::Yes,
                                Ok(false) => Reply::No,
                                Err(e) => Reply::Failed(e.clone()),
                            },
                        );
                    }
                },
                |j, _| closed.push(j),
            )
            .is_ready();
        (ready, closed)
    }

    #[test]
    fn a_round_answered_in_its_first_poll_arms_no_timer() {
        let round = Round::new(3);
        for i in 0..3 {
            round.answer(i, Ok(true));
        }
        let mut fanout = round.fanout();
        let mut tallies = [Tally::new(3, 2, WaitFor::Decision)];
        let (ready, closed) = step(
            &round,
            &mut fanout,
            true,
            &mut tallies,
            &[round.t0 + ms(100)],
            &mut [true],
        );
        assert!(ready && closed.is_empty());
        assert_eq!(tallies[0].yes(), 3);
        assert_eq!(round.sleeps(), 0);
    }

    #[test]
    fn a_won_round_gives_stragglers_a_grace_only_when_asked_and_never_past_its_deadline() {
        for grace in [false, true] {
            let round = Round::new(3);
            let mut fanout = round.fanout();
            let mut tallies = [Tally::new(3, 2, WaitFor::Decision)];
            let deadline = [round.t0 + ms(1_000)];
            let mut open = [true];
            round.at(ms(10));
            round.answer(0, Ok(true));
            round.answer(1, Ok(true));
            let (ready, _) = step(
                &round,
                &mut fanout,
                grace,
                &mut tallies,
                &deadline,
                &mut open,
            );
            assert_eq!(ready, !grace, "won: over at once without a grace");
            if !grace {
                continue;
            }
            assert_eq!(open, [true], "won, still open");
            // The grace: twice as long as the quorum took (20 ms), at least the floor (50 ms of a 1 s round).
            round.at(ms(59));
            assert!(
                !step(
                    &round,
                    &mut fanout,
                    true,
                    &mut tallies,
                    &deadline,
                    &mut open
                )
                .0
            );
            round.at(ms(60));
            assert!(
                step(
                    &round,
                    &mut fanout,
                    true,
                    &mut tallies,
                    &deadline,
                    &mut open
                )
                .0
            );
            assert_eq!(round.sleeps(), 1, "one grace timer, no deadline timer");
            assert_eq!(tallies[0].pending(), 1, "the straggler was let go");
        }
        // A short round: the floor is a quarter of it (25 ms of 100 ms), not the 50 ms of longer rounds.
        let round = Round::new(3);
        let mut fanout = round.fanout();
        let mut tallies = [Tally::new(3, 2, WaitFor::Decision)];
        let deadline = [round.t0 + ms(100)];
        let mut open = [true];
        round.at(ms(5));
        round.answer(0, Ok(true));
        round.answer(1, Ok(true));
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        round.at(ms(29));
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        round.at(ms(30));
        assert!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        // A quorum late in the round: the grace ends at the deadline.
        let round = Round::new(3);
        let mut fanout = round.fanout();
        let mut tallies = [Tally::new(3, 2, WaitFor::Decision)];
        let deadline = [round.t0 + ms(100)];
        let mut open = [true];
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        round.at(ms(90));
        round.answer(0, Ok(true));
        round.answer(2, Ok(true));
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        round.at(ms(100));
        assert!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadline,
                &mut open
            )
            .0
        );
        assert_eq!(tallies[0].yes(), 2);
    }

    #[test]
    fn each_party_times_out_at_its_own_deadline_and_a_failed_one_is_closed_at_once() {
        let round = Round::new(3);
        let mut fanout = round.fanout();
        let mut tallies: Vec<Tally> = (0..3)
            .map(|_| Tally::new(3, 2, WaitFor::Decision))
            .collect();
        let deadlines = [round.t0 + ms(100), round.t0 + ms(300), round.t0 + ms(200)];
        let mut open = [true; 3];
        // Nothing answered: one timer, for the earliest deadline, kept across polls.
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![])
        );
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            )
            .0
        );
        assert_eq!(round.sleeps(), 1, "the same deadline reuses its timer");
        // Party 0's deadline: it times out (its pending nodes fail) and is closed alone.
        round.at(ms(100));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![0])
        );
        assert_eq!(open, [false, true, true]);
        assert_eq!(tallies[0].errors().len(), 3);
        assert!(!tallies[1].is_done() && !tallies[2].is_done());
        assert_eq!(
            round.sleeps(),
            2,
            "then a timer for the next deadline (party 2's)"
        );
        // Node 0 refuses, node 1 says yes: every open party still needs node 2.
        round.answer(0, Ok(false));
        round.answer(1, Ok(true));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![])
        );
        assert_eq!(round.sleeps(), 2);
        round.at(ms(200));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![2])
        );
        assert_eq!(round.sleeps(), 3);
        // Node 2 says yes: party 1 won, nothing else open; over (every node answered).
        round.answer(2, Ok(true));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (true, vec![])
        );
        assert_eq!(
            open,
            [false, true, false],
            "the winner is left to the caller"
        );
        assert_eq!(tallies[1].yes(), 2);
    }

    #[test]
    fn a_closed_partys_deadline_no_longer_holds_the_round_and_its_timer_is_replaced() {
        let round = Round::new(3);
        let mut fanout = round.fanout();
        // Party 0 needs 3 yes of 3 (one refusal decides it), party 1 a majority.
        let mut tallies = vec![
            Tally::new(3, 3, WaitFor::Decision),
            Tally::new(3, 2, WaitFor::Decision),
        ];
        let deadlines = [round.t0 + ms(100), round.t0 + ms(500)];
        let mut open = [true; 2];
        assert!(
            !step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            )
            .0
        );
        assert_eq!(round.sleeps(), 1);
        // A refusal closes party 0 before its deadline: the round now waits for party 1's.
        round.answer(0, Ok(false));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![0])
        );
        assert_eq!(round.sleeps(), 2, "a new timer for party 1's deadline");
        round.at(ms(100));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (false, vec![]),
            "party 0's deadline passed: nothing to do"
        );
        assert!(!tallies[1].is_done());
        round.at(ms(500));
        assert_eq!(
            step(
                &round,
                &mut fanout,
                true,
                &mut tallies,
                &deadlines,
                &mut open
            ),
            (true, vec![1])
        );
        assert!(!open.contains(&true));
    }
}
