//! HTTP in one place: the route table, input validation and the error →
//! status/JSON mapping, shared by every Lambda function and the local server.

use std::time::Instant;

use lambda_http::http::{
    self,
    header::{ALLOW, CONTENT_TYPE},
    HeaderValue, StatusCode,
};
use semaphore_wire::{self as wire, Seconds};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::clock::now_ms;
use crate::domain::{Callback, PoolState, TicketState};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId};
use crate::metrics::RequestLog;
use crate::service::{BorrowRequest, Call, EnqueueRequest, Grant, Service, TicketReport};
use crate::store::StoreErrorKind;

/// The routes of API.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    Register,
    Inspect,
    Delete,
    Borrow,
    Return,
    /// Async mode: a ticket, its grant delivered to a callback.
    Enqueue,
    Ticket,
    Cancel,
}

/// Where a route lives: on the pool, `/l/{id}`, or on one of its actions,
/// `/l/{id}/<action>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Pool,
    Action(&'static str),
}

/// Every route with its method, path and route key (as API Gateway names it;
/// safe to log). The one table routing, `Allow` and the Lambda adapter read.
const ROUTES: [(Route, &str, Path, &str); 8] = [
    (Route::Register, "PUT", Path::Pool, "PUT /l/{id}"),
    (Route::Inspect, "GET", Path::Pool, "GET /l/{id}"),
    (Route::Delete, "DELETE", Path::Pool, "DELETE /l/{id}"),
    (
        Route::Borrow,
        "POST",
        Path::Action("borrow"),
        "POST /l/{id}/borrow",
    ),
    (
        Route::Return,
        "POST",
        Path::Action("return"),
        "POST /l/{id}/return",
    ),
    (
        Route::Enqueue,
        "POST",
        Path::Action("enqueue"),
        "POST /l/{id}/enqueue",
    ),
    (
        Route::Ticket,
        "POST",
        Path::Action("ticket"),
        "POST /l/{id}/ticket",
    ),
    (
        Route::Cancel,
        "POST",
        Path::Action("cancel"),
        "POST /l/{id}/cancel",
    ),
];

impl Route {
    fn entry(self) -> &'static (Route, &'static str, Path, &'static str) {
        // Every variant is in the table (a unit test checks it).
        ROUTES
            .iter()
            .find(|(route, ..)| *route == self)
            .unwrap_or(&ROUTES[0])
    }

    pub fn method(self) -> &'static str {
        self.entry().1
    }

    pub fn key(self) -> &'static str {
        self.entry().3
    }

    fn path(self) -> Path {
        self.entry().2
    }
}

/// The methods of the routes on `path`, as an `Allow` header lists them.
fn allow(path: Path) -> String {
    let methods: Vec<&str> = ROUTES
        .iter()
        .filter(|(_, _, p, _)| *p == path)
        .map(|(_, method, ..)| *method)
        .collect();
    methods.join(", ")
}

/// A finished response: status, JSON body, and `Allow` for a 405.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Value,
    pub allow: Option<String>,
}

impl ApiResponse {
    pub fn ok(body: Value) -> Self {
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
        if let Some(allow) = self.allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
            headers.insert(ALLOW, allow);
        }
        response
    }
}

/// The only mapping from errors to responses: `Error` knows its status and
/// its message; this adds the JSON shape and `Allow`.
pub fn error_response(err: &Error) -> ApiResponse {
    ApiResponse {
        status: err.status(),
        body: wire::to_value(&wire::ErrorBody {
            error: err.to_string(),
        }),
        allow: match err {
            Error::MethodNotAllowed { allow } => Some(allow.clone()),
            _ => None,
        },
    }
}

