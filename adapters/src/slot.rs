//! Redis Cluster hash slots, computed client-side so that a fenced lock whose two keys live in different slots
//! is rejected before any command is sent.
//!
//! ```
//! use redlease_adapters::slot::{hash_slot, same_slot};
//!
//! assert_eq!(hash_slot(b"123456789"), 12739);
//! // Only the part between the first `{` and the next `}` is hashed, when it is not empty.
//! assert!(same_slot("orders:{42}:lock", "orders:{42}:fence"));
//! assert!(!same_slot("orders:42:lock", "orders:42:fence"));
//! ```

use redlease::{NodeError, NodeErrorKind};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of `key` that Redis Cluster hashes: the bytes between the first `{` and the first `}` after it,
/// if that is not empty; otherwise the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}')
            && close > 0
        {
            return &rest[..close];
        }
    }
    key
}

/// The Redis Cluster hash slot of `key` (0..16384), honouring `{tag}`s like `CLUSTER KEYSLOT`.
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// Whether two keys hash to the same Redis Cluster slot.
pub fn same_slot(a: &str, b: &str) -> bool {
    hash_slot(a.as_bytes()) == hash_slot(b.as_bytes())
}

/// `Ok` when the lock and fence keys share a slot; otherwise a definite [`NodeErrorKind::CrossSlot`] error that
/// names both keys and their slots.
pub fn check_same_slot(key: &str, fence_key: &str) -> Result<(), NodeError> {
    let (a, b) = (hash_slot(key.as_bytes()), hash_slot(fence_key.as_bytes()));
    if a == b {
        return Ok(());
    }
    Err(NodeError::not_applied(
        NodeErrorKind::CrossSlot,
        format!(
            "lock key {key:?} (slot {a}) and fence key {fence_key:?} (slot {b}) hash to different Redis Cluster \
             slots; give them one hash tag, e.g. \"orders:{{42}}:lock\" and \"orders:{{42}}:fence\""
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_reference_vector() {
        // The check value of CRC-16/XMODEM, also quoted in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn slots_match_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
        assert_eq!(hash_slot(b""), 0);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
    }

    #[test]
    fn hash_tags_follow_the_cluster_rules() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"no-open}"), b"no-open}");
        assert_eq!(hash_tag(b"open{only"), b"open{only");
    }

    #[test]
    fn cross_slot_keys_give_a_definite_error_naming_both_keys() {
        assert!(check_same_slot("a:{t}:lock", "a:{t}:fence").is_ok());
        let err = check_same_slot("foo", "bar").unwrap_err();
        assert_eq!(err.kind(), NodeErrorKind::CrossSlot);
        assert!(!err.is_ambiguous());
        assert!(err.message().contains("\"foo\"") && err.message().contains("\"bar\""));
        assert!(err.message().contains("12182") && err.message().contains("5061"));
    }
}
