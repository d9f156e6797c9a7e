//! Lease metrics over the [`metrics`](https://docs.rs/metrics) facade: install [`MetricsObserver`] on a
//! manager and any `metrics` exporter (Prometheus, StatsD, …) receives these series.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `redlease_acquire_attempts_total` | counter | `outcome`: `won`, `contended`, `too_few_nodes`, `validity_exhausted`, `refused` | acquisition attempts (rounds of node calls) |
//! | `redlease_acquired_total` | counter | – | acquisitions that got the lease |
//! | `redlease_contended_total` | counter | `result`: `acquired`, `not_acquired` | acquisitions that found the lock held by another owner at least once |
//! | `redlease_acquire_failed_total` | counter | `reason`: `contended`, `too_few_nodes`, `validity_exhausted`, `refused`, `deadline_passed`, `not_replicated` | acquisitions that gave up |
//! | `redlease_lost_total` | counter | `reason`: `expired`, `not_held`, `extend_failed`, `suspended`, `hold_limit` | leases lost |
//! | `redlease_renewals_total` | counter | `result`: `extended`, `at_risk` | automatic renewal rounds: succeeded, or failed without proving the lease gone |
//! | `redlease_at_risk_total` | counter | – | leases that went at risk (the first failed renewal round of each at-risk period) |
//! | `redlease_recovered_total` | counter | – | at-risk leases that a renewal saved |
//! | `redlease_node_errors_total` | counter | `op`: `acquire`, `extend`, `release`, `cleanup`; `kind`: the error kind's `as_str()` (`connection`, `timeout`, …) | node calls that failed (a round the quorum decided without a node's reply does not count it) |
//! | `redlease_acquire_duration_seconds` | histogram | `result`: `acquired`, `not_acquired` | acquisition latency: from the call to its result, every attempt and pause included |
//! | `redlease_acquire_wait_seconds` | histogram | – | contended acquisitions that got the lease: the time they waited for it |
//! | `redlease_hold_seconds` | histogram | `end`: `released`, `dropped`, `lost`, `handed_off` | from acquisition (or resumption) to release, drop, loss or handoff |
//! | `redlease_renewal_duration_seconds` | histogram | – | one automatic renewal round |
//! | `redlease_leases_held` | gauge | – | leases acquired or resumed and not yet released, dropped, lost or handed off |
//!
//! With [`with_key_label(true)`](MetricsObserver::with_key_label) every series above also carries
//! `key` = the lock key. Off by default: each key is a new series, so only turn it on for a small, fixed set of
//! keys.
//!
//! Cost: a series without the key label is looked up in the recorder by a static key (no allocation); with
//! the key label, each event builds its key (allocates). Node errors, rare by nature, build theirs either way.
//!
//! ```
//! # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
//! use std::sync::Arc;
//! use redlease::{Config, LockManager, metrics::MetricsObserver};
//!
//! # block_on(async {
//! // Install a `metrics` recorder (an exporter) first; without one the series go nowhere.
//! let manager = LockManager::single(MapNode::default(), Config::default())?
//!     .with_observer(MetricsObserver::new());
//! manager.lock("job").try_acquire().await?.release().await?;
//! # Ok::<(), redlease::Error>(())
//! # }).unwrap();
//! ```

use metrics::{Key, Label, Level, Metadata};

use crate::error::{LossReason, NotAcquiredReason};
use crate::observe::{AttemptOutcome, EventKind, LeaseEvent, Nodes, Observer};

/// An [`Observer`] that records the series in the [module's table](self) through the `metrics` facade's
/// current recorder.
///
/// Combine it with another observer with a pair: `manager.with_observer((MetricsObserver::new(), other))`.
#[derive(Debug, Clone, Default)]
pub struct MetricsObserver {
    key_label: bool,
}

