//! Async mode in the service: enqueue, a ticket's status, cancel, admission
//! from the backlog, and the dispatcher's step (everything but the callback
//! itself, which is `crate::dispatch`'s). See `docs/DESIGN.md`.

use super::*;
use crate::domain::{
    Callback, Change, LeaseDigest, TicketGrant, TicketItem, TicketState, MAX_ADMITS,
};
use crate::store::{PutTicket, TicketStore, TicketUpdated};

/// The most async tickets admitted to a pool's queue at once: what async
/// tickets add to the pool item (a queue entry and a `y` listing, about 35
/// bytes each) stays near half a kilobyte, so that a pool of count 10 with a
/// full window is still one write unit. Admission refills it by halves.
pub const ASYNC_WINDOW: usize = 16;

/// An enqueue after validation (clamping is the service's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnqueueRequest {
    pub ttl_ms: u64,
    /// `None`: the longest wait the service allows.
    pub wait_ms: Option<u64>,
    pub lease: LeaseId,
    pub callback: Callback,
}

/// What an enqueue answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    pub ticket: u64,
    /// Tickets before it, at most (some may have ended).
    pub ahead: u64,
}

/// A ticket as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketReport {
    pub item: TicketItem,
    /// While it waits: tickets before it, at most.
    pub ahead: Option<u64>,
}

/// A grant the dispatcher recorded, to deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToDeliver {
    pub item: TicketItem,
    pub grant: TicketGrant,
}

/// What one dispatcher step did and what it leaves to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Granted tickets not yet delivered (recorded now or before).
    pub deliver: Vec<ToDeliver>,
    /// When the pool next needs a step without any write to it: a lease
    /// expiry while async tickets wait, or a ticket's wait ending (Unix ms).
    pub wake_ms: Option<u64>,
    /// Whether the pool still has async work (its flag).
    pub active: bool,
    /// Tickets in line: the backlog's numbers and the queue's live tickets.
    pub depth: u64,
}

/// The void item that fills a ticket number whose request found its lease
/// id's ticket already there: admission steps over it at once.
fn void(number: u64, incarnation: u64, now_ms: u64) -> TicketItem {
    let mut digest = [0xffu8; 8];
    digest[..].copy_from_slice(&(!number).to_be_bytes());
    TicketItem {
        number,
        holder: Holder {
            digest: crate::domain::LeaseDigest(digest),
            ttl_ms: 1,
        },
        incarnation,
        joined_ms: now_ms,
        wait_until_ms: now_ms,
        callback: None,
        state: TicketState::Cancelled,
        attempts: 0,
    }
}

