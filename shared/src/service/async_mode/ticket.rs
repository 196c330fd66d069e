//! `POST …/ticket`: a ticket's status, and its place while it waits.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{Pool, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::service::harness::Harness;
use crate::service::{Budget, Service};
use crate::store::{Record, TicketStore, TicketUpdated};

/// A ticket as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketReport {
    pub item: TicketItem,
    /// While it waits: tickets before it, at most.
    pub ahead: Option<u64>,
}

impl Service {
    /// `POST …/ticket`: the ticket of this lease id, with its place while it
    /// waits.
    pub async fn ticket(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Budget,
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
}

/// A ticket whose wait is over ends `expired` when it is read, so that its
/// owner is told at its deadline, not at the dispatcher's next step: one
/// still in the backlog (admission has not reached it) can no longer be
/// admitted, and an async ticket in the queue is never handed a slot at or
/// after its deadline, so unless the pool shows a slot handed to it before,
/// it never will be (the dispatcher's step then takes it out of the queue).
/// A sync borrower's ticket in the queue is its request's to end.
pub(super) async fn expire_if_over(
    ctx: &mut Harness<'_>,
    tickets: &dyn TicketStore,
    key: &PoolKey,
    record: &Record,
    item: TicketItem,
) -> Result<TicketItem, Error> {
    let now = now_ms();
    let unserved = if item.callback.is_some() {
        record.pool.grant_to(&item).is_none()
    } else {
        !record.pool.asks(item.digest(), now) && record.pool.line().admitted <= item.number
    };
    let over = item.state == TicketState::Waiting
        && record.incarnation == item.incarnation
        && now >= item.wait_until_ms
        && unserved;
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
pub(super) fn report(
    record: Option<&Record>,
    item: Option<TicketItem>,
) -> Result<TicketReport, Error> {
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
pub(super) fn ahead_of(pool: &Pool, item: &TicketItem, now_ms: u64) -> Option<u64> {
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
