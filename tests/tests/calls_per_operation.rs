//! DynamoDB requests per operation, counted on the wire (every SDK attempt,
//! by operation and outcome, as DynamoDB bills them), on DynamoDB Local.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use semaphore::clock::now_ms;
use semaphore::domain::{BorrowPlan, Compaction, Holder};
use semaphore::keys::LeaseId;
use semaphore::service::Timing;
use semaphore::store::dynamodb::pool_key;
use semaphore::store::dynamodb::schema::{pool_item, segment_item, segment_sort_key, SK};
use semaphore::store::Updated;
use semaphore::Limits;
use semaphore_tests::counting::{Counters, Outcome};
use semaphore_tests::harness::{
    dynamodb_client, dynamodb_store, dynamodb_store_on_the_wire, dynamodb_stores_on_the_wire,
    pool_id, ApiClient, TABLE,
};

/// What a list of `(operation, outcome, count)` means on the wire.
fn wire(expected: &[(&str, Outcome, u64)]) -> BTreeMap<(String, Outcome), u64> {
    expected
        .iter()
        .map(|(op, outcome, n)| ((op.to_string(), *outcome), *n))
        .collect()
}

/// Runs one request and checks its status and exactly the requests it sent.
macro_rules! sends {
    ($counters:expr, $label:expr, $expected:expr, $request:expr) => {{
        let before = $counters.wire();
        let (status, body) = $request.await;
        assert_eq!(status, 200, "{}: {}", $label, body);
        let sent = Counters::wire_since(&$counters.wire(), &before);
        println!("{:<30} {:?}", $label, sent);
        assert_eq!(sent, wire(&$expected), "{}", $label);
        body
    }};
}

use Outcome::{ConditionFailed as Lost, Ok as Won};

#[tokio::test]
async fn uncontended_operations_send_exactly_their_requests() {
    let counters = Arc::new(Counters::default());
    let store = dynamodb_store_on_the_wire(counters.clone()).await;
    let api = ApiClient::new(store, Limits::default());
    let id = pool_id();

    sends!(
        counters,
        "register (new pool)",
        [("PutItem", Won, 1)],
        api.register(&id, 1)
    );
    // An existing pool: its create fails and hands the pool back.
    sends!(
        counters,
        "register (same count)",
        [("PutItem", Lost, 1)],
        api.register(&id, 1)
    );
    sends!(
        counters,
        "register (new count)",
        [("PutItem", Lost, 1), ("UpdateItem", Won, 1)],
        api.register(&id, 2)
    );
    sends!(counters, "inspect", [("GetItem", Won, 1)], api.inspect(&id));
    let body = sends!(
        counters,
        "borrow",
        [("GetItem", Won, 1), ("UpdateItem", Won, 1)],
        api.borrow(&id, 60.0, 0.0)
    );
    let lease = body["lease"].as_str().unwrap().to_string();
    sends!(
        counters,
        "return",
        [("GetItem", Won, 1), ("UpdateItem", Won, 1)],
        api.return_lease(&id, &lease)
    );
    // A return of an id the pool does not hold is remembered (a cancel may
    // overtake its borrow): one read, one write.
    sends!(
        counters,
        "return (already returned)",
        [("GetItem", Won, 1), ("UpdateItem", Won, 1)],
        api.return_lease(&id, &lease)
    );
    sends!(
        counters,
        "return (remembered)",
        [("GetItem", Won, 1)],
        api.return_lease(&id, &lease)
    );
    sends!(
        counters,
        "delete",
        [("DeleteItem", Won, 1)],
        api.delete(&id)
    );
}

/// Timing that compacts at every write, so that each operation shows it.
fn compact_always() -> Timing {
    Timing {
        compaction: Compaction {
            hot_max: 0,
            cold_after_ms: 0,
            ..Compaction::DEFAULT
        },
        ..Timing::default()
    }
}

