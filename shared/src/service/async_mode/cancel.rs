//! `POST …/cancel`: a waiting ticket ends `cancelled` and leaves the line.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{ReturnPlan, TicketState};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId};
use crate::service::harness::write;
use crate::service::{Budget, Service};
use crate::store::TicketUpdated;

use super::ticket::{ahead_of, expire_if_over, report};
use super::TicketReport;

impl Service {
    /// `POST …/cancel`: a waiting ticket ends `cancelled` and leaves the
    /// line; one granted already keeps its grant (return its lease to give
    /// it up). Idempotent.
    pub async fn cancel(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Budget,
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
}