/// Splits a path into its `l`, id and optional action segments, ignoring a
/// trailing slash and a query. `anchored`: the path starts with `/l/`;
/// otherwise anything may come before the last `/l/` (a stage prefix).
fn segments(path: &str, anchored: bool) -> Option<(&str, Option<&str>)> {
    let path = path.split('?').next().unwrap_or_default();
    let path = path.strip_suffix('/').unwrap_or(path);
    let parts: Vec<&str> = path.split('/').collect();
    let l = if anchored {
        (parts.first() == Some(&"") && parts.get(1) == Some(&"l")).then_some(1)?
    } else {
        parts
            .iter()
            .rposition(|p| *p == "l")
            .filter(|&i| i + 3 >= parts.len())?
    };
    match &parts[l + 1..] {
        [id] if !id.is_empty() => Some((id, None)),
        [id, action] if !id.is_empty() => Some((id, Some(action))),
        _ => None,
    }
}

/// Which path of the table `action` names.
fn path_of(action: Option<&str>) -> Option<Path> {
    match action {
        None => Some(Path::Pool),
        Some(action) => ROUTES.iter().find_map(|(_, _, path, _)| match path {
            Path::Action(a) if *a == action => Some(*path),
            _ => None,
        }),
    }
}

/// Matches a request against the table: the route for `method` on `path` and
/// the raw id segment, or 404 (no such path) / 405 (with the right methods).
pub fn resolve<'p>(method: &str, path: &'p str) -> Result<(Route, &'p str), Error> {
    let (id, action) = segments(path, true).ok_or(Error::RouteNotFound)?;
    let path = path_of(action).ok_or(Error::RouteNotFound)?;
    ROUTES
        .iter()
        .find(|(_, m, p, _)| *p == path && *m == method)
        .map(|(route, ..)| (*route, id))
        .ok_or_else(|| Error::MethodNotAllowed { allow: allow(path) })
}

/// Finds the id in a raw path for `route`, when no path parameter was given
/// (Function URL, `cargo lambda watch`, a stage prefix): the segment after the
/// last `/l/`, with the route's action after it.
pub fn id_from_path(route: Route, path: &str) -> Option<&str> {
    let (id, action) = segments(path, false)?;
    (path_of(action) == Some(route.path())).then_some(id)
}

/// A request parsed and validated: what a route was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Register { id: PoolId, count: u16 },
    Inspect { id: PoolId },
    Delete { id: PoolId },
    Borrow { id: PoolId, borrow: BorrowRequest },
    Return { id: PoolId, lease: LeaseId },
    Enqueue { id: PoolId, enqueue: EnqueueRequest },
    Ticket { id: PoolId, lease: LeaseId },
    Cancel { id: PoolId, lease: LeaseId },
}

impl Request {
    /// Parses the raw id segment and JSON body of a request on `route`. A
    /// borrow without a client-chosen lease id gets one here, so that the
    /// caller knows how to cancel its wait.
    pub fn parse(route: Route, raw_id: &str, raw_body: &[u8]) -> Result<Request, Error> {
        let id = parse_pool_id(raw_id)?;
        Ok(match route {
            Route::Register => Request::Register {
                id,
                count: body::<wire::RegisterBody>(raw_body)?.count,
            },
            Route::Inspect => Request::Inspect { id },
            Route::Delete => Request::Delete { id },
            Route::Borrow => Request::Borrow {
                id,
                borrow: borrow_request(body(raw_body)?),
            },
            Route::Return => Request::Return {
                id,
                lease: LeaseId(body::<wire::ReturnBody>(raw_body)?.lease),
            },
            Route::Enqueue => {
                let body = body::<wire::EnqueueBody>(raw_body)?;
                Request::Enqueue {
                    id,
                    enqueue: EnqueueRequest {
                        ttl_ms: body.ttl.as_millis(),
                        wait_ms: body.wait.map(Seconds::as_millis),
                        lease: LeaseId(body.lease),
                        callback: Callback {
                            url: body.callback.url,
                            token: body.callback.token,
                        },
                    },
                }
            }
            Route::Ticket => Request::Ticket {
                id,
                lease: LeaseId(body::<wire::ReturnBody>(raw_body)?.lease),
            },
            Route::Cancel => Request::Cancel {
                id,
                lease: LeaseId(body::<wire::ReturnBody>(raw_body)?.lease),
            },
        })
    }

