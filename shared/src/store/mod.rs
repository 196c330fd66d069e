//! Where pools live: one record per pool. Every change is a conditional
//! [`Update`] checked against exactly what it depends on (see
//! [`crate::domain`]), plus the pool's incarnation, so a pool deleted and
//! registered again never takes a write meant for the one before.
//!
//! The in-memory store documents the contract the DynamoDB one keeps: it is
//! `Pool::apply` over a map. Both run the same behavioural tests.

use std::fmt;

use async_trait::async_trait;

use crate::domain::{Pool, Update};
use crate::keys::PoolKey;

pub mod dynamodb;
pub mod memory;

pub use dynamodb::DynamoDbStore;
pub use memory::MemoryStore;

/// A stored pool, with the incarnation every update is conditioned on.
/// Incarnations are random per creation, so one read before a delete never
/// matches the pool registered after it (no ABA).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub incarnation: u64,
    pub pool: Pool,
}

impl Record {
    /// A new pool's record, with a fresh incarnation.
    pub fn new(pool: Pool) -> Self {
        Record {
            incarnation: fastrand::u64(..),
            pool,
        }
    }
}

/// Outcome of a create: it landed, or a pool is already stored (handed back,
/// so the caller needs no second read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    Created(Record),
    Exists(Record),
}

/// Outcome of a conditional update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Updated {
    /// It landed; the record as it is now.
    Written(Record),
    /// A condition failed; the record as it is now (possibly another
    /// incarnation), so the caller can decide again without a read.
    Lost(Record),
    /// No pool is stored.
    Gone,
}

/// A database call failed. For a write, it may or may not have landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Throttled by the database (capacity or request rate).
    Throttled,
    /// No answer in the time the request had left.
    TimedOut,
    /// Any other failed call: network, service error.
    Unavailable,
    /// A stored record that cannot be decoded: a bug, not retryable.
    Corrupt,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    /// Whether trying again may help (everything but a corrupt record).
    pub fn is_transient(&self) -> bool {
        self.kind != StoreErrorKind::Corrupt
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
    /// The pool, or `None` if no pool is stored. Always the latest write.
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError>;

    /// Stores a new pool unless one exists.
    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError>;

    /// Applies `update` if the stored pool is `incarnation` and every
    /// expectation of the update holds.
    async fn update(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError>;

    /// Removes the pool. Returns whether one was there.
    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError>;
}