/// A split pool (count above 48): a read is the pool item, then the
/// segments this process does not have at the versions the pool item
/// records; a compaction two writes (the segment, then the pool item); a
/// delete removes its segments too.
#[tokio::test]
async fn a_split_pool_reads_its_segments_after_its_pool_item_and_compacts_in_two_writes() {
    let counters = Arc::new(Counters::default());
    let store = dynamodb_store_on_the_wire(counters.clone()).await;
    let api = ApiClient::with_timing(store, Limits::default(), compact_always());
    // Another process: a cache of its own.
    let other_counters = Arc::new(Counters::default());
    let other = ApiClient::with_timing(
        dynamodb_store_on_the_wire(other_counters.clone()).await,
        Limits::default(),
        compact_always(),
    );
    let id = pool_id();
    sends!(
        counters,
        "register (split)",
        [("PutItem", Won, 1)],
        api.register(&id, 100)
    );
    // No segment yet: nothing to read but the pool item.
    let body = sends!(
        counters,
        "borrow (then compaction)",
        [
            ("GetItem", Won, 1),
            ("UpdateItem", Won, 2),
            ("PutItem", Won, 1)
        ],
        api.borrow(&id, 60.0, 0.0)
    );
    let lease = body["lease"].as_str().unwrap().to_string();
    // The lease is cold now, in its segment: the same answer for its id.
    let again = api
        .call(
            "POST",
            &format!("/l/{id}/borrow"),
            &format!(r#"{{"ttl": 60, "lease": "{lease}"}}"#),
        )
        .await;
    assert_eq!((again.0, &again.1["position"]), (200, &body["position"]));
    // The segment as written is this process's: the pool item alone.
    let seen = sends!(counters, "inspect", [("GetItem", Won, 1)], api.inspect(&id));
    // Another process reads it once, then has it.
    let from_other = sends!(
        other_counters,
        "inspect (another process)",
        [("GetItem", Won, 1), ("Query", Won, 1)],
        other.inspect(&id)
    );
    assert_eq!(from_other["in_use"], seen["in_use"]);
    sends!(
        other_counters,
        "inspect (another process, again)",
        [("GetItem", Won, 1)],
        other.inspect(&id)
    );
    sends!(
        counters,
        "return (a cold lease, then compaction)",
        [
            ("GetItem", Won, 1),
            ("UpdateItem", Won, 2),
            ("PutItem", Won, 1)
        ],
        api.return_lease(&id, &lease)
    );
    // The segment moved on: the other process reads it again.
    let from_other = sends!(
        other_counters,
        "inspect (another process, after a compaction)",
        [("GetItem", Won, 1), ("Query", Won, 1)],
        other.inspect(&id)
    );
    assert_eq!(from_other["in_use"], 0);
    sends!(
        counters,
        "delete (and its segment)",
        [
            ("DeleteItem", Won, 1),
            ("Query", Won, 1),
            ("BatchWriteItem", Won, 1)
        ],
        api.delete(&id)
    );
    assert_eq!(items_of(&id).await, 0, "every item of the pool goes");
}

/// How many items the pool has in the table.
async fn items_of(id: &str) -> i32 {
    dynamodb_client()
        .await
        .query()
        .table_name(TABLE)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", AttributeValue::B(Blob::new(key_of(id).0.to_vec())))
        .send()
        .await
        .unwrap()
        .count()
}

/// The item with this key, as the table holds it.
async fn raw_item(
    client: &aws_sdk_dynamodb::Client,
    key: std::collections::HashMap<String, AttributeValue>,
) -> std::collections::HashMap<String, AttributeValue> {
    client
        .get_item()
        .table_name(TABLE)
        .set_key(Some(key))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the item")
}

fn key_of(id: &str) -> semaphore::keys::PoolKey {
    semaphore::api::parse_pool_id(id).unwrap().key()
}

/// A large pool whose one segment moved since this process read them all:
/// that segment alone is read again (a `GetItem`, not the `Query` of all),
/// and what the process answers is what a fresh one does.
#[tokio::test]
async fn a_large_pool_reads_again_only_the_segment_that_moved() {
    let quiet = Arc::new(Counters::default());
    let api = ApiClient::with_timing(
        dynamodb_store_on_the_wire(quiet).await,
        Limits::default(),
        compact_always(),
    );
    let counters = Arc::new(Counters::default());
    let other = dynamodb_store_on_the_wire(counters.clone()).await;
    let id = pool_id();
    let key = key_of(&id);
    api.register(&id, 1000).await;
    let mut leases = Vec::new();
    // Four segments of cold leases (64 positions each).
    for _ in 0..256 {
        let (status, body) = api.borrow(&id, 600.0, 0.0).await;
        assert_eq!(status, 200, "{body}");
        leases.push(body["lease"].as_str().unwrap().to_string());
    }
    let load = |label: &'static str, expected: Vec<(&'static str, Outcome, u64)>| {
        let (other, counters) = (other.clone(), counters.clone());
        async move {
            let before = counters.wire();
            let record = other.load(&key).await.unwrap().unwrap();
            let sent = Counters::wire_since(&counters.wire(), &before);
            assert_eq!(sent, wire(&expected), "{label}");
            record
        }
    };
    load(
        "load (all segments)",
        vec![("GetItem", Won, 1), ("Query", Won, 1)],
    )
    .await;
    assert_eq!(api.return_lease(&id, &leases[70]).await.0, 200);
    assert_eq!(api.borrow(&id, 600.0, 0.0).await.0, 200);
    let seen = load("load (one segment moved)", vec![("GetItem", Won, 2)]).await;
    let fresh = dynamodb_store().await.load(&key).await.unwrap().unwrap();
    assert_eq!(
        seen.pool.slots(),
        fresh.pool.slots(),
        "the cached segments are the table's"
    );
    assert_eq!(seen.pool.in_use(now_ms()), 256);
    api.delete(&id).await;
}