impl Service {
    fn ticket_store(&self) -> Result<&dyn TicketStore, Error> {
        self.tickets.as_deref().ok_or_else(|| {
            Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "async mode is not configured on this server",
            ))
        })
    }

    /// `POST …/enqueue`: a ticket in the pool's line, or the one this lease
    /// id has already (idempotent). One write to the pool item (its ticket
    /// number) and one ticket item written.
    pub async fn enqueue(
        &self,
        id: PoolId,
        request: EnqueueRequest,
        call: &mut Call,
    ) -> Result<Enqueued, Error> {
        let tickets = self.ticket_store()?;
        let key = id.key();
        let digest = request.lease.digest();
        let checked = tokio::time::timeout(
            Duration::from_secs(2),
            self.callbacks.check(&request.callback.url),
        )
        .await
        .map_err(|_| Error::BadRequest("callback url's host did not resolve in time".into()))?;
        checked.map_err(|refusal| Error::BadRequest(refusal.to_string()))?;
        let mut ctx = self.ctx(call, Duration::ZERO);
        // A repeat finds its ticket without taking a number (and leaving a
        // gap in the line).
        if let Some(item) = ctx.call(tickets.ticket(&key, digest)).await? {
            let record = ctx.load_existing(&key).await?;
            if record.incarnation == item.incarnation {
                let ahead = ahead_of(&record.pool, &item, now_ms());
                return Ok(Enqueued {
                    ticket: item.number,
                    ahead: ahead.unwrap_or(0),
                });
            }
            // A ticket of a pool deleted since: this lease id starts afresh.
            ctx.call(tickets.delete_ticket(&key, digest)).await?;
        }
        let record = ctx
            .call(ctx.store.number_ticket(&key))
            .await?
            .ok_or(Error::PoolNotFound)?;
        let number = record.pool.line().next - 1;
        // Written after the number was taken: admission passes a missing
        // number only once a later ticket is older than GAP_MS.
        let now = now_ms();
        let wait_ms = request
            .wait_ms
            .unwrap_or(self.limits.max_async_wait_ms)
            .min(self.limits.max_async_wait_ms);
        let item = TicketItem {
            number,
            holder: Holder {
                digest,
                ttl_ms: request.ttl_ms.min(self.limits.max_ttl_ms).max(1),
            },
            incarnation: record.incarnation,
            joined_ms: now,
            wait_until_ms: now.saturating_add(wait_ms),
            callback: Some(request.callback),
            state: TicketState::Waiting,
            attempts: 0,
        };
        let ahead =
            |pool: &Pool| number.saturating_sub(pool.line().admitted) + pool.waiting(now) as u64;
        let put = self.put_ticket(&mut ctx, &key, &item).await;
        ctx.changed(&key);
        match put? {
            None => Ok(Enqueued {
                ticket: number,
                ahead: ahead(&record.pool),
            }),
            Some(existing) => {
                // A twin request wrote this lease id's ticket first.
                let _ = ctx
                    .call(tickets.put_ticket(&key, &void(number, record.incarnation, now)))
                    .await;
                Ok(Enqueued {
                    ticket: existing.number,
                    ahead: ahead_of(&record.pool, &existing, now).unwrap_or(0),
                })
            }
        }
    }

    /// Writes a new ticket item: `None` when it is ours (written now, or by
    /// an earlier attempt whose answer was lost), else the ticket of the
    /// same lease id that is there.
    async fn put_ticket(
        &self,
        ctx: &mut Ctx<'_>,
        key: &PoolKey,
        item: &TicketItem,
    ) -> Result<Option<TicketItem>, Error> {
        let tickets = self.ticket_store()?;
        let mut failures = 0u32;
        loop {
            match ctx.call(tickets.put_ticket(key, item)).await {
                Ok(PutTicket::Created) => return Ok(None),
                Ok(PutTicket::Exists(existing)) => {
                    let ours =
                        existing.number == item.number && existing.incarnation == item.incarnation;
                    return Ok((!ours).then_some(existing));
                }
                Err(err) => ctx.retry_after(err, &mut failures).await?,
            }
        }
    }

    /// `POST …/ticket`: the ticket of this lease id, with its place while it
    /// waits.
    pub async fn ticket(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Call,
    ) -> Result<TicketReport, Error> {
        let tickets = self.ticket_store()?;
        let key = id.key();
        let mut ctx = self.ctx(call, Duration::ZERO);
        let record = ctx.load(&key).await?;
        let mut item = ctx.call(tickets.ticket(&key, lease.digest())).await?;
        if let Some(record) = &record {
            if let Some(found) = item.take() {
                item = Some(expire_if_over(&mut ctx, tickets, &key, record, found).await?);
            }
        }
        report(record.as_ref(), item)
    }

    /// `POST …/cancel`: a waiting ticket ends `cancelled` and leaves the
    /// line; one granted already keeps its grant (return its lease to give
    /// it up). Idempotent.
    pub async fn cancel(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Call,
    ) -> Result<TicketReport, Error> {
        let tickets = self.ticket_store()?;
        let key = id.key();
        let digest = lease.digest();
        let mut ctx = self.ctx(call, Duration::ZERO);
        let found = ctx.call(tickets.ticket(&key, digest)).await?;
        let Some(mut record) = ctx.load(&key).await?.filter(|r| {
            found
                .as_ref()
                .is_none_or(|t| t.incarnation == r.incarnation)
        }) else {
            // Its pool was deleted: nothing to cancel.
            return report(None, found);
        };
        let found = found.ok_or(Error::TicketNotFound)?;
        let mut item = expire_if_over(&mut ctx, tickets, &key, &record, found).await?;
        if item.state == TicketState::Waiting {
            item = match ctx
                .call(tickets.set_ticket_state(
                    &key,
                    digest,
                    &TicketState::Waiting,
                    &TicketState::Cancelled,
                ))
                .await?
            {
                TicketUpdated::Written(item) | TicketUpdated::Lost(item) => item,
                TicketUpdated::Gone => return Err(Error::TicketNotFound),
            };
        }
        if item.state == TicketState::Cancelled {
            // Out of the queue now (admission steps over it in the backlog);
            // a slot handed to it meanwhile goes back (its holder gave up).
            // Read again: an admission may have queued it since our read.
            record = ctx.load_existing(&key).await?;
            let mut lost = 0u32;
            while let ReturnPlan::Return(_, update) | ReturnPlan::Cancel(update) =
                record.pool.plan_return(digest, now_ms())
            {
                record = write(&mut ctx, &key, &record, &update, &mut lost).await?;
            }
            if let Some(update) = record.pool.plan_unlist(digest) {
                write(&mut ctx, &key, &record, &update, &mut lost).await?;
            }
        }
        let ahead = ahead_of(&record.pool, &item, now_ms());
        Ok(TicketReport { item, ahead })
    }

    /// The dispatcher's work on one pool after a change (or at a wake):
    /// admits backlog tickets, hands free slots owed to async tickets at the
    /// head, records their grants, ends tickets that left the queue
    /// ungranted, and says when to look again. Delivery is the caller's.
    ///
    /// `delivering`: the tickets whose delivery the caller is making; they
    /// are left be (their delivery's end records them).
    pub async fn dispatch_step(
        &self,
        key: &PoolKey,
        delivering: &[LeaseDigest],
        call: &mut Call,
    ) -> Result<Step, Error> {
        let tickets = self.ticket_store()?;
        let mut ctx = self.ctx(call, Duration::ZERO);
        let Some(mut record) = ctx.load(key).await? else {
            return Ok(Step::default());
        };
        let mut lost = 0u32;
        let mut step = Step::default();
        // Each round writes at most once; a pool settles in a few.
        for _ in 0..64 {
            let now = now_ms();
            if let Some(admitted) = admit(&mut ctx, key, &record, self.limits.max_waiters).await? {
                record = admitted;
                continue;
            }
            let async_queued = record
                .pool
                .queue()
                .iter()
                .any(|t| record.pool.async_number(t.holder.digest).is_some());
            if async_queued {
                if let Some(update) = record.pool.plan_serve(now) {
                    record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                    continue;
                }
            }
            // Listed async tickets: granted, or out of the queue ungranted.
            let mut changed = false;
            for (digest, _) in record.pool.line().asyncs.clone() {
                if delivering.contains(&digest) {
                    continue;
                }
                // A ticket waiting in the queue, its wait not over and no
                // slot handed to it, needs no read: nothing to do for it.
                let waits = record
                    .pool
                    .ticket_of(digest)
                    .is_some_and(|(_, t)| t.is_live(now));
                if waits && record.pool.lease_of(digest).is_none() {
                    continue;
                }
                let Some(item) = ctx.call(tickets.ticket(key, digest)).await? else {
                    // No item (a bug, or deleted): unlist it.
                    if let Some(update) = record.pool.plan_unlist(digest) {
                        record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                        changed = true;
                    }
                    continue;
                };
                let queued = record.pool.ticket_of(digest);
                let grant = record
                    .pool
                    .grant_of(&item.holder)
                    .filter(|l| l.granted_ms.saturating_add(TICKET_GRACE_MS) >= item.joined_ms);
                let ended = match (&item.state, grant, queued) {
                    // Ended ungranted (cancelled or expired) while a slot
                    // was being handed to it, or failed with its lease not
                    // yet returned (that write failed): nobody holds it.
                    (
                        TicketState::Cancelled | TicketState::Expired | TicketState::Failed { .. },
                        Some(lease),
                        _,
                    ) if lease.is_live(now) => {
                        if let ReturnPlan::Return(_, update) = record.pool.plan_return(digest, now)
                        {
                            record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                        }
                        true
                    }
                    // Ended: no longer the pool's business.
                    (state, ..) if state.is_final() => true,
                    // Granted, not yet delivered (delivery under way, or cut
                    // short by a crash): listed until it ends, so that a
                    // later step delivers it again.
                    (TicketState::Granted(grant), ..) => {
                        step.deliver.push(ToDeliver {
                            grant: *grant,
                            item,
                        });
                        false
                    }
                    (_, Some(lease), _) => {
                        let grant = TicketGrant {
                            position: lease.position,
                            fence: lease.fence,
                            granted_ms: lease.granted_ms,
                            expires_at_ms: lease.expires_at_ms,
                        };
                        let (item, moved) = self
                            .move_ticket(&mut ctx, key, item, TicketState::Granted(grant))
                            .await?;
                        if moved {
                            step.deliver.push(ToDeliver { item, grant });
                            false
                        } else {
                            // Cancelled or expired before its grant was
                            // recorded: nobody will use the slot.
                            if lease.is_live(now) {
                                if let ReturnPlan::Return(_, update) =
                                    record.pool.plan_return(digest, now)
                                {
                                    record =
                                        write(&mut ctx, key, &record, &update, &mut lost).await?;
                                }
                            }
                            item.state.is_final()
                        }
                    }
                    // Waits in the queue: ends when its wait does.
                    (_, None, Some((_, ticket))) if ticket.is_live(now) => false,
                    (_, None, Some((index, _))) => {
                        self.move_ticket(&mut ctx, key, item, TicketState::Expired)
                            .await?;
                        let update = record.pool.plan_cancel(&record.pool.queue()[index].holder);
                        if let Some(update) = update {
                            record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                        }
                        true
                    }
                    // Left the queue ungranted: pruned as dead, or its lease
                    // id returned (a cancel by return).
                    (_, None, None) => {
                        let end = if now >= item.wait_until_ms {
                            TicketState::Expired
                        } else {
                            TicketState::Cancelled
                        };
                        self.move_ticket(&mut ctx, key, item, end).await?;
                        true
                    }
                };
                if ended {
                    if let Some(update) = record.pool.plan_unlist(digest) {
                        record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                        changed = true;
                    }
                }
            }
            if changed {
                continue;
            }
            break;
        }
        if let Some(update) = record.pool.plan_settle() {
            // Its writes stop invoking the dispatcher (a lost settle: work
            // arrived meanwhile, and its write invoked a step).
            if let Ok(Updated::Written(settled)) = ctx.write(key, &record, &update).await {
                record = settled;
            }
        }
        // Rounds see the same granted tickets again.
        step.deliver.sort_by_key(|d| d.item.digest());
        step.deliver.dedup_by_key(|d| d.item.digest());
        let now = now_ms();
        let pool = &record.pool;
        step.active = pool.line().active;
        step.depth =
            pool.line().next.saturating_sub(pool.line().admitted) + pool.waiting(now) as u64;
        let waiting_asyncs: Vec<u64> = pool
            .queue()
            .iter()
            .filter(|t| pool.async_number(t.holder.digest).is_some())
            .map(|t| (t.give_up_s * 1000).saturating_add(TICKET_GRACE_MS))
            .collect();
        if !waiting_asyncs.is_empty() {
            // A lease expiring frees a slot with no write to see.
            let expiry = pool.nth_expiry(1, now);
            step.wake_ms = waiting_asyncs.into_iter().chain(expiry).min();
        }
        if !step.deliver.is_empty() {
            // Deliveries under way end within the bound; a step then unlists
            // them (or delivers again what a crash cut short).
            let soon = now + 30_000;
            step.wake_ms = Some(step.wake_ms.map_or(soon, |w| w.min(soon)));
        }
        if pool.line().has_backlog() {
            // Admission passes tickets whose wait ended (they end `expired`)
            // and, after GAP_MS, numbers without a ticket.
            let soon = now + 1_000;
            step.wake_ms = Some(step.wake_ms.map_or(soon, |w| w.min(soon)));
        }
        Ok(step)
    }

    /// Moves a ticket to `to` unless it has moved already: the ticket as it
    /// is after, and whether this call moved it.
    async fn move_ticket(
        &self,
        ctx: &mut Ctx<'_>,
        key: &PoolKey,
        item: TicketItem,
        to: TicketState,
    ) -> Result<(TicketItem, bool), Error> {
        let tickets = self.ticket_store()?;
        if !item.state.may_become(&to) {
            return Ok((item, false));
        }
        Ok(
            match ctx
                .call(tickets.set_ticket_state(key, item.digest(), &item.state, &to))
                .await?
            {
                TicketUpdated::Written(item) => (item, true),
                TicketUpdated::Lost(item) => (item, false),
                TicketUpdated::Gone => (item, false),
            },
        )
    }

    /// Records how a delivery ended: `delivered`, or `failed` with its
    /// reason (and its lease returned, so the slot is not held by nobody).
    pub async fn delivery_ended(
        &self,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        outcome: Result<u64, String>,
        call: &mut Call,
    ) -> Result<TicketItem, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        match outcome {
            Ok(delivered_ms) => {
                let to = TicketState::Delivered {
                    grant,
                    delivered_ms,
                };
                let from = TicketState::Granted(grant);
                let moved = TicketItem {
                    state: from,
                    ..item.clone()
                };
                Ok(self.move_ticket(&mut ctx, key, moved, to).await?.0)
            }
            Err(reason) => {
                let moved = TicketItem {
                    state: TicketState::Granted(grant),
                    ..item.clone()
                };
                let (ended, _) = self
                    .move_ticket(&mut ctx, key, moved, TicketState::Failed { reason })
                    .await?;
                // Its lease goes back only if the ticket failed: another
                // dispatcher's delivery of the same grant may have landed
                // (`delivered`), and its receiver holds the slot.
                let failed = matches!(ended.state, TicketState::Failed { .. });
                if let Some(mut record) = ctx.load(key).await?.filter(|_| failed) {
                    let mut lost = 0u32;
                    while record.incarnation == item.incarnation {
                        let held = record
                            .pool
                            .leases()
                            .into_iter()
                            .find(|l| l.digest == item.digest() && l.fence == grant.fence);
                        let Some(lease) = held.filter(|l| l.is_live(now_ms())) else {
                            break;
                        };
                        let ReturnPlan::Return(_, update) =
                            record.pool.plan_return(lease.digest, now_ms())
                        else {
                            break;
                        };
                        record = write(&mut ctx, key, &record, &update, &mut lost).await?;
                    }
                }
                Ok(ended)
            }
        }
    }

    /// Counts a delivery attempt (for the ticket's status and metrics).
    pub async fn count_attempt(&self, key: &PoolKey, item: &TicketItem) -> Result<u32, Error> {
        let tickets = self.ticket_store()?;
        let mut call = Call::default();
        let mut ctx = self.ctx(&mut call, Duration::ZERO);
        Ok(ctx
            .call(tickets.count_attempt(key, item.digest()))
            .await?
            .unwrap_or(item.attempts))
    }
}

