//! DynamoDB calls per operation, uncontended (budget: borrow ≤ 2, return ≤ 2,
//! inspect 1, register ≤ 2, delete 1), on DynamoDB Local.

use std::sync::Arc;

use semaphore::Limits;
use semaphore_tests::counting::CountingStore;
use semaphore_tests::harness::{dynamodb_store, pool_id, ApiClient};

/// Runs one request and checks its status and its number of DynamoDB calls.
macro_rules! calls {
    ($counts:expr, $label:expr, $expected:expr, $request:expr) => {{
        $counts.reset();
        let (status, body) = $request.await;
        assert_eq!(status, 200, "{}: {}", $label, body);
        let calls = $counts.total();
        println!("{:<28} {} DynamoDB call(s)", $label, calls);
        assert_eq!(calls, $expected, "{} took {} calls", $label, calls);
        body
    }};
}

#[tokio::test]
async fn uncontended_operations_stay_within_their_call_budget() {
    let store = Arc::new(CountingStore::new(dynamodb_store().await));
    let counts = store.counts.clone();
    let api = ApiClient::new(store, Limits::default());
    let id = pool_id();

    calls!(counts, "register (new pool)", 1, api.register(&id, 1));
    calls!(counts, "register (same count)", 1, api.register(&id, 1));
    calls!(counts, "register (new count)", 2, api.register(&id, 2));
    calls!(counts, "inspect", 1, api.inspect(&id));
    let body = calls!(counts, "borrow", 2, api.borrow(&id, 60.0, 0.0));
    let lease = body["lease"].as_str().unwrap().to_string();
    calls!(counts, "return", 2, api.return_lease(&id, &lease));
    calls!(
        counts,
        "return (already returned)",
        1,
        api.return_lease(&id, &lease)
    );
    calls!(counts, "delete", 1, api.delete(&id));
    assert_eq!(counts.conflicts(), 0);
}
