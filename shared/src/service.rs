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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::domain::{BorrowPlan, JoinPlan, Lease, LeaseDigest, Pool, PoolState, Ticket, Update};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::store::{Created, PoolStore, Record, StoreError, StoreErrorKind, Updated};

/// Bounds applied to requests (API.md: `ttl` and `wait` are clamped, never
/// rejected), and the most borrowers that may wait on one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_ttl_ms: u64,
    pub max_wait_ms: u64,
    pub max_waiters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_ttl_ms: 3_600_000,
            // API Gateway's HTTP API cuts every request at 30 s.
            max_wait_ms: 25_000,
            // 100 tickets of 23 bytes keep a pool item within a few write units.
            max_waiters: 100,
        }
    }
}

/// How waiters poll, how lost races and failed calls are retried, and how
/// much time every request keeps in hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Waiters read in rounds: those the next `count` freed slots would
    /// serve (at most 4) every `poll`, the next `count` every `2 · poll`, and
    /// so on up to `poll_cap`, so the head sees a return within about `poll`
    /// and the pool's reads grow far slower than its queue; sooner (never
    /// below `poll_min`) when the queue has moved fast enough past a waiter
    /// that its turn may come before then. Jittered to ¾–1×. Expiries are
    /// slept to exactly.
    pub poll: Duration,
    pub poll_min: Duration,
    pub poll_cap: Duration,
    /// After a failed store call: full jitter in `[0, first · 2^n]`, capped.
    pub retry_first: Duration,
    pub retry_cap: Duration,
    /// After the third lost write in a row, the same kind of nap (a lost
    /// write is otherwise retried at once with the record it handed back).
    pub conflict_first: Duration,
    pub conflict_cap: Duration,
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
    /// A waiter's read interval by its place alone: its turn comes after
    /// `needed` more slots free up on a pool of `count`. In rounds of up to
    /// `count` releases (at most 4, which bounds the reads of a long
    /// queue): whoever the next round serves reads every `poll`, the one after
    /// every `2 · poll`, and so on, at most every `poll_cap`. The queue's pace
    /// may only shorten this, never lengthen it: a pace measured while
    /// everyone polled slowly would keep them slow.
    fn by_place(&self, needed: usize, count: u16) -> Duration {
        let round = needed.max(1).div_ceil(usize::from(count.clamp(1, 4)));
        self.poll
            .saturating_mul(u32::try_from(round).unwrap_or(u32::MAX))
            .min(self.poll_cap)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            poll: Duration::from_millis(70),
            poll_min: Duration::from_millis(10),
            poll_cap: Duration::from_secs(2),
            retry_first: Duration::from_millis(20),
            retry_cap: Duration::from_millis(400),
            conflict_first: Duration::from_millis(10),
            conflict_cap: Duration::from_millis(100),
            call_timeout: Duration::from_millis(2_500),
            deadline_margin: Duration::from_millis(300),
            local_budget: Duration::from_millis(4_500),
            cancel_reserve: Duration::from_millis(1_500),
        }
    }
}

/// How the service writes and waits. The default is the product; the rest
/// are the designs it replaced, kept selectable so that a benchmark compares
/// both in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Every write also conditions on the whole pool as read (as the old
    /// version-checked `PutItem` did), and a lost write naps and reads again.
    /// For small pools only (benchmarks): it pins every slot.
    pub whole_item_writes: bool,
    /// Waiters queue in arrival order. Off: they poll (15 ms doubling to
    /// 90 ms, jittered) and race newcomers for each freed slot.
    pub fair_waiting: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            whole_item_writes: false,
            fair_waiting: true,
        }
    }
}

/// A granted lease, as the borrow response reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub lease: LeaseId,
    pub position: u16,
    pub expires_at_ms: u64,
    /// What the borrower is told it has: the clamped ttl for a new grant, the
    /// time left for an idempotent repeat.
    pub expires_in_ms: u64,
    pub fence: u64,
}

/// Borrow parameters after validation (clamping is the service's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BorrowRequest {
    pub ttl_ms: u64,
    pub wait_ms: u64,
    /// A client-chosen lease id, making the borrow idempotent.
    pub lease: Option<LeaseId>,
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

