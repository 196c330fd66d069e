//! Async mode through the API, on both stores, with the dispatcher running
//! in-process and a test receiver: grants delivered in line with sync
//! waiters, idempotent enqueue, cancel, expiry, a failing receiver, and the
//! callbacks the service refuses.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use semaphore::callback::CallbackPolicy;
use semaphore::clock::now_ms;
use semaphore::delivery::{Caller, Dispatcher, Local};
use semaphore::domain::{
    Change, DeliveryClaim, LeaseDigest, ReturnPlan, TicketGrant, TicketItem, TicketState, Update,
};
use semaphore::keys::{LeaseId, PoolId, PoolKey};
use semaphore::service::{Budget, Claiming, Step, ToDeliver};
use semaphore::store::{
    PoolStore, PutTicket, Record, StoreError, StoreErrorKind, TicketStore, TicketUpdated, Updated,
};
use semaphore::Limits;
use semaphore_tests::counting::{Counters, CountingStore};
use semaphore_tests::forward::{Around, Forward};
use semaphore_tests::harness::{pool_id, ApiClient, Backend};
use semaphore_tests::receiver::{answer, read_request};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

on_both_stores!(
    workers = 4;
    grants_go_in_line_with_sync_waiters,
    enqueue_is_idempotent_by_lease,
    cancel_ends_a_waiting_ticket,
    a_ticket_not_served_in_its_wait_expires,
    a_refusing_receiver_fails_the_ticket_and_frees_the_slot,
    refused_callbacks_are_400,
    deleting_the_pool_ends_its_tickets,
    a_grant_cut_short_is_delivered_at_the_next_step,
    a_step_that_delivers_claims_its_grants_from_every_other_step,
    a_step_with_one_unreadable_ticket_hands_out_the_others,
    a_delivery_uses_the_claim_its_step_took,
    a_delivery_starts_as_its_step_claims_it,
    a_lease_returned_after_its_grant_was_claimed_is_not_delivered,
    a_step_that_hands_out_goes_on_while_a_free_slot_is_owed,
    dead_waiters_filling_the_queue_do_not_stall_the_backlog,
    deliveries_claimed_elsewhere_are_not_read_again_for_a_while,
    a_step_that_loses_a_grant_to_its_recorders_claim_looks_again_at_the_lapse,
    a_pool_settles_when_its_async_work_is_done,
    a_raised_count_serves_waiting_tickets,
    a_ticket_of_a_lease_id_in_use_ends_cancelled,
    a_returned_lease_is_never_delivered,
    a_ticket_reads_expired_at_its_deadline_and_is_never_granted_after,
    a_sync_borrower_leaves_no_live_ticket_behind,
    a_ticket_cancelled_while_its_admission_lands_is_never_served,
    a_slot_handed_to_a_ticket_as_it_expires_goes_back,
    a_backlog_that_cannot_change_wakes_nobody,
    a_full_backlog_refuses_tickets_with_a_409_naming_its_limit,
    a_borrower_that_could_not_wait_takes_a_spare_slot_over_waiters,
    an_unlisting_lands_after_another_unlisted_some_of_its_tickets,
);

/// What the receiver got: the Authorization header and the JSON body.
type Got = Arc<Mutex<Vec<(String, Value)>>>;

/// A receiver on loopback answering every POST with `status`.
async fn receiver(status: u16) -> (String, Got) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let got: Got = Arc::default();
    let record = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                if let Some(delivered) = read_request(&mut stream).await {
                    record
                        .lock()
                        .expect("lock")
                        .push((delivered.authorization, delivered.body));
                    answer(&mut stream, status).await;
                }
            });
        }
    });
    (url, got)
}

/// The API over one store, with async mode and its in-process dispatcher
/// (loopback receivers allowed, as local-api's setting does).
async fn api(backend: Backend, allow_local: bool) -> Arc<ApiClient> {
    api_and_store(backend, allow_local).await.0
}

/// [`api`], and its pool store (to see what the API does not show).
async fn api_and_store(
    backend: Backend,
    allow_local: bool,
) -> (Arc<ApiClient>, Arc<dyn PoolStore>) {
    let (store, tickets) = backend.stores().await;
    let policy = CallbackPolicy { allow_local };
    let local = Local::new();
    let client = Arc::new(ApiClient {
        service: semaphore::Service::new(store.clone(), Limits::default())
            .with_tickets(tickets.clone())
            .with_callback_policy(policy)
            .with_watch(local.watch()),
    });
    // The dispatcher's own service over the same stores (in AWS, another
    // function).
    let service = Arc::new(
        semaphore::Service::new(store.clone(), Limits::default())
            .with_tickets(tickets)
            .with_callback_policy(policy),
    );
    let caller = Caller::new(policy, Duration::from_secs(2)).expect("caller");
    local.start(Arc::new(
        Dispatcher::new(service, caller).with_bound(Duration::from_secs(3)),
    ));
    (client, store)
}

/// The API over one store with async mode and no dispatcher: nothing admits,
/// hands on or delivers but the requests themselves (and a test's own steps).
async fn undispatched(backend: Backend) -> ApiClient {
    undispatched_with(backend, Limits::default()).await
}

/// [`undispatched`] with these limits.
async fn undispatched_with(backend: Backend, limits: Limits) -> ApiClient {
    let (store, tickets) = backend.stores().await;
    ApiClient {
        service: service_over(store, tickets, limits),
    }
}

/// A service over these stores with async mode, callbacks to loopback
/// allowed, and `limits`; no dispatcher of its own.
fn service_over(
    store: Arc<dyn PoolStore>,
    tickets: Arc<dyn TicketStore>,
    limits: Limits,
) -> semaphore::Service {
    semaphore::Service::new(store, limits)
        .with_tickets(tickets)
        .with_callback_policy(CallbackPolicy { allow_local: true })
}

fn lease() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn enqueue(api: &ApiClient, pool: &str, lease: &str, url: &str, wait: f64) -> (u16, Value) {
    let body = json!({"ttl": 30, "wait": wait, "lease": lease,
        "callback": {"url": url, "token": "t0ken"}});
    api.call("POST", &format!("/l/{pool}/enqueue"), &body.to_string())
        .await
}

/// A new pool of `count` with `tickets` async tickets enqueued to a receiver
/// that never answers (each may wait 600 s): the pool, its key and the
/// tickets' lease ids.
async fn pool_with_tickets(
    api: &ApiClient,
    count: u32,
    tickets: usize,
) -> (String, PoolKey, Vec<String>) {
    let pool = pool_id();
    api.register(&pool, count).await;
    let leases: Vec<String> = (0..tickets).map(|_| lease()).collect();
    for mine in &leases {
        let (status, _) = enqueue(api, &pool, mine, "http://127.0.0.1:9/hook", 600.0).await;
        assert_eq!(status, 202);
    }
    let key = PoolId(pool.parse().expect("uuid")).key();
    (pool, key, leases)
}