const ACQUIRE_ATTEMPTS: &str = "redlease_acquire_attempts_total";
const ACQUIRED: &str = "redlease_acquired_total";
const CONTENDED: &str = "redlease_contended_total";
const ACQUIRE_FAILED: &str = "redlease_acquire_failed_total";
const LOST: &str = "redlease_lost_total";
const RENEWALS: &str = "redlease_renewals_total";
const AT_RISK: &str = "redlease_at_risk_total";
const RECOVERED: &str = "redlease_recovered_total";
const NODE_ERRORS: &str = "redlease_node_errors_total";
const ACQUIRE_DURATION: &str = "redlease_acquire_duration_seconds";
const ACQUIRE_WAIT: &str = "redlease_acquire_wait_seconds";
const HOLD: &str = "redlease_hold_seconds";
const RENEWAL_DURATION: &str = "redlease_renewal_duration_seconds";
const HELD: &str = "redlease_leases_held";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A static one-label set, so that a series key needs no allocation.
macro_rules! labels {
    ($name:literal: $($value:literal),* $(,)?) => {
        [$([Label::from_static_parts($name, $value)]),*]
    };
}

static OUTCOME_WON: [[Label; 1]; 1] = labels!("outcome": "won");
static OUTCOME_FAILED: [[Label; 1]; 6] = labels!(
    "outcome": "contended", "too_few_nodes", "validity_exhausted", "refused", "deadline_passed",
    "not_replicated"
);
static REASON_FAILED: [[Label; 1]; 6] = labels!(
    "reason": "contended", "too_few_nodes", "validity_exhausted", "refused", "deadline_passed",
    "not_replicated"
);
static RESULT_ACQUIRE: [[Label; 1]; 2] = labels!("result": "acquired", "not_acquired");
static REASON_LOST: [[Label; 1]; 6] = labels!(
    "reason": "expired", "not_held", "extend_failed", "released", "suspended", "hold_limit"
);
static RESULT_RENEWAL: [[Label; 1]; 2] = labels!("result": "extended", "at_risk");
static END: [[Label; 1]; 4] = labels!("end": "released", "dropped", "lost", "handed_off");

fn failed_index(reason: NotAcquiredReason) -> usize {
    match reason {
        NotAcquiredReason::Contended => 0,
        NotAcquiredReason::TooFewNodes => 1,
        NotAcquiredReason::ValidityExhausted => 2,
        NotAcquiredReason::Refused => 3,
        NotAcquiredReason::DeadlinePassed => 4,
        NotAcquiredReason::NotReplicated => 5,
    }
}

fn lost_index(reason: LossReason) -> usize {
    match reason {
        LossReason::Expired => 0,
        LossReason::NotHeld => 1,
        LossReason::ExtendFailed => 2,
        LossReason::Released => 3,
        LossReason::Suspended => 4,
        LossReason::HoldLimit => 5,
    }
}

impl MetricsObserver {
    /// Records without the key label, and describes the series (help text, units) to the current recorder.
    pub fn new() -> Self {
        describe();
        Self { key_label: false }
    }

    /// Adds the lock key as a `key` label to every series (`false` by default; see the module docs about
    /// cardinality).
    #[must_use]
    pub fn with_key_label(mut self, on: bool) -> Self {
        self.key_label = on;
        self
    }

    /// The series key: static when possible, with the `key` label when asked for.
    fn key(&self, name: &'static str, labels: &'static [Label], lock_key: &str) -> Key {
        if self.key_label {
            let mut all: Vec<Label> = labels.to_vec();
            all.push(Label::new("key", lock_key.to_owned()));
            Key::from_parts(name, all)
        } else {
            Key::from_static_parts(name, labels)
        }
    }

    fn count(&self, name: &'static str, labels: &'static [Label], lock_key: &str) {
        let key = self.key(name, labels, lock_key);
        metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
    }