/// Admission, if the pool has a backlog and the line has room: the record
/// after the write (landed or lost), `None` when nothing was to admit.
pub(super) async fn admit(
    ctx: &mut Ctx<'_>,
    key: &PoolKey,
    record: &Record,
    max_waiters: usize,
) -> Result<Option<Record>, Error> {
    let Some(tickets) = ctx.tickets else {
        return Ok(None);
    };
    let room = record.pool.admission_room(max_waiters, ASYNC_WINDOW);
    if room == 0 {
        return Ok(None);
    }
    // Room for those admitted, and as many again for tickets that ended
    // (stepped over) and numbers without a ticket.
    let backlog: Vec<TicketItem> = ctx
        .call(tickets.backlog(key, record.pool.line().admitted, room + MAX_ADMITS))
        .await?
        .into_iter()
        .filter(|t| t.incarnation == record.incarnation)
        .collect();
    let now = now_ms();
    let Some(update) = record
        .pool
        .plan_admit(&backlog, now, max_waiters, ASYNC_WINDOW)
    else {
        return Ok(None);
    };
    let mut lost = 0u32;
    let after = write(ctx, key, record, &update, &mut lost).await?;
    // Waiting tickets it passed without queueing them end now (each once:
    // conditioned on still waiting): `expired` when their wait was over, else
    // `cancelled` (their lease id already held a slot or waited in the queue).
    let passed = update.changes.iter().find_map(|change| match change {
        Change::SetAdmitted(admitted) => Some(*admitted),
        _ => None,
    });
    let queued: Vec<LeaseDigest> = update
        .changes
        .iter()
        .filter_map(|change| match change {
            Change::Append(ticket) => Some(ticket.holder.digest),
            _ => None,
        })
        .collect();
    if let Some(passed) = passed.filter(|p| after.pool.line().admitted >= *p) {
        for item in backlog.iter().filter(|t| {
            t.number < passed && t.state == TicketState::Waiting && !queued.contains(&t.digest())
        }) {
            let end = if now >= item.wait_until_ms {
                TicketState::Expired
            } else {
                TicketState::Cancelled
            };
            ctx.call(tickets.set_ticket_state(key, item.digest(), &TicketState::Waiting, &end))
                .await?;
        }
    }
    Ok(Some(after))
}

