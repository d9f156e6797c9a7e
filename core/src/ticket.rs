//! Handing a held lease to another process: [`LeaseTicket`].

use std::fmt;
use std::str::FromStr;

use crate::mode::Mode;
use crate::token::{TOKEN_BYTES, Token};

/// A held lease, handed over: what another process needs to continue it with
/// [`Lock::resume`](crate::Lock::resume). Made by [`Lease::handoff`](crate::Lease::handoff).
///
/// It carries the key, the ownership token, the mode, the fencing token and, per node, what the lease may
/// still have in flight there — never a validity: the resuming process proves ownership with an extension
/// round of its own and counts validity from that round.
///
/// **The token is a secret**: whoever holds it can extend and release the lease. `Debug` and `Display` show
/// only its first four characters; [`encode`](Self::encode) gives the full text, to be passed only over a
/// channel trusted like the Redis password. A ticket resumes one lease: resuming it twice, in two processes,
/// makes two holders of one lease, as sharing a token would.
///
/// ```
/// # mod doc_support { include!("doc_support.rs"); } use doc_support::*;
/// use std::sync::Arc;
/// use redlease::{Config, LeaseTicket, LockManager};
///
/// # block_on(async {
/// let node = Arc::new(MapNode::default());
/// let dispatcher = LockManager::single(Arc::clone(&node), Config::default())?;
/// let lease = dispatcher.lock("job:42").try_acquire().await?;
/// let wire: String = lease.handoff()?.encode();
///
/// // In the worker (another process, with its own manager over the same node):
/// let worker = LockManager::single(node, Config::default())?;
/// let ticket: LeaseTicket = wire.parse()?;
/// let lease = worker.lock("job:42").resume(&ticket).await?;
/// assert!(lease.is_held());
/// lease.release().await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseTicket {
    pub(crate) key: String,
    pub(crate) token: Token,
    pub(crate) mode: Mode,
    pub(crate) fence: Option<u64>,
    /// Per node, the smallest TTL (ms) of a request of the lease that may still be applied there (0: none).
    pub(crate) pending: Box<[u64]>,
    /// Nodes that never confirmed holding the key (bit `i`: node `i`).
    pub(crate) missing: u64,
}

/// The version prefix of [`LeaseTicket::encode`]'s text.
const PREFIX: &str = "redlease-ticket-v1";

impl LeaseTicket {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The ownership token (print it only through its redacting `Debug`/`Display`).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// Single authority or Redlock: the ticket resumes only on a manager of the same mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The fencing token the lease was acquired with, for fenced locks; a resumed lease keeps it.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// How many nodes the lease was held on: the ticket resumes only on a manager with as many, in the
    /// same order.
    pub fn nodes(&self) -> usize {
        self.pending.len()
    }

    /// The ticket as one line of text, for a message queue, a database row or an environment variable;
    /// [`str::parse`] reads it back. **Contains the whole token**: treat it as a secret.
    pub fn encode(&self) -> String {
        let mode = match self.mode {
            Mode::Single => "s",
            Mode::Redlock => "r",
        };
        let fence = self.fence.map_or_else(|| "-".to_owned(), |f| f.to_string());
        let pending = self
            .pending
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut text = format!(
            "{PREFIX}.{mode}.{fence}.{:x}.{pending}.{}.{}",
            self.missing,
            self.token.hex_str(),
            hex::encode(self.key.as_bytes())
        );
        if let Some(info) = self.token.info() {
            text.push('.');
            text.push_str(&hex::encode(info.as_bytes()));
        }
        text
    }
}

impl fmt::Debug for LeaseTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseTicket")
            .field("key", &crate::error::ShortKey(&self.key).to_string())
            .field("token", &self.token)
            .field("mode", &self.mode)
            .field("fence", &self.fence)
            .field("nodes", &self.pending.len())
            .finish()
    }
}

impl fmt::Display for LeaseTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ticket for {} (token {})",
            crate::error::ShortKey(&self.key),
            self.token
        )
    }
}

