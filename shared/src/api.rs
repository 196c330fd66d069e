//! HTTP in one place: routing, input validation and the error → status/JSON
//! mapping, shared by every Lambda function and the local server.

use std::time::{Duration, Instant};

use lambda_http::http::{
    self,
    header::{ALLOW, CONTENT_TYPE},
    HeaderValue, StatusCode,
};
use serde_json::{json, Map, Number, Value};
use uuid::Uuid;

use crate::domain::{PoolState, MAX_COUNT};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId};
use crate::service::{BorrowRequest, Grant, Service};
use crate::store::StoreErrorKind;

/// The five routes of API.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    Register,
    Inspect,
    Delete,
    Borrow,
    Return,
}

impl Route {
    pub const ALL: [Route; 5] = [
        Route::Register,
        Route::Inspect,
        Route::Delete,
        Route::Borrow,
        Route::Return,
    ];

    pub fn method(self) -> &'static str {
        match self {
            Route::Register => "PUT",
            Route::Inspect => "GET",
            Route::Delete => "DELETE",
            Route::Borrow | Route::Return => "POST",
        }
    }

    /// The route key as API Gateway names it; safe to log (no id in it).
    pub fn key(self) -> &'static str {
        match self {
            Route::Register => "PUT /l/{id}",
            Route::Inspect => "GET /l/{id}",
            Route::Delete => "DELETE /l/{id}",
            Route::Borrow => "POST /l/{id}/borrow",
            Route::Return => "POST /l/{id}/return",
        }
    }
}

/// A finished response: status, JSON body, and `Allow` for a 405.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Value,
    pub allow: Option<&'static str>,
}

impl ApiResponse {
    fn ok(body: Value) -> Self {
        ApiResponse {
            status: 200,
            body,
            allow: None,
        }
    }