/// A ticket whose wait is over while it is still in the backlog (admission
/// has not reached it) ends `expired` when it is read: it can no longer be
/// admitted, and its owner is told so now. (One admitted to the queue ends
/// by the dispatcher's step, which also sees a slot handed to it meanwhile.)
async fn expire_if_over(
    ctx: &mut Ctx<'_>,
    tickets: &dyn TicketStore,
    key: &PoolKey,
    record: &Record,
    item: TicketItem,
) -> Result<TicketItem, Error> {
    let over = item.state == TicketState::Waiting
        && record.incarnation == item.incarnation
        && now_ms() >= item.wait_until_ms
        && !record.pool.asks(item.digest(), now_ms())
        && record.pool.line().admitted <= item.number;
    if !over {
        return Ok(item);
    }
    Ok(
        match ctx
            .call(tickets.set_ticket_state(
                key,
                item.digest(),
                &TicketState::Waiting,
                &TicketState::Expired,
            ))
            .await?
        {
            TicketUpdated::Written(item) | TicketUpdated::Lost(item) => item,
            TicketUpdated::Gone => item,
        },
    )
}

/// The report of `item` in the pool as read: a ticket of a pool deleted
/// since (none stored, or another incarnation) ended with it.
fn report(record: Option<&Record>, item: Option<TicketItem>) -> Result<TicketReport, Error> {
    let mut item = match (record, item) {
        (None, None) => return Err(Error::PoolNotFound),
        (Some(_), None) => return Err(Error::TicketNotFound),
        (_, Some(item)) => item,
    };
    match record.filter(|r| r.incarnation == item.incarnation) {
        Some(record) => {
            let ahead = ahead_of(&record.pool, &item, now_ms());
            Ok(TicketReport { item, ahead })
        }
        None => {
            if !item.state.is_final() {
                item.state = TicketState::Failed {
                    reason: "its pool was deleted".into(),
                };
            }
            Ok(TicketReport { item, ahead: None })
        }
    }
}

