//! The embedded store: same semantics as DynamoDB's conditional writes, for the
//! local default and unit tests.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{new_version, Created, PoolStore, Replaced, StoreError, Version, Versioned};
use crate::domain::Pool;
use crate::keys::PoolKey;

#[derive(Default)]
pub struct MemoryStore {
    pools: Mutex<HashMap<PoolKey, Versioned>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Versioned>> {
        // A panic while holding the lock cannot leave a half-written pool (each
        // write is a single insert), so a poisoned lock is still consistent.
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl PoolStore for MemoryStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError> {
        Ok(self.pools().get(key).cloned())
    }

    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError> {
        let mut pools = self.pools();
        if let Some(existing) = pools.get(key) {
            return Ok(Created::Exists(existing.clone()));
        }
        let version = new_version();
        pools.insert(
            *key,
            Versioned {
                pool: pool.clone(),
                version,
            },
        );
        Ok(Created::Created(version))
    }

    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError> {
        let mut pools = self.pools();
        match pools.get_mut(key) {
            Some(current) if current.version == expected => {
                let version = new_version();
                *current = Versioned {
                    pool: pool.clone(),
                    version,
                };
                Ok(Replaced::Replaced(version))
            }
            Some(current) => Ok(Replaced::Conflict(Some(current.clone()))),
            None => Ok(Replaced::Conflict(None)),
        }
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        Ok(self.pools().remove(key).is_some())
    }
}
