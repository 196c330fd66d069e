//! The operations of the API: read → decide (domain) → conditional write,
//! decided again from the record a lost write hands back.
//!
//! Every store call is bounded by the time the request has left, so every
//! answer — a 502 included — comes before anyone else's deadline. A write
//! whose outcome is unknown (an error after it may have landed) is never
//! taken as failed: the service reads again and recognises its own lease,
//! ticket, return or pool, so no slot is stranded by an answer nobody got.

use std::sync::Arc;

use crate::callback::CallbackPolicy;
use crate::keys::PoolKey;
use crate::store::{PoolStore, TicketStore};

mod async_mode;
mod borrow;
mod delete;
mod harness;
mod inspect;
mod pacing;
mod register;
mod return_lease;
mod settings;

pub use async_mode::{
    Begin, EnqueueRequest, Enqueued, Step, TicketReport, ToDeliver, ASYNC_WINDOW,
};
pub use borrow::{BorrowRequest, Grant};
pub use harness::{Budget, Stats};
pub use settings::{Limits, Timing};

pub struct Service {
    store: Arc<dyn PoolStore>,
    /// Async mode's ticket items (and the backlog sync borrowers wait in).
    tickets: Option<Arc<dyn TicketStore>>,
    /// Which callback URLs an enqueue may name.
    callbacks: CallbackPolicy,
    /// Told of every write that leaves a pool with async tickets or a
    /// backlog: an in-process dispatcher's stand-in for the table's stream.
    watch: Option<Watch>,
    /// Told when a write hands a slot to an async ticket (in AWS: a wake for
    /// the dispatcher without delay, ahead of the table's stream).
    on_async_grant: Option<Arc<dyn OnAsyncGrant>>,
    limits: Limits,
    timing: Timing,
}

/// Hears which pool changed (see [`Service::with_watch`]).
pub type Watch = Arc<dyn Fn(PoolKey) + Send + Sync>;

/// Hears, before the request answers, that one of its writes handed a slot
/// to an async ticket (see [`Service::with_on_async_grant`]). Failures are
/// its own to log: the table's stream delivers the grant all the same.
#[async_trait::async_trait]
pub trait OnAsyncGrant: Send + Sync {
    async fn granted(&self, key: &PoolKey);
}

impl Service {
    pub fn new(store: Arc<dyn PoolStore>, limits: Limits) -> Self {
        Service {
            store,
            tickets: None,
            callbacks: CallbackPolicy::default(),
            watch: None,
            on_async_grant: None,
            limits,
            timing: Timing::default(),
        }
    }

    /// Which callbacks enqueues may name (by default, https to public
    /// addresses only).
    pub fn with_callback_policy(mut self, policy: CallbackPolicy) -> Self {
        self.callbacks = policy;
        self
    }

    pub fn callback_policy(&self) -> CallbackPolicy {
        self.callbacks
    }

    /// Calls `watch` after each write that leaves a pool with async work
    /// (its `active` flag), and after each enqueue (local runs: in AWS the table's
    /// stream, filtered the same way, invokes the dispatcher).
    pub fn with_watch(mut self, watch: Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Calls `hook` after each write of a request that hands a slot to an
    /// async ticket (a return, a resize, a waiter serving the queue's head),
    /// so that the delivery starts at once; the table's stream stays the
    /// backstop that makes sure no grant is lost.
    pub fn with_on_async_grant(mut self, hook: Arc<dyn OnAsyncGrant>) -> Self {
        self.on_async_grant = Some(hook);
        self
    }

    /// Serves async mode, with its tickets in `tickets` (the same table).
    pub fn with_tickets(mut self, tickets: Arc<dyn TicketStore>) -> Self {
        self.tickets = Some(tickets);
        self
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }
}
