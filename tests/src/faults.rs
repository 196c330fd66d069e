//! `FaultyStore`: a `PoolStore` wrapper that makes calls fail the ways a
//! database call can, at random from a seeded RNG:
//! - fail before the call reaches the store (nothing changed);
//! - fail after the inner call landed (the caller sees an error, but the write
//!   happened: the ambiguous case, e.g. a timeout or a reset connection);
//! - for writes, land and then report a lost condition with the current item,
//!   as when the SDK retried a write that had landed and the retry's
//!   condition failed (the first attempt, or a third writer, changed what it
//!   checks): the caller must recognise its own write in that item;
//! - throttle (fail before, as `StoreErrorKind::Throttled`);
//! - delay it a few ms (widens races between instances).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use semaphore::domain::{CompactionPlan, Update};
use semaphore::keys::PoolKey;
use semaphore::store::{Created, PoolStore, Record, StoreError, StoreErrorKind, Updated};

use crate::rng::Rng;

/// Probability per store call of each fault (their sum must be ≤ 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultPlan {
    pub fail_before: f64,
    pub fail_after: f64,
    /// Writes only: landed, then answered as lost to a newer item.
    pub retry_lost: f64,
    pub throttle: f64,
    pub delay: f64,
    /// A delayed call waits 1 ..= this many ms.
    pub max_delay_ms: u64,
    /// The first delete through this store lands, then fails, whatever the
    /// draw: a run with any delete surely holds a call (a 502) whose outcome
    /// its client never learned. (Deletes are few; at 3 % a run of thousands
    /// of calls often had no failed one.)
    pub first_delete_fails_after: bool,
}

impl FaultPlan {
    /// No faults at all.
    pub fn none() -> Self {
        FaultPlan {
            fail_before: 0.0,
            fail_after: 0.0,
            retry_lost: 0.0,
            throttle: 0.0,
            delay: 0.0,
            max_delay_ms: 0,
            first_delete_fails_after: false,
        }
    }
}

impl Default for FaultPlan {
    /// About one call in eight faulty: enough to hit every path of a run of
    /// thousands of calls, few enough that most operations complete.
    fn default() -> Self {
        FaultPlan {
            fail_before: 0.03,
            fail_after: 0.03,
            retry_lost: 0.03,
            throttle: 0.02,
            delay: 0.05,
            max_delay_ms: 8,
            first_delete_fails_after: false,
        }
    }
}

/// Faults injected so far, by kind. Shared by every store of a run.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub calls: AtomicU64,
    pub failed_before: AtomicU64,
    pub failed_after: AtomicU64,
    pub retries_lost: AtomicU64,
    pub throttled: AtomicU64,
    pub delayed: AtomicU64,
}

impl FaultCounts {
    pub fn total_faults(&self) -> u64 {
        self.failed_before.load(Ordering::Relaxed)
            + self.failed_after.load(Ordering::Relaxed)
            + self.retries_lost.load(Ordering::Relaxed)
            + self.throttled.load(Ordering::Relaxed)
            + self.delayed.load(Ordering::Relaxed)
    }
}

impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "{} store calls: {} failed before, {} failed after landing, {} landed then lost on retry, {} throttled, {} delayed",
            n(&self.calls),
            n(&self.failed_before),
            n(&self.failed_after),
            n(&self.retries_lost),
            n(&self.throttled),
            n(&self.delayed)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    FailBefore,
    FailAfter,
    RetryLost,
    Throttle,
    Delay(Duration),
}

pub struct FaultyStore {
    inner: Arc<dyn PoolStore>,
    plan: FaultPlan,
    rng: Mutex<Rng>,
    counts: Arc<FaultCounts>,
    /// Whether a delete has gone through (see `first_delete_fails_after`).
    deleted_once: std::sync::atomic::AtomicBool,
}

