//! DynamoDB requests per operation, counted on the wire (every SDK attempt,
//! by operation and outcome, as DynamoDB bills them), on DynamoDB Local.

use std::collections::BTreeMap;
use std::sync::Arc;

use semaphore::clock::now_ms;
use semaphore::domain::{BorrowPlan, Compaction, Holder};
use semaphore::keys::LeaseId;
use semaphore::service::Timing;
use semaphore::store::Updated;
use semaphore::Limits;
use semaphore_tests::counting::{Counters, Outcome};
use semaphore_tests::harness::{
    dynamodb_client, dynamodb_store_on_the_wire, dynamodb_stores_on_the_wire, pool_id, ApiClient,
    TABLE,
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

/// A split pool (count above 48): a read is the pool item, then its
/// segments in one `Query`; a compaction two writes (the segment, then the
/// pool item); a delete removes its segments too. Compaction here at every
/// write, so that each operation shows it.
#[tokio::test]
async fn a_split_pool_reads_its_segments_after_its_pool_item_and_compacts_in_two_writes() {
    let counters = Arc::new(Counters::default());
    let store = dynamodb_store_on_the_wire(counters.clone()).await;
    let timing = Timing {
        compaction: Compaction {
            hot_max: 0,
            cold_after_ms: 0,
            ..Compaction::DEFAULT
        },
        ..Timing::default()
    };
    let api = ApiClient::with_timing(store, Limits::default(), timing);
    let id = pool_id();
    sends!(
        counters,
        "register (split)",
        [("PutItem", Won, 1)],
        api.register(&id, 100)
    );
    let body = sends!(
        counters,
        "borrow (then compaction)",
        [
            ("GetItem", Won, 1),
            ("Query", Won, 1),
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
    sends!(
        counters,
        "inspect",
        [("GetItem", Won, 1), ("Query", Won, 1)],
        api.inspect(&id)
    );
    sends!(
        counters,
        "return (a cold lease, then compaction)",
        [
            ("GetItem", Won, 1),
            ("Query", Won, 1),
            ("UpdateItem", Won, 2),
            ("PutItem", Won, 1)
        ],
        api.return_lease(&id, &lease)
    );
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
    let client = dynamodb_client().await;
    let left = client
        .query()
        .table_name(TABLE)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(
            ":pk",
            aws_sdk_dynamodb::types::AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
                semaphore::keys::PoolId(id.parse().unwrap())
                    .key()
                    .0
                    .to_vec(),
            )),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(left.count(), 0, "every item of the pool goes");
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