async fn ticket(api: &ApiClient, pool: &str, lease: &str) -> Value {
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/ticket"),
            &json!({"lease": lease}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Polls the ticket until it is in `state` (or panics after `within`).
async fn until_state(
    api: &ApiClient,
    pool: &str,
    lease: &str,
    state: &str,
    within: Duration,
) -> Value {
    let start = Instant::now();
    loop {
        let body = ticket(api, pool, lease).await;
        if body["state"] == state {
            return body;
        }
        assert!(
            start.elapsed() < within,
            "still {body} after {within:?}, want {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn borrow_as(api: &ApiClient, pool: &str, lease: &str, ttl: f64, wait: f64) -> (u16, Value) {
    let body = json!({"ttl": ttl, "wait": wait, "lease": lease});
    api.call("POST", &format!("/l/{pool}/borrow"), &body.to_string())
        .await
}

async fn grants_go_in_line_with_sync_waiters(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let (a, b, c, d) = (lease(), lease(), lease(), lease());
    let (status, held) = borrow_as(&api, &pool, &a, 30.0, 0.0).await;
    assert_eq!(status, 200, "{held}");
    // b (sync) waits first, then c (async), then d (sync).
    let waiter = |lease: String| {
        let (api, pool) = (api.clone(), pool.clone());
        tokio::spawn(async move { borrow_as(&api, &pool, &lease, 30.0, 20.0).await })
    };
    let b_wait = waiter(b.clone());
    until_waiting(&api, &pool, 1).await;
    let (status, queued) = enqueue(&api, &pool, &c, &url, 600.0).await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(queued["ahead"], 1, "b waits before it: {queued}");
    until_waiting(&api, &pool, 2).await;
    let d_wait = waiter(d.clone());
    until_waiting(&api, &pool, 3).await;

    api.return_lease(&pool, &a).await;
    let (status, b_grant) = b_wait.await.expect("b");
    assert_eq!(status, 200, "{b_grant}");
    api.return_lease(&pool, &b).await;
    let delivered = until_state(&api, &pool, &c, "delivered", Duration::from_secs(10)).await;
    let calls = got.lock().expect("lock").clone();
    assert_eq!(calls.len(), 1, "delivered once: {calls:?}");
    let (auth, body) = &calls[0];
    assert_eq!(auth, "Bearer t0ken");
    assert_eq!(body["ticket"], queued["ticket"]);
    assert_eq!(body["fence"], delivered["fence"]);
    assert_eq!(body["position"], 0);
    assert!(
        body["fence"].as_u64() > b_grant["fence"].as_u64(),
        "c after b"
    );
    // The receiver is done: it returns the lease it chose, and d is next.
    api.return_lease(&pool, &c).await;
    let (status, d_grant) = d_wait.await.expect("d");
    assert_eq!(status, 200, "{d_grant}");
    assert!(
        d_grant["fence"].as_u64() > body["fence"].as_u64(),
        "d after c"
    );
}

async fn until_waiting(api: &ApiClient, pool: &str, waiting: u64) {
    let start = Instant::now();
    loop {
        let (_, state) = api.inspect(pool).await;
        if state["waiting"] == waiting {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{state}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn enqueue_is_idempotent_by_lease(backend: Backend) {
    let api = api(backend, true).await;
    let (url, _) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let first_lease = lease();
    let (status, first) = enqueue(&api, &pool, &first_lease, &url, 600.0).await;
    assert_eq!(status, 202, "{first}");
    let (status, again) = enqueue(&api, &pool, &first_lease, &url, 600.0).await;
    assert_eq!((status, &again["ticket"]), (202, &first["ticket"]));
    let (_, second) = enqueue(&api, &pool, &lease(), &url, 600.0).await;
    assert_eq!(
        second["ticket"].as_u64(),
        first["ticket"].as_u64().map(|n| n + 1),
        "the repeat took no number"
    );
    let status = ticket(&api, &pool, &first_lease).await;
    assert_eq!(status["state"], "waiting");
    assert_eq!(status["ahead"], 0);
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/ticket"),
            &json!({"lease": lease()}).to_string(),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("ticket not found"))
    );
    let (status, _) = enqueue(&api, &pool_id(), &lease(), &url, 600.0).await;
    assert_eq!(status, 404, "unknown pool");
}

async fn cancel_ends_a_waiting_ticket(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let mine = lease();
    enqueue(&api, &pool, &mine, &url, 600.0).await;
    until_waiting(&api, &pool, 1).await;
    for _ in 0..2 {
        let (status, body) = api
            .call(
                "POST",
                &format!("/l/{pool}/cancel"),
                &json!({"lease": mine}).to_string(),
            )
            .await;
        assert_eq!(
            (status, body["state"].as_str()),
            (200, Some("cancelled")),
            "{body}"
        );
    }
    api.return_lease(&pool, &holder).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(
        (state["available"].as_u64(), state["waiting"].as_u64()),
        (Some(1), Some(0)),
        "{state}"
    );
    assert!(
        got.lock().expect("lock").is_empty(),
        "a cancelled ticket is not called"
    );
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "cancelled");
}

async fn a_ticket_not_served_in_its_wait_expires(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let mine = lease();
    enqueue(&api, &pool, &mine, &url, 1.0).await;
    let body = until_state(&api, &pool, &mine, "expired", Duration::from_secs(6)).await;
    assert!(body["reason"].is_string(), "{body}");
    api.return_lease(&pool, &holder).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["available"], 1, "{state}");
    assert!(got.lock().expect("lock").is_empty());
}

async fn a_refusing_receiver_fails_the_ticket_and_frees_the_slot(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(410).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, &url, 600.0).await;
    assert_eq!(status, 202);
    let body = until_state(&api, &pool, &mine, "failed", Duration::from_secs(10)).await;
    assert!(
        body["reason"].as_str().is_some_and(|r| r.contains("410")),
        "{body}"
    );
    assert_eq!(got.lock().expect("lock").len(), 1, "a 4xx is not retried");
    let start = Instant::now();
    loop {
        let (_, state) = api.inspect(&pool).await;
        if state["available"] == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "slot still held: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn refused_callbacks_are_400(backend: Backend) {
    let api = api(backend, false).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    for url in [
        "http://example.com/hook",
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[fc00::1]/hook",
        "https://localhost/hook",
        "https://user:pw@example.com/hook",
        "not a url",
    ] {
        let (status, body) = enqueue(&api, &pool, &lease(), url, 60.0).await;
        assert_eq!(status, 400, "{url}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("callback")),
            "{url}: {body}"
        );
    }
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["waiting"], 0, "nothing was queued");
}

async fn deleting_the_pool_ends_its_tickets(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    borrow_as(&api, &pool, &lease(), 30.0, 0.0).await;
    let (admitted, backlog) = (lease(), lease());
    enqueue(&api, &pool, &admitted, &url, 600.0).await;
    enqueue(&api, &pool, &backlog, &url, 600.0).await;
    api.delete(&pool).await;
    for mine in [&admitted, &backlog] {
        let body = ticket(&api, &pool, mine).await;
        assert_eq!(body["state"], "failed", "{body}");
        assert_eq!(body["reason"], "its pool was deleted", "{body}");
    }
    // Registered again: the old tickets are still the old pool's.
    api.register(&pool, 1).await;
    assert_eq!(ticket(&api, &pool, &admitted).await["state"], "failed");
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/cancel"),
            &json!({"lease": backlog}).to_string(),
        )
        .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("failed")),
        "{body}"
    );
    // The lease may be used again in the new pool.
    let (status, again) = enqueue(&api, &pool, &admitted, &url, 600.0).await;
    assert_eq!(status, 202, "{again}");
    until_state(&api, &pool, &admitted, "delivered", Duration::from_secs(5)).await;
    assert_eq!(
        got.lock().expect("lock").len(),
        1,
        "only the new pool's ticket was called"
    );
}

