//! DynamoDB calls per operation, uncontended (budget: borrow ≤ 2, return ≤ 2,
//! inspect 1, register ≤ 2, delete 1), on DynamoDB Local.

use std::sync::Arc;

use semaphore::Limits;
use semaphore_tests::counting::{Counters, CountingStore};
use semaphore_tests::harness::{dynamodb_store, pool_id, ApiClient};

/// Runs one request and checks its status and its number of DynamoDB calls
/// (each store call is exactly one DynamoDB request).
macro_rules! calls {
    ($counters:expr, $label:expr, $expected:expr, $request:expr) => {{
        let before = $counters.snapshot();
        let (status, body) = $request.await;
        assert_eq!(status, 200, "{}: {}", $label, body);
        let calls = $counters.snapshot().since(&before).store_calls();
        println!("{:<28} {} DynamoDB call(s)", $label, calls);
        assert_eq!(calls, $expected, "{} took {} calls", $label, calls);
        body
    }};
}

#[tokio::test]
async fn uncontended_operations_stay_within_their_call_budget() {
    let counters = Arc::new(Counters::default());
    let store = Arc::new(CountingStore::new(dynamodb_store().await, counters.clone()));
    let api = ApiClient::new(store, Limits::default());
    let id = pool_id();
    let start = counters.snapshot();

    calls!(counters, "register (new pool)", 1, api.register(&id, 1));
    calls!(counters, "register (same count)", 1, api.register(&id, 1));
    calls!(counters, "register (new count)", 2, api.register(&id, 2));
    calls!(counters, "inspect", 1, api.inspect(&id));
    let body = calls!(counters, "borrow", 2, api.borrow(&id, 60.0, 0.0));
    let lease = body["lease"].as_str().unwrap().to_string();
    calls!(counters, "return", 2, api.return_lease(&id, &lease));
    calls!(
        counters,
        "return (already returned)",
        1,
        api.return_lease(&id, &lease)
    );
    calls!(counters, "delete", 1, api.delete(&id));
    // Only the two PUTs of an existing pool met a failed condition: they learn
    // the pool from the failed create instead of reading it first.
    assert_eq!(counters.snapshot().since(&start).conflicts, 2);
}
