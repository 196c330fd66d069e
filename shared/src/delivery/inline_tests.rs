//! A route's own deliveries: made before the request answers, or left to
//! the dispatcher through a wake.
use std::time::Instant;

use tokio::sync::watch;

use super::*;
use crate::callback::CallbackPolicy;
use crate::delivery::test_support::{enqueue_request, receiver, Sent};
use crate::delivery::wake::Wake;
use crate::delivery::Caller;
use crate::domain::{TicketState, Update};
use crate::keys::{LeaseId, PoolId};
use crate::service::{BorrowRequest, Budget, Service};
use crate::store::forward::{Around, Forward};
use crate::store::{MemoryStore, PoolStore, Record, StoreError, Updated};
use crate::Limits;

struct Fixture {
    service: Service,
    sent: Arc<Sent>,
}

/// A route function's service: its grants delivered within `bound`.
fn fixture(bound: Duration) -> Fixture {
    let store = Arc::new(MemoryStore::new());
    fixture_over(store.clone(), store, bound)
}

/// [`fixture`] with its pools in `store`.
fn fixture_over(store: Arc<dyn PoolStore>, tickets: Arc<MemoryStore>, bound: Duration) -> Fixture {
    let policy = CallbackPolicy { allow_local: true };
    let service = Service::new(store, Limits::default())
        .with_tickets(tickets)
        .with_callback_policy(policy);
    let caller = Caller::new(policy, bound).unwrap();
    let dispatcher = Dispatcher::new(Arc::new(service.clone()), caller);
    let sent = Arc::new(Sent::default());
    let hook = DeliverOnGrant::new(Arc::new(dispatcher), Some(WakeOnGrant::new(sent.clone())))
        .with_bound(bound);
    Fixture {
        service: service.with_on_async_grant(Arc::new(hook)),
        sent,
    }
}

/// A slot of the pool, held for a minute: its lease.
async fn hold(f: &Fixture, id: PoolId) -> LeaseId {
    let lease = LeaseId::new_random();
    let borrow = BorrowRequest {
        ttl_ms: 60_000,
        wait_ms: 0,
        lease,
    };
    f.service
        .borrow(id, borrow, &mut Budget::new(None))
        .await
        .unwrap();
    lease
}

/// An async ticket calling back `url`: its lease.
async fn enqueue_to(f: &Fixture, id: PoolId, url: String) -> LeaseId {
    let lease = LeaseId::new_random();
    let enqueue = enqueue_request(lease, url);
    f.service
        .enqueue(id, enqueue, &mut Budget::new(None))
        .await
        .unwrap();
    lease
}

/// A pool of one slot, held, and an async ticket calling back `url`,
/// admitted to its queue: the holder's lease and the ticket's.
async fn held_with_a_ticket(f: &Fixture, id: PoolId, url: String) -> (LeaseId, LeaseId) {
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let holder = hold(f, id).await;
    let ticket = enqueue_to(f, id, url).await;
    // The dispatcher's step admits it (the slot is held: no grant yet).
    f.service
        .dispatch_step(&id.key(), &[], budget)
        .await
        .unwrap();
    (holder, ticket)
}

async fn state(f: &Fixture, id: PoolId, lease: LeaseId) -> TicketState {
    let report = f.service.ticket(id, lease, &mut Budget::new(None)).await;
    report.unwrap().item.state
}

fn now_wake(id: PoolId) -> (Wake, Duration) {
    let wake = Wake {
        key: id.key(),
        at_ms: None,
    };
    (wake, Duration::ZERO)
}

#[tokio::test]
async fn a_return_that_hands_its_slot_on_delivers_it_before_it_answers() {
    let f = fixture(Duration::from_secs(1));
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let (holder, ticket) = held_with_a_ticket(&f, id, format!("http://{addr}/ok")).await;
    let budget = &mut Budget::new(None);
    assert!(f.service.return_lease(id, holder, budget).await.unwrap());
    assert_eq!(
        arrived.try_recv().as_deref(),
        Ok("/ok"),
        "delivered before the answer"
    );
    let state = state(&f, id, ticket).await;
    assert!(matches!(state, TicketState::Delivered { .. }), "{state:?}");
    assert_eq!(f.sent.taken(), [], "nothing left to the dispatcher");
    assert!(arrived.try_recv().is_err(), "once");
}

#[tokio::test]
async fn a_receiver_slower_than_the_bound_is_left_to_the_dispatcher() {
    let bound = Duration::from_millis(300);
    let f = fixture(bound);
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let (holder, ticket) = held_with_a_ticket(&f, id, format!("http://{addr}/hang")).await;
    let started = Instant::now();
    let budget = &mut Budget::new(None);
    assert!(f.service.return_lease(id, holder, budget).await.unwrap());
    let took = started.elapsed();
    assert!(
        took < bound * 3,
        "the return waited {took:?} for its receiver"
    );
    assert_eq!(arrived.try_recv().as_deref(), Ok("/hang"));
    // Granted, its claim released: the dispatcher, woken, delivers it again
    // at once (not when the claim would have lapsed).
    let state = state(&f, id, ticket).await;
    assert!(matches!(state, TicketState::Granted(_)), "{state:?}");
    assert_eq!(f.sent.taken(), [now_wake(id)], "the dispatcher woken");
    let step = f.service.dispatch_step(&id.key(), &[], budget).await;
    let step = step.unwrap();
    assert_eq!(step.deliver.len(), 1, "{step:?}");
    assert!(step.claimed_elsewhere.is_empty());
}

