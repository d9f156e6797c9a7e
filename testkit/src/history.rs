//! Recording what lease holders believed, and checking it for overlaps.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{EventKind as CoreEvent, LeaseEvent, Observer};

use crate::SkewedClock;

/// One thing a client observed about a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// The client acquired the lock; valid until the instant, with this fencing token.
    Acquired {
        /// Validity deadline reported by the lease.
        valid_until: Instant,
        /// Fencing token, if the lock is fenced.
        fence: Option<u64>,
    },
    /// The client resumed a lease another client handed off
    /// ([`Lock::resume`](redlease::Lock::resume)): from here on it holds it, valid until the instant, with
    /// the fencing token the lease was acquired with (equal to the handing client's, not larger).
    Resumed {
        /// Validity deadline reported by the resumed lease.
        valid_until: Instant,
        /// Fencing token, if the lock is fenced.
        fence: Option<u64>,
    },
    /// An extension or renewal succeeded, moving the validity deadline.
    Extended {
        /// The new validity deadline.
        valid_until: Instant,
    },
    /// The client learned that the lease was lost (loss signal, failed extension, failed `run`).
    Lost,
    /// The client started releasing the lease (it stopped believing it holds it).
    Released,
    /// The whole client was stopped (a GC pause, `SIGSTOP`; see [`Sim::pause`](crate::Sim::pause)) from
    /// the event's instant until `until`, whatever lock the event names. A stopped client cannot learn of a
    /// loss: a deadline that falls in a pause is checked against the pause's end instead.
    Paused {
        /// When the client ran again.
        until: Instant,
    },
    /// The lock's only server lost its data at this instant (a restart without persistence, see
    /// [`MemoryNode::restart`](crate::MemoryNode::restart)): the lock named by the event, or every lock
    /// when the name is empty; the client number is not used. A single-node lock cannot survive that, so a
    /// lease acquired before the wipe may overlap one acquired after it without a violation: its belief
    /// counts only up to the wipe for the overlap check. Its loss must still be signalled by its validity
    /// deadline ([`Violation::LateLoss`]), and holders that both started before (or both after) a wipe are
    /// checked as usual. Not for a Redlock cluster, which must survive the restart of its nodes (the
    /// restart quarantine).
    Wiped,
    /// One acquisition attempt (one round of node calls) ended at the event's instant; recorded only by a
    /// recorder [`with_attempts`](ClientRecorder::with_attempts), for [`History::check_fifo`].
    Attempted {
        /// When the attempt's round started (its requests were sent).
        sent: Instant,
        /// The first attempt of an acquisition.
        first: bool,
        /// Every node answered that the lock is held by another owner (for a fair lock: this waiter's place
        /// in the queue is on every node).
        held: bool,
        /// The attempt won the lock.
        won: bool,
    },
}

/// What the client's own clock read at an event, when the client runs on a clock other than the one the
/// history is kept on (for example a [`SkewedClock`](crate::SkewedClock)): lets [`History::check`] also
/// assert that every loss was signalled by the deadline the client computed on its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientView {
    /// The client's clock reading when the event happened.
    pub at: Instant,
    /// For [`EventKind::Acquired`] and [`EventKind::Extended`]: the validity deadline on the client's clock
    /// (what [`Lease::valid_until`](redlease::Lease::valid_until) reports there).
    pub valid_until: Option<Instant>,
    /// For [`EventKind::Lost`]: when (on the history's clock) the client's clock reached the lease's
    /// deadline, as far as the client's clock knew at the loss — earlier than the deadline recorded with the
    /// acquisition or extension if the client's clock jumped ahead meanwhile. A loss whose deadline the
    /// client's clock reached during a pause of the client is checked against the pause's end.
    pub deadline_at: Option<Instant>,
}

impl ClientView {
    /// The client's clock read `at`; `valid_until` is its deadline for acquisitions and extensions.
    pub fn new(at: Instant, valid_until: Option<Instant>) -> Self {
        Self {
            at,
            valid_until,
            deadline_at: None,
        }
    }

    /// Adds, for a loss, when (on the history's clock) the client's clock reached the deadline.
    #[must_use]
    pub fn with_deadline_at(mut self, deadline_at: Instant) -> Self {
        self.deadline_at = Some(deadline_at);
        self
    }
}

/// A recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Which client (any stable number the test chooses).
    pub client: u64,
    /// The lock key.
    pub lock: String,
    /// When it happened (on the history's clock, common to every client).
    pub at: Instant,
    /// What happened (deadlines on the history's clock).
    pub kind: EventKind,
    /// The same event seen on the client's own clock, if it has one.
    pub client_view: Option<ClientView>,
    /// For [`EventKind::Acquired`]: when the acquisition began (on the history's clock), the earliest its
    /// requests can have written the key. A lease whose acquisition began before a wipe
    /// ([`EventKind::Wiped`]) and was granted after it (its reply was on its way) rests on a write the wipe
    /// lost: the checker counts none of its belief.
    pub began: Option<Instant>,
}

impl Event {
    /// An event at `at` on the history's clock, with no client view.
    pub fn new(client: u64, lock: impl Into<String>, at: Instant, kind: EventKind) -> Self {
        Self {
            client,
            lock: lock.into(),
            at,
            kind,
            client_view: None,
            began: None,
        }
    }

    /// Adds when the acquisition began (see [`began`](Self::began)).
    #[must_use]
    pub fn with_began(mut self, began: Instant) -> Self {
        self.began = Some(began);
        self
    }

    /// Adds what the client's own clock read.
    #[must_use]
    pub fn with_client_view(mut self, view: ClientView) -> Self {
        self.client_view = Some(view);
        self
    }
}

