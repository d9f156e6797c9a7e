//! Which algorithm a manager runs: [`Mode`]. A leaf: it depends on nothing else in the crate.

/// Single authority or Redlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// One logical Redis authority; fencing tokens available.
    Single,
    /// An odd number (≥ 3) of independent primaries; majority acquisition and renewal, no fencing.
    Redlock,
}
