//! The wall clock, as every part of the service reads it: leases expire by
//! it, fences of a new pool start from it.

use std::time::{SystemTime, UNIX_EPOCH};

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
