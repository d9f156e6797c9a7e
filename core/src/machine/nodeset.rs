//! A set of node indices.

/// A set of node indices, `Copy` and allocation-free: nodes from the 65th on are never members (callers
/// treat that as "unknown" and fall back to what is safe without the set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeSet(u64);

impl NodeSet {
    /// The empty set.
    pub(crate) const EMPTY: NodeSet = NodeSet(0);

    /// The set of `indices` (those under 64).
    pub(crate) fn of(indices: impl IntoIterator<Item = usize>) -> Self {
        let mut set = Self::EMPTY;
        for i in indices {
            set.insert(i);
        }
        set
    }

    /// Whether node `i` is a member.
    pub(crate) fn contains(self, i: usize) -> bool {
        i < 64 && self.0 >> i & 1 == 1
    }

    /// Adds node `i` (nothing for `i` ≥ 64).
    pub(crate) fn insert(&mut self, i: usize) {
        if i < 64 {
            self.0 |= 1 << i;
        }
    }

    /// Removes node `i`.
    pub(crate) fn remove(&mut self, i: usize) {
        if i < 64 {
            self.0 &= !(1 << i);
        }
    }

    /// The members as bits (bit `i`: node `i`), for a [`LeaseTicket`](crate::LeaseTicket).
    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// The set whose members are the bits of `bits`.
    pub(crate) fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// Whether no node is a member.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_under_64_only() {
        let mut s = NodeSet::of([0, 2, 63, 64, 100]);
        assert!(s.contains(0) && s.contains(2) && s.contains(63));
        assert!(!s.contains(1) && !s.contains(64) && !s.contains(100));
        s.remove(2);
        s.remove(0);
        s.remove(63);
        assert!(s.is_empty());
    }

    #[test]
    fn removing_keeps_the_other_members_and_ignores_indices_past_63() {
        let mut s = NodeSet::of([0, 2, 5, 63]);
        s.remove(2);
        assert!(s.contains(0) && !s.contains(2) && s.contains(5) && s.contains(63));
        s.remove(64);
        s.remove(1_000);
        assert_eq!(s, NodeSet::of([0, 5, 63]));
        assert!(!s.is_empty());
        assert!(NodeSet::EMPTY.is_empty() && NodeSet::of([64]).is_empty());
    }

    #[test]
    fn bits_round_trip() {
        let s = NodeSet::of([1, 4, 63]);
        assert_eq!(s.bits(), (1 << 1) | (1 << 4) | (1 << 63));
        assert_eq!(NodeSet::from_bits(s.bits()), s);
        assert_eq!(NodeSet::from_bits(0b101), NodeSet::of([0, 2]));
    }
}
