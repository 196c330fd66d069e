//! Random numbers: incarnations of pools, and jitter for waiters and retries.

/// 64 random bits from the OS RNG (via uuid's v4 generator, already a dependency).
pub fn random_u64() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// Jitter, so that waiters and retries spread out instead of moving in
/// lockstep. A tiny xorshift seeded from the OS RNG is plenty here.
pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Self {
        Jitter(random_u64() | 1)
    }

    /// Uniform in [0, 1).
    pub fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Jitter::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_uniform_in_the_unit_interval() {
        let mut jitter = Jitter::new();
        let samples: Vec<f64> = (0..10_000).map(|_| jitter.next_unit()).collect();
        assert!(samples.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
