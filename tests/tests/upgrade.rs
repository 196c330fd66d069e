//! Pools stored flat (by every version before the split layout, or raised
//! past its threshold by a resize) are split in place by the first write of
//! a version that splits large pools: live leases, waiting borrowers and
//! async tickets all carry over, none lost or granted twice.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use semaphore::callback::CallbackPolicy;
use semaphore::delivery::{Caller, Dispatcher, Local};
use semaphore::domain::{BorrowPlan, Compaction, Holder, Layout, Pool, ReturnPlan};
use semaphore::keys::{LeaseId, PoolId};
use semaphore::service::Timing;
use semaphore::store::DynamoDbStore;
use semaphore::store::{PoolStore, Record, TicketStore, Updated};
use semaphore::Limits;
use semaphore_tests::counting::{on_the_wire, Counters};
use semaphore_tests::harness::{dynamodb_client, pool_id, ApiClient, Backend, TABLE};
use semaphore_tests::receiver::{answer, read_request};
use serde_json::{json, Value};
use tokio::net::TcpListener;

type Stores = (Arc<dyn PoolStore>, Arc<dyn TicketStore>);

/// A service with async mode over these stores, with this timing.
fn service_over(stores: &Stores, timing: Timing) -> semaphore::Service {
    semaphore::Service::new(stores.0.clone(), Limits::default())
        .with_tickets(stores.1.clone())
        .with_callback_policy(CallbackPolicy { allow_local: true })
        .with_timing(timing)
}

fn service(stores: &Stores, timing: Timing) -> Arc<ApiClient> {
    Arc::new(ApiClient {
        service: service_over(stores, timing),
    })
}

/// [`service`] with its in-process dispatcher (as local-api runs it).
fn dispatched(stores: &Stores, timing: Timing) -> Arc<ApiClient> {
    let local = Local::new();
    let client = Arc::new(ApiClient {
        service: service_over(stores, timing).with_watch(local.watch()),
    });
    let caller =
        Caller::new(CallbackPolicy { allow_local: true }, Duration::from_secs(2)).expect("caller");
    let service = Arc::new(service_over(stores, timing));
    local.start(Arc::new(
        Dispatcher::new(service, caller).with_bound(Duration::from_secs(3)),
    ));
    client
}

/// A receiver on loopback that answers every delivery 200.
async fn receiver() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_request(&mut stream).await.is_some() {
                    answer(&mut stream, 200).await;
                }
            });
        }
    });
    url
}

/// How a version before the split layout stores every pool: flat.
fn flat() -> Timing {
    Timing {
        compaction: Compaction {
            split_above: u16::MAX,
            ..Compaction::DEFAULT
        },
        ..Timing::default()
    }
}