#[tokio::test]
async fn a_refused_grant_fails_returns_its_slot_and_wakes_the_dispatcher() {
    let f = fixture(Duration::from_secs(1));
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let (holder, ticket) = held_with_a_ticket(&f, id, format!("http://{addr}/refuse")).await;
    let budget = &mut Budget::new(None);
    assert!(f.service.return_lease(id, holder, budget).await.unwrap());
    assert_eq!(arrived.try_recv().as_deref(), Ok("/refuse"));
    let state = state(&f, id, ticket).await;
    assert!(matches!(state, TicketState::Failed { .. }), "{state:?}");
    let pool = f.service.inspect(id, &mut Budget::new(None)).await.unwrap();
    assert_eq!(pool.in_use, 0, "its lease returned");
    // Its slot may go on to another ticket: the dispatcher's to see.
    assert_eq!(f.sent.taken(), [now_wake(id)]);
}

#[tokio::test]
async fn a_request_short_of_time_leaves_its_grants_to_the_dispatcher() {
    let f = fixture(Duration::from_secs(1));
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let (holder, ticket) = held_with_a_ticket(&f, id, format!("http://{addr}/ok")).await;
    // Less time left than an attempt and what follows it would need: the
    // request keeps it for its own answer.
    let deadline = Instant::now() + Duration::from_secs(2);
    let budget = &mut Budget::new(Some(deadline));
    assert!(f.service.return_lease(id, holder, budget).await.unwrap());
    assert!(Instant::now() < deadline);
    assert!(arrived.try_recv().is_err(), "no attempt");
    assert_eq!(state(&f, id, ticket).await, TicketState::Waiting);
    assert_eq!(f.sent.taken(), [now_wake(id)], "the dispatcher woken");
}

/// A store whose next pool write first lets `before` run (another request's
/// write lands between a request's read and its own).
struct Between {
    inner: Arc<MemoryStore>,
    before: std::sync::Mutex<Option<futures_util::future::BoxFuture<'static, ()>>>,
}

#[async_trait]
impl Around for Between {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let before = self.before.lock().unwrap().take();
        if let Some(before) = before {
            before.await;
        }
        self.inner.update(key, read, update).await
    }
}

#[tokio::test]
async fn a_return_delivers_its_own_grant_not_one_that_landed_after_its_read() {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(Forward(Between {
        inner: memory.clone(),
        before: std::sync::Mutex::new(None),
    }));
    let f = fixture_over(store.clone(), memory, Duration::from_secs(1));
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    // Two slots, both held; two tickets in line.
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    f.service.register(id, 2, budget).await.unwrap();
    let holders = [hold(&f, id).await, hold(&f, id).await];
    let mut tickets = Vec::new();
    for path in ["/ok-first", "/ok-second"] {
        tickets.push(enqueue_to(&f, id, format!("http://{addr}{path}")).await);
    }
    f.service
        .dispatch_step(&id.key(), &[], budget)
        .await
        .unwrap();
    // The second holder's return reads the pool; the first holder's return
    // lands before its write (handing the first ticket its slot, and
    // delivering it), then its own write hands the second ticket the other.
    let other = f.service.clone();
    let first = holders[0];
    *store.0.before.lock().unwrap() = Some(Box::pin(async move {
        let budget = &mut Budget::new(None);
        assert!(other.return_lease(id, first, budget).await.unwrap());
    }));
    assert!(f
        .service
        .return_lease(id, holders[1], budget)
        .await
        .unwrap());
    let mut paths = vec![arrived.try_recv().unwrap(), arrived.try_recv().unwrap()];
    paths.sort();
    assert_eq!(paths, ["/ok-first", "/ok-second"], "each delivered once");
    assert!(arrived.try_recv().is_err(), "nothing twice");
    for ticket in tickets {
        let state = state(&f, id, ticket).await;
        assert!(matches!(state, TicketState::Delivered { .. }), "{state:?}");
    }
    // The later write did not take the earlier grant for its own: it
    // neither tried to record it nor woke the dispatcher for it.
    assert_eq!(f.sent.taken(), [], "nothing left to the dispatcher");
}

#[tokio::test]
async fn a_return_that_frees_a_slot_while_tickets_wait_unadmitted_wakes_the_dispatcher() {
    let f = fixture(Duration::from_secs(1));
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let holder = hold(&f, id).await;
    let ticket = enqueue_to(&f, id, "http://127.0.0.1:9/never".into()).await;
    assert_eq!(f.sent.taken(), [], "the slot was held: nothing to do yet");
    // Not admitted yet (no step since): the return frees the slot to nobody.
    assert!(f.service.return_lease(id, holder, budget).await.unwrap());
    assert_eq!(state(&f, id, ticket).await, TicketState::Waiting);
    assert_eq!(
        f.sent.taken(),
        [now_wake(id)],
        "the dispatcher woken to admit it, not left to the stream"
    );
}

#[tokio::test]
async fn a_resize_up_that_leaves_a_slot_owed_to_a_ticket_wakes_the_dispatcher() {
    let f = fixture(Duration::from_secs(1));
    let id = PoolId(uuid::Uuid::new_v4());
    let (_holder, ticket) = held_with_a_ticket(&f, id, "http://127.0.0.1:9/never".into()).await;
    assert_eq!(f.sent.taken(), []);
    // The resize's write hands nothing on: the dispatcher's step does.
    let budget = &mut Budget::new(None);
    f.service.register(id, 2, budget).await.unwrap();
    assert_eq!(state(&f, id, ticket).await, TicketState::Waiting);
    assert_eq!(f.sent.taken(), [now_wake(id)], "the dispatcher woken");
}
