//! Client for the http-semaphore service (see `docs/API.md`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), semaphore_client::Error> {
//! use std::time::Duration;
//! use semaphore_client::{Borrow, Client, Uuid};
//!
//! let client = Client::new("http://127.0.0.1:3000")?;
//! let pool = client.pool(Uuid::parse_str("9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01").unwrap());
//! pool.register(2).await?;
//! // Hold a slot for at most 60 s; wait up to 5 minutes for one.
//! let ask = Borrow::ttl(Duration::from_secs(60)).wait(Duration::from_secs(300));
//! let lease = pool.borrow(ask).await?;
//! println!("slot {} (fence {:?})", lease.position(), lease.fence());
//! // ... the guarded work, passing lease.fence() to the protected resource,
//! // done before lease.deadline() ...
//! lease.release().await?;
//!
//! // Or scoped: the lease is returned (and awaited) however the body ends,
//! // a panic included.
//! let fence = pool
//!     .with_lease(ask, async |lease| {
//!         // ... the guarded work ...
//!         lease.fence()
//!     })
//!     .await?;
//! # let _ = fence;
//! # Ok(()) }
//! ```
//!
//! - **A [`Borrow`] names its durations.** `Borrow::ttl(…).wait(…)`: the
//!   lease's time to live and the time to wait for a slot cannot be swapped.
//! - **Waits of any length.** The server blocks a borrow for at most its own
//!   `MAX_WAIT_SECONDS` (25 s by default); [`Pool::borrow`] borrows again
//!   after each `409` until the caller's whole wait is spent, pausing a little
//!   (jittered) when a `409` came back much sooner than asked (a server that
//!   never blocks, or a pool with a full queue of waiters). Each new request
//!   joins the end of the pool's queue of waiters.
//! - **Retries that never strand a slot.** Connection errors, timeouts and
//!   `502`/`503`/`504`/`429` are retried with capped, jittered backoff
//!   ([`RetryPolicy`]). A borrow sends a lease UUID it chose once per
//!   [`Pool::borrow`] call (or the caller's, [`Borrow::lease_id`]), so a
//!   retry after a lost answer gets the slot the lost answer granted instead
//!   of a second one. `500` (a server bug) is not retried.
//! - **A borrow given up is given back.** Dropping a [`Pool::borrow`] future
//!   before it resolved (a timeout, the losing branch of `select!`) sends the
//!   return of its lease UUID in the background: that takes the waiting
//!   borrow out of the pool's queue, or returns the slot if one was granted
//!   meanwhile. So does a borrow that failed without knowing whether it was
//!   granted ([`Error::Unavailable`], [`Error::Unexpected`]).
//! - **A lease is a guard.** Dropping a [`Lease`] without
//!   [`release`](Lease::release) or [`detach`](Lease::detach) returns it in
//!   the background. Background returns (of a dropped lease or of a dropped
//!   borrow) are spawned on the tokio runtime current where the drop happens,
//!   retried at most 3 times within 5 s in all, and happen only if that
//!   runtime keeps running that long: **not** when the drop happens outside a
//!   runtime, nor when the runtime shuts down first (the end of
//!   `#[tokio::main]`, a dropped `Runtime`, a test's runtime), nor when the
//!   process exits first. In those cases the slot frees itself when its ttl
//!   ends. To know the slot is back, call `release().await`, or use
//!   [`Pool::with_lease`], which always awaits the return; to let the
//!   background returns finish before the runtime ends, await
//!   [`Client::settle`].
//! - **The lease's end by your clock.** The server may grant less than the
//!   ttl asked (it clamps it to its `MAX_TTL_SECONDS`; a slot handed over
//!   after a wait has already run a little). [`Lease::deadline`] is the
//!   answer's arrival plus the time the server said was left; stop using the
//!   slot a little before it.
//! - **Secrets stay out of logs.** Pool and lease UUIDs are bearer
//!   credentials: `Debug` output and error messages show only their first 8
//!   hex digits.
//!
//! The `semaphore` command-line tool is in this crate too, behind the `cli`
//! feature (off by default), so that the library alone does not compile the
//! tool's dependencies: `cargo install --path client --features cli`.

mod client;
mod error;
mod lease;
mod pool;

use std::time::Duration;

use semaphore_wire::Seconds;

