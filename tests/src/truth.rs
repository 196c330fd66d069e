//! Ground truth for the checker: every lease the store ever held, seen from
//! just above the real store (below any fault injection), so that a lease
//! written by a call whose answer was lost is seen too.
//!
//! With it the checker measures **orphaned slot-seconds**: time a position
//! was held by a lease no client was ever told about (no borrow answered
//! 200 with it). Such a lease holds its slot until its ttl, and with
//! `count: 1` that is a lock nobody can release.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use semaphore::domain::{LeaseDigest, Update};
use semaphore::keys::{LeaseId, PoolKey};
use semaphore::service::now_ms;
use semaphore::store::{Created, PoolStore, Record, StoreError, Updated};
use std::sync::Arc;

use crate::history::{Call, Op};

/// A lease as the store held it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredLease {
    pub key: PoolKey,
    pub digest: LeaseDigest,
    pub position: u16,
    pub fence: u64,
    pub expires_at_ms: u64,
    /// When a store call first returned it: no earlier than its write.
    pub first_seen_ms: u64,
}

/// A `PoolStore` wrapper that records every lease in every record the inner
/// store returns.
pub struct Recorder {
    inner: Arc<dyn PoolStore>,
    seen: Mutex<HashMap<(PoolKey, u64), StoredLease>>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn PoolStore>) -> Self {
        Recorder {
            inner,
            seen: Mutex::default(),
        }
    }

    /// Every lease seen so far.
    pub fn leases(&self) -> Vec<StoredLease> {
        self.lock().values().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(PoolKey, u64), StoredLease>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn saw(&self, key: &PoolKey, record: &Record) {
        let now = now_ms();
        let mut seen = self.lock();
        for lease in record.pool.leases() {
            // Fences are unique per pool id, even across incarnations.
            seen.entry((*key, lease.fence)).or_insert(StoredLease {
                key: *key,
                digest: lease.digest,
                position: lease.position,
                fence: lease.fence,
                expires_at_ms: lease.expires_at_ms,
                first_seen_ms: now,
            });
        }
    }
}

#[async_trait]
impl PoolStore for Recorder {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        let loaded = self.inner.load(key).await?;
        if let Some(record) = &loaded {
            self.saw(key, record);
        }
        Ok(loaded)
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let created = self.inner.create(key, record).await?;
        match &created {
            Created::Created(now) | Created::Exists(now) => self.saw(key, now),
        }
        Ok(created)
    }

    async fn update(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let updated = self.inner.update(key, incarnation, update).await?;
        if let Updated::Written(now) | Updated::Lost(now) = &updated {
            self.saw(key, now);
        }
        Ok(updated)
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
}

/// Leases stored that no client was told about, and how long they held
/// their positions in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    pub leases: Vec<StoredLease>,
    pub slot_ms: u64,
}

impl Orphans {
    pub fn slot_seconds(&self) -> f64 {
        self.slot_ms as f64 / 1000.0
    }
}

/// The stored leases of `truth` that no borrow in `ops` answered 200 with.
/// Each held its position from its write until its expiry (nobody could
/// return it), which is what it costs.
pub fn orphans(truth: &[StoredLease], ops: &[Op]) -> Orphans {
    let told: HashSet<(PoolKey, LeaseDigest)> = ops
        .iter()
        .filter(|op| matches!(op.call, Call::Borrow { .. }) && op.status == 200)
        .filter_map(|op| {
            let pool = semaphore::api::parse_pool_id(&op.pool).ok()?;
            let lease = uuid::Uuid::parse_str(op.body["lease"].as_str()?).ok()?;
            Some((pool.key(), LeaseId(lease).digest()))
        })
        .collect();
    let mut found = Orphans::default();
    for lease in truth {
        if !told.contains(&(lease.key, lease.digest)) {
            found.slot_ms += lease.expires_at_ms.saturating_sub(lease.first_seen_ms);
            found.leases.push(*lease);
        }
    }
    found
}

/// For a failure message: the borrows of the orphan's pool not answered 200
/// that were in flight before it was first seen.
pub fn suspects(lease: &StoredLease, ops: &[Op]) -> Vec<String> {
    ops.iter()
        .enumerate()
        .filter(|(_, op)| matches!(op.call, Call::Borrow { .. }) && op.status != 200)
        .filter(|(_, op)| {
            semaphore::api::parse_pool_id(&op.pool).is_ok_and(|p| p.key() == lease.key)
        })
        .filter(|(_, op)| {
            op.invoke_ms <= lease.first_seen_ms && op.response_ms + 5_000 >= lease.first_seen_ms
        })
        .map(|(i, op)| {
            format!(
                "#{i} client {} {:?} [{}, {}] → {} {}",
                op.client, op.call, op.invoke_ms, op.response_ms, op.status, op.body
            )
        })
        .collect()
}
