//! The baseline: the same domain and store, driven the naive way — re-read
//! after every conflict (ignoring the record the conflict handed back) and, when
//! the pool is full, sleep a fixed 3 s before trying again, as the aws-samples
//! Step Functions semaphore does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::domain::{Exhausted, LeaseDigest};
use semaphore::keys::{LeaseId, PoolKey};
use semaphore::service::now_ms;
use semaphore::store::{PoolStore, Replaced, StoreError, StoreErrorKind};

pub const FULL_SLEEP: Duration = Duration::from_secs(3);

pub struct Naive {
    pub store: Arc<dyn PoolStore>,
}

fn gone() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "pool vanished")
}

impl Naive {
    /// A lease digest, or `None` if `give_up` passed while the pool was full.
    pub async fn borrow(
        &self,
        key: &PoolKey,
        ttl_ms: u64,
        give_up: Instant,
    ) -> Result<Option<LeaseDigest>, StoreError> {
        let digest = LeaseId::new_random().digest();
        loop {
            let current = self.store.load(key).await?.ok_or_else(gone)?;
            let mut pool = current.pool.clone();
            let now = now_ms();
            match pool.borrow(digest, now + ttl_ms, now) {
                Ok(_) => match self.store.replace(key, &pool, current.version).await? {
                    Replaced::Replaced(_) => return Ok(Some(digest)),
                    Replaced::Conflict(_) => continue,
                },
                Err(Exhausted) => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    tokio::time::sleep(FULL_SLEEP.min(left)).await;
                }
            }
        }
    }

    pub async fn return_lease(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<bool, StoreError> {
        loop {
            let current = self.store.load(key).await?.ok_or_else(gone)?;
            let mut pool = current.pool.clone();
            if !pool.return_lease(digest, now_ms()) {
                return Ok(false);
            }
            match self.store.replace(key, &pool, current.version).await? {
                Replaced::Replaced(_) => return Ok(true),
                Replaced::Conflict(_) => continue,
            }
        }
    }
}
