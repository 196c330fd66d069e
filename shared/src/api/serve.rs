//! The one request path of every entrypoint (the Lambda functions, the
//! `$default` fallback, local-api): the route found, the body read, the pool
//! id parsed once, the request run, one log line. Each entrypoint's
//! differences are its [`Entry`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::{error_response, health, id_from_path, openapi, parse_pool_id, resolve};
use super::{ApiResponse, Request, Route};
use crate::error::Error;
use crate::keys::PoolId;
use crate::metrics::{LogFormat, RequestLog};
use crate::service::{Budget, Service};
use crate::store::StoreErrorKind;

/// How an entrypoint finds the route of a request.
pub enum Entry<'a> {
    /// A Lambda route function: its route, and API Gateway's `id` path parameter.
    Route(Route, Option<&'a str>),
    /// Every route by the table (local-api).
    Table,
    /// API Gateway's `$default` (the fallback function): what no route matched.
    Default,
}

/// A request as an entrypoint received it, before its body is read.
pub struct Incoming<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub entry: Entry<'a>,
    /// The Lambda invocation's deadline: a borrow never waits past it.
    pub deadline: Option<Instant>,
    /// How the request's log line is written.
    pub log: LogFormat,
    /// local-api: a borrow whose client hangs up gives its wait up through this (Lambda: None).
    pub give_up_with: Option<Arc<Service>>,
}

/// The largest request body any entrypoint reads: requests are a few dozen
/// bytes, anything this large is not ours (API Gateway passes up to 10 MB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The request body was over the entrypoint's limit: a 413.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge;

impl From<TooLarge> for ApiResponse {
    fn from(_: TooLarge) -> Self {
        ApiResponse::too_large()
    }
}

/// The request body did not arrive within local-api's read timeout: a 408.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyTimedOut(pub std::time::Duration);

impl From<BodyTimedOut> for ApiResponse {
    fn from(BodyTimedOut(after): BodyTimedOut) -> Self {
        ApiResponse::request_timeout(after)
    }
}

/// Where a request goes: its route and raw id segment, or why nowhere.
enum Target<'a> {
    Routed(Route, &'a str),
    /// Refused before its body is read; the raw id found all the same (for
    /// the log line).
    Refused(Error, Option<&'a str>),
}

/// Answers one request: `/openapi.json` and `/health` first (`Table` and `Default`, with no
/// log line), then its route, and one log line. `body` is awaited only once
/// the request is routed. Without a service (`$default`: no database) no
/// request is run: a routable one is a 404.
pub async fn serve<B: AsRef<[u8]>, E: Into<ApiResponse>>(
    service: Option<&Service>,
    incoming: Incoming<'_>,
    body: impl Future<Output = Result<B, E>>,
) -> ApiResponse {
    let Incoming {
        method,
        path,
        entry,
        deadline,
        log,
        give_up_with,
    } = incoming;
    // The API's own description and its health are served before routing
    // (no pool, no store).
    if !matches!(entry, Entry::Route(..)) {
        if let Some(response) =
            openapi::respond(method, path).or_else(|| health::respond(method, path))
        {
            return response;
        }
    }
    let started = Instant::now();
    let mut call = Budget::new(deadline);
    let (key, target) = target(method, path, entry);
    let (pool, response) = match (target, service) {
        (Target::Routed(route, raw_id), Some(service)) => {
            // The one parse of the id: the request and the log line use it.
            let id = parse_pool_id(raw_id);
            let pool = id.as_ref().ok().copied();
            let response = match body.await {
                Ok(body) => {
                    let parsed = id.and_then(|id| Request::parse(route, id, body.as_ref()));
                    run_parsed(service, route, parsed, give_up_with, &mut call).await
                }
                Err(unread) => unread.into(),
            };
            (pool, response)
        }
        (Target::Routed(_, raw_id), None) => (
            parse_pool_id(raw_id).ok(),
            error_response(&Error::RouteNotFound),
        ),
        (Target::Refused(err, raw_id), _) => (
            raw_id.and_then(|raw| parse_pool_id(raw).ok()),
            error_response(&err),
        ),
    };
    request_log(key, pool, &response, started, &call).emit(log);
    response
}

/// The request's log key and where it goes, by its entry.
fn target<'a>(method: &str, path: &'a str, entry: Entry<'a>) -> (&'static str, Target<'a>) {
    match entry {
        Entry::Route(route, param) => {
            let raw_id = param.or_else(|| id_from_path(route, path));
            let target = match raw_id {
                None => Target::Refused(Error::RouteNotFound, None),
                // The same 405 (and `Allow`) the local server gives for this path.
                Some(_) if method != route.method() => match resolve(method, path) {
                    Err(err) => Target::Refused(err, raw_id),
                    Ok(_) => Target::Refused(Error::RouteNotFound, raw_id),
                },
                Some(id) => Target::Routed(route, id),
            };
            (route.key(), target)
        }
        Entry::Table => match resolve(method, path) {
            Ok((route, id)) => (route.key(), Target::Routed(route, id)),
            Err(err) => ("$default", Target::Refused(err, None)),
        },
        Entry::Default => match resolve(method, path) {
            Err(err) => ("$default", Target::Refused(err, None)),
            // A routable request should never reach `$default`.
            Ok(_) => ("$default", Target::Refused(Error::RouteNotFound, None)),
        },
    }
}

