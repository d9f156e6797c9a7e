//! Validity arithmetic: how long a lease may be trusted after a round of node calls.
//!
//! `drift = ceil(ttl × drift_factor) + 2 ms` and `validity = ttl − elapsed − drift`, where `elapsed` runs from
//! the moment the first request of the round was sent. Every function saturates instead of overflowing and
//! never reports a positive validity when `elapsed + drift ≥ ttl`.

use std::time::{Duration, Instant};

use crate::node::Ttl;

// Defined beside `drift_factor` (config validation uses it, and config is below the machines).
pub use crate::config::{DRIFT_FLOOR, drift};

/// The remaining validity after a round that took `elapsed`: `ttl − elapsed − drift`, or `None` if that is
/// not strictly positive.
pub fn validity(ttl: Ttl, factor: f64, elapsed: Duration) -> Option<Duration> {
    ttl.as_duration()
        .checked_sub(elapsed)?
        .checked_sub(drift(ttl, factor))
        .filter(|v| !v.is_zero())
}

/// The instant a lease stops being valid, given the round's start: `start + ttl − drift`.
///
/// Returns `None` when the drift allowance is not smaller than the TTL or the instant is not representable.
pub fn valid_until(start: Instant, ttl: Ttl, factor: f64) -> Option<Instant> {
    let budget = ttl
        .as_duration()
        .checked_sub(drift(ttl, factor))
        .filter(|b| !b.is_zero())?;
    start.checked_add(budget)
}

/// Decides a finished round: the validity deadline if the round ended (at `now`) with positive validity,
/// measured from `start`.
pub fn deadline_after_round(
    start: Instant,
    now: Instant,
    ttl: Ttl,
    factor: f64,
) -> Option<Instant> {
    let elapsed = now.saturating_duration_since(start);
    validity(ttl, factor, elapsed)?;
    valid_until(start, ttl, factor).filter(|until| *until > now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ttl(ms: u64) -> Ttl {
        Ttl::from_millis(ms).unwrap()
    }

    #[test]
    fn drift_matches_the_reference_formula() {
        assert_eq!(drift(ttl(30_000), 0.01), Duration::from_millis(302));
        assert_eq!(drift(ttl(1), 0.01), Duration::from_millis(3));
        assert_eq!(drift(ttl(100), 0.0), Duration::from_millis(2));
        assert_eq!(drift(ttl(150), 0.01), Duration::from_millis(4));
    }

    #[test]
    fn validity_examples() {
        assert_eq!(
            validity(ttl(30_000), 0.01, Duration::from_millis(10)),
            Some(Duration::from_millis(29_688))
        );
        assert_eq!(validity(ttl(1), 0.01, Duration::ZERO), None);
        assert_eq!(
            validity(ttl(4), 0.01, Duration::ZERO),
            Some(Duration::from_millis(1))
        );
        assert_eq!(validity(ttl(4), 0.01, Duration::from_millis(1)), None);
        assert_eq!(validity(Ttl::MAX, 0.01, Duration::MAX), None);
    }

    #[test]
    fn edges_do_not_overflow() {
        let start = Instant::now();
        assert!(valid_until(start, Ttl::MAX, 0.0).is_some());
        assert!(valid_until(start, Ttl::MAX, 0.999_999).is_some());
        assert_eq!(valid_until(start, ttl(2), 0.01), None);
        assert_eq!(deadline_after_round(start, start, ttl(3), 0.01), None);
    }

    proptest! {
        #[test]
        fn validity_is_never_positive_when_elapsed_plus_drift_reaches_ttl(
            ms in 1u64..=Ttl::MAX.as_millis(),
            factor in 0.0f64..1.0,
            elapsed_ns in any::<u64>(),
            elapsed_s in prop_oneof![Just(0u64), any::<u64>()],
        ) {
            let t = ttl(ms);
            let elapsed = Duration::new(elapsed_s, (elapsed_ns % 1_000_000_000) as u32);
            let d = drift(t, factor);
            match validity(t, factor, elapsed) {
                Some(v) => {
                    prop_assert!(elapsed.saturating_add(d) < t.as_duration());
                    prop_assert_eq!(v + elapsed + d, t.as_duration());
                }
                None => prop_assert!(elapsed.saturating_add(d) >= t.as_duration()),
            }
        }

        #[test]
        fn deadline_is_consistent_with_validity(
            ms in 1u64..=10_000_000,
            factor in 0.0f64..1.0,
            elapsed_ms in 0u64..20_000_000,
        ) {
            let t = ttl(ms);
            let start = Instant::now();
            let now = start + Duration::from_millis(elapsed_ms);
            let deadline = deadline_after_round(start, now, t, factor);
            prop_assert_eq!(deadline.is_some(), validity(t, factor, now - start).is_some());
            if let Some(until) = deadline {
                prop_assert!(until > now);
                prop_assert_eq!(until - now, validity(t, factor, now - start).unwrap());
            }
        }

        #[test]
        fn drift_is_at_least_the_floor_and_monotonic_in_ttl(a in 1u64..=Ttl::MAX.as_millis(), b in 1u64..=Ttl::MAX.as_millis(), factor in 0.0f64..1.0) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(drift(ttl(lo), factor) >= DRIFT_FLOOR);
            prop_assert!(drift(ttl(lo), factor) <= drift(ttl(hi), factor));
        }
    }
}
