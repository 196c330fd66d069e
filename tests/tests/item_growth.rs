//! The pool item stays small however long short leases are left to expire
//! while others wait (a map of reused short grants once grew by about 370
//! bytes a second under this workload, until DynamoDB refused the item).
//!
//! Against DynamoDB Local, each store call delayed 1–8 ms: count 32, 16
//! clients that loop `borrow {"ttl": 2, "wait": 10}` and never return. The
//! item is read as stored (every attribute, as `GetItem` returns it) and
//! sized by DynamoDB's rules. 40 s in CI; `SEMAPHORE_SOAK=1` runs the
//! 10 minutes of docs/CORRECTNESS.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::domain::ENDED_RING;
use semaphore::keys::PoolId;
use semaphore::store::dynamodb::{pool_key, stored_size};
use semaphore::Limits;
use semaphore_tests::faults::{FaultCounts, FaultPlan, FaultyStore};
use semaphore_tests::harness::{dynamodb_client, dynamodb_store, pool_id, ApiClient, TABLE};

const CLIENTS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_leases_left_to_expire_never_grow_the_item() {
    let soak = std::env::var("SEMAPHORE_SOAK").is_ok_and(|v| v == "1");
    let (run, every) = if soak {
        (Duration::from_secs(600), Duration::from_secs(15))
    } else {
        (Duration::from_secs(40), Duration::from_secs(5))
    };
    let latency = FaultPlan {
        delay: 1.0,
        max_delay_ms: 8,
        ..FaultPlan::none()
    };
    let store = Arc::new(FaultyStore::new(
        dynamodb_store().await,
        latency,
        7,
        Arc::new(FaultCounts::default()),
    ));
    let api = Arc::new(ApiClient::new(store, Limits::default()));
    let id = pool_id();
    assert_eq!(api.register(&id, 32).await.0, 200);

    let started = Instant::now();
    let grants = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (api, id, grants) = (api.clone(), id.clone(), grants.clone());
            tokio::spawn(async move {
                while started.elapsed() < run {
                    match api.borrow(&id, 2.0, 10.0).await {
                        (200, _) => {
                            grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        (409, _) => {}
                        other => panic!("borrow answered {other:?}"),
                    }
                }
            })
        })
        .collect();

    let client = dynamodb_client().await;
    let key = PoolId(id.parse().expect("a UUID")).key();
    let mut samples: Vec<(Duration, usize, u64)> = Vec::new();
    while started.elapsed() < run {
        tokio::time::sleep(every).await;
        let item = client
            .get_item()
            .table_name(TABLE)
            .set_key(Some(pool_key(&key)))
            .consistent_read(true)
            .send()
            .await
            .expect("GetItem")
            .item
            .expect("the pool item");
        let grants = grants.load(std::sync::atomic::Ordering::Relaxed);
        samples.push((started.elapsed(), stored_size(&item), grants));
    }
    for client in clients {
        client.await.expect("a client");
    }

    println!("| after | item bytes | grants |\n|---|---|---|");
    for (after, bytes, grants) in &samples {
        println!("| {} s | {bytes} | {grants} |", after.as_secs());
    }
    let (_, _, total) = samples[samples.len() - 1];
    assert!(total > 100, "only {total} grants: the workload did not run");
    let largest = samples.iter().map(|s| s.1).max().unwrap_or(0);
    if soak {
        // The last minute's item is no larger than the first minute's, but
        // for the fence counter's digits: each slot's stamp and each memory
        // holds a fence, and a number takes one byte more per two digits
        // (10 minutes took fences from 3 to 4 digits: 32 bytes at count 32).
        let minute = |from: u64, to: u64| {
            samples
                .iter()
                .filter(|(after, ..)| (from..to).contains(&after.as_secs()))
                .map(|s| s.1)
                .max()
                .unwrap_or(0)
        };
        let (first, last) = (minute(0, 61), minute(run.as_secs() - 60, u64::MAX));
        let digit = 32 + ENDED_RING;
        assert!(
            last <= first + digit,
            "first minute {first} bytes, last {last}"
        );
    } else {
        // Past its first 10 s the pool is in its steady state (the queue full
        // of waiters, the ring of reused grants full). The queue's length and
        // the slots' stamps vary by a few hundred bytes between reads; the map
        // the ring replaced added 370 bytes a second.
        let settled = samples
            .iter()
            .find(|(after, ..)| after.as_secs() >= 10)
            .map_or(0, |s| s.1);
        let last = samples[samples.len() - 1].1;
        assert!(
            last <= settled + 512,
            "the item grew from {settled} to {last} bytes"
        );
    }
    assert!(largest <= 3 * 1024, "the item reached {largest} bytes");
}

/// An item an older version grew (the map `e` of ended grants by lease id,
/// here 2,000 entries, 48 KB) is cured by the pool's next grant: the map
/// is not read, and the write that takes the slot removes it.
#[tokio::test]
async fn the_next_grant_removes_the_map_an_older_version_grew() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let api = ApiClient::new(dynamodb_store().await, Limits::default());
    let id = pool_id();
    assert_eq!(api.register(&id, 2).await.0, 200);
    let client = dynamodb_client().await;
    let key = pool_key(&PoolId(id.parse().expect("a UUID")).key());
    let legacy = (0..2_000)
        .map(|n| {
            (
                format!("{n:011}"),
                AttributeValue::N(format!("{}", 1_000_000_000_000_000_000_000u128 + n)),
            )
        })
        .collect();
    client
        .update_item()
        .table_name(TABLE)
        .set_key(Some(key.clone()))
        .update_expression("SET e = :e")
        .expression_attribute_values(":e", AttributeValue::M(legacy))
        .send()
        .await
        .expect("an item as an older version left it");
    let stored = || async {
        client
            .get_item()
            .table_name(TABLE)
            .set_key(Some(key.clone()))
            .consistent_read(true)
            .send()
            .await
            .expect("GetItem")
            .item
            .expect("the pool item")
    };
    let before = stored().await;
    assert!(stored_size(&before) > 40_000);
    // Read as ever: the map is not part of the pool.
    let (status, body) = api.inspect(&id).await;
    assert_eq!((status, &body["available"]), (200, &serde_json::json!(2)));
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.0, 200);
    let after = stored().await;
    assert!(!after.contains_key("e"), "the map is still there");
    assert!(stored_size(&after) < 1024, "{} bytes", stored_size(&after));
}