    /// For a borrow that may wait: the return that gives its wait up.
    pub fn give_up(&self) -> Option<Request> {
        match self {
            Request::Borrow { id, borrow } if borrow.wait_ms > 0 => Some(Request::Return {
                id: *id,
                lease: borrow.lease,
            }),
            _ => None,
        }
    }
}

/// Runs one request on `route` for the raw id segment and JSON body. `call`
/// carries the Lambda deadline (a borrow never waits past it) and collects
/// what the request cost.
pub async fn handle(
    service: &Service,
    route: Route,
    raw_id: &str,
    body: &[u8],
    call: &mut Call,
) -> ApiResponse {
    respond(service, route, Request::parse(route, raw_id, body), call).await
}

/// Runs a parsed request (or answers its parse error), logging store errors.
pub async fn respond(
    service: &Service,
    route: Route,
    request: Result<Request, Error>,
    call: &mut Call,
) -> ApiResponse {
    let result = match request {
        Ok(request) => execute(service, request, call).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(response) => response,
        Err(err) => {
            if let Error::Store(store) = &err {
                if store.kind == StoreErrorKind::Corrupt {
                    tracing::error!(route = route.key(), error = %store, "stored pool cannot be read");
                } else {
                    tracing::warn!(route = route.key(), error = %store, "database call failed");
                }
            }
            error_response(&err)
        }
    }
}

async fn execute(
    service: &Service,
    request: Request,
    call: &mut Call,
) -> Result<ApiResponse, Error> {
    match request {
        Request::Register { id, count } => {
            let state = service.register(id, count, call).await?;
            Ok(ApiResponse::ok(state_body(id, state)))
        }
        Request::Inspect { id } => {
            let state = service.inspect(id, call).await?;
            Ok(ApiResponse::ok(state_body(id, state)))
        }
        Request::Delete { id } => {
            let deleted = service.delete(id, call).await?;
            Ok(ApiResponse::ok(wire::to_value(&wire::Deleted { deleted })))
        }
        Request::Borrow { id, borrow } => {
            let grant = service.borrow(id, borrow, call).await?;
            Ok(ApiResponse::ok(grant_body(&grant)))
        }
        Request::Return { id, lease } => {
            let returned = service.return_lease(id, lease, call).await?;
            Ok(ApiResponse::ok(wire::to_value(&wire::Returned {
                returned,
            })))
        }
        Request::Enqueue { id, enqueue } => {
            let enqueued = service.enqueue(id, enqueue, call).await?;
            Ok(ApiResponse {
                status: 202,
                body: wire::to_value(&wire::Enqueued {
                    ticket: enqueued.ticket,
                    ahead: enqueued.ahead,
                }),
                allow: None,
            })
        }
        Request::Ticket { id, lease } => {
            let report = service.ticket(id, lease, call).await?;
            Ok(ApiResponse::ok(ticket_body(&report)))
        }
        Request::Cancel { id, lease } => {
            let report = service.cancel(id, lease, call).await?;
            Ok(ApiResponse::ok(ticket_body(&report)))
        }
    }
}

/// A ticket's status: the grant once granted, the reason once failed.
pub fn ticket_body(report: &TicketReport) -> Value {
    let item = &report.item;
    let grant = item.state.grant();
    let now = now_ms();
    wire::to_value(&wire::TicketStatus {
        state: item.state.name().to_string(),
        ticket: item.number,
        ahead: report.ahead,
        position: grant.map(|g| g.position.into()),
        fence: grant.map(|g| g.fence),
        expires_at_unix: grant.map(|g| g.expires_at_ms / 1000),
        expires_in: grant.map(|g| Seconds::from_millis(g.expires_at_ms.saturating_sub(now))),
        reason: match &item.state {
            TicketState::Failed { reason } => Some(reason.clone()),
            TicketState::Expired => Some("not granted within its wait".into()),
            _ => None,
        },
    })
}

