//! The operations of the API: read → decide (domain) → conditional write,
//! decided again from the record a lost write hands back.
//!
//! Every store call is bounded by the time the request has left, so every
//! answer — a 502 included — comes before anyone else's deadline. A write
//! whose outcome is unknown (an error after it may have landed) is never
//! taken as failed: the service reads again and recognises its own lease,
//! ticket, return or pool, so no slot is stranded by an answer nobody got.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::callback::CallbackPolicy;
use crate::clock::{now_ms, now_us};
use crate::domain::TICKET_GRACE_MS;
use crate::domain::{BorrowPlan, Holder, Lease, Pool, PoolState, ReturnPlan, Update, WaitPlan};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::store::{Created, PoolStore, Record, StoreError, StoreErrorKind, TicketStore, Updated};
use semaphore_wire::{self as wire, Backoff, Jitter};

mod line;

pub use line::{EnqueueRequest, Enqueued, Step, TicketReport, ToDeliver, ASYNC_WINDOW};

/// Bounds applied to requests (API.md: `ttl` and `wait` are clamped, never
/// rejected), and the most borrowers that may wait on one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_ttl_ms: u64,
    pub max_wait_ms: u64,
    pub max_waiters: usize,
    /// Longest `wait` of an async ticket (enqueue).
    pub max_async_wait_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_async_wait_ms: 24 * 3_600_000,
            max_ttl_ms: 3_600_000,
            // API Gateway's HTTP API cuts every request at 30 s.
            max_wait_ms: 25_000,
            // 100 tickets of about 20 bytes keep a pool item within a few write units.
            max_waiters: 100,
        }
    }
}

/// How waiters poll, how lost races and failed calls are retried, and how
/// much time every request keeps in hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Waiters read in rounds: those the next `count` freed slots would
    /// serve (at most 4 wide) every `poll`, the next round every `2 · poll`,
    /// then `4 · poll`, … up to `poll_cap`: the head sees a hand-off within
    /// about `poll`, and a long queue's reads grow with the log of its
    /// length. Sooner (never below `poll_min`) when grants come fast enough
    /// that a waiter's turn may come before then. Jittered to ¾–1×.
    /// Expiries are slept to exactly.
    pub poll: Duration,
    pub poll_min: Duration,
    pub poll_cap: Duration,
    /// After a failed store call (full jitter: these requests contend with
    /// each other, and none needs a least pause).
    pub retry: Backoff,
    /// After the third lost write in a row, the same kind of nap (a lost
    /// write is otherwise retried at once with the record it handed back).
    pub conflict: Backoff,
    /// Longest one store call may take (the SDK also has its own timeouts).
    pub call_timeout: Duration,
    /// Time kept back from the Lambda deadline to send the response.
    pub deadline_margin: Duration,
    /// Without a Lambda deadline (local server): how long past its `wait` a
    /// request may take to answer.
    pub local_budget: Duration,
    /// Kept back from the answer-by time when a waiter stops waiting, to
    /// cancel its ticket (or find it granted) before answering.
    pub cancel_reserve: Duration,
}

impl Timing {
    /// A waiter's read interval by its place alone: `ahead` live tickets
    /// before it on a pool of `count`. Rounds of up to `count` places (at
    /// most 4), each twice as far apart as the one before.
    fn by_place(&self, ahead: usize, count: u16) -> Duration {
        let round = ahead / usize::from(count.clamp(1, 4));
        self.poll
            .saturating_mul(1u32 << round.min(16))
            .min(self.poll_cap)
    }
}

impl Timing {
    /// The nap before reading when a hand-off is due at `due_ms`: until just
    /// before it, then every `poll_min` for a while after it (a forecast that
    /// came true late), then no shorter than any other nap.
    fn near(&self, due_ms: u64, now_ms: u64) -> Duration {
        let margin = self.poll_min / 2;
        let before = Duration::from_millis(due_ms.saturating_sub(now_ms));
        if before > margin {
            before - margin
        } else if now_ms.saturating_sub(due_ms) <= 4 * self.poll_min.as_millis() as u64 {
            self.poll_min
        } else {
            Duration::MAX
        }
    }
}