    fn observe(&self, name: &'static str, labels: &'static [Label], lock_key: &str, seconds: f64) {
        let key = self.key(name, labels, lock_key);
        metrics::with_recorder(|r| r.register_histogram(&key, &METADATA).record(seconds));
    }

    fn held(&self, lock_key: &str, delta: f64) {
        let key = self.key(HELD, &[], lock_key);
        metrics::with_recorder(|r| r.register_gauge(&key, &METADATA).increment(delta));
    }

    fn node_errors(&self, op: &'static str, nodes: &Nodes<'_>, lock_key: &str) {
        for (_, error) in nodes.errors() {
            let mut labels = vec![
                Label::from_static_parts("op", op),
                Label::from_static_parts("kind", error.kind().as_str()),
            ];
            if self.key_label {
                labels.push(Label::new("key", lock_key.to_owned()));
            }
            let key = Key::from_parts(NODE_ERRORS, labels);
            metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
        }
    }
}

/// Help texts and units for every series.
fn describe() {
    use metrics::Unit;
    let counters = [
        (ACQUIRE_ATTEMPTS, "Acquisition attempts, by outcome"),
        (ACQUIRED, "Acquisitions that got the lease"),
        (
            CONTENDED,
            "Acquisitions that found the lock held by another owner",
        ),
        (ACQUIRE_FAILED, "Acquisitions that gave up, by reason"),
        (LOST, "Leases lost, by reason"),
        (RENEWALS, "Automatic renewal rounds, by result"),
        (AT_RISK, "Leases that went at risk"),
        (RECOVERED, "At-risk leases saved by a renewal"),
        (
            NODE_ERRORS,
            "Failed node calls, by operation and error kind",
        ),
    ];
    let histograms = [
        (
            ACQUIRE_DURATION,
            "Acquisition latency, all attempts included",
        ),
        (
            ACQUIRE_WAIT,
            "Time contended acquisitions waited for the lease",
        ),
        (HOLD, "Time from acquisition to release, drop or loss"),
        (RENEWAL_DURATION, "Duration of one renewal round"),
    ];
    metrics::with_recorder(|r| {
        for (name, help) in counters {
            r.describe_counter(name.into(), Some(Unit::Count), help.into());
        }
        for (name, help) in histograms {
            r.describe_histogram(name.into(), Some(Unit::Seconds), help.into());
        }
        r.describe_gauge(
            HELD.into(),
            Some(Unit::Count),
            "Leases currently held".into(),
        );
    });
}

