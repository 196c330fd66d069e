//! Every response body of the API, and errors as a status and JSON (each
//! error's status and message come from `error.rs`).

use lambda_http::http::{
    self,
    header::{ALLOW, CONTENT_TYPE},
    HeaderValue, StatusCode,
};
use semaphore_wire::{self as wire, Seconds};
use serde_json::Value;

use crate::clock::now_ms;
use crate::domain::{PoolState, TicketState};
use crate::error::Error;
use crate::keys::PoolId;
use crate::service::{Grant, TicketReport};

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

    /// 413: a request body over local-api's limit (read only once routed).
    pub fn too_large() -> Self {
        ApiResponse {
            status: 413,
            body: serde_json::json!({ "error": "request body too large" }),
            allow: None,
        }
    }

    /// 408: a request (head or body) that did not arrive within local-api's
    /// read timeout; the connection is closed after it.
    pub fn request_timeout(after: std::time::Duration) -> Self {
        ApiResponse {
            status: 408,
            body: serde_json::json!({
                "error": format!(
                    "the request did not arrive within {} s; send it whole and retry",
                    after.as_secs_f64()
                )
            }),
            allow: None,
        }
    }

    /// 503: local-api has as many connections open as it allows.
    pub fn too_many_connections() -> Self {
        ApiResponse {
            status: 503,
            body: serde_json::json!({
                "error": "too many open connections; retry with backoff"
            }),
            allow: None,
        }
    }

    /// 400 / 414 / 431: a request local-api cannot parse as HTTP/1.1 (hyper
    /// would answer these with an empty body).
    pub fn unparsable(status: u16, why: &str) -> Self {
        ApiResponse {
            status,
            body: serde_json::json!({ "error": why }),
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

pub(super) fn state_body(id: PoolId, state: PoolState) -> Value {
    wire::to_value(&wire::PoolState {
        id: id.0,
        count: state.count.into(),
        in_use: state.in_use,
        available: state.available,
        waiting: Some(state.waiting),
    })
}

pub(super) fn grant_body(grant: &Grant) -> Value {
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
    use crate::api::parse_pool_id;
    use crate::keys::LeaseId;
    use crate::store::StoreErrorKind;
    use serde_json::json;

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
