//! Every `events/*.json` fixture (API Gateway HTTP API v2 events, and the
//! dispatcher's stream and wake queue batches, for `sam local invoke`) goes
//! through its typed deserialization (lambda_http's, aws_lambda_events') and
//! the real handler, built the way each function's `main` builds it, against
//! DynamoDB Local — so the fixtures cannot rot.

use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_http::{Body, Response};
use semaphore::delivery::wake::Wake;
use semaphore::delivery::BatchResponse;
use semaphore::store::dynamodb::dispatches;
use semaphore::{config, lambda, Route, Service};
use semaphore_tests::receiver::{answer, read_request, Delivered};
use semaphore_tests::wakes::dispatcher_on_dynamodb;
use serde_dynamo::AttributeValue;
use serde_json::{json, Value};
use tokio::net::TcpListener;

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
        // As events/env.json sets it for the enqueue function: the
        // receiver below is on loopback.
        "ALLOW_LOCAL_CALLBACKS" => Some("true".to_string()),
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

    // The same pool (in this test: the fixtures share its id) in async mode.
    async_fixtures_run_through_the_routes_and_the_dispatcher(&service).await;
}

/// A receiver on loopback answering every POST 200, and what it got.
async fn receiver() -> (String, Arc<Mutex<Vec<Delivered>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/grants", listener.local_addr().expect("addr"));
    let got: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let record = got.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            if let Some(delivered) = read_request(&mut stream).await {
                record.lock().expect("lock").push(delivered);
                answer(&mut stream, 200).await;
            }
        }
    });
    (url, got)
}

/// enqueue → ticket → the stream batch (the dispatcher grants, and hands the
/// delivery to the wake queue) → the wake batch (it delivers) → cancel (a
/// delivered ticket keeps its grant) → return.
async fn async_fixtures_run_through_the_routes_and_the_dispatcher(service: &Service) {
    let dispatcher = dispatcher_on_dynamodb().await;
    let (url, got) = receiver().await;
    invoke(service, Route::Register, &read_event("register.json")).await;

    let mut enqueue = read_event("enqueue.json");
    let mut body: Value = serde_json::from_str(enqueue["body"].as_str().unwrap()).unwrap();
    let lease = body["lease"].clone();
    body["callback"]["url"] = json!(url);
    enqueue["body"] = json!(body.to_string());
    assert_eq!(
        invoke(service, Route::Enqueue, &enqueue).await,
        (202, json!({"ticket": 0, "ahead": 0}))
    );
    let (status, ticket) = invoke(service, Route::Ticket, &read_event("ticket.json")).await;
    assert_eq!(
        (status, &ticket["state"]),
        (200, &json!("waiting")),
        "{ticket}"
    );

    // What the stream tells the dispatcher of the enqueue: the ticket's
    // insert and the pool item's change. It grants, and delivers nothing
    // itself: the wake queue's invocation does.
    let stream = read_event("dispatcher-stream.json");
    let response = dispatcher.handler.handle_batch(stream, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(got.lock().unwrap().len(), 0);
    let (_, ticket) = invoke(service, Route::Ticket, &read_event("ticket.json")).await;
    assert_eq!(ticket["state"], "granted", "{ticket}");
    let sent = dispatcher.wakes.taken();
    assert_eq!(
        sent.len(),
        2,
        "the step's next wake, then the hand-off: {sent:?}"
    );
    assert_eq!((sent[1].0.at_ms, sent[1].1.as_secs()), (None, 0));

    // A wake long past (as the hand-off's would be): the pool is stepped,
    // its grant delivered, nothing else due, nothing more armed.
    let wake = read_event("dispatcher-wake.json");
    let response = dispatcher.handler.handle_batch(wake, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    let delivered = got.lock().unwrap().clone();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].authorization, "Bearer s3cr3t-t0ken");
    assert_eq!(delivered[0].body["ticket"], 0);
    let (_, ticket) = invoke(service, Route::Ticket, &read_event("ticket.json")).await;
    assert_eq!(ticket["state"], "delivered", "{ticket}");
    assert_eq!(dispatcher.wakes.taken().len(), 0);

    let (status, cancelled) = invoke(service, Route::Cancel, &read_event("cancel.json")).await;
    assert_eq!((status, &cancelled["state"]), (200, &json!("delivered")));
    let mut ret = read_event("return.json");
    ret["body"] = json!(json!({ "lease": lease }).to_string());
    assert_eq!(
        invoke(service, Route::Return, &ret).await,
        (200, json!({"returned": true}))
    );
    invoke(service, Route::Delete, &read_event("delete.json")).await;
}