/// A segment written ahead of its pool item (a compaction that stopped
/// halfway, in another process): this process's compaction of it is
/// refused, its next read gets every segment, and its next write catches
/// the pool item up.
#[tokio::test]
async fn a_segment_ahead_of_its_pool_item_is_found_after_a_refused_compaction() {
    let counters = Arc::new(Counters::default());
    let api = ApiClient::with_timing(
        dynamodb_store_on_the_wire(counters.clone()).await,
        Limits::default(),
        compact_always(),
    );
    let id = pool_id();
    api.register(&id, 100).await;
    assert_eq!(api.borrow(&id, 600.0, 0.0).await.0, 200);
    // Segment 0 at version 2, its pool item still recording 1.
    let client = dynamodb_client().await;
    let pool_item = raw_item(&client, pool_key(&key_of(&id))).await;
    let AttributeValue::N(incarnation) = &pool_item[pool_item::INCARNATION] else {
        panic!("no incarnation")
    };
    let mut segment = pool_key(&key_of(&id));
    segment.insert(
        SK.to_string(),
        AttributeValue::B(Blob::new(
            segment_sort_key(incarnation.parse().unwrap(), 0).to_vec(),
        )),
    );
    let mut item = raw_item(&client, segment).await;
    assert_eq!(item[segment_item::VERSION], AttributeValue::N("1".into()));
    item.insert(segment_item::VERSION.into(), AttributeValue::N("2".into()));
    client
        .put_item()
        .table_name(TABLE)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();

    // Its compactor (the claim is still its own) reads again: every
    // segment, and the pool item again (a segment ahead of it); then it
    // catches the pool item up.
    sends!(
        counters,
        "borrow (its compaction refused, then the catch-up)",
        [
            ("GetItem", Won, 3),
            ("Query", Won, 1),
            ("UpdateItem", Won, 2),
            ("PutItem", Lost, 1)
        ],
        api.borrow(&id, 600.0, 0.0)
    );
    let caught_up = raw_item(&client, pool_key(&key_of(&id))).await;
    let AttributeValue::M(versions) = &caught_up[pool_item::SEGMENTS] else {
        panic!("no segment versions")
    };
    assert_eq!(versions["0"], AttributeValue::N("2".into()));
    assert!(
        !caught_up.contains_key(pool_item::COMPACTION_CLAIM),
        "the catch-up ends its claim (the next write claims again)"
    );
    sends!(
        counters,
        "inspect (caught up)",
        [("GetItem", Won, 1)],
        api.inspect(&id)
    );
    sends!(
        counters,
        "borrow (then compaction)",
        [
            ("GetItem", Won, 1),
            ("UpdateItem", Won, 2),
            ("PutItem", Won, 1)
        ],
        api.borrow(&id, 600.0, 0.0)
    );
    let (status, body) = api.inspect(&id).await;
    assert_eq!((status, &body["in_use"]), (200, &serde_json::json!(3)));
    api.delete(&id).await;
}

/// A lost race costs one billed write: the failed `UpdateItem` itself, which
/// hands the item back; nothing else is sent.
#[tokio::test]
async fn a_lost_race_is_one_failed_update_and_nothing_more() {
    let counters = Arc::new(Counters::default());
    let store = dynamodb_store_on_the_wire(counters.clone()).await;
    let api = ApiClient::new(store.clone(), Limits::default());
    let id = pool_id();
    api.register(&id, 1).await;
    let key = semaphore::api::parse_pool_id(&id).unwrap().key();
    let read = store.load(&key).await.unwrap().unwrap();
    let plan = |n: u8| {
        let holder = Holder {
            digest: LeaseId(uuid::Uuid::from_bytes([n; 16])).digest(),
            ttl_ms: 60_000,
        };
        match read.pool.plan_borrow(holder, now_ms(), now_ms(), 100) {
            BorrowPlan::Take { update, .. } => update,
            other => panic!("{other:?}"),
        }
    };
    let (first, second) = (plan(1), plan(2));
    assert!(matches!(
        store.update(&key, &read, &first).await.unwrap(),
        Updated::Written(_)
    ));
    let before = counters.wire();
    let lost = store.update(&key, &read, &second).await.unwrap();
    let Updated::Lost(now) = lost else {
        panic!("{lost:?}")
    };
    assert_eq!(now.pool.in_use(now_ms()), 1, "the item as it is now");
    assert_eq!(
        Counters::wire_since(&counters.wire(), &before),
        wire(&[("UpdateItem", Lost, 1)])
    );
}