/// Microseconds since the Unix epoch: a new pool's first fence.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub fn now_ms() -> u64 {
    now_us() / 1000
}

pub struct Service {
    store: Arc<dyn PoolStore>,
    limits: Limits,
    timing: Timing,
    policy: Policy,
}

/// A request's working state: when it must answer by, and its store calls.
struct Ctx<'a> {
    store: &'a dyn PoolStore,
    timing: Timing,
    policy: Policy,
    answer_by: Instant,
    stats: &'a mut Stats,
    jitter: Jitter,
}

impl Service {
    pub fn new(store: Arc<dyn PoolStore>, limits: Limits) -> Self {
        Service {
            store,
            limits,
            timing: Timing::default(),
            policy: Policy::default(),
        }
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
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
            timing: self.timing,
            policy: self.policy,
            answer_by,
            stats: &mut call.stats,
            jitter: Jitter::new(),
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
            let current = match ctx.call(ctx.store.create(&key, &fresh)).await {
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
            let Some(update) = current.pool.plan_resize(count) else {
                return Ok(current.pool.state(now_ms()));
            };
            match ctx.write(&key, &current, &update).await {
                Ok(Updated::Written(record)) => return Ok(record.pool.state(now_ms())),
                // Deleted or recreated under us: start over.
                Ok(Updated::Gone | Updated::Lost(_)) => {
                    ctx.lost(&mut lost).await?;
                }
                Err(err) => match ctx.reload(&key, err).await? {
                    Some(now) if now.pool.count() == count => {
                        return Ok(now.pool.state(now_ms()));
                    }
                    _ => {
                        ctx.lost(&mut lost).await?;
                    }
                },
            }
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
    /// others wait, a place in the queue until a slot is this borrower's or
    /// its wait ends.
    pub async fn borrow(
        &self,
        id: PoolId,
        request: BorrowRequest,
        call: &mut Call,
    ) -> Result<Grant, Error> {
        let ttl_ms = request.ttl_ms.min(self.limits.max_ttl_ms).max(1);
        let wait = Duration::from_millis(request.wait_ms.min(self.limits.max_wait_ms));
        let lease = request.lease.unwrap_or_else(LeaseId::new_random);
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
            lease,
            ttl_ms,
            give_up,
            give_up_ms: now_ms() + (give_up - started).as_millis() as u64,
            max_waiters: self.limits.max_waiters,
        };
        borrower.run(&mut ctx).await
    }

    /// `POST …/return`: whether a live lease was freed.
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
            let now = now_ms();
            if record.incarnation != incarnation {
                // Deleted and registered again: the lease ended with the delete.
                return Ok(false);
            }
            let Some((held, update)) = record.pool.plan_return(digest, now) else {
                return Ok(false);
            };
            match ctx.write(&key, &record, &update).await {
                Ok(Updated::Written(_)) => return Ok(true),
                Ok(Updated::Gone) => return Err(Error::PoolNotFound),
                Ok(Updated::Lost(fresh)) => {
                    if gone_while_live(&fresh, incarnation, &held) {
                        return Ok(true);
                    }
                    record = if ctx.lost(&mut lost).await? {
                        ctx.load_existing(&key).await?
                    } else {
                        fresh
                    };
                }
                Err(err) => {
                    let fresh = ctx.reload(&key, err).await?.ok_or(Error::PoolNotFound)?;
                    if gone_while_live(&fresh, incarnation, &held) {
                        return Ok(true);
                    }
                    record = fresh;
                }
            }
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

/// A lease of `record` that a write of ours granted (its expiry is one we
/// tried), even if the write took so long that it has expired since: it was
/// granted, so it is the answer.
fn ours<'r>(record: &'r Record, digest: LeaseDigest, tried: &[u64]) -> Option<&'r Lease> {
    record
        .pool
        .leases()
        .iter()
        .find(|l| l.digest == digest && tried.contains(&l.expires_at_ms))
}

/// One borrow in progress.
struct Borrower {
    key: PoolKey,
    lease: LeaseId,
    ttl_ms: u64,
    /// When it stops waiting (and its wall-clock twin, stored in its ticket).
    give_up: Instant,
    give_up_ms: u64,
    max_waiters: usize,
}