impl Timing {
    /// A waiter's nap (before jitter) by its place and the pool's pace as it
    /// has seen it. The pace may only shorten the nap by place, never
    /// lengthen it: a pace measured while everyone read slowly would keep
    /// them slow.
    fn by_pace(&self, ahead: usize, needed: usize, count: u16, seen: Seen) -> Duration {
        let by_place = self.by_place(ahead, count);
        // Half the time its turn is expected to take (a grant is then seen
        // about a quarter of that after it lands, on average); a quarter when
        // the pace is glimpsed from one read's slots. Half was not enough
        // there: a pool whose waiters noticed their grants late looked slow,
        // its waiters far back read later still, and 64 clients settled at a
        // third of the cycles 16 made (measured in docs/BENCHMARK.md).
        // Saturating: no pace estimate may panic a request.
        let by_pace = |per_second: f64, share: f64| {
            Duration::try_from_secs_f64(needed.max(1) as f64 / per_second * share)
                .unwrap_or(by_place)
                .clamp(self.poll_min.min(by_place), by_place)
        };
        match seen {
            Seen::Granting(per_second) => by_pace(per_second, 0.5),
            Seen::Glimpsed(per_second) => by_pace(per_second, 0.25),
            // Early on, read again soon: a second read tells how fast the
            // pool grants.
            Seen::Unknown => by_place.min(self.poll),
            // Nothing granted since its first read: a return or a raise may
            // come at any time, and its place alone says how soon it matters.
            Seen::Idle => by_place,
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            poll: Duration::from_millis(70),
            poll_min: Duration::from_millis(10),
            poll_cap: Duration::from_secs(2),
            retry: Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(400),
                Jitter::Full,
            ),
            conflict: Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(100),
                Jitter::Full,
            ),
            call_timeout: Duration::from_millis(2_500),
            deadline_margin: Duration::from_millis(300),
            local_budget: Duration::from_millis(4_500),
            cancel_reserve: Duration::from_millis(1_500),
        }
    }
}

/// A granted lease, as the borrow response reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub lease: LeaseId,
    pub position: u16,
    pub expires_at_ms: u64,
    /// What the borrower is told it has: the clamped ttl for a slot it took
    /// at once, the time left for one handed to it while it waited (the
    /// lease runs from the hand-off) and for an idempotent repeat.
    pub expires_in_ms: u64,
    pub fence: u64,
}

/// Borrow parameters after validation (clamping is the service's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BorrowRequest {
    pub ttl_ms: u64,
    pub wait_ms: u64,
    /// The lease id: the client's (making the borrow idempotent, and its
    /// wait cancellable by a return of that id), or one the server chose.
    pub lease: LeaseId,
}

/// What one request cost, for its log line and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub store_calls: u32,
    /// Store calls that failed (errors and timeouts).
    pub store_errors: u32,
    /// Conditional writes lost to another writer.
    pub conflicts: u32,
    /// Time spent waiting for a slot (sleeping between polls).
    pub waited: Duration,
}

/// One request in flight: its Lambda deadline, if any, and what it cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct Call {
    pub deadline: Option<Instant>,
    pub stats: Stats,
}

impl Call {
    pub fn new(deadline: Option<Instant>) -> Self {
        Call {
            deadline,
            stats: Stats::default(),
        }
    }
}

pub struct Service {
    store: Arc<dyn PoolStore>,
    /// Async mode's ticket items (and the backlog sync borrowers wait in).
    tickets: Option<Arc<dyn TicketStore>>,
    /// Which callback URLs an enqueue may name.
    callbacks: CallbackPolicy,
    /// Told of every write that leaves a pool with async tickets or a
    /// backlog: an in-process dispatcher's stand-in for the table's stream.
    watch: Option<Watch>,
    limits: Limits,
    timing: Timing,
}

/// Hears which pool changed (see [`Service::with_watch`]).
pub type Watch = Arc<dyn Fn(PoolKey) + Send + Sync>;

/// A request's working state: when it must answer by, and its store calls.
struct Ctx<'a> {
    store: &'a dyn PoolStore,
    tickets: Option<&'a dyn TicketStore>,
    watch: Option<&'a Watch>,
    timing: Timing,
    answer_by: Instant,
    stats: &'a mut Stats,
}

impl Service {
    pub fn new(store: Arc<dyn PoolStore>, limits: Limits) -> Self {
        Service {
            store,
            tickets: None,
            callbacks: CallbackPolicy::default(),
            watch: None,
            limits,
            timing: Timing::default(),
        }
    }

    /// Which callbacks enqueues may name (by default, https to public
    /// addresses only).
    pub fn with_callback_policy(mut self, policy: CallbackPolicy) -> Self {
        self.callbacks = policy;
        self
    }

    pub fn callback_policy(&self) -> CallbackPolicy {
        self.callbacks
    }