/// The dispatcher's step alone (no delivery made): a granted ticket stays
/// listed and every later step hands it out again, until it ends.
async fn a_grant_cut_short_is_delivered_at_the_next_step(backend: Backend) {
    let api = undispatched(backend).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, "http://127.0.0.1:9/hook", 600.0).await;
    assert_eq!(status, 202);
    let key = PoolId(pool.parse().expect("uuid")).key();
    let first = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(first.deliver.len(), 1, "granted: {first:?}");
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "granted");
    // The dispatcher stopped before delivering: the next step has it again.
    let again = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(again.deliver, first.deliver);
    assert!(again.wake_ms.is_some(), "a wake while it is undelivered");
}

/// A step made for a caller that delivers at once claims each grant as it
/// records it: another dispatcher's step, meanwhile, hands out none of them
/// and looks again when the claims lapse; nor does a later round of the same
/// step read them again. Tickets that ended leave the list in one write.
async fn a_step_that_delivers_claims_its_grants_from_every_other_step(backend: Backend) {
    let api = undispatched(backend).await;
    let (_, key, _) = pool_with_tickets(&api, 3, 3).await;
    let claim_for = Duration::from_secs(10);
    let first = api
        .service
        .dispatch_step_to_deliver(&key, &[], claim_for, &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(first.deliver.len(), 3, "{first:?}");
    for delivery in &first.deliver {
        let claim = delivery.claim.expect("claimed by its step");
        assert_eq!(delivery.item.claim, Some(claim), "the claim is stored");
        assert_eq!(delivery.item.attempts, 1, "and counts the first attempt");
    }
    let mut second = Budget::new(None);
    let other = api
        .service
        .dispatch_step_to_deliver(&key, &[], claim_for, &mut second)
        .await
        .expect("step");
    assert!(other.deliver.is_empty(), "claimed by the first: {other:?}");
    let lapse = first
        .deliver
        .iter()
        .filter_map(|d| d.claim)
        .map(|c| c.until_ms)
        .min();
    assert_eq!(
        other.claim_lapses_ms, lapse,
        "it looks again when they lapse"
    );
    // One read of the pool and one of each ticket: no second round reads them.
    assert_eq!(second.stats.store_calls, 1 + 3, "{:?}", second.stats);
    // A step for a caller that hands its deliveries on takes no claim.
    let (pool, key, tickets) = pool_with_tickets(&api, 3, 3).await;
    let handed_on = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(handed_on.deliver.len(), 3);
    for delivery in &handed_on.deliver {
        assert_eq!((delivery.claim, delivery.item.claim), (None, None));
    }
    // Their leases returned undelivered, the next step ends them and
    // unlists all three (in one write), and the pool settles.
    for mine in &tickets {
        assert_eq!(api.return_lease(&pool, mine).await.0, 200);
    }
    let last = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert!(!last.active, "all unlisted, the pool settled: {last:?}");
    for mine in &tickets {
        assert_eq!(ticket(&api, &pool, mine).await["state"], "failed");
    }
}

/// A ticket store that counts its reads of tickets, and whose reads of one
/// ticket (if named) fail (the others answer); with `recorded_first`, the
/// first grant recorded through it was recorded just before by another
/// (from `waiting`, with that claim), as a route delivering it would.
struct WatchedTickets {
    inner: Arc<dyn TicketStore>,
    unreadable: Option<LeaseDigest>,
    reads: std::sync::atomic::AtomicUsize,
    recorded_first: std::sync::Mutex<Option<DeliveryClaim>>,
}

impl WatchedTickets {
    fn new(inner: Arc<dyn TicketStore>, unreadable: Option<LeaseDigest>) -> Arc<Self> {
        Arc::new(WatchedTickets {
            inner,
            unreadable,
            reads: Default::default(),
            recorded_first: Default::default(),
        })
    }

    fn recorded_first(inner: Arc<dyn TicketStore>, claim: DeliveryClaim) -> Arc<Self> {
        Arc::new(WatchedTickets {
            inner,
            unreadable: None,
            reads: Default::default(),
            recorded_first: std::sync::Mutex::new(Some(claim)),
        })
    }

    fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TicketStore for WatchedTickets {
    async fn put_ticket(
        &self,
        key: &PoolKey,
        ticket: &TicketItem,
    ) -> Result<PutTicket, StoreError> {
        self.inner.put_ticket(key, ticket).await
    }

    async fn ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<Option<TicketItem>, StoreError> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if Some(digest) == self.unreadable {
            return Err(StoreError::new(StoreErrorKind::TimedOut, "injected"));
        }
        self.inner.ticket(key, digest).await
    }

    async fn backlog(
        &self,
        key: &PoolKey,
        from: u64,
        limit: usize,
    ) -> Result<Vec<TicketItem>, StoreError> {
        self.inner.backlog(key, from, limit).await
    }

    async fn move_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        to: &TicketState,
    ) -> Result<TicketUpdated, StoreError> {
        self.inner.move_ticket(key, digest, from, to).await
    }

    async fn claim_attempt(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        fence: u64,
        claim: DeliveryClaim,
        now_ms: u64,
    ) -> Result<TicketUpdated, StoreError> {
        self.inner
            .claim_attempt(key, digest, fence, claim, now_ms)
            .await
    }

    async fn record_grant(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        grant: TicketGrant,
        claim: Option<DeliveryClaim>,
    ) -> Result<TicketUpdated, StoreError> {
        let first = self.recorded_first.lock().unwrap().take();
        if let Some(other) = first {
            let waiting = TicketState::Waiting;
            let recorded = self
                .inner
                .record_grant(key, digest, &waiting, grant, Some(other));
            assert!(matches!(recorded.await, Ok(TicketUpdated::Written(_))));
        }
        self.inner
            .record_grant(key, digest, from, grant, claim)
            .await
    }

    async fn delete_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        number: u64,
        incarnation: u64,
    ) -> Result<bool, StoreError> {
        self.inner
            .delete_ticket(key, digest, number, incarnation)
            .await
    }

    async fn delete_tickets(&self, key: &PoolKey) -> Result<usize, StoreError> {
        self.inner.delete_tickets(key).await
    }
}

