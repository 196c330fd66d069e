//! Admission from the backlog into the queue (the dispatcher's step, and a
//! sync borrower waiting in the backlog, both admit).

use crate::clock::now_ms;
use crate::domain::{Change, LeaseDigest, TicketItem, TicketState, MAX_ADMITS};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::{write, Harness};
use crate::store::Record;

/// The most async tickets admitted to a pool's queue at once: what async
/// tickets add to the pool item (a queue entry and a `y` listing, about 35
/// bytes each) stays near half a kilobyte, so that a pool of count 10 with a
/// full window is still one write unit. Admission refills it by halves.
pub const ASYNC_WINDOW: usize = 16;

/// Admission, if the pool has a backlog and the line has room: the record
/// after the write (landed or lost), `None` when nothing was to admit.
pub(in crate::service) async fn admit(
    ctx: &mut Harness<'_>,
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
    let Some(passed) = passed.filter(|p| after.pool.line().admitted >= *p) else {
        return Ok(Some(after));
    };
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
    if queued.is_empty() {
        return Ok(Some(after));
    }
    // A ticket cancelled between the backlog read above and this write was
    // queued all the same, and its canceller's read of the pool (made to take
    // it out of the queue) may have come before this write landed. Read the
    // admitted tickets again and take those that ended out of the queue, so
    // that no slot is handed to a ticket nobody waits for. (A cancel landing
    // after this read finds them queued on its own read.)
    let again = ctx
        .call(tickets.backlog(key, record.pool.line().admitted, backlog.len()))
        .await?;
    let mut after = after;
    let mut lost = 0u32;
    for item in again
        .iter()
        .filter(|t| t.state.is_final() && queued.contains(&t.digest()))
    {
        if let Some(update) = after.pool.plan_cancel(&item.holder) {
            after = write(ctx, key, &after, &update, &mut lost).await?;
        }
    }
    Ok(Some(after))
}