    /// Calls `watch` after each write that leaves a pool with async work
    /// (its `active` flag), and after each enqueue (local runs: in AWS the table's
    /// stream, filtered the same way, invokes the dispatcher).
    pub fn with_watch(mut self, watch: Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Serves async mode, with its tickets in `tickets` (the same table).
    pub fn with_tickets(mut self, tickets: Arc<dyn TicketStore>) -> Self {
        self.tickets = Some(tickets);
        self
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn ctx<'a>(&'a self, call: &'a mut Call, wait: Duration) -> Ctx<'a> {
        let now = Instant::now();
        let answer_by = match call.deadline {
            Some(deadline) => deadline
                .checked_sub(self.timing.deadline_margin)
                .unwrap_or(now)
                .max(now),
            None => now + wait + self.timing.local_budget,
        };
        Ctx {
            store: self.store.as_ref(),
            tickets: self.tickets.as_deref(),
            watch: self.watch.as_ref(),
            timing: self.timing,
            answer_by,
            stats: &mut call.stats,
        }
    }

    /// `PUT`: creates the pool, or sets its count keeping live leases.
    pub async fn register(
        &self,
        id: PoolId,
        count: u16,
        call: &mut Call,
    ) -> Result<PoolState, Error> {
        let key = id.key();
        let mut ctx = self.ctx(call, Duration::ZERO);
        let mut fresh = Record::new(Pool::new(count, now_us()));
        let mut lost = 0u32;
        loop {
            let mut current = match ctx.call(ctx.store.create(&key, &fresh)).await {
                Ok(Created::Created(record)) => return Ok(record.pool.state(now_ms())),
                Ok(Created::Exists(current)) => current,
                // Unknown outcome: our create may have landed.
                Err(err) => match ctx.reload(&key, err).await? {
                    // Ours landed: answer the pool as our write left it,
                    // not as later calls may have changed it since.
                    Some(current) if current.incarnation == fresh.incarnation => {
                        return Ok(fresh.pool.state(now_ms()));
                    }
                    Some(current) => current,
                    None => continue,
                },
            };
            // Resize the pool that exists, deciding again from each record
            // a lost write hands back; start over if it is deleted.
            loop {
                let Some(update) = current.pool.plan_resize(count, now_ms()) else {
                    return Ok(current.pool.state(now_ms()));
                };
                match ctx.write(&key, &current, &update).await {
                    Ok(Updated::Written(record)) => {
                        if record.pool.plan_resize(count, now_ms()).is_none() {
                            return Ok(record.pool.state(now_ms()));
                        }
                        // More to trim than one write carries.
                        current = record;
                    }
                    Ok(Updated::Lost(record)) if record.incarnation == current.incarnation => {
                        if ctx.lost(&mut lost).await? {
                            current = ctx.load_existing(&key).await?;
                        } else {
                            current = record;
                        }
                    }
                    Ok(Updated::Lost(_) | Updated::Gone) => break,
                    Err(err) => match ctx.reload(&key, err).await? {
                        Some(now) if now.incarnation == current.incarnation => current = now,
                        _ => break,
                    },
                }
            }
            ctx.lost(&mut lost).await?;
            fresh = Record::new(Pool::new(count, now_us()));
        }
    }

    /// `GET`.
    pub async fn inspect(&self, id: PoolId, call: &mut Call) -> Result<PoolState, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        let record = ctx.load_existing(&id.key()).await?;
        Ok(record.pool.state(now_ms()))
    }

    /// `DELETE`: whether a pool was removed.
    pub async fn delete(&self, id: PoolId, call: &mut Call) -> Result<bool, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        Ok(ctx.call(ctx.store.delete(&id.key())).await?)
    }

    /// `POST …/borrow`: the lowest free position, or, when none is free or
    /// others wait, a place in the queue until a slot is handed to this
    /// borrower or its wait ends.
    pub async fn borrow(
        &self,
        id: PoolId,
        request: BorrowRequest,
        call: &mut Call,
    ) -> Result<Grant, Error> {
        let ttl_ms = request.ttl_ms.min(self.limits.max_ttl_ms).max(1);
        let wait = Duration::from_millis(request.wait_ms.min(self.limits.max_wait_ms));
        let mut ctx = self.ctx(call, wait);
        let started = Instant::now();
        // Stop waiting in time to cancel the ticket before answering.
        let give_up = (started + wait)
            .min(
                ctx.answer_by
                    .checked_sub(ctx.timing.cancel_reserve)
                    .unwrap_or(started),
            )
            .max(started);
        let borrower = Borrower {
            key: id.key(),
            lease: request.lease,
            holder: Holder {
                digest: request.lease.digest(),
                ttl_ms,
            },
            give_up,
            give_up_ms: now_ms() + (give_up - started).as_millis() as u64,
            max_waiters: self.limits.max_waiters,
        };
        borrower.run(&mut ctx).await
    }

    /// `POST …/return`: whether a live lease was freed. A return of a lease
    /// id whose borrow still waits takes its ticket out of the queue (and
    /// answers `false`: nothing was held); one of an id the pool has never
    /// seen is remembered for a while, so that a borrow with that id
    /// arriving after it is refused (a cancel may overtake its borrow).
    pub async fn return_lease(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Call,
    ) -> Result<bool, Error> {
        let key = id.key();
        let digest = lease.digest();
        let mut ctx = self.ctx(call, Duration::ZERO);
        let mut record = ctx.load_existing(&key).await?;
        let incarnation = record.incarnation;
        let mut lost = 0u32;
        loop {
            if record.incarnation != incarnation {
                // Deleted and registered again: the lease ended with the delete.
                return Ok(false);
            }
            let (held, update, remember) = match record.pool.plan_return(digest, now_ms()) {
                ReturnPlan::Return(held, update) => (Some(held), update, false),
                ReturnPlan::Cancel(update) => (None, update, false),
                ReturnPlan::Remember(update) => (None, update, true),
                ReturnPlan::Expired(_) | ReturnPlan::Remembered => return Ok(false),
            };
            let fresh = match ctx.write(&key, &record, &update).await {
                // Its borrow's take or ticket landed between our read and
                // the tombstone (which they are conditioned against, but not
                // it against them): give that up too, as if read first.
                Ok(Updated::Written(new)) if remember && new.pool.asks(digest, now_ms()) => new,
                Ok(Updated::Written(_)) => return Ok(held.is_some()),
                Ok(Updated::Gone) => return Err(Error::PoolNotFound),
                Ok(Updated::Lost(fresh)) => {
                    if ctx.lost(&mut lost).await? {
                        ctx.load_existing(&key).await?
                    } else {
                        fresh
                    }
                }
                Err(err) => ctx.reload(&key, err).await?.ok_or(Error::PoolNotFound)?,
            };
            if let Some(held) = held {
                if gone_while_live(&fresh, incarnation, &held) {
                    return Ok(true);
                }
            }
            record = fresh;
        }
    }
}