/// Text that is not a [`LeaseTicket`] ([`LeaseTicket::encode`]'s output).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a lease ticket: {0}")]
pub struct TicketError(&'static str);

impl FromStr for LeaseTicket {
    type Err = TicketError;

    fn from_str(s: &str) -> Result<Self, TicketError> {
        let mut parts = s.trim().split('.');
        let mut next = |what: &'static str| parts.next().ok_or(TicketError(what));
        if next("empty")? != PREFIX {
            return Err(TicketError("unknown format or version"));
        }
        let mode = match next("no mode")? {
            "s" => Mode::Single,
            "r" => Mode::Redlock,
            _ => return Err(TicketError("unknown mode")),
        };
        let fence = match next("no fencing token")? {
            "-" => None,
            f => Some(f.parse().map_err(|_| TicketError("bad fencing token"))?),
        };
        let missing = u64::from_str_radix(next("no node set")?, 16)
            .map_err(|_| TicketError("bad node set"))?;
        let pending = next("no node list")?
            .split(',')
            .map(|t| t.parse::<u64>())
            .collect::<Result<Box<[u64]>, _>>()
            .map_err(|_| TicketError("bad node list"))?;
        if pending.is_empty() || pending.len() > 1024 {
            return Err(TicketError("bad node count"));
        }
        let token = next("no token")?;
        if token.len() != TOKEN_BYTES * 2
            || !token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(TicketError("bad token"));
        }
        let token = Token::from_hex(token).ok_or(TicketError("bad token"))?;
        let key = hex::decode(next("no key")?)
            .ok()
            .and_then(|k| String::from_utf8(k).ok())
            .ok_or(TicketError("bad key"))?;
        let info = match parts.next() {
            Some(info) => Some(
                hex::decode(info)
                    .ok()
                    .and_then(|i| String::from_utf8(i).ok())
                    .ok_or(TicketError("bad holder info"))?,
            ),
            None => None,
        };
        let token = token.with_info(info.as_deref());
        if parts.next().is_some() {
            return Err(TicketError("trailing data"));
        }
        Ok(Self {
            key,
            token,
            mode,
            fence,
            pending,
            missing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(key: &str, mode: Mode, fence: Option<u64>, pending: &[u64]) -> LeaseTicket {
        LeaseTicket {
            key: key.to_owned(),
            token: Token::random().unwrap_or_else(|_| unreachable!()),
            mode,
            fence,
            pending: pending.into(),
            missing: 0b100,
        }
    }

    #[test]
    fn encoding_round_trips_every_field() {
        for t in [
            ticket("job:42", Mode::Single, Some(7), &[0]),
            ticket("a.b.c:{x}", Mode::Redlock, None, &[0, 30_000, 5]),
            ticket("ünïcode key", Mode::Single, Some(u64::MAX), &[1]),
            LeaseTicket {
                token: Token::random()
                    .unwrap_or_else(|_| unreachable!())
                    .with_info(Some("host=a.b pid=1")),
                ..ticket("k", Mode::Single, None, &[0])
            },
        ] {
            let text = t.encode();
            assert_eq!(text.parse::<LeaseTicket>(), Ok(t));
        }
    }

    #[test]
    fn debug_and_display_never_show_the_token() {
        let t = ticket("job", Mode::Single, None, &[0]);
        let secret = t.token.as_str().to_owned();
        for shown in [format!("{t:?}"), t.to_string()] {
            assert!(!shown.contains(&secret[..8]), "{shown}");
            assert!(shown.contains("job"), "{shown}");
        }
        assert!(t.encode().contains(&secret));
    }

    #[test]
    fn malformed_text_is_a_typed_error() {
        let good = ticket("job", Mode::Redlock, None, &[0, 0, 0]).encode();
        let cut = &good[..good.len() - 1];
        let token = good.split('.').nth(5).unwrap_or_default().to_owned();
        for bad in [
            "",
            "nonsense",
            "redlease-ticket-v0.s.-.0.0.x.6a6f62",
            &good.replacen(".r.", ".q.", 1),
            &good.replacen(&token, &token.to_uppercase(), 1),
            &good.replacen(&token, &token[..39], 1),
            &format!("{good}.extra"),
            cut,
        ] {
            assert!(bad.parse::<LeaseTicket>().is_err(), "{bad:?} parsed");
        }
    }
}
