//! The pool as a value: slots, the queue of waiting borrowers, expiry, hand-off
//! and resize. No I/O and no clock: every operation takes `now_ms` (Unix
//! milliseconds), so tests never sleep.
//!
//! Every change to a pool is an [`Update`]: the conditions it depends on and
//! the changes it makes. [`Pool::apply`] is what an update means; the
//! in-memory store is that function, and the DynamoDB store turns the same
//! update into one conditional `UpdateItem` (see `docs/DESIGN.md`).
//!
//! **Hand-off.** Borrowers that cannot have a slot at once join a queue. The
//! write that frees a slot gives it to the head of the queue *as the queue is
//! when the write lands* ([`Change::HandOff`]): it names no ticket, so two
//! returns landing together serve two different tickets and neither
//! conditions on the other's slot. A waiter learns of its grant by reading.
//! A slot freed without a write (an expiry, a raised `count`) is handed to
//! the head the same way by the head's waiter when it reads. Several slots
//! free at once go to as many tickets in one write, lowest position first,
//! written by whichever waiter owed one of them reads first (the others'
//! identical writes then fail their conditions and find their grants).
//!
//! **Fairness.** A newcomer takes a free slot only when more slots are free
//! than live tickets wait (they are owed that many); otherwise it joins the
//! queue behind them. Slots freed while tickets wait go to them in the order
//! they joined.

mod admission;
mod borrow;
mod compaction;
mod layout;
mod lowest;
mod pieces;
mod pool;
mod resize;
mod return_lease;
pub mod ticket;
mod ticket_step;
mod types;
mod update;
mod wait;

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod test_support;

pub use admission::{GAP_MS, MAX_ADMITS, MAX_LISTED};
pub use borrow::BorrowPlan;
pub use compaction::{Compaction, CompactionPlan, SegmentWrite, COMPACTION_SEGMENTS};
pub use layout::{segment_of, Layout, Split, FLAT_MAX, SEGMENT_SLOTS};
pub use pieces::MAX_PRUNE;
pub use pool::{Pool, MAX_COUNT};
pub use resize::{ResizeSeen, RESIZE_NONCE_BITS};
pub use return_lease::{ReturnPlan, GIVEN_UP_MS, MAX_GIVEN_UP};
pub use ticket::{Callback, DeliveryClaim, TicketGrant, TicketItem, TicketState, OUTCOME_GRACE_MS};
pub use ticket_step::TicketStep;
pub use types::{
    by_position, AsyncLine, Ended, GiveUp, GivenUp, Holder, Inconsistent, Lease, LeaseDigest,
    PoolState, Sizing, Slot, Stamp, Ticket, ENDED_KEEP_MS, ENDED_RING, SHORT_GRANT_MS,
    TICKET_GRACE_MS,
};
pub use update::{Change, ConditionFailed, Expect, Update};
pub use wait::{WaitPlan, MAX_HAND_OFFS};