/// After a return whose write was lost or failed: the lease is no longer
/// stored although it had not expired, so a write of ours (an earlier SDK
/// attempt, or this one before its answer was lost) or a twin return of the
/// same lease removed it: the return happened.
fn gone_while_live(fresh: &Record, incarnation: u64, held: &Lease) -> bool {
    fresh.incarnation == incarnation
        && held.is_live(now_ms())
        && !fresh
            .pool
            .leases()
            .iter()
            .any(|l| l.position == held.position && l.fence == held.fence)
}

/// One borrow in progress.
struct Borrower {
    key: PoolKey,
    lease: LeaseId,
    holder: Holder,
    /// When it stops waiting (and its wall-clock twin, stored in its ticket).
    give_up: Instant,
    give_up_ms: u64,
    max_waiters: usize,
}

/// Where a borrow stands after its first writes.
enum Placed {
    /// A slot: the lease, and whether this request's own take granted it.
    Granted(Lease, bool),
    /// A ticket in the queue (its own, or a twin request's), joined at ms.
    Queued(Record, Holder, u64),
}

impl Borrower {
    async fn run(&self, ctx: &mut Ctx<'_>) -> Result<Grant, Error> {
        let record = ctx.load_existing(&self.key).await?;
        let incarnation = record.incarnation;
        let (record, mine, joined_ms) = match self.place(ctx, record).await? {
            Placed::Granted(lease, own) => return Ok(self.grant(&lease, now_ms(), own)),
            Placed::Queued(record, mine, joined_ms) => (record, mine, joined_ms),
        };
        self.wait(ctx, incarnation, record, mine, joined_ms).await
    }

    /// Takes a free slot, or joins the queue.
    async fn place(&self, ctx: &mut Ctx<'_>, mut record: Record) -> Result<Placed, Error> {
        let incarnation = record.incarnation;
        let mut lost = 0u32;
        // The grant times of the takes we tried: a lease of ours found with
        // one of them is this request's own grant.
        let mut tried: Vec<u64> = Vec::new();
        // A borrower that may wait and lost a take joins the queue instead of
        // racing for the next free slot (joins never collide).
        let mut take = true;
        loop {
            if record.incarnation != incarnation {
                // Deleted (and maybe registered again) while we were at it.
                return Err(Error::PoolNotFound);
            }
            if let Some(lease) = record
                .pool
                .leases()
                .into_iter()
                .find(|l| l.digest == self.holder.digest && tried.contains(&l.granted_ms))
            {
                // Ours even if expired since (a take that landed late).
                return Ok(Placed::Granted(lease, true));
            }
            let now = now_ms();
            let may_wait = Instant::now() < self.give_up;
            let plan = record.pool.plan_borrow_or_join(
                self.holder,
                self.give_up_ms,
                now,
                self.max_waiters,
                take || !may_wait,
            );
            match plan {
                BorrowPlan::Held(lease) => return Ok(Placed::Granted(lease, false)),
                BorrowPlan::Queued(holder) => return Ok(Placed::Queued(record, holder, now)),
                // Given up before this request was seen, or no place to wait.
                BorrowPlan::Cancelled | BorrowPlan::Full => return Err(Error::Exhausted),
                BorrowPlan::Backlog if !may_wait => return Err(Error::Exhausted),
                BorrowPlan::Backlog => return self.wait_in_backlog(ctx, incarnation).await,
                BorrowPlan::Prune(update) => {
                    record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                }
                BorrowPlan::Take { update, .. } => {
                    tried.push(now);
                    record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                    // Lost unless the lease it wrote is there (checked above).
                    take = false;
                }
                BorrowPlan::Join(update) => {
                    if !may_wait {
                        // `wait: 0` (or no time left): no waiting at all.
                        return Err(Error::Exhausted);
                    }
                    let joined = write(ctx, &self.key, &record, &update, &mut lost).await?;
                    if joined.pool.queue().iter().any(|t| t.holder == self.holder) {
                        return Ok(Placed::Queued(joined, self.holder, now));
                    }
                    record = joined;
                }
            }
        }
    }