/// A step whose read of one ticket fails still records, claims and hands
/// out the others' grants, and has the pool stepped again within a second.
async fn a_step_with_one_unreadable_ticket_hands_out_the_others(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let service = |tickets| service_over(store.clone(), tickets, Limits::default());
    let api = ApiClient {
        service: service(tickets.clone()),
    };
    let (_, key, leases) = pool_with_tickets(&api, 2, 2).await;
    let (readable, unreadable) = (leases[0].clone(), leases[1].clone());
    let flaky = service(WatchedTickets::new(
        tickets.clone(),
        Some(LeaseId(unreadable.parse().expect("uuid")).digest()),
    ));
    let before = semaphore::clock::now_ms();
    let step = flaky
        .dispatch_step_to_deliver(&key, &[], Duration::from_secs(10), &mut Budget::new(None))
        .await
        .expect("the claimed delivery goes ahead");
    assert_eq!(step.deliver.len(), 1, "{step:?}");
    assert_eq!(
        step.deliver[0].item.digest(),
        LeaseId(readable.parse().expect("uuid")).digest()
    );
    assert!(step.deliver[0].claim.is_some());
    let wake = step.wake_ms.expect("a wake");
    assert!(
        wake <= semaphore::clock::now_ms() + 1_000 && wake >= before,
        "{wake}"
    );
    // A step that claims nothing (a stream batch's) does the same: the
    // failure is logged, not the batch's, and a step soon looks again.
    let before = semaphore::clock::now_ms();
    let handing_on = flaky
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("its other tickets done");
    assert!(handing_on.deliver.is_empty(), "{handing_on:?}");
    let wake = handing_on.wake_ms.expect("a wake");
    assert!(
        wake <= semaphore::clock::now_ms() + 1_000 && wake >= before,
        "{wake}"
    );
    // The store answering again, the other is handed out.
    let again = api
        .service
        .dispatch_step_to_deliver(&key, &[], Duration::from_secs(10), &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(again.deliver.len(), 1, "{again:?}");
    assert_eq!(
        again.deliver[0].item.digest(),
        LeaseId(unreadable.parse().expect("uuid")).digest()
    );
}

/// The first attempt of a delivery uses the claim its step took: one
/// attempt counted, one POST, the ticket `delivered`.
async fn a_delivery_uses_the_claim_its_step_took(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let service = || service_over(store.clone(), tickets.clone(), Limits::default());
    let api = ApiClient { service: service() };
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, &url, 600.0).await;
    assert_eq!(status, 202);
    let key = PoolId(pool.parse().expect("uuid")).key();
    let caller = Caller::new(CallbackPolicy { allow_local: true }, Duration::from_secs(2));
    let dispatcher = Dispatcher::new(Arc::new(service()), caller.expect("caller"));
    let step = dispatcher.step_to_deliver(key).await.expect("step");
    assert_eq!(step.deliver.len(), 1);
    let claim = step.deliver[0].claim.expect("claimed");
    for delivery in step.deliver {
        dispatcher.deliver(key, delivery).await;
    }
    assert_eq!(got.lock().expect("lock").len(), 1);
    let item = tickets
        .ticket(&key, LeaseId(mine.parse().expect("uuid")).digest())
        .await
        .expect("read")
        .expect("item");
    assert_eq!(item.state.name(), "delivered");
    assert_eq!(item.attempts, 1, "the step's claim served the attempt");
    assert_eq!(item.claim, Some(claim), "no other claim written");
}

/// A step for a caller that delivers at once, through the service: the
/// step, and the deliveries it handed out as it claimed them, in order.
async fn step_handing(service: &semaphore::Service, key: &PoolKey) -> (Step, Vec<ToDeliver>) {
    let handed: Mutex<Vec<ToDeliver>> = Mutex::default();
    let hand = |delivery: ToDeliver| handed.lock().expect("lock").push(delivery);
    let claiming = Claiming {
        span: Duration::from_secs(10),
        hand: Some(&hand),
    };
    let step = service
        .dispatch_step_claiming(key, &[], claiming, &mut Budget::new(None))
        .await
        .expect("step");
    (step, handed.into_inner().expect("lock"))
}

/// A step made for a caller that delivers at once hands each delivery out
/// as soon as its grant and claim are written (one write): the step lists
/// none to deliver after. Each first attempt reads the pool once, after
/// the claim; a delivery the receiver took leaves nothing for the
/// invocation to step again for.
async fn a_delivery_starts_as_its_step_claims_it(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let api = ApiClient {
        service: service_over(store.clone(), tickets.clone(), Limits::default()),
    };
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 2).await;
    let (first, second) = (lease(), lease());
    for mine in [&first, &second] {
        let (status, _) = enqueue(&api, &pool, mine, &url, 600.0).await;
        assert_eq!(status, 202);
    }
    let key = PoolId(pool.parse().expect("uuid")).key();
    let counters = Arc::new(Counters::default());
    let counted: Arc<dyn PoolStore> = Arc::new(CountingStore::new(store.clone(), counters.clone()));
    let service = Arc::new(service_over(counted, tickets.clone(), Limits::default()));
    // Through the service: what the step hands out, as it hands it out.
    let (step, handed) = step_handing(&service, &key).await;
    assert!(step.deliver.is_empty(), "{step:?}");
    assert_eq!(step.handed, 2);
    assert_eq!(handed.len(), 2);
    for delivery in &handed {
        assert_eq!(delivery.item.attempts, 1, "claimed in the grant's write");
        assert_eq!(delivery.item.claim, delivery.claim);
    }
    let caller = Caller::new(CallbackPolicy { allow_local: true }, Duration::from_secs(2));
    let dispatcher = Arc::new(Dispatcher::new(service, caller.expect("caller")));
    let loads = counters.loads.load(Ordering::Relaxed);
    for delivery in handed {
        assert!(
            !dispatcher.deliver(key, delivery).await,
            "taken: nothing changed"
        );
    }
    assert_eq!(
        counters.loads.load(Ordering::Relaxed),
        loads + 2,
        "each first attempt read the pool once"
    );
    assert_eq!(got.lock().expect("lock").len(), 2);
    for mine in [&first, &second] {
        let item = tickets
            .ticket(&key, LeaseId(mine.parse().expect("uuid")).digest())
            .await
            .expect("read")
            .expect("item");
        assert_eq!((item.state.name(), item.attempts), ("delivered", 1));
    }
    // Through the dispatcher: the deliveries run in the set it fills.
    let third = lease();
    let (status, _) = enqueue(&api, &pool, &third, &url, 600.0).await;
    assert_eq!(status, 202);
    for mine in [&first, &second] {
        let (status, _) = api.return_lease(&pool, mine).await;
        assert_eq!(status, 200);
    }
    let mut deliveries = JoinSet::new();
    let step = dispatcher
        .step_and_deliver(key, &mut deliveries)
        .await
        .expect("step");
    assert!(step.deliver.is_empty(), "{step:?}");
    assert_eq!(step.handed, 1);
    while let Some(changed) = deliveries.join_next().await {
        assert!(!changed.expect("joined"));
    }
    assert_eq!(got.lock().expect("lock").len(), 3);
}

