//! Every route and every rule of API.md, run against both stores: the embedded
//! one and DynamoDB Local. Requests go through routing and validation exactly
//! as the local server and the Lambda functions send them.

use std::time::{Duration, Instant};

use semaphore::Limits;
use semaphore_tests::harness::{pool_id, ApiClient, Backend};
use serde_json::{json, Value};

on_both_stores!(
    register_creates_then_updates,
    unknown_pool_is_404_everywhere_but_delete,
    borrow_takes_lowest_free_positions,
    borrow_response_reports_expiry,
    ttl_and_wait_are_clamped,
    return_is_idempotent,
    delete_removes_pool_and_leases,
    expired_leases_free_their_slots,
    shrink_keeps_live_leases,
    count_zero_never_grants,
    wait_is_woken_by_return,
    wait_is_woken_by_expiry,
    wait_is_woken_by_count_raise,
    wait_gives_409_after_wait,
    delete_while_waiting_is_404,
    inspect_never_reveals_leases,
    bad_input_is_400_json,
    routes_and_methods,
);

async fn lease_of(body: &Value) -> String {
    body["lease"].as_str().expect("lease in body").to_string()
}

async fn register_creates_then_updates(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    let (status, body) = api.register(&id, 4).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"id": id, "count": 4, "in_use": 0, "available": 4, "waiting": 0})
    );
    // The same call again is idempotent.
    assert_eq!(api.register(&id, 4).await, (200, body));
    // Any case in, hyphenated lowercase out.
    let (status, body) = api.register(&id.to_uppercase(), 6).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"id": id, "count": 6, "in_use": 0, "available": 6, "waiting": 0})
    );
    assert_eq!(api.inspect(&id).await.1["count"], 6);
    // Upper bound of the range.
    assert_eq!(api.register(&id, 1000).await.1["available"], 1000);
}

async fn unknown_pool_is_404_everywhere_but_delete(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    let not_found = json!({"error": "pool not found"});
    assert_eq!(api.inspect(&id).await, (404, not_found.clone()));
    assert_eq!(api.borrow(&id, 10.0, 0.0).await, (404, not_found.clone()));
    assert_eq!(api.borrow(&id, 10.0, 0.5).await, (404, not_found.clone()));
    let lease = uuid::Uuid::new_v4().to_string();
    assert_eq!(api.return_lease(&id, &lease).await, (404, not_found));
    assert_eq!(api.delete(&id).await, (200, json!({"deleted": false})));
}

async fn borrow_takes_lowest_free_positions(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 3).await;
    let mut leases = Vec::new();
    for expected in 0..3 {
        let (status, body) = api.borrow(&id, 60.0, 0.0).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["position"], expected);
        leases.push(lease_of(&body).await);
    }
    let start = Instant::now();
    assert_eq!(
        api.borrow(&id, 60.0, 0.0).await,
        (409, json!({"error": "no resource available"}))
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "wait 0 fails at once"
    );
    // The freed position is the next one handed out.
    assert_eq!(
        api.return_lease(&id, &leases[1]).await.1,
        json!({"returned": true})
    );
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 1);
    assert_eq!(api.return_lease(&id, &leases[0]).await.1["returned"], true);
    assert_eq!(api.return_lease(&id, &leases[2]).await.1["returned"], true);
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 0);
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 2);
    let state = api.inspect(&id).await.1;
    assert_eq!(
        (state["in_use"].clone(), state["available"].clone()),
        (json!(3), json!(0))
    );
}

async fn borrow_response_reports_expiry(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 2).await;
    let before = semaphore::clock::now_ms();
    let (status, body) = api.borrow(&id, 30.0, 0.0).await;
    let after = semaphore::clock::now_ms();
    assert_eq!(status, 200);
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "lease",
            "position",
            "expires_at_unix",
            "expires_in",
            "fence"
        ]
    );
    assert_eq!(body["expires_in"], 30);
    assert!(
        body["fence"].as_u64().unwrap() < 1 << 53,
        "a JSON-safe integer"
    );
    let at = body["expires_at_unix"].as_u64().unwrap();
    assert!(at >= (before + 30_000) / 1000 && at <= (after + 30_000) / 1000);
    let lease = lease_of(&body).await;
    let parsed = uuid::Uuid::parse_str(&lease).unwrap();
    assert_eq!(parsed.get_version_num(), 4);
    assert_eq!(parsed.hyphenated().to_string(), lease);
    // Fractions are kept to the millisecond.
    let (_, body) = api.borrow(&id, 1.25, 0.0).await;
    assert_eq!(body["expires_in"], 1.25);
}