/// An [`Observer`] that records the leases of one client's manager into a [`History`] under one client number
/// (so that [`EventKind::Paused`] records of that client apply to them), optionally from the client's own
/// [`SkewedClock`]: then every instant is converted to the clock's base (the history's clock) and the
/// event also carries the client's view, so [`History::check`] asserts losses by the client's clock too.
///
/// Make one with [`History::recorder`].
///
/// ```
/// use std::time::Duration;
/// use redlease::{Config, LockManager};
/// use redlease_testkit::{History, MemoryNode, Sim, SkewedClock};
///
/// let mut sim = Sim::new(1);
/// let client_clock = SkewedClock::new(sim.clock(), -0.002); // this client's clock runs 0.2 % slow
/// let history = History::new();
/// let manager = LockManager::single(MemoryNode::with_timer(sim.clock()), Config::default())
///     .unwrap()
///     .with_timer(client_clock.clone())
///     .with_observer(history.recorder(7).on_clock(client_clock));
/// let lock = manager.lock("job").expiry(Duration::from_secs(10));
/// let lease = sim.block_on(lock.try_acquire()).unwrap();
/// sim.block_on(lease.lost()); // it expires
/// let events = history.events();
/// assert_eq!(events.len(), 2);
/// assert!(events.iter().all(|e| e.client == 7 && e.client_view.is_some()));
/// assert_eq!(history.check(), Ok(()));
/// ```
#[derive(Clone)]
pub struct ClientRecorder {
    history: History,
    client: u64,
    clock: Option<SkewedClock>,
    /// Records every acquisition attempt too ([`EventKind::Attempted`]).
    attempts: bool,
}

impl fmt::Debug for ClientRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientRecorder")
            .field("client", &self.client)
            .field("clock", &self.clock)
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl ClientRecorder {
    /// The client's manager runs on `clock` (its [`with_timer`](redlease::LockManager::with_timer)), whose
    /// base is the history's clock.
    #[must_use]
    pub fn on_clock(mut self, clock: SkewedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Records every acquisition attempt as well ([`EventKind::Attempted`]), which
    /// [`History::check_fifo`] needs.
    #[must_use]
    pub fn with_attempts(mut self) -> Self {
        self.attempts = true;
        self
    }
}

impl Observer for ClientRecorder {
    fn event(&self, event: &LeaseEvent<'_>) {
        if let CoreEvent::Attempt {
            attempt,
            nodes,
            round,
            outcome,
            ..
        } = &event.kind
        {
            if !self.attempts {
                return;
            }
            let global = |t: Instant| self.clock.as_ref().map_or(t, |c| c.base_at(t));
            let won = matches!(outcome, redlease::AttemptOutcome::Won { .. });
            let kind = EventKind::Attempted {
                sent: global(event.at.checked_sub(*round).unwrap_or(event.at)),
                first: *attempt == 1,
                held: !won && !nodes.is_empty() && nodes.no() == nodes.len(),
                won,
            };
            self.history
                .push(Event::new(self.client, event.key, global(event.at), kind));
            return;
        }
        let began = match event.kind {
            CoreEvent::Acquired { waited, .. } => event.at.checked_sub(waited),
            _ => None,
        };
        let (kind, local_until) = match event.kind {
            CoreEvent::Acquired {
                valid_until, fence, ..
            } => (
                EventKind::Acquired { valid_until, fence },
                Some(valid_until),
            ),
            CoreEvent::Extended { valid_until, .. } | CoreEvent::Capped { valid_until } => {
                (EventKind::Extended { valid_until }, Some(valid_until))
            }
            CoreEvent::Resumed {
                valid_until, fence, ..
            } => (EventKind::Resumed { valid_until, fence }, Some(valid_until)),
            CoreEvent::Lost { .. } => (EventKind::Lost, None),
            CoreEvent::Released { .. } | CoreEvent::HandedOff { .. } => (EventKind::Released, None),
            _ => return,
        };
        let Some(clock) = &self.clock else {
            let mut e = Event::new(self.client, event.key, event.at, kind);
            if let Some(began) = began {
                e = e.with_began(began);
            }
            self.history.push(e);
            return;
        };
        let global = |t: Instant| clock.base_at(t);
        let kind = match kind {
            EventKind::Acquired { valid_until, fence } => EventKind::Acquired {
                valid_until: global(valid_until),
                fence,
            },
            EventKind::Resumed { valid_until, fence } => EventKind::Resumed {
                valid_until: global(valid_until),
                fence,
            },
            EventKind::Extended { valid_until } => EventKind::Extended {
                valid_until: global(valid_until),
            },
            other => other,
        };
        let mut local_at = event.at;
        let mut deadline_at = None;
        if let CoreEvent::Lost { valid_until, .. } = event.kind {
            deadline_at = Some(global(valid_until));
            // A fast clock advances by more than 1 ns of its own time per base nanosecond, so its readings
            // can step over the deadline: a loss seen at the first reading past it was seen as early as this
            // clock allows, which is at the deadline.
            if local_at > valid_until && local_at <= clock.local_at(clock.base_at(valid_until)) {
                local_at = valid_until;
            }
        }
        let mut view = ClientView::new(local_at, local_until);
        if let Some(at) = deadline_at {
            view = view.with_deadline_at(at);
        }
        let mut e =
            Event::new(self.client, event.key, global(event.at), kind).with_client_view(view);
        if let Some(began) = began {
            e = e.with_began(global(began));
        }
        self.history.push(e);
    }
}

/// A violation found by [`History::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two clients believed they held one lock at the same time.
    Overlap {
        /// The lock.
        lock: String,
        /// The earlier holder and its believed interval, relative to the history's [origin](History::origin).
        first: (u64, std::time::Duration, std::time::Duration),
        /// The later holder and its believed interval.
        second: (u64, std::time::Duration, std::time::Duration),
    },
    /// A fencing token did not exceed the previous holder's.
    FenceNotIncreasing {
        /// The lock.
        lock: String,
        /// The previous token.
        previous: u64,
        /// The offending token.
        next: u64,
    },
    /// A loss was reported after the lease's validity deadline.
    LateLoss {
        /// The lock.
        lock: String,
        /// The client.
        client: u64,
        /// How late, past the deadline.
        late_by: std::time::Duration,
    },
    /// A loss was signalled after the validity deadline the client computed on its own clock.
    LateLossOnClientClock {
        /// The lock.
        lock: String,
        /// The client.
        client: u64,
        /// How late, past the deadline, by the client's clock.
        late_by: std::time::Duration,
    },
    /// A fair lock served a later arrival before a waiter that stayed in the queue (see
    /// [`History::check_fifo`]).
    NotFifo {
        /// The lock.
        lock: String,
        /// The waiter that stayed, and when its place was confirmed on the server (relative to the origin).
        first: (u64, std::time::Duration),
        /// The acquisition served before it, and when it began (after the first's place was confirmed).
        second: (u64, std::time::Duration),
    },
    /// An event that does not fit the client's lease lifecycle (e.g. an extension while not holding).
    Malformed(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overlap {
                lock,
                first,
                second,
            } => write!(
                f,
                "lock {lock:?}: client {} believed it held [{:?}, {:?}) while client {} believed it held [{:?}, {:?})",
                first.0, first.1, first.2, second.0, second.1, second.2
            ),
            Self::FenceNotIncreasing {
                lock,
                previous,
                next,
            } => {
                write!(
                    f,
                    "lock {lock:?}: fencing token {next} issued after {previous}"
                )
            }
            Self::LateLoss {
                lock,
                client,
                late_by,
            } => {
                write!(
                    f,
                    "lock {lock:?}: client {client} learned of its loss {late_by:?} after the deadline"
                )
            }
            Self::LateLossOnClientClock {
                lock,
                client,
                late_by,
            } => {
                write!(
                    f,
                    "lock {lock:?}: client {client} learned of its loss {late_by:?} after the deadline by its own clock"
                )
            }
            Self::NotFifo {
                lock,
                first,
                second,
            } => write!(
                f,
                "lock {lock:?}: client {} (queued at {:?}, stayed) was served after client {} (began at {:?})",
                first.0, first.1, second.0, second.1
            ),
            Self::Malformed(what) => write!(f, "malformed history: {what}"),
        }
    }
}

