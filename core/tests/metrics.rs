//! The `metrics` feature, on the simulator: one contended acquisition, one renewal failure that recovers,
//! one loss — what a recorder receives.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/observe.rs"]
mod support;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redlease::metrics::MetricsObserver;

use support::*;

/// `(name, sorted "k=v" labels, value)` for every series.
fn snapshot(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> Vec<(String, Vec<String>, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (key.key().name().to_owned(), labels, value)
        })
        .collect()
}

fn find<'a>(
    s: &'a [(String, Vec<String>, DebugValue)],
    name: &str,
    labels: &[&str],
) -> Option<&'a DebugValue> {
    s.iter()
        .find(|(n, l, _)| n == name && l.iter().map(String::as_str).eq(labels.iter().copied()))
        .map(|(_, _, v)| v)
}

fn counter(s: &[(String, Vec<String>, DebugValue)], name: &str, labels: &[&str]) -> u64 {
    match find(s, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name} {labels:?}: {other:?} in {s:#?}"),
    }
}

fn histogram(s: &[(String, Vec<String>, DebugValue)], name: &str, labels: &[&str]) -> Vec<f64> {
    match find(s, name, labels) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
        other => panic!("{name} {labels:?}: {other:?} in {s:#?}"),
    }
}

#[test]
fn counters_histograms_and_the_held_gauge_follow_the_scenario() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let mut w = world(51);
        let manager = w.manager.clone().with_observer(MetricsObserver::new());
        scenario(&mut w, &manager);
    });
    let s = snapshot(&snapshotter);
    // holder, waiter, job.
    assert_eq!(counter(&s, "redlease_acquired_total", &[]), 3);
    assert_eq!(
        counter(&s, "redlease_contended_total", &["result=acquired"]),
        1
    );
    assert!(
        counter(
            &s,
            "redlease_acquire_attempts_total",
            &["outcome=contended"]
        ) >= 2
    );
    assert_eq!(
        counter(&s, "redlease_acquire_attempts_total", &["outcome=won"]),
        3
    );
    let wait = histogram(&s, "redlease_acquire_wait_seconds", &[]);
    assert_eq!(wait.len(), 1);
    assert!(wait[0] >= 0.120 && wait[0] < 2.0, "{wait:?}");
    assert_eq!(
        histogram(
            &s,
            "redlease_acquire_duration_seconds",
            &["result=acquired"]
        )
        .len(),
        3
    );
    assert_eq!(
        counter(&s, "redlease_renewals_total", &["result=at_risk"]),
        1
    );
    assert_eq!(
        counter(&s, "redlease_renewals_total", &["result=extended"]),
        1
    );
    assert_eq!(counter(&s, "redlease_recovered_total", &[]), 1);
    assert_eq!(counter(&s, "redlease_at_risk_total", &[]), 1);
    // One failed renewal round, and the loss's own renewal found the key gone (no error).
    assert_eq!(
        counter(
            &s,
            "redlease_node_errors_total",
            &["kind=connection", "op=extend"]
        ),
        1
    );
    assert_eq!(counter(&s, "redlease_lost_total", &["reason=not_held"]), 1);
    assert_eq!(
        histogram(&s, "redlease_hold_seconds", &["end=released"]).len(),
        2
    );
    let lost_after = histogram(&s, "redlease_hold_seconds", &["end=lost"]);
    assert_eq!(lost_after.len(), 1);
    assert!(
        lost_after[0] >= 20.0 && lost_after[0] < 22.0,
        "{lost_after:?}"
    );
    // Three renewal rounds of `job`: failed, retried, then the one that found the key gone.
    assert_eq!(
        histogram(&s, "redlease_renewal_duration_seconds", &[]).len(),
        3
    );
    match find(&s, "redlease_leases_held", &[]) {
        Some(DebugValue::Gauge(v)) => assert_eq!(v.into_inner(), 0.0),
        other => panic!("{other:?}"),
    }
    // No key label unless asked for.
    assert!(
        s.iter()
            .all(|(_, l, _)| l.iter().all(|l| !l.starts_with("key=")))
    );
}

#[test]
fn the_key_label_is_opt_in() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let mut w = world(52);
        let manager = w
            .manager
            .clone()
            .with_observer(MetricsObserver::new().with_key_label(true));
        scenario(&mut w, &manager);
    });
    let s = snapshot(&snapshotter);
    assert_eq!(counter(&s, "redlease_acquired_total", &["key=report"]), 2);
    assert_eq!(counter(&s, "redlease_acquired_total", &["key=job"]), 1);
    assert_eq!(
        counter(&s, "redlease_lost_total", &["key=job", "reason=not_held"]),
        1
    );
    assert_eq!(
        counter(
            &s,
            "redlease_node_errors_total",
            &["key=job", "kind=connection", "op=extend"]
        ),
        1
    );
    assert!(find(&s, "redlease_acquired_total", &[]).is_none());
}
