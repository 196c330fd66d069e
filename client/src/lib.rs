//! Client for the http-semaphore service (see `docs/API.md`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), semaphore_client::Error> {
//! use std::time::Duration;
//! use semaphore_client::Client;
//!
//! let client = Client::new("http://127.0.0.1:3000")?;
//! let pool = client.pool("9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01".parse().unwrap());
//! pool.register(2).await?;
//! // Hold a slot for at most 60 s; wait up to 5 minutes for one.
//! let lease = pool.borrow(Duration::from_secs(60), Duration::from_secs(300)).await?;
//! println!("slot {} (fence {:?})", lease.position(), lease.fence());
//! // ... the guarded work, passing lease.fence() to the protected resource ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! - **Waits of any length.** The server blocks a borrow for at most its own
//!   `MAX_WAIT_SECONDS` (25 s by default); [`Pool::borrow`] borrows again
//!   after each `409` until the caller's whole wait is spent, pausing a little
//!   (jittered) when a `409` came back much sooner than asked (a server that
//!   never blocks, or a pool with a full queue of waiters). Each new request
//!   joins the end of the pool's queue of waiters.
//! - **Retries that never strand a slot.** Connection errors, timeouts and
//!   `502`/`503`/`504`/`429` are retried with capped, jittered backoff
//!   ([`RetryPolicy`]). A borrow sends a lease UUID it chose once per
//!   [`Pool::borrow`] call, so a retry after a lost answer gets the slot the
//!   lost answer granted instead of a second one. `500` (a server bug) is not
//!   retried.
//! - **A lease is a guard.** Dropping a [`Lease`] without
//!   [`release`](Lease::release) returns it in the background on the current
//!   tokio runtime: best effort, since the runtime may shut down first (at the
//!   end of `main`, say) and the return is not retried. Call `release().await`
//!   to know the slot is back; in any case it frees itself when its `ttl` ends.
//! - **Secrets stay out of logs.** Pool and lease UUIDs are bearer
//!   credentials: `Debug` output and error messages show only their first 8
//!   hex digits.

mod error;
mod lease;

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, Url};
use serde_json::{json, Value};
use uuid::Uuid;

pub use error::Error;
pub use lease::{Grant, Lease};

/// Longest `wait` asked of the server in one request. API Gateway ends every
/// request at 30 s, so a deployed server never blocks longer than this anyway.
const LONGEST_ASK: Duration = Duration::from_secs(28);
/// Time allowed for a request beyond the wait it asks for.
const REQUEST_SLACK: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before borrowing again after a `409` that came much sooner than asked.
const QUICK_409_PAUSE: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_secs(2),
};

/// How failed requests are retried: up to `retries` more attempts, sleeping
/// `base` doubling per attempt up to `cap`, each sleep jittered between half
/// and all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub retries: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    /// 5 retries, 0.2 s doubling to 5 s: about 6 s of retrying in all.
    fn default() -> Self {
        RetryPolicy {
            retries: 5,
            base: Duration::from_millis(200),
            cap: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// The `step`th pause (from 0): `base · 2^step`, at most `cap`, then
    /// "equal jitter" (half fixed, half random) so that clients that failed
    /// together do not retry together, yet never retry at once.
    fn pause(self, step: u32) -> Duration {
        let full = self.base.saturating_mul(1 << step.min(20)).min(self.cap);
        full / 2 + full.mul_f64(fastrand::f64() / 2.0)
    }
}

/// A connection to one service. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    retry: RetryPolicy,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("retry", &self.retry)
            .finish()
    }
}

impl Client {
    /// A client for the service at `base_url`: `http://127.0.0.1:3000` for
    /// local-api, the stack's `ApiUrl` when deployed. A path in it (a stage)
    /// is kept: routes are resolved under it.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        let mut base =
            Url::parse(base_url).map_err(|e| Error::InvalidUrl(format!("{base_url:?}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(Error::InvalidUrl(format!(
                "{base_url:?}: must be an http:// or https:// URL"
            )));
        }
        // `…/prod` is the stage `prod`: without the slash, joining would drop it.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        base.set_query(None);
        base.set_fragment(None);
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| Error::InvalidUrl(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            retry: RetryPolicy::default(),
        })
    }

    /// The same client with another retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Client {
        self.retry = retry;
        self
    }

    /// The pool with this id. The id is the pool's credential: keep it secret.
    pub fn pool(&self, id: Uuid) -> Pool {
        Pool {
            client: self.clone(),
            id,
        }
    }

    fn url(&self, path: &str) -> Result<Url, Error> {
        self.base
            .join(path)
            .map_err(|e| Error::InvalidUrl(e.to_string()))
    }

    /// Sends one request, retried per the policy on connection errors,
    /// timeouts and retryable statuses. `attempt` builds each attempt's body
    /// and timeout afresh (a borrow's remaining wait shrinks between them).
    async fn call(
        &self,
        method: Method,
        url: &Url,
        mut attempt: impl FnMut() -> (Option<Value>, Duration),
    ) -> Result<Answer, Error> {
        let backoff = Backoff {
            base: self.retry.base,
            cap: self.retry.cap,
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (body, timeout) = attempt();
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .timeout(timeout);
            if let Some(body) = body {
                request = request
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.to_string());
            }
            let failure = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    match response.bytes().await {
                        Ok(bytes) => {
                            let answer = Answer::new(status, &bytes);
                            if !is_retryable(status) {
                                return Ok(answer);
                            }
                            format!("HTTP {status}: {}", answer.message())
                        }
                        Err(err) => describe(err),
                    }
                }
                Err(err) => describe(err),
            };
            if attempts > self.retry.retries {
                return Err(Error::Unavailable {
                    attempts,
                    last: failure,
                });
            }
            tokio::time::sleep(backoff.pause(attempts - 1)).await;
        }
    }
}

