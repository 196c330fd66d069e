//! HTTP in one place: the route table, input validation and the error →
//! status/JSON mapping, shared by every Lambda function and the local server.
//!
//! The route table ([`Route`]) lists every route once (method, path, log key);
//! [`Request`] parses and runs each one; [`serve`] is the one request path
//! of every entrypoint ([`lambda`], local-api).

pub mod health;
pub mod lambda;
pub mod openapi;
mod request;
mod response;
mod routes;
mod serve;

pub use request::{parse_pool_id, Request};
pub use response::{error_response, ticket_body, ApiResponse};
#[cfg(test)]
pub(crate) use routes::every_route;
pub use routes::{id_from_path, resolve, Route};
pub use serve::{handle, respond, serve, BodyTimedOut, Entry, Incoming, TooLarge, MAX_BODY_BYTES};