/// Each fixture parses as the event it stands for, as Lambda would hand it
/// to the function: the HTTP ones as lambda_http's request, the stream batch
/// as a DynamoDB stream event whose records pass the template's filter, the
/// wake batch as an SQS event whose bodies are wakes.
#[test]
fn every_fixture_parses_as_the_event_it_stands_for() {
    for name in fixtures() {
        let text = std::fs::read_to_string(events_dir().join(&name)).unwrap();
        match name.as_str() {
            "env.json" => {}
            "dispatcher-stream.json" => {
                let event: StreamEvent = serde_json::from_str(&text).expect(&name);
                assert!(!event.records.is_empty());
                for record in event.records {
                    let change = record.change;
                    let Some(AttributeValue::B(sk)) = change.keys.get("sk") else {
                        panic!("{name}: a binary sort key")
                    };
                    let passes = dispatches(
                        sk,
                        |attribute| change.new_image.contains_key(attribute),
                        record.event_name == "INSERT",
                    );
                    assert!(passes, "{name}: a record the filter passes");
                    assert!(change.sequence_number.is_some());
                }
            }
            "dispatcher-wake.json" => {
                let event: SqsEvent = serde_json::from_str(&text).expect(&name);
                assert!(!event.records.is_empty());
                for message in event.records {
                    assert!(message.message_id.is_some());
                    let wake = Wake::from_body(message.body.as_deref().unwrap_or_default());
                    assert!(wake.is_ok_and(|w| w.at_ms.is_some()), "{name}");
                }
            }
            _ => {
                let request = lambda_http::request::from_str(&text).expect(&name);
                let route =
                    semaphore::api::resolve(request.method().as_str(), request.uri().path());
                assert!(route.is_ok(), "{name}: a route of the API");
            }
        }
    }
}

fn fixtures() -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(events_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

/// A fixture nobody runs would rot: every event file must be exercised above.
#[test]
fn no_event_fixture_goes_untested() {
    let tested = [
        "borrow-bad-input.json",
        "borrow.json",
        "cancel.json",
        "delete.json",
        "dispatcher-stream.json",
        "dispatcher-wake.json",
        "enqueue.json",
        "env.json",
        "inspect.json",
        "register.json",
        "return.json",
        "ticket.json",
    ];
    assert_eq!(fixtures(), tested);
    // env.json names every function of the template, with what it must
    // have at start.
    let env = read_event("env.json");
    for function in semaphore::functions::FUNCTIONS {
        let vars = &env[function.logical_id];
        assert!(vars.is_object(), "{} in env.json", function.logical_id);
        // And nothing it does not read (the SDK's own variables aside).
        let sdk = [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "AWS_ENDPOINT_URL_SQS",
        ];
        for name in vars.as_object().into_iter().flat_map(|o| o.keys()) {
            let read = function.env.iter().any(|v| v.name == name);
            assert!(
                read || sdk.contains(&name.as_str()),
                "{}: {name}",
                function.logical_id
            );
        }
        for var in function.env.iter().filter(|v| v.required) {
            assert!(
                vars[var.name].is_string(),
                "{}: {}",
                function.logical_id,
                var.name
            );
        }
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

/// `GET /openapi.json` and `GET /health` have no route in the template, so
/// `$default` serves them (and HEAD, with no body).
#[tokio::test]
async fn fallback_serves_the_openapi_document() {
    let cases = [
        ("GET", "/openapi.json", 200, None),
        ("HEAD", "/openapi.json", 200, None),
        ("POST", "/openapi.json", 405, Some("GET, HEAD")),
        ("GET", "/health", 200, None),
        ("HEAD", "/health", 200, None),
        ("DELETE", "/health", 405, Some("GET, HEAD")),
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
        assert_eq!(response.headers()["content-type"], "application/json");
        let got_allow = response
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got_allow.as_deref(), allow, "{method} {path}");
        if method == "HEAD" {
            // GET's status and headers, no body.
            assert!(matches!(response.body(), Body::Empty), "{method} {path}");
            continue;
        }
        let Body::Text(text) = response.body() else {
            panic!("non-text body")
        };
        let body: Value = serde_json::from_str(text).unwrap();
        match (status, path) {
            (200, "/health") => assert_eq!(body, json!({"status": "ok"})),
            (200, _) => {
                assert_eq!(body["openapi"], "3.1.0");
                assert!(body["paths"]["/l/{id}/borrow"]["post"].is_object());
            }
            _ => assert!(body["error"].is_string()),
        }
    }
}

/// A body over 64 KiB (API Gateway passes up to 10 MB) is a 413 on the Lambda
/// path as on local-api, and is never parsed: nothing is written.
#[tokio::test]
async fn a_body_over_64_kib_is_413_on_the_lambda_path() {
    let service = Service::new(
        Arc::new(semaphore::store::MemoryStore::new()),
        semaphore::Limits::default(),
    );
    let mut event = read_event("register.json");
    let padded = json!({"count": 2, "pad": "x".repeat(64 * 1024)}).to_string();
    event["body"] = Value::String(padded);
    let (status, body) = invoke(&service, Route::Register, &event).await;
    assert_eq!(status, 413, "{body}");
    assert!(body["error"].is_string(), "{body}");
    // Exactly the limit is read (and this body is valid).
    let body = json!({"count": 2, "pad": ""}).to_string();
    let pad = 64 * 1024 - body.len();
    event["body"] = Value::String(json!({"count": 2, "pad": "x".repeat(pad)}).to_string());
    let (status, body) = invoke(&service, Route::Register, &event).await;
    assert_eq!(status, 200, "{body}");
}
