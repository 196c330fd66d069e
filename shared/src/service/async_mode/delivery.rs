//! A delivery's end recorded (its lease returned if it failed), and its
//! attempts counted.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{ReturnPlan, TicketGrant, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::write;
use crate::service::{Budget, Service};

impl Service {
    /// Records how a delivery ended: `delivered`, or `failed` with its
    /// reason (and its lease returned, so the slot is not held by nobody).
    pub async fn delivery_ended(
        &self,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        outcome: Result<u64, String>,
        call: &mut Budget,
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
        let mut call = Budget::default();
        let mut ctx = self.ctx(&mut call, Duration::ZERO);
        Ok(ctx
            .call(tickets.count_attempt(key, item.digest()))
            .await?
            .unwrap_or(item.attempts))
    }
}
