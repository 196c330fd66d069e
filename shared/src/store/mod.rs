//! Where pools live. One record per pool, every change a conditional write
//! guarded by the record's version token (optimistic concurrency).
//!
//! The in-memory store documents the contract the DynamoDB one keeps; both run
//! the same behavioural tests.

use std::fmt;

use async_trait::async_trait;

use crate::domain::Pool;
use crate::keys::PoolKey;

pub mod dynamodb;
pub mod memory;

pub use dynamodb::DynamoDbStore;
pub use memory::MemoryStore;

/// A version token. Random per write rather than a counter, so a pool that is
/// deleted and registered again can never match a version read before the
/// delete (no ABA).
pub type Version = u64;

/// A pool as loaded, with the version a conditional write must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub pool: Pool,
    pub version: Version,
}

/// Outcome of a create: it landed, or a pool is already stored (handed back so
/// the caller needs no second read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    Created(Version),
    Exists(Versioned),
}

/// Outcome of a conditional replace: it landed, or someone else wrote first.
/// `Conflict(Some)` carries the current record (no re-read needed);
/// `Conflict(None)` means the pool is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replaced {
    Replaced(Version),
    Conflict(Option<Versioned>),
}

/// A database call failed. The write may or may not have landed; callers map
/// it to a retryable 502.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Throttled by the database (capacity or request rate).
    Throttled,
    /// Any other failed call: network, timeout, service error.
    Unavailable,
    /// A stored record that cannot be decoded.
    Corrupt,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for StoreError {}

#[async_trait]
pub trait PoolStore: Send + Sync {
    /// The pool with its version, or `None` if no pool is stored.
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError>;

    /// Stores a new pool unless one exists.
    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError>;

    /// Replaces the pool only if its version is still `expected`.
    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError>;

    /// Removes the pool. Returns whether one was there.
    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError>;
}

/// A fresh random version token.
pub fn new_version() -> Version {
    // Any 64 random bits will do; uuid's v4 generator is the OS RNG we already have.
    uuid::Uuid::new_v4().as_u64_pair().0
}
