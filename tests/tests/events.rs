//! Every `events/*.json` fixture (API Gateway HTTP API v2 events for
//! `sam local invoke`) goes through lambda_http's own deserialization and the
//! real handler, built the way each function's `main` builds it, against
//! DynamoDB Local — so the fixtures cannot rot.

use std::path::{Path, PathBuf};

use lambda_http::{Body, Response};
use semaphore::{config, lambda, Route, Service};
use serde_json::{json, Value};

const POOL: &str = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../events")
}

fn read_event(name: &str) -> Value {
    let path = events_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn invoke(service: &Service, route: Route, event: &Value) -> (u16, Value) {
    let request =
        lambda_http::request::from_str(&event.to_string()).expect("lambda_http parses the event");
    let response: Response<Body> = lambda::handle(service, route, request).await.unwrap();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(content_type.as_deref(), Some("application/json"));
    let body = match response.body() {
        Body::Text(text) => serde_json::from_str(text).unwrap(),
        other => panic!("non-text body {other:?}"),
    };
    (response.status().as_u16(), body)
}

#[tokio::test]
async fn every_event_fixture_runs_through_the_real_handler() {
    // The functions' own init path (service_from_env reads the environment
    // through this lookup): TABLE_NAME and AWS_ENDPOINT_URL_DYNAMODB as in
    // events/env.json, the rest from the environment. No set_var: other tests
    // run in this process at the same time.
    let endpoint = semaphore_tests::harness::endpoint();
    semaphore_tests::harness::dynamodb_client().await; // creates the table
    let service = config::service_from_lookup(|name| match name {
        "AWS_ENDPOINT_URL_DYNAMODB" => Some(endpoint.clone()),
        "TABLE_NAME" => Some(semaphore_tests::harness::TABLE.to_string()),
        _ => std::env::var(name).ok(),
    })
    .await
    .expect("service from the lookup");

    let delete = read_event("delete.json");
    invoke(&service, Route::Delete, &delete).await;

    let (status, body) = invoke(&service, Route::Register, &read_event("register.json")).await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"id": POOL, "count": 2, "in_use": 0, "available": 2, "waiting": 0})
        )
    );

    let (status, grant) = invoke(&service, Route::Borrow, &read_event("borrow.json")).await;
    assert_eq!(status, 200, "{grant}");
    assert_eq!(
        (grant["position"].clone(), grant["expires_in"].clone()),
        (json!(0), json!(30))
    );

    let (status, body) = invoke(&service, Route::Inspect, &read_event("inspect.json")).await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"id": POOL, "count": 2, "in_use": 1, "available": 1, "waiting": 0})
        )
    );

    let (status, body) = invoke(&service, Route::Return, &read_event("return.json")).await;
    assert_eq!(
        (status, body),
        (200, json!({"returned": false})),
        "the fixture's lease is unknown"
    );
    let mut ret = read_event("return.json");
    ret["body"] = json!(json!({"lease": grant["lease"]}).to_string());
    assert_eq!(
        invoke(&service, Route::Return, &ret).await,
        (200, json!({"returned": true}))
    );

    let (status, body) = invoke(
        &service,
        Route::Borrow,
        &read_event("borrow-bad-input.json"),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("ttl"));

    // Without path parameters (a Function URL, `cargo lambda watch`) the id
    // comes from the raw path.
    let mut bare = read_event("inspect.json");
    bare.as_object_mut().unwrap().remove("pathParameters");
    assert_eq!(invoke(&service, Route::Inspect, &bare).await.1["count"], 2);
    // A wrong method reaching a function is a 405.
    let mut wrong = read_event("inspect.json");
    wrong["requestContext"]["http"]["method"] = json!("PATCH");
    assert_eq!(invoke(&service, Route::Inspect, &wrong).await.0, 405);

    assert_eq!(
        invoke(&service, Route::Delete, &delete).await,
        (200, json!({"deleted": true}))
    );
    assert_eq!(
        invoke(&service, Route::Delete, &delete).await,
        (200, json!({"deleted": false}))
    );
}

/// A fixture nobody runs would rot: every event file must be exercised above.
#[test]
fn no_event_fixture_goes_untested() {
    let tested = [
        "borrow-bad-input.json",
        "borrow.json",
        "delete.json",
        "env.json",
        "inspect.json",
        "register.json",
        "return.json",
    ];
    let mut found: Vec<String> = std::fs::read_dir(events_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, tested);
    // env.json names every function of the template.
    let env = read_event("env.json");
    for function in [
        "RegisterFunction",
        "InspectFunction",
        "DeleteFunction",
        "BorrowFunction",
        "ReturnFunction",
    ] {
        assert!(
            env[function]["TABLE_NAME"].is_string(),
            "{function} in env.json"
        );
    }
}

/// `$default` (anything no route matched) answers JSON 404s and 405s.
#[tokio::test]
async fn fallback_answers_unmatched_requests_with_json() {
    let cases = [
        ("GET", "/nowhere", 404, None),
        (
            "GET",
            "/l/9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01/borrow",
            405,
            Some("POST"),
        ),
        (
            "POST",
            "/l/9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01",
            405,
            Some("PUT, GET, DELETE"),
        ),
    ];
    for (method, path, status, allow) in cases {
        let mut event = read_event("inspect.json");
        event["routeKey"] = json!("$default");
        event["rawPath"] = json!(path);
        event["requestContext"]["http"]["method"] = json!(method);
        event["requestContext"]["http"]["path"] = json!(path);
        event.as_object_mut().unwrap().remove("pathParameters");
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        let response = lambda::fallback(request).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        let got_allow = response
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got_allow.as_deref(), allow);
        let Body::Text(text) = response.body() else {
            panic!("non-text body")
        };
        let body: Value = serde_json::from_str(text).unwrap();
        assert!(body["error"].is_string());
    }
}

/// `GET /openapi.json` has no route in the template, so `$default` serves it.
#[tokio::test]
async fn fallback_serves_the_openapi_document() {
    for (method, status, allow) in [("GET", 200, None), ("POST", 405, Some("GET"))] {
        let mut event = read_event("inspect.json");
        event["routeKey"] = json!("$default");
        event["rawPath"] = json!("/openapi.json");
        event["requestContext"]["http"]["method"] = json!(method);
        event["requestContext"]["http"]["path"] = json!("/openapi.json");
        event.as_object_mut().unwrap().remove("pathParameters");
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        let response = lambda::fallback(request).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{method}");
        assert_eq!(response.headers()["content-type"], "application/json");
        let got_allow = response
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got_allow.as_deref(), allow);
        let Body::Text(text) = response.body() else {
            panic!("non-text body")
        };
        let body: Value = serde_json::from_str(text).unwrap();
        if status == 200 {
            assert_eq!(body["openapi"], "3.1.0");
            assert!(body["paths"]["/l/{id}/borrow"]["post"].is_object());
        } else {
            assert!(body["error"].is_string());
        }
    }
}