    /// Waits in the queue until a slot is handed to `mine`, handing free
    /// slots to the head when it is this reader's turn to, and gives up in
    /// time to cancel its ticket.
    async fn wait(
        &self,
        ctx: &mut Ctx<'_>,
        incarnation: u64,
        mut record: Record,
        mine: Holder,
        joined_ms: u64,
    ) -> Result<Grant, Error> {
        let mut lost = 0u32;
        let mut pace = Pace::default();
        let mut forecast = Forecast::default();
        loop {
            if record.incarnation != incarnation {
                return Err(Error::PoolNotFound);
            }
            let now = now_ms();
            let (ahead, needed) = match record.pool.plan_wait(&mine, joined_ms, now) {
                WaitPlan::Granted(lease) => return Ok(self.grant(&lease, now, false)),
                // Cancelled by a return of its lease id, or pruned as dead.
                WaitPlan::Gone => return Err(Error::Exhausted),
                WaitPlan::Waiting {
                    duty: Some(update), ..
                } => {
                    record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                    continue;
                }
                WaitPlan::Waiting { ahead, needed, .. } => {
                    if needed == 0 {
                        // A free slot, but dead tickets block the hand-off.
                        if let Some(update) = record.pool.plan_prune(now) {
                            record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                            continue;
                        }
                    }
                    (ahead, needed)
                }
            };
            if Instant::now() >= self.give_up {
                return self
                    .give_up(ctx, incarnation, record, mine, joined_ms)
                    .await;
            }
            let nap = ctx.poll_interval(ahead, needed, &record.pool, now, &mut pace);
            // Read around the time the slot it waits for is expected to be
            // handed on (a shorter nap only, never a longer one).
            let nap = match forecast.observe(&record.pool, needed, now) {
                Some(due) => nap.min(ctx.timing.near(due, now)),
                None => nap,
            };
            // Once the next returns may serve it, read well within its ttl:
            // a slot handed to it is its lease from the hand-off on.
            let nap = if ahead < usize::from(record.pool.count().max(1)) {
                nap.min(Duration::from_millis(mine.ttl_ms / 3).max(ctx.timing.poll_min))
            } else {
                nap
            };
            let nap = match record.pool.nth_expiry(needed, now) {
                // Wake as the lease whose end makes it this reader's turn
                // expires, so that its slot is handed on within milliseconds.
                Some(expiry) => nap.min(Duration::from_millis(expiry.saturating_sub(now))),
                None => nap,
            };
            let nap = nap.min(self.give_up.saturating_duration_since(Instant::now()));
            tokio::time::sleep(nap).await;
            ctx.stats.waited += nap;
            record = ctx.load_existing(&self.key).await?;
        }
    }

    /// At the end of its wait: takes its ticket out of the queue, or finds
    /// the slot handed to it meanwhile (then the grant stands: a slot is
    /// never left to a borrower that answered 409).
    async fn give_up(
        &self,
        ctx: &mut Ctx<'_>,
        incarnation: u64,
        mut record: Record,
        mine: Holder,
        joined_ms: u64,
    ) -> Result<Grant, Error> {
        let mut lost = 0u32;
        loop {
            if record.incarnation != incarnation {
                return Err(Error::PoolNotFound);
            }
            let now = now_ms();
            if let WaitPlan::Granted(lease) = record.pool.plan_wait(&mine, joined_ms, now) {
                return Ok(self.grant(&lease, now, false));
            }
            let Some(update) = record.pool.plan_cancel(&mine) else {
                return Err(Error::Exhausted);
            };
            record = write(ctx, &self.key, &record, &update, &mut lost).await?;
        }
    }

    /// The answer for a lease held under our id: a slot this request took
    /// carries its full ttl (API.md: `expires_in` is the clamped ttl); one
    /// handed to it while it waited, or an idempotent repeat, the time left.
    fn grant(&self, lease: &Lease, now_ms: u64, own: bool) -> Grant {
        let expires_in_ms = if own {
            lease.ttl_ms
        } else {
            lease.expires_at_ms.saturating_sub(now_ms).max(1)
        };
        Grant {
            lease: self.lease,
            position: lease.position,
            expires_at_ms: lease.expires_at_ms,
            expires_in_ms,
            fence: lease.fence,
        }
    }
}

/// Writes `update`, planned from `read`; the record to decide from next: the
/// new one, the one a lost write handed back, or (outcome unknown) a fresh
/// read.
async fn write(
    ctx: &mut Ctx<'_>,
    key: &PoolKey,
    read: &Record,
    update: &Update,
    lost: &mut u32,
) -> Result<Record, Error> {
    match ctx.write(key, read, update).await {
        Ok(Updated::Written(record)) => {
            *lost = 0;
            Ok(record)
        }
        Ok(Updated::Lost(record)) => {
            if ctx.lost(lost).await? {
                return ctx.load_existing(key).await;
            }
            Ok(record)
        }
        Ok(Updated::Gone) => Err(Error::PoolNotFound),
        Err(err) => ctx.reload(key, err).await?.ok_or(Error::PoolNotFound),
    }
}