    /// As an HTTP response: the JSON body, `Content-Type: application/json`,
    /// and `Allow` on a 405. Every entrypoint answers through this.
    pub fn into_http(self) -> http::Response<String> {
        let mut response = http::Response::new(self.body.to_string());
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(allow) = self.allow {
            headers.insert(ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

/// The only mapping from errors to statuses.
pub fn error_response(err: &Error) -> ApiResponse {
    let (status, message) = match err {
        Error::BadRequest(reason) => (400, reason.clone()),
        Error::PoolNotFound => (404, "pool not found".to_string()),
        Error::RouteNotFound => (404, "not found".to_string()),
        Error::MethodNotAllowed { .. } => (405, "method not allowed".to_string()),
        Error::Exhausted => (409, "no resource available".to_string()),
        // Details go to the log; the caller only needs to know it may retry.
        Error::Store(store) => (
            502,
            match store.kind {
                StoreErrorKind::Throttled => "database throttled the request; retry with backoff",
                _ => "database call failed; retry with backoff",
            }
            .to_string(),
        ),
    };
    ApiResponse {
        status,
        body: json!({ "error": message }),
        allow: match err {
            Error::MethodNotAllowed { allow } => Some(allow),
            _ => None,
        },
    }
}

/// Matches a path against the routes: `/l/{id}` and `/l/{id}/borrow|return`.
/// Returns the route for `method` and the raw id segment, or 404/405.
pub fn resolve<'p>(method: &str, path: &'p str) -> Result<(Route, &'p str), Error> {
    let path = path.split('?').next().unwrap_or_default();
    let mut segments = path.strip_prefix('/').unwrap_or(path).split('/');
    let (Some("l"), Some(id)) = (segments.next(), segments.next()) else {
        return Err(Error::RouteNotFound);
    };
    if id.is_empty() {
        return Err(Error::RouteNotFound);
    }
    let routes: &[Route] = match (segments.next(), segments.next()) {
        (None, _) => &[Route::Register, Route::Inspect, Route::Delete],
        (Some("borrow"), None) => &[Route::Borrow],
        (Some("return"), None) => &[Route::Return],
        _ => return Err(Error::RouteNotFound),
    };
    match routes.iter().find(|r| r.method() == method) {
        Some(route) => Ok((*route, id)),
        None => Err(Error::MethodNotAllowed {
            allow: if routes.len() == 1 {
                "POST"
            } else {
                "PUT, GET, DELETE"
            },
        }),
    }
}

/// Finds the id in a raw path for `route`, when no path parameter was given
/// (Function URL, `cargo lambda watch`, a stage prefix): the segment after the
/// last `/l/`.
pub fn id_from_path(route: Route, path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or_default();
    let mut segments: Vec<&str> = path.split('/').collect();
    if segments.last() == Some(&"") {
        segments.pop();
    }
    let tail = match route {
        Route::Borrow => Some("borrow"),
        Route::Return => Some("return"),
        _ => None,
    };
    if let Some(tail) = tail {
        if segments.pop() != Some(tail) {
            return None;
        }
    }
    let id = segments.pop()?;
    (segments.pop() == Some("l")).then_some(id)
}

/// Runs one request on `route` for the raw id segment and JSON body.
/// `deadline` is the Lambda's: a borrow never waits past it.
pub async fn handle(
    service: &Service,
    route: Route,
    raw_id: &str,
    body: &[u8],
    deadline: Option<Instant>,
) -> ApiResponse {
    match dispatch(service, route, raw_id, body, deadline).await {
        Ok(response) => response,
        Err(err) => {
            if let Error::Store(store) = &err {
                tracing::warn!(route = route.key(), error = %store, "database call failed");
            }
            error_response(&err)
        }
    }
}

async fn dispatch(
    service: &Service,
    route: Route,
    raw_id: &str,
    body: &[u8],
    deadline: Option<Instant>,
) -> Result<ApiResponse, Error> {
    let id = parse_pool_id(raw_id)?;
    match route {
        Route::Register => {
            let count = parse_count(&parse_object(body)?)?;
            let state = service.register(id, count, deadline).await?;
            Ok(ApiResponse::ok(state_body(id, state)))
        }
        Route::Inspect => {
            let state = service.inspect(id).await?;
            Ok(ApiResponse::ok(state_body(id, state)))
        }
        Route::Delete => {
            let deleted = service.delete(id).await?;
            Ok(ApiResponse::ok(json!({ "deleted": deleted })))
        }
        Route::Borrow => {
            let request = parse_borrow(&parse_object(body)?)?;
            let grant = service.borrow(id, request, deadline).await?;
            Ok(ApiResponse::ok(grant_body(&grant)))
        }
        Route::Return => {
            let lease = parse_lease(&parse_object(body)?)?;
            let returned = service.return_lease(id, lease, deadline).await?;
            Ok(ApiResponse::ok(json!({ "returned": returned })))
        }
    }
}

/// One log line per request, without secrets: the route key, the pool id's
/// first 8 hex digits, the status and the latency.
pub fn log_request(route_key: &str, raw_id: Option<&str>, status: u16, elapsed: Duration) {
    let pool = raw_id
        .and_then(|raw| parse_pool_id(raw).ok())
        .map_or_else(|| "-".to_string(), |id| id.to_string());
    tracing::info!(
        route = route_key,
        pool = %pool,
        status,
        ms = elapsed.as_millis() as u64,
        "request"
    );
}

fn bad(reason: impl Into<String>) -> Error {
    Error::BadRequest(reason.into())
}

pub fn parse_pool_id(raw: &str) -> Result<PoolId, Error> {
    Uuid::parse_str(raw)
        .map(PoolId)
        .map_err(|_| bad("pool id must be a UUID"))
}

/// The body as a JSON object. Unknown fields are ignored by the callers.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("request body must be a JSON object"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("request body must be a JSON object")),
        Err(err) => Err(bad(format!("malformed JSON: {err}"))),
    }
}

/// `count`: a JSON integer in `0 … 1000`.
pub fn parse_count(body: &Map<String, Value>) -> Result<u16, Error> {
    let range = || bad(format!("count must be an integer from 0 to {MAX_COUNT}"));
    match body.get("count") {
        None => Err(bad("count is required")),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c <= MAX_COUNT)
            .ok_or_else(range),
        Some(_) => Err(range()),
    }
}

/// `ttl` (required, > 0) and `wait` (default 0, ≥ 0), in seconds with
/// fractions, kept as milliseconds. Clamping to the maximums is the service's.
pub fn parse_borrow(body: &Map<String, Value>) -> Result<BorrowRequest, Error> {
    let ttl = match body.get("ttl") {
        None => return Err(bad("ttl is required")),
        Some(value) => seconds(value).filter(|t| *t > 0.0),
    }
    .ok_or_else(|| bad("ttl must be a number of seconds greater than 0"))?;
    let wait = match body.get("wait") {
        None => 0.0,
        Some(value) => seconds(value)
            .filter(|w| *w >= 0.0)
            .ok_or_else(|| bad("wait must be a number of seconds, 0 or more"))?,
    };
    Ok(BorrowRequest {
        // A positive ttl never rounds to an already-expired lease.
        ttl_ms: to_ms(ttl).max(1),
        wait_ms: to_ms(wait),
    })
}