/// A lease returned (its lease id, by the client) after the step recorded
/// and claimed its grant, but before the first attempt: no attempt starts,
/// and the ticket fails saying so. (The checker found holders overlapping
/// when the first attempt began from a read of the pool made beside the
/// claim instead of after it.)
async fn a_lease_returned_after_its_grant_was_claimed_is_not_delivered(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let service = Arc::new(service_over(
        store.clone(),
        tickets.clone(),
        Limits::default(),
    ));
    let api = ApiClient {
        service: service_over(store, tickets.clone(), Limits::default()),
    };
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, &url, 600.0).await;
    assert_eq!(status, 202);
    let key = PoolId(pool.parse().expect("uuid")).key();
    let (step, handed) = step_handing(&service, &key).await;
    assert_eq!(step.handed, 1);
    let (status, body) = api.return_lease(&pool, &mine).await;
    assert_eq!((status, &body["returned"]), (200, &json!(true)), "{body}");
    let caller = Caller::new(CallbackPolicy { allow_local: true }, Duration::from_secs(2));
    let dispatcher = Dispatcher::new(service, caller.expect("caller"));
    for delivery in handed {
        dispatcher.deliver(key, delivery).await;
    }
    assert!(
        got.lock().expect("lock").is_empty(),
        "delivered a returned lease"
    );
    let item = tickets
        .ticket(&key, LeaseId(mine.parse().expect("uuid")).digest())
        .await
        .expect("read")
        .expect("item");
    assert!(
        matches!(&item.state, TicketState::Failed { reason } if reason.contains("returned")),
        "{:?}",
        item.state
    );
}

/// A step that hands its deliveries out as it goes ends with the round that
/// handed some, unless that round left a free slot owed to the queue: then
/// it serves and hands that one out too (no other write would wake it).
async fn a_step_that_hands_out_goes_on_while_a_free_slot_is_owed(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let api = ApiClient {
        service: service_over(store.clone(), tickets.clone(), Limits::default()),
    };
    let (url, _got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 2).await;
    let key = PoolId(pool.parse().expect("uuid")).key();
    let (first, second) = (lease(), lease());
    let (status, _) = enqueue(&api, &pool, &first, &url, 600.0).await;
    assert_eq!(status, 202);
    // A stream batch's step: the first ticket admitted, served and
    // recorded granted, its delivery handed on (here: dropped).
    let step = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(step.deliver.len(), 1, "{step:?}");
    // The second waits in the backlog; the other slot is free.
    let (status, _) = enqueue(&api, &pool, &second, &url, 600.0).await;
    assert_eq!(status, 202);
    // Its first round hands the first out and admits the second, which the
    // free slot is then owed to.
    let (step, handed) = step_handing(&api.service, &key).await;
    assert_eq!(step.handed, 2, "{step:?}");
    let mut handed: Vec<LeaseDigest> = handed.iter().map(|d| d.item.digest()).collect();
    handed.sort();
    let mut both = [&first, &second].map(|l| LeaseId(l.parse().expect("uuid")).digest());
    both.sort();
    assert_eq!(handed, both);
}

/// Sync waiters whose requests died without a cancel, filling the queue,
/// keep no async ticket in the backlog: a dispatcher step prunes them and
/// admits it.
async fn dead_waiters_filling_the_queue_do_not_stall_the_backlog(backend: Backend) {
    let limits = Limits {
        max_waiters: 2,
        ..Limits::default()
    };
    let api = undispatched_with(backend, limits).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    // The slot's holder lets its lease expire (no write frees it).
    let (status, _) = borrow_as(&api, &pool, &lease(), 3.0, 0.0).await;
    assert_eq!(status, 200);
    // Two sync waiters, their requests gone mid-wait (as a Lambda cut off).
    for _ in 0..2 {
        let waiter = lease();
        let waiting = borrow_as(&api, &pool, &waiter, 30.0, 1.0);
        assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err());
    }
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, "http://127.0.0.1:9/hook", 600.0).await;
    assert_eq!(status, 202);
    // Past the waiters' wait and grace, and the lease's expiry.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let key = PoolId(pool.parse().expect("uuid")).key();
    let step = api
        .service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert_eq!(step.deliver.len(), 1, "{step:?}");
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "granted");
}

/// A dispatcher that found deliveries claimed by another leaves them be
/// (no read of their tickets) until the claims lapse, and has the pool
/// looked at again then.
async fn deliveries_claimed_elsewhere_are_not_read_again_for_a_while(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let service = |tickets| service_over(store.clone(), tickets, Limits::default());
    let dispatcher = |tickets: Arc<dyn TicketStore>| {
        let caller = Caller::new(CallbackPolicy { allow_local: true }, Duration::from_secs(1));
        Dispatcher::new(Arc::new(service(tickets)), caller.expect("caller"))
    };
    let api = ApiClient {
        service: service(tickets.clone()),
    };
    let (_, key, _) = pool_with_tickets(&api, 2, 2).await;
    let first = dispatcher(tickets.clone());
    let claimed = first.step_to_deliver(key).await.expect("step");
    assert_eq!(claimed.deliver.len(), 2);
    let lapse = claimed
        .deliver
        .iter()
        .filter_map(|d| d.claim)
        .map(|c| c.until_ms)
        .min();
    let watched = WatchedTickets::new(tickets.clone(), None);
    let other = dispatcher(watched.clone());
    let seen = other.step_to_deliver(key).await.expect("step");
    assert!(seen.deliver.is_empty());
    assert_eq!(watched.reads(), 2, "each read once");
    assert!(seen.wake_ms <= lapse, "{:?} vs {lapse:?}", seen.wake_ms);
    let again = other.step_to_deliver(key).await.expect("step");
    assert!(again.deliver.is_empty());
    assert_eq!(watched.reads(), 2, "not read again while claimed");
    // Looked at again when they lapse, or within half a second if sooner (a
    // route that gives up its own delivery releases its claim early).
    let recheck = semaphore::clock::now_ms() + 500;
    assert!(again.wake_ms <= lapse, "{:?} vs {lapse:?}", again.wake_ms);
    assert!(
        again.wake_ms.is_some_and(|at| at <= recheck),
        "{:?}",
        again.wake_ms
    );
}

