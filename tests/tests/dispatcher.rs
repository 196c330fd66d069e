//! The dispatcher function's handler on DynamoDB Local, its wake queue
//! recorded: the pending wake's conditions as DynamoDB evaluates them (a
//! wake past SQS's 15 minutes re-armed when it arrives early, a stray one
//! arming nothing), a poison record failing alone, and the table's TTL.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use semaphore::clock::now_ms;
use semaphore::delivery::wake::{Wake, MAX_DELAY};
use semaphore::domain::Callback;
use semaphore::keys::{LeaseId, PoolId, PoolKey};
use semaphore::service::{BorrowRequest, Budget, EnqueueRequest};
use semaphore::store::{dynamodb, DynamoDbStore, WakeStore};
use semaphore_tests::harness::TABLE;
use semaphore_tests::wakes::{dispatcher_on_dynamodb, pending_wake, DispatcherOnDynamoDb};
use serde_json::{json, Value};

/// As in the issue: count 1, a lease of 960 s, a ticket waiting a day. The
/// pool's key and the wake its step wants (the lease's expiry).
async fn held_pool_with_a_ticket(d: &DispatcherOnDynamoDb) -> (PoolKey, u64) {
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    d.service.register(id, 1, budget).await.expect("register");
    let borrow = BorrowRequest {
        ttl_ms: 960_000,
        wait_ms: 0,
        lease: LeaseId::new_random(),
    };
    let held = d.service.borrow(id, borrow, budget).await.expect("borrow");
    let enqueue = EnqueueRequest {
        ttl_ms: 30_000,
        wait_ms: Some(86_400_000),
        lease: LeaseId::new_random(),
        callback: Callback {
            url: "http://127.0.0.1:9/hook".into(),
            token: "t".into(),
        },
    };
    d.service
        .enqueue(id, enqueue, budget)
        .await
        .expect("enqueue");
    (id.key(), held.expires_at_ms)
}

fn wake(key: PoolKey, at_ms: u64) -> Wake {
    Wake {
        key,
        at_ms: Some(at_ms),
    }
}

fn wake_batch(id: &str, wake: &Wake) -> Value {
    json!({"Records": [{"messageId": id, "receiptHandle": "r", "body": wake.to_body(),
        "attributes": {}, "messageAttributes": {}, "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:wake", "awsRegion": "us-east-1"}]})
}

fn store(d: &DispatcherOnDynamoDb) -> DynamoDbStore {
    DynamoDbStore::new(d.client.clone(), TABLE)
}

#[tokio::test]
async fn a_wake_past_sqs_limit_arriving_early_re_arms_itself() {
    let d = dispatcher_on_dynamodb().await;
    let (key, at) = held_pool_with_a_ticket(&d).await;
    // The stream's invocation armed it: `wk` = at, its message capped at 900 s.
    let first = d
        .handler
        .handle_batch(stream_batch(&[("1", key)]), None)
        .await;
    assert_eq!(first.expect("handled").ids(), Vec::<&str>::new());
    assert_eq!(d.wakes.taken(), [(wake(key, at), MAX_DELAY)]);
    assert_eq!(pending_wake(&d.client, &key).await, Some(at));

    // That message arrives 900 s later, about 60 s before `at`.
    let early = d
        .handler
        .handle_batch(wake_batch("m1", &wake(key, at)), None)
        .await;
    assert_eq!(early.expect("handled").ids(), Vec::<&str>::new());
    let again = d.wakes.taken();
    assert_eq!(again.len(), 1, "re-armed: {again:?}");
    assert_eq!(again[0].0, wake(key, at));
    assert_eq!(pending_wake(&d.client, &key).await, Some(at));
}

#[tokio::test]
async fn a_stray_wake_arms_nothing_while_another_is_pending() {
    let d = dispatcher_on_dynamodb().await;
    let (key, at) = held_pool_with_a_ticket(&d).await;
    assert!(store(&d)
        .arm_wake(&key, at, now_ms(), &[])
        .await
        .expect("arm"));
    // A later wake that an earlier one replaced: its message is still queued.
    let stray = wake(key, at + 60_000);
    let response = d.handler.handle_batch(wake_batch("m1", &stray), None).await;
    assert_eq!(response.expect("handled").ids(), Vec::<&str>::new());
    assert_eq!(d.wakes.taken(), []);
    assert_eq!(pending_wake(&d.client, &key).await, Some(at));
}

#[tokio::test]
async fn an_early_wake_of_a_settled_pool_is_cleared() {
    let d = dispatcher_on_dynamodb().await;
    let id = PoolId(uuid::Uuid::new_v4());
    d.service
        .register(id, 1, &mut Budget::new(None))
        .await
        .expect("register");
    let at = now_ms() + 1_200_000;
    assert!(store(&d)
        .arm_wake(&id.key(), at, now_ms(), &[])
        .await
        .expect("arm"));
    let response = d
        .handler
        .handle_batch(wake_batch("m1", &wake(id.key(), at)), None)
        .await;
    assert_eq!(response.expect("handled").ids(), Vec::<&str>::new());
    assert_eq!(d.wakes.taken(), []);
    assert_eq!(pending_wake(&d.client, &id.key()).await, None);
}

fn stream_batch(records: &[(&str, PoolKey)]) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|(seq, key)| {
            json!({"eventID": seq, "eventName": "MODIFY", "eventSource": "aws:dynamodb",
                "eventVersion": "1.1", "awsRegion": "us-east-1",
                "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode(key.0)}, "sk": {"B": "AA=="}},
                    "NewImage": {"pk": {"B": STANDARD.encode(key.0)}, "sk": {"B": "AA=="}, "z": {"N": "1"}},
                    "SequenceNumber": seq, "SizeBytes": 30, "StreamViewType": "NEW_IMAGE"}})
        })
        .collect();
    json!({ "Records": records })
}

#[tokio::test]
async fn poison_records_fail_alone_and_the_rest_is_handled() {
    let d = dispatcher_on_dynamodb().await;
    let (key, at) = held_pool_with_a_ticket(&d).await;
    let mut batch = stream_batch(&[("10", key), ("11", PoolKey([0; 16])), ("12", key)]);
    // Not a pool: a key of another table's shape.
    batch["Records"][1]["dynamodb"]["Keys"] = json!({"id": {"S": "x"}});
    let response = d.handler.handle_batch(batch, None).await.expect("handled");
    assert_eq!(response.ids(), ["11"]);
    assert_eq!(d.wakes.taken(), [(wake(key, at), MAX_DELAY)]);

    let mut wakes = wake_batch("a", &wake(key, at));
    wakes["Records"][0]["body"] = json!("not json");
    let response = d.handler.handle_batch(wakes, None).await.expect("handled");
    assert_eq!(response.ids(), ["a"]);
}

#[tokio::test]
async fn ensure_table_turns_on_the_templates_ttl_once() {
    let d = dispatcher_on_dynamodb().await; // ensures the table once
    dynamodb::ensure_table(&d.client, TABLE)
        .await
        .expect("again");
    let ttl = dynamodb::ttl_attribute(&d.client, TABLE)
        .await
        .expect("described");
    assert_eq!(ttl.as_deref(), Some("xp"));
}