/// The log line of one request: never a whole UUID.
pub fn request_log<'a>(
    route_key: &'a str,
    raw_id: Option<&str>,
    response: &ApiResponse,
    started: Instant,
    call: &Call,
) -> RequestLog<'a> {
    RequestLog {
        route: route_key,
        pool: raw_id.and_then(|raw| parse_pool_id(raw).ok()),
        status: response.status,
        duration: started.elapsed(),
        stats: call.stats,
    }
}

pub fn parse_pool_id(raw: &str) -> Result<PoolId, Error> {
    Uuid::parse_str(raw)
        .map(PoolId)
        .map_err(|_| Error::BadRequest("pool id must be a UUID".into()))
}

/// A request body by the contract's input rules (the wire model's).
fn body<T: TryFrom<Map<String, Value>, Error = wire::Invalid>>(body: &[u8]) -> Result<T, Error> {
    wire::parse(body).map_err(|wire::Invalid(message)| Error::BadRequest(message))
}

/// A borrow as the service runs it. Without a client-chosen lease UUID it
/// gets a random one here, so that the caller knows how to cancel its wait.
fn borrow_request(body: wire::BorrowBody) -> BorrowRequest {
    BorrowRequest {
        ttl_ms: body.ttl.as_millis(),
        wait_ms: body.wait.as_millis(),
        lease: body.lease.map_or_else(LeaseId::new_random, LeaseId),
    }
}

fn state_body(id: PoolId, state: PoolState) -> Value {
    wire::to_value(&wire::PoolState {
        id: id.0,
        count: state.count.into(),
        in_use: state.in_use,
        available: state.available,
        waiting: Some(state.waiting),
    })
}