impl FaultyStore {
    pub fn new(
        inner: Arc<dyn PoolStore>,
        plan: FaultPlan,
        seed: u64,
        counts: Arc<FaultCounts>,
    ) -> Self {
        FaultyStore {
            inner,
            plan,
            rng: Mutex::new(Rng::new(seed)),
            counts,
            deleted_once: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Draws this call's fault and counts it. `write`: whether the call is a
    /// conditional write (only those can lose a retry).
    fn draw(&self, write: bool) -> Fault {
        let (u, delay_ms) = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            (rng.unit(), rng.range(1, self.plan.max_delay_ms.max(1)))
        };
        let p = &self.plan;
        let c = &self.counts;
        let mut edge = 0.0;
        let mut below = |p: f64| {
            edge += p;
            u < edge
        };
        let (fault, counter) = if below(p.fail_before) {
            (Fault::FailBefore, Some(&c.failed_before))
        } else if below(p.fail_after) {
            (Fault::FailAfter, Some(&c.failed_after))
        } else if below(p.retry_lost) {
            if write {
                (Fault::RetryLost, Some(&c.retries_lost))
            } else {
                (Fault::None, None)
            }
        } else if below(p.throttle) {
            (Fault::Throttle, Some(&c.throttled))
        } else if below(p.delay) {
            (
                Fault::Delay(Duration::from_millis(delay_ms)),
                Some(&c.delayed),
            )
        } else {
            (Fault::None, None)
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        fault
    }

    /// Runs `call` on the inner store under this call's fault.
    async fn inject<T, F>(&self, what: &str, call: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let fault = self.draw(false);
        self.inject_drawn(fault, what, call).await
    }

    /// A conditional write under this call's fault, which may also be "landed,
    /// then the SDK's retry lost": the caller gets the item as it now is.
    async fn inject_update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        match self.draw(true) {
            // A resize is sent once (no SDK retry can lose it): its answer
            // lost after it landed is an error, as a timeout would be.
            Fault::RetryLost if update.sets_count() => {
                self.inject_drawn(
                    Fault::FailAfter,
                    "update",
                    self.inner.update(key, read, update),
                )
                .await
            }
            Fault::RetryLost => match self.inner.update(key, read, update).await? {
                Updated::Written(now) | Updated::Lost(now) => Ok(Updated::Lost(now)),
                Updated::Gone => Ok(Updated::Gone),
            },
            fault => {
                self.inject_drawn(fault, "update", self.inner.update(key, read, update))
                    .await
            }
        }
    }

    async fn inject_drawn<T, F>(&self, fault: Fault, what: &str, call: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        match fault {
            Fault::FailBefore => Err(injected(StoreErrorKind::Unavailable, what, "before")),
            Fault::Throttle => Err(injected(StoreErrorKind::Throttled, what, "before")),
            Fault::FailAfter => {
                // Whatever the inner call did stays done; the caller cannot know.
                call.await?;
                Err(injected(StoreErrorKind::Unavailable, what, "after"))
            }
            Fault::Delay(delay) => {
                tokio::time::sleep(delay).await;
                call.await
            }
            Fault::None | Fault::RetryLost => call.await,
        }
    }
}

fn injected(kind: StoreErrorKind, what: &str, when: &str) -> StoreError {
    StoreError::new(kind, format!("injected fault {when} {what}"))
}

#[async_trait]
impl PoolStore for FaultyStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.inject("load", self.inner.load(key)).await
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        self.inject("create", self.inner.create(key, record)).await
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        self.inject_update(key, read, update).await
    }

    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        self.inject("compact", self.inner.compact(key, read, plan))
            .await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        if self.plan.first_delete_fails_after && !self.deleted_once.swap(true, Ordering::Relaxed) {
            self.counts.failed_after.fetch_add(1, Ordering::Relaxed);
            self.counts.calls.fetch_add(1, Ordering::Relaxed);
            return self
                .inject_drawn(Fault::FailAfter, "delete", self.inner.delete(key))
                .await;
        }
        self.inject("delete", self.inner.delete(key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use semaphore::domain::{BorrowPlan, Holder, LeaseDigest, Pool};
    use semaphore::store::MemoryStore;

    #[tokio::test]
    async fn faults_follow_the_plan_and_fail_after_lands() {
        let counts = Arc::new(FaultCounts::default());
        let inner: Arc<dyn PoolStore> = Arc::new(MemoryStore::new());
        let plan = FaultPlan {
            fail_after: 1.0,
            ..FaultPlan::none()
        };
        let store = FaultyStore::new(inner.clone(), plan, 1, counts.clone());
        let key = PoolKey([1; 16]);
        let record = Record::new(Pool::new(2, 0));
        assert!(store.create(&key, &record).await.is_err());
        // The write landed although the caller saw an error.
        assert_eq!(inner.load(&key).await.unwrap(), Some(record.clone()));
        assert_eq!(counts.failed_after.load(Ordering::Relaxed), 1);

        // Landed, then reported lost, with the item as the write left it.
        let plan = FaultPlan {
            retry_lost: 1.0,
            ..FaultPlan::none()
        };
        let store = FaultyStore::new(inner.clone(), plan, 1, counts.clone());
        let BorrowPlan::Take { update: take, .. } = record.pool.plan_borrow(
            Holder {
                digest: LeaseDigest([7; 8]),
                ttl_ms: 60_000,
            },
            0,
            0,
            10,
        ) else {
            panic!("a free slot")
        };
        let Ok(Updated::Lost(now)) = store.update(&key, &record, &take).await else {
            panic!("a landed write reported lost")
        };
        assert_eq!(now.pool.leases().len(), 1);
        assert_eq!(inner.load(&key).await.unwrap(), Some(now.clone()));
        // A resize is sent once: its lost answer is an error, after it landed.
        let resize = now.pool.plan_resize(3, 0).unwrap();
        assert!(store.update(&key, &now, &resize).await.is_err());
        assert_eq!(inner.load(&key).await.unwrap().unwrap().pool.count(), 3);
        // Reads cannot lose a retry.
        assert!(store.load(&key).await.is_ok());

        let store = FaultyStore::new(inner, FaultPlan::default(), 2, counts.clone());
        for _ in 0..2000 {
            let _ = store.load(&key).await;
        }
        let total = counts.total_faults();
        assert!((150..=400).contains(&total), "{counts}");
        assert!(counts.throttled.load(Ordering::Relaxed) > 0, "{counts}");
    }
}