impl Ctx<'_> {
    /// Runs one store call, bounded by the time left.
    async fn call<T>(
        &mut self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.stats.store_calls += 1;
        let until = self
            .answer_by
            .min(Instant::now() + self.timing.call_timeout);
        let result = match tokio::time::timeout_at(until.into(), call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::TimedOut,
                "no answer from the database in the time left",
            )),
        };
        if result.is_err() {
            self.stats.store_errors += 1;
        }
        result
    }

    /// Writes `update`, planned from `read`, conditioned on `read`'s incarnation.
    async fn write(
        &mut self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let result = self
            .call(self.store.update(key, read.incarnation, update))
            .await;
        match &result {
            Ok(Updated::Lost(_)) => self.stats.conflicts += 1,
            // As the stream's filter passes writes to the dispatcher.
            Ok(Updated::Written(record)) if record.pool.line().active => self.changed(key),
            _ => {}
        }
        result
    }

    fn changed(&self, key: &PoolKey) {
        if let Some(watch) = self.watch {
            watch(*key);
        }
    }

    /// Reads the pool, retrying failed reads while there is time.
    async fn load(&mut self, key: &PoolKey) -> Result<Option<Record>, Error> {
        let mut failures = 0u32;
        loop {
            match self.call(self.store.load(key)).await {
                Ok(record) => return Ok(record),
                Err(err) => self.retry_after(err, &mut failures).await?,
            }
        }
    }

    async fn load_existing(&mut self, key: &PoolKey) -> Result<Record, Error> {
        self.load(key).await?.ok_or(Error::PoolNotFound)
    }

    /// After a write whose outcome is unknown: the pool as it is now, to see
    /// whether the write landed. The write's own error if no read succeeds.
    async fn reload(&mut self, key: &PoolKey, err: StoreError) -> Result<Option<Record>, Error> {
        if !err.is_transient() {
            return Err(err.into());
        }
        // At once: the sooner we look, the less can have changed since.
        self.load(key).await
    }

    /// Naps before retrying a failed call; the error when there is no time.
    async fn retry_after(&mut self, err: StoreError, failures: &mut u32) -> Result<(), Error> {
        if !err.is_transient() {
            return Err(err.into());
        }
        *failures += 1;
        self.nap(*failures, self.timing.retry)
            .await
            .map_err(|()| Error::from(err))
    }

    /// After a lost conditional write: retry at once (with the record it
    /// handed back) twice, then nap; past the answer-by time, too much
    /// contention. `Ok(true)` after a nap: the handed-back record is stale
    /// by then, so decide from a fresh read.
    async fn lost(&mut self, lost: &mut u32) -> Result<bool, Error> {
        *lost += 1;
        if Instant::now() >= self.answer_by {
            return Err(Error::Contention);
        }
        const IMMEDIATE: u32 = 2;
        if *lost <= IMMEDIATE {
            return Ok(false);
        }
        self.nap(*lost - IMMEDIATE, self.timing.conflict)
            .await
            .map_err(|()| Error::Contention)?;
        Ok(true)
    }

    /// Sleeps the `n`th pause (from 1) of `backoff`, unless it would end
    /// past the answer-by time (then `Err`).
    async fn nap(&self, n: u32, backoff: Backoff) -> Result<(), ()> {
        let nap = backoff.pause(n - 1);
        if Instant::now() + nap + self.timing.call_timeout.min(Duration::from_millis(50))
            >= self.answer_by
        {
            return Err(());
        }
        tokio::time::sleep(nap).await;
        Ok(())
    }

    /// How long a waiter sleeps: `ahead` live tickets are before it and its
    /// turn comes after `needed` more slots free up; `pace` is how fast the
    /// pool has granted as this waiter has seen it.
    fn poll_interval(
        &mut self,
        ahead: usize,
        needed: usize,
        pool: &Pool,
        now_ms: u64,
        pace: &mut Pace,
    ) -> Duration {
        let full = self
            .timing
            .by_pace(ahead, needed, pool.count(), pace.observe(pool, now_ms));
        full.mul_f64(0.75 + 0.25 * wire::unit())
    }
}

/// When the slots a waiter waits for are likely to be handed on: how long
/// holders hold, learned from the slots it saw handed on between its reads.
#[derive(Default)]
struct Forecast {
    /// The held slots at the last read: position, fence, grant ms.
    seen: Vec<(u16, u64, u64)>,
    /// Smoothed hold, ms.
    hold_ms: Option<f64>,
}