impl Observer for MetricsObserver {
    fn event(&self, e: &LeaseEvent<'_>) {
        let k = e.key;
        match &e.kind {
            EventKind::Attempt { nodes, outcome, .. } => {
                let labels: &'static [Label] = match outcome {
                    AttemptOutcome::Won { .. } => &OUTCOME_WON[0],
                    AttemptOutcome::Failed(reason) => &OUTCOME_FAILED[failed_index(*reason)],
                };
                self.count(ACQUIRE_ATTEMPTS, labels, k);
                self.node_errors("acquire", nodes, k);
            }
            EventKind::Acquired {
                waited, contended, ..
            } => {
                self.count(ACQUIRED, &[], k);
                self.observe(
                    ACQUIRE_DURATION,
                    &RESULT_ACQUIRE[0],
                    k,
                    waited.as_secs_f64(),
                );
                if *contended {
                    self.count(CONTENDED, &RESULT_ACQUIRE[0], k);
                    self.observe(ACQUIRE_WAIT, &[], k, waited.as_secs_f64());
                }
                self.held(k, 1.0);
            }
            EventKind::NotAcquired {
                reason,
                waited,
                contended,
                ..
            } => {
                self.count(ACQUIRE_FAILED, &REASON_FAILED[failed_index(*reason)], k);
                self.observe(
                    ACQUIRE_DURATION,
                    &RESULT_ACQUIRE[1],
                    k,
                    waited.as_secs_f64(),
                );
                if *contended {
                    self.count(CONTENDED, &RESULT_ACQUIRE[1], k);
                }
            }
            EventKind::Extension {
                renewal,
                nodes,
                round,
            } => {
                if *renewal {
                    self.observe(RENEWAL_DURATION, &[], k, round.as_secs_f64());
                }
                self.node_errors("extend", nodes, k);
            }
            EventKind::Extended { renewal: true, .. } => {
                self.count(RENEWALS, &RESULT_RENEWAL[0], k);
            }
            EventKind::AtRisk { first, .. } => {
                self.count(RENEWALS, &RESULT_RENEWAL[1], k);
                if *first {
                    self.count(AT_RISK, &[], k);
                }
            }
            EventKind::Recovered { .. } => self.count(RECOVERED, &[], k),
            EventKind::Lost {
                reason, held_for, ..
            } => {
                self.count(LOST, &REASON_LOST[lost_index(*reason)], k);
                self.observe(HOLD, &END[2], k, held_for.as_secs_f64());
                self.held(k, -1.0);
            }
            EventKind::Released { dropped, held_for } => {
                let end = if *dropped { &END[1] } else { &END[0] };
                self.observe(HOLD, end, k, held_for.as_secs_f64());
                self.held(k, -1.0);
            }
            EventKind::HandedOff { held_for } => {
                self.observe(HOLD, &END[3], k, held_for.as_secs_f64());
                self.held(k, -1.0);
            }
            EventKind::Resumed { .. } => self.held(k, 1.0),
            EventKind::ReleaseRound { nodes, .. } => self.node_errors("release", nodes, k),
            EventKind::Cleanup { nodes, .. } => self.node_errors("cleanup", nodes, k),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{loss_str, not_acquired_str};

    /// The table rows of a Markdown text (`| `redlease_…` lines), with any `//! ` prefix removed.
    fn rows(text: &str) -> Vec<&str> {
        text.lines()
            .map(|l| l.strip_prefix("//! ").unwrap_or(l))
            .filter(|l| l.starts_with("| `redlease_"))
            .collect()
    }

    #[test]
    fn the_readme_table_is_the_module_table() {
        let module = rows(include_str!("metrics.rs"));
        let readme = rows(include_str!("../README.md"));
        assert_eq!(module.len(), 14);
        assert_eq!(readme, module);
        // Every series name used in the code is in the table.
        for name in [
            ACQUIRE_ATTEMPTS,
            ACQUIRED,
            CONTENDED,
            ACQUIRE_FAILED,
            LOST,
            RENEWALS,
            AT_RISK,
            RECOVERED,
            NODE_ERRORS,
            ACQUIRE_DURATION,
            ACQUIRE_WAIT,
            HOLD,
            RENEWAL_DURATION,
            HELD,
        ] {
            assert!(
                module.iter().any(|r| r.starts_with(&format!("| `{name}`"))),
                "{name}"
            );
        }
    }

    /// The label tables and the reason names the docs and the tracing fields use must agree.
    #[test]
    fn label_tables_match_reason_names() {
        for reason in [
            NotAcquiredReason::Contended,
            NotAcquiredReason::TooFewNodes,
            NotAcquiredReason::ValidityExhausted,
            NotAcquiredReason::Refused,
            NotAcquiredReason::DeadlinePassed,
            NotAcquiredReason::NotReplicated,
        ] {
            let i = failed_index(reason);
            assert_eq!(REASON_FAILED[i][0].value(), not_acquired_str(reason));
            assert_eq!(OUTCOME_FAILED[i][0].value(), not_acquired_str(reason));
        }
        for reason in [
            LossReason::Expired,
            LossReason::NotHeld,
            LossReason::ExtendFailed,
            LossReason::Released,
            LossReason::Suspended,
            LossReason::HoldLimit,
        ] {
            assert_eq!(REASON_LOST[lost_index(reason)][0].value(), loss_str(reason));
        }
    }
}