/// Tickets before `item` while it waits: live ones ahead in the queue once
/// admitted, else the whole queue and the backlog numbers before it.
fn ahead_of(pool: &Pool, item: &TicketItem, now_ms: u64) -> Option<u64> {
    if item.state != TicketState::Waiting {
        return None;
    }
    Some(match pool.ticket_of(item.digest()) {
        Some((index, _)) => pool.queue()[..index]
            .iter()
            .filter(|t| t.is_live(now_ms))
            .count() as u64,
        None => item.number.saturating_sub(pool.line().admitted) + pool.waiting(now_ms) as u64,
    })
}

impl Borrower {
    /// A borrower that finds tickets in the backlog waits there too: takes
    /// the next number, writes its ticket item, and waits to be admitted
    /// (admitting the backlog's head itself when it reads, so a backlog of
    /// sync borrowers moves without the dispatcher).
    pub(super) async fn wait_in_backlog(
        &self,
        ctx: &mut Ctx<'_>,
        incarnation: u64,
    ) -> Result<Placed, Error> {
        let Some(tickets) = ctx.tickets else {
            return Err(Error::Exhausted);
        };
        let mut record = ctx
            .call(ctx.store.number_ticket(&self.key))
            .await?
            .ok_or(Error::PoolNotFound)?;
        if record.incarnation != incarnation {
            return Err(Error::PoolNotFound);
        }
        let number = record.pool.line().next - 1;
        let joined_ms = now_ms();
        let item = TicketItem {
            number,
            holder: self.holder,
            incarnation,
            joined_ms,
            wait_until_ms: self.give_up_ms,
            callback: None,
            state: TicketState::Waiting,
            attempts: 0,
        };
        let mut failures = 0u32;
        loop {
            match ctx.call(tickets.put_ticket(&self.key, &item)).await {
                Ok(PutTicket::Created) => break,
                Ok(PutTicket::Exists(existing))
                    if existing.number == number && existing.incarnation == incarnation =>
                {
                    break
                }
                // This lease id has a ticket already (a twin request's, or
                // an async one): not a second one.
                Ok(PutTicket::Exists(_)) => {
                    let _ = ctx
                        .call(tickets.put_ticket(&self.key, &void(number, incarnation, joined_ms)))
                        .await;
                    return Err(Error::Exhausted);
                }
                Err(err) => ctx.retry_after(err, &mut failures).await?,
            }
        }
        let mut round = 0u32;
        loop {
            if record.incarnation != incarnation {
                return Err(Error::PoolNotFound);
            }
            let now = now_ms();
            if let WaitPlan::Granted(lease) = record.pool.plan_wait(&self.holder, joined_ms, now) {
                return Ok(Placed::Granted(lease, false));
            }
            if record.pool.ticket_of(self.holder.digest).is_some() {
                return Ok(Placed::Queued(record, self.holder, joined_ms));
            }
            if record.pool.line().admitted > number {
                // Passed without being admitted: it ended (its wait, or a
                // return of its lease id cancelled it).
                return Err(Error::Exhausted);
            }
            if Instant::now() >= self.give_up {
                let _ = ctx
                    .call(tickets.set_ticket_state(
                        &self.key,
                        self.holder.digest,
                        &TicketState::Waiting,
                        &TicketState::Cancelled,
                    ))
                    .await;
                // Admitted meanwhile: the queue's give-up takes it out.
                let record = ctx.load_existing(&self.key).await?;
                return Ok(Placed::Queued(record, self.holder, joined_ms));
            }
            if let Some(admitted) = admit(ctx, &self.key, &record, self.max_waiters).await? {
                record = admitted;
                continue;
            }
            round += 1;
            let nap = ctx
                .timing
                .poll
                .saturating_mul(round.min(8))
                .min(ctx.timing.poll_cap)
                .mul_f64(0.75 + 0.25 * wire::unit())
                .min(self.give_up.saturating_duration_since(Instant::now()));
            tokio::time::sleep(nap).await;
            ctx.stats.waited += nap;
            record = ctx.load_existing(&self.key).await?;
        }
    }
}