/// Statuses worth retrying: the service's `502`, and what API Gateway
/// answers by itself under load or on a timed-out integration. Not `500`.
fn is_retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// A transport error without its URL (the URL holds the pool's UUID), with
/// its causes, which say what actually failed (refused, reset, timed out).
fn describe(err: reqwest::Error) -> String {
    if err.is_timeout() {
        return "timed out".to_string();
    }
    let err = err.without_url();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A response: its status and JSON body (`Null` when it was not JSON).
struct Answer {
    status: u16,
    body: Value,
    raw: String,
}

impl Answer {
    fn new(status: u16, bytes: &[u8]) -> Answer {
        Answer {
            status,
            body: serde_json::from_slice(bytes).unwrap_or(Value::Null),
            raw: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
        }
    }

    /// The server's `error`, or the start of the body.
    fn message(&self) -> String {
        match self.body.get("error").and_then(Value::as_str) {
            Some(message) => message.to_string(),
            None => self.raw.clone(),
        }
    }

    /// The error for a status that is not the route's success.
    fn error(&self) -> Error {
        match self.status {
            400 | 413 => Error::BadRequest(self.message()),
            404 => Error::PoolNotFound,
            500 => Error::ServerBug(self.message()),
            status => Error::Unexpected(format!("HTTP {status}: {}", self.message())),
        }
    }

    /// A `200` parsed by `parse`, or the error the answer stands for.
    fn success<T>(self, parse: impl FnOnce(&Value) -> Option<T>) -> Result<T, Error> {
        if self.status != 200 {
            return Err(self.error());
        }
        parse(&self.body).ok_or_else(|| Error::Unexpected(format!("HTTP 200: {}", self.raw)))
    }
}

/// A pool's state, as `PUT` and `GET /l/{id}` answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub count: u32,
    pub in_use: u32,
    pub available: u32,
}

impl PoolState {
    fn parse(body: &Value) -> Option<PoolState> {
        let field = |name| {
            body.get(name)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        Some(PoolState {
            count: field("count")?,
            in_use: field("in_use")?,
            available: field("available")?,
        })
    }
}

/// One pool of the service, by its UUID.
#[derive(Clone)]
pub struct Pool {
    client: Client,
    id: Uuid,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("id", &self.short_id())
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The id's first 8 hex digits: enough to tell pools apart in a log,
    /// not enough to use one (the whole id is a credential).
    pub fn short_id(&self) -> String {
        short(self.id)
    }

    fn path(&self, action: &str) -> String {
        format!("l/{}{action}", self.id.hyphenated())
    }

    /// `PUT /l/{id}`: creates the pool with `count` slots (0 to 1000), or
    /// changes its count, keeping live leases.
    pub async fn register(&self, count: u16) -> Result<PoolState, Error> {
        let url = self.client.url(&self.path(""))?;
        self.client
            .call(Method::PUT, &url, || {
                (Some(json!({ "count": count })), REQUEST_SLACK)
            })
            .await?
            .success(PoolState::parse)
    }

    /// `GET /l/{id}`.
    pub async fn inspect(&self) -> Result<PoolState, Error> {
        let url = self.client.url(&self.path(""))?;
        self.client
            .call(Method::GET, &url, || (None, REQUEST_SLACK))
            .await?
            .success(PoolState::parse)
    }

    /// `DELETE /l/{id}`: whether a pool was removed. (After a retried
    /// request, `false` can also mean an earlier attempt removed it.)
    pub async fn delete(&self) -> Result<bool, Error> {
        let url = self.client.url(&self.path(""))?;
        self.client
            .call(Method::DELETE, &url, || (None, REQUEST_SLACK))
            .await?
            .success(|body| body.get("deleted")?.as_bool())
    }

    /// `POST /l/{id}/return`: whether a live lease was ended. (After a
    /// retried request, `false` can also mean an earlier attempt ended it.)
    pub async fn return_lease(&self, lease: Uuid) -> Result<bool, Error> {
        let url = self.client.url(&self.path("/return"))?;
        self.client
            .call(Method::POST, &url, || {
                (
                    Some(json!({ "lease": lease.hyphenated().to_string() })),
                    REQUEST_SLACK,
                )
            })
            .await?
            .success(|body| body.get("returned")?.as_bool())
    }

