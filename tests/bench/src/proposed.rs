//! An experiment, not the product: the service's borrow and return loops with
//! the one change recommended for shared/service.rs — after a lost conditional
//! write, sleep a fully jittered, exponentially growing nap and read the pool
//! again, instead of writing the record the conflict handed back at once.
//! (Writing that record after the nap starves the losers: it is stale by then,
//! so only the last winner keeps winning.) Compare with `--strategies ours,proposed`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::domain::{Exhausted, LeaseDigest};
use semaphore::keys::{LeaseId, PoolKey};
use semaphore::service::{now_ms, Backoff};
use semaphore::store::{new_version, PoolStore, Replaced, StoreError, StoreErrorKind};
use semaphore_tests::rng::Rng;

/// Full jitter: uniform in [0, min(cap, first · 2^conflicts)].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConflictBackoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Default for ConflictBackoff {
    fn default() -> Self {
        ConflictBackoff {
            first: Duration::from_millis(10),
            cap: Duration::from_millis(100),
        }
    }
}

impl ConflictBackoff {
    fn nap(&self, rng: &mut Rng, conflicts: u32) -> Duration {
        let window = self
            .first
            .saturating_mul(1 << conflicts.min(16))
            .min(self.cap);
        window.mul_f64(rng.unit())
    }
}

pub struct Proposed {
    pub store: Arc<dyn PoolStore>,
    pub backoff: Backoff,
    pub conflict: ConflictBackoff,
}

fn gone() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "pool vanished")
}

impl Proposed {
    /// As `Service::borrow`; `Ok(None)` when `give_up` passed while full.
    pub async fn borrow(
        &self,
        key: &PoolKey,
        ttl_ms: u64,
        give_up: Instant,
    ) -> Result<Option<LeaseDigest>, StoreError> {
        let digest = LeaseId::new_random().digest();
        let mut rng = Rng::new(new_version());
        let mut current = self.store.load(key).await?.ok_or_else(gone)?;
        let (mut polls, mut conflicts) = (0u32, 0u32);
        loop {
            let now = now_ms();
            let mut pool = current.pool.clone();
            match pool.borrow(digest, now + ttl_ms, now) {
                Ok(_) => match self.store.replace(key, &pool, current.version).await? {
                    Replaced::Replaced(_) => return Ok(Some(digest)),
                    Replaced::Conflict(Some(_)) => {
                        // The change: let the winner's burst pass, then read afresh.
                        let left = give_up.saturating_duration_since(Instant::now());
                        let nap = self.conflict.nap(&mut rng, conflicts).min(left);
                        tokio::time::sleep(nap).await;
                        conflicts += 1;
                        current = self.store.load(key).await?.ok_or_else(gone)?;
                    }
                    Replaced::Conflict(None) => return Err(gone()),
                },
                Err(Exhausted) => {
                    let now_instant = Instant::now();
                    if now_instant >= give_up {
                        return Ok(None);
                    }
                    // The service's polling, unchanged.
                    let full = self
                        .backoff
                        .first
                        .saturating_mul(1 << polls.min(16))
                        .min(self.backoff.cap);
                    let mut nap = full.mul_f64(0.5 + 0.5 * rng.unit());
                    if let Some(expiry) = current.pool.next_expiry(now) {
                        nap = nap.min(Duration::from_millis(expiry.saturating_sub(now)));
                    }
                    tokio::time::sleep(nap.min(give_up - now_instant)).await;
                    polls += 1;
                    current = self.store.load(key).await?.ok_or_else(gone)?;
                }
            }
        }
    }

    pub async fn return_lease(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<bool, StoreError> {
        let mut rng = Rng::new(new_version());
        let mut current = self.store.load(key).await?.ok_or_else(gone)?;
        let mut conflicts = 0u32;
        loop {
            let mut pool = current.pool.clone();
            if !pool.return_lease(digest, now_ms()) {
                return Ok(false);
            }
            match self.store.replace(key, &pool, current.version).await? {
                Replaced::Replaced(_) => return Ok(true),
                Replaced::Conflict(Some(_)) => {
                    tokio::time::sleep(self.conflict.nap(&mut rng, conflicts)).await;
                    conflicts += 1;
                    current = self.store.load(key).await?.ok_or_else(gone)?;
                }
                Replaced::Conflict(None) => return Err(gone()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_naps_are_jittered_and_capped() {
        let backoff = ConflictBackoff::default();
        let mut rng = Rng::new(7);
        for conflicts in 0..40 {
            let window = (10u64 << conflicts.min(16)).min(100);
            let nap = backoff.nap(&mut rng, conflicts);
            assert!(nap <= Duration::from_millis(window), "{conflicts}: {nap:?}");
        }
    }
}
