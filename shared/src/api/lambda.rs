//! The Lambda entrypoint: an API Gateway HTTP API (or Function URL) event in,
//! one route's response out, and one EMF log line per request.

use std::convert::Infallible;
use std::future::ready;

use lambda_http::{Body, Request, RequestExt, Response};

use super::{serve, ApiResponse, Entry, Incoming, Route, TooLarge, MAX_BODY_BYTES};
use crate::clock::deadline_instant;
use crate::metrics::LogFormat;
use crate::service::Service;

/// Handles one request for `route`. The id comes from the `id` path parameter,
/// or from the raw path when there is none (Function URL, `cargo lambda watch`).
pub async fn handle(
    service: &Service,
    route: Route,
    request: Request,
) -> Result<Response<Body>, Infallible> {
    let path_param = request
        .path_parameters_ref()
        .and_then(|params| params.first("id"));
    let deadline = request
        .lambda_context_ref()
        .and_then(|c| deadline_instant(c.deadline));
    let incoming = Incoming {
        method: request.method().as_str(),
        path: request_path(&request),
        entry: Entry::Route(route, path_param),
        deadline,
        log: LogFormat::Json,
        give_up_with: None,
    };
    let body = ready(body_bytes(request.body()));
    Ok(into_response(serve(Some(service), incoming, body).await))
}

/// The HTTP API's `$default` route: whatever matched no route. API Gateway
/// would answer a bare `{"message":"Not Found"}`; the contract wants JSON
/// errors and a 405 for a known path with the wrong method.
pub async fn fallback(request: Request) -> Result<Response<Body>, Infallible> {
    // `GET /openapi.json` and `GET /health` have no route of their own in the
    // template: they land here.
    let head = request.method() == lambda_http::http::Method::HEAD;
    let incoming = Incoming {
        method: request.method().as_str(),
        path: request_path(&request),
        entry: Entry::Default,
        deadline: None,
        log: LogFormat::Json,
        give_up_with: None,
    };
    let body = ready(body_bytes(request.body()));
    let mut response = into_response(serve(None, incoming, body).await);
    if head {
        // A HEAD answer has GET's status and headers, and no body.
        *response.body_mut() = Body::Empty;
    }
    Ok(response)
}

/// The body, unless it is over [`MAX_BODY_BYTES`]: then a 413 without
/// reading it as JSON (the runtime has the event in memory already; a 128 MB
/// function need not hold a parsed copy of it too).
fn body_bytes(body: &Body) -> Result<&[u8], TooLarge> {
    let bytes: &[u8] = match body {
        Body::Empty => &[],
        Body::Text(text) => text.as_bytes(),
        Body::Binary(bytes) => bytes,
        _ => &[],
    };
    if bytes.len() > MAX_BODY_BYTES {
        return Err(TooLarge);
    }
    Ok(bytes)
}

fn into_response(response: ApiResponse) -> Response<Body> {
    response.into_http().map(Body::Text)
}

/// The request's path: API Gateway's raw path, or the URI's when absent.
fn request_path(request: &Request) -> &str {
    let raw = request.raw_http_path();
    if raw.is_empty() {
        request.uri().path()
    } else {
        raw
    }
}
