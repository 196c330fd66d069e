//! Fences, idempotent borrows and fair (FIFO) waiting, on both stores.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use semaphore::domain::{Change, Update};
use semaphore::keys::PoolKey;
use semaphore::store::{PoolStore, Record, StoreError, Updated};
use semaphore::Limits;
use semaphore_tests::forward::{Around, Forward};
use semaphore_tests::harness::{pool_id, ApiClient, Backend};
use serde_json::Value;
use tokio::sync::{oneshot, Mutex};

on_both_stores!(
    workers = 4;
    fences_strictly_increase_even_across_delete,
    a_borrow_with_a_lease_id_is_idempotent,
    concurrent_duplicates_take_one_slot,
    waiting_duplicates_take_one_slot_and_leave_no_ticket,
    waiters_are_served_in_arrival_order,
    a_newcomer_never_takes_a_slot_an_earlier_waiter_waits_for,
    a_full_queue_refuses_at_once,
    a_waiter_that_gives_up_leaves_no_trace,
    a_return_whose_borrow_lands_just_before_its_tombstone_gives_it_up,
    slots_freed_together_go_lowest_first_in_arrival_order,
);

/// `instances` services over one store, as Lambda containers share a table.
async fn instances(backend: Backend, n: usize, limits: Limits) -> Vec<Arc<ApiClient>> {
    let store = backend.store().await;
    (0..n)
        .map(|_| Arc::new(ApiClient::new(store.clone(), limits)))
        .collect()
}

async fn borrow_as(api: &ApiClient, id: &str, lease: &str, ttl: f64, wait: f64) -> (u16, Value) {
    api.call(
        "POST",
        &format!("/l/{id}/borrow"),
        &format!(r#"{{"ttl":{ttl},"wait":{wait},"lease":"{lease}"}}"#),
    )
    .await
}

fn fence(body: &Value) -> u64 {
    body["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no fence in {body}"))
}

async fn fences_strictly_increase_even_across_delete(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 2).await;
    let mut last = 0;
    for _ in 0..5 {
        let (status, a) = api.borrow(&id, 30.0, 0.0).await;
        assert_eq!(status, 200, "{a}");
        let (_, b) = api.borrow(&id, 30.0, 0.0).await;
        assert!(fence(&a) > last && fence(&b) > fence(&a), "{a} {b}");
        last = fence(&b);
        for body in [a, b] {
            api.return_lease(&id, body["lease"].as_str().unwrap()).await;
        }
    }
    // Deleted and registered again at once: the new pool's fences are above
    // every fence the old one issued.
    api.delete(&id).await;
    api.register(&id, 1).await;
    let (_, body) = api.borrow(&id, 30.0, 0.0).await;
    assert!(fence(&body) > last, "{} after {last}", fence(&body));
    assert!(fence(&body) < 1 << 53);
}

