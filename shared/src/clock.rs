//! The wall clock, as every part of the service reads it: leases expire by
//! it, fences of a new pool start from it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch: a new pool's first fence.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch: grant and expiry times.
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// A Lambda invocation's deadline (Unix ms) as an `Instant`; none when unset
/// or not in the future. Lambda's always is; `cargo lambda watch` sends a
/// timeout, 600000, where the deadline belongs, which would leave every
/// invocation out of time at once. The HTTP routes and the dispatcher both
/// read the deadline through this.
pub fn deadline_instant(deadline_ms: u64) -> Option<Instant> {
    let now = now_ms();
    (deadline_ms > now).then(|| Instant::now() + Duration::from_millis(deadline_ms - now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_deadline_in_the_future_is_one() {
        assert_eq!(deadline_instant(0), None);
        assert_eq!(deadline_instant(600_000), None, "a timeout, not a deadline");
        let soon = deadline_instant(now_ms() + 5_000).expect("a deadline");
        let left = soon.saturating_duration_since(Instant::now());
        assert!(left > Duration::from_millis(4_900) && left <= Duration::from_millis(5_000));
    }
}
