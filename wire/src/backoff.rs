//! The one retry backoff: the client's retries of failed requests and the
//! server's naps after failed store calls and lost writes. Random numbers
//! come from `fastrand` (ids that are credentials come from the OS, through
//! uuid's v4).

use std::time::Duration;

/// Capped exponential backoff with jitter: the `step`th pause (from 0) is
/// drawn from a window of `first · 2^step`, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
    pub jitter: Jitter,
}

/// How a pause is drawn from its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    /// Anywhere in `[0, window]`: spreads contenders the most (the server,
    /// whose requests already wait on each other).
    Full,
    /// In `[window / 2, window]`: never retries at once (a client, whose
    /// request failed on a server or network that needs a moment).
    Equal,
}

impl Backoff {
    pub const fn new(first: Duration, cap: Duration, jitter: Jitter) -> Backoff {
        Backoff { first, cap, jitter }
    }

    /// The window the `step`th pause is drawn from.
    pub fn window(&self, step: u32) -> Duration {
        self.first
            .saturating_mul(1u32 << step.min(20))
            .min(self.cap)
    }

    /// The `step`th pause (from 0).
    pub fn pause(&self, step: u32) -> Duration {
        let window = self.window(step);
        match self.jitter {
            Jitter::Full => window.mul_f64(unit()),
            Jitter::Equal => window / 2 + (window / 2).mul_f64(unit()),
        }
    }
}

/// Uniform in `[0, 1)`, for jitter.
pub fn unit() -> f64 {
    fastrand::f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_to_their_cap_within_the_jitter() {
        for jitter in [Jitter::Full, Jitter::Equal] {
            let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), jitter);
            for step in 0..40 {
                let window =
                    Duration::from_millis(100 * (1u64 << step.min(4))).min(Duration::from_secs(1));
                assert_eq!(b.window(step), window);
                let pause = b.pause(step);
                let least = if jitter == Jitter::Equal {
                    window / 2
                } else {
                    Duration::ZERO
                };
                assert!(pause >= least && pause <= window, "{step}: {pause:?}");
            }
        }
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_window() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1), Jitter::Full);
        let pauses: Vec<f64> = (0..10_000).map(|_| b.pause(0).as_secs_f64()).collect();
        let mean = pauses.iter().sum::<f64>() / pauses.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert!(pauses.iter().any(|p| *p < 0.1) && pauses.iter().any(|p| *p > 0.9));
    }
}