    /// Borrows a slot for `ttl`, waiting up to `wait` for one to free up, as
    /// long as the server's own maximum wait or not. The lease UUID is chosen
    /// here, once: every retry and re-borrow of this call asks for the same
    /// lease, so no slot is ever taken twice.
    pub async fn borrow(&self, ttl: Duration, wait: Duration) -> Result<Lease, Error> {
        self.borrow_as(Uuid::new_v4(), ttl, wait).await
    }

    /// [`borrow`](Pool::borrow) with a lease UUID of the caller's (not the
    /// nil UUID), so that a caller interrupted before the answer can still
    /// return whatever was granted.
    pub async fn borrow_as(
        &self,
        lease: Uuid,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let url = self.client.url(&self.path("/borrow"))?;
        let started = Instant::now();
        let deadline = started + wait;
        let mut quick_409s = 0;
        loop {
            let mut sent_at = Instant::now();
            let mut asked = Duration::ZERO;
            let answer = self
                .client
                .call(Method::POST, &url, || {
                    sent_at = Instant::now();
                    // A retry asks only for what is left of the caller's wait.
                    asked = deadline.saturating_duration_since(sent_at).min(LONGEST_ASK);
                    let body = json!({
                        "ttl": seconds(ttl.max(Duration::from_millis(1))),
                        "wait": seconds(asked),
                        "lease": lease.hyphenated().to_string(),
                    });
                    (Some(body), asked + REQUEST_SLACK)
                })
                .await?;
            if answer.status != 409 {
                let grant = answer.success(Grant::parse)?;
                return Ok(Lease::new(self.clone(), grant, sent_at));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::NoSlot { waited: wait });
            }
            // The server gave up well before the wait asked of it: it never
            // blocks, or the pool has as many waiters as it allows. Borrowing
            // again at once would only hammer it.
            if now - sent_at < asked.min(Duration::from_secs(1)) / 2 {
                let pause = QUICK_409_PAUSE.pause(quick_409s);
                quick_409s += 1;
                tokio::time::sleep_until((now + pause).min(deadline).into()).await;
            } else {
                quick_409s = 0;
            }
        }
    }
}

/// Seconds as a JSON number, kept to the millisecond like the server.
fn seconds(duration: Duration) -> Value {
    let ms = duration.as_millis().min(u128::from(u64::MAX)) as u64;
    if ms.is_multiple_of(1000) {
        json!(ms / 1000)
    } else {
        json!(ms as f64 / 1000.0)
    }
}

/// The first 8 hex digits of a UUID, for logs and status lines.
pub fn short(id: Uuid) -> String {
    id.simple().to_string()[..8].to_string()
}

/// A duration for people: `5 s`, `0.25 s`, `90 s`.
pub fn format_seconds(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        let text = format!("{:.3}", ms as f64 / 1000.0);
        format!("{} s", text.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn backoff_grows_to_its_cap_with_jitter() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        for step in 0..40 {
            let full =
                Duration::from_millis(100 * (1u64 << step.min(4))).min(Duration::from_secs(1));
            let pause = b.pause(step);
            assert!(pause >= full / 2 && pause <= full, "{step}: {pause:?}");
        }
    }

    #[test]
    fn seconds_keep_milliseconds() {
        assert_eq!(seconds(Duration::from_secs(30)), json!(30));
        assert_eq!(seconds(Duration::from_millis(1500)), json!(1.5));
        assert_eq!(seconds(Duration::from_micros(200)), json!(0));
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
        assert_eq!(answer(404, r#"{"error":"x"}"#).error(), Error::PoolNotFound);
        assert_eq!(
            answer(500, r#"{"error":"bug"}"#).error(),
            Error::ServerBug("bug".into())
        );
        assert!(matches!(
            answer(405, "<html>").error(),
            Error::Unexpected(m) if m.contains("405") && m.contains("<html>")
        ));
        assert!(matches!(
            answer(200, r#"{"count":"x"}"#).success(PoolState::parse),
            Err(Error::Unexpected(_))
        ));
        assert!([429, 502, 503, 504].into_iter().all(is_retryable));
        assert!(![200, 400, 404, 409, 500].into_iter().any(is_retryable));
    }

    #[test]
    fn ids_are_shortened_for_logs() {
        let id: Uuid = "9F1C2E7A-5B3D-4C8E-A1F0-6D2B9C4E7A01".parse().unwrap();
        assert_eq!(short(id), "9f1c2e7a");
        let pool = Client::new("http://x").unwrap().pool(id);
        let debug = format!("{pool:?}");
        assert!(
            debug.contains("9f1c2e7a") && !debug.contains("5b3d"),
            "{debug}"
        );
    }
}