impl std::error::Error for Violation {}

/// A thread-safe log of [`Event`]s, shared by clones.
///
/// On a simulation, take it from [`Sim::history`](crate::Sim::history): then the simulation's client pauses
/// ([`Sim::pause`](crate::Sim::pause)) are recorded in it by themselves, and its [origin](Self::origin) is the
/// simulation's start, so [`timeline`](Self::timeline) compares across replays of a seed.
#[derive(Clone, Default)]
pub struct History {
    events: Arc<Mutex<Vec<Event>>>,
    origin: Option<Instant>,
}

/// What happened, with every instant given as the time since the history's origin (see
/// [`History::timeline`]): equal for equal runs, unlike raw `Instant`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Timed {
    /// [`EventKind::Acquired`].
    Acquired {
        /// The validity deadline.
        valid_until: Duration,
        /// The fencing token, if the lock is fenced.
        fence: Option<u64>,
    },
    /// [`EventKind::Resumed`].
    Resumed {
        /// The validity deadline.
        valid_until: Duration,
        /// The fencing token, if the lock is fenced.
        fence: Option<u64>,
    },
    /// [`EventKind::Extended`].
    Extended {
        /// The new validity deadline.
        valid_until: Duration,
    },
    /// [`EventKind::Lost`].
    Lost,
    /// [`EventKind::Released`].
    Released,
    /// [`EventKind::Paused`].
    Paused {
        /// When the client ran again.
        until: Duration,
    },
    /// [`EventKind::Wiped`].
    Wiped,
    /// [`EventKind::Attempted`].
    Attempted {
        /// When the attempt's round started.
        sent: Duration,
        /// The first attempt of an acquisition.
        first: bool,
        /// Every node answered "held".
        held: bool,
        /// It won.
        won: bool,
    },
}

/// One entry of [`History::timeline`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TimedEvent {
    /// Which client.
    pub client: u64,
    /// The lock key (empty for a pause, which stops the whole client).
    pub lock: String,
    /// When, since the history's origin.
    pub at: Duration,
    /// What.
    pub kind: Timed,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "History({} events)", self.events().len())
    }
}

/// A believed-held interval.
#[derive(Debug, Clone, Copy)]
struct Interval {
    client: u64,
    /// When its acquisition began (`start` if unknown).
    began: Instant,
    start: Instant,
    end: Instant,
    fence: Option<u64>,
    /// The validity deadline on the client's own clock, when the events carry a client view.
    local_end: Option<Instant>,
    /// Continues a lease another client handed off: its fence equals that client's.
    resumed: bool,
}

impl History {
    /// An empty history. Its [origin](Self::origin) is its earliest event.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty history whose [timeline](Self::timeline) counts from `origin` (for a simulation, its start:
    /// [`Sim::history`](crate::Sim::history) does this).
    pub fn starting_at(origin: Instant) -> Self {
        Self {
            events: Arc::default(),
            origin: Some(origin),
        }
    }

    /// Where the [timeline](Self::timeline) counts from: the origin given to
    /// [`starting_at`](Self::starting_at), else the earliest event's instant (`None` while empty).
    pub fn origin(&self) -> Option<Instant> {
        self.origin
            .or_else(|| self.events().iter().map(|e| e.at).min())
    }

