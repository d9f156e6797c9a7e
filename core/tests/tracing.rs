//! The `tracing` feature, on the simulator: one contended acquisition, one renewal failure that recovers,
//! one loss — what a subscriber receives. (Its own test binary: `tracing`'s per-call-site interest cache is
//! process-wide, and other tests emitting from other threads without a subscriber made it flaky.)
#![cfg(feature = "tracing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/observe.rs"]
mod support;

use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;

use support::*;

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

/// Runs the scenario on `w` with a subscriber that keeps everything (span closes included): the `job`
/// lease's token and the log.
fn captured(mut w: World) -> (String, String) {
    let buf = Buf::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(buf.clone())
        .finish();
    let token = tracing::subscriber::with_default(subscriber, || {
        let manager = w.manager.clone();
        scenario(&mut w, &manager)
    });
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (token, out)
}

#[test]
fn spans_and_events_carry_key_attempt_outcome_at_operator_levels_and_never_the_token() {
    let (token, out) = captured(world(50));
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
    // The waiter's span: its last attempt's number, at least 2 (the first found the lock held).
    let waiter_attempts: Vec<u32> = closed
        .iter()
        .filter(|l| l.contains("key=\"report\""))
        .filter_map(|l| {
            l.split(" attempt=")
                .nth(1)?
                .split([' ', '}'])
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(waiter_attempts.len(), 2, "{out}");
    assert!(
        waiter_attempts.iter().any(|&n| n >= 2),
        "{waiter_attempts:?}"
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

/// Batched renewal keeps a `redlease.renewal` span per lease and round, with its outcome, and the lease's
/// at-risk and recovery events.
#[test]
fn batched_renewals_have_a_span_per_lease_and_round_with_its_outcome() {
    let (_, out) = captured(world_with(51, |c| c.with_renewal_batching(ms(5), 100)));
    let renewals = lines_with(&out, "redlease.renewal", "close");
    assert!(
        renewals
            .iter()
            .any(|l| l.contains("key=\"job\"") && l.contains("outcome=\"failed\"")),
        "{out}"
    );
    assert!(
        renewals.iter().any(|l| l.contains("outcome=\"extended\"")),
        "{out}"
    );
    let at_risk = lines_with(&out, "WARN", "lease at risk: renewal failed");
    assert_eq!(at_risk.len(), 1, "{out}");
    assert!(at_risk[0].contains("redlease.renewal"), "{}", at_risk[0]);
}
