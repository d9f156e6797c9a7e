//! [`Reply`], the client-neutral view of a reply, and the interpretation of the scripts' replies.

use std::time::Duration;

use redlease::{KeyState, NodeError, NodeErrorKind};

use super::Script;
use super::batch::ACQUIRE_MANY;
use super::lock::{ACQUIRE_FENCED, ACQUIRE_TTL, INSPECT};
use super::native::{SET_NX, TRANSACTION};
use super::permit::{PERMIT, RW_PERMIT};

/// A client-neutral view of a script reply, built by each adapter from its client's value type — and by a
/// node of your own from its client's, to interpret replies with the `parse_*` functions of this module.
/// (An error reply is not a `Reply`: classify its line with [`server_error_kind`](super::server_error_kind).)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// A nil bulk string or nil array (RESP3 null).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk or simple string.
    Bytes(Vec<u8>),
    /// An array.
    Array(Vec<Reply>),
    /// Any other RESP type, by name (it is never a valid answer of a script).
    Other(&'static str),
}

pub(super) fn unexpected(script: &Script, reply: &Reply) -> NodeError {
    let noun = script.noun();
    // The reply of a script that ran: the command may have taken effect.
    let shape = match reply {
        Reply::Nil => "nil",
        Reply::Int(_) => "an integer",
        Reply::Bytes(_) => "a string",
        Reply::Array(_) => "an array",
        Reply::Other(name) => name,
    };
    NodeError::ambiguous(
        NodeErrorKind::Protocol,
        format!("unexpected reply to the {} {noun}: {shape}", script.name),
    )
}

fn parse_int(script: &Script, reply: &Reply) -> Result<i64, NodeError> {
    match reply {
        Reply::Int(n) => Ok(*n),
        Reply::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(script, reply)),
        _ => Err(unexpected(script, reply)),
    }
}

/// Replies 1 / 0 of [`ACQUIRE`](super::ACQUIRE), [`ACQUIRE_FRESH`](super::ACQUIRE_FRESH), [`RELEASE`](super::RELEASE) and [`EXTEND`](super::EXTEND): `true` for 1. Any other reply
/// is an ambiguous [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_flag(script: &Script, reply: Reply) -> Result<bool, NodeError> {
    match parse_int(script, &reply)? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`EXTEND_MANY`](super::EXTEND_MANY) for `n` keys: an array of n flags, each 1 or 0.
pub fn parse_flags(script: &Script, reply: Reply, n: usize) -> Result<Vec<bool>, NodeError> {
    match reply {
        Reply::Array(items) if items.len() == n => items
            .into_iter()
            .map(|item| parse_flag(script, item))
            .collect(),
        other => Err(unexpected(script, &other)),
    }
}

/// The reply of `SET key token NX GET PX ttl`: nil when the key was absent (now set), the old value when it
/// exists (nothing changed).
pub fn parse_set_nx_get(reply: Reply) -> Result<bool, NodeError> {
    match &reply {
        Reply::Nil => Ok(true),
        Reply::Bytes(_) => Ok(false),
        _ => Err(unexpected(&SET_NX, &reply)),
    }
}