    /// The events in recording order with every instant as the time since the [origin](Self::origin), so
    /// that two runs of one seed compare equal (raw `Instant`s never do: each run's virtual clock starts at
    /// the real instant it was created).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlease::Config;
    /// use redlease_testkit::{MemoryNode, Sim, Timed};
    ///
    /// let run = |seed| {
    ///     let mut sim = Sim::new(seed);
    ///     let history = sim.history();
    ///     let node = MemoryNode::with_timer(sim.clock());
    ///     // Under a client number of the test's choosing (a bare `History` observer numbers managers
    ///     // by a process-wide counter, which differs between runs).
    ///     let manager = sim.single(node, Config::default()).unwrap().with_observer(history.recorder(1));
    ///     let lock = manager.lock("job").expiry(Duration::from_secs(2));
    ///     let lease = sim.block_on(lock.try_acquire()).unwrap();
    ///     sim.block_on(lease.lost()); // it expires, unrenewed
    ///     history.timeline()
    /// };
    /// let first = run(7);
    /// assert_eq!(first[0].at, Duration::ZERO);
    /// assert!(matches!(first[1].kind, Timed::Lost));
    /// assert_eq!(run(7), first); // a replay gives the same timeline
    /// ```
    pub fn timeline(&self) -> Vec<TimedEvent> {
        let events = self.events();
        let Some(origin) = self.origin.or_else(|| events.iter().map(|e| e.at).min()) else {
            return Vec::new();
        };
        let rel = |t: Instant| t.saturating_duration_since(origin);
        events
            .into_iter()
            .map(|e| TimedEvent {
                client: e.client,
                at: rel(e.at),
                kind: match e.kind {
                    EventKind::Acquired { valid_until, fence } => Timed::Acquired {
                        valid_until: rel(valid_until),
                        fence,
                    },
                    EventKind::Resumed { valid_until, fence } => Timed::Resumed {
                        valid_until: rel(valid_until),
                        fence,
                    },
                    EventKind::Extended { valid_until } => Timed::Extended {
                        valid_until: rel(valid_until),
                    },
                    EventKind::Lost => Timed::Lost,
                    EventKind::Released => Timed::Released,
                    EventKind::Paused { until } => Timed::Paused { until: rel(until) },
                    EventKind::Wiped => Timed::Wiped,
                    EventKind::Attempted {
                        sent,
                        first,
                        held,
                        won,
                    } => Timed::Attempted {
                        sent: rel(sent),
                        first,
                        held,
                        won,
                    },
                },
                lock: e.lock,
            })
            .collect()
    }

    /// Records an event.
    pub fn record(&self, client: u64, lock: &str, at: Instant, kind: EventKind) {
        self.push(Event::new(client, lock, at, kind));
    }

    /// Records an event together with what the client's own clock read.
    pub fn record_with_view(
        &self,
        client: u64,
        lock: &str,
        at: Instant,
        kind: EventKind,
        view: ClientView,
    ) {
        self.push(Event::new(client, lock, at, kind).with_client_view(view));
    }

    /// An [`Observer`] for client `client`'s manager that records into this history; see [`ClientRecorder`].
    pub fn recorder(&self, client: u64) -> ClientRecorder {
        ClientRecorder {
            history: self.clone(),
            client,
            clock: None,
            attempts: false,
        }
    }

