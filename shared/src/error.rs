//! The one error type. `api::error_response` is the only place that turns it
//! into a status code.

use std::fmt;

use crate::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Malformed JSON, a bad id or lease, a field missing, mistyped or out of range.
    BadRequest(String),
    /// No pool exists for that id (never registered, or deleted).
    PoolNotFound,
    /// Borrow got no slot within `wait`.
    Exhausted,
    /// No such route.
    RouteNotFound,
    /// A known path with the wrong method; `allow` lists the right ones.
    MethodNotAllowed { allow: &'static str },
    /// A database call failed; retryable.
    Store(StoreError),
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        Error::Store(err)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadRequest(reason) => f.write_str(reason),
            Error::PoolNotFound => f.write_str("pool not found"),
            Error::Exhausted => f.write_str("no resource available"),
            Error::RouteNotFound => f.write_str("no such route"),
            Error::MethodNotAllowed { .. } => f.write_str("method not allowed"),
            Error::Store(err) => write!(f, "database call failed: {err}"),
        }
    }
}

impl std::error::Error for Error {}