async fn ttl_and_wait_are_clamped(backend: Backend) {
    let api = ApiClient::new(
        backend.store().await,
        Limits {
            max_ttl_ms: 10_000,
            max_wait_ms: 300,
            ..Limits::default()
        },
    );
    let id = pool_id();
    api.register(&id, 1).await;
    let (status, body) = api.borrow(&id, 1e9, 0.0).await;
    assert_eq!(status, 200);
    assert_eq!(body["expires_in"], 10, "ttl above the maximum is clamped");
    let start = Instant::now();
    let (status, _) = api.borrow(&id, 1.0, 1e9).await;
    let waited = start.elapsed();
    assert_eq!(status, 409);
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "wait clamped to 0.3 s, waited {waited:?}"
    );
    // The defaults: 3600 s.
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 1).await;
    assert_eq!(api.borrow(&id, 86_400.0, 0.0).await.1["expires_in"], 3600);
}

async fn return_is_idempotent(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let (id, other) = (pool_id(), pool_id());
    api.register(&id, 2).await;
    api.register(&other, 2).await;
    let lease = lease_of(&api.borrow(&id, 60.0, 0.0).await.1).await;
    let foreign = lease_of(&api.borrow(&other, 60.0, 0.0).await.1).await;
    let no = json!({"returned": false});
    assert_eq!(
        api.return_lease(&id, &foreign).await,
        (200, no.clone()),
        "another pool's lease"
    );
    assert_eq!(
        api.return_lease(&id, &uuid::Uuid::new_v4().to_string())
            .await,
        (200, no.clone())
    );
    assert_eq!(
        api.return_lease(&id, &lease.to_uppercase()).await,
        (200, json!({"returned": true}))
    );
    assert_eq!(
        api.return_lease(&id, &lease).await,
        (200, no),
        "already returned"
    );
    assert_eq!(api.inspect(&id).await.1["in_use"], 0);
    assert_eq!(
        api.inspect(&other).await.1["in_use"],
        1,
        "foreign lease untouched"
    );
}

async fn delete_removes_pool_and_leases(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 2).await;
    let lease = lease_of(&api.borrow(&id, 60.0, 0.0).await.1).await;
    assert_eq!(api.delete(&id).await, (200, json!({"deleted": true})));
    assert_eq!(api.inspect(&id).await.0, 404);
    assert_eq!(api.return_lease(&id, &lease).await.0, 404);
    assert_eq!(api.delete(&id).await, (200, json!({"deleted": false})));
    // A later PUT starts an empty pool; the old lease means nothing there.
    assert_eq!(api.register(&id, 2).await.1["in_use"], 0);
    assert_eq!(
        api.return_lease(&id, &lease).await,
        (200, json!({"returned": false}))
    );
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 0);
}

async fn expired_leases_free_their_slots(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 2).await;
    let short = lease_of(&api.borrow(&id, 0.2, 0.0).await.1).await;
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 1);
    assert_eq!(api.inspect(&id).await.1["in_use"], 2);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(api.inspect(&id).await.1["in_use"], 1);
    assert_eq!(
        api.return_lease(&id, &short).await.1["returned"],
        false,
        "expired"
    );
    assert_eq!(
        api.borrow(&id, 60.0, 0.0).await.1["position"],
        0,
        "expired slot is next"
    );
}

async fn shrink_keeps_live_leases(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 3).await;
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(lease_of(&api.borrow(&id, 60.0, 0.0).await.1).await);
    }
    let (status, body) = api.register(&id, 1).await;
    assert_eq!(status, 200);
    assert_eq!(body["in_use"], 3, "lowering count revokes nothing");
    assert_eq!(body["available"], 0);
    // Positions ≥ count stay held; two leases still exceed count 1.
    assert_eq!(api.return_lease(&id, &leases[0]).await.1["returned"], true);
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.0, 409);
    assert_eq!(api.return_lease(&id, &leases[1]).await.1["returned"], true);
    assert_eq!(
        api.borrow(&id, 60.0, 0.0).await.0,
        409,
        "position 2 still held"
    );
    assert_eq!(api.return_lease(&id, &leases[2]).await.1["returned"], true);
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.1["position"], 0);
    assert_eq!(api.borrow(&id, 60.0, 0.0).await.0, 409);
}