async fn a_step_that_loses_a_grant_to_its_recorders_claim_looks_again_at_the_lapse(
    backend: Backend,
) {
    let (store, tickets) = backend.stores().await;
    let api = ApiClient {
        service: service_over(store.clone(), tickets.clone(), Limits::default()),
    };
    let (_, key, _) = pool_with_tickets(&api, 1, 1).await;
    // A route records the grant, its delivery claimed, between the step's
    // read of the ticket (`waiting`) and its own record.
    let until_ms = semaphore::clock::now_ms() + 5_000;
    let claim = DeliveryClaim { by: 7, until_ms };
    let raced = WatchedTickets::recorded_first(tickets.clone(), claim);
    let service = service_over(store.clone(), raced.clone(), Limits::default());
    let step = service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await;
    let step = step.expect("step");
    assert!(raced.recorded_first.lock().unwrap().is_none(), "raced");
    assert!(step.deliver.is_empty(), "its recorder's: {step:?}");
    assert_eq!(step.claimed_elsewhere.len(), 1, "{step:?}");
    assert_eq!(step.claimed_elsewhere[0].1, until_ms);
    assert!(
        step.wake_ms <= Some(until_ms),
        "{:?} vs {until_ms}",
        step.wake_ms
    );
}

async fn a_pool_settles_when_its_async_work_is_done(backend: Backend) {
    let (api, store) = api_and_store(backend, true).await;
    let (url, _) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let key = PoolId(pool.parse().expect("uuid")).key();
    let mine = lease();
    enqueue(&api, &pool, &mine, &url, 600.0).await;
    until_state(&api, &pool, &mine, "delivered", Duration::from_secs(5)).await;
    api.return_lease(&pool, &mine).await;
    // Its writes stop invoking the dispatcher (the stream's filter) once the
    // dispatcher has nothing left to do.
    let start = Instant::now();
    loop {
        let record = store.load(&key).await.expect("load").expect("pool");
        if !record.pool.line().active {
            assert!(record.pool.line().is_settled());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            record.pool.line()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_raised_count_serves_waiting_tickets(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    borrow_as(&api, &pool, &lease(), 30.0, 0.0).await;
    let (first, second) = (lease(), lease());
    enqueue(&api, &pool, &first, &url, 600.0).await;
    enqueue(&api, &pool, &second, &url, 600.0).await;
    until_waiting(&api, &pool, 2).await;
    // Two more slots: no return, no expiry; the raise's write is the change.
    api.register(&pool, 3).await;
    let a = until_state(&api, &pool, &first, "delivered", Duration::from_secs(5)).await;
    let b = until_state(&api, &pool, &second, "delivered", Duration::from_secs(5)).await;
    let mut positions = [a["position"].as_u64(), b["position"].as_u64()];
    positions.sort();
    assert_eq!(
        positions,
        [Some(1), Some(2)],
        "the lowest free positions, in order"
    );
    assert!(
        a["fence"].as_u64() < b["fence"].as_u64(),
        "first in line, first served"
    );
    assert_eq!(got.lock().expect("lock").len(), 2);
}

/// An enqueue with the lease id of a lease already held: admission passes
/// the ticket (one lease id, one grant) and it ends, never left waiting.
async fn a_ticket_of_a_lease_id_in_use_ends_cancelled(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 2).await;
    let held = lease();
    let (status, _) = borrow_as(&api, &pool, &held, 30.0, 0.0).await;
    assert_eq!(status, 200);
    let (status, _) = enqueue(&api, &pool, &held, &url, 600.0).await;
    assert_eq!(status, 202);
    until_state(&api, &pool, &held, "cancelled", Duration::from_secs(5)).await;
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["in_use"], 1, "the borrow's lease stands: {state}");
    assert!(got.lock().expect("lock").is_empty());
}

/// A grant whose lease its lease id returned before any receiver took it:
/// no attempt starts after the return, and the ticket fails saying why.
async fn a_returned_lease_is_never_delivered(backend: Backend) {
    let api = api(backend, true).await;
    // The receiver is not up yet: its port refuses connections.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, &url, 600.0).await;
    assert_eq!(status, 202);
    api.return_lease(&pool, &holder).await;
    until_state(&api, &pool, &mine, "granted", Duration::from_secs(5)).await;
    let (status, body) = api.return_lease(&pool, &mine).await;
    assert_eq!((status, &body["returned"]), (200, &json!(true)), "{body}");
    // An attempt that read the pool just before the return landed may
    // still POST (the window docs/API.md names); it finds no receiver.
    // Every attempt after reads the lease returned.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The receiver comes up: it must never hear of the returned lease.
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("rebind");
    let heard = Arc::new(Mutex::new(0u32));
    let count = heard.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            if read_request(&mut stream).await.is_some() {
                *count.lock().expect("lock") += 1;
                answer(&mut stream, 200).await;
            }
        }
    });
    let body = until_state(&api, &pool, &mine, "failed", Duration::from_secs(5)).await;
    assert_eq!(
        body["reason"], "its lease was returned before its delivery was confirmed",
        "{body}"
    );
    // Longer than the dispatcher's retries would have taken to reach it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        *heard.lock().expect("lock"),
        0,
        "a returned lease was delivered"
    );
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "failed");
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["in_use"], 0, "{state}");
}

/// An async ticket reads `expired` as soon as its wait is over (not at the
/// dispatcher's next look), and a slot freed after its deadline is never
/// handed to it.
async fn a_ticket_reads_expired_at_its_deadline_and_is_never_granted_after(backend: Backend) {
    let api = api(backend, true).await;
    let (url, got) = receiver(200).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, &url, 1.0).await;
    assert_eq!(status, 202);
    // The deadline is the server's enqueue time + 1 s, before this instant + 1 s.
    let enqueued = Instant::now();
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "waiting");
    tokio::time::sleep_until((enqueued + Duration::from_secs(1)).into()).await;
    // One read, no polling: past its deadline it is expired.
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "expired");
    api.return_lease(&pool, &holder).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "expired");
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(
        (&state["available"], &state["waiting"]),
        (&json!(1), &json!(0)),
        "{state}"
    );
    assert!(
        got.lock().expect("lock").is_empty(),
        "delivered after its deadline"
    );
}

