//! The HTTP client: the service's base URL, requests with timeouts and
//! retries, and returns sent in the background when a lease is dropped.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, Url};
use semaphore_wire::{Backoff, ErrorBody, Jitter, POOL_NOT_FOUND, TICKET_NOT_FOUND};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::{Error, Pool, Uuid};

/// Longest `wait` asked of the server in one request. API Gateway ends every
/// request at 30 s, so a deployed server never blocks longer than this anyway.
pub(crate) const LONGEST_ASK: Duration = Duration::from_secs(28);
/// Time allowed for a request beyond the wait it asks for.
pub(crate) const REQUEST_SLACK: Duration = Duration::from_secs(10);
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before borrowing again after a `409` that came much sooner than asked.
pub(crate) const QUICK_409_PAUSE: Backoff = Backoff::new(
    Duration::from_millis(100),
    Duration::from_secs(2),
    Jitter::Equal,
);
/// A return sent in the background (a dropped lease or borrow) is retried
/// this way, and given up after [`BACKGROUND_DEADLINE`] in all: it must not
/// keep a runtime busy for long, and the slot frees itself at its ttl anyway.
pub(crate) const BACKGROUND_RETRY: RetryPolicy = RetryPolicy {
    retries: 3,
    base: Duration::from_millis(100),
    cap: Duration::from_secs(1),
};
pub(crate) const BACKGROUND_DEADLINE: Duration = Duration::from_secs(5);

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

    pub(crate) fn backoff(&self) -> Backoff {
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
    pub(crate) background: Arc<Background>,
}

/// Returns sent in the background that have not finished yet.
#[derive(Default)]
pub(crate) struct Background {
    pending: AtomicUsize,
    finished: Notify,
}

/// Counts one background return as finished when dropped: when it is done,
/// and also when a runtime shutting down drops it unfinished.
pub(crate) struct Pending(Arc<Background>);

impl Pending {
    pub(crate) fn new(background: &Arc<Background>) -> Pending {
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
        let parsed = Url::parse(base_url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && !url.cannot_be_a_base());
        let Some(mut base) = parsed else {
            // `127.0.0.1:3000` does not parse, `localhost:3000` parses with the
            // scheme `localhost`: both most likely lack `http://`.
            let hint = if base_url.contains("://") {
                String::new()
            } else {
                format!(" (did you mean http://{base_url}?)")
            };
            return Err(Error::InvalidUrl(format!(
                "{base_url:?} is not an http:// or https:// URL{hint}"
            )));
        };
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

    pub(crate) fn url(&self, path: &str) -> Result<Url, Error> {
        self.base
            .join(path)
            .map_err(|e| Error::InvalidUrl(e.to_string()))
    }

    /// Sends one request, retried per the policy on connection errors,
    /// timeouts and retryable statuses. `attempt` builds each attempt's body
    /// and timeout afresh (a borrow's remaining wait shrinks between them).
    pub(crate) async fn call(
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
pub(crate) fn is_retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// A transport error without its URL (the URL holds the pool's UUID), with
/// its causes, which say what actually failed (refused, reset, timed out).
pub(crate) fn describe(err: reqwest::Error) -> String {
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
    // rustls's words for a TLS handshake answered in plain HTTP; its error
    // type is not reachable through reqwest's.
    if text.contains("InvalidContentType") {
        text.push_str(
            " (the server does not speak TLS: if it is local-api, use http:// instead of https://)",
        );
    }
    text
}

/// A response: its status and body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    body: Vec<u8>,
    /// The server's `error`, when the body is the service's error answer.
    error: Option<String>,
}

impl Answer {
    pub(crate) fn new(status: u16, bytes: &[u8]) -> Answer {
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
    pub(crate) fn start(&self) -> String {
        let start = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]);
        start.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The server's `error`, or the start of the body.
    pub(crate) fn message(&self) -> String {
        self.error.clone().unwrap_or_else(|| self.start())
    }

    /// The error for a status that is not the route's success.
    pub(crate) fn error(&self) -> Error {
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
    pub(crate) fn success<T: DeserializeOwned>(self) -> Result<T, Error> {
        if !matches!(self.status, 200 | 202) {
            return Err(self.error());
        }
        serde_json::from_slice(&self.body)
            .map_err(|_| Error::Unexpected(format!("HTTP {}: {}", self.status, self.start())))
    }
}