async fn a_borrow_with_a_lease_id_is_idempotent(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 3).await;
    let lease = uuid::Uuid::new_v4().to_string();
    let (status, first) = borrow_as(&api, &id, &lease.to_uppercase(), 30.0, 0.0).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        first["lease"],
        lease.as_str(),
        "the id the client chose, lowercase"
    );
    assert_eq!(first["expires_in"], 30);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, again) = borrow_as(&api, &id, &lease, 30.0, 0.0).await;
    assert_eq!(status, 200);
    for field in ["lease", "position", "expires_at_unix", "fence"] {
        assert_eq!(again[field], first[field], "{field}: {first} vs {again}");
    }
    let left = again["expires_in"].as_f64().unwrap();
    assert!(
        left < 30.0 && left > 29.0,
        "expires_in is the time left: {again}"
    );
    assert_eq!(api.inspect(&id).await.1["in_use"], 1, "one slot, not two");

    // Returned, the id may be used again: a new grant.
    assert_eq!(api.return_lease(&id, &lease).await.1["returned"], true);
    let (status, fresh) = borrow_as(&api, &id, &lease, 30.0, 0.0).await;
    assert_eq!(status, 200);
    assert!(fence(&fresh) > fence(&first));
    assert_eq!(api.inspect(&id).await.1["in_use"], 1);

    // The nil UUID, or not a UUID: 400.
    for bad in ["00000000-0000-0000-0000-000000000000", "x"] {
        let (status, body) = borrow_as(&api, &id, bad, 30.0, 0.0).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

/// Eight copies of one borrow (a client retrying after lost answers) race
/// over four instances: one slot is taken, and every copy answers its grant.
async fn concurrent_duplicates_take_one_slot(backend: Backend) {
    let apis = instances(backend, 4, Limits::default()).await;
    let id = pool_id();
    apis[0].register(&id, 3).await;
    let lease = uuid::Uuid::new_v4().to_string();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (api, id, lease) = (apis[i % 4].clone(), id.clone(), lease.clone());
            tokio::spawn(async move { borrow_as(&api, &id, &lease, 30.0, 0.0).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        answers.push((body["position"].clone(), fence(&body)));
    }
    answers.dedup();
    assert_eq!(answers.len(), 1, "copies disagree: {answers:?}");
    assert_eq!(apis[0].inspect(&id).await.1["in_use"], 1);
}

/// Copies of one borrow waiting on a full pool: when a slot frees, they all
/// answer the one grant, and none leaves a ticket that would make later
/// borrowers wait.
async fn waiting_duplicates_take_one_slot_and_leave_no_ticket(backend: Backend) {
    let apis = instances(backend, 4, Limits::default()).await;
    let id = pool_id();
    apis[0].register(&id, 1).await;
    let (_, holder) = apis[0].borrow(&id, 30.0, 0.0).await;
    let lease = uuid::Uuid::new_v4().to_string();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (api, id, lease) = (apis[i].clone(), id.clone(), lease.clone());
            tokio::spawn(async move { borrow_as(&api, &id, &lease, 30.0, 5.0).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    apis[0]
        .return_lease(&id, holder["lease"].as_str().unwrap())
        .await;
    let mut fences = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        fences.push(fence(&body));
    }
    fences.dedup();
    assert_eq!(fences.len(), 1, "copies got different grants: {fences:?}");
    assert_eq!(apis[0].inspect(&id).await.1["in_use"], 1);
    apis[0].return_lease(&id, &lease).await;
    let started = Instant::now();
    let (status, body) = apis[1].borrow(&id, 30.0, 0.0).await;
    assert_eq!(status, 200, "a copy's ticket was left behind: {body}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// Five waiters arrive 60 ms apart on a held pool of count 1; each holds its
/// slot 100 ms. They are granted in the order they arrived.
async fn waiters_are_served_in_arrival_order(backend: Backend) {
    let apis = instances(backend, 4, Limits::default()).await;
    let id = pool_id();
    apis[0].register(&id, 1).await;
    let (_, holder) = apis[0].borrow(&id, 30.0, 0.0).await;
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let (api, id) = (apis[i % 4].clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let (status, body) = api.borrow(&id, 0.1, 10.0).await;
            (i, status, body, Instant::now())
        }));
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    apis[0]
        .return_lease(&id, holder["lease"].as_str().unwrap())
        .await;
    let mut grants = Vec::new();
    for task in tasks {
        let (i, status, body, at) = task.await.unwrap();
        assert_eq!(status, 200, "waiter {i}: {body}");
        grants.push((fence(&body), i, at));
    }
    grants.sort();
    let order: Vec<usize> = grants.iter().map(|g| g.1).collect();
    assert_eq!(order, [0, 1, 2, 3, 4], "granted out of arrival order");
    assert!(grants.windows(2).all(|w| w[0].2 <= w[1].2));
}

/// Three waiters on a full pool; two slots free at once (a raise, then two
/// leases expiring together): the first waiter gets the lowest position,
/// the second the next, and the third waits on. Each waiter is granted the
/// lowest position free at its grant, as every borrow is.
async fn slots_freed_together_go_lowest_first_in_arrival_order(backend: Backend) {
    let apis = instances(backend, 3, Limits::default()).await;
    for round in 0..4 {
        let id = pool_id();
        apis[0].register(&id, 3).await;
        for _ in 0..3 {
            apis[0].borrow(&id, 30.0, 0.0).await;
        }
        let mut waiters = Vec::new();
        for i in 0..3usize {
            let (api, pool) = (apis[i].clone(), id.clone());
            waiters.push(tokio::spawn(
                async move { api.borrow(&pool, 0.5, 3.0).await },
            ));
            // Arrival order: each joins before the next.
            while apis[0].inspect(&id).await.1["waiting"] != i + 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // Wait until every waiter has read at least once more.
        tokio::time::sleep(Duration::from_millis(150)).await;
        apis[0].register(&id, 5).await;
        let mut positions = Vec::new();
        for waiter in waiters.drain(..2) {
            let (status, body) = waiter.await.unwrap();
            assert_eq!(status, 200, "round {round}: {body}");
            positions.push(body["position"].as_u64().unwrap());
        }
        assert_eq!(positions, [3, 4], "round {round}: after a raise");
        // Leases 3 and 4 (0.5 s) expire together; the third waiter and a
        // fourth that joins now get them, lowest first.
        let (api, id2) = (apis[1].clone(), id.clone());
        let fourth = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            api.borrow(&id2, 0.5, 3.0).await
        });
        let third = waiters.pop().unwrap().await.unwrap();
        let fourth = fourth.await.unwrap();
        assert_eq!(
            (third.1["position"].as_u64(), fourth.1["position"].as_u64()),
            (Some(3), Some(4)),
            "round {round}: after expiries: {third:?} {fourth:?}"
        );
    }
}

/// A slot freed while a borrower waits is the waiter's: a newcomer that
/// arrives right after the return gets 409, however quick it is.
async fn a_newcomer_never_takes_a_slot_an_earlier_waiter_waits_for(backend: Backend) {
    let apis = instances(backend, 2, Limits::default()).await;
    for _ in 0..3 {
        let id = pool_id();
        apis[0].register(&id, 1).await;
        let (_, holder) = apis[0].borrow(&id, 30.0, 0.0).await;
        let waiter = {
            let (api, id) = (apis[1].clone(), id.clone());
            tokio::spawn(async move { api.borrow(&id, 30.0, 5.0).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        apis[0]
            .return_lease(&id, holder["lease"].as_str().unwrap())
            .await;
        let (status, body) = apis[0].borrow(&id, 30.0, 0.0).await;
        assert_eq!(status, 409, "the newcomer overtook the waiter: {body}");
        let (status, body) = waiter.await.unwrap();
        assert_eq!((status, body["position"].as_u64()), (200, Some(0)));
    }
}

async fn a_full_queue_refuses_at_once(backend: Backend) {
    let limits = Limits {
        max_waiters: 2,
        ..Limits::default()
    };
    let apis = instances(backend, 3, limits).await;
    let id = pool_id();
    apis[0].register(&id, 1).await;
    apis[0].borrow(&id, 30.0, 0.0).await;
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let (api, id) = (apis[i].clone(), id.clone());
            tokio::spawn(async move { api.borrow(&id, 30.0, 1.5).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, body) = apis[2].borrow(&id, 30.0, 5.0).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "no resource available");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a third waiter waited {:?}",
        started.elapsed()
    );
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().0, 409);
    }
}

/// A waiter that gives up cancels its ticket: once the slot frees, a
/// newcomer gets it at once.
async fn a_waiter_that_gives_up_leaves_no_trace(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 1).await;
    let (_, holder) = api.borrow(&id, 30.0, 0.0).await;
    let started = Instant::now();
    assert_eq!(api.borrow(&id, 30.0, 0.3).await.0, 409);
    assert!(started.elapsed() >= Duration::from_millis(300));
    api.return_lease(&id, holder["lease"].as_str().unwrap())
        .await;
    let (status, body) = api.borrow(&id, 30.0, 0.0).await;
    assert_eq!((status, body["position"].as_u64()), (200, Some(0)));
}

/// Holds the first tombstone write back: tells `reached`, then waits for
/// `go` before it lets the write through.
struct HoldsTheTombstone {
    inner: Arc<dyn PoolStore>,
    reached: Mutex<Option<oneshot::Sender<()>>>,
    go: Mutex<Option<oneshot::Receiver<()>>>,
}

#[async_trait]
impl Around for HoldsTheTombstone {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }
    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        if update
            .changes
            .iter()
            .any(|c| matches!(c, Change::SetGivenUp(_)))
        {
            if let Some(reached) = self.reached.lock().await.take() {
                let _ = reached.send(());
                if let Some(go) = self.go.lock().await.take() {
                    let _ = go.await;
                }
            }
        }
        self.inner.update(key, read, update).await
    }
}