async fn count_zero_never_grants(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    assert_eq!(
        api.register(&id, 0).await.1,
        json!({"id": id, "count": 0, "in_use": 0, "available": 0, "waiting": 0})
    );
    assert_eq!(api.borrow(&id, 1.0, 0.0).await.0, 409);
    assert_eq!(api.borrow(&id, 1.0, 0.2).await.0, 409);
}

/// Starts a waiting borrow in the background; returns its handle and start time.
fn spawn_waiter(
    api: &std::sync::Arc<ApiClient>,
    id: &str,
    wait: f64,
) -> tokio::task::JoinHandle<((u16, Value), Instant)> {
    let (api, id) = (api.clone(), id.to_string());
    tokio::spawn(async move {
        let result = api.borrow(&id, 30.0, wait).await;
        (result, Instant::now())
    })
}

async fn wait_is_woken_by_return(backend: Backend) {
    let api = std::sync::Arc::new(ApiClient::for_backend(backend).await);
    let id = pool_id();
    api.register(&id, 1).await;
    let held = lease_of(&api.borrow(&id, 60.0, 0.0).await.1).await;
    let waiter = spawn_waiter(&api, &id, 5.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "waiter must block while the pool is full"
    );
    let returned_at = Instant::now();
    assert_eq!(api.return_lease(&id, &held).await.1["returned"], true);
    let ((status, body), granted_at) = waiter.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["position"], 0);
    let delay = granted_at.duration_since(returned_at);
    assert!(
        delay < Duration::from_millis(500),
        "woken {delay:?} after the return"
    );
}

async fn wait_is_woken_by_expiry(backend: Backend) {
    let api = std::sync::Arc::new(ApiClient::for_backend(backend).await);
    let id = pool_id();
    api.register(&id, 1).await;
    let started = Instant::now();
    api.borrow(&id, 0.4, 0.0).await;
    let waiter = spawn_waiter(&api, &id, 5.0);
    let ((status, body), granted_at) = waiter.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["position"], 0);
    let held = granted_at.duration_since(started);
    // Expiry is kept in whole ms of the wall clock, so it can fall up to 1 ms
    // before 400 ms on the monotonic clock measured here.
    assert!(
        held >= Duration::from_millis(399) && held < Duration::from_millis(900),
        "granted {held:?} after a 0.4 s lease began"
    );
}

async fn wait_is_woken_by_count_raise(backend: Backend) {
    let api = std::sync::Arc::new(ApiClient::for_backend(backend).await);
    let id = pool_id();
    api.register(&id, 1).await;
    api.borrow(&id, 60.0, 0.0).await;
    let waiter = spawn_waiter(&api, &id, 5.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let raised_at = Instant::now();
    assert_eq!(api.register(&id, 2).await.1["available"], 1);
    let ((status, body), granted_at) = waiter.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["position"], 1);
    assert!(granted_at.duration_since(raised_at) < Duration::from_millis(500));
}

async fn wait_gives_409_after_wait(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 1).await;
    api.borrow(&id, 60.0, 0.0).await;
    let start = Instant::now();
    assert_eq!(
        api.borrow(&id, 10.0, 0.5).await,
        (409, json!({"error": "no resource available"}))
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
}

async fn delete_while_waiting_is_404(backend: Backend) {
    let api = std::sync::Arc::new(ApiClient::for_backend(backend).await);
    let id = pool_id();
    api.register(&id, 1).await;
    api.borrow(&id, 60.0, 0.0).await;
    let waiter = spawn_waiter(&api, &id, 5.0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.delete(&id).await;
    let ((status, _), _) = waiter.await.unwrap();
    assert_eq!(status, 404);
}

async fn inspect_never_reveals_leases(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 2).await;
    let lease = lease_of(&api.borrow(&id, 60.0, 0.0).await.1).await;
    let (status, body) = api.inspect(&id).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"id": id, "count": 2, "in_use": 1, "available": 1, "waiting": 0})
    );
    assert!(!body.to_string().contains(&lease));
}

