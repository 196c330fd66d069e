//! One pool through the client: borrow, return, inspect, register, delete,
//! and async mode's enqueue, ticket and cancel.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::{Duration, Instant};

use reqwest::Method;
use semaphore_wire::{
    to_json, BorrowBody, CallbackBody, Deleted, EnqueueBody, Enqueued, RegisterBody, ReturnBody,
    Returned, Seconds,
};
use serde::de::DeserializeOwned;

use crate::client::{
    Pending, BACKGROUND_DEADLINE, BACKGROUND_RETRY, LONGEST_ASK, QUICK_409_PAUSE, REQUEST_SLACK,
};
use crate::{short, Client, Error, Lease, PoolState, RetryPolicy, TicketStatus, Uuid};

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
    pub(crate) client: Client,
    pub(crate) id: Uuid,
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

    pub(crate) fn path(&self, action: &str) -> String {
        format!("l/{}{action}", self.id.hyphenated())
    }

    /// One request on the pool (`action` after its path) that a `200` with a
    /// `T` answers; no wait, so the usual time allowed.
    pub(crate) async fn request<T: DeserializeOwned>(
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

    pub(crate) async fn borrow_as(&self, lease: Uuid, ask: Borrow) -> Result<Lease, Error> {
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
    pub(crate) fn with_retry(&self, retry: RetryPolicy) -> Pool {
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
