//! Durability waits (`WAIT` / `WAITAOF`) on connections of their own.
//!
//! The server serves nothing else on a connection while a `WAIT` blocks it, so a `WAIT` sent over the
//! connection a node shares between its leases would hold up every other lease and lock on that node for as
//! long as it waits (with a replica down: its whole timeout, one `WAIT` after the other). A node that can open
//! connections therefore sends each wait on a connection of its own, kept for the next wait once it answered
//! (a few are kept; one whose call was dropped half-way is closed, never reused).
//!
//! `WAIT` counts the writes of its own connection only: it waits until the replicas acknowledged the
//! replication offset of that connection's last write. So the wait connection first writes something that
//! is replicated and touches no key: `PUBLISH` on [`CHANNEL`] (outside a cluster the server replicates every
//! `PUBLISH`), pipelined right before the `WAIT`. The lease's write was answered before the wait starts,
//! so the `PUBLISH` runs after it, at a larger offset, and the `WAIT` covers the lease's write (checked on
//! Redis 7.0, Valkey 8.1 and 9.1: without the `PUBLISH` a fresh connection's `WAIT` answers at once with a
//! stopped replica counted).
//!
//! Where that cannot be shown, the wait goes over the shared connection as before ([`ops::wait_replicas`]):
//! the `PUBLISH` refused (a channel ACL), the server's run id unknown on either connection (`INFO` denied),
//! or no way to open a connection (a node built from a bare connection). A wait connection that reached
//! another server process than the one the node's connection learned (a restart or failover in between) is
//! never counted: the wait fails as not applied.
//!
//! [`ops::wait_replicas`]: crate::ops::wait_replicas

use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use redlease::{NodeError, NodeErrorKind, RunId};

use crate::scripts::Reply;

/// The channel of the wait connections' `PUBLISH` (nobody subscribes to it; the message is empty).
pub(crate) const CHANNEL: &str = "redlease:wait";

/// How many idle wait connections a node keeps (more are opened while more waits run at once, and closed
/// after them).
const IDLE_KEPT: usize = 4;

/// What a wait on a connection of its own answered: whether the `PUBLISH` before the `WAIT` was accepted
/// (if not, the `WAIT` counted nothing of ours), and the `WAIT` / `WAITAOF` reply.
#[derive(Debug)]
pub(crate) struct Apart {
    pub(crate) published: bool,
    pub(crate) reply: Result<Reply, NodeError>,
}

/// How a client adapter opens and uses wait connections.
pub(crate) trait Line: Send + Sync {
    /// A wait connection.
    type Conn: Send;

    /// Opens a wait connection to the server that carries `key` (no response timeout of its own shorter than
    /// a wait: the caller bounds the call).
    fn open(&self, key: &str) -> impl Future<Output = Result<Self::Conn, NodeError>> + Send;

    /// Sends `INFO server` on `conn`.
    fn info(&self, conn: &mut Self::Conn) -> impl Future<Output = Result<Reply, NodeError>> + Send;

    /// Sends `PUBLISH` on [`CHANNEL`] and `wait` pipelined behind it, once, on `conn`. An error: the pipeline
    /// failed as a whole (the connection is not reused).
    fn publish_and_wait(
        &self,
        conn: &mut Self::Conn,
        wait: &[&str],
    ) -> impl Future<Output = Result<Apart, NodeError>> + Send;

    /// The idle connections.
    fn idle(&self) -> &Idle<Self::Conn>;

    /// Closes `conn` (it is not kept).
    fn close(&self, conn: Self::Conn);
}

/// Runs the wait `wait` (whose server-side timeout is `timeout`) on a connection of `line`'s own whose server
/// has the run id `expected` (the one the node's connection learned before its write): an idle one, or a
/// new one. `None` when no such connection could be had or the `PUBLISH` was refused (the caller then waits
/// over the shared connection); otherwise the `WAIT`'s answer. The whole call is bounded by `timeout` plus
/// twice `allowance` (the node's response timeout: opening and asking `INFO`, then the pair's round trip),
/// so a wait connection that stopped answering cannot hold a caller that set no bound of its own.
pub(crate) async fn wait<L: Line>(
    line: &L,
    key: &str,
    wait: &[&str],
    expected: &RunId,
    timeout: Duration,
    allowance: Duration,
) -> Option<Result<Reply, NodeError>> {
    let bound = timeout.saturating_add(allowance.saturating_mul(2));
    match within(bound, wait_unbounded(line, key, wait, expected)).await {
        Some(answer) => answer,
        // The connection in use was dropped with the future, so it is not reused.
        None => Some(Err(NodeError::ambiguous(
            NodeErrorKind::Timeout,
            format!(
                "WAIT for replicas: no answer on the wait connection within {bound:?} (the wait's \
                 timeout and the response timeout)"
            ),
        ))),
    }
}

