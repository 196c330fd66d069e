//! `IDLE_POOL_DAYS`: every write of a pool item sets its `xp` (DynamoDB's TTL
//! attribute) to now + the idle time, so that a pool nobody writes expires;
//! without it no pool item carries one. No decision reads it.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use semaphore::clock::now_ms;
use semaphore::keys::PoolId;
use semaphore::store::{dynamodb, DynamoDbStore};
use semaphore::Limits;
use semaphore_tests::harness::{dynamodb_client, pool_id, ApiClient, TABLE};
use serde_json::json;

async fn xp_of(client: &aws_sdk_dynamodb::Client, pool: &str) -> Option<u64> {
    let key = PoolId(pool.parse().expect("uuid")).key();
    let item = client
        .get_item()
        .table_name(TABLE)
        .set_key(Some(dynamodb::pool_key(&key)))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .expect("the pool item");
    match item.get("xp") {
        Some(AttributeValue::N(n)) => Some(n.parse().expect("a number")),
        _ => None,
    }
}

async fn reset(client: &aws_sdk_dynamodb::Client, pool: &str) {
    let key = PoolId(pool.parse().expect("uuid")).key();
    client
        .update_item()
        .table_name(TABLE)
        .set_key(Some(dynamodb::pool_key(&key)))
        .update_expression("SET xp = :old")
        .expression_attribute_values(":old", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("update");
}

#[tokio::test]
async fn every_pool_write_pushes_its_expiry_and_none_is_set_without_it() {
    let client = dynamodb_client().await;
    let after = Duration::from_secs(40 * 86_400);
    let store = DynamoDbStore::new(client.clone(), TABLE).with_idle_expiry(after);
    let store = Arc::new(store);
    let api = ApiClient {
        service: semaphore::Service::new(store.clone(), Limits::default())
            .with_tickets(store)
            .with_callback_policy(semaphore::callback::CallbackPolicy { allow_local: true }),
    };
    let pool = pool_id();
    let near = |xp: Option<u64>| {
        let want = now_ms() / 1000 + after.as_secs();
        xp.is_some_and(|xp| xp.abs_diff(want) <= 5)
    };
    api.register(&pool, 1).await;
    assert!(near(xp_of(&client, &pool).await), "set by the create");
    // Pushed by an update: set back first, so that only the write can set it.
    reset(&client, &pool).await;
    let (status, held) = api.borrow(&pool, 30.0, 0.0).await;
    assert_eq!(status, 200, "{held}");
    assert!(near(xp_of(&client, &pool).await), "pushed by the borrow");
    // And by an enqueue's number (its own conditional write).
    reset(&client, &pool).await;
    let (status, body) = api
        .call(
            "POST",
            &format!("/l/{pool}/enqueue"),
            &json!({"ttl": 5, "lease": uuid::Uuid::new_v4(),
                "callback": {"url": "http://127.0.0.1:9/x", "token": "t"}})
            .to_string(),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert!(near(xp_of(&client, &pool).await), "pushed by the enqueue");
    // The default: no expiry on the pool item.
    let plain = ApiClient::new(
        Arc::new(DynamoDbStore::new(client.clone(), TABLE)),
        Limits::default(),
    );
    let other = pool_id();
    plain.register(&other, 1).await;
    plain.borrow(&other, 30.0, 0.0).await;
    assert_eq!(xp_of(&client, &other).await, None);
    // Turned off after it was on: the next write takes the old date away
    // (TTL would delete the pool on it, in use or not).
    reset(&client, &pool).await;
    let (status, body) = plain.borrow(&pool, 30.0, 0.0).await;
    assert_eq!(
        status, 409,
        "the slot is held: a refusal writes nothing: {body}"
    );
    let held = held["lease"].as_str().expect("lease").to_string();
    plain.return_lease(&pool, &held).await;
    assert_eq!(xp_of(&client, &pool).await, None, "removed by the return");
}
