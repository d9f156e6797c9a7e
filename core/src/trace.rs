//! Spans and log events through `tracing` (feature `tracing`); without the feature, the same calls compile to
//! nothing.
//!
//! Spans wrap the futures of the operations (they must, to be entered on every poll); log events are written
//! by the event hook ([`Hook::emit`](crate::observe::Hook)) from the same [`LeaseEvent`]s an
//! [`Observer`](crate::Observer) sees, so the two never disagree. Neither ever contains a token (no event
//! carries one) or a node's address.

use std::future::Future;

use crate::mode::Mode;
use crate::observe::LeaseId;
#[cfg(feature = "tracing")]
use crate::observe::{LeaseEvent, loss_str, not_acquired_str};

/// Which span to open.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum SpanOf<'a> {
    /// `redlease.acquire` (info): one acquisition, all its attempts.
    Acquire(&'a str, Mode),
    /// `redlease.extend` (info): one [`Lease::extend`](crate::Lease::extend).
    Extend(&'a str, Mode, LeaseId),
    /// `redlease.release` (info): one [`Lease::release`](crate::Lease::release).
    Release(&'a str, Mode, LeaseId),
    /// `redlease.renewal` (debug): one automatic renewal round.
    Renewal(&'a str, Mode, LeaseId),
}

#[cfg(feature = "tracing")]
pub(crate) type Span = tracing::Span;

/// Without the `tracing` feature: nothing.
#[cfg(not(feature = "tracing"))]
pub(crate) struct Span;

#[cfg(feature = "tracing")]
fn mode_str(mode: Mode) -> &'static str {
    match mode {
        Mode::Single => "single",
        Mode::Redlock => "redlock",
    }
}

/// Opens (creates, not enters) the span.
#[cfg(feature = "tracing")]
pub(crate) fn span(of: SpanOf<'_>) -> Span {
    use tracing::field::Empty;
    match of {
        SpanOf::Acquire(key, mode) => tracing::info_span!(
            "redlease.acquire",
            key,
            mode = mode_str(mode),
            lease = Empty,
            attempt = Empty,
            outcome = Empty
        ),
        SpanOf::Extend(key, mode, lease) => tracing::info_span!(
            "redlease.extend",
            key,
            mode = mode_str(mode),
            lease = lease.get(),
            outcome = Empty
        ),
        SpanOf::Release(key, mode, lease) => tracing::info_span!(
            "redlease.release",
            key,
            mode = mode_str(mode),
            lease = lease.get(),
            outcome = Empty
        ),
        SpanOf::Renewal(key, mode, lease) => tracing::debug_span!(
            "redlease.renewal",
            key,
            mode = mode_str(mode),
            lease = lease.get(),
            outcome = Empty
        ),
    }
}

/// Without the `tracing` feature: nothing.
#[cfg(not(feature = "tracing"))]
#[inline(always)]
pub(crate) fn span(_: SpanOf<'_>) -> Span {
    Span
}

/// Enters `span` until the guard drops (synchronous code only: never held across an await).
#[cfg(feature = "tracing")]
pub(crate) fn enter(span: &Span) -> tracing::span::Entered<'_> {
    span.enter()
}

/// Without the `tracing` feature: a guard that does nothing (not `()`, so that `let _in = enter(…)` reads
/// the same with and without the feature).
#[cfg(not(feature = "tracing"))]
#[inline(always)]
pub(crate) fn enter(_: &Span) -> NotEntered {
    NotEntered
}

/// What [`enter`] returns without the `tracing` feature.
#[cfg(not(feature = "tracing"))]
pub(crate) struct NotEntered;

/// Runs `fut` inside `span`.
#[cfg(feature = "tracing")]
pub(crate) fn instrument<F: Future>(span: Span, fut: F) -> tracing::instrument::Instrumented<F> {
    tracing::Instrument::instrument(fut, span)
}

/// Without the `tracing` feature: `fut` itself.
#[cfg(not(feature = "tracing"))]
#[inline(always)]
pub(crate) fn instrument<F: Future>(_: Span, fut: F) -> F {
    fut
}

/// Records `value` in field `field` of the current span if it is one of redlease's (a user's span with a
/// field of the same name is left alone).
#[cfg(feature = "tracing")]
fn record(field: &'static str, value: &dyn tracing::Value) {
    let span = tracing::Span::current();
    if span
        .metadata()
        .is_some_and(|m| m.name().starts_with("redlease."))
    {
        span.record(field, value);
    }
}

/// The event hook's sink for the log lines: every event a manager emits is also given to [`event`].
#[cfg(feature = "tracing")]
pub(crate) const SINK: Option<crate::observe::Sink> = Some(crate::observe::Sink {
    emit: event,
    listening,
});

/// Whether any subscriber may record anything (`tracing`'s global maximum level is not `OFF`): without one
/// the lease events are not even built.
#[cfg(feature = "tracing")]
fn listening() -> bool {
    tracing::level_filters::LevelFilter::current() != tracing::level_filters::LevelFilter::OFF
}
/// Without the feature nothing is logged.
#[cfg(not(feature = "tracing"))]
pub(crate) const SINK: Option<crate::observe::Sink> = None;

/// Logs one lease event at the level an operator expects, and records outcomes on the current span.
///
/// | event | level |
/// |---|---|
/// | `Lost`, `AtRisk` (the first of an at-risk period; later ones at debug), `NotAcquired` for too few nodes or no validity left, a release that reached too few nodes | warn |
/// | `NotAcquired` refused (wrong key type, ACL, cross-slot, fence counter) | error |
/// | `Recovered` | info |
/// | `Acquired`, `NotAcquired` contended or deadline passed, a contended or failed attempt, `Released`, release rounds, clean-ups, extension rounds with failures | debug |
/// | `Capped` (the deadline brought forward before a shorter extension) | debug |
/// | won attempts, `Extended`, extension rounds without failures | trace |
#[cfg(feature = "tracing")]
pub(crate) fn event(e: &LeaseEvent<'_>) {
    use crate::error::Chain;
    use crate::error::NotAcquiredReason as R;
    use crate::observe::{AttemptOutcome, EventKind as K};
    use tracing::{debug, error, info, trace, warn};

    let key = e.key;
    let lease = e.lease.get();
    match &e.kind {
        K::Attempt {
            attempt,
            nodes,
            round,
            outcome,
        } => {
            // (fmt subscribers append every record: record each field once.)
            if *attempt == 1 {
                record("lease", &lease);
            }
            match outcome {
                AttemptOutcome::Won { validity } => {
                    trace!(
                        key,
                        lease,
                        attempt,
                        ?nodes,
                        ?round,
                        ?validity,
                        "attempt won"
                    )
                }
                AttemptOutcome::Failed(R::Contended) => {
                    debug!(
                        key,
                        lease,
                        attempt,
                        ?nodes,
                        ?round,
                        "lock held by another owner"
                    )
                }
                AttemptOutcome::Failed(reason) => debug!(
                    key,
                    lease,
                    attempt,
                    ?nodes,
                    ?round,
                    reason = not_acquired_str(*reason),
                    "attempt failed"
                ),
            }
        }
        K::Acquired {
            attempts,
            waited,
            contended,
            fence,
            ..
        } => {
            record("attempt", attempts);
            record("outcome", &"acquired");
            debug!(key, lease, attempts, ?waited, contended, fence, "acquired");
        }
        K::NotAcquired {
            reason,
            attempts,
            waited,
            contended,
        } => {
            let name = not_acquired_str(*reason);
            record("attempt", attempts);
            record("outcome", &name);
            match reason {
                R::Contended | R::DeadlinePassed => {
                    debug!(
                        key,
                        lease,
                        attempts,
                        ?waited,
                        contended,
                        reason = name,
                        "not acquired"
                    )
                }
                R::Refused => error!(key, lease, attempts, ?waited, reason = name, "not acquired"),
                _ => warn!(
                    key,
                    lease,
                    attempts,
                    ?waited,
                    contended,
                    reason = name,
                    "not acquired"
                ),
            }
        }
        K::Extension {
            renewal,
            nodes,
            round,
        } => {
            let outcome = if nodes.yes() >= nodes.required() {
                "quorum"
            } else if nodes.no() > nodes.len() - nodes.required() {
                "not_held"
            } else {
                "failed"
            };
            record("outcome", &outcome);
            if nodes.failed() > 0 {
                debug!(
                    key,
                    lease,
                    renewal,
                    ?nodes,
                    ?round,
                    outcome,
                    "extension round"
                );
            } else {
                trace!(
                    key,
                    lease,
                    renewal,
                    ?nodes,
                    ?round,
                    outcome,
                    "extension round"
                );
            }
        }
        K::Extended {
            valid_until,
            renewal,
        } => {
            record("outcome", &"extended");
            let validity = valid_until.saturating_duration_since(e.at);
            trace!(key, lease, renewal, ?validity, "extended");
        }
        K::Capped { valid_until } => {
            let validity = valid_until.saturating_duration_since(e.at);
            debug!(
                key,
                lease,
                ?validity,
                "deadline brought forward before a shorter extension"
            );
        }
        K::AtRisk {
            valid_until,
            error,
            first,
        } => {
            // Warn when the lease goes at risk; further failed rounds of the same period at debug.
            let remaining = valid_until.saturating_duration_since(e.at);
            match (error, first) {
                (Some(error), true) => {
                    warn!(key, lease, ?remaining, error = %Chain(*error), "lease at risk: renewal failed")
                }
                (None, true) => warn!(
                    key,
                    lease,
                    ?remaining,
                    "lease at risk: renewal ran out of time"
                ),
                (Some(error), false) => {
                    debug!(key, lease, ?remaining, error = %Chain(*error), "lease still at risk: renewal failed again")
                }
                (None, false) => debug!(key, lease, ?remaining, "lease still at risk"),
            }
        }
        K::Recovered {
            valid_until,
            at_risk_for,
        } => {
            let validity = valid_until.saturating_duration_since(e.at);
            info!(
                key,
                lease,
                ?at_risk_for,
                ?validity,
                "lease recovered: renewal succeeded"
            );
        }
        K::Lost {
            reason, held_for, ..
        } => {
            record("outcome", &"lost");
            warn!(
                key,
                lease,
                reason = loss_str(*reason),
                ?held_for,
                "lease lost: {reason}"
            );
        }
        K::Released { dropped, held_for } => {
            debug!(key, lease, dropped, ?held_for, "released");
        }
        K::HandedOff { held_for } => debug!(key, lease, ?held_for, "handed off"),
        K::Resumed { valid_until, fence } => {
            debug!(key, lease, ?valid_until, fence, "resumed");
        }
        K::ReleaseRound { nodes, round } => {
            let n = nodes.len();
            let outcome = if nodes.yes() >= nodes.required() {
                "released"
            } else if nodes.no() > n - nodes.required() {
                "not_held"
            } else {
                "unknown"
            };
            record("outcome", &outcome);
            if outcome == "unknown" {
                warn!(
                    key,
                    lease,
                    ?nodes,
                    ?round,
                    outcome,
                    "release reached too few nodes"
                );
            } else {
                debug!(key, lease, ?nodes, ?round, outcome, "release round");
            }
        }
        K::Cleanup {
            cause,
            nodes,
            round,
        } => {
            debug!(
                key,
                lease,
                cause = cause.as_str(),
                ?nodes,
                ?round,
                "clean-up"
            );
        }
        K::NodeRestarted {
            node,
            quarantined_for,
        } => {
            warn!(
                key,
                lease,
                node,
                ?quarantined_for,
                "node restarted (its run_id changed): it may have forgotten locks"
            );
        }
        K::NotReplicated {
            acknowledged,
            wanted,
            error,
        } => match error {
            Some(error) => {
                warn!(key, lease, wanted, error = %Chain(*error), "write not acknowledged by replicas: the wait failed")
            }
            None => warn!(
                key,
                lease, acknowledged, wanted, "write not acknowledged by enough replicas in time"
            ),
        },
        K::FenceRegressed { fence, previous } => {
            error!(
                key,
                lease, fence, previous, "fence counter went backwards: the server lost writes"
            );
        }
    }
}
