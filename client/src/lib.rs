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

mod error;
mod lease;

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, Url};
use semaphore_wire::{
    to_json, Backoff, BorrowBody, CallbackBody, Deleted, EnqueueBody, Enqueued, ErrorBody, Jitter,
    RegisterBody, ReturnBody, Returned, Seconds, POOL_NOT_FOUND, TICKET_NOT_FOUND,
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

pub use error::Error;
pub use lease::Lease;
/// The wire model's bodies, as the service answers them.
pub use semaphore_wire::{short, Grant, PoolState, TicketStatus, Uuid};

/// Longest `wait` asked of the server in one request. API Gateway ends every
/// request at 30 s, so a deployed server never blocks longer than this anyway.
const LONGEST_ASK: Duration = Duration::from_secs(28);
/// Time allowed for a request beyond the wait it asks for.
const REQUEST_SLACK: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before borrowing again after a `409` that came much sooner than asked.
const QUICK_409_PAUSE: Backoff = Backoff::new(
    Duration::from_millis(100),
    Duration::from_secs(2),
    Jitter::Equal,
);
/// A return sent in the background (a dropped lease or borrow) is retried
/// this way, and given up after [`BACKGROUND_DEADLINE`] in all: it must not
/// keep a runtime busy for long, and the slot frees itself at its ttl anyway.
const BACKGROUND_RETRY: RetryPolicy = RetryPolicy {
    retries: 3,
    base: Duration::from_millis(100),
    cap: Duration::from_secs(1),
};
const BACKGROUND_DEADLINE: Duration = Duration::from_secs(5);

/// How failed requests are retried: up to `retries` more attempts, sleeping
/// `base` doubling per attempt up to `cap`, each sleep jittered between half
/// and all of it (the wire crate's [`Backoff`] with equal jitter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

impl RetryPolicy {
    /// `retries` more attempts, sleeping `base` doubling up to `cap` between them.
    pub fn new(retries: u32, base: Duration, cap: Duration) -> RetryPolicy {
        RetryPolicy { retries, base, cap }
    }

    /// The same policy with another number of retries (0: one attempt).
    pub fn with_retries(mut self, retries: u32) -> RetryPolicy {
        self.retries = retries;
        self
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(self.base, self.cap, Jitter::Equal)
    }
}

/// A connection to one service. Cheap to clone (the connection pool, and
/// the count of returns sent in the background, are shared).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    retry: RetryPolicy,
    background: Arc<Background>,
}

/// Returns sent in the background that have not finished yet.
#[derive(Default)]
struct Background {
    pending: AtomicUsize,
    finished: Notify,
}

/// Counts one background return as finished when dropped: when it is done,
/// and also when a runtime shutting down drops it unfinished.
struct Pending(Arc<Background>);

impl Pending {
    fn new(background: &Arc<Background>) -> Pending {
        background.pending.fetch_add(1, Ordering::SeqCst);
        Pending(background.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::SeqCst);
        self.0.finished.notify_waiters();
    }
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
            background: Arc::default(),
        })
    }

    /// Waits until the returns this client (or a clone of it) sent in the
    /// background have finished: those of dropped leases and of dropped or
    /// failed borrows. Each gives up within 5 s. Await it before the runtime
    /// ends (at the end of `main`) so that none is cut off.
    pub async fn settle(&self) {
        loop {
            let mut finished = std::pin::pin!(self.background.finished.notified());
            // Registered before the check, so a return finishing in between
            // still wakes us.
            finished.as_mut().enable();
            if self.background.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            finished.await;
        }
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
        mut attempt: impl FnMut() -> (Option<String>, Duration),
    ) -> Result<Answer, Error> {
        let backoff = self.retry.backoff();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (body, timeout) = attempt();
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .timeout(timeout);
            if let Some(body) = body {
                request = request.header(CONTENT_TYPE, "application/json").body(body);
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

/// A response: its status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
    /// The server's `error`, when the body is the service's error answer.
    error: Option<String>,
}

impl Answer {
    fn new(status: u16, bytes: &[u8]) -> Answer {
        Answer {
            status,
            body: bytes.to_vec(),
            error: serde_json::from_slice::<ErrorBody>(bytes)
                .ok()
                .map(|body| body.error),
        }
    }

    /// The start of the body, on one line: an HTML page quoted in an error
    /// stays readable.
    fn start(&self) -> String {
        let start = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]);
        start.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The server's `error`, or the start of the body.
    fn message(&self) -> String {
        self.error.clone().unwrap_or_else(|| self.start())
    }

    /// The error for a status that is not the route's success.
    fn error(&self) -> Error {
        match self.status {
            400 | 413 => Error::BadRequest(self.message()),
            // Only the service's own answer means the pool is missing: a
            // route it does not know answers `not found`, and another server
            // (a wrong URL) anything at all.
            404 if self.error.as_deref() == Some(POOL_NOT_FOUND) => Error::PoolNotFound,
            404 if self.error.as_deref() == Some(TICKET_NOT_FOUND) => Error::TicketNotFound,
            404 => Error::RouteNotFound(self.message()),
            500 => Error::ServerBug(self.message()),
            status => Error::Unexpected(format!("HTTP {status}: {}", self.message())),
        }
    }

    /// A `200`'s (an enqueue's `202`) body as `T`, or the error the answer
    /// stands for.
    fn success<T: DeserializeOwned>(self) -> Result<T, Error> {
        if !matches!(self.status, 200 | 202) {
            return Err(self.error());
        }
        serde_json::from_slice(&self.body)
            .map_err(|_| Error::Unexpected(format!("HTTP {}: {}", self.status, self.start())))
    }
}

