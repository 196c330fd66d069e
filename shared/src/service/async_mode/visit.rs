//! The writes a dispatcher step makes for one listed ticket, as
//! [`Pool::ticket_step`] names them (but a grant to record, which the round
//! records side by side): a slot returned, the ticket ended, a delivery
//! handed out again.
//!
//! [`Pool::ticket_step`]: crate::domain::Pool::ticket_step

use crate::clock::now_ms;
use crate::domain::{LeaseDigest, ReturnPlan, TicketItem, TicketState, TicketStep};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::{write, Harness};
use crate::service::Service;
use crate::store::Record;

use super::step::Round;

impl Service {
    /// Makes the writes `ticket_step` (what [`Pool::ticket_step`] says of
    /// the listed ticket of `digest`, whose item is `item`) names, but a
    /// grant to record: the record after them, and whether the ticket ended
    /// (then it is unlisted).
    pub(super) async fn visit(
        &self,
        ctx: &mut Harness<'_>,
        round: Round<'_>,
        mut record: Record,
        digest: LeaseDigest,
        item: TicketItem,
        ticket_step: TicketStep,
    ) -> Result<(Record, bool), Error> {
        let Round {
            key,
            now,
            step,
            lost,
            leave,
        } = round;
        let ended = match ticket_step {
            // Ended ungranted (cancelled or expired) while a slot
            // was being handed to it, or failed with its lease not
            // yet returned (that write failed): nobody holds it.
            TicketStep::ReturnThenUnlist => {
                if let ReturnPlan::Return(_, update) = record.pool.plan_return(digest, now) {
                    record = write(ctx, key, &record, &update, lost).await?;
                }
                true
            }
            // Ended: no longer the pool's business.
            TicketStep::Unlist => true,
            // Granted, not yet delivered (delivery under way, or cut
            // short by a crash): listed until it ends, so that a
            // later step delivers it again.
            TicketStep::Redeliver(grant) => {
                step.redeliver(item, grant);
                false
            }
            // Another dispatcher's attempt is under way: its own.
            TicketStep::Claimed { until_ms } => {
                leave.push(digest);
                step.claimed_until(digest, until_ms);
                false
            }
            // Its lease ended undelivered: nobody holds the slot to return.
            // Decided from the pool as read before the ticket, which another
            // dispatcher may have granted since: read the pool again first.
            TicketStep::Fail(_) => {
                let Some(fresh) = ctx.load(key).await? else {
                    return Ok((record, false));
                };
                record = fresh;
                match record.pool.ticket_step(&item, now_ms()) {
                    TicketStep::Fail(reason) => {
                        self.move_ticket(ctx, key, item, TicketState::Failed { reason })
                            .await?;
                        true
                    }
                    TicketStep::Redeliver(grant) => {
                        step.redeliver(item, grant);
                        false
                    }
                    _ => false,
                }
            }
            // Recorded side by side by the caller.
            TicketStep::Record { .. } => false,
            // Waits in the queue: ends when its wait does.
            TicketStep::Wait => false,
            // Its wait is over (or it ended) while still in the queue.
            TicketStep::Expire { .. } => {
                let (item, _) = self
                    .move_ticket(ctx, key, item, TicketState::Expired)
                    .await?;
                match item.state {
                    // Granted meanwhile (recorded by another step): listed,
                    // so that a later step delivers it.
                    TicketState::Waiting | TicketState::Granted(_) => false,
                    // Its receiver's: only its place in the queue goes.
                    TicketState::Delivered { .. } => {
                        let queued = record.pool.ticket_of(item.digest());
                        let update = queued.and_then(|(_, t)| record.pool.plan_cancel(&t.holder));
                        if let Some(update) = update {
                            record = write(ctx, key, &record, &update, lost).await?;
                        }
                        true
                    }
                    _ => {
                        record = let_go(ctx, key, record, &item, lost).await?;
                        true
                    }
                }
            }
            // Left the queue ungranted: pruned as dead, or its lease
            // id returned (a cancel by return).
            TicketStep::End(end) => {
                self.move_ticket(ctx, key, item, end).await?;
                true
            }
        };
        Ok((record, ended))
    }
}

/// Takes the ticket of `item`, ended ungranted, out of `record`'s pool: out
/// of the queue, and a slot handed to it before that write landed given
/// back (nobody will use it; once unlisted, no step would look again).
async fn let_go(
    ctx: &mut Harness<'_>,
    key: &PoolKey,
    mut record: Record,
    item: &TicketItem,
    lost: &mut u32,
) -> Result<Record, Error> {
    loop {
        let now = now_ms();
        let queued = record.pool.ticket_of(item.digest());
        let update = match queued.and_then(|(_, ticket)| record.pool.plan_cancel(&ticket.holder)) {
            Some(update) => update,
            None => match record.pool.grant_to(item).filter(|l| l.is_live(now)) {
                Some(lease) => match record.pool.plan_return(lease.digest, now) {
                    ReturnPlan::Return(_, update) => update,
                    _ => return Ok(record),
                },
                None => return Ok(record),
            },
        };
        record = write(ctx, key, &record, &update, lost).await?;
    }
}
