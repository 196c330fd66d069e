//! A `PoolStore` wrapper that counts calls. Each trait call is exactly one
//! DynamoDB request in `DynamoDbStore` (GetItem, PutItem, PutItem, DeleteItem),
//! so these are DynamoDB calls per operation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use semaphore::domain::Pool;
use semaphore::keys::PoolKey;
use semaphore::store::{Created, PoolStore, Replaced, StoreError, Version, Versioned};

#[derive(Default, Debug)]
pub struct Counts {
    pub loads: AtomicU64,
    pub creates: AtomicU64,
    pub replaces: AtomicU64,
    pub deletes: AtomicU64,
    /// Conditional writes (create or replace) whose condition failed.
    pub conflicts: AtomicU64,
}

impl Counts {
    pub fn total(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
            + self.creates.load(Ordering::Relaxed)
            + self.replaces.load(Ordering::Relaxed)
            + self.deletes.load(Ordering::Relaxed)
    }

    pub fn writes(&self) -> u64 {
        self.creates.load(Ordering::Relaxed) + self.replaces.load(Ordering::Relaxed)
    }

    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        for counter in [
            &self.loads,
            &self.creates,
            &self.replaces,
            &self.deletes,
            &self.conflicts,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

pub struct CountingStore {
    inner: Arc<dyn PoolStore>,
    pub counts: Arc<Counts>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn PoolStore>) -> Self {
        CountingStore {
            inner,
            counts: Arc::default(),
        }
    }
}

#[async_trait]
impl PoolStore for CountingStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError> {
        self.counts.loads.fetch_add(1, Ordering::Relaxed);
        self.inner.load(key).await
    }

    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError> {
        self.counts.creates.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.create(key, pool).await?;
        if matches!(outcome, Created::Exists(_)) {
            self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError> {
        self.counts.replaces.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.replace(key, pool, expected).await?;
        if matches!(outcome, Replaced::Conflict(_)) {
            self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.counts.deletes.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(key).await
    }
}