/// Two returns that read the same queue both land: each hands its slot to
/// the head of the queue as it finds it, and neither conditions on the other.
#[tokio::test]
async fn concurrent_returns_with_waiters_never_collide() {
    let counters = Arc::new(Counters::default());
    let store = dynamodb_store_on_the_wire(counters.clone()).await;
    let api = ApiClient::new(store.clone(), Limits::default());
    let id = pool_id();
    api.register(&id, 2).await;
    let a = api.borrow(&id, 60.0, 0.0).await.1["lease"]
        .as_str()
        .unwrap()
        .to_string();
    let b = api.borrow(&id, 60.0, 0.0).await.1["lease"]
        .as_str()
        .unwrap()
        .to_string();
    // The waiters' reads go through a store of their own: only the two
    // returns are counted below.
    let waiters_store = dynamodb_store_on_the_wire(Arc::new(Counters::default())).await;
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let api = ApiClient::new(waiters_store.clone(), Limits::default());
            let id = id.clone();
            tokio::spawn(async move { api.borrow(&id, 60.0, 10.0).await })
        })
        .collect();
    while api.inspect(&id).await.1["waiting"] != 2 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Both returns read before either writes.
    let key = semaphore::api::parse_pool_id(&id).unwrap().key();
    let read = store.load(&key).await.unwrap().unwrap();
    let updates: Vec<_> = [&a, &b]
        .iter()
        .map(|lease| {
            let digest = LeaseId(uuid::Uuid::parse_str(lease).unwrap()).digest();
            match read.pool.plan_return(digest, now_ms()) {
                semaphore::domain::ReturnPlan::Return(_, update) => update,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let before = counters.wire();
    for update in &updates {
        let outcome = store.update(&key, &read, update).await.unwrap();
        assert!(matches!(outcome, Updated::Written(_)), "{outcome:?}");
    }
    assert_eq!(
        Counters::wire_since(&counters.wire(), &before),
        wire(&[("UpdateItem", Won, 2)])
    );
    let mut positions: Vec<u64> = Vec::new();
    for waiter in waiters {
        let (status, body) = waiter.await.unwrap();
        assert_eq!(status, 200, "{body}");
        positions.push(body["position"].as_u64().unwrap());
    }
    positions.sort_unstable();
    assert_eq!(positions, vec![0, 1]);
}

/// Async mode's enqueue: two reads (its lease's ticket: a repeat takes no
/// number; the pool: the backlog's limit), one write to the pool item (the
/// number, conditioned on that limit), one ticket item. A
/// repeat reads its ticket and the pool, and writes nothing.
#[tokio::test]
async fn an_enqueue_writes_the_pool_item_once_and_its_ticket() {
    let counters = Arc::new(Counters::default());
    let (store, tickets) = dynamodb_stores_on_the_wire(counters.clone()).await;
    let api = ApiClient {
        service: semaphore::Service::new(store, Limits::default())
            .with_tickets(tickets)
            .with_callback_policy(semaphore::callback::CallbackPolicy { allow_local: true }),
    };
    let id = pool_id();
    api.register(&id, 1).await;
    api.borrow(&id, 60.0, 0.0).await;
    let lease = uuid::Uuid::new_v4();
    let body = serde_json::json!({"ttl": 60, "lease": lease,
        "callback": {"url": "http://127.0.0.1:9/granted", "token": "t"}})
    .to_string();
    for (label, expected) in [
        (
            "enqueue",
            // The repeat check, the pool's `admitted` (MAX_TICKETS bounds
            // the number taken), the number, the ticket.
            wire(&[
                ("GetItem", Won, 2),
                ("UpdateItem", Won, 1),
                ("PutItem", Won, 1),
            ]),
        ),
        ("enqueue (repeated)", wire(&[("GetItem", Won, 2)])),
    ] {
        let before = counters.wire();
        let (status, answer) = api.call("POST", &format!("/l/{id}/enqueue"), &body).await;
        assert_eq!(status, 202, "{label}: {answer}");
        assert_eq!(answer["ticket"], 0, "{label}: {answer}");
        let sent = Counters::wire_since(&counters.wire(), &before);
        println!("{label:<30} {sent:?}");
        assert_eq!(sent, expected, "{label}");
    }
}
