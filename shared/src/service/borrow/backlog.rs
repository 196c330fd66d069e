//! A borrow that finds tickets in the backlog (async mode's line) waits
//! there: it takes a number, writes its ticket item, admits the backlog's
//! head itself when it reads, and leaves no live ticket behind.

use std::time::Instant;

use crate::clock::now_ms;
use crate::domain::{TicketItem, TicketState, WaitPlan};
use crate::error::Error;
use crate::store::{PutTicket, Record, TicketStore};

use super::super::async_mode::{admit, filler_ticket, take_number};
use super::super::harness::{write, Harness};
use super::{Borrower, Placed};

impl Borrower<'_> {
    /// A borrower that waited in the backlog leaves no live ticket behind,
    /// whatever its answer: once admission has passed its number the item is
    /// removed (so that a later borrow with the same lease id, such as the
    /// client's next round of a long wait, can join again); before, it ends
    /// `cancelled` or `expired`, so that admission steps over it at once (a
    /// missing number would hold the backlog up for `GAP_MS`), and an
    /// admission that queued it meanwhile is undone. Only its own item (by
    /// number): a twin request's later one stays. Best effort: an item left
    /// over is replaced by the next borrow of its lease id.
    pub(super) async fn end_backlog_ticket(
        &self,
        ctx: &mut Harness<'_>,
        number: u64,
        incarnation: u64,
    ) {
        let Some(tickets) = ctx.tickets else {
            return;
        };
        let digest = self.holder.digest;
        let passed = match ctx.load(&self.key).await {
            Ok(Some(record)) => {
                record.incarnation != incarnation || record.pool.line().admitted > number
            }
            Ok(None) => true,
            Err(_) => return,
        };
        if passed {
            let _ = ctx
                .call(tickets.delete_ticket(&self.key, digest, number, incarnation))
                .await;
            return;
        }
        let end = if now_ms() >= self.give_up_ms {
            TicketState::Expired
        } else {
            TicketState::Cancelled
        };
        let ended = ctx
            .call(tickets.set_ticket_state(&self.key, digest, &TicketState::Waiting, &end))
            .await;
        if ended.is_err() {
            return;
        }
        // Admitted since the read above: out of the queue again.
        let mut lost = 0u32;
        while let Ok(Some(record)) = ctx.load(&self.key).await {
            let Some(update) = record
                .pool
                .plan_cancel(&self.holder)
                .filter(|_| record.incarnation == incarnation)
            else {
                break;
            };
            if write(ctx, &self.key, &record, &update, &mut lost)
                .await
                .is_err()
            {
                break;
            }
        }
    }

    /// A borrower that finds tickets in the backlog waits there too: takes
    /// the next number, writes its ticket item, and waits to be admitted
    /// (admitting the backlog's head itself when it reads, so a backlog of
    /// sync borrowers moves without the dispatcher).
    pub(super) async fn wait_in_backlog(
        &self,
        ctx: &mut Harness<'_>,
        incarnation: u64,
        backlog: &mut Option<(u64, u64)>,
    ) -> Result<Placed, Error> {
        let Some(tickets) = ctx.tickets else {
            return Err(Error::Exhausted);
        };
        let (mut record, number, joined_ms) = self.join_backlog(ctx, tickets, incarnation).await?;
        *backlog = Some((number, incarnation));
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
            let nap = ctx.timing.backlog_nap(round, self.give_up);
            record = ctx.wait_then_load(nap, &self.key).await?;
        }
    }

    /// Joins the backlog: takes the next number and writes its ticket item.
    /// The record as the number left it, the number, and when it joined;
    /// `Exhausted` when this lease id has a ticket already.
    async fn join_backlog(
        &self,
        ctx: &mut Harness<'_>,
        tickets: &dyn TicketStore,
        incarnation: u64,
    ) -> Result<(Record, u64, u64), Error> {
        let record = take_number(ctx, &self.key, self.max_tickets).await?;
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
            claim: None,
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
                // An earlier borrow's item of this lease id that admission
                // has passed (left over: its request died before removing
                // it), or one of a pool deleted since: not a ticket any more.
                Ok(PutTicket::Exists(existing))
                    if existing.callback.is_none()
                        && (existing.incarnation != incarnation
                            || existing.number < record.pool.line().admitted) =>
                {
                    ctx.call(tickets.delete_ticket(
                        &self.key,
                        self.holder.digest,
                        existing.number,
                        existing.incarnation,
                    ))
                    .await?;
                }
                // This lease id has a ticket already (a twin request's, or
                // an async one): not a second one.
                Ok(PutTicket::Exists(_)) => {
                    let _ = ctx
                        .call(
                            tickets.put_ticket(
                                &self.key,
                                &filler_ticket(number, incarnation, joined_ms),
                            ),
                        )
                        .await;
                    return Err(Error::Exhausted);
                }
                Err(err) => ctx.retry_after(err, &mut failures).await?,
            }
        }
        Ok((record, number, joined_ms))
    }
}
