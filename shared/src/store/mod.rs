//! Where pools live: one record per pool. Every change is a conditional
//! [`Update`] checked against exactly what it depends on (see
//! [`crate::domain`]), plus the pool's incarnation, so a pool deleted and
//! registered again never takes a write meant for the one before.
//!
//! The in-memory store documents the contract the DynamoDB one keeps: it is
//! `Pool::apply` over a map. Both run the same behavioural tests.

use std::fmt;

use async_trait::async_trait;

use crate::domain::{
    CompactionPlan, DeliveryClaim, LeaseDigest, Pool, TicketGrant, TicketItem, TicketState, Update,
};
use crate::keys::PoolKey;

pub mod dynamodb;
#[cfg(any(test, feature = "measure"))]
pub mod forward;
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

/// What [`PoolStore::number_ticket`] did.
#[derive(Debug)]
pub enum Numbered {
    /// Took the number: the record as the write left it.
    Taken(Record),
    /// The next number was not below the bound: the record as it is.
    Full(Record),
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

    /// Applies `update`, planned on `read`, if the stored pool is `read`'s
    /// incarnation and every expectation of the update holds. (A store that
    /// keeps slots apart from the pool item knows from `read` those the
    /// write leaves as they were.)
    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError>;

    /// Removes the pool. Returns whether one was there.
    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError>;

    /// Moves a split pool's hot entries to their segment: writes the
    /// segment (conditioned on its version as read), then the pool item
    /// (`plan.update`). (Every wrapper must forward it: a store's own
    /// `update` of `plan.update` alone would lose the segment.)
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError>;

    /// Takes the pool's next ticket number (async mode) if it is below
    /// `below`: [`Numbered::Taken`] with the record as the write left it (its
    /// `line().next - 1` is the number taken), [`Numbered::Full`] with the
    /// record as it is, or [`Numbered::Gone`] when no pool is stored. The
    /// DynamoDB store does it in one write, conditioned on the pool existing
    /// and the number; this default reads first.
    async fn number_ticket(&self, key: &PoolKey, below: u64) -> Result<Numbered, StoreError> {
        loop {
            let Some(record) = self.load(key).await? else {
                return Ok(Numbered::Gone);
            };
            if record.pool.line().next >= below {
                return Ok(Numbered::Full(record));
            }
            match self.update(key, &record, &Pool::plan_number()).await? {
                Updated::Written(record) => return Ok(Numbered::Taken(record)),
                Updated::Lost(_) => continue,
                Updated::Gone => return Ok(Numbered::Gone),
            }
        }
    }
}

/// Outcome of writing a new ticket item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutTicket {
    Created,
    /// A ticket of the same lease id is stored already (handed back): an
    /// enqueue repeated.
    Exists(TicketItem),
}

/// Outcome of a ticket's state change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TicketUpdated {
    /// It landed; the ticket as it is now.
    Written(TicketItem),
    /// The ticket was not in the state expected; as it is now.
    Lost(TicketItem),
    /// No such ticket.
    Gone,
}

/// Tickets in items of their own under their pool's key (async mode): one
/// per lease id, read in ticket order. Every state change is conditioned on
/// the state it leaves, so each ticket ends exactly once.
#[async_trait]
pub trait TicketStore: Send + Sync {
    /// Stores a new ticket unless one of its lease id exists.
    async fn put_ticket(&self, key: &PoolKey, ticket: &TicketItem)
        -> Result<PutTicket, StoreError>;

    /// The ticket of this lease digest. Always the latest write.
    async fn ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<Option<TicketItem>, StoreError>;

    /// Up to `limit` tickets numbered `from` or above, in ticket order,
    /// whatever their state. Always the latest writes.
    async fn backlog(
        &self,
        key: &PoolKey,
        from: u64,
        limit: usize,
    ) -> Result<Vec<TicketItem>, StoreError>;