fn lease() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn ticket(api: &ApiClient, pool: &str, lease: &str) -> Value {
    let body = json!({ "lease": lease }).to_string();
    let (status, body) = api.call("POST", &format!("/l/{pool}/ticket"), &body).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn layout(store: &Arc<dyn PoolStore>, pool: &str) -> Layout {
    let key = PoolId(pool.parse().unwrap()).key();
    store
        .load(&key)
        .await
        .unwrap()
        .unwrap()
        .pool
        .layout()
        .clone()
}

async fn a_flat_pool_is_split_in_place_with_its_leases_waiters_and_tickets(backend: Backend) {
    let old_stores = backend.stores().await;
    let old = service(&old_stores, flat());
    let pool = pool_id();
    assert_eq!(old.register(&pool, 60).await.0, 200);
    let mut held = Vec::new();
    for _ in 0..60 {
        let (status, body) = old.borrow(&pool, 600.0, 0.0).await;
        assert_eq!(status, 200, "{body}");
        held.push((
            body["lease"].as_str().unwrap().to_string(),
            body["position"].as_u64().unwrap(),
        ));
    }
    // Two async tickets, then two borrowers that wait.
    let url = receiver().await;
    let tickets = [lease(), lease()];
    for mine in &tickets {
        let body = json!({"ttl": 600, "wait": 600, "lease": mine,
            "callback": {"url": url, "token": "t0ken"}});
        let (status, body) = old
            .call("POST", &format!("/l/{pool}/enqueue"), &body.to_string())
            .await;
        assert_eq!(status, 202, "{body}");
    }
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (old, pool) = (old.clone(), pool.clone());
        waiters.push(tokio::spawn(
            async move { old.borrow(&pool, 600.0, 20.0).await },
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(layout(&old_stores.0, &pool).await, Layout::Flat);
    let (_, seen) = old.inspect(&pool).await;
    assert_eq!(
        (seen["in_use"].as_u64(), seen["waiting"].as_u64()),
        (Some(60), Some(4))
    );

    // The new version (in DynamoDB, another process with a cache of its
    // own): its first write splits the pool.
    let new_stores = match backend {
        Backend::Memory => old_stores.clone(),
        Backend::DynamoDb => backend.stores().await,
    };
    let new = dispatched(&new_stores, Timing::default());
    let (first, _) = held.remove(5);
    let (status, body) = new.return_lease(&pool, &first).await;
    assert_eq!((status, &body["returned"]), (200, &json!(true)));
    assert!(
        matches!(layout(&new_stores.0, &pool).await, Layout::Split(_)),
        "split by the new version's first write"
    );
    // Three more returns: each slot goes to the next in line.
    let mut freed = BTreeSet::from([5]);
    for _ in 0..3 {
        let (mine, position) = held.remove(0);
        let (status, body) = new.return_lease(&pool, &mine).await;
        assert_eq!((status, &body["returned"]), (200, &json!(true)));
        freed.insert(position);
    }
    let mut granted = BTreeSet::new();
    for waiter in waiters {
        let (status, body) = waiter.await.unwrap();
        assert_eq!(status, 200, "a waiter of the flat pool is served: {body}");
        assert!(granted.insert(body["position"].as_u64().unwrap()), "{body}");
    }
    for mine in &tickets {
        let mut body = ticket(&new, &pool, mine).await;
        for _ in 0..100 {
            if body["state"] == "delivered" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            body = ticket(&new, &pool, mine).await;
        }
        assert_eq!(body["state"], "delivered", "{body}");
        assert!(granted.insert(body["position"].as_u64().unwrap()), "{body}");
    }
    assert_eq!(granted, freed, "each slot returned went to one in line");
    // Every lease of the flat pool is still held, and returns once.
    let (_, seen) = new.inspect(&pool).await;
    assert_eq!(
        (seen["in_use"].as_u64(), seen["waiting"].as_u64()),
        (Some(60), Some(0))
    );
    for (mine, _) in &held {
        let (status, body) = new.return_lease(&pool, mine).await;
        assert_eq!((status, &body["returned"]), (200, &json!(true)), "{mine}");
    }
    let (_, seen) = old.inspect(&pool).await;
    assert_eq!(seen["in_use"].as_u64(), Some(4), "the four granted in line");
    new.delete(&pool).await;
}

/// A pool registered small and raised past the flat threshold is split too.
async fn a_pool_resized_past_the_flat_threshold_is_split(backend: Backend) {
    let stores = backend.stores().await;
    let api = service(&stores, Timing::default());
    let pool = pool_id();
    api.register(&pool, 8).await;
    let mut leases = Vec::new();
    for _ in 0..8 {
        let (status, body) = api.borrow(&pool, 600.0, 0.0).await;
        assert_eq!(status, 200);
        leases.push(body["lease"].as_str().unwrap().to_string());
    }
    assert_eq!(api.register(&pool, 500).await.0, 200);
    assert!(matches!(layout(&stores.0, &pool).await, Layout::Split(_)));
    let (status, body) = api.borrow(&pool, 600.0, 0.0).await;
    assert_eq!((status, &body["position"]), (200, &json!(8)));
    for mine in &leases {
        let (status, body) = api.return_lease(&pool, mine).await;
        assert_eq!((status, &body["returned"]), (200, &json!(true)));
    }
    let (_, seen) = api.inspect(&pool).await;
    assert_eq!(seen["in_use"].as_u64(), Some(1));
    api.delete(&pool).await;
}

/// The largest pool, fully held and stored flat (about 24 KB), splits in
/// one write on DynamoDB (its condition compares the 1,000 holders whole),
/// and then cools to a small pool item, every lease kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_flat_pool_of_the_largest_count_splits_on_dynamodb() {
    let counters = Arc::new(Counters::default());
    let client = on_the_wire(&dynamodb_client().await, counters.clone());
    let store = Arc::new(DynamoDbStore::new(client, TABLE).with_capacity_tracking(Arc::default()));
    let stores: Stores = (store.clone(), store);
    let pool = pool_id();
    let key = PoolId(pool.parse().unwrap()).key();
    let now = semaphore::clock::now_ms();
    let mut flat = Pool::new(1000, now * 1000).split_above(u16::MAX);
    let mut leases = Vec::new();
    for _ in 0..1000 {
        let id = LeaseId(uuid::Uuid::new_v4());
        let holder = Holder {
            digest: id.digest(),
            ttl_ms: 600_000,
        };
        let BorrowPlan::Take { update, .. } = flat.plan_borrow(holder, now, now, 100) else {
            panic!("full too soon")
        };
        flat = flat.apply(&update).unwrap();
        leases.push(id.0.to_string());
    }
    stores
        .0
        .create(&key, &Record::new(flat.clone()))
        .await
        .unwrap();
    let api = service(
        &stores,
        Timing {
            // Every entry old enough to cool at once: each return (one at
            // a time) claims the compaction its write finds due and runs it.
            compaction: Compaction {
                cold_after_ms: 0,
                ..Compaction::DEFAULT
            },
            ..Timing::default()
        },
    );
    let before = counters.billed();
    let (status, body) = api.return_lease(&pool, &leases[0]).await;
    assert_eq!((status, &body["returned"]), (200, &json!(true)));
    let split_at = counters.billed().since(&before);
    let split = Backend::DynamoDb
        .store()
        .await
        .load(&key)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(split.pool.layout(), Layout::Split(_)));
    let mut kept = flat.leases();
    kept.remove(0);
    assert_eq!(
        split.pool.leases(),
        kept,
        "every other grant exactly as it was"
    );
    // Each write after cools a segment.
    for mine in &leases[1..20] {
        let (status, body) = api.return_lease(&pool, mine).await;
        assert_eq!((status, &body["returned"]), (200, &json!(true)));
    }
    let cooled = counters.billed().since(&before);
    let last = counters.billed();
    let (status, _) = api.return_lease(&pool, &leases[20]).await;
    assert_eq!(status, 200);
    let after = counters.billed().since(&last);
    println!(
        "write units: the return that split {:.1}; 20 returns, cooling {:.1}; a return after {:.1}",
        split_at.wcu_milli() as f64 / 1000.0,
        cooled.wcu_milli() as f64 / 1000.0,
        after.wcu_milli() as f64 / 1000.0
    );
    assert!(after.wcu_milli() <= 2_000, "a small pool item after");
    let fresh = Backend::DynamoDb.store().await;
    let now = fresh.load(&key).await.unwrap().unwrap();
    let Layout::Split(split) = now.pool.layout() else {
        panic!("not split")
    };
    assert!(split.hot().len() <= 20, "cooled: {} hot", split.hot().len());
    assert_eq!(now.pool.in_use(semaphore::clock::now_ms()), 979);
    let kept: BTreeSet<_> = now.pool.leases().iter().map(|l| l.digest).collect();
    for mine in &leases[21..] {
        let id = LeaseId(mine.parse().unwrap());
        assert!(kept.contains(&id.digest()), "lease {mine} kept");
    }
    api.delete(&pool).await;
}

/// Writes planned on a pool while it was flat, landing after its split:
/// each that names a slot fails (and is planned again on the split item),
/// a join lands, and every lease keeps its grant exactly.
async fn writes_planned_on_the_flat_pool_fail_on_its_slots_after_the_split(backend: Backend) {
    let stores = backend.stores().await;
    let old = service(&stores, flat());
    let pool = pool_id();
    old.register(&pool, 60).await;
    let mut digests = Vec::new();
    for _ in 0..3 {
        let (status, body) = old.borrow(&pool, 600.0, 0.0).await;
        assert_eq!(status, 200);
        digests.push(LeaseId(body["lease"].as_str().unwrap().parse().unwrap()).digest());
    }
    let key = PoolId(pool.parse().unwrap()).key();
    let read = stores.0.load(&key).await.unwrap().unwrap();
    assert_eq!(read.pool.layout(), &Layout::Flat);
    let split = read.pool.plan_split(Compaction::DEFAULT).unwrap();
    let Updated::Written(after) = stores.0.update(&key, &read, &split).await.unwrap() else {
        panic!("the split lands")
    };
    assert!(matches!(after.pool.layout(), Layout::Split(_)));
    assert_eq!(
        after.pool.leases(),
        read.pool.leases(),
        "every grant as it was"
    );
    // Its own split again: not as read any more.
    assert!(matches!(
        stores.0.update(&key, &read, &split).await.unwrap(),
        Updated::Lost(_)
    ));

    let now = semaphore::clock::now_ms();
    let newcomer = Holder {
        digest: LeaseId(uuid::Uuid::new_v4()).digest(),
        ttl_ms: 60_000,
    };
    let BorrowPlan::Take { update: take, .. } = read.pool.plan_borrow(newcomer, now, now, 100)
    else {
        panic!("a free slot")
    };
    let ReturnPlan::Return(_, give_back) = read.pool.plan_return(digests[1], now) else {
        panic!("held")
    };
    let grow = read.pool.plan_resize(70, now).unwrap();
    for (what, update) in [("take", take), ("return", give_back), ("resize", grow)] {
        let landed = stores.0.update(&key, &read, &update).await.unwrap();
        assert!(matches!(landed, Updated::Lost(_)), "{what}: {landed:?}");
    }
    let BorrowPlan::Join(join) =
        read.pool
            .plan_borrow_or_join(newcomer, now + 5_000, now, 100, false)
    else {
        panic!("a join")
    };
    let Updated::Written(joined) = stores.0.update(&key, &read, &join).await.unwrap() else {
        panic!("a join names no slot: it lands")
    };
    assert_eq!(joined.pool.queue().len(), 1);
    let fresh = backend.store().await;
    let now_stored = match backend {
        Backend::Memory => stores.0.load(&key).await.unwrap().unwrap(),
        Backend::DynamoDb => fresh.load(&key).await.unwrap().unwrap(),
    };
    assert_eq!(now_stored.pool.leases(), read.pool.leases());
    stores.0.delete(&key).await.unwrap();
}

on_both_stores!(
    workers = 4;
    writes_planned_on_the_flat_pool_fail_on_its_slots_after_the_split,
    a_flat_pool_is_split_in_place_with_its_leases_waiters_and_tickets,
    a_pool_resized_past_the_flat_threshold_is_split,
);
