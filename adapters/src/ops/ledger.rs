//! The node's write ledger and gates: which keys were written in which connection generation (for
//! `WAIT`), how a write operation records itself ([`recorded`]), and the guards of the transaction gate
//! and the capability check's turn.

use std::future::Future;

use redlease::NodeError;

use super::Transport;
use super::probe::Probe;

/// The node's transaction gate, held by one call at a time (see [`Probe::tx_gate`]); given back when dropped.
///
/// A call that sends `WATCH` says so ([`watching`](Self::watching)) and says when its `EXEC` or `UNWATCH`
/// answered ([`unwatched`](Self::unwatched)). Dropped in between — the call was cut, its `WATCH` still armed
/// on the connection — the gate leaves that key with the node, and the next holder ends the `WATCH` first
/// ([`super::gate`]): otherwise it would abort the next `EXEC` on that connection, another call's.
pub(crate) struct TxGate<'a> {
    pub(super) probe: &'a Probe,
    pub(super) watching: Option<String>,
}

impl TxGate<'_> {
    /// A `WATCH` of `key` (routed by it) is about to be sent.
    pub(crate) fn watching(&mut self, key: &str) {
        self.watching = Some(key.to_owned());
    }

    /// The `WATCH` ended: its `EXEC` or `UNWATCH` answered (or failed with the connection).
    pub(crate) fn unwatched(&mut self) {
        self.watching = None;
    }
}

impl Drop for TxGate<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut state = self.probe.lock();
            if let Some(key) = self.watching.take() {
                state.stale_watch = Some(key);
            }
            state.tx_busy = false;
            std::mem::take(&mut state.tx_waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

/// The turn of the one call that runs a connection's capability check while the others wait for its answer
/// (so that N calls made at once on an unchecked connection send one check, not N). Given back when dropped,
/// also when the call is cut: a waiter then runs the check itself if no answer was remembered.
pub(crate) struct CheckTurn<'a>(pub(super) &'a Probe);