fn grant_body(grant: &Grant) -> Value {
    wire::to_value(&wire::Grant {
        lease: grant.lease.0,
        position: grant.position.into(),
        expires_at_unix: grant.expires_at_ms / 1000,
        expires_in: Seconds::from_millis(grant.expires_in_ms),
        fence: Some(grant.fence),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn is_bad<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
        matches!(r, Err(Error::BadRequest(_)))
    }

    #[test]
    fn every_route_is_in_the_table() {
        for route in [
            Route::Register,
            Route::Inspect,
            Route::Delete,
            Route::Borrow,
            Route::Return,
        ] {
            assert!(ROUTES.iter().any(|(r, ..)| *r == route), "{route:?}");
            let path = match route.path() {
                Path::Pool => "/l/x".to_string(),
                Path::Action(action) => format!("/l/x/{action}"),
            };
            assert_eq!(resolve(route.method(), &path), Ok((route, "x")));
            assert_eq!(id_from_path(route, &path), Some("x"));
        }
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
            resolve("DELETE", &format!("/l/{id}/")),
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
            "/prod/l/1",
            &format!("/l/{id}/renew"),
            &format!("/l/{id}/borrow/x"),
        ] {
            assert_eq!(resolve("GET", path), Err(Error::RouteNotFound), "{path}");
        }
        assert_eq!(
            resolve("POST", &format!("/l/{id}")),
            Err(Error::MethodNotAllowed {
                allow: "PUT, GET, DELETE".into()
            })
        );
        assert_eq!(
            resolve("GET", &format!("/l/{id}/borrow")),
            Err(Error::MethodNotAllowed {
                allow: "POST".into()
            })
        );
    }

    #[test]
    fn id_is_found_in_raw_paths() {
        assert_eq!(id_from_path(Route::Inspect, "/l/abc"), Some("abc"));
        assert_eq!(id_from_path(Route::Inspect, "/prod/l/abc/"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/borrow"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/return"), None);
        assert_eq!(id_from_path(Route::Return, "/l/abc"), None);
        assert_eq!(id_from_path(Route::Inspect, "/x/abc"), None);
        assert_eq!(id_from_path(Route::Inspect, "/l/abc/x/y"), None);
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
    fn bodies_follow_the_wire_rules() {
        let id = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";
        let parse = |route, body: &str| Request::parse(route, id, body.as_bytes());
        assert!(matches!(
            parse(Route::Register, r#"{"count":3}"#),
            Ok(Request::Register { count: 3, .. })
        ));
        assert_eq!(
            parse(Route::Register, r#"{"count":2.0}"#),
            Err(Error::BadRequest(
                "count must be an integer from 0 to 1000".into()
            ))
        );
        assert_eq!(
            parse(Route::Borrow, "[]"),
            Err(Error::BadRequest(
                "request body must be a JSON object".into()
            ))
        );
        assert!(is_bad(parse(Route::Return, r#"{"lease":1}"#)));
        assert!(is_bad(Request::parse(Route::Inspect, "x", b"")));
        // The body of a route that takes none is not read.
        assert!(matches!(
            parse(Route::Inspect, "not json"),
            Ok(Request::Inspect { .. })
        ));
        let Ok(Request::Borrow { borrow, .. }) = parse(Route::Borrow, r#"{"ttl":1.5,"wait":0.25}"#)
        else {
            panic!("a valid borrow")
        };
        assert_eq!((borrow.ttl_ms, borrow.wait_ms), (1500, 250));
        let Ok(Request::Borrow { borrow: other, .. }) = parse(Route::Borrow, r#"{"ttl":1.5}"#)
        else {
            panic!("a valid borrow")
        };
        assert_ne!(
            borrow.lease, other.lease,
            "a random lease id when none is sent"
        );
        let lease = "3A7D0B14-9E2C-4F6A-8B1D-0C5E2F9A7B34";
        let Ok(Request::Return {
            lease: returned, ..
        }) = parse(Route::Return, &format!(r#"{{"lease":"{lease}"}}"#))
        else {
            panic!("a valid return")
        };
        assert_eq!(
            returned.0.hyphenated().to_string(),
            lease.to_ascii_lowercase()
        );
    }

    #[test]
    fn every_error_is_json_with_the_contract_status() {
        use crate::store::StoreError;
        let store = |kind| Error::Store(StoreError::new(kind, "details stay in the log"));
        let cases = [
            (Error::BadRequest("x".into()), 400),
            (Error::PoolNotFound, 404),
            (Error::RouteNotFound, 404),
            (
                Error::MethodNotAllowed {
                    allow: "POST".into(),
                },
                405,
            ),
            (Error::Exhausted, 409),
            (Error::Contention, 502),
            (store(StoreErrorKind::Throttled), 502),
            (store(StoreErrorKind::TimedOut), 502),
            (store(StoreErrorKind::Unavailable), 502),
            (store(StoreErrorKind::Corrupt), 500),
        ];
        for (err, status) in cases {
            let response = error_response(&err);
            assert_eq!(response.status, status, "{err:?}");
            let message = response.body["error"].as_str().unwrap();
            assert!(!message.contains("details"), "{message}");
            assert_eq!(response.body.as_object().unwrap().len(), 1);
        }
        assert_eq!(
            error_response(&Error::Exhausted).body,
            json!({"error": "no resource available"})
        );
        assert!(error_response(&Error::Contention).body["error"]
            .as_str()
            .unwrap()
            .contains("contention"));
        let allow = error_response(&Error::MethodNotAllowed {
            allow: "POST".into(),
        });
        assert_eq!(allow.into_http().headers()[ALLOW], "POST");
    }

    #[test]
    fn grants_and_states_are_the_wire_model() {
        let lease = LeaseId::new_random();
        let grant = |expires_in_ms| Grant {
            lease,
            position: 2,
            expires_at_ms: 1_700_000_000_999,
            expires_in_ms,
            fence: 7,
        };
        assert_eq!(
            grant_body(&grant(1_500)),
            json!({"lease": lease.0.hyphenated().to_string(), "position": 2,
                   "expires_at_unix": 1_700_000_000u64, "expires_in": 1.5, "fence": 7})
        );
        assert_eq!(grant_body(&grant(30_000))["expires_in"], json!(30));
        let id = parse_pool_id("9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01").unwrap();
        let state = PoolState {
            count: 3,
            in_use: 1,
            available: 2,
            waiting: 0,
        };
        assert_eq!(
            state_body(id, state),
            json!({"id": "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01", "count": 3,
                   "in_use": 1, "available": 2, "waiting": 0})
        );
    }
}
