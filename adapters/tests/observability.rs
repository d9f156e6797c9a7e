//! Runs the observability example (its own code, included below) against a password-protected server of each
//! flavor started here, and checks what an operator would see: the log lines and the scraped `/metrics` text for one
//! contended acquisition, one renewal failure that recovers, and one loss — and that neither shows a token
//! or the password.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use redlease_testkit::server::{Flavor, RedisServer, on_each_flavor};
use tracing_subscriber::fmt::MakeWriter;

#[path = "../examples/observability.rs"]
#[allow(dead_code, unreachable_pub)]
mod observability;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buf {
    type Writer = Buf;
    fn make_writer(&'a self) -> Buf {
        self.clone()
    }
}

/// `GET /metrics` over plain HTTP, as a scraper would.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    body.to_owned()
}

/// The value of the series written exactly as `series` (name and labels), if present.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

fn lines<'a>(log: &'a str, level: &str, text: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.contains(level) && l.contains(text))
        .collect()
}

/// Set in the child processes of the test below: the flavor (`Flavor::name`) the child runs on.
const FLAVOR_ENV: &str = "REDLEASE_OBSERVABILITY_FLAVOR";

const TEST: &str = "example_shows_contention_renewal_failure_and_loss_in_logs_and_metrics";

/// On every server. The logger and the metrics recorder are global to a process (installed once, counting
/// from zero), so each server's run is a child process of this test binary running this test alone.
#[test]
fn example_shows_contention_renewal_failure_and_loss_in_logs_and_metrics() {
    if let Ok(name) = std::env::var(FLAVOR_ENV) {
        let flavor = Flavor::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{FLAVOR_ENV}={name:?} names no flavor"));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(observe_on(flavor));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    on_each_flavor(TEST, &Flavor::ALL, |flavor| {
        let out = std::process::Command::new(&exe)
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(FLAVOR_ENV, flavor.name())
            .output()
            .unwrap();
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "on {flavor}:\n{output}");
        // The child ran the test (and did not filter it away).
        assert!(output.contains("1 passed"), "on {flavor}:\n{output}");
    });
}

async fn observe_on(flavor: Flavor) {
    const PASSWORD: &str = "obs-pw-7d3e91c4";
    let server = RedisServer::start_flavor(flavor, &["--requirepass", PASSWORD]);
    let log = Buf::default();
    let (_handle, addr) = observability::observe(log.clone(), "127.0.0.1:0").unwrap();
    let report = observability::run(&server.url_with_password(PASSWORD))
        .await
        .unwrap();
    let metrics = scrape(addr);
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let shown = format!("--- log ---\n{log}\n--- metrics ---\n{metrics}");

    // Contention: a debug line inside the waiter's acquisition span; its wait in the metrics.
    let contended = lines(&log, "DEBUG", "lock held by another owner");
    assert!(!contended.is_empty(), "{shown}");
    assert!(
        contended[0].contains(&format!(
            "redlease.acquire{{key=\"{}\"",
            observability::REPORT_KEY
        )),
        "{}",
        contended[0]
    );
    assert_eq!(
        value(&metrics, "redlease_contended_total{result=\"acquired\"}"),
        Some(1.0),
        "{shown}"
    );
    assert_eq!(
        value(&metrics, "redlease_acquire_wait_seconds_count"),
        Some(1.0),
        "{shown}"
    );
    assert_eq!(
        value(&metrics, "redlease_acquired_total"),
        Some(3.0),
        "{shown}"
    );

    // The renewal failure: at risk (warn), recovered (info); counted, with the node errors behind it.
    let at_risk = lines(&log, "WARN", "lease at risk");
    assert!(!at_risk.is_empty(), "{shown}");
    assert!(
        at_risk[0].contains(observability::JOB_KEY),
        "{}",
        at_risk[0]
    );
    assert_eq!(lines(&log, "INFO", "lease recovered").len(), 1, "{shown}");
    assert!(
        value(&metrics, "redlease_renewals_total{result=\"at_risk\"}").is_some_and(|n| n >= 2.0),
        "two pauses, each failing at least one renewal round: {shown}"
    );
    assert_eq!(
        value(&metrics, "redlease_recovered_total"),
        Some(1.0),
        "{shown}"
    );
    // One at-risk period per pause; the warn line only for the first failed round of each.
    assert_eq!(
        value(&metrics, "redlease_at_risk_total"),
        Some(2.0),
        "{shown}"
    );
    assert_eq!(lines(&log, "WARN", "lease at risk").len(), 2, "{shown}");
    assert!(
        value(&metrics, "redlease_renewals_total{result=\"extended\"}").is_some_and(|n| n >= 1.0),
        "{shown}"
    );
    assert!(
        value(
            &metrics,
            "redlease_node_errors_total{op=\"extend\",kind=\"timeout\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{shown}"
    );

    // The loss: one warn line naming the key and the reason; one lost lease in the metrics, none held.
    let lost = lines(&log, "WARN", "lease lost");
    assert_eq!(lost.len(), 1, "{shown}");
    assert!(lost[0].contains(observability::JOB_KEY), "{}", lost[0]);
    let reason = match report.lost {
        redlease::LossReason::Expired => "expired",
        redlease::LossReason::ExtendFailed => "extend_failed",
        other => panic!("lost for {other:?}"),
    };
    assert!(
        lost[0].contains(&format!("reason=\"{reason}\"")),
        "{}",
        lost[0]
    );
    assert_eq!(
        value(
            &metrics,
            &format!("redlease_lost_total{{reason=\"{reason}\"}}")
        ),
        Some(1.0),
        "{shown}"
    );
    assert_eq!(
        value(&metrics, "redlease_hold_seconds_count{end=\"lost\"}"),
        Some(1.0),
        "{shown}"
    );
    assert_eq!(
        value(&metrics, "redlease_leases_held"),
        Some(0.0),
        "{shown}"
    );

    // Per-node spans name the server without the password.
    let node = format!("redlease.node{{node=redis://127.0.0.1:{}/0", server.port());
    assert!(log.contains(&node), "{shown}");

    // Nothing secret anywhere.
    assert!(
        !log.contains(PASSWORD) && !metrics.contains(PASSWORD),
        "{shown}"
    );
    assert_eq!(report.tokens.len(), 3);
    for token in &report.tokens {
        assert!(!log.contains(token.as_str()), "token in the log: {shown}");
        assert!(
            !metrics.contains(token.as_str()),
            "token in the metrics: {shown}"
        );
    }
}