impl Forecast {
    /// Takes in a read at `now_ms`; when the `needed`-th of the slots held
    /// now is expected to be handed on (a slot whose holder has held it
    /// well past the usual hold is not expected before its expiry).
    fn observe(&mut self, pool: &Pool, needed: usize, now_ms: u64) -> Option<u64> {
        let held: Vec<_> = pool
            .leases()
            .into_iter()
            .filter(|l| l.is_live(now_ms))
            .collect();
        for lease in &held {
            let before = self
                .seen
                .iter()
                .find(|(position, fence, _)| *position == lease.position && *fence < lease.fence);
            if let Some(&(_, _, granted)) = before {
                let hold = lease.granted_ms.saturating_sub(granted) as f64;
                self.hold_ms = Some(match self.hold_ms {
                    Some(old) => 0.7 * old + 0.3 * hold,
                    None => hold,
                });
            }
        }
        self.seen = held
            .iter()
            .map(|l| (l.position, l.fence, l.granted_ms))
            .collect();
        let hold = self.hold_ms? as u64;
        let slack = (hold / 4).max(20);
        let mut due: Vec<u64> = held
            .iter()
            .map(|l| {
                let usual = l.granted_ms.saturating_add(hold);
                if usual.saturating_add(slack) < now_ms {
                    l.expires_at_ms
                } else {
                    usual.min(l.expires_at_ms)
                }
            })
            .collect();
        due.sort_unstable();
        needed.checked_sub(1).and_then(|i| due.get(i).copied())
    }
}

/// How fast a pool grants, as one waiter sees it: fences issued per second
/// since its first read (a window of a few polls may hold no grant at all,
/// and a waiter far back must not take a busy pool for an idle one), and
/// until that window is long enough, from when its current holders were
/// granted.
#[derive(Default)]
struct Pace {
    first: Option<(u64, u64)>,
}

impl Pace {
    /// Grants shorter apart than this say nothing of a pool's pace.
    const WINDOW_MS: u64 = 200;

    /// Takes in a read of `pool` at `now_ms`: the grants per second seen so
    /// far, or that it has seen none.
    fn observe(&mut self, pool: &Pool, now_ms: u64) -> Seen {
        let fence = pool.next_fence();
        let recent = Self::recent(pool, fence, now_ms);
        let (since, first) = *self.first.get_or_insert((now_ms, fence));
        if now_ms < since + Self::WINDOW_MS {
            return recent.map_or(Seen::Unknown, Seen::Glimpsed);
        }
        let rate = fence.saturating_sub(first) as f64 * 1000.0 / (now_ms - since) as f64;
        if rate > 0.0 {
            // The faster of the two: a pool speeds up as its waiters notice
            // their grants sooner, and one that read slowly while it was
            // slow would otherwise keep it slow.
            Seen::Granting(rate.max(recent.unwrap_or(0.0)))
        } else {
            Seen::Idle
        }
    }

    /// The grants per second since the oldest recent grant still held: every
    /// fence issued since was a grant, whether or not its slot is held still.
    /// (Counting only the slots held now took a pool whose waiters were slow
    /// to notice their grants for a slow pool: those read later still, and
    /// were later still to notice theirs.)
    fn recent(pool: &Pool, fence: u64, now_ms: u64) -> Option<f64> {
        let oldest = pool
            .leases()
            .into_iter()
            .filter(|l| {
                l.is_live(now_ms) && now_ms.saturating_sub(l.granted_ms) <= 10 * Self::WINDOW_MS
            })
            .min_by_key(|l| l.granted_ms)?;
        // A lease's fence is offset by the pool's base; `fence` is not.
        let grants = fence.saturating_sub(oldest.fence.saturating_sub(pool.base_us()));
        let since = now_ms.saturating_sub(oldest.granted_ms).max(1);
        (grants >= 2).then(|| (grants - 1) as f64 * 1000.0 / since as f64)
    }
}

