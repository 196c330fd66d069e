//! What can go wrong, typed by what the caller should do about it.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// `404 {"error":"pool not found"}`: no pool with this id (never
    /// registered, or deleted).
    PoolNotFound,
    /// `404 {"error":"ticket not found"}`: the pool has no ticket of that
    /// lease UUID (async mode).
    TicketNotFound,
    /// Any other `404`: the URL leads to no route of the service (a wrong
    /// path or stage), or to another server. The start of its answer.
    RouteNotFound(String),
    /// `409` until the caller's whole wait (`waited`) was spent: no slot
    /// freed up.
    NoSlot { waited: Duration },
    /// `400` (or `413`): the server refused the request; its reason.
    BadRequest(String),
    /// Every attempt failed with a connection error, a timeout or a retryable
    /// status (`502`, `503`, `504`, `429`); `last` describes the last one.
    Unavailable { attempts: u32, last: String },
    /// `500`: the server found a stored pool it cannot read. A server bug;
    /// not retried, since retrying does not fix it.
    ServerBug(String),
    /// An answer the contract does not allow (wrong URL, another service).
    Unexpected(String),
    /// The base URL is not an `http` or `https` URL.
    InvalidUrl(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::PoolNotFound => f.write_str("pool not found"),
            Error::TicketNotFound => f.write_str("ticket not found"),
            Error::RouteNotFound(answer) => write!(
                f,
                "the service URL leads to no semaphore service (HTTP 404: {answer})"
            ),
            Error::NoSlot { waited } if waited.is_zero() => f.write_str("no slot free"),
            Error::NoSlot { waited } => write!(
                f,
                "no slot freed up within {}",
                crate::format_seconds(*waited)
            ),
            Error::BadRequest(reason) => write!(f, "request refused: {reason}"),
            Error::Unavailable { attempts, last } => write!(
                f,
                "service unavailable after {attempts} attempt{}: {last}",
                if *attempts == 1 { "" } else { "s" }
            ),
            Error::ServerBug(reason) => write!(f, "server error (a bug, not retried): {reason}"),
            Error::Unexpected(what) => write!(f, "unexpected answer: {what}"),
            Error::InvalidUrl(reason) => write!(f, "invalid service URL: {reason}"),
        }
    }
}

impl std::error::Error for Error {}