fn seconds(value: &Value) -> Option<f64> {
    value.as_f64().filter(|s| s.is_finite())
}

/// Seconds to whole milliseconds, saturating (the service clamps anyway).
fn to_ms(seconds: f64) -> u64 {
    let ms = (seconds * 1000.0).round();
    if ms >= u64::MAX as f64 {
        u64::MAX
    } else {
        ms as u64
    }
}

/// `lease`: a UUID string.
pub fn parse_lease(body: &Map<String, Value>) -> Result<LeaseId, Error> {
    match body.get("lease") {
        None => Err(bad("lease is required")),
        Some(Value::String(s)) => Uuid::parse_str(s)
            .map(LeaseId)
            .map_err(|_| bad("lease must be a UUID")),
        Some(_) => Err(bad("lease must be a UUID string")),
    }
}

fn state_body(id: PoolId, state: PoolState) -> Value {
    json!({
        "id": id.to_hyphenated(),
        "count": state.count,
        "in_use": state.in_use,
        "available": state.available,
    })
}

fn grant_body(grant: &Grant) -> Value {
    json!({
        "lease": grant.lease.0.hyphenated().to_string(),
        "position": grant.position,
        "expires_at_unix": grant.expires_at_ms / 1000,
        "expires_in": seconds_value(grant.ttl_ms),
    })
}