/// A sync borrower that waited behind async tickets (in the backlog) and
/// answered 409 leaves no ticket waiting under its lease id, and the same
/// lease id can borrow again (as the client's long waits do).
async fn a_sync_borrower_leaves_no_live_ticket_behind(backend: Backend) {
    // No dispatcher: the async ticket stays in the backlog, so the borrower
    // waits there too, then is admitted by its own reads.
    let api = undispatched(backend).await;
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let (status, _) = enqueue(&api, &pool, &lease(), "http://127.0.0.1:9/hook", 600.0).await;
    assert_eq!(status, 202);
    let mine = lease();
    for round in 0..2 {
        let started = Instant::now();
        let (status, body) = borrow_as(&api, &pool, &mine, 30.0, 1.0).await;
        assert_eq!(status, 409, "round {round}: {body}");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "round {round}: it waited its second"
        );
        let (status, body) = api
            .call(
                "POST",
                &format!("/l/{pool}/ticket"),
                &json!({"lease": mine}).to_string(),
            )
            .await;
        assert!(
            status == 404
                || ["cancelled", "expired"].contains(&body["state"].as_str().unwrap_or("")),
            "round {round}: a live ticket left behind: {status} {body}"
        );
    }
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["waiting"], 1, "only the async ticket waits: {state}");
}

/// Cancels one ticket just before the first admission write lands: after the
/// admitter read the backlog, and after the canceller's own read of the pool
/// (which found the ticket not yet queued).
struct CancelDuringAdmission {
    inner: Arc<dyn PoolStore>,
    tickets: Arc<dyn TicketStore>,
    victim: Arc<Mutex<Option<LeaseDigest>>>,
}

#[async_trait::async_trait]
impl Around for CancelDuringAdmission {
    fn inner(&self) -> &dyn PoolStore {
        self.inner.as_ref()
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let admits = update
            .changes
            .iter()
            .any(|c| matches!(c, Change::SetAdmitted(_)));
        let victim = admits
            .then(|| self.victim.lock().expect("lock").take())
            .flatten();
        if let Some(digest) = victim {
            self.tickets
                .set_ticket_state(key, digest, &TicketState::Waiting, &TicketState::Cancelled)
                .await?;
        }
        self.inner.update(key, read, update).await
    }
}

/// A cancel that races an admission (the ticket read waiting, then cancelled,
/// then queued by the admission's write) leaves the ticket out of the queue:
/// no slot is ever handed to it.
async fn a_ticket_cancelled_while_its_admission_lands_is_never_served(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let victim_digest = Arc::new(Mutex::new(None));
    let racing = CancelDuringAdmission {
        inner: store,
        tickets: tickets.clone(),
        victim: victim_digest.clone(),
    };
    let service = service_over(Arc::new(Forward(racing)), tickets, Limits::default());
    let api = ApiClient { service };
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let victim = lease();
    let (status, _) = enqueue(&api, &pool, &victim, "http://127.0.0.1:9/hook", 600.0).await;
    assert_eq!(status, 202);
    *victim_digest.lock().expect("lock") = Some(LeaseId(victim.parse().expect("uuid")).digest());
    let key = PoolId(pool.parse().expect("uuid")).key();
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    assert!(
        victim_digest.lock().expect("lock").is_none(),
        "it was admitted"
    );
    assert_eq!(ticket(&api, &pool, &victim).await["state"], "cancelled");
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(state["waiting"], 0, "a cancelled ticket in line: {state}");
    api.return_lease(&pool, &holder).await;
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(
        state["in_use"], 0,
        "a slot handed to a cancelled ticket: {state}"
    );
}

/// Lands `handoff` (a write planned from `read`, before its ticket's wait
/// was over) right before the next write through this store: a return
/// that handed its slot to the queued ticket, landing as a step expires it.
struct HandOffBeforeNextWrite {
    inner: Arc<dyn PoolStore>,
    handoff: Arc<Mutex<Option<(Record, Update)>>>,
    landed: Arc<Mutex<Option<Record>>>,
}

#[async_trait::async_trait]
impl Around for HandOffBeforeNextWrite {
    fn inner(&self) -> &dyn PoolStore {
        self.inner.as_ref()
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let handoff = self.handoff.lock().expect("lock").take();
        if let Some((planned_from, handoff)) = handoff {
            let lowered = planned_from.pool.lower(&handoff).0;
            if let Updated::Written(after) = self.inner.update(key, &planned_from, &lowered).await?
            {
                *self.landed.lock().expect("lock") = Some(after);
            }
        }
        self.inner.update(key, read, update).await
    }
}

/// A return planned while a ticket still waited hands it the slot, and
/// lands just as the dispatcher's step expires the ticket (after the step
/// read the pool, before it takes the ticket out of the queue): the slot
/// goes back, not held by nobody until its lease ends. (A random test on
/// DynamoDB Local found a slot left held so.)
async fn a_slot_handed_to_a_ticket_as_it_expires_goes_back(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let handoff = Arc::new(Mutex::new(None));
    let landed = Arc::new(Mutex::new(None));
    let racing = HandOffBeforeNextWrite {
        inner: store.clone(),
        handoff: handoff.clone(),
        landed: landed.clone(),
    };
    let service = service_over(Arc::new(Forward(racing)), tickets, Limits::default());
    let api = ApiClient { service };
    let pool = pool_id();
    api.register(&pool, 1).await;
    let holder = lease();
    borrow_as(&api, &pool, &holder, 30.0, 0.0).await;
    let mine = lease();
    let (status, _) = enqueue(&api, &pool, &mine, "http://127.0.0.1:9/hook", 0.3).await;
    assert_eq!(status, 202);
    let enqueued = Instant::now();
    let key = PoolId(pool.parse().expect("uuid")).key();
    // Admitted: in the queue.
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    let read = store.load(&key).await.expect("read").expect("the pool");
    let holder_digest = LeaseId(holder.parse().expect("uuid")).digest();
    let ReturnPlan::Return(_, update) = read.pool.plan_return(holder_digest, now_ms()) else {
        panic!("the holder's lease is live");
    };
    tokio::time::sleep_until((enqueued + Duration::from_millis(400)).into()).await;
    *handoff.lock().expect("lock") = Some((read, update));
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    let mine_digest = LeaseId(mine.parse().expect("uuid")).digest();
    let after = landed
        .lock()
        .expect("lock")
        .take()
        .expect("the hand-off landed");
    assert!(
        after.pool.lease_of(mine_digest).is_some(),
        "the return handed the ticket its slot"
    );
    assert_eq!(ticket(&api, &pool, &mine).await["state"], "expired");
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(
        (&state["in_use"], &state["waiting"]),
        (&json!(0), &json!(0)),
        "a slot handed to an expired ticket is held: {state}"
    );
}