    /// Moves the ticket from `from` (the state as read) to `to`, if it is
    /// still in `from`'s state. `from` must be allowed to become `to`
    /// ([`TicketState::may_become`]); otherwise a `Corrupt` error (a bug).
    async fn set_ticket_state(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        to: &TicketState,
    ) -> Result<TicketUpdated, StoreError> {
        may_move(from, to)?;
        self.move_ticket(key, digest, from, to).await
    }

    /// [`set_ticket_state`](Self::set_ticket_state)'s write, the transition
    /// checked: conditioned on the ticket's state being `from`'s.
    async fn move_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        to: &TicketState,
    ) -> Result<TicketUpdated, StoreError>;

    /// Records `grant` on the ticket (from `from`, the state as read, as
    /// [`set_ticket_state`](Self::set_ticket_state)) and, with `claim`,
    /// claims its first delivery attempt and counts it in the same write:
    /// a ticket just granted has no claim of anyone's to respect.
    async fn record_grant(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        grant: TicketGrant,
        claim: Option<DeliveryClaim>,
    ) -> Result<TicketUpdated, StoreError> {
        let granted = TicketState::Granted(grant);
        let recorded = self.set_ticket_state(key, digest, from, &granted).await?;
        match (recorded, claim) {
            (TicketUpdated::Written(_), Some(claim)) => {
                let now = crate::clock::now_ms();
                self.claim_attempt(key, digest, grant.fence, claim, now)
                    .await
            }
            (recorded, _) => Ok(recorded),
        }
    }

    /// Claims the next delivery attempt of the ticket granted `fence` and
    /// counts it, if [`TicketItem::may_claim`] at `now_ms` (conditioned on
    /// exactly that): `Written` with the item after, else `Lost` with the
    /// item as it is (another's claim is live, or it is no longer granted).
    async fn claim_attempt(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        fence: u64,
        claim: DeliveryClaim,
        now_ms: u64,
    ) -> Result<TicketUpdated, StoreError>;

    /// Removes the ticket item of `digest` if it is still the one numbered
    /// `number` in the pool's incarnation `incarnation` (a later ticket of
    /// the same lease id is left alone): whether it did.
    async fn delete_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        number: u64,
        incarnation: u64,
    ) -> Result<bool, StoreError>;

    /// Removes every ticket item of the pool (after the pool itself was
    /// deleted and its tickets ended); how many were removed.
    async fn delete_tickets(&self, key: &PoolKey) -> Result<usize, StoreError>;
}

/// A `Corrupt` error (a bug) unless a ticket in `from` may become `to`.
pub(crate) fn may_move(from: &TicketState, to: &TicketState) -> Result<(), StoreError> {
    if from.may_become(to) {
        return Ok(());
    }
    Err(StoreError::new(
        StoreErrorKind::Corrupt,
        format!("a ticket cannot go from {} to {}", from.name(), to.name()),
    ))
}

/// The dispatcher's pending wake of each pool (async mode in AWS, where a
/// wake is a delayed SQS message): recorded on the pool, so that
/// invocations wanting the same or a later wake send none while one is
/// pending. It is not the only message queued: an earlier wake replaces a
/// later pending one, whose message stays queued (a stray, cheap: one step).
#[async_trait]
pub trait WakeStore: Send + Sync {
    /// Records a wake of the pool at `at_ms` unless another is pending (not
    /// yet due at `now_ms`, at or before `at_ms`, and not among `handled`,
    /// the wakes the caller is handling, which may arrive early): `true`
    /// when it did (the caller then sends the wake), `false` when another
    /// is pending or the pool is gone.
    async fn arm_wake(
        &self,
        key: &PoolKey,
        at_ms: u64,
        now_ms: u64,
        handled: &[u64],
    ) -> Result<bool, StoreError>;

    /// Clears the pending wake if it is one of `handled` (a wake handled
    /// early that armed none after it, or one whose message was not sent),
    /// so that it does not hold off a later one: whether it did.
    async fn disarm_wake(&self, key: &PoolKey, handled: &[u64]) -> Result<bool, StoreError>;
}
