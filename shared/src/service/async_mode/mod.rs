//! Async mode in the service: enqueue, a ticket's status, cancel, admission
//! from the backlog, and the dispatcher's step (everything but the callback
//! itself, which is `crate::delivery`'s). See `docs/DESIGN.md`.

use crate::domain::{Holder, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::store::{Numbered, Record, StoreError, StoreErrorKind, TicketStore, TicketUpdated};

use super::harness::Harness;
use super::Service;

mod admit;
mod cancel;
mod claim;
mod delivery;
mod enqueue;
mod step;
mod ticket;
mod visit;

pub(in crate::service) use admit::admit;
pub use admit::ASYNC_WINDOW;
pub use delivery::Begin;
pub use enqueue::{EnqueueRequest, Enqueued};
pub use step::{Claiming, Step, ToDeliver};
pub use ticket::TicketReport;

/// The filler item that fills a ticket number whose request found its lease
/// id's ticket already there: admission steps over it at once.
pub(super) fn filler_ticket(number: u64, incarnation: u64, now_ms: u64) -> TicketItem {
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
        claim: None,
    }
}

/// Takes the pool's next ticket number while its backlog (numbers taken,
/// not yet admitted) holds fewer than `max_tickets`: the record as the number
/// left it. One conditional write: `admitted` only rises, so a number below
/// `admitted` as read plus `max_tickets` is within the limit.
pub(in crate::service) async fn take_number(
    ctx: &mut Harness<'_>,
    key: &PoolKey,
    max_tickets: u64,
) -> Result<Record, Error> {
    let mut record = ctx.load_existing(key).await?;
    // Each retry follows admission, which moved on meanwhile.
    for _ in 0..8 {
        let below = record.pool.line().admitted.saturating_add(max_tickets);
        match ctx.call(ctx.store.number_ticket(key, below)).await? {
            Numbered::Taken(taken) => return Ok(taken),
            Numbered::Gone => return Err(Error::PoolNotFound),
            Numbered::Full(now) => {
                let line = now.pool.line();
                if line.next >= line.admitted.saturating_add(max_tickets) {
                    return Err(Error::BacklogFull { limit: max_tickets });
                }
                record = now;
            }
        }
    }
    Err(Error::Contention)
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

    /// Moves a ticket to `to` unless it has moved already: the ticket as it
    /// is after, and whether this call moved it.
    async fn move_ticket(
        &self,
        ctx: &mut Harness<'_>,
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
}