/// What to borrow: a lease that lives `ttl`, waiting up to `wait` for a
/// slot. Each duration is named where it is set, so they cannot be swapped:
///
/// ```
/// # use std::time::Duration;
/// # use semaphore_client::Borrow;
/// let ask = Borrow::ttl(Duration::from_secs(60)).wait(Duration::from_secs(300));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[must_use = "a Borrow does nothing until passed to Pool::borrow"]
pub struct Borrow {
    ttl: Duration,
    wait: Duration,
    lease: Option<Uuid>,
}

impl fmt::Debug for Borrow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Borrow")
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("lease", &self.lease.as_ref().map(short))
            .finish()
    }
}

impl Borrow {
    /// A lease that lives `ttl` (the server clamps it to its
    /// `MAX_TTL_SECONDS`; kept to the millisecond, at least 1 ms), without
    /// waiting: a full pool answers [`Error::NoSlot`] at once.
    pub fn ttl(ttl: Duration) -> Borrow {
        Borrow {
            ttl,
            wait: Duration::ZERO,
            lease: None,
        }
    }

    /// Waits up to `wait` for a slot, however long the server's own maximum
    /// wait: the client borrows again until the whole wait is spent.
    pub fn wait(mut self, wait: Duration) -> Borrow {
        self.wait = wait;
        self
    }

    /// Asks for this lease UUID (not the nil UUID) instead of a fresh random
    /// one per [`Pool::borrow`] call: a caller that may be stopped before the
    /// answer arrives can return whatever was granted by this UUID. Use a
    /// UUID for one borrow only; the same UUID again gets the same grant
    /// while it lives.
    pub fn lease_id(mut self, lease: Uuid) -> Borrow {
        self.lease = Some(lease);
        self
    }
}

/// An async ticket to queue (async mode): a lease of `ttl` from its grant,
/// POSTed to `url` with `Authorization: Bearer <token>` when granted.
///
/// ```
/// # use std::time::Duration;
/// # use semaphore_client::Enqueue;
/// let ask = Enqueue::new(Duration::from_secs(60), "https://example.com/granted", "s3cr3t")
///     .wait(Duration::from_secs(7200));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "an Enqueue does nothing until passed to Pool::enqueue"]
pub struct Enqueue {
    ttl: Duration,
    wait: Option<Duration>,
    lease: Option<Uuid>,
    url: String,
    token: String,
}

impl fmt::Debug for Enqueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL and token may be the receiver's secrets.
        f.debug_struct("Enqueue")
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("lease", &self.lease.as_ref().map(short))
            .finish_non_exhaustive()
    }
}

impl Enqueue {
    pub fn new(ttl: Duration, url: impl Into<String>, token: impl Into<String>) -> Enqueue {
        Enqueue {
            ttl,
            wait: None,
            lease: None,
            url: url.into(),
            token: token.into(),
        }
    }

    /// How long the ticket may wait for its grant (the server's maximum,
    /// a day by default, when not set).
    pub fn wait(mut self, wait: Duration) -> Enqueue {
        self.wait = Some(wait);
        self
    }

    /// The lease UUID (not the nil UUID) instead of a fresh random one: the
    /// ticket's key, so the same UUID again is the same ticket.
    pub fn lease_id(mut self, lease: Uuid) -> Enqueue {
        self.lease = Some(lease);
        self
    }
}

