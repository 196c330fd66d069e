//! `POST …/borrow`: take a free slot, join the queue (or the backlog), wait
//! there until a slot is handed over, and give up in time.

use std::time::{Duration, Instant};

use crate::clock::now_ms;
use crate::domain::{BorrowPlan, Holder, Lease, WaitPlan};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::store::Record;

use super::harness::{write, write_landed, Harness};
use super::pacing::{Forecast, Pace};
use super::waiting_room::Pass;
use super::{Budget, Service};

mod backlog;

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

impl Service {
    /// `POST …/borrow`: the lowest free position, or, when none is free or
    /// others wait, a place in the queue until a slot is handed to this
    /// borrower or its wait ends.
    pub async fn borrow(
        &self,
        id: PoolId,
        request: BorrowRequest,
        call: &mut Budget,
    ) -> Result<Grant, Error> {
        self.borrow_key(id.key(), request, call, Who::Client).await
    }

    /// [`Service::borrow`] on the pool stored under `key`, for a client (a
    /// borrow about to wait takes a pass of the service's waiting budget
    /// first, see `waiting_room.rs`, and gives it back before answering) or
    /// for a pass itself (its ttl is not clamped: it covers a whole wait).
    pub(super) async fn borrow_key(
        &self,
        key: PoolKey,
        request: BorrowRequest,
        call: &mut Budget,
        who: Who,
    ) -> Result<Grant, Error> {
        let ttl_ms = match who {
            Who::Client => request.ttl_ms.min(self.limits.max_ttl_ms).max(1),
            Who::Pass => request.ttl_ms.max(1),
        };
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
            service: (who == Who::Client).then_some(self),
            key,
            lease: request.lease,
            holder: Holder {
                digest: request.lease.digest(),
                ttl_ms,
            },
            give_up,
            give_up_ms: now_ms() + (give_up - started).as_millis() as u64,
            max_waiters: self.limits.max_waiters,
            max_tickets: self.limits.max_tickets,
        };
        borrower.run(&mut ctx).await
    }
}

/// Who borrows: a client, or the waiting budget for one of its passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    Client,
    Pass,
}

/// One borrow in progress.
struct Borrower<'s> {
    /// The service whose waiting budget a client's borrow takes a pass of
    /// before it waits (`None`: a pass's own borrow, which never waits).
    service: Option<&'s Service>,
    key: PoolKey,
    lease: LeaseId,
    holder: Holder,
    /// When it stops waiting (and its wall-clock twin, stored in its ticket).
    give_up: Instant,
    give_up_ms: u64,
    max_waiters: usize,
    max_tickets: u64,
}

/// Where a borrow stands after its first writes.
enum Placed {
    /// A slot: the lease, and whether this request's own take granted it.
    Granted(Lease, bool),
    /// A ticket in the queue (its own, or a twin request's), joined at ms.
    Queued(Record, Holder, u64),
}