/// What a waiter has seen of its pool's pace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Seen {
    /// Not yet enough to tell.
    Unknown,
    /// No grant since its first read, a window ago or more.
    Idle,
    /// Grants per second, from the slots held at one read.
    Glimpsed(f64),
    /// Grants per second.
    Granting(f64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ReturnPlan;

    #[test]
    fn waiters_read_in_rounds_that_double() {
        let timing = Timing::default();
        let ms = |n| Duration::from_millis(n);
        // Count 1: one round per place.
        assert_eq!(timing.by_place(0, 1), ms(70));
        assert_eq!(timing.by_place(1, 1), ms(140));
        assert_eq!(timing.by_place(2, 1), ms(280));
        // Count 4: the next four freed slots serve the first round.
        assert_eq!(timing.by_place(3, 4), ms(70));
        assert_eq!(timing.by_place(4, 4), ms(140));
        // A big pool's rounds are 4 wide; far back, every 2 s.
        assert_eq!(timing.by_place(8, 1000), ms(280));
        assert_eq!(timing.by_place(900, 4), ms(2000));
        // Count 0 (a pool shrunk to nothing) is sane.
        assert_eq!(timing.by_place(0, 0), ms(70));
    }

    fn holder(n: u8) -> Holder {
        Holder {
            digest: crate::domain::LeaseDigest([n; 8]),
            ttl_ms: 60_000,
        }
    }

    /// `pool` after holder `n` took its lowest free slot at `at`.
    fn take(pool: Pool, n: u8, at: u64) -> Pool {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(n), at, at, 100) else {
            panic!("holder {n} found no free slot")
        };
        pool.apply(&update).unwrap()
    }

    /// `pool` after the lease `from` was returned and holder `n` took a slot.
    fn hand_on(pool: Pool, from: crate::domain::LeaseDigest, n: u8, at: u64) -> Pool {
        let ReturnPlan::Return(_, update) = pool.plan_return(from, at) else {
            panic!("no such lease")
        };
        take(pool.apply(&update).unwrap(), n, at)
    }

    #[test]
    fn the_pace_is_grants_per_second_since_the_first_read() {
        let mut pool = Pool::new(2, 0);
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Unknown, "a first read");
        // Two holders granted 100 ms apart, 100 ms ago at the latest: the
        // pool grants about 10 per second.
        pool = take(pool, 1, 800);
        pool = take(pool, 2, 900);
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Glimpsed(5.0));
        // Five grants in the 250 ms since the first read: 20 per second.
        for k in 0..5u8 {
            let which = pool.leases()[0].digest;
            pool = hand_on(pool, which, 20 + k, 1_050 + u64::from(k) * 40);
        }
        assert_eq!(pace.observe(&pool, 1_250), Seen::Granting(20.0));
    }

    #[test]
    fn waiters_on_a_pool_that_grants_nothing_read_by_place_alone() {
        let timing = Timing::default();
        let ms = Duration::from_millis;
        let mut pool = Pool::new(4, 0);
        let mut pace = Pace::default();
        // A first read says nothing of the pace: read again within `poll`.
        let seen = pace.observe(&pool, 1_000);
        assert_eq!(seen, Seen::Unknown);
        assert_eq!(timing.by_pace(40, 37, 4, seen), ms(70));
        // Nothing granted a window later: the place alone sets the nap (a
        // waiter far back once read every 70 ms while nothing moved).
        let seen = pace.observe(&pool, 1_300);
        assert_eq!(seen, Seen::Idle);
        assert_eq!(timing.by_pace(40, 37, 4, seen), ms(2_000));
        assert_eq!(timing.by_pace(5, 2, 4, seen), ms(140));
        assert_eq!(timing.by_pace(0, 1, 4, seen), ms(70));
        // Four grants seen after that: the pace shortens the nap again.
        for n in 0..4 {
            pool = take(pool, n, 1_400);
        }
        // Since its first read 8 per second, over the last 100 ms 30: the
        // faster counts.
        let seen = pace.observe(&pool, 1_500);
        assert_eq!(seen, Seen::Granting(30.0));
        // By place 560 ms; by pace half the time of one grant.
        assert_eq!(
            timing.by_pace(12, 1, 4, seen),
            Duration::from_secs_f64(1.0 / 30.0 / 2.0)
        );
        // A rate glimpsed at a first read is trusted half as much.
        assert_eq!(
            timing.by_pace(12, 4, 4, Seen::Glimpsed(30.0)),
            Duration::from_secs_f64(4.0 / 30.0 / 4.0)
        );
    }

    #[test]
    fn a_first_read_counts_every_grant_since_the_oldest_slot_held() {
        // A real pool's fences start at its creation time in µs.
        let mut pool = Pool::new(2, 1_700_000_000_000_000);
        // One holder slow to move on since 800; the other slot handed on
        // ten times since: 11 grants after the one at 800, in 200 ms.
        pool = take(pool, 1, 800);
        pool = take(pool, 2, 850);
        for k in 0..10u8 {
            pool = hand_on(pool, holder(2 + k).digest, 3 + k, 860 + u64::from(k) * 14);
        }
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Glimpsed(55.0));
    }

    #[test]
    fn a_forecast_learns_the_hold_and_expects_the_next_hand_off() {
        let mut pool = Pool::new(2, 0);
        pool = take(pool, 0, 1_000);
        pool = take(pool, 1, 1_100);
        let mut forecast = Forecast::default();
        assert_eq!(forecast.observe(&pool, 1, 1_150), None, "no hold seen yet");
        // Slot 0 is handed on after 200 ms.
        pool = hand_on(pool, holder(0).digest, 9, 1_200);
        // Slot 1 (granted at 1100) is next, at 1300; slot 0 at 1400.
        assert_eq!(forecast.observe(&pool, 1, 1_210), Some(1_300));
        assert_eq!(forecast.observe(&pool, 2, 1_210), Some(1_400));
        // Long overdue (slot 1 past 1300 + 50): not expected before its expiry.
        assert_eq!(forecast.observe(&pool, 1, 1_420), Some(1_400));
        assert_eq!(forecast.observe(&pool, 1, 1_700), Some(61_100));
    }

    #[test]
    fn naps_close_in_on_a_due_hand_off() {
        let timing = Timing::default();
        let ms = Duration::from_millis;
        assert_eq!(timing.near(1_100, 1_000), ms(95));
        assert_eq!(timing.near(1_003, 1_000), ms(10));
        assert_eq!(timing.near(1_000, 1_030), ms(10));
        assert_eq!(timing.near(1_000, 1_041), Duration::MAX);
    }
}
