//! Percentiles over latency samples (milliseconds).

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentile of sorted samples; 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[f64]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Summary {
        samples: sorted.len(),
        p50_ms: round3(percentile(&sorted, 0.50)),
        p99_ms: round3(percentile(&sorted, 0.99)),
        max_ms: round3(sorted.last().copied().unwrap_or(0.0)),
        mean_ms: round3(if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().sum::<f64>() / sorted.len() as f64
        }),
    }
}

/// Jain's fairness index of per-client shares: 1 when all got the same,
/// 1/n when one client got everything (0 for no shares at all).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

/// Three decimals keep the JSON readable without losing anything measurable.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let s = summarize(&[3.0, 1.0, 2.0]);
        assert_eq!(
            (s.samples, s.p50_ms, s.max_ms, s.mean_ms),
            (3, 2.0, 3.0, 2.0)
        );
    }

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), 1.0);
        assert_eq!(jain(&[4.0, 0.0, 0.0, 0.0]), 0.25);
        assert_eq!(jain(&[0.0, 0.0]), 0.0);
    }
}