/// Whole seconds as a JSON integer, fractions as a JSON float.
fn seconds_value(ms: u64) -> Value {
    if ms.is_multiple_of(1000) {
        Value::from(ms / 1000)
    } else {
        Number::from_f64(ms as f64 / 1000.0).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> Map<String, Value> {
        parse_object(s.as_bytes()).unwrap()
    }

    fn is_bad<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
        matches!(r, Err(Error::BadRequest(_)))
    }

    #[test]
    fn routes_resolve_like_api_gateway() {
        let id = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";
        assert_eq!(
            resolve("PUT", &format!("/l/{id}")),
            Ok((Route::Register, id))
        );
        assert_eq!(
            resolve("GET", &format!("/l/{id}?x=1")),
            Ok((Route::Inspect, id))
        );
        assert_eq!(
            resolve("DELETE", &format!("/l/{id}")),
            Ok((Route::Delete, id))
        );
        assert_eq!(
            resolve("POST", &format!("/l/{id}/borrow")),
            Ok((Route::Borrow, id))
        );
        assert_eq!(
            resolve("POST", &format!("/l/{id}/return")),
            Ok((Route::Return, id))
        );
        assert_eq!(
            resolve("GET", "/l/not-a-uuid"),
            Ok((Route::Inspect, "not-a-uuid"))
        );
        for path in [
            "/",
            "/l",
            "/l/",
            "/x/1",
            &format!("/l/{id}/renew"),
            &format!("/l/{id}/borrow/x"),
        ] {
            assert_eq!(resolve("GET", path), Err(Error::RouteNotFound), "{path}");
        }
        assert!(matches!(
            resolve("POST", &format!("/l/{id}")),
            Err(Error::MethodNotAllowed {
                allow: "PUT, GET, DELETE"
            })
        ));
        assert!(matches!(
            resolve("GET", &format!("/l/{id}/borrow")),
            Err(Error::MethodNotAllowed { allow: "POST" })
        ));
    }

    #[test]
    fn id_is_found_in_raw_paths() {
        assert_eq!(id_from_path(Route::Inspect, "/l/abc"), Some("abc"));
        assert_eq!(id_from_path(Route::Inspect, "/prod/l/abc/"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/borrow"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/return"), None);
        assert_eq!(id_from_path(Route::Return, "/l/abc"), None);
        assert_eq!(id_from_path(Route::Inspect, "/x/abc"), None);
    }

    #[test]
    fn ids_parse_in_any_case() {
        let upper = parse_pool_id("9F1C2E7A-5B3D-4C8E-A1F0-6D2B9C4E7A01").unwrap();
        assert_eq!(
            upper.to_hyphenated(),
            "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01"
        );
        assert!(is_bad(parse_pool_id("9f1c2e7a")));
        assert!(is_bad(parse_pool_id("")));
    }

    #[test]
    fn bodies_must_be_json_objects() {
        for body in ["", "  ", "{", "[]", "1", "\"x\"", "null", "{\"count\":1}x"] {
            assert!(is_bad(parse_object(body.as_bytes())), "{body:?}");
        }
        assert!(is_bad(parse_object(&[0xff, 0xfe])));
    }

    #[test]
    fn count_rules() {
        assert_eq!(parse_count(&obj(r#"{"count":0}"#)), Ok(0));
        assert_eq!(parse_count(&obj(r#"{"count":1000,"x":1}"#)), Ok(1000));
        for body in [
            r#"{}"#,
            r#"{"count":-1}"#,
            r#"{"count":1001}"#,
            r#"{"count":1.5}"#,
            r#"{"count":2.0}"#,
            r#"{"count":"4"}"#,
            r#"{"count":null}"#,
            r#"{"count":true}"#,
            r#"{"count":1e3}"#,
            r#"{"count":18446744073709551616}"#,
        ] {
            assert!(is_bad(parse_count(&obj(body))), "{body}");
        }
    }

    #[test]
    fn borrow_rules() {
        let r = parse_borrow(&obj(r#"{"ttl":1.5}"#)).unwrap();
        assert_eq!((r.ttl_ms, r.wait_ms), (1500, 0));
        let r = parse_borrow(&obj(r#"{"ttl":30,"wait":0.25}"#)).unwrap();
        assert_eq!((r.ttl_ms, r.wait_ms), (30_000, 250));
        let r = parse_borrow(&obj(r#"{"ttl":0.0001,"wait":0}"#)).unwrap();
        assert_eq!(r.ttl_ms, 1, "positive ttl keeps at least 1 ms");
        let r = parse_borrow(&obj(r#"{"ttl":1e300,"wait":1e300}"#)).unwrap();
        assert_eq!((r.ttl_ms, r.wait_ms), (u64::MAX, u64::MAX));
        for body in [
            r#"{}"#,
            r#"{"wait":1}"#,
            r#"{"ttl":0}"#,
            r#"{"ttl":-1}"#,
            r#"{"ttl":"30"}"#,
            r#"{"ttl":null}"#,
            r#"{"ttl":30,"wait":-0.5}"#,
            r#"{"ttl":30,"wait":"1"}"#,
            r#"{"ttl":30,"wait":null}"#,
            r#"{"ttl":30,"wait":false}"#,
        ] {
            assert!(is_bad(parse_borrow(&obj(body))), "{body}");
        }
    }

    #[test]
    fn lease_rules() {
        let l = parse_lease(&obj(r#"{"lease":"3A7D0B14-9E2C-4F6A-8B1D-0C5E2F9A7B34"}"#)).unwrap();
        assert_eq!(
            l.0.hyphenated().to_string(),
            "3a7d0b14-9e2c-4f6a-8b1d-0c5e2f9a7b34"
        );
        for body in [
            r#"{}"#,
            r#"{"lease":"x"}"#,
            r#"{"lease":1}"#,
            r#"{"lease":null}"#,
        ] {
            assert!(is_bad(parse_lease(&obj(body))), "{body}");
        }
    }

    #[test]
    fn every_error_is_json_with_the_contract_status() {
        use crate::store::StoreError;
        let cases = [
            (Error::BadRequest("x".into()), 400),
            (Error::PoolNotFound, 404),
            (Error::RouteNotFound, 404),
            (Error::MethodNotAllowed { allow: "POST" }, 405),
            (Error::Exhausted, 409),
            (
                Error::Store(StoreError::new(StoreErrorKind::Throttled, "t")),
                502,
            ),
        ];
        for (err, status) in cases {
            let response = error_response(&err);
            assert_eq!(response.status, status);
            assert!(response.body["error"].is_string());
        }
        assert_eq!(
            error_response(&Error::Exhausted).body,
            json!({"error": "no resource available"})
        );
    }

    #[test]
    fn expires_in_keeps_fractions() {
        assert_eq!(seconds_value(30_000), json!(30));
        assert_eq!(seconds_value(1_500), json!(1.5));
    }
}
