//! `GET /health` (and `HEAD`): an answer for load balancers and smoke tests
//! that the server (or function) is up, without a pool or a database call,
//! so that it costs nothing and never fails for a reason outside it.

use crate::api::{self, ApiResponse};
use crate::error::Error;

/// Where it is served.
pub const PATH: &str = "/health";

/// The answer to `method` on `path` when `path` is `/health`, else `None`.
/// GET and HEAD: 200 `{"status": "ok"}`; any other method: 405.
pub fn respond(method: &str, path: &str) -> Option<ApiResponse> {
    Some(match read_only(method, path, PATH)? {
        Err(refused) => refused,
        Ok(()) => ApiResponse {
            status: 200,
            body: serde_json::json!({ "status": "ok" }),
            allow: None,
        },
    })
}

/// The API's own read-only paths (this one, `/openapi.json`): `None` when
/// `path` (its query aside) is not `at`; a 405 for a method but GET and HEAD.
pub(super) fn read_only(method: &str, path: &str, at: &str) -> Option<Result<(), ApiResponse>> {
    let path = path.split('?').next().unwrap_or_default();
    if path != at {
        return None;
    }
    if method != "GET" && method != "HEAD" {
        return Some(Err(api::error_response(&Error::MethodNotAllowed {
            allow: "GET, HEAD".into(),
        })));
    }
    Some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_on_get_and_head_only() {
        for method in ["GET", "HEAD"] {
            let ok = respond(method, "/health?probe=1").expect("served");
            assert_eq!(ok.status, 200);
            assert_eq!(ok.body, serde_json::json!({"status": "ok"}));
        }
        let wrong = respond("POST", "/health").expect("answered");
        assert_eq!(wrong.status, 405);
        assert_eq!(wrong.into_http().headers()["allow"], "GET, HEAD");
        assert!(respond("GET", "/l/health").is_none());
        assert!(respond("GET", "/healthz").is_none());
    }
}