impl Borrower<'_> {
    async fn run(&self, ctx: &mut Harness<'_>) -> Result<Grant, Error> {
        // The backlog ticket item this request wrote, if any: its number and
        // the pool's incarnation.
        let mut backlog = None;
        // Its pass of the waiting budget, once it is about to wait.
        let mut pass = None;
        let result = self.borrow(ctx, &mut backlog, &mut pass).await;
        if let (Some(service), Some(pass)) = (self.service, pass) {
            service.leave_waiting_room(pass, ctx.stats).await;
        }
        if let Some((number, incarnation)) = backlog {
            self.end_backlog_ticket(ctx, number, incarnation).await;
        }
        result
    }

    async fn borrow(
        &self,
        ctx: &mut Harness<'_>,
        backlog: &mut Option<(u64, u64)>,
        pass: &mut Option<Pass>,
    ) -> Result<Grant, Error> {
        let record = ctx.load_existing(&self.key).await?;
        let incarnation = record.incarnation;
        let (record, mine, joined_ms) = match self.place(ctx, record, backlog, pass).await? {
            Placed::Granted(lease, own) => return Ok(self.grant(&lease, now_ms(), own)),
            Placed::Queued(record, mine, joined_ms) => (record, mine, joined_ms),
        };
        self.wait(ctx, incarnation, record, mine, joined_ms).await
    }

    /// Takes a pass of the waiting budget, unless it holds one (or is a
    /// pass's own borrow): just before a write that has it wait.
    async fn enter_waiting_room(
        &self,
        ctx: &mut Harness<'_>,
        pass: &mut Option<Pass>,
    ) -> Result<(), Error> {
        let Some(service) = self.service.filter(|_| pass.is_none()) else {
            return Ok(());
        };
        let wait_ms = self
            .give_up
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        *pass = service
            .enter_waiting_room(wait_ms, ctx.answer_by, ctx.stats)
            .await?;
        Ok(())
    }

    /// Takes a free slot, or joins the queue.
    async fn place(
        &self,
        ctx: &mut Harness<'_>,
        mut record: Record,
        backlog: &mut Option<(u64, u64)>,
        pass: &mut Option<Pass>,
    ) -> Result<Placed, Error> {
        let incarnation = record.incarnation;
        let mut lost = 0u32;
        // The grant times of the takes we tried: a lease of ours found with
        // one of them is this request's own grant.
        let mut tried: Vec<u64> = Vec::new();
        // A borrower that may wait and lost a take joins the queue instead of
        // racing for the next free slot (joins never collide).
        let mut take = true;
        let mut take_now = false;
        loop {
            if record.incarnation != incarnation {
                // Deleted (and maybe registered again) while we were at it.
                return Err(Error::PoolNotFound);
            }
            if let Some(repair) = record.pool.plan_repair(self.holder.digest, now_ms()) {
                record = write(ctx, &self.key, &record, &repair, &mut lost).await?;
                continue;
            }
            if let Some(lease) = self.own_take(&record, &tried) {
                // Ours even if expired since (a take that landed late).
                return Ok(Placed::Granted(lease, true));
            }
            let now = now_ms();
            let may_wait = Instant::now() < self.give_up;
            let state = record.pool.state(now);
            let waiting = state.waiting as usize;
            // More slots free than borrowers wait.
            let spare = state.available as usize > waiting;
            // A borrower that may wait joins behind live waiters rather than
            // take a spare slot: the queue's head hands the lowest free slots
            // on in order, and a take would race it for the lowest (a join
            // never collides). Measured: taking spare slots over waiters
            // cost 3.0 billed writes a cycle at 4 to 32 clients on count 32,
            // joining 2.5–2.7.
            // It takes one when it could not wait: the queue is full, or the
            // service's waiting budget is in use (`take_now`).
            let may_take =
                !may_wait || (take && (waiting == 0 || waiting >= self.max_waiters || take_now));
            let plan = record.pool.plan_borrow_or_join(
                self.holder,
                self.give_up_ms,
                now,
                self.max_waiters,
                may_take,
            );
            match plan {
                BorrowPlan::Held(lease) => return Ok(Placed::Granted(lease, false)),
                BorrowPlan::Queued(holder) => return Ok(Placed::Queued(record, holder, now)),
                // Given up before this request was seen, or no place to wait.
                BorrowPlan::Cancelled | BorrowPlan::Full => return Err(Error::Exhausted),
                BorrowPlan::Backlog if !may_wait => return Err(Error::Exhausted),
                BorrowPlan::Backlog => {
                    self.enter_waiting_room(ctx, pass).await?;
                    return self.wait_in_backlog(ctx, incarnation, backlog).await;
                }
                BorrowPlan::Prune(update) => {
                    record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                }
                BorrowPlan::Take { update, .. } => {
                    tried.push(now);
                    let landed;
                    (record, landed) =
                        write_landed(ctx, &self.key, &record, &update, &mut lost).await?;
                    // A take that landed is this request's grant, answered
                    // as its own write left the pool: the record after it
                    // may be of a later instant (a compaction lands on what
                    // others wrote since), when a short lease may have
                    // expired and its slot been taken again. Answering 409
                    // then would deny a grant that was made.
                    let own = ctx.landed.take().filter(|_| landed);
                    if let Some(lease) = own.as_ref().and_then(|own| self.own_take(own, &tried)) {
                        return Ok(Placed::Granted(lease, true));
                    }
                    if own.is_some() && self.taken_back(&record) {
                        return Err(Error::Exhausted);
                    }
                    // Lost unless the lease it wrote is there (checked above).
                    take = false;
                }
                BorrowPlan::Join(update) => {
                    if !may_wait {
                        // `wait: 0` (or no time left): no waiting at all.
                        return Err(Error::Exhausted);
                    }
                    match self.enter_waiting_room(ctx, pass).await {
                        Ok(()) => {}
                        // A borrower that gets a free slot at once is never
                        // refused for the budget: it takes the spare one.
                        Err(Error::Busy { .. }) if spare && take => {
                            take_now = true;
                            continue;
                        }
                        Err(error) => return Err(error),
                    }
                    let (joined, landed) =
                        write_landed(ctx, &self.key, &record, &update, &mut lost).await?;
                    // Once its ticket was in the queue, only the wait decides:
                    // the record handed back may already show the ticket
                    // served (its grant, even expired and reused) or taken
                    // out by a return of its lease id (409), never a reason
                    // to join again.
                    if landed || joined.pool.queue().iter().any(|t| t.holder == self.holder) {
                        return Ok(Placed::Queued(joined, self.holder, now));
                    }
                    record = joined;
                }
            }
        }
    }

    /// After a take of ours landed whose own item does not show its lease
    /// (a store that answers a write with a later item): whether `record`
    /// holds neither a lease nor a ticket of our lease id. A return of that
    /// id took the lease back: the client gave the borrow up, so it answers
    /// 409 and never takes or joins again (nothing stays held for a lease
    /// id returned while its borrow ran).
    fn taken_back(&self, record: &Record) -> bool {
        let digest = self.holder.digest;
        !record.pool.leases().iter().any(|l| l.digest == digest)
            && record.pool.ticket_of(digest).is_none()
    }

    /// The lease one of this request's takes (granted at one of the `tried`
    /// times) wrote, if `record` holds it.
    fn own_take(&self, record: &Record, tried: &[u64]) -> Option<Lease> {
        record
            .pool
            .leases()
            .into_iter()
            .find(|l| l.digest == self.holder.digest && tried.contains(&l.granted_ms))
    }

    /// Waits in the queue until a slot is handed to `mine`, handing free
    /// slots to the head when it is this reader's turn to, and gives up in
    /// time to cancel its ticket.
    async fn wait(
        &self,
        ctx: &mut Harness<'_>,
        incarnation: u64,
        mut record: Record,
        mine: Holder,
        joined_ms: u64,
    ) -> Result<Grant, Error> {
        let mut lost = 0u32;
        let mut pace = Pace::default();
        let mut forecast = Forecast::default();
        // The first in line hands free slots on at once; another waiter owed
        // one only once owed for two head polls (the head is gone), or as its
        // wait ends: waiters that read the same state plan the same write,
        // and all but one lose it. Since when its reads found it owed one:
        let mut owed_since: Option<Instant> = None;
        loop {
            if record.incarnation != incarnation {
                return Err(Error::PoolNotFound);
            }
            let now = now_ms();
            // Read once: a waiter owed a slot hands it on before it gives up.
            let ending = Instant::now() >= self.give_up;
            let head_late = owed_since.is_some_and(|t| t.elapsed() >= ctx.timing.poll * 2);
            if let Some(repair) = record.pool.plan_repair(mine.digest, now) {
                record = write(ctx, &self.key, &record, &repair, &mut lost).await?;
                continue;
            }
            let (ahead, needed) = match record.pool.plan_wait(&mine, joined_ms, now) {
                WaitPlan::Granted(lease) => return Ok(self.grant(&lease, now, false)),
                // Cancelled by a return of its lease id, or pruned as dead.
                WaitPlan::Gone => return Err(Error::Exhausted),
                WaitPlan::Waiting {
                    duty: Some(update),
                    ahead,
                    ..
                } if ahead == 0 || ending || head_late => {
                    owed_since = None;
                    record = write(ctx, &self.key, &record, &update, &mut lost).await?;
                    continue;
                }
                WaitPlan::Waiting {
                    duty: Some(_),
                    ahead,
                    ..
                } => {
                    owed_since.get_or_insert_with(Instant::now);
                    (ahead, 0)
                }
                WaitPlan::Waiting { ahead, needed, .. } => {
                    owed_since = None;
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
            if ending {
                return self
                    .give_up(ctx, incarnation, record, mine, joined_ms)
                    .await;
            }
            let nap = ctx
                .timing
                .poll_interval(ahead, needed, &record.pool, now, &mut pace);
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
            record = ctx.wait_then_load(nap, &self.key).await?;
        }
    }

    /// At the end of its wait: takes its ticket out of the queue, or finds
    /// the slot handed to it meanwhile (then the grant stands: a slot is
    /// never left to a borrower that answered 409).
    async fn give_up(
        &self,
        ctx: &mut Harness<'_>,
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