/// A queued ticket: the lease UUID its grant will carry (return it with
/// [`Pool::return_lease`] when done), its number, and how many tickets wait
/// before it (at most).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub lease: Uuid,
    pub ticket: u64,
    pub ahead: u64,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("lease", &short(&self.lease))
            .field("ticket", &self.ticket)
            .field("ahead", &self.ahead)
            .finish()
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
        short(&self.id)
    }

    fn path(&self, action: &str) -> String {
        format!("l/{}{action}", self.id.hyphenated())
    }

    /// One request on the pool (`action` after its path) that a `200` with a
    /// `T` answers; no wait, so the usual time allowed.
    async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        action: &str,
        body: Option<String>,
    ) -> Result<T, Error> {
        let url = self.client.url(&self.path(action))?;
        self.client
            .call(method, &url, || (body.clone(), REQUEST_SLACK))
            .await?
            .success()
    }

    /// `PUT /l/{id}`: creates the pool with `count` slots (0 to 1000), or
    /// changes its count, keeping live leases.
    pub async fn register(&self, count: u16) -> Result<PoolState, Error> {
        let count = to_json(&RegisterBody { count });
        self.request(Method::PUT, "", Some(count)).await
    }

    /// `GET /l/{id}`.
    pub async fn inspect(&self) -> Result<PoolState, Error> {
        self.request(Method::GET, "", None).await
    }

    /// `DELETE /l/{id}`: whether a pool was removed. (After a retried
    /// request, `false` can also mean an earlier attempt removed it.)
    pub async fn delete(&self) -> Result<bool, Error> {
        let answer: Deleted = self.request(Method::DELETE, "", None).await?;
        Ok(answer.deleted)
    }

    /// `POST /l/{id}/return`: whether a live lease was ended. (After a
    /// retried request, `false` can also mean an earlier attempt ended it.)
    ///
    /// The UUID of a borrow that still waits takes that borrow out of the
    /// queue (its request then answers `409`; this answers `false`, as
    /// nothing was held), so this also gives up a borrow made with
    /// [`Borrow::lease_id`] from elsewhere.
    pub async fn return_lease(&self, lease: Uuid) -> Result<bool, Error> {
        let lease = to_json(&ReturnBody { lease });
        let answer: Returned = self.request(Method::POST, "/return", Some(lease)).await?;
        Ok(answer.returned)
    }

    /// `POST /l/{id}/enqueue` (async mode): a place in the pool's line; the
    /// grant is POSTed to the callback. Retried with the same lease UUID, so
    /// a retry never queues a second ticket.
    pub async fn enqueue(&self, ask: Enqueue) -> Result<Ticket, Error> {
        let lease = ask.lease.unwrap_or_else(Uuid::new_v4);
        let body = to_json(&EnqueueBody {
            ttl: Seconds::from_duration(ask.ttl),
            wait: ask.wait.map(Seconds::from_duration),
            lease,
            callback: CallbackBody {
                url: ask.url,
                token: ask.token,
            },
        });
        let queued: Enqueued = self.request(Method::POST, "/enqueue", Some(body)).await?;
        Ok(Ticket {
            lease,
            ticket: queued.ticket,
            ahead: queued.ahead,
        })
    }

    /// `POST /l/{id}/ticket`: the state of the ticket of `lease`.
    pub async fn ticket(&self, lease: Uuid) -> Result<TicketStatus, Error> {
        let lease = to_json(&ReturnBody { lease });
        self.request(Method::POST, "/ticket", Some(lease)).await
    }

    /// `POST /l/{id}/cancel`: ends the ticket of `lease` if it still waits
    /// (idempotent); its state after.
    pub async fn cancel(&self, lease: Uuid) -> Result<TicketStatus, Error> {
        let lease = to_json(&ReturnBody { lease });
        self.request(Method::POST, "/cancel", Some(lease)).await
    }

    /// Borrows a slot as `ask` says: for its ttl, waiting up to its wait for
    /// one to free up, as long as the server's own maximum wait or not. The
    /// lease UUID is chosen once per call (or is the one `ask` names): every
    /// retry and re-borrow of this call asks for the same lease, so no slot
    /// is ever taken twice.
    ///
    /// Dropping the future before it resolves gives the borrow up: the return
    /// of its lease UUID is sent in the background (see the crate docs for
    /// when that runs), which takes it out of the pool's queue, or returns
    /// the slot if the server granted one meanwhile. So does a borrow that
    /// ends in [`Error::Unavailable`] or [`Error::Unexpected`], since it
    /// cannot know whether a slot was granted.
    pub async fn borrow(&self, ask: Borrow) -> Result<Lease, Error> {
        let lease = ask.lease.unwrap_or_else(Uuid::new_v4);
        let mut give_up = GiveUp {
            pool: self,
            lease,
            armed: true,
        };
        let outcome = self.borrow_as(lease, ask).await;
        // Disarmed once the outcome is known: a lease (a guard itself), or an
        // answer that says no slot was taken.
        give_up.armed = matches!(
            outcome,
            Err(Error::Unavailable { .. }) | Err(Error::Unexpected(_))
        );
        outcome
    }

    async fn borrow_as(&self, lease: Uuid, ask: Borrow) -> Result<Lease, Error> {
        let url = self.client.url(&self.path("/borrow"))?;
        let ttl = ask.ttl.max(Duration::from_millis(1));
        let started = Instant::now();
        let deadline = started + ask.wait;
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
                    let ask = BorrowBody {
                        ttl: Seconds::from(ttl),
                        wait: Seconds::from(asked),
                        lease: Some(lease),
                    };
                    (Some(to_json(&ask)), asked + REQUEST_SLACK)
                })
                .await?;
            let received = Instant::now();
            if answer.status != 409 {
                let grant = answer.success()?;
                return Ok(Lease::new(self.clone(), grant, ttl, started, received));
            }
            if received >= deadline {
                return Err(Error::NoSlot { waited: ask.wait });
            }
            // The server gave up well before the wait asked of it: it never
            // blocks, or the pool has as many waiters as it allows. Borrowing
            // again at once would only hammer it.
            if received - sent_at < asked.min(Duration::from_secs(1)) / 2 {
                let pause = QUICK_409_PAUSE.pause(quick_409s);
                quick_409s += 1;
                tokio::time::sleep_until((received + pause).min(deadline).into()).await;
            } else {
                quick_409s = 0;
            }
        }
    }

    /// Borrows as `ask` says, runs `body` with the lease, and returns the
    /// lease however `body` ends, awaiting the return before this resolves
    /// (unlike dropping a [`Lease`]). A panic in `body` is resumed after the
    /// return. The answer is `body`'s; an error only when the borrow failed.
    /// A failed return is not an error: the slot then frees itself at its
    /// ttl, and `body`'s result is kept.
    ///
    /// If this future is itself dropped while `body` runs, the lease is
    /// returned in the background, as a dropped [`Lease`] is.
    ///
    /// ```no_run
    /// # async fn demo(pool: semaphore_client::Pool) -> Result<(), semaphore_client::Error> {
    /// # use std::time::Duration;
    /// use semaphore_client::Borrow;
    /// let ask = Borrow::ttl(Duration::from_secs(30)).wait(Duration::from_secs(60));
    /// let fence = pool.with_lease(ask, async |lease| lease.fence()).await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    pub async fn with_lease<T>(
        &self,
        ask: Borrow,
        body: impl AsyncFnOnce(&Lease) -> T,
    ) -> Result<T, Error> {
        let lease = self.borrow(ask).await?;
        let outcome = {
            let mut running = std::pin::pin!(body(&lease));
            std::future::poll_fn(|cx| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| running.as_mut().poll(cx))) {
                    Ok(Poll::Pending) => Poll::Pending,
                    Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
                    Err(panic) => Poll::Ready(Err(panic)),
                }
            })
            .await
        };
        let _ = lease.release().await;
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// The same pool through a client with another retry policy.
    fn with_retry(&self, retry: RetryPolicy) -> Pool {
        Pool {
            client: self.client.clone().with_retry(retry),
            id: self.id,
        }
    }

    /// Sends the return of `lease` on the current tokio runtime without
    /// waiting for it: a few retries, bounded in time. Without a runtime
    /// there is nothing to run it on; the lease then ends at its ttl.
    pub(crate) fn return_in_background(&self, lease: Uuid) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.with_retry(BACKGROUND_RETRY);
        let pending = Pending::new(&pool.client.background);
        // A runtime shutting down drops the task at once; no panic.
        runtime.spawn(async move {
            let _pending = pending;
            let _ = tokio::time::timeout(BACKGROUND_DEADLINE, pool.return_lease(lease)).await;
        });
    }
}

/// Gives a borrow up when its future is dropped before its outcome is known.
struct GiveUp<'p> {
    pool: &'p Pool,
    lease: Uuid,
    armed: bool,
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pool.return_in_background(self.lease);
        }
    }
}

/// A duration for people: `5 s`, `0.25 s`, `90 s`.
pub fn format_seconds(duration: Duration) -> String {
    Seconds::from(duration).to_string()
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
