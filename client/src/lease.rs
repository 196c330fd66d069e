//! A held slot: the grant the server answered, as a guard that gives the slot
//! back when dropped.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use crate::{Error, Grant, Pool};

/// A held slot of a pool. Dropping it without [`release`](Lease::release)
/// or [`detach`](Lease::detach) returns it in the background, bounded and
/// only while the current tokio runtime keeps running (the crate docs say
/// exactly when); [`Pool::with_lease`](crate::Pool::with_lease) always awaits
/// the return.
pub struct Lease {
    pool: Pool,
    grant: Grant,
    /// When the lease ends by this process's clock: when its answer arrived
    /// plus the time the server said it had left.
    deadline: Instant,
    /// Whether the server surely granted less than the ttl asked.
    clamped: bool,
    /// Whether dropping must return it.
    armed: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.pool)
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// `grant`, answered at `received` to a borrow of `ttl` that started at
    /// `started`.
    pub(crate) fn new(
        pool: Pool,
        grant: Grant,
        ttl: Duration,
        started: Instant,
        received: Instant,
    ) -> Lease {
        let left = grant.expires_in.as_duration();
        // The slot was granted after the borrow started, so the ttl granted
        // is at most what is left plus the time since: less than asked means
        // the server clamped it (a hand-off after a wait alone cannot).
        // A millisecond of slack for the server's rounding.
        let clamped = left + (received - started) + Duration::from_millis(1)
            < Duration::from_millis(ttl.as_millis().min(u128::from(u64::MAX)) as u64);
        Lease {
            pool,
            deadline: received + left,
            clamped,
            grant,
            armed: true,
        }
    }

    pub fn id(&self) -> Uuid {
        self.grant.lease
    }

    pub fn position(&self) -> u32 {
        self.grant.position
    }

    /// The fencing token: pass it to the protected resource, which refuses
    /// tokens lower than the highest it has seen. `None` only from a server
    /// older than fencing.
    pub fn fence(&self) -> Option<u64> {
        self.grant.fence
    }

    /// When the lease ends (the server's `expires_at_unix`, whole seconds
    /// rounded down).
    pub fn expires_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.grant.expires_at_unix)
    }

    /// When the lease ends by this process's monotonic clock: the instant
    /// its answer arrived plus the `expires_in` the server answered, so the
    /// time the server granted, not the ttl asked. It is late by the answer's
    /// time in transit (milliseconds on a good network): stop using the slot
    /// a little before.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the server surely granted a shorter ttl than asked (it clamps
    /// the ttl to its `MAX_TTL_SECONDS`). A lease can also have less left
    /// than asked without that, if it was handed over during a wait: in all
    /// cases [`deadline`](Lease::deadline) is when it ends.
    pub fn ttl_clamped(&self) -> bool {
        self.clamped
    }

    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Returns the slot now: `true` if the lease was still live.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.armed = false;
        self.pool.return_lease(self.grant.lease).await
    }

    /// Keeps the lease beyond this guard (to return it later by its UUID, or
    /// let it expire): dropping no longer returns it.
    pub fn detach(mut self) -> Grant {
        self.armed = false;
        self.grant
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.pool.return_in_background(self.grant.lease);
        }
    }
}
