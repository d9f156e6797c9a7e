//! The `tracing` and `metrics` features, on the simulator: one contended acquisition, one renewal failure
//! that recovers, one loss. What a subscriber and a recorder receive.
#![cfg(any(feature = "tracing", feature = "metrics"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::Duration;

use redlease::{Config, Lease, LockManager, NodeErrorKind, Timer};
use redlease_testkit::{Fault, Faults, FaultyNode, MemoryNode, Op, Sim, VirtualClock};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One node on virtual time, with a spawner.
struct World {
    sim: Sim,
    clock: VirtualClock,
    node: MemoryNode,
    faults: Faults,
    manager: LockManager,
}

fn world(seed: u64) -> World {
    let sim = Sim::new(seed);
    let clock = sim.clock();
    let node = MemoryNode::with_timer(clock.clone());
    let (faulty, faults) = FaultyNode::new(node.clone(), clock.clone());
    let config = Config::default()
        .jitter_seed(seed)
        .expiry(Duration::from_secs(30))
        .retry_delay(ms(50));
    let manager = LockManager::single(faulty, config)
        .unwrap()
        .with_timer(clock.clone())
        .with_spawner(sim.spawner());
    World {
        sim,
        clock,
        node,
        faults,
        manager,
    }
}

/// The scenario: a contended acquisition of `report` (its holder leaves after 120 ms), then a self-renewing
/// lease on `job` whose first renewal fails (at risk, recovered on the retry) and which is lost when someone
/// deletes its key. Returns the raw token value of the `job` lease, read from the node.
fn scenario(w: &mut World, manager: &LockManager) -> String {
    let report = manager.lock("report");
    let holder = {
        let report = report.clone();
        w.sim
            .block_on(async move { report.try_acquire().await })
            .unwrap()
    };
    let clock = w.clock.clone();
    w.sim.spawn(async move {
        clock.sleep_until(clock.now() + ms(120)).await;
        holder.release().await.unwrap();
    });
    let waiter = w
        .sim
        .block_on(async move { report.acquire_within(Duration::from_secs(2)).await })
        .unwrap();
    w.sim
        .block_on(async move { waiter.release().await })
        .unwrap();

    w.faults
        .script(Op::Extend, [Fault::Fail(NodeErrorKind::Connection)]);
    let job = manager.lock("job").auto_renew(Duration::from_secs(10));
    let lease: Lease = w
        .sim
        .block_on(async move { job.try_acquire().await })
        .unwrap();
    let token = String::from_utf8(w.node.get("job").unwrap()).unwrap();
    assert_eq!(token, lease.token().as_str());
    w.sim.run_for(Duration::from_secs(11));
    assert_eq!(lease.state(), redlease::LeaseState::Held);
    w.node.del("job");
    w.sim.run_for(Duration::from_secs(11));
    assert!(!lease.is_held());
    drop(lease);
    w.sim.run_for(Duration::from_secs(1));
    token
}

#[cfg(feature = "tracing")]
mod tracing_feature {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::fmt::format::FmtSpan;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn lines_with<'a>(out: &'a str, level: &str, text: &str) -> Vec<&'a str> {
        out.lines()
            .filter(|l| l.contains(level) && l.contains(text))
            .collect()
    }

    #[test]
    fn spans_and_events_carry_key_attempt_outcome_at_operator_levels_and_never_the_token() {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(FmtSpan::CLOSE)
            .with_writer(buf.clone())
            .finish();
        let token = tracing::subscriber::with_default(subscriber, || {
            let mut w = world(50);
            let manager = w.manager.clone();
            scenario(&mut w, &manager)
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        // Contention at debug, inside the acquisition's span with key, mode and attempt.
        let contended = lines_with(&out, "DEBUG", "lock held by another owner");
        assert!(!contended.is_empty(), "{out}");
        assert!(
            contended[0].contains("redlease.acquire{key=\"report\" mode=\"single\""),
            "{}",
            contended[0]
        );
        assert!(contended[0].contains("attempt=1"), "{}", contended[0]);
        // The acquisition span closes with its outcome and the number of the winning attempt.
        let closed = lines_with(&out, "redlease.acquire", "close");
        assert!(
            closed
                .iter()
                .any(|l| l.contains("key=\"report\"") && l.contains("outcome=\"acquired\"")),
            "{out}"
        );
        // The failed renewal at warn, with the node error; the recovery at info.
        let at_risk = lines_with(&out, "WARN", "lease at risk: renewal failed");
        assert_eq!(at_risk.len(), 1, "{out}");
        assert!(at_risk[0].contains("key=\"job\""), "{}", at_risk[0]);
        assert!(at_risk[0].contains("connection"), "{}", at_risk[0]);
        assert_eq!(
            lines_with(&out, "INFO", "lease recovered").len(),
            1,
            "{out}"
        );
        // Renewal rounds in spans of their own, with their outcome.
        assert!(
            lines_with(&out, "redlease.renewal", "close")
                .iter()
                .any(|l| l.contains("outcome=\"failed\"")),
            "{out}"
        );
        // The loss at warn, with its reason.
        let lost = lines_with(&out, "WARN", "lease lost");
        assert_eq!(lost.len(), 1, "{out}");
        assert!(lost[0].contains("reason=\"not_held\""), "{}", lost[0]);
        // Releases in their span.
        assert!(
            lines_with(&out, "redlease.release", "close")
                .iter()
                .any(|l| l.contains("outcome=\"released\"")),
            "{out}"
        );
        assert!(
            !out.contains(&token),
            "the token appears in the log:\n{out}"
        );
        assert!(
            !out.contains(&token[..12]),
            "part of the token appears:\n{out}"
        );
    }
}

#[cfg(feature = "metrics")]
mod metrics_feature {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use redlease::metrics::MetricsObserver;

    use super::*;

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
}