impl Drop for CheckTurn<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut state = self.0.lock();
            state.checking = false;
            std::mem::take(&mut state.check_waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

/// How many keys each set of [`Writes`] holds before it is replaced by a fresh one.
pub(super) const WRITES_KEPT: usize = 1024;

/// The keys written in the current connection generation (`fresh`) and in an earlier one (`stale`), for
/// [`wait_replicas`](super::wait_replicas): a `WAIT` for a stale key would not count its write. O(1) per write (no allocation for a
/// key written again); each kind is two sets, the newer replaced by a fresh one once it holds
/// [`WRITES_KEPT`] keys, so the last `WRITES_KEPT` writes of each kind are always known (a `WAIT` follows its
/// write at once; an older key forgotten is waited for as before).
#[derive(Default)]
pub(super) struct Writes {
    fresh: [std::collections::HashSet<String>; 2],
    stale: [std::collections::HashSet<String>; 2],
}

impl Writes {
    pub(super) fn add(sets: &mut [std::collections::HashSet<String>; 2], key: &str) {
        if sets[0].contains(key) {
            return;
        }
        if sets[0].len() >= WRITES_KEPT {
            sets[1] = std::mem::take(&mut sets[0]);
        }
        sets[0].insert(key.to_owned());
    }

    /// `key` was written in the current generation (`current`) or in an earlier one.
    pub(super) fn wrote(&mut self, key: &str, current: bool) {
        let (add, remove) = if current {
            (&mut self.fresh, &mut self.stale)
        } else {
            (&mut self.stale, &mut self.fresh)
        };
        // Not hashed for empty sets (the stale ones nearly always are): a write is recorded on every
        // acquisition and extension.
        for set in remove.iter_mut().filter(|set| !set.is_empty()) {
            set.remove(key);
        }
        Self::add(add, key);
    }

    /// The connection was replaced: every key written so far is stale.
    pub(super) fn replaced(&mut self) {
        let fresh = std::mem::take(&mut self.fresh);
        for key in fresh.iter().flatten() {
            Self::add(&mut self.stale, key);
        }
    }

    pub(super) fn is_stale(&self, key: &str) -> bool {
        self.stale.iter().any(|set| set.contains(key))
    }
}

// The write operations, recording the connection generation each key was written in (for `wait_replicas`).
// The generation is taken before the write is sent, after acting on reconnections the client announced: a
// reconnect noticed while it is on its way makes the `WAIT` after it fail rather than count another
// connection's writes.

/// Runs the write `op` makes on `key` and records it when `wrote` says the key now holds our token. `op` is
/// called after the generation is read, so nothing is sent before.
///
/// `op` makes the future here rather than being one: a future passed in is kept twice in the future that
/// awaits it (as captured, and as moved into the place it is polled from), and it is the whole operation, a
/// client's command future included (fred's alone is about 5 KB), so the node's boxed future would be twice
/// as large, allocated and copied on every call. (Not an `async fn` either, which keeps its arguments twice
/// too.)
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future; an async block, once"
)]
pub(super) fn recorded<T, F>(
    t: &impl Transport,
    key: &str,
    op: impl FnOnce() -> F,
    wrote: impl FnOnce(&T) -> bool,
) -> impl Future<Output = Result<T, NodeError>>
where
    F: Future<Output = Result<T, NodeError>>,
{
    async move {
        t.notice_reconnections();
        let generation = t.probe().generation();
        let r = op().await;
        if r.as_ref().is_ok_and(wrote) {
            t.probe().wrote(key, generation);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_before_a_noticed_reconnect_are_stale_until_written_again() {
        let probe = Probe::default();
        let before = probe.generation();
        probe.wrote("a", before);
        assert!(!probe.written_before_a_reconnect("a"));
        probe.forget();
        assert!(
            probe.written_before_a_reconnect("a"),
            "written on the replaced connection"
        );
        // A write whose generation was taken before the reconnect counts as on the old connection.
        probe.wrote("b", before);
        assert!(probe.written_before_a_reconnect("b"));
        probe.wrote("a", probe.generation());
        assert!(
            !probe.written_before_a_reconnect("a"),
            "written again on the new one"
        );
        assert!(!probe.written_before_a_reconnect("never written"));
        // A refused command forgets the checks, not the connection.
        probe.wrote("c", probe.generation());
        probe.forget_checks();
        assert!(!probe.written_before_a_reconnect("c"));
        // Bounded: the most recent writes are always known, however many keys were written.
        for i in 0..3 * WRITES_KEPT {
            probe.wrote(&format!("k{i}"), probe.generation());
        }
        probe.forget();
        assert!(probe.written_before_a_reconnect(&format!("k{}", 3 * WRITES_KEPT - 1)));
        assert!(probe.written_before_a_reconnect(&format!("k{}", 2 * WRITES_KEPT)));
        let state = probe.lock();
        assert!(
            state
                .writes
                .stale
                .iter()
                .all(|set| set.len() <= WRITES_KEPT)
        );
    }

    /// A write whose generation was taken before the call opened the node's first connection went on that
    /// connection: it counts for `WAIT`. A connection lost (noticed) or replaced unnoticed does not.
    #[test]
    fn the_first_write_on_a_newly_opened_connection_counts_for_wait() {
        let probe = Probe::default();
        let before = probe.generation();
        probe.opened();
        probe.wrote("first", before);
        assert!(!probe.written_before_a_reconnect("first"));
        // Lost, then opened again: the write on the lost one is stale, one made after the loss is not.
        probe.forget();
        let after_loss = probe.generation();
        probe.opened();
        probe.wrote("second", after_loss);
        assert!(probe.written_before_a_reconnect("first"));
        assert!(!probe.written_before_a_reconnect("second"));
        // Opened again with no loss noticed (replaced): the writes before are stale.
        probe.opened();
        assert!(probe.written_before_a_reconnect("second"));
    }
}