pub use client::{Client, RetryPolicy};
pub use error::Error;
pub use lease::Lease;
pub use pool::{Borrow, Enqueue, Pool, Ticket};
/// The wire model's bodies, as the service answers them.
pub use semaphore_wire::{short, Grant, PoolState, TicketStatus, Uuid};

/// A duration for people: `5 s`, `0.25 s`, `90 s`.
pub fn format_seconds(duration: Duration) -> String {
    Seconds::from(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{is_retryable, Answer};

    #[test]
    fn base_urls_keep_their_stage() {
        let client = Client::new("https://example.com/prod").unwrap();
        let id = Uuid::nil();
        assert_eq!(
            client
                .url(&client.pool(id).path("/borrow"))
                .unwrap()
                .as_str(),
            "https://example.com/prod/l/00000000-0000-0000-0000-000000000000/borrow"
        );
        let client = Client::new("http://127.0.0.1:3000").unwrap();
        assert_eq!(
            client.url(&client.pool(id).path("")).unwrap().as_str(),
            "http://127.0.0.1:3000/l/00000000-0000-0000-0000-000000000000"
        );
        for bad in ["", "127.0.0.1:3000", "ftp://x", "mailto:a@b", "http://"] {
            assert!(
                matches!(Client::new(bad), Err(Error::InvalidUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations_read_as_seconds() {
        assert_eq!(format_seconds(Duration::from_millis(250)), "0.25 s");
        assert_eq!(format_seconds(Duration::from_secs(5)), "5 s");
    }

    #[test]
    fn answers_map_to_typed_errors() {
        let answer = |status, body: &str| Answer::new(status, body.as_bytes());
        assert_eq!(
            answer(400, r#"{"error":"ttl is required"}"#).error(),
            Error::BadRequest("ttl is required".into())
        );
        assert_eq!(
            answer(404, r#"{"error":"pool not found"}"#).error(),
            Error::PoolNotFound
        );
        // A route the service does not know, API Gateway's own 404, another server.
        assert_eq!(
            answer(404, r#"{"error":"not found"}"#).error(),
            Error::RouteNotFound("not found".into())
        );
        assert_eq!(
            answer(404, r#"{"message":"Not Found"}"#).error(),
            Error::RouteNotFound(r#"{"message":"Not Found"}"#.into())
        );
        assert_eq!(
            answer(404, "<html>\n<h1>Not Found</h1>\n</html>\n").error(),
            Error::RouteNotFound("<html> <h1>Not Found</h1> </html>".into())
        );
        assert_eq!(
            answer(500, r#"{"error":"bug"}"#).error(),
            Error::ServerBug("bug".into())
        );
        assert!(matches!(
            answer(405, "<html>").error(),
            Error::Unexpected(m) if m.contains("405") && m.contains("<html>")
        ));
        assert!(matches!(
            answer(200, r#"{"count":"x"}"#).success::<PoolState>(),
            Err(Error::Unexpected(_))
        ));
        assert!([429, 502, 503, 504].into_iter().all(is_retryable));
        assert!(![200, 400, 404, 409, 500].into_iter().any(is_retryable));
    }

    #[test]
    fn ids_are_shortened_for_logs() {
        let id: Uuid = "9F1C2E7A-5B3D-4C8E-A1F0-6D2B9C4E7A01".parse().unwrap();
        assert_eq!(short(&id), "9f1c2e7a");
        let pool = Client::new("http://x").unwrap().pool(id);
        let debug = format!("{pool:?}");
        assert!(
            debug.contains("9f1c2e7a") && !debug.contains("5b3d"),
            "{debug}"
        );
        let ask = Borrow::ttl(Duration::from_secs(1)).lease_id(id);
        let debug = format!("{ask:?}");
        assert!(
            debug.contains("9f1c2e7a") && !debug.contains("5b3d"),
            "{debug}"
        );
    }

    #[test]
    fn dropped_outside_a_runtime_nothing_is_sent_and_nothing_panics() {
        let pool = Client::new("http://127.0.0.1:9").unwrap().pool(Uuid::nil());
        pool.return_in_background(Uuid::new_v4());
        // A borrow future dropped before it was ever polled, outside a runtime.
        drop(pool.borrow(Borrow::ttl(Duration::from_secs(1))));
    }
}

/// The README's Rust example, compiled by `cargo test --doc` as written there
/// (a user pastes it as it is).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeExamples;