impl Borrower {
    async fn run(&self, ctx: &mut Ctx<'_>) -> Result<Grant, Error> {
        let digest = self.lease.digest();
        let mut record = ctx.load_existing(&self.key).await?;
        let incarnation = record.incarnation;
        let mut ticket: Option<Ticket> = None;
        let mut lost = 0u32;
        // Expiries of the grants we tried to write: a lease found with one of
        // them is ours (full ttl), any other is an idempotent repeat.
        let mut tried: Vec<u64> = Vec::new();
        let mut polls = 0u32;
        let mut pace = Pace::default();
        loop {
            if record.incarnation != incarnation {
                // Deleted (and maybe registered again) while we were at it.
                return Err(Error::PoolNotFound);
            }
            let now = now_ms();
            if let Some(ours) = ours(&record, digest, &tried) {
                return Ok(self.grant(ours, now, &tried));
            }
            let plan = record
                .pool
                .plan_borrow(digest, now + self.ttl_ms, now, ticket.as_ref());
            let update = match plan {
                BorrowPlan::Held(held) => {
                    if let Some(t) = ticket.filter(|t| record.pool.ticket_index(t).is_some()) {
                        // A twin request (same client lease id) was granted:
                        // our ticket must not keep a place it will never use.
                        // Best effort: the grant is the answer either way.
                        let _ = self.cancel(ctx, incarnation, &t, record, &tried).await;
                    }
                    return Ok(self.grant(&held, now, &tried));
                }
                BorrowPlan::Take { update, .. } => {
                    tried.push(now + self.ttl_ms);
                    update
                }
                BorrowPlan::Prune(update) => update,
                BorrowPlan::Wait { ahead, needed, .. } => {
                    let Some(mine) = ticket else {
                        if Instant::now() >= self.give_up {
                            return Err(Error::Exhausted);
                        }
                        if !ctx.policy.fair_waiting {
                            // The old policy: no queue, poll and race.
                            let nap = ctx.unfair_poll_interval(polls);
                            let nap = match record.pool.nth_expiry(needed, now) {
                                Some(expiry) => {
                                    nap.min(Duration::from_millis(expiry.saturating_sub(now)))
                                }
                                None => nap,
                            };
                            let nap =
                                nap.min(self.give_up.saturating_duration_since(Instant::now()));
                            tokio::time::sleep(nap).await;
                            ctx.stats.waited += nap;
                            polls += 1;
                            record = ctx.load_existing(&self.key).await?;
                            continue;
                        }
                        let joining = Ticket {
                            digest,
                            give_up_ms: self.give_up_ms,
                        };
                        match record.pool.plan_join(joining, self.max_waiters, now) {
                            // Too many wait already: no place to wait in.
                            JoinPlan::Full => return Err(Error::Exhausted),
                            JoinPlan::Prune(update) => {
                                record = self.write(ctx, &record, &update, &mut lost).await?;
                            }
                            JoinPlan::Join(update) => {
                                record = self.write(ctx, &record, &update, &mut lost).await?;
                                if record.pool.ticket_index(&joining).is_some() {
                                    ticket = Some(joining);
                                }
                            }
                        }
                        continue;
                    };
                    if record.pool.ticket_index(&mine).is_none() {
                        // Pruned as dead (a clock far ahead of ours): join
                        // again at the end if there is time left.
                        ticket = None;
                        continue;
                    }
                    if Instant::now() >= self.give_up {
                        return match self.cancel(ctx, incarnation, &mine, record, &tried).await? {
                            Some(held) => Ok(self.grant(&held, now_ms(), &tried)),
                            None => Err(Error::Exhausted),
                        };
                    }
                    let nap = ctx.poll_interval(ahead, needed, record.pool.count(), &mut pace);
                    let nap = match record.pool.nth_expiry(needed, now) {
                        // Wake as the lease that serves us expires, so its
                        // slot is taken within milliseconds.
                        Some(expiry) => nap.min(Duration::from_millis(expiry.saturating_sub(now))),
                        None => nap,
                    };
                    let nap = nap.min(self.give_up.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(nap).await;
                    ctx.stats.waited += nap;
                    record = ctx.load_existing(&self.key).await?;
                    continue;
                }
            };
            record = self.write(ctx, &record, &update, &mut lost).await?;
        }
    }

    /// Writes `update`; the record to decide from next: the new one, the one
    /// a lost write handed back, or (outcome unknown) a fresh read.
    /// `read`: the record `update` was planned from.
    async fn write(
        &self,
        ctx: &mut Ctx<'_>,
        read: &Record,
        update: &Update,
        lost: &mut u32,
    ) -> Result<Record, Error> {
        match ctx.write(&self.key, read, update).await {
            Ok(Updated::Written(record)) => {
                *lost = 0;
                Ok(record)
            }
            Ok(Updated::Lost(record)) => {
                if ctx.lost(lost).await? {
                    return ctx.load_existing(&self.key).await;
                }
                Ok(record)
            }
            Ok(Updated::Gone) => Err(Error::PoolNotFound),
            Err(err) => ctx.reload(&self.key, err).await?.ok_or(Error::PoolNotFound),
        }
    }

    /// Removes our ticket, or finds that our lease was granted meanwhile
    /// (then the grant stands: a slot is never left to a borrower that
    /// answered 409). `None` when the ticket is gone and nothing was granted.
    async fn cancel(
        &self,
        ctx: &mut Ctx<'_>,
        incarnation: u64,
        ticket: &Ticket,
        mut record: Record,
        tried: &[u64],
    ) -> Result<Option<Lease>, Error> {
        let mut lost = 0u32;
        loop {
            if record.incarnation != incarnation {
                return Err(Error::PoolNotFound);
            }
            // Ours even if expired since (a take of ours that landed late), or
            // a live twin's.
            let held = ours(&record, ticket.digest, tried)
                .or_else(|| record.pool.live_lease(ticket.digest, now_ms()))
                .copied();
            let Some(update) = record.pool.plan_cancel(ticket) else {
                return Ok(held);
            };
            record = self.write(ctx, &record, &update, &mut lost).await?;
        }
    }

    /// The answer for a lease held under our id: our own grant carries its
    /// full ttl (API.md: `expires_in` is the clamped ttl), an idempotent
    /// repeat of an earlier request's grant the time left.
    fn grant(&self, lease: &Lease, now_ms: u64, tried: &[u64]) -> Grant {
        let expires_in_ms = if tried.contains(&lease.expires_at_ms) {
            self.ttl_ms
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

    /// Writes `update`, planned from `read`, conditioned on `read`'s
    /// incarnation (and, by the old policy, on all of `read`).
    async fn write(
        &mut self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let pinned;
        let update = if self.policy.whole_item_writes {
            let mut all = update.clone();
            all.expect.extend(read.pool.pins());
            pinned = all;
            &pinned
        } else {
            update
        };
        let result = self
            .call(self.store.update(key, read.incarnation, update))
            .await;
        if matches!(result, Ok(Updated::Lost(_))) {
            self.stats.conflicts += 1;
        }
        result
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
        self.nap(failures, self.timing.retry_first, self.timing.retry_cap)
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
        // The old policy napped after every lost write.
        let immediate = if self.policy.whole_item_writes { 0 } else { 2 };
        if *lost <= immediate {
            return Ok(false);
        }
        let mut n = *lost - immediate;
        self.nap(&mut n, self.timing.conflict_first, self.timing.conflict_cap)
            .await
            .map_err(|()| Error::Contention)?;
        Ok(true)
    }

    /// Sleeps a full-jitter backoff in `[0, first · 2^(n-1)]`, capped, unless
    /// it would end past the answer-by time (then `Err`).
    async fn nap(&mut self, n: &mut u32, first: Duration, cap: Duration) -> Result<(), ()> {
        let window = first.saturating_mul(1u32 << (*n - 1).min(16)).min(cap);
        let nap = window.mul_f64(self.jitter.next_unit());
        if Instant::now() + nap + self.timing.call_timeout.min(Duration::from_millis(50))
            >= self.answer_by
        {
            return Err(());
        }
        tokio::time::sleep(nap).await;
        Ok(())
    }

    /// The old policy's poll: 15 ms doubling to 90 ms, jittered to ½–1×.
    fn unfair_poll_interval(&mut self, polls: u32) -> Duration {
        let full = Duration::from_millis(15)
            .saturating_mul(1u32 << polls.min(16))
            .min(Duration::from_millis(90));
        full.mul_f64(0.5 + 0.5 * self.jitter.next_unit())
    }

    /// How long a waiter sleeps: `ahead` live tickets are in front of it and
    /// its turn comes after `needed` more slots free up, on a pool of `count`
    /// slots; `pace` is the queue's speed as this waiter has seen it.
    fn poll_interval(
        &mut self,
        ahead: usize,
        needed: usize,
        count: u16,
        pace: &mut Pace,
    ) -> Duration {
        let timing = self.timing;
        let by_place = timing.by_place(needed, count);
        // The first nap after joining is at most `poll`: one early read tells
        // how fast the queue moves (a queue that moves faster than one place
        // per `poll` would otherwise never be seen to).
        let first = pace.last.is_none();
        let full = match pace.turn_in(ahead, Instant::now()) {
            Some(turn) => turn.clamp(timing.poll_min.min(by_place), by_place),
            None if first => by_place.min(timing.poll),
            None => by_place,
        };
        full.mul_f64(0.75 + 0.25 * self.jitter.next_unit())
    }
}

/// How fast the queue moves past one waiter: places advanced per second,
/// smoothed over its polls.
#[derive(Default)]
struct Pace {
    last: Option<(Instant, usize)>,
    per_second: Option<f64>,
}

impl Pace {
    /// When this waiter's turn may come, `ahead` places from the front at
    /// `now`; `None` until the queue has been seen to move.
    fn turn_in(&mut self, ahead: usize, now: Instant) -> Option<Duration> {
        if let Some((then, before)) = self.last {
            let seconds = now.saturating_duration_since(then).as_secs_f64();
            if seconds > 0.0 {
                let moved = before.saturating_sub(ahead) as f64 / seconds;
                self.per_second = Some(match self.per_second {
                    Some(rate) => 0.5 * rate + 0.5 * moved,
                    None => moved,
                });
            }
        }
        self.last = Some((now, ahead));
        let rate = self.per_second.filter(|r| *r > 0.0)?;
        Some(Duration::from_secs_f64(
            ((ahead + 1) as f64 / rate).min(3600.0),
        ))
    }
}

/// Jitter, so that waiters and retries spread out instead of moving in
/// lockstep. A tiny xorshift seeded from the OS RNG is plenty here.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        Jitter(crate::store::random_u64() | 1)
    }

    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_read_in_rounds_of_count_slots() {
        let timing = Timing::default();
        let ms = |n| Duration::from_millis(n);
        // Count 1: one round per place.
        assert_eq!(timing.by_place(1, 1), ms(70));
        assert_eq!(timing.by_place(2, 1), ms(140));
        // Count 4: the next four freed slots serve the first round.
        assert_eq!(timing.by_place(4, 4), ms(70));
        assert_eq!(timing.by_place(5, 4), ms(140));
        // A big pool's rounds are 4 wide; far back, every 2 s.
        assert_eq!(timing.by_place(9, 1000), ms(210));
        assert_eq!(timing.by_place(900, 4), ms(2000));
        // Count 0 (a pool shrunk to nothing) and nothing needed are sane.
        assert_eq!(timing.by_place(0, 0), ms(70));
    }

    #[test]
    fn waiters_poll_as_fast_as_the_queue_moves() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        assert_eq!(pace.turn_in(9, t0), None, "unknown until it moves");
        // Five places in 100 ms: 50 per second; five places to go: 100 ms.
        let turn = pace.turn_in(4, t0 + Duration::from_millis(100)).unwrap();
        assert_eq!(turn, Duration::from_millis(100));
        // Standing still halves the pace each time.
        let turn = pace.turn_in(4, t0 + Duration::from_millis(200)).unwrap();
        assert_eq!(turn, Duration::from_millis(200));
    }

    #[test]
    fn jitter_is_uniform_in_the_unit_interval() {
        let mut jitter = Jitter::new();
        let samples: Vec<f64> = (0..10_000).map(|_| jitter.next_unit()).collect();
        assert!(samples.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
