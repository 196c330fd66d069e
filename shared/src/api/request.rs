//! A request parsed by the wire model's rules (the pool id, the JSON body),
//! and run on the service: beside each other, the compiler-checked code of
//! every route.

use semaphore_wire::{self as wire, Seconds};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::response::{grant_body, state_body};
use super::{ticket_body, ApiResponse, Route};
use crate::domain::Callback;
use crate::error::Error;
use crate::keys::{LeaseId, PoolId};
use crate::service::{BorrowRequest, Budget, EnqueueRequest, Service};

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
    /// Parses the JSON body of a request on `route` for the pool `id` (parsed
    /// once, by [`parse_pool_id`]). A borrow without a client-chosen lease id
    /// gets one here, so that the caller knows how to cancel its wait.
    pub fn parse(route: Route, id: PoolId, raw_body: &[u8]) -> Result<Request, Error> {
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

    /// Runs the request on the service: its response, or the error to answer.
    pub(super) async fn run(
        self,
        service: &Service,
        call: &mut Budget,
    ) -> Result<ApiResponse, Error> {
        match self {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn is_bad<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
        matches!(r, Err(Error::BadRequest(_)))
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
        let id = parse_pool_id("9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01").unwrap();
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
        assert!(is_bad(parse_pool_id("x")));
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
}