/// A return reads the pool before its borrow's take or ticket lands, and
/// its tombstone lands after: the return still gives that borrow up (the
/// take is returned, the ticket cancelled), as if it had read them.
async fn a_return_whose_borrow_lands_just_before_its_tombstone_gives_it_up(backend: Backend) {
    let store = backend.store().await;
    let plain = Arc::new(ApiClient::new(store.clone(), Limits::default()));
    for full in [false, true] {
        let id = pool_id();
        plain.register(&id, 1).await;
        let holder = if full {
            let (_, body) = plain.borrow(&id, 30.0, 0.0).await;
            Some(body["lease"].as_str().unwrap().to_string())
        } else {
            None
        };
        let (reached, reached_rx) = oneshot::channel();
        let (go_tx, go) = oneshot::channel();
        let holding = ApiClient::new(
            Arc::new(Forward(HoldsTheTombstone {
                inner: store.clone(),
                reached: Mutex::new(Some(reached)),
                go: Mutex::new(Some(go)),
            })),
            Limits::default(),
        );
        let lease = uuid::Uuid::new_v4().to_string();
        let giving_up = {
            let (id, lease) = (id.clone(), lease.clone());
            tokio::spawn(async move { holding.return_lease(&id, &lease).await })
        };
        reached_rx.await.unwrap();
        // The borrow lands between the return's read and its tombstone.
        let borrow = {
            let (plain, id, lease) = (plain.clone(), id.clone(), lease.clone());
            tokio::spawn(async move { borrow_as(&plain, &id, &lease, 30.0, 10.0).await })
        };
        if full {
            while plain.inspect(&id).await.1["waiting"] != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            while plain.inspect(&id).await.1["in_use"] != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        go_tx.send(()).unwrap();
        let (status, returned) = giving_up.await.unwrap();
        // Its take held a slot: that is freed (`true`); its ticket held
        // nothing: that leaves the queue (`false`).
        assert_eq!(
            (status, returned["returned"].as_bool()),
            (200, Some(!full)),
            "full: {full}"
        );
        let state = plain.inspect(&id).await.1;
        assert_eq!(state["waiting"], 0, "full: {full}: {state}");
        assert_eq!(state["in_use"], u32::from(full), "full: {full}: {state}");
        let started = Instant::now();
        let (status, _) = borrow.await.unwrap();
        if full {
            assert_eq!(status, 409, "the given-up waiter is refused");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
            plain.return_lease(&id, holder.as_deref().unwrap()).await;
        } else {
            assert_eq!(
                status, 200,
                "its take had landed: answered before the return"
            );
        }
        let (status, body) = plain.borrow(&id, 30.0, 0.0).await;
        assert_eq!(
            (status, body["position"].as_u64()),
            (200, Some(0)),
            "nothing stays held"
        );
    }
}
