//! The dispatcher's step on one pool: hand-offs owed to async tickets,
//! their grants recorded, tickets that left the queue ungranted ended,
//! admission, and when to look again. What to do with each listed ticket is
//! [`Pool::ticket_step`]'s; the writes it names are made here.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{
    DeliveryClaim, LeaseDigest, Pool, ReturnPlan, TicketGrant, TicketItem, TicketState, TicketStep,
    GAP_MS,
};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::{write, Harness};
use crate::service::{Budget, Service};
use crate::store::{Record, TicketStore, TicketUpdated, Updated};

use super::admit;
use super::claim::{claimed_by_its_recorder, Claimed};

/// A grant the dispatcher recorded, to deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToDeliver {
    pub item: TicketItem,
    pub grant: TicketGrant,
    /// The delivery claim the step took for its first attempt, if the step
    /// was made for a caller that delivers at once.
    pub claim: Option<DeliveryClaim>,
}

/// How a step made for a caller that delivers at once claims what it hands
/// out.
#[derive(Clone, Copy)]
pub struct Claiming<'h> {
    /// How long a claim covers (counting the first attempt).
    pub span: Duration,
    /// Where each delivery goes as soon as its claim lands, so that it
    /// starts before the step's other writes (else: in [`Step::deliver`]).
    pub hand: Option<&'h (dyn Fn(ToDeliver) + Send + Sync)>,
}

/// What one dispatcher step did and what it leaves to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Granted tickets not yet delivered (recorded now or before).
    pub deliver: Vec<ToDeliver>,
    /// Deliveries handed out as they were claimed ([`Claiming::hand`]).
    pub handed: usize,
    /// When the pool next needs a step without any write to it: a lease
    /// expiry while async tickets wait, or a ticket's wait ending (Unix ms).
    pub wake_ms: Option<u64>,
    /// Whether the pool still has async work (its flag).
    pub active: bool,
    /// Tickets in line: the backlog's numbers and the queue's live tickets.
    pub depth: u64,
    /// The earliest lapse of another delivery's claim seen: if that delivery
    /// died, its ticket is delivered again after (Unix ms).
    pub claim_lapses_ms: Option<u64>,
    /// The tickets found claimed by another dispatcher, and when each claim
    /// lapses (Unix ms).
    pub claimed_elsewhere: Vec<(LeaseDigest, u64)>,
}

/// One round of a step over the listed tickets: the pool's key, the round's
/// time, the step's findings, its lost writes in a row, and the tickets it
/// leaves be (their deliveries under way: the caller's, or claimed).
pub(super) struct Round<'r> {
    pub(super) key: &'r PoolKey,
    pub(super) now: u64,
    pub(super) step: &'r mut Step,
    pub(super) lost: &'r mut u32,
    pub(super) leave: &'r mut Vec<LeaseDigest>,
}

/// How soon a step that could not finish (a store call failed after it
/// claimed deliveries) has the pool stepped again.
const AGAIN_SOON_MS: u64 = 1_000;

/// How a round of a step ended.
enum Next {
    /// It wrote: another round.
    Again,
    /// Nothing more to do.
    Done,
    /// A call on some tickets failed, the round's others done: a step soon
    /// does the rest.
    Partly(Error),
}

impl Service {
    /// The dispatcher's work on one pool after a change (or at a wake):
    /// hands free slots owed to async tickets at the head, records their
    /// grants, ends tickets that left the queue ungranted, admits backlog
    /// tickets, and says when to look again. Delivery is the caller's.
    ///
    /// `delivering`: the tickets whose delivery the caller is making; they
    /// are left be (their delivery's end records them).
    pub async fn dispatch_step(
        &self,
        key: &PoolKey,
        delivering: &[LeaseDigest],
        call: &mut Budget,
    ) -> Result<Step, Error> {
        self.step_pool(key, delivering, None, call).await
    }

    /// [`Service::dispatch_step`] for a caller that delivers what it hands
    /// out at once: each grant's delivery claim (for `claim_for`, and
    /// counting its first attempt) is taken in the write that records the
    /// grant, side by side, so that no other dispatcher's step hands out
    /// the same delivery meanwhile; a grant whose claim another holds is
    /// not handed out.
    pub async fn dispatch_step_to_deliver(
        &self,
        key: &PoolKey,
        delivering: &[LeaseDigest],
        claim_for: Duration,
        call: &mut Budget,
    ) -> Result<Step, Error> {
        let claiming = Claiming {
            span: claim_for,
            hand: None,
        };
        self.step_pool(key, delivering, Some(claiming), call).await
    }

