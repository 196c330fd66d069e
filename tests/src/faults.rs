//! `FaultyStore`: a `PoolStore` wrapper that makes calls fail the ways a
//! database call can, at random from a seeded RNG:
//! - fail before the call reaches the store (nothing changed);
//! - fail after the inner call landed (the caller sees an error, but the write
//!   happened: the ambiguous case);
//! - throttle (fail before, as `StoreErrorKind::Throttled`);
//! - delay it a few ms (widens races between instances).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use semaphore::domain::Pool;
use semaphore::keys::PoolKey;
use semaphore::store::{
    Created, PoolStore, Replaced, StoreError, StoreErrorKind, Version, Versioned,
};

use crate::rng::Rng;

/// Probability per store call of each fault (their sum must be ≤ 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultPlan {
    pub fail_before: f64,
    pub fail_after: f64,
    pub throttle: f64,
    pub delay: f64,
    /// A delayed call waits 1 ..= this many ms.
    pub max_delay_ms: u64,
}

impl FaultPlan {
    /// No faults at all.
    pub fn none() -> Self {
        FaultPlan {
            fail_before: 0.0,
            fail_after: 0.0,
            throttle: 0.0,
            delay: 0.0,
            max_delay_ms: 0,
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
            throttle: 0.02,
            delay: 0.05,
            max_delay_ms: 8,
        }
    }
}

/// Faults injected so far, by kind. Shared by every store of a run.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub calls: AtomicU64,
    pub failed_before: AtomicU64,
    pub failed_after: AtomicU64,
    pub throttled: AtomicU64,
    pub delayed: AtomicU64,
}

impl FaultCounts {
    pub fn total_faults(&self) -> u64 {
        self.failed_before.load(Ordering::Relaxed)
            + self.failed_after.load(Ordering::Relaxed)
            + self.throttled.load(Ordering::Relaxed)
            + self.delayed.load(Ordering::Relaxed)
    }
}

impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "{} store calls: {} failed before, {} failed after landing, {} throttled, {} delayed",
            n(&self.calls),
            n(&self.failed_before),
            n(&self.failed_after),
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
    Throttle,
    Delay(Duration),
}

pub struct FaultyStore {
    inner: Arc<dyn PoolStore>,
    plan: FaultPlan,
    rng: Mutex<Rng>,
    counts: Arc<FaultCounts>,
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
        }
    }

    /// Draws this call's fault and counts it.
    fn draw(&self) -> Fault {
        let (u, delay_ms) = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            (rng.unit(), rng.range(1, self.plan.max_delay_ms.max(1)))
        };
        let p = &self.plan;
        let c = &self.counts;
        let (fault, counter) = if u < p.fail_before {
            (Fault::FailBefore, Some(&c.failed_before))
        } else if u < p.fail_before + p.fail_after {
            (Fault::FailAfter, Some(&c.failed_after))
        } else if u < p.fail_before + p.fail_after + p.throttle {
            (Fault::Throttle, Some(&c.throttled))
        } else if u < p.fail_before + p.fail_after + p.throttle + p.delay {
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
        match self.draw() {
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
            Fault::None => call.await,
        }
    }
}

fn injected(kind: StoreErrorKind, what: &str, when: &str) -> StoreError {
    StoreError::new(kind, format!("injected fault {when} {what}"))
}

#[async_trait]
impl PoolStore for FaultyStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError> {
        self.inject("load", self.inner.load(key)).await
    }

    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError> {
        self.inject("create", self.inner.create(key, pool)).await
    }

    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError> {
        self.inject("replace", self.inner.replace(key, pool, expected))
            .await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.inject("delete", self.inner.delete(key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let key = PoolKey([1; 32]);
        assert!(store.create(&key, &Pool::new(2)).await.is_err());
        // The write landed although the caller saw an error.
        assert_eq!(inner.load(&key).await.unwrap().unwrap().pool, Pool::new(2));
        assert_eq!(counts.failed_after.load(Ordering::Relaxed), 1);

        let store = FaultyStore::new(inner, FaultPlan::default(), 2, counts.clone());
        for _ in 0..2000 {
            let _ = store.load(&key).await;
        }
        let total = counts.total_faults();
        assert!((150..=400).contains(&total), "{counts}");
        assert!(counts.throttled.load(Ordering::Relaxed) > 0, "{counts}");
    }
}