/// The reply of a conditional `SET` (`NX` or `IFEQ`, without `GET`): `OK` when it was set, nil when not.
pub(crate) fn parse_set_ok(script: &Script, reply: Reply) -> Result<bool, NodeError> {
    match &reply {
        Reply::Nil => Ok(false),
        Reply::Bytes(b) if b.as_slice() == b"OK" => Ok(true),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The `[value or nil, pttl]` of `MULTI GET PTTL EXEC`, read like [`parse_inspect`].
pub(crate) fn parse_inspect_tx(reply: Vec<Reply>) -> Result<Option<KeyState>, NodeError> {
    match <[Reply; 2]>::try_from(reply) {
        Ok([Reply::Nil, _]) => Ok(None),
        Ok([value, pttl]) => parse_inspect(Reply::Array(vec![value, pttl])).map_err(|_| {
            unexpected(
                &TRANSACTION,
                &Reply::Other("a GET/PTTL pair of the wrong shape"),
            )
        }),
        Err(items) => Err(unexpected(&TRANSACTION, &Reply::Array(items))),
    }
}

/// An integer reply (or a decimal string) of a plain command.
pub(crate) fn parse_integer(script: &Script, reply: &Reply) -> Result<i64, NodeError> {
    parse_int(script, reply)
}

/// A reply of the wrong shape to `script` (ambiguous: the command ran).
pub(crate) fn unexpected_reply(script: &Script, reply: &Reply) -> NodeError {
    unexpected(script, reply)
}

/// The reply of [`ACQUIRE_TTL`]: taken, or held with the holder's remaining TTL (`None`: no expiry).
pub fn parse_claim(reply: Reply) -> Result<redlease::Claim, NodeError> {
    let script = &ACQUIRE_TTL;
    match parse_int(script, &reply)? {
        1 => Ok(redlease::Claim::Taken),
        0 => Ok(redlease::Claim::Held { remaining: None }),
        n if n < 0 => Ok(redlease::Claim::Held {
            remaining: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`PERMIT`] to operation `op`: 1 done; 0 not held (`extend`, `release`); `-1 - ms` full
/// (`acquire`), the earliest permit expiring in `ms`. Any other reply is an ambiguous
/// [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_permit(
    op: redlease::PermitOp<'_>,
    reply: Reply,
) -> Result<redlease::PermitReply, NodeError> {
    use redlease::{PermitOp, PermitReply};
    let script = &PERMIT;
    let acquire = matches!(op, PermitOp::Acquire { .. });
    match parse_int(script, &reply)? {
        1 => Ok(PermitReply::Done),
        0 if !acquire => Ok(PermitReply::NotHeld),
        n if n < 0 && acquire => Ok(PermitReply::Full {
            next_expiry: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`RW_PERMIT`]: 1 taken; `-1 - ms` blocked, the earliest blocking entry expiring in `ms`; a
/// fenced writer's grant, the fence as a string ([`PermitReply::Fenced`](redlease::PermitReply::Fenced)). Any
/// other reply is an ambiguous [`NodeErrorKind::Protocol`] error (the script ran).
pub fn parse_rw_permit(reply: Reply) -> Result<redlease::PermitReply, NodeError> {
    let script = &RW_PERMIT;
    if let Reply::Bytes(b) = &reply {
        return std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .map(|fence| redlease::PermitReply::Fenced { fence })
            .ok_or_else(|| unexpected(script, &reply));
    }
    match parse_int(script, &reply)? {
        1 => Ok(redlease::PermitReply::Done),
        n if n < 0 => Ok(redlease::PermitReply::Full {
            next_expiry: Some(Duration::from_millis((-1 - n).unsigned_abs())),
        }),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`ACQUIRE_FENCED`]: the fence as a string (exact above 2^53) or nil when contended.
pub fn parse_fence(reply: Reply) -> Result<Option<u64>, NodeError> {
    let script = &ACQUIRE_FENCED;
    match &reply {
        Reply::Nil => Ok(None),
        Reply::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .map(Some)
            .ok_or_else(|| unexpected(script, &reply)),
        Reply::Int(n) if *n >= 1 => Ok(Some(n.unsigned_abs())),
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`ACQUIRE_MANY`] for `n` keys: `{1, fences…}` (`''` for an unfenced key) or `{0, i, pttl}`.
pub fn parse_acquire_many(reply: Reply, n: usize) -> Result<redlease::MultiKeyReply, NodeError> {
    let script = &ACQUIRE_MANY;
    let Reply::Array(items) = &reply else {
        return Err(unexpected(script, &reply));
    };
    match items.first() {
        Some(Reply::Int(1)) if items.len() == n + 1 => items[1..]
            .iter()
            .map(|item| match item {
                Reply::Bytes(b) if b.is_empty() => Ok(None),
                other => parse_fence(other.clone())
                    .ok()
                    .flatten()
                    .map(Some)
                    .ok_or_else(|| unexpected(script, &reply)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|fences| redlease::MultiKeyReply::Taken { fences }),
        Some(Reply::Int(0)) if items.len() == 3 => {
            let index = parse_int(script, &items[1])?;
            let pttl = parse_int(script, &items[2])?;
            match usize::try_from(index) {
                Ok(index) if index < n => Ok(redlease::MultiKeyReply::Held {
                    index,
                    remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                }),
                _ => Err(unexpected(script, &reply)),
            }
        }
        _ => Err(unexpected(script, &reply)),
    }
}

/// The reply of [`INSPECT`]: nil for a missing key, else `[value, pttl]`.
pub fn parse_inspect(reply: Reply) -> Result<Option<KeyState>, NodeError> {
    let script = &INSPECT;
    match reply {
        Reply::Nil => Ok(None),
        Reply::Array(items) => match <[Reply; 2]>::try_from(items) {
            Ok([Reply::Bytes(value), pttl]) => {
                let ms = parse_int(script, &pttl)?;
                let ttl = match ms {
                    // -1: no expiry. (-2, key absent, cannot happen after GET found it.)
                    -1 => None,
                    ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
                    _ => return Err(unexpected(script, &pttl)),
                };
                Ok(Some(KeyState::new(value, ttl)))
            }
            Ok(other) => Err(unexpected(script, &Reply::Array(other.into()))),
            Err(items) => Err(unexpected(script, &Reply::Array(items))),
        },
        other => Err(unexpected(script, &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::ACQUIRE;

    #[test]
    fn flags_parse_integers_and_reject_other_shapes() {
        assert!(parse_flag(&ACQUIRE, Reply::Int(1)).unwrap());
        assert!(!parse_flag(&ACQUIRE, Reply::Int(0)).unwrap());
        let err = parse_flag(&ACQUIRE, Reply::Int(2)).unwrap_err();
        assert!(err.is_ambiguous());
        assert_eq!(err.kind(), NodeErrorKind::Protocol);
        assert!(parse_flag(&ACQUIRE, Reply::Nil).is_err());
    }

    #[test]
    fn fences_parse_exactly_above_two_to_the_53() {
        let big = (1u64 << 62) + 1;
        assert_eq!(
            parse_fence(Reply::Bytes(big.to_string().into_bytes())).unwrap(),
            Some(big)
        );
        assert_eq!(parse_fence(Reply::Nil).unwrap(), None);
        assert_eq!(parse_fence(Reply::Int(7)).unwrap(), Some(7));
        assert!(parse_fence(Reply::Bytes(b"0".to_vec())).is_err());
        assert!(parse_fence(Reply::Bytes(b"-3".to_vec())).is_err());
        assert!(parse_fence(Reply::Int(0)).is_err());
    }

    #[test]
    fn inspect_parses_value_and_ttl() {
        let state = parse_inspect(Reply::Array(vec![
            Reply::Bytes(b"abc".to_vec()),
            Reply::Int(1500),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(state.value, b"abc");
        assert_eq!(state.ttl, Some(Duration::from_millis(1500)));
        let persistent = parse_inspect(Reply::Array(vec![
            Reply::Bytes(b"v".to_vec()),
            Reply::Int(-1),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(persistent.ttl, None);
        assert_eq!(parse_inspect(Reply::Nil).unwrap(), None);
        assert!(parse_inspect(Reply::Array(vec![Reply::Int(1)])).is_err());
        assert!(parse_inspect(Reply::Int(1)).is_err());
    }

    #[test]
    fn permit_replies_parse_by_operation() {
        use redlease::{PermitOp, PermitReply};
        let acquire = PermitOp::Acquire { permits: 2 };
        assert_eq!(
            parse_permit(acquire, Reply::Int(1)).unwrap(),
            PermitReply::Done
        );
        assert_eq!(
            parse_permit(acquire, Reply::Int(-1001)).unwrap(),
            PermitReply::Full {
                next_expiry: Some(Duration::from_millis(1000))
            }
        );
        assert_eq!(
            parse_permit(acquire, Reply::Int(-1)).unwrap(),
            PermitReply::Full {
                next_expiry: Some(Duration::ZERO)
            }
        );
        for op in [PermitOp::Extend, PermitOp::Release] {
            assert_eq!(parse_permit(op, Reply::Int(1)).unwrap(), PermitReply::Done);
            assert_eq!(
                parse_permit(op, Reply::Int(0)).unwrap(),
                PermitReply::NotHeld
            );
            let err = parse_permit(op, Reply::Int(-5)).unwrap_err();
            assert!(err.is_ambiguous(), "{err}");
        }
        // An acquisition never answers "not held".
        assert!(parse_permit(acquire, Reply::Int(0)).is_err());
        assert!(parse_permit(acquire, Reply::Nil).is_err());
    }
}