/// A full pool with tickets waiting long (a backlog left over, for 40): once
/// stepped, nothing is due until a change (which invokes a step itself) or
/// the first deadline; the dispatcher's next wake is not a poll. (It was a
/// second while a backlog was left: 20 steps in 20 s.)
async fn a_backlog_that_cannot_change_wakes_nobody(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let policy = CallbackPolicy { allow_local: true };
    let service = || {
        semaphore::Service::new(store.clone(), Limits::default())
            .with_tickets(tickets.clone())
            .with_callback_policy(policy)
    };
    let api = ApiClient { service: service() };
    let caller = Caller::new(policy, Duration::from_secs(2)).expect("caller");
    let dispatcher = Dispatcher::new(Arc::new(service()), caller);
    for count in [20, 40] {
        let pool = pool_id();
        api.register(&pool, 0).await;
        for _ in 0..count {
            let (status, body) =
                enqueue(&api, &pool, &lease(), "http://127.0.0.1:9/hook", 600.0).await;
            assert_eq!(status, 202, "{body}");
        }
        let key = PoolId(pool.parse().expect("uuid")).key();
        // Admission takes a step per half window; then nothing changes.
        let mut wake = None;
        for _ in 0..4 {
            let step = dispatcher.step(key).await.expect("step");
            assert!(step.deliver.is_empty(), "count 0 grants nothing");
            wake = step.wake_ms;
        }
        let wake = wake.expect("a wake while tickets wait");
        let now = semaphore::clock::now_ms();
        assert!(
            wake >= now + 50_000,
            "{count} tickets: the next step is due in {} ms",
            wake.saturating_sub(now)
        );
    }
}

/// `MAX_TICKETS`: a pool's backlog holds at most that many tickets; an
/// enqueue past it (and a borrower that would wait in it) gets a 409 that
/// names the limit, and nothing is written. Admission makes room again.
async fn a_full_backlog_refuses_tickets_with_a_409_naming_its_limit(backend: Backend) {
    let limits = Limits {
        max_tickets: 3,
        ..Limits::default()
    };
    let api = undispatched_with(backend, limits).await;
    let pool = pool_id();
    api.register(&pool, 0).await;
    let hook = "http://127.0.0.1:9/hook";
    let first = lease();
    for mine in [first.clone(), lease(), lease()] {
        let (status, body) = enqueue(&api, &pool, &mine, hook, 600.0).await;
        assert_eq!(status, 202, "{body}");
    }
    let refused = lease();
    let (status, body) = enqueue(&api, &pool, &refused, hook, 600.0).await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("3 tickets") && error.contains("MAX_TICKETS"),
        "{error}"
    );
    // A repeat takes no number: it answers its ticket.
    let (status, body) = enqueue(&api, &pool, &first, hook, 600.0).await;
    assert_eq!((status, body["ticket"].as_u64()), (202, Some(0)), "{body}");
    // A borrower that would wait behind them in the backlog: the same.
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/borrow"),
            &json!({"ttl": 5, "wait": 1}).to_string(),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("MAX_TICKETS"),
        "{body}"
    );
    // Nothing was written for the refused one.
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/ticket"),
            &json!({"lease": refused}).to_string(),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    // Admission takes the three into the line: room for more.
    let key = PoolId(pool.parse().expect("uuid")).key();
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    let (status, body) = enqueue(&api, &pool, &lease(), hook, 600.0).await;
    assert_eq!(status, 202, "{body}");
}

/// A pool of 3 with one slot held and one async ticket waiting (admitted to
/// the queue by one step; no dispatcher runs, so nobody hands the two spare
/// slots on).
async fn spare_slots_behind_a_ticket(api: &ApiClient) -> String {
    let (pool, key, _) = pool_with_tickets(api, 1, 0).await;
    api.borrow(&pool, 30.0, 0.0).await;
    let (status, _) = enqueue(api, &pool, &lease(), "http://127.0.0.1:9/hook", 600.0).await;
    assert_eq!(status, 202);
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    api.register(&pool, 3).await;
    let (_, state) = api.inspect(&pool).await;
    assert_eq!(
        (state["available"].as_u64(), state["waiting"].as_u64()),
        (Some(2), Some(1))
    );
    pool
}

/// A borrower that may wait joins behind waiting tickets even when slots are
/// spare (the queue's head hands them on). One that could not wait takes a
/// spare slot instead, as it always could: when the queue is full, and when
/// the service's waiting budget is in use (a borrow that gets a free slot at
/// once is never refused for the budget).
async fn a_borrower_that_could_not_wait_takes_a_spare_slot_over_waiters(backend: Backend) {
    let takes = |api: Arc<ApiClient>, pool: String| async move {
        let (status, body) = api.borrow(&pool, 30.0, 2.0).await;
        assert_eq!(
            (status, body["position"].as_u64()),
            (200, Some(1)),
            "{body}"
        );
        let (_, state) = api.inspect(&pool).await;
        assert_eq!(state["waiting"], 1, "the ticket still waits: {state}");
    };
    // The queue full (1 of 1).
    let limits = Limits {
        max_waiters: 1,
        ..Limits::default()
    };
    let api = Arc::new(undispatched_with(backend, limits).await);
    let pool = spare_slots_behind_a_ticket(&api).await;
    takes(api, pool).await;
    // The budget's one pass held by a waiter on a full pool.
    let limits = Limits {
        waiting_budget: 1,
        ..Limits::default()
    };
    let api = Arc::new(undispatched_with(backend, limits).await);
    let pool = spare_slots_behind_a_ticket(&api).await;
    let full = pool_id();
    api.register(&full, 1).await;
    api.borrow(&full, 30.0, 0.0).await;
    let budget_holder = {
        let (api, full) = (api.clone(), full.clone());
        tokio::spawn(async move { api.borrow(&full, 30.0, 3.0).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    takes(api, pool).await;
    let (status, _) = budget_holder.await.expect("waiter");
    assert_eq!(status, 409);
}

/// Steps running at once find the same tickets ended: one's unlisting of
/// some of them first does not make the other's lose (each loss cost a
/// reread of the round's tickets and another write); it lands and unlists
/// the rest. (It lost before: 0.44 lost writes a ticket in the burst.)
async fn an_unlisting_lands_after_another_unlisted_some_of_its_tickets(backend: Backend) {
    let (store, tickets) = backend.stores().await;
    let api = ApiClient {
        service: service_over(store.clone(), tickets, Limits::default()),
    };
    let (_, key, leases) = pool_with_tickets(&api, 3, 3).await;
    api.service
        .dispatch_step(&key, &[], &mut Budget::new(None))
        .await
        .expect("step");
    let read = store.load(&key).await.expect("read").expect("the pool");
    let digests: Vec<_> = leases
        .iter()
        .map(|l| LeaseId(l.parse().expect("uuid")).digest())
        .collect();
    assert_eq!(read.pool.line().listed.len(), 3, "all three listed");
    let all = read.pool.plan_unlist_all(&digests).expect("listed");
    let first = read.pool.plan_unlist(digests[1]).expect("listed");
    let Updated::Written(_) = store.update(&key, &read, &first).await.expect("write") else {
        panic!("the first unlisting lands");
    };
    match store.update(&key, &read, &all).await.expect("write") {
        Updated::Written(after) => assert!(
            after.pool.line().listed.is_empty(),
            "the rest unlisted: {:?}",
            after.pool.line()
        ),
        other => panic!("the second unlisting lost: {other:?}"),
    }
}
