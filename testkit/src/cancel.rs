//! Cancellation at every await point: drop a future after its k-th poll, for every k until it completes.
//!
//! Dropping a future at uniform random *times* almost never lands inside a round of node calls (a round takes
//! microseconds of virtual time between long sleeps). Dropping it after its k-th *poll*, for each k, visits
//! every await point it passes, on a fresh setup each time so earlier cuts do not disturb later ones.

use std::future::Future;

use crate::Sim;

/// Access to the simulation inside a test's setup, for [`each_poll`].
pub trait SimHost {
    /// The simulation that runs the future.
    fn sim(&mut self) -> &mut Sim;
}

impl SimHost for Sim {
    fn sim(&mut self) -> &mut Sim {
        self
    }
}

/// Where [`each_poll`] stopped the future of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cut {
    /// How many times the future was polled (0: dropped before its first poll).
    pub polls: usize,
    /// Whether it completed on its last poll instead of being dropped.
    pub completed: bool,
}

/// The most polls [`each_poll`] allows before it declares the future endless.
pub const MAX_POLLS: usize = 10_000;

/// For `k = 0, 1, 2, …`: builds a fresh environment with `setup`, starts the future with `start`, runs it on
/// the environment's [`Sim`] and drops it right after its k-th poll ([`Sim::block_on_for_polls`]), then calls
/// `check` (which typically runs the simulation on for a while and asserts invariants). Stops after the run in
/// which the future completed (`check` sees that run too, with [`Cut::completed`]); returns the number of
/// polls it needed.
///
/// `setup` must be deterministic (same seed every time) so that run k follows run k − 1 up to its cut.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use redlease::Timer;
/// use redlease_testkit::Sim;
/// use redlease_testkit::cancel::each_poll;
///
/// // A "transaction" that must never be left half done: it marks itself started, sleeps, then done.
/// struct Env { sim: Sim, log: Arc<Mutex<Vec<&'static str>>> }
/// impl redlease_testkit::cancel::SimHost for Env { fn sim(&mut self) -> &mut Sim { &mut self.sim } }
///
/// let polls = each_poll(
///     || Env { sim: Sim::new(1), log: Arc::default() },
///     |env| {
///         let (clock, log) = (env.sim.clock(), env.log.clone());
///         async move {
///             log.lock().unwrap().push("start");
///             clock.sleep_until(clock.now() + Duration::from_secs(1)).await;
///             log.lock().unwrap().push("done");
///         }
///     },
///     |env, cut| {
///         let log = env.log.lock().unwrap().clone();
///         match cut.polls {
///             0 => assert!(log.is_empty()),
///             1 => assert_eq!(log, ["start"], "dropped at the sleep"),
///             _ => assert!(cut.completed && log == ["start", "done"]),
///         }
///     },
/// );
/// assert_eq!(polls, 2);
/// ```
///
/// # Panics
/// When the future has not completed after [`MAX_POLLS`] polls, and whatever `check` or the simulation
/// panics with.
#[allow(clippy::panic)]
pub fn each_poll<E, F>(
    mut setup: impl FnMut() -> E,
    mut start: impl FnMut(&mut E) -> F,
    mut check: impl FnMut(&mut E, Cut),
) -> usize
where
    E: SimHost,
    F: Future,
{
    for k in 0..=MAX_POLLS {
        let mut env = setup();
        let fut = start(&mut env);
        let done = env.sim().block_on_for_polls(fut, k).is_some();
        check(
            &mut env,
            Cut {
                polls: k,
                completed: done,
            },
        );
        if done {
            return k;
        }
    }
    panic!("each_poll: the future did not complete within {MAX_POLLS} polls");
}