async fn bad_input_is_400_json(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    api.register(&id, 1).await;
    let pool = format!("/l/{id}");
    let borrow = format!("/l/{id}/borrow");
    let ret = format!("/l/{id}/return");
    let cases: Vec<(&str, String, &str)> = vec![
        // Ids that are not UUIDs, on every route.
        ("PUT", "/l/nope".into(), r#"{"count":1}"#),
        ("GET", "/l/nope".into(), ""),
        ("DELETE", "/l/1234".into(), ""),
        ("POST", "/l/nope/borrow".into(), r#"{"ttl":1}"#),
        (
            "POST",
            "/l/nope/return".into(),
            r#"{"lease":"3a7d0b14-9e2c-4f6a-8b1d-0c5e2f9a7b34"}"#,
        ),
        // Register bodies.
        ("PUT", pool.clone(), ""),
        ("PUT", pool.clone(), "{"),
        ("PUT", pool.clone(), "[1]"),
        ("PUT", pool.clone(), "{}"),
        ("PUT", pool.clone(), r#"{"count":-1}"#),
        ("PUT", pool.clone(), r#"{"count":1001}"#),
        ("PUT", pool.clone(), r#"{"count":2.5}"#),
        ("PUT", pool.clone(), r#"{"count":"2"}"#),
        ("PUT", pool.clone(), r#"{"count":null}"#),
        // Borrow bodies.
        ("POST", borrow.clone(), ""),
        ("POST", borrow.clone(), "not json"),
        ("POST", borrow.clone(), r#""ttl""#),
        ("POST", borrow.clone(), r#"{"wait":1}"#),
        ("POST", borrow.clone(), r#"{"ttl":0}"#),
        ("POST", borrow.clone(), r#"{"ttl":-5}"#),
        ("POST", borrow.clone(), r#"{"ttl":"5"}"#),
        ("POST", borrow.clone(), r#"{"ttl":5,"wait":-1}"#),
        ("POST", borrow.clone(), r#"{"ttl":5,"wait":"1"}"#),
        ("POST", borrow.clone(), r#"{"ttl":5,"wait":true}"#),
        // Return bodies.
        ("POST", ret.clone(), ""),
        ("POST", ret.clone(), "{}"),
        ("POST", ret.clone(), r#"{"lease":"nope"}"#),
        ("POST", ret.clone(), r#"{"lease":42}"#),
    ];
    for (method, path, body) in &cases {
        let (status, response) = api.call(method, path, body).await;
        assert_eq!(status, 400, "{method} {path} {body:?} → {response}");
        assert!(
            response["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{response}"
        );
    }
    // Nothing was half-written by the bad requests.
    assert_eq!(
        api.inspect(&id).await.1,
        json!({"id": id, "count": 1, "in_use": 0, "available": 1, "waiting": 0})
    );
    // Unknown fields are ignored.
    assert_eq!(
        api.call("PUT", &pool, r#"{"count":2,"colour":"red"}"#)
            .await
            .0,
        200
    );
    assert_eq!(
        api.call("POST", &borrow, r#"{"ttl":5,"extra":[1]}"#)
            .await
            .0,
        200
    );
}

async fn routes_and_methods(backend: Backend) {
    let api = ApiClient::for_backend(backend).await;
    let id = pool_id();
    for (method, path) in [
        ("GET", "/".to_string()),
        ("GET", "/l".to_string()),
        ("GET", format!("/pools/{id}")),
        ("POST", format!("/l/{id}/renew")),
    ] {
        let (status, body) = api.call(method, &path, "").await;
        assert_eq!(status, 404, "{method} {path}");
        assert!(body["error"].is_string());
    }
    for (method, path, allow) in [
        ("POST", format!("/l/{id}"), "PUT, GET, DELETE"),
        ("PATCH", format!("/l/{id}"), "PUT, GET, DELETE"),
        ("GET", format!("/l/{id}/borrow"), "POST"),
        ("PUT", format!("/l/{id}/return"), "POST"),
    ] {
        let response = api.raw(method, &path, b"", None).await;
        assert_eq!(response.status, 405, "{method} {path}");
        assert_eq!(response.allow.as_deref(), Some(allow));
        assert!(response.body["error"].is_string());
    }
}
