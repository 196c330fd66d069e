//! The one error type, with the one place that says what each error means to
//! a client: its status and its message. Details (a database's own error
//! text) go to the log, never into a response.

use std::fmt;

use crate::store::{StoreError, StoreErrorKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Malformed JSON, a bad id or lease, a field missing, mistyped or out of range.
    BadRequest(String),
    /// No pool exists for that id (never registered, or deleted).
    PoolNotFound,
    /// The pool has no ticket of that lease id (async mode).
    TicketNotFound,
    /// Borrow got no slot within `wait` (or no place to wait in).
    Exhausted,
    /// The pool's backlog holds `limit` tickets (`MAX_TICKETS`): no enqueue,
    /// and no borrower joins it, until admission takes some.
    BacklogFull { limit: u64 },
    /// The service's waiting budget (`WAITING_BUDGET`) is in use: a borrow
    /// that would wait is refused at once. Retryable.
    Busy { budget: u32 },
    /// No such route.
    RouteNotFound,
    /// A known path with the wrong method; `allow` lists the right ones.
    MethodNotAllowed { allow: String },
    /// Every write of this request lost to another writer of the pool until
    /// its time ran out. Nothing was written; retryable.
    Contention,
    /// A database call failed or timed out (retryable), or a stored pool
    /// cannot be read (a bug).
    Store(StoreError),
}

impl Error {
    /// The HTTP status API.md gives this error.
    pub fn status(&self) -> u16 {
        match self {
            Error::BadRequest(_) => 400,
            Error::PoolNotFound | Error::TicketNotFound | Error::RouteNotFound => 404,
            Error::MethodNotAllowed { .. } => 405,
            Error::Exhausted | Error::BacklogFull { .. } => 409,
            Error::Busy { .. } => 429,
            Error::Store(err) if err.kind == StoreErrorKind::Corrupt => 500,
            Error::Contention | Error::Store(_) => 502,
        }
    }
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        Error::Store(err)
    }
}

/// The client-facing message: the `error` of the JSON body.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Error::BacklogFull { limit } = self {
            return write!(
                f,
                "this pool already has {limit} tickets waiting, its limit (MAX_TICKETS); try again later"
            );
        }
        if let Error::Busy { budget } = self {
            return write!(
                f,
                "{budget} borrows already wait on this service, its limit (WAITING_BUDGET); retry with backoff"
            );
        }
        f.write_str(match self {
            Error::BacklogFull { .. } | Error::Busy { .. } => "",
            Error::BadRequest(reason) => reason,
            Error::PoolNotFound => "pool not found",
            Error::TicketNotFound => semaphore_wire::TICKET_NOT_FOUND,
            Error::Exhausted => "no resource available",
            Error::RouteNotFound => "not found",
            Error::MethodNotAllowed { .. } => "method not allowed",
            Error::Contention => "too much contention on this pool; retry with backoff",
            Error::Store(err) => match err.kind {
                StoreErrorKind::Corrupt => "a stored pool cannot be read (a server bug)",
                StoreErrorKind::Throttled => "database throttled the request; retry with backoff",
                StoreErrorKind::TimedOut => "database did not answer in time; retry with backoff",
                StoreErrorKind::Unavailable => "database call failed; retry with backoff",
            },
        })
    }
}

impl std::error::Error for Error {}