    /// [`Service::dispatch_step_to_deliver`] as `claiming` says: with its
    /// `hand`, each delivery is handed to it as soon as it is claimed,
    /// before the step's other writes (counted in [`Step::handed`], not
    /// listed in [`Step::deliver`]).
    pub async fn dispatch_step_claiming(
        &self,
        key: &PoolKey,
        delivering: &[LeaseDigest],
        claiming: Claiming<'_>,
        call: &mut Budget,
    ) -> Result<Step, Error> {
        self.step_pool(key, delivering, Some(claiming), call).await
    }

    async fn step_pool(
        &self,
        key: &PoolKey,
        delivering: &[LeaseDigest],
        claiming: Option<Claiming<'_>>,
        call: &mut Budget,
    ) -> Result<Step, Error> {
        // A claim lasts seconds: a ticket found claimed is left be for the
        // rest of the step, as are those the caller delivers.
        let mut leave = delivering.to_vec();
        let tickets = self.ticket_store()?;
        let mut ctx = self.ctx(call, Duration::ZERO);
        let Some(mut record) = ctx.load(key).await? else {
            return Ok(Step::default());
        };
        let mut lost = 0u32;
        let mut step = Step::default();
        let mut cut_short = false;
        // Each round writes the pool at most twice (an unlisting, an
        // admission); a pool settles in a few.
        let handing = claiming.is_some_and(|c| c.hand.is_some());
        for _ in 0..64 {
            let (handed, before) = (step.handed, record.clone());
            let round = Round {
                key,
                now: now_ms(),
                step: &mut step,
                lost: &mut lost,
                leave: &mut leave,
            };
            match self
                .round(&mut ctx, tickets, claiming, record.clone(), round)
                .await
            {
                Ok((next, Next::Again)) => {
                    record = next;
                    // A step that hands its deliveries out as it goes ends
                    // with the round that handed some, unless a free slot is
                    // owed to the queue or its own writes granted async
                    // tickets (a return of a slot nobody will use hands it
                    // on): grants made since by other writes sent wakes of
                    // their own, and its invocation (a wake queue poller's)
                    // is wanted for them.
                    let owed = record.pool.plan_serve(now_ms()).is_some()
                        || record.pool.granted_async_since(&before.pool);
                    if handing && step.handed > handed && !owed {
                        break;
                    }
                }
                Ok((next, Next::Done)) => {
                    record = next;
                    break;
                }
                Ok((next, Next::Partly(err))) => {
                    tracing::warn!(error = %err, "a step's call failed: its other tickets done");
                    record = next;
                    cut_short = true;
                    break;
                }
                // Deliveries it claimed are made whatever failed after: a
                // step soon does the rest (unclaimed, a later step hands
                // them out again, as it does after a crash).
                Err(err) if step.handed > 0 || step.deliver.iter().any(|d| d.claim.is_some()) => {
                    tracing::warn!(error = %err, "a step failed after claiming deliveries");
                    cut_short = true;
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        if let Some(update) = record.pool.plan_settle().filter(|_| !cut_short) {
            // Its writes stop invoking the dispatcher (a lost settle: work
            // arrived meanwhile, and its write invoked a step).
            if let Ok(Updated::Written(settled)) = ctx.write(key, &record, &update).await {
                record = settled;
            }
        }
        let now = now_ms();
        step.finish(&record.pool, now);
        if cut_short {
            let soon = now + AGAIN_SOON_MS;
            step.wake_ms = Some(step.wake_ms.map_or(soon, |w| w.min(soon)));
        }
        Ok(step)
    }

    /// One round of a step: a prune of dead waiters in the backlog's way, or
    /// a hand-off owed to async tickets, or a visit of the listed tickets and
    /// then an admission. The record after it, and how it ended.
    async fn round(
        &self,
        ctx: &mut Harness<'_>,
        tickets: &dyn TicketStore,
        claiming: Option<Claiming<'_>>,
        record: Record,
        round: Round<'_>,
    ) -> Result<(Record, Next), Error> {
        let (key, now) = (round.key, round.now);
        // Dead waiters filling the queue would keep the backlog out.
        if let Some(update) = record
            .pool
            .plan_prune_for_backlog(now, self.limits.max_waiters)
        {
            let pruned = write(ctx, key, &record, &update, round.lost).await?;
            return Ok((pruned, Next::Again));
        }
        let async_queued = record
            .pool
            .queue()
            .iter()
            .any(|t| record.pool.listed_number(t.holder.digest).is_some());
        if async_queued {
            if let Some(update) = record.pool.plan_serve(now) {
                let served = write(ctx, key, &record, &update, round.lost).await?;
                return Ok((served, Next::Again));
            }
        }
        // Listed async tickets: granted, or out of the queue ungranted. Before
        // admission, whose backlog read and write a grant need not wait for
        // (a return that handed its slot on left the queue room).
        let (record, next) = self
            .visit_listed(ctx, tickets, claiming, record, round)
            .await;
        // Admission whatever the visit left (a ticket whose call failed
        // must not keep the backlog out).
        match (
            admit(ctx, key, &record, self.limits.max_waiters).await?,
            next,
        ) {
            (Some(admitted), Next::Partly(err)) => Ok((admitted, Next::Partly(err))),
            (Some(admitted), _) => Ok((admitted, Next::Again)),
            (None, next) => Ok((record, next)),
        }
    }

    /// Visits the listed async tickets (but those it leaves be): the record
    /// after the round's writes, and how the round ended (`Again` when it
    /// unlisted some). The
    /// tickets are items of their own: they are read side by side, the
    /// grants handed to them recorded side by side (and, with `claiming`,
    /// claimed in the same writes); the tickets that ended leave the list
    /// in one write of the pool. A ticket whose call failed is left for a
    /// later step, the others done, and the first failure reported after.
    async fn visit_listed(
        &self,
        ctx: &mut Harness<'_>,
        tickets: &dyn TicketStore,
        claiming: Option<Claiming<'_>>,
        mut record: Record,
        round: Round<'_>,
    ) -> (Record, Next) {
        let Round {
            key,
            now,
            step,
            lost,
            leave,
        } = round;
        let handed = step.deliver.len();
        let mut failed: Option<Error> = None;
        // A ticket waiting in the queue, its wait not over and no slot
        // handed to it, needs no read: nothing to do for it.
        let due: Vec<LeaseDigest> = record
            .pool
            .line()
            .listed
            .iter()
            .map(|(digest, _)| *digest)
            .filter(|digest| !leave.contains(digest) && record.pool.listed_needs_read(*digest, now))
            .collect();
        let items = ctx
            .side_by_side(due.iter().map(|digest| tickets.ticket(key, *digest)))
            .await;
        let mut unlist = Vec::new();
        let mut grants = Vec::new();
        for (digest, item) in due.into_iter().zip(items) {
            let item = match item {
                Ok(Some(item)) => item,
                // No item (a bug, or deleted): unlist it.
                Ok(None) => {
                    unlist.push(digest);
                    continue;
                }
                Err(err) => {
                    failed.get_or_insert(err.into());
                    continue;
                }
            };
            match record.pool.ticket_step(&item, now) {
                TicketStep::Record { grant, live } => grants.push((item, grant, live)),
                ticket_step => {
                    let round = Round {
                        key,
                        now,
                        step: &mut *step,
                        lost: &mut *lost,
                        leave: &mut *leave,
                    };
                    match self
                        .visit(ctx, round, record.clone(), digest, item, ticket_step)
                        .await
                    {
                        Ok((visited, ended)) => {
                            record = visited;
                            if ended {
                                unlist.push(digest);
                            }
                        }
                        Err(err) => {
                            failed.get_or_insert(err);
                        }
                    }
                }
            }
        }
        // A ticket that moved already (cancelled, expired, granted by
        // another) is not written: `may_become` says so without a call.
        let (grants, moved): (Vec<_>, Vec<_>) = grants
            .into_iter()
            .partition(|(item, grant, _)| item.state.may_become(&TicketState::Granted(*grant)));
        // Granted but undelivered, found this round: with `claiming`, claimed
        // beside the grants' writes.
        let redeliver = step.deliver.split_off(handed);
        let mut not_recorded = Vec::new();
        match claiming {
            Some(claiming) => {
                // Under way whatever their claims' outcome: left be by the
                // step's later rounds.
                leave.extend(redeliver.iter().map(|d| d.item.digest()));
                let recorded = self
                    .record_and_claim(ctx, tickets, key, claiming.span, grants, redeliver)
                    .await;
                for outcome in recorded {
                    match outcome {
                        Claimed::Deliver(delivery) => {
                            leave.push(delivery.item.digest());
                            match claiming.hand {
                                Some(hand) => {
                                    step.handed += 1;
                                    hand(delivery);
                                }
                                None => step.deliver.push(delivery),
                            }
                        }
                        Claimed::Elsewhere(digest, until_ms) => {
                            leave.push(digest);
                            step.claimed_until(digest, until_ms);
                        }
                        Claimed::NotRecorded(item, live) => not_recorded.push((item, live)),
                        Claimed::Passed => {}
                        Claimed::Failed(err) => {
                            failed.get_or_insert(err);
                        }
                    }
                }
            }
            None => {
                step.deliver.extend(redeliver);
                let recorded = ctx
                    .side_by_side(grants.iter().map(|(item, grant, _)| {
                        tickets.record_grant(key, item.digest(), &item.state, *grant, None)
                    }))
                    .await;
                for ((item, grant, live), outcome) in grants.into_iter().zip(recorded) {
                    match outcome {
                        Ok(TicketUpdated::Written(item)) => step.deliver.push(ToDeliver {
                            item,
                            grant,
                            claim: None,
                        }),
                        // Its recorder's (with a live claim): looked at again
                        // when the claim lapses.
                        Ok(TicketUpdated::Lost(now_as)) => {
                            match claimed_by_its_recorder(&now_as, grant, now) {
                                Some(until_ms) => {
                                    leave.push(now_as.digest());
                                    step.claimed_until(now_as.digest(), until_ms);
                                }
                                None => not_recorded.push((now_as, live)),
                            }
                        }
                        Ok(TicketUpdated::Gone) => not_recorded.push((item, live)),
                        Err(err) => {
                            failed.get_or_insert(err.into());
                        }
                    }
                }
            }
        }
        not_recorded.extend(moved.into_iter().map(|(item, _, live)| (item, live)));
        for (item, live) in not_recorded {
            let digest = item.digest();
            // Cancelled or expired before its grant was recorded: nobody
            // will use the slot. (Recorded `granted` by another dispatcher
            // instead: its delivery, its slot.)
            if live && item.state.is_final() {
                if let ReturnPlan::Return(_, update) = record.pool.plan_return(digest, now) {
                    match write(ctx, key, &record, &update, lost).await {
                        Ok(returned) => record = returned,
                        Err(err) => {
                            // Still listed: a later step returns it.
                            failed.get_or_insert(err);
                            continue;
                        }
                    }
                }
            }
            if item.state.is_final() {
                unlist.push(digest);
            }
        }
        let mut next = Next::Done;
        if let Some(update) = record.pool.plan_unlist_all(&unlist) {
            match write(ctx, key, &record, &update, lost).await {
                Ok(unlisted) => {
                    record = unlisted;
                    next = Next::Again;
                }
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        match failed {
            Some(err) => (record, Next::Partly(err)),
            None => (record, next),
        }
    }
}

impl Step {
    /// The granted ticket of `item` is delivered again (its delivery was
    /// cut short, or is under way unclaimed): unclaimed, for the caller.
    pub(super) fn redeliver(&mut self, item: TicketItem, grant: TicketGrant) {
        self.deliver.push(ToDeliver {
            item,
            grant,
            claim: None,
        });
    }

    /// The ticket of `digest` is another's delivery until `until_ms`: the
    /// step looks at it again then (in case its claimer died).
    pub(super) fn claimed_until(&mut self, digest: LeaseDigest, until_ms: u64) {
        self.claimed_elsewhere.push((digest, until_ms));
        self.claim_lapses_ms = Some(self.claim_lapses_ms.map_or(until_ms, |w| w.min(until_ms)));
    }

    /// The step's outcome from the pool as it leaves it: each grant to
    /// deliver once, the pool's flag and depth, and when to step again.
    fn finish(&mut self, pool: &Pool, now: u64) {
        // Rounds see the same granted tickets again.
        self.deliver.sort_by_key(|d| d.item.digest());
        self.deliver.dedup_by_key(|d| d.item.digest());
        self.active = pool.line().active;
        self.depth =
            pool.line().next.saturating_sub(pool.line().admitted) + pool.waiting(now) as u64;
        let waiting_asyncs: Vec<u64> = pool
            .queue()
            .iter()
            .filter(|t| pool.listed_number(t.holder.digest).is_some())
            .map(|t| t.give_up.dead_from_ms())
            .collect();
        if !waiting_asyncs.is_empty() {
            // A lease expiring frees a slot with no write to see.
            let expiry = pool.nth_expiry(1, now);
            self.wake_ms = waiting_asyncs.into_iter().chain(expiry).min();
        }
        if !self.deliver.is_empty() || self.handed > 0 {
            // Deliveries under way end within the bound; a step then unlists
            // them (or delivers again what a crash cut short).
            let soon = now + 30_000;
            self.wake_ms = Some(self.wake_ms.map_or(soon, |w| w.min(soon)));
        }
        if let Some(lapse) = self.claim_lapses_ms {
            // Another's delivery: look again when its claim lapses (it
            // renews it before each attempt while it lives).
            let at = lapse.max(now);
            self.wake_ms = Some(self.wake_ms.map_or(at, |w| w.min(at)));
        }
        if pool.line().has_backlog() {
            // A backlog that admission left waits for a change, and every
            // change invokes a step (a write of the pool, a new ticket item):
            // a ticket leaving the queue or the list, a ticket written for
            // the next number. Only a number whose ticket was never written
            // needs time: admission passes it GAP_MS after a later ticket was
            // written, which is now at the latest. (A backlog ticket whose
            // wait ends needs no step: it reads `expired` at once, and
            // admission passes it when it comes to it.)
            let at = now + GAP_MS;
            self.wake_ms = Some(self.wake_ms.map_or(at, |w| w.min(at)));
        }
    }
}