    /// Records a built [`Event`].
    pub fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// All events in recording order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Number of acquisitions recorded.
    pub fn acquisitions(&self) -> usize {
        self.events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Acquired { .. }))
            .count()
    }

    /// Checks that no two believed-held intervals of one lock overlap, that fencing tokens strictly increase
    /// in acquisition order, and that every loss was learned no later than its validity deadline — on the
    /// history's clock, and also on the client's own clock for events that carry a [`ClientView`].
    ///
    /// A client believes it holds a lease from `Acquired` until the earliest of `Lost`, `Released` and its
    /// current validity deadline.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlease_testkit::{EventKind, History, Violation};
    ///
    /// let t0 = Instant::now();
    /// let s = Duration::from_secs;
    /// let history = History::new();
    /// // Client 1 holds "job" with fence 7 until t0 + 10 s; client 2 acquires at t0 + 5 s with fence 8.
    /// history.record(1, "job", t0, EventKind::Acquired { valid_until: t0 + s(10), fence: Some(7) });
    /// history.record(2, "job", t0 + s(5), EventKind::Acquired { valid_until: t0 + s(15), fence: Some(8) });
    /// assert!(matches!(history.check(), Err(Violation::Overlap { .. })));
    ///
    /// // Had client 1 learned of its loss first, the history would be fine.
    /// let history = History::new();
    /// history.record(1, "job", t0, EventKind::Acquired { valid_until: t0 + s(10), fence: Some(7) });
    /// history.record(1, "job", t0 + s(4), EventKind::Lost);
    /// history.record(2, "job", t0 + s(5), EventKind::Acquired { valid_until: t0 + s(15), fence: Some(8) });
    /// assert_eq!(history.check(), Ok(()));
    ///
    /// // A fence that does not increase is a violation even without overlap.
    /// history.record(2, "job", t0 + s(6), EventKind::Released);
    /// history.record(3, "job", t0 + s(7), EventKind::Acquired { valid_until: t0 + s(17), fence: Some(8) });
    /// assert!(matches!(history.check(), Err(Violation::FenceNotIncreasing { previous: 8, next: 8, .. })));
    /// ```
    ///
    /// # Errors
    /// The first [`Violation`] found.
    pub fn check(&self) -> Result<(), Violation> {
        self.check_holders(1)
    }

    /// [`check`](Self::check) for locks that admit up to `holders` believed holders at once (a
    /// [semaphore](redlease::Semaphore)'s permits): one more at any instant is an
    /// [`Overlap`](Violation::Overlap) naming the newest and the active holder that believed longest. Fencing
    /// tokens are compared only when `holders` is 1. Late losses are checked as for a lock.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlease_testkit::{EventKind, History, Violation};
    ///
    /// let (t0, s) = (Instant::now(), Duration::from_secs);
    /// let history = History::new();
    /// for client in 1..=3 {
    ///     let at = t0 + s(client);
    ///     history.record(client, "api", at, EventKind::Acquired { valid_until: at + s(10), fence: None });
    /// }
    /// assert_eq!(history.check_holders(3), Ok(()));
    /// assert!(matches!(history.check_holders(2), Err(Violation::Overlap { .. })));
    /// ```
    ///
    /// # Errors
    /// The first [`Violation`] found.
    pub fn check_holders(&self, holders: usize) -> Result<(), Violation> {
        self.check_sharing(holders.max(1), None)
    }

    /// [`check`](Self::check) for [read/write locks](redlease::RwLock): the clients for which `is_writer`
    /// holds are writers, the others readers. Readers may overlap one another; a writer overlaps nobody.
    /// The writers' fencing tokens (a [fenced writer](redlease::RwLock::fenced)) strictly increase in the
    /// order the writers were granted the lock, as a lock's do.
    ///
    /// # Errors
    /// The first [`Violation`] found.
    pub fn check_readers_writers(&self, is_writer: impl Fn(u64) -> bool) -> Result<(), Violation> {
        self.check_sharing(usize::MAX, Some(&is_writer))
    }

    /// Checks arrival order for [fair locks](redlease::Lock::fair), from the attempts recorded by recorders
    /// [`with_attempts`](ClientRecorder::with_attempts); returns how many pairs of acquisitions it compared.
    ///
    /// What FIFO means under faults: a waiter's place is on the server from the first attempt that every
    /// node answered "held" (its reply says the place was written), and it **stayed** if, until it won, every
    /// attempt of its acquisition was answered "held" by every node (no error, timeout or lost reply, after
    /// which the token is cleaned up and may leave the queue, and no wipe of the lock's data) and no two
    /// consecutive ones — the last and the winning one included — were further apart than `place_life`
    /// (from the first one's start to the second one's end: its place could not have expired between them;
    /// pass the place's life on the nodes' clocks less their drift). A waiter that stayed is never served
    /// after an acquisition that **began after its place was confirmed**: a violation is such a later
    /// acquisition whose winning round ended before the stayed waiter's winning round started. Waiters that
    /// did not stay, and acquisitions that overlap in time with the confirmation, promise nothing.
    ///
    /// # Errors
    /// The first [`Violation::NotFifo`] found.
    pub fn check_fifo(&self, place_life: Duration) -> Result<usize, Violation> {
        /// One acquisition, from its attempts.
        struct Acq {
            client: u64,
            began: Instant,
            /// The end of its first attempt answered "held" everywhere.
            queued: Option<Instant>,
            /// The start of its last attempt answered "held".
            last_held: Option<Instant>,
            /// Its winning round (start, end).
            won: Option<(Instant, Instant)>,
            /// It cannot have stayed in the queue.
            left: bool,
        }
        let events = self.events();
        let Some(origin) = self.origin.or_else(|| events.iter().map(|e| e.at).min()) else {
            return Ok(0);
        };
        let wipes: Vec<(&str, Instant)> = events
            .iter()
            .filter(|e| e.kind == EventKind::Wiped)
            .map(|e| (e.lock.as_str(), e.at))
            .collect();
        let mut by_lock: BTreeMap<&str, Vec<Acq>> = BTreeMap::new();
        for e in &events {
            let EventKind::Attempted {
                sent,
                first,
                held,
                won,
            } = e.kind
            else {
                continue;
            };
            let acqs = by_lock.entry(&e.lock).or_default();
            let current = acqs.iter().rposition(|a| a.client == e.client);
            let open = current.filter(|&i| !first && acqs[i].won.is_none());
            let i = match open {
                Some(i) => i,
                None => {
                    acqs.push(Acq {
                        client: e.client,
                        began: sent,
                        queued: None,
                        last_held: None,
                        won: None,
                        left: false,
                    });
                    acqs.len() - 1
                }
            };
            let a = &mut acqs[i];
            let lapsed = a
                .last_held
                .is_some_and(|prev| e.at.saturating_duration_since(prev) >= place_life);
            if won {
                a.won = Some((sent, e.at));
                a.left |= lapsed;
            } else if held {
                a.queued.get_or_insert(e.at);
                a.left |= lapsed;
                a.last_held = Some(sent);
            } else {
                a.left = true;
            }
        }
        let rel = |t: Instant| t.saturating_duration_since(origin);
        let mut compared = 0;
        for (lock, acqs) in &by_lock {
            for a in acqs {
                let (Some(queued), Some((a_sent, a_end)), false) = (a.queued, a.won, a.left) else {
                    continue;
                };
                let wiped = wipes
                    .iter()
                    .any(|(l, at)| (l.is_empty() || l == lock) && a.began <= *at && *at <= a_end);
                if wiped {
                    continue;
                }
                for b in acqs {
                    let Some((_, b_end)) = b.won else { continue };
                    if b.client == a.client || b.began <= queued {
                        continue;
                    }
                    compared += 1;
                    if b_end < a_sent {
                        return Err(Violation::NotFifo {
                            lock: (*lock).to_owned(),
                            first: (a.client, rel(queued)),
                            second: (b.client, rel(b.began)),
                        });
                    }
                }
            }
        }
        Ok(compared)
    }

    fn check_sharing(
        &self,
        holders: usize,
        is_writer: Option<&dyn Fn(u64) -> bool>,
    ) -> Result<(), Violation> {
        let events = self.events();
        let Some(origin) = self.origin.or_else(|| events.iter().map(|e| e.at).min()) else {
            return Ok(());
        };
        let mut by_lock: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
        let mut pauses: BTreeMap<u64, Vec<(Instant, Instant)>> = BTreeMap::new();
        // When the server of a lock ("": of every lock) lost its data.
        let mut wipes: Vec<(&str, Instant)> = Vec::new();
        for e in &events {
            match e.kind {
                EventKind::Paused { until } => {
                    pauses.entry(e.client).or_default().push((e.at, until));
                }
                EventKind::Wiped => wipes.push((&e.lock, e.at)),
                _ => by_lock.entry(&e.lock).or_default().push(e),
            }
        }
        // When a loss due at `deadline` can be signalled: then, or at the end of a pause covering it.
        let due = |client: u64, deadline: Instant| -> (Instant, bool) {
            let mut due = deadline;
            let mut paused = false;
            while let Some(end) = pauses.get(&client).and_then(|ws| {
                ws.iter()
                    .filter(|(from, until)| *from <= due && due < *until)
                    .map(|(_, until)| *until)
                    .max()
            }) {
                due = end;
                paused = true;
            }
            (due, paused)
        };
        for (lock, events) in by_lock {
            let mut open: BTreeMap<u64, Interval> = BTreeMap::new();
            let mut closed: Vec<Interval> = Vec::new();
            for e in events {
                match &e.kind {
                    EventKind::Acquired { valid_until, fence }
                    | EventKind::Resumed { valid_until, fence } => {
                        if open.contains_key(&e.client) {
                            return Err(Violation::Malformed(format!(
                                "client {} acquired {lock:?} twice without losing or releasing it",
                                e.client
                            )));
                        }
                        open.insert(
                            e.client,
                            Interval {
                                client: e.client,
                                began: e.began.unwrap_or(e.at).min(e.at),
                                start: e.at,
                                end: *valid_until,
                                fence: *fence,
                                local_end: e.client_view.and_then(|v| v.valid_until),
                                resumed: matches!(e.kind, EventKind::Resumed { .. }),
                            },
                        );
                    }
                    EventKind::Extended { valid_until } => match open.get_mut(&e.client) {
                        // An extension observed after the deadline does not revive belief.
                        Some(iv) if e.at < iv.end => {
                            iv.end = *valid_until;
                            if let Some(end) = e.client_view.and_then(|v| v.valid_until) {
                                iv.local_end = Some(end);
                            }
                        }
                        Some(_) => {}
                        None => {
                            return Err(Violation::Malformed(format!(
                                "client {} extended {lock:?} without holding it",
                                e.client
                            )));
                        }
                    },
                    EventKind::Lost | EventKind::Released => {
                        let Some(mut iv) = open.remove(&e.client) else {
                            return Err(Violation::Malformed(format!(
                                "client {} ended a lease on {lock:?} it did not hold",
                                e.client
                            )));
                        };
                        let paused_at_local_deadline = e
                            .client_view
                            .and_then(|v| v.deadline_at)
                            .is_some_and(|at| due(e.client, at).1);
                        let (due, paused) = due(e.client, iv.end);
                        if e.kind == EventKind::Lost && e.at > due {
                            return Err(Violation::LateLoss {
                                lock: lock.to_owned(),
                                client: e.client,
                                late_by: e.at - due,
                            });
                        }
                        // A pause is measured on the history's clock only: one in which the client's clock
                        // reached the deadline (which a jump of that clock may have brought forward) excuses
                        // the client's clock from the check.
                        let paused = paused || paused_at_local_deadline;
                        if let (EventKind::Lost, Some(view), Some(end), false) =
                            (&e.kind, e.client_view, iv.local_end, paused)
                        {
                            if view.at > end {
                                return Err(Violation::LateLossOnClientClock {
                                    lock: lock.to_owned(),
                                    client: e.client,
                                    late_by: view.at - end,
                                });
                            }
                        }
                        iv.end = iv.end.min(e.at);
                        closed.push(iv);
                    }
                    EventKind::Paused { .. } | EventKind::Wiped | EventKind::Attempted { .. } => {}
                }
            }
            closed.extend(open.into_values());
            // A belief held across a wipe of the server rests on nothing after it: it counts up to the wipe
            // (nothing, if the acquisition began before the wipe and was granted after it). Such a lease's
            // fence may have been issued before fences of leases granted earlier: not compared.
            closed.retain_mut(|iv| {
                let wipe = wipes
                    .iter()
                    .filter(|(l, at)| {
                        (l.is_empty() || *l == lock) && iv.began < *at && *at < iv.end
                    })
                    .map(|(_, at)| *at)
                    .min();
                match wipe {
                    Some(w) if w <= iv.start => false,
                    Some(w) => {
                        iv.end = w;
                        true
                    }
                    None => true,
                }
            });
            closed.sort_by_key(|iv| (iv.start, iv.client));
            let rel = |t: Instant| t.saturating_duration_since(origin);
            // Fences: of a lock's holders in start order, or of a read/write lock's writers (readers carry
            // none).
            let fenced: Vec<Interval> = match is_writer {
                Some(w) => closed.iter().filter(|iv| w(iv.client)).copied().collect(),
                None if holders == 1 => closed.clone(),
                None => Vec::new(),
            };
            for pair in fenced.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if let (Some(previous), Some(next)) = (a.fence, b.fence) {
                    // A resumed lease keeps the fence of the lease handed to it.
                    if next < previous || (next == previous && !b.resumed) {
                        return Err(Violation::FenceNotIncreasing {
                            lock: lock.to_owned(),
                            previous,
                            next,
                        });
                    }
                }
            }
            // Believed holders at each start, in start order: at most `holders` at once.
            let mut active: Vec<Interval> = Vec::new();
            for iv in closed {
                if iv.end <= iv.start {
                    continue;
                }
                active.retain(|a| a.end > iv.start);
                let conflict = match is_writer {
                    // A writer conflicts with anyone; a reader with a writer.
                    Some(w) if w(iv.client) => !active.is_empty(),
                    Some(w) => active.iter().any(|a| w(a.client)),
                    None => active.len() >= holders,
                };
                if conflict {
                    let blocking =
                        |a: &&Interval| is_writer.is_none_or(|w| w(iv.client) || w(a.client));
                    if let Some(prev) = active.iter().filter(blocking).max_by_key(|a| a.end) {
                        return Err(Violation::Overlap {
                            lock: lock.to_owned(),
                            first: (prev.client, rel(prev.start), rel(prev.end)),
                            second: (iv.client, rel(iv.start), rel(iv.end)),
                        });
                    }
                }
                active.push(iv);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Client `client`'s attempt on "q" from `sent` to `end` (ms after `t0`): `outcome` 'h' held everywhere,
    /// 'w' won, 'f' failed.
    fn attempt(
        h: &History,
        t0: Instant,
        client: u64,
        (sent, end): (u64, u64),
        first: bool,
        outcome: char,
    ) {
        h.record(
            client,
            "q",
            t0 + ms(end),
            EventKind::Attempted {
                sent: t0 + ms(sent),
                first,
                held: outcome == 'h',
                won: outcome == 'w',
            },
        );
    }

    #[test]
    fn fifo_flags_a_later_arrival_served_before_a_waiter_that_stayed() {
        let t0 = Instant::now();
        let life = ms(1_000);
        // Client 1 queues at 10 ms and refreshes every 400 ms; client 2 begins at 100 ms and wins at 500 ms,
        // before client 1's winning round (900 ms).
        let jumped = History::new();
        attempt(&jumped, t0, 1, (0, 10), true, 'h');
        attempt(&jumped, t0, 1, (400, 410), false, 'h');
        attempt(&jumped, t0, 2, (100, 110), true, 'h');
        attempt(&jumped, t0, 2, (500, 510), false, 'w');
        attempt(&jumped, t0, 1, (900, 910), false, 'w');
        assert!(matches!(
            jumped.check_fifo(life),
            Err(Violation::NotFifo {
                first: (1, _),
                second: (2, _),
                ..
            })
        ));
        // The same order is no violation when client 1's place may have lapsed (a gap beyond its life) or
        // an attempt failed (its token may have been cleaned up), or client 2 began before the place was
        // confirmed.
        for (gap, failed, b_began) in [(1_200, false, 100), (400, true, 100), (400, false, 5)] {
            let h = History::new();
            attempt(&h, t0, 1, (0, 10), true, 'h');
            attempt(
                &h,
                t0,
                1,
                (gap, gap + 10),
                false,
                if failed { 'f' } else { 'h' },
            );
            attempt(&h, t0, 2, (b_began, b_began + 10), true, 'h');
            attempt(&h, t0, 2, (gap + 100, gap + 110), false, 'w');
            attempt(&h, t0, 1, (gap + 500, gap + 510), false, 'w');
            assert_eq!(
                h.check_fifo(life).map(|_| ()),
                Ok(()),
                "gap {gap} failed {failed}"
            );
        }
        // Served in arrival order: one pair compared, no violation.
        let fair = History::new();
        attempt(&fair, t0, 1, (0, 10), true, 'h');
        attempt(&fair, t0, 2, (100, 110), true, 'h');
        attempt(&fair, t0, 1, (400, 410), false, 'w');
        attempt(&fair, t0, 2, (500, 510), false, 'w');
        assert_eq!(fair.check_fifo(life), Ok(1));
    }

    #[test]
    fn disjoint_holders_pass() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: Some(1),
            },
        );
        h.record(1, "k", t0 + ms(50), EventKind::Released);
        h.record(
            2,
            "k",
            t0 + ms(60),
            EventKind::Acquired {
                valid_until: t0 + ms(160),
                fence: Some(2),
            },
        );
        h.record(2, "k", t0 + ms(160), EventKind::Lost);
        assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn overlap_is_found() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
        );
        h.record(
            2,
            "k",
            t0 + ms(60),
            EventKind::Acquired {
                valid_until: t0 + ms(160),
                fence: None,
            },
        );
        assert!(matches!(h.check(), Err(Violation::Overlap { .. })));
    }

    #[test]
    fn extension_prolongs_belief() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
        );
        h.record(
            1,
            "k",
            t0 + ms(50),
            EventKind::Extended {
                valid_until: t0 + ms(200),
            },
        );
        h.record(
            2,
            "k",
            t0 + ms(150),
            EventKind::Acquired {
                valid_until: t0 + ms(300),
                fence: None,
            },
        );
        assert!(matches!(h.check(), Err(Violation::Overlap { .. })));
    }

    #[test]
    fn expiry_ends_belief_without_an_event() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: Some(5),
            },
        );
        h.record(
            2,
            "k",
            t0 + ms(100),
            EventKind::Acquired {
                valid_until: t0 + ms(200),
                fence: Some(6),
            },
        );
        assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn decreasing_fence_is_found() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(10),
                fence: Some(5),
            },
        );
        h.record(
            2,
            "k",
            t0 + ms(20),
            EventKind::Acquired {
                valid_until: t0 + ms(30),
                fence: Some(5),
            },
        );
        assert!(matches!(
            h.check(),
            Err(Violation::FenceNotIncreasing { .. })
        ));
    }

    #[test]
    fn late_loss_is_found() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(10),
                fence: None,
            },
        );
        h.record(1, "k", t0 + ms(11), EventKind::Lost);
        assert!(matches!(h.check(), Err(Violation::LateLoss { .. })));
    }

    #[test]
    fn late_loss_by_the_clients_own_clock_is_found() {
        // The client's clock runs slow: on the history's clock the loss is on time, on its own it is late.
        let t0 = Instant::now();
        let local0 = t0 + ms(1_000);
        let h = History::new();
        h.record_with_view(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
            ClientView::new(local0, Some(local0 + ms(100))),
        );
        h.record_with_view(
            1,
            "k",
            t0 + ms(50),
            EventKind::Extended {
                valid_until: t0 + ms(200),
            },
            ClientView::new(local0 + ms(50), Some(local0 + ms(150))),
        );
        h.record_with_view(
            1,
            "k",
            t0 + ms(190),
            EventKind::Lost,
            ClientView::new(local0 + ms(160), None),
        );
        assert_eq!(
            h.check(),
            Err(Violation::LateLossOnClientClock {
                lock: "k".into(),
                client: 1,
                late_by: ms(10),
            })
        );
        // The same history signalled at 150 ms by the client's clock passes.
        let ok = History::new();
        for e in h.events() {
            let e = match (&e.kind, e.client_view) {
                (EventKind::Lost, Some(v)) => {
                    Event::new(e.client, e.lock.clone(), e.at, EventKind::Lost)
                        .with_client_view(ClientView::new(v.at - ms(10), None))
                }
                _ => e,
            };
            ok.push(e);
        }
        assert_eq!(ok.check(), Ok(()));
    }

    #[test]
    fn a_loss_due_during_a_pause_may_be_signalled_when_the_pause_ends() {
        let t0 = Instant::now();
        let history = |lost_at: Duration| {
            let h = History::new();
            h.record(
                1,
                "k",
                t0,
                EventKind::Acquired {
                    valid_until: t0 + ms(100),
                    fence: None,
                },
            );
            h.record(
                1,
                "",
                t0 + ms(50),
                EventKind::Paused {
                    until: t0 + ms(120),
                },
            );
            h.record(
                1,
                "",
                t0 + ms(110),
                EventKind::Paused {
                    until: t0 + ms(150),
                },
            );
            h.record(1, "k", t0 + lost_at, EventKind::Lost);
            h
        };
        assert_eq!(history(ms(150)).check(), Ok(()));
        assert_eq!(
            history(ms(151)).check(),
            Err(Violation::LateLoss {
                lock: "k".into(),
                client: 1,
                late_by: ms(1),
            })
        );
        // Another client's pause excuses nothing.
        let h = History::new();
        h.record(
            1,
            "k",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
        );
        h.record(
            2,
            "",
            t0,
            EventKind::Paused {
                until: t0 + ms(500),
            },
        );
        h.record(1, "k", t0 + ms(101), EventKind::Lost);
        assert!(matches!(h.check(), Err(Violation::LateLoss { .. })));
    }

    #[test]
    fn a_wiped_server_excuses_only_holders_on_either_side_of_the_wipe() {
        let t0 = Instant::now();
        let history = |wipe: Option<(&str, u64)>, second_at: u64, lost_at: u64| {
            let h = History::new();
            h.record(
                1,
                "k",
                t0,
                EventKind::Acquired {
                    valid_until: t0 + ms(100),
                    fence: None,
                },
            );
            if let Some((lock, at)) = wipe {
                h.record(0, lock, t0 + ms(at), EventKind::Wiped);
            }
            h.record(
                2,
                "k",
                t0 + ms(second_at),
                EventKind::Acquired {
                    valid_until: t0 + ms(second_at + 100),
                    fence: None,
                },
            );
            h.record(1, "k", t0 + ms(lost_at), EventKind::Lost);
            h
        };
        // Client 2 acquired after the wipe: client 1's belief counts up to the wipe only.
        assert_eq!(history(Some(("k", 30)), 40, 90).check(), Ok(()));
        assert_eq!(history(Some(("", 30)), 40, 90).check(), Ok(()));
        // No wipe, a wipe of another lock, or a second holder from before the wipe: two holders.
        for (wipe, second_at) in [(None, 40), (Some(("other", 30)), 40), (Some(("k", 50)), 40)] {
            assert!(
                matches!(
                    history(wipe, second_at, 90).check(),
                    Err(Violation::Overlap { .. })
                ),
                "{wipe:?}"
            );
        }
        // The wipe excuses no late loss.
        assert!(matches!(
            history(Some(("k", 30)), 40, 101).check(),
            Err(Violation::LateLoss { .. })
        ));
        // A lease granted after the wipe to an acquisition that began before it (fence 1, issued before the
        // wipe) counts for nothing, nor does its fence; one that began after the wipe counts in full.
        for (began, ok) in [(25, true), (35, false)] {
            let h = History::new();
            h.record(0, "", t0 + ms(30), EventKind::Wiped);
            h.record(
                2,
                "k",
                t0 + ms(40),
                EventKind::Acquired {
                    valid_until: t0 + ms(140),
                    fence: Some(2),
                },
            );
            h.push(
                Event::new(
                    1,
                    "k",
                    t0 + ms(50),
                    EventKind::Acquired {
                        valid_until: t0 + ms(120),
                        fence: Some(1),
                    },
                )
                .with_began(t0 + ms(began)),
            );
            assert_eq!(h.check().is_ok(), ok, "began at {began} ms");
        }
    }

    #[test]
    fn locks_are_checked_separately() {
        let t0 = Instant::now();
        let h = History::new();
        h.record(
            1,
            "a",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
        );
        h.record(
            2,
            "b",
            t0,
            EventKind::Acquired {
                valid_until: t0 + ms(100),
                fence: None,
            },
        );
        assert_eq!(h.check(), Ok(()));
    }
}