async fn wait_unbounded<L: Line>(
    line: &L,
    key: &str,
    wait: &[&str],
    expected: &RunId,
) -> Option<Result<Reply, NodeError>> {
    // An idle connection may have been closed meanwhile (the server's `timeout`, `CLIENT KILL`, a cut
    // link): then once more on a new one (`PUBLISH` and `WAIT` change no key, so sending them twice is
    // harmless).
    let mut reuse = true;
    loop {
        let (mut conn, reused) = connection(line, key, expected, reuse).await.ok()?;
        // The connection goes back only once it answered; dropped half-way (the caller gave up), it is
        // closed with this future, so no later wait queues behind a `WAIT` still blocking it.
        match line.publish_and_wait(&mut conn, wait).await {
            Ok(apart) => {
                if let Some(extra) = line.idle().put(conn, Some(expected.clone())) {
                    line.close(extra);
                }
                // A refused `PUBLISH` (a channel ACL): the `WAIT` counted nothing of ours.
                return apart.published.then_some(apart.reply);
            }
            Err(e) => {
                line.close(conn);
                if !reused {
                    return Some(Err(e));
                }
                reuse = false;
            }
        }
    }
}

/// `fut`'s output, or `None` if it did not finish within `bound` (on redlease's own timer, so on any
/// runtime).
async fn within<F: Future>(bound: Duration, fut: F) -> Option<F::Output> {
    use redlease::Timer as _;
    let mut sleep = redlease::SystemTimer.sleep_until(std::time::Instant::now() + bound);
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// A wait connection to the server process `expected`: an idle one (if `reuse`), or a new one; and whether
/// it was idle.
async fn connection<L: Line>(
    line: &L,
    key: &str,
    expected: &RunId,
    reuse: bool,
) -> Result<(L::Conn, bool), NodeError> {
    while reuse && let Some((conn, id)) = line.idle().take() {
        if id.is_some_and(|id| id.as_str() == expected.as_str()) {
            return Ok((conn, true));
        }
        // Opened to another server process (before a restart or failover): never used again.
        line.close(conn);
    }
    let mut conn = line.open(key).await?;
    let id = match line.info(&mut conn).await {
        Ok(reply) => run_id_in(&reply),
        Err(e) => {
            line.close(conn);
            return Err(e);
        }
    };
    if id.is_none_or(|id| id.as_str() != expected.as_str()) {
        line.close(conn);
        return Err(NodeError::not_applied(
            NodeErrorKind::Connection,
            "WAIT for replicas: a new wait connection reached another server process than the one the \
             node's connection wrote to, or could not tell which (not used)",
        ));
    }
    Ok((conn, false))
}

/// The idle wait connections of a node, shared by its clones, each with the run id learned when it opened.
pub(crate) struct Idle<C>(Mutex<Vec<(C, Option<RunId>)>>);

impl<C> Default for Idle<C> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<C> std::fmt::Debug for Idle<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Idle").field(&self.lock().len()).finish()
    }
}

impl<C> Idle<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(C, Option<RunId>)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection, if any.
    pub(crate) fn take(&self) -> Option<(C, Option<RunId>)> {
        self.lock().pop()
    }

    /// Keeps `conn` for the next wait; gives it back when enough are kept already (the caller closes it).
    pub(crate) fn put(&self, conn: C, run_id: Option<RunId>) -> Option<C> {
        let mut idle = self.lock();
        if idle.len() >= IDLE_KEPT {
            return Some(conn);
        }
        idle.push((conn, run_id));
        None
    }
}

/// The run id in an `INFO server` reply.
pub(crate) fn run_id_in(reply: &Reply) -> Option<RunId> {
    let Reply::Bytes(text) = reply else {
        return None;
    };
    String::from_utf8_lossy(text)
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(RunId::new)
}
