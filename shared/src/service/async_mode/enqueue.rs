//! `POST …/enqueue`: a number in the pool's line and a ticket item,
//! idempotent by lease id.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{Callback, Holder, Pool, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::service::harness::Harness;
use crate::service::{Budget, Service};
use crate::store::PutTicket;

use super::ticket::ahead_of;
use super::{filler_ticket, take_number};

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

impl Service {
    /// `POST …/enqueue`: a ticket in the pool's line, or the one this lease
    /// id has already (idempotent). One write to the pool item (its ticket
    /// number) and one ticket item written.
    pub async fn enqueue(
        &self,
        id: PoolId,
        request: EnqueueRequest,
        call: &mut Budget,
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
            ctx.call(tickets.delete_ticket(&key, digest, item.number, item.incarnation))
                .await?;
        }
        let record = take_number(&mut ctx, &key, self.limits.max_tickets).await?;
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
            claim: None,
        };
        let ahead =
            |pool: &Pool| number.saturating_sub(pool.line().admitted) + pool.waiting(now) as u64;
        let put = self.put_ticket(&mut ctx, &key, &item).await;
        ctx.changed(&key);
        match put? {
            None => {
                // Nobody ahead in the backlog and a slot free for it: the
                // next step grants it, and no write that frees a slot will
                // say so.
                let state = record.pool.state(now);
                if record.pool.line().admitted == number && state.available > state.waiting {
                    ctx.granted_async(&key, &[]).await;
                }
                Ok(Enqueued {
                    ticket: number,
                    ahead: ahead(&record.pool),
                })
            }
            Some(existing) => {
                // A twin request wrote this lease id's ticket first.
                let _ = ctx
                    .call(tickets.put_ticket(&key, &filler_ticket(number, record.incarnation, now)))
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
        ctx: &mut Harness<'_>,
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
}
