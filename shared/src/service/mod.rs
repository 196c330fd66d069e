//! The operations of the API: read → decide (domain) → conditional write,
//! decided again from the record a lost write hands back.
//!
//! Every store call is bounded by the time the request has left, so every
//! answer — a 502 included — comes before anyone else's deadline. A write
//! whose outcome is unknown (an error after it may have landed) is never
//! taken as failed: the service reads again and recognises its own lease,
//! ticket, return or pool, so no slot is stranded by an answer nobody got.

use std::sync::Arc;
use std::time::Instant;

use crate::callback::CallbackPolicy;
use crate::domain::{LeaseDigest, TicketGrant};
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
mod waiting_room;

pub use async_mode::{
    Begin, Claiming, EnqueueRequest, Enqueued, Step, TicketReport, ToDeliver, ASYNC_WINDOW,
};
pub use borrow::{BorrowRequest, Grant};
pub use harness::{Budget, Stats};
pub use settings::{Limits, Timing};

#[derive(Clone)]
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
    /// `grants`: the tickets the write handed slots to (lease digest, grant);
    /// none when a slot is owed to a ticket that a step has yet to grant.
    /// `by`: when it must be done (it is cut there), so that the request
    /// keeps time for the rest of its work and its answer.
    async fn granted(&self, key: &PoolKey, grants: &[(LeaseDigest, TicketGrant)], by: Instant);
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::domain::Callback;
    use crate::keys::{LeaseId, PoolId};
    use crate::store::MemoryStore;

    /// The pools the hook was told of, in order.
    #[derive(Default)]
    struct Told(Mutex<Vec<PoolKey>>);

    #[async_trait::async_trait]
    impl OnAsyncGrant for Told {
        async fn granted(&self, key: &PoolKey, _: &[(LeaseDigest, TicketGrant)], _: Instant) {
            self.0.lock().unwrap().push(*key);
        }
    }

    impl Told {
        fn taken(&self) -> Vec<PoolKey> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    fn service() -> (Service, Arc<Told>) {
        let store = Arc::new(MemoryStore::new());
        let told = Arc::new(Told::default());
        let service = Service::new(store.clone(), Limits::default())
            .with_tickets(store)
            .with_callback_policy(CallbackPolicy { allow_local: true })
            .with_on_async_grant(told.clone());
        (service, told)
    }

    async fn held(service: &Service, id: PoolId, count: u16) -> LeaseId {
        let budget = &mut Budget::new(None);
        service.register(id, count, budget).await.unwrap();
        let lease = LeaseId::new_random();
        let borrow = BorrowRequest {
            ttl_ms: 60_000,
            wait_ms: 0,
            lease,
        };
        service.borrow(id, borrow, budget).await.unwrap();
        lease
    }

    async fn enqueue(service: &Service, id: PoolId) {
        let enqueue = EnqueueRequest {
            ttl_ms: 30_000,
            wait_ms: Some(60_000),
            lease: LeaseId::new_random(),
            callback: Callback {
                url: "http://127.0.0.1:9/hook".into(),
                token: "t".into(),
            },
        };
        let budget = &mut Budget::new(None);
        service.enqueue(id, enqueue, budget).await.unwrap();
    }

    #[tokio::test]
    async fn the_hook_hears_a_return_that_hands_the_slot_to_an_async_ticket() {
        let (service, told) = service();
        let id = PoolId(uuid::Uuid::new_v4());
        let holder = held(&service, id, 1).await;
        enqueue(&service, id).await;
        // Admitted to the queue: no slot for it yet.
        let budget = &mut Budget::new(None);
        service.dispatch_step(&id.key(), &[], budget).await.unwrap();
        assert_eq!(told.taken(), []);

        assert!(service.return_lease(id, holder, budget).await.unwrap());
        assert_eq!(told.taken(), [id.key()]);
    }

    #[tokio::test]
    async fn the_hook_hears_no_ordinary_return() {
        let (service, told) = service();
        let budget = &mut Budget::new(None);
        // A sync-only pool.
        let id = PoolId(uuid::Uuid::new_v4());
        let holder = held(&service, id, 1).await;
        assert!(service.return_lease(id, holder, budget).await.unwrap());
        // A pool with async work, whose freed slot nobody waits for: its
        // one ticket holds the other slot already.
        let id = PoolId(uuid::Uuid::new_v4());
        let holder = held(&service, id, 2).await;
        enqueue(&service, id).await;
        let step = service.dispatch_step(&id.key(), &[], budget).await.unwrap();
        assert_eq!(step.deliver.len(), 1, "granted");
        told.taken();
        assert!(service.return_lease(id, holder, budget).await.unwrap());
        assert_eq!(told.taken(), []);
    }

    #[tokio::test]
    async fn the_hook_hears_an_enqueue_that_finds_a_free_slot() {
        let (service, told) = service();
        let id = PoolId(uuid::Uuid::new_v4());
        service
            .register(id, 1, &mut Budget::new(None))
            .await
            .unwrap();
        enqueue(&service, id).await;
        assert_eq!(told.taken(), [id.key()], "the next step grants it");
        // Behind it: the slot is the first ticket's.
        enqueue(&service, id).await;
        assert_eq!(told.taken(), []);
        // A held pool.
        let id = PoolId(uuid::Uuid::new_v4());
        held(&service, id, 1).await;
        enqueue(&service, id).await;
        assert_eq!(told.taken(), []);
    }
}
