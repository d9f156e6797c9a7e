//! The start-up check ([`LockManager::check`]): every node contacted once, and what it found reported per
//! node, so that a wrong password, a down server or a missing permission shows at boot rather than at the
//! first lock.

use std::fmt;
use std::time::Duration;

use crate::driver::BoxFuture;
use crate::error::Error;
use crate::machine::WaitFor;
use crate::manager::LockManager;
pub use crate::node::readiness::{CommandPaths, Path, Readiness};
use crate::node::{NodeError, RedisNode};

/// One node's part of a [`CheckReport`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeCheck {
    /// The node's position in the manager (the order it was given in).
    pub index: usize,
    /// The node's [endpoint](crate::NodeProfile::endpoint), if it reports one (never with credentials).
    pub endpoint: Option<String>,
    /// What the check found.
    pub readiness: Readiness,
}

/// What [`LockManager::check`] found on every node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CheckReport {
    /// One entry per node, in the manager's order.
    pub nodes: Vec<NodeCheck>,
    /// Nodes that must be ready for a lease to be granted (1 in single mode, the majority in Redlock mode).
    pub quorum: usize,
}

impl CheckReport {
    /// Whether every node is ready.
    pub fn all_ready(&self) -> bool {
        self.nodes.iter().all(|n| n.readiness.is_ready())
    }

    /// Whether at least a quorum of nodes is ready: leases can be granted now (a Redlock service may start
    /// with a minority down).
    pub fn quorum_ready(&self) -> bool {
        self.nodes.iter().filter(|n| n.readiness.is_ready()).count() >= self.quorum
    }

    /// The nodes that are not ready.
    pub fn failed(&self) -> impl Iterator<Item = &NodeCheck> {
        self.nodes.iter().filter(|n| !n.readiness.is_ready())
    }
}

impl fmt::Display for CheckReport {
    /// One line per node: `node 0 (redis://10.0.0.1:6379/0): ready (acquire native, …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, node) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "node {}", node.index)?;
            if let Some(endpoint) = &node.endpoint {
                write!(f, " ({endpoint})")?;
            }
            write!(f, ": {}", node.readiness)?;
        }
        Ok(())
    }
}

/// The least time [`LockManager::check`] gives each node (the operation timeout when that is longer).
pub const CHECK_TIMEOUT_FLOOR: Duration = Duration::from_secs(2);

impl LockManager {
    /// The start-up check: contacts every node once, concurrently, and reports per node whether it is
    /// reachable, accepts the login, and lets the user run what a lease needs, and which commands it will
    /// use ([`CheckReport`]). Writes nothing.
    ///
    /// `example_key` stands for the lock keys (choose one the ACL's key patterns allow, as real lock keys
    /// must be). Each node's check is bounded by the configuration's operation timeout or
    /// [`CHECK_TIMEOUT_FLOOR`] (2 s), whichever is longer — at start-up a first connection and its
    /// capability check may take longer than one operation on a warm connection, and nothing waits on the
    /// check but the start-up itself; a node that does not answer in time is
    /// [`Unreachable`](Readiness::Unreachable). Nodes with a check of their own
    /// ([`RedisNode::readiness`]: both adapters) report their command paths and the checked connection
    /// serves the first lease; others are asked to read `example_key`.
    ///
    /// ```
    /// use redlease::{CheckReport, LockManager};
    ///
    /// async fn start(manager: &LockManager) -> Result<(), Box<dyn std::error::Error>> {
    ///     let report: CheckReport = manager.check("jobs:{nightly}:lock").await?;
    ///     if !report.quorum_ready() {
    ///         return Err(format!("Redis is not ready for leases:\n{report}").into());
    ///     }
    ///     for node in report.failed() {
    ///         eprintln!("running without node {}: {}", node.index, node.readiness);
    ///     }
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or too long `example_key`, before anything is sent. What the nodes
    /// answer is in the report, never an error.
    pub async fn check(&self, example_key: &str) -> Result<CheckReport, Error> {
        crate::config::check_key("lock", example_key)?;
        let engine = self.engine();
        let config = &engine.config;
        let timeout: Duration = config
            .operation_timeout_for(config.expiry())
            .max(CHECK_TIMEOUT_FLOOR);
        let r = engine
            .round(
                WaitFor::All,
                false,
                timeout,
                |_, node| -> BoxFuture<'_, Result<Readiness, NodeError>> {
                    Box::pin(async move { Ok(readiness(node, example_key).await) })
                },
                |_| true,
            )
            .await;
        let nodes = r
            .values
            .into_iter()
            .enumerate()
            .map(|(index, value)| NodeCheck {
                index,
                endpoint: engine.profiles[index].endpoint.clone(),
                readiness: value
                    .unwrap_or_else(|| Readiness::Unreachable(NodeError::timed_out(timeout))),
            })
            .collect();
        Ok(CheckReport {
            nodes,
            quorum: engine.quorum(),
        })
    }
}

/// A node's own check, or a read for a node without one.
async fn readiness(node: &dyn RedisNode, key: &str) -> Readiness {
    match node.readiness(key).await {
        Readiness::Unknown => match node.inspect(key).await {
            Ok(_) => Readiness::Answered,
            Err(e) => Readiness::from_error(e),
        },
        found => found,
    }
}
