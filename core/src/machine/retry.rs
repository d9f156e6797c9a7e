//! The pause between acquisition attempts.

use std::time::Duration;

/// A small seedable pseudo-random generator (SplitMix64) for retry jitter.
///
/// Jitter only spreads contenders apart; it needs no cryptographic strength, but it must be reproducible
/// from a seed in tests. Ownership tokens never come from here (see [`Token`](crate::Token)).
#[derive(Debug, Clone)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator starting from `seed`.
    pub fn from_seed(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the operating system, or from the wall clock if that fails (jitter quality
    /// is not a safety property).
    pub fn from_os() -> Self {
        let mut bytes = [0u8; 8];
        let seed = match getrandom::fill(&mut bytes) {
            Ok(()) => u64::from_le_bytes(bytes),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5EED),
        };
        Self::from_seed(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The retry schedule of an acquisition: `delay + U[0, jitter) × delay` after each failed attempt.
///
/// Call protocol: after a failed attempt, call [`next_pause`](Self::next_pause) and sleep that long (or until
/// the acquisition's deadline, if sooner) before the next attempt.
#[derive(Debug, Clone)]
pub struct Backoff {
    delay: Duration,
    jitter: f64,
    rng: Jitter,
}

impl Backoff {
    /// A schedule with base `delay` and `jitter` in `[0, 1]` (clamped).
    pub fn new(delay: Duration, jitter: f64, rng: Jitter) -> Self {
        let jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        Self { delay, jitter, rng }
    }

    /// The pause before the next attempt, in `[delay, delay × (1 + jitter))`.
    pub fn next_pause(&mut self) -> Duration {
        let extra = self.delay.mul_f64(self.jitter * self.rng.next_unit());
        self.delay.saturating_add(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_generator_is_splitmix64() {
        // SplitMix64's reference outputs (seed 0, and seed 1 234 567).
        let mut j = Jitter::from_seed(0);
        let first: Vec<u64> = (0..3).map(|_| j.next_u64()).collect();
        assert_eq!(
            first,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
        let mut j = Jitter::from_seed(1_234_567);
        assert_eq!(j.next_u64(), 0x599E_D017_FB08_FC85);
        assert_eq!(j.next_u64(), 0x2C73_F084_5854_0FA5);
    }

    #[test]
    fn same_seed_same_schedule() {
        let mut a = Backoff::new(Duration::from_millis(200), 0.5, Jitter::from_seed(7));
        let mut b = Backoff::new(Duration::from_millis(200), 0.5, Jitter::from_seed(7));
        for _ in 0..100 {
            assert_eq!(a.next_pause(), b.next_pause());
        }
    }

    #[test]
    fn jitter_spreads_pauses() {
        let mut a = Backoff::new(Duration::from_millis(200), 0.5, Jitter::from_seed(1));
        let pauses: std::collections::HashSet<_> = (0..100).map(|_| a.next_pause()).collect();
        assert!(pauses.len() > 90);
    }

    #[test]
    fn zero_jitter_is_the_plain_delay() {
        let mut a = Backoff::new(Duration::from_millis(200), 0.0, Jitter::from_os());
        assert_eq!(a.next_pause(), Duration::from_millis(200));
    }

    proptest! {
        #[test]
        fn pauses_stay_within_bounds(seed in any::<u64>(), delay_ms in 1u64..100_000, jitter in 0.0f64..=1.0) {
            let delay = Duration::from_millis(delay_ms);
            let mut b = Backoff::new(delay, jitter, Jitter::from_seed(seed));
            for _ in 0..20 {
                let p = b.next_pause();
                prop_assert!(p >= delay);
                prop_assert!(p <= delay.mul_f64(1.0 + jitter));
            }
        }

        #[test]
        fn unit_floats_are_in_range(seed in any::<u64>()) {
            let mut j = Jitter::from_seed(seed);
            for _ in 0..100 {
                let u = j.next_unit();
                prop_assert!((0.0..1.0).contains(&u));
            }
        }
    }
}
