//! The embedded store: [`Pool::apply`] over a map, with the same semantics as
//! the DynamoDB store's conditional writes. For the local default and tests.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{Created, PoolStore, Record, StoreError, Updated};
use crate::domain::Update;
use crate::keys::PoolKey;

#[derive(Default)]
pub struct MemoryStore {
    pools: Mutex<HashMap<PoolKey, Record>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Record>> {
        // A panic while holding the lock cannot leave a half-written pool (each
        // write is a single insert), so a poisoned lock is still consistent.
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl PoolStore for MemoryStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        Ok(self.pools().get(key).cloned())
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let mut pools = self.pools();
        if let Some(existing) = pools.get(key) {
            return Ok(Created::Exists(existing.clone()));
        }
        pools.insert(*key, record.clone());
        Ok(Created::Created(record.clone()))
    }

    async fn update(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let mut pools = self.pools();
        let Some(current) = pools.get_mut(key) else {
            return Ok(Updated::Gone);
        };
        if current.incarnation != incarnation {
            return Ok(Updated::Lost(current.clone()));
        }
        match current.pool.apply(update) {
            Ok(next) => {
                current.pool = next;
                Ok(Updated::Written(current.clone()))
            }
            Err(_) => Ok(Updated::Lost(current.clone())),
        }
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        Ok(self.pools().remove(key).is_some())
    }
}