/// Runs a parsed request; with `give_up_with`, a borrow dropped while it
/// waits gives its wait up.
async fn run_parsed(
    service: &Service,
    route: Route,
    parsed: Result<Request, Error>,
    give_up_with: Option<Arc<Service>>,
    call: &mut Budget,
) -> ApiResponse {
    // A client that hangs up while its borrow waits gives the
    // wait up: hyper drops this future, and the guard sends
    // the return of its lease id.
    let guard = give_up_with.map(|service| GiveUp {
        service,
        request: parsed.as_ref().ok().and_then(Request::give_up),
    });
    let response = respond(service, route, parsed, call).await;
    if let Some(guard) = guard {
        guard.disarm();
    }
    response
}

/// Runs one request on `route` for the raw id segment and JSON body. `call`
/// carries the Lambda deadline (a borrow never waits past it) and collects
/// what the request cost.
pub async fn handle(
    service: &Service,
    route: Route,
    raw_id: &str,
    body: &[u8],
    call: &mut Budget,
) -> ApiResponse {
    let request = parse_pool_id(raw_id).and_then(|id| Request::parse(route, id, body));
    respond(service, route, request, call).await
}

/// Runs a parsed request (or answers its parse error), logging store errors.
pub async fn respond(
    service: &Service,
    route: Route,
    request: Result<Request, Error>,
    call: &mut Budget,
) -> ApiResponse {
    let result = match request {
        Ok(request) => request.run(service, call).await,
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

/// The log line of one request: never a whole UUID.
fn request_log<'a>(
    route_key: &'a str,
    pool: Option<PoolId>,
    response: &ApiResponse,
    started: Instant,
    call: &Budget,
) -> RequestLog<'a> {
    RequestLog {
        route: route_key,
        pool,
        status: response.status,
        duration: started.elapsed(),
        stats: call.stats,
    }
}

/// Gives a waiting borrow up if it is dropped before it answers (its client
/// disconnected): the return of its lease id takes its ticket out of the
/// queue, or returns the slot handed to it meanwhile, in the background.
struct GiveUp {
    service: Arc<Service>,
    request: Option<Request>,
}

impl GiveUp {
    fn disarm(mut self) {
        self.request = None;
    }
}

impl Drop for GiveUp {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let service = self.service.clone();
        // Dropped inside the runtime (hyper drops the request future there).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut call = Budget::new(None);
                let response = respond(&service, Route::Return, Ok(request), &mut call).await;
                tracing::info!(
                    status = response.status,
                    "client hung up while its borrow waited: the wait was given up"
                );
            });
        }
    }
}
