//! A store over another that changes one or two of its calls: implement
//! [`Around`] (the inner store, and only the calls it changes) and use it as a
//! [`PoolStore`] through [`Forward`]. For tests and the benchmark.
//!
//! `number_ticket` is not forwarded: [`PoolStore`]'s default runs it, through
//! the wrapper's own `load` and `update`, as it did for each hand-written
//! wrapper before.

use async_trait::async_trait;

use super::{Created, PoolStore, Record, StoreError, Updated};
use crate::domain::{CompactionPlan, Update};
use crate::keys::PoolKey;

/// The calls of a store wrapped around `inner()`, each by default the inner
/// store's own.
#[async_trait]
pub trait Around: Send + Sync {
    /// The store the calls not overridden go to.
    fn inner(&self) -> &dyn PoolStore;

    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.inner().load(key).await
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        self.inner().create(key, record).await
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        self.inner().update(key, read, update).await
    }

    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        self.inner().compact(key, read, plan).await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.inner().delete(key).await
    }
}

/// An [`Around`] as a [`PoolStore`] (a type of its own: a blanket
/// `impl PoolStore for A: Around` would overlap the stores' own impls).
pub struct Forward<A>(pub A);

#[async_trait]
impl<A: Around> PoolStore for Forward<A> {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.0.load(key).await
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        self.0.create(key, record).await
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        self.0.update(key, read, update).await
    }

    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        self.0.compact(key, read, plan).await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.0.delete(key).await
    }
}
