//! An observable service: redlease's spans and events printed by `tracing-subscriber`, its metrics exposed
//! in the Prometheus text format by `metrics-exporter-prometheus`, through one contended acquisition, one
//! renewal failure (the lease goes at risk, then recovers) and one loss.
//!
//! ```sh
//! cargo run -p redlease-adapters --features redis,tokio,tracing,metrics --example observability
//! ```
//!
//! Without `REDIS_URL` it starts a temporary `redis-server`. **It pauses the server's writes** (`CLIENT PAUSE
//! … WRITE`) twice to make renewals fail: do not point it at a Redis anything else uses.
//!
//! While it runs, `GET /metrics` on the printed address returns what a Prometheus scraper would see; at the
//! end the same text is printed. The wiring a service needs is all in [`observe`] and [`manager`]: a
//! subscriber, a recorder, [`MetricsObserver`] on the manager, and [`Traced`] around each node for per-node
//! spans.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlease::metrics::MetricsObserver;
use redlease::{
    AttemptOutcome, Config, EventKind, Lease, LeaseEvent, LeaseState, LockManager, LossReason,
    NotAcquiredReason, Observer,
};
use redlease_adapters::redis::redis;
use redlease_adapters::trace::Traced;
use tokio::sync::Notify;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;

#[path = "common/mod.rs"]
mod common;
use common::BoxError;

const TTL: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_millis(600);
const OP_TIMEOUT: Duration = Duration::from_millis(150);
const RETRY_DELAY: Duration = Duration::from_millis(50);
/// How long the demo waits for each thing it provokes before it gives up (far above what each takes).
const PATIENCE: Duration = Duration::from_secs(15);

/// Lock keys.
pub(crate) const REPORT_KEY: &str = "report:{daily}:lock";
pub(crate) const JOB_KEY: &str = "job:{sync}:lock";

/// What the run did, for the test.
#[derive(Debug)]
pub(crate) struct Report {
    /// Why the last lease was lost.
    pub(crate) lost: LossReason,
    /// The raw token values of every lease (no log line may contain them; read by the test).
    #[allow(dead_code)]
    pub(crate) tokens: Vec<String>,
}

/// Wakes the demo when an acquisition attempt finds the lock held. Paired with [`MetricsObserver`] on the
/// manager: `with_observer((MetricsObserver::new(), seen))`.
#[derive(Clone, Default)]
struct ContentionSeen(Arc<Notify>);

impl Observer for ContentionSeen {
    fn event(&self, e: &LeaseEvent<'_>) {
        if let EventKind::Attempt {
            outcome: AttemptOutcome::Failed(NotAcquiredReason::Contended),
            ..
        } = e.kind
        {
            self.0.notify_one();
        }
    }
}

/// The observability a service sets up once at start: spans and events to `writer` (stdout in `main`;
/// debug and above, so contention shows; span closes too, with their recorded outcome), metrics into a
/// Prometheus recorder, served at `/metrics` on `addr`.
pub(crate) fn observe<W>(writer: W, addr: &str) -> Result<(PrometheusHandle, SocketAddr), BoxError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(writer)
        .try_init()?;
    let handle = PrometheusBuilder::new().install_recorder()?;
    let addr = serve_metrics(handle.clone(), addr)?;
    Ok((handle, addr))
}

/// A minimal HTTP endpoint: every request gets the current metrics in the Prometheus text format. (A service
/// with an HTTP framework would route `/metrics` to `handle.render()` instead; the exporter's own
/// `http-listener` feature does the same with hyper.)
pub(crate) fn serve_metrics(handle: PrometheusHandle, addr: &str) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // Read the request head; its content does not matter.
            let mut reader = BufReader::new(&mut stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let body = handle.render();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(local)
}

/// The manager: one node over redis-rs, traced per call; background renewal on tokio; metrics plus the
/// demo's own observer.
async fn manager(url: &str, seen: ContentionSeen) -> Result<LockManager, BoxError> {
    let node = Traced::new(common::node(url).await?);
    let config = Config::default()
        .with_expiry(TTL)
        .with_operation_timeout(OP_TIMEOUT)
        .with_retry_delay(RETRY_DELAY);
    Ok(LockManager::single(node, config)?
        .with_spawner(|task| {
            tokio::spawn(task);
        })
        .with_observer((MetricsObserver::new(), seen)))
}

/// `CLIENT PAUSE <ms> WRITE` (`Some`) or `CLIENT UNPAUSE` (`None`) on the admin connection.
async fn pause(
    admin: &mut redis::aio::MultiplexedConnection,
    ms: Option<u64>,
) -> Result<(), BoxError> {
    let mut cmd = redis::cmd("CLIENT");
    match ms {
        Some(ms) => cmd.arg("PAUSE").arg(ms).arg("WRITE"),
        None => cmd.arg("UNPAUSE"),
    };
    cmd.query_async::<()>(admin).await?;
    Ok(())
}

/// Polls `lease` until `want` holds for its state.
async fn wait_for(
    lease: &Lease,
    what: &str,
    want: impl Fn(LeaseState) -> bool,
) -> Result<(), BoxError> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !want(lease.state()) {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{what}: still {:?} after {PATIENCE:?}", lease.state()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The three situations, against the Redis at `url`.
pub(crate) async fn run(url: &str) -> Result<Report, BoxError> {
    let seen = ContentionSeen::default();
    let manager = manager(url, seen.clone()).await?;
    let mut admin = common::connection(url).await?;
    let mut tokens = Vec::new();

    // 1. Contention: a second acquisition waits while the first holds the lock.
    let report = manager.lock(REPORT_KEY);
    let holder = report.try_acquire().await?;
    tokens.push(holder.token().as_str().to_owned());
    let waiter = tokio::spawn({
        let report = report.clone();
        async move { report.acquire_within(PATIENCE).await }
    });
    tokio::time::timeout(PATIENCE, seen.0.notified())
        .await
        .map_err(|_| "the waiter never found the lock held")?;
    holder.release().await?;
    let lease = waiter.await??;
    tokens.push(lease.token().as_str().to_owned());
    lease.release().await?;

    // 2. A renewal failure: writes are paused until renewal reports the lease at risk, then resumed, and
    //    the next renewal round recovers it.
    let lease = manager
        .lock(JOB_KEY)
        .auto_renew(RENEW_EVERY)
        .try_acquire()
        .await?;
    tokens.push(lease.token().as_str().to_owned());
    pause(&mut admin, Some(60_000)).await?;
    let at_risk = wait_for(&lease, "at risk", |s| s == LeaseState::AtRisk).await;
    pause(&mut admin, None).await?;
    at_risk?;
    wait_for(&lease, "recovered", |s| s == LeaseState::Held).await?;

    // 3. A loss: writes stay paused past the lease's validity.
    pause(&mut admin, Some(60_000)).await?;
    let lost = tokio::time::timeout(PATIENCE, lease.lost()).await;
    pause(&mut admin, None).await?;
    let lost = lost.map_err(|_| "the lease was not lost")?;
    // Releasing a lost lease reports the loss (and deletes its token if it is still there).
    match lease.release().await {
        Err(e) if e.is_lost() => {}
        other => return Err(format!("release after the loss: {other:?}").into()),
    }
    Ok(Report { lost, tokens })
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (handle, addr) = observe(std::io::stdout, "127.0.0.1:0")?;
    println!("metrics at http://{addr}/metrics");
    let servers = common::servers(1)?;
    let report = run(&servers.urls[0]).await?;
    println!("lost the last lease: {}", report.lost);
    println!("\n{}", handle.render());
    Ok(())
}
