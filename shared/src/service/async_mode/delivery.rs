//! A delivery's end recorded (its lease returned if it failed), and its
//! attempts counted.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{DeliveryClaim, ReturnPlan, TicketGrant, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::{write, Harness};
use crate::service::{Budget, Service};
use crate::store::{Record, TicketUpdated};

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
                Ok(self
                    .move_ticket(&mut ctx, key, granted(item, grant), to)
                    .await?
                    .0)
            }
            Err(reason) => {
                let ended = self
                    .fail_granted(&mut ctx, key, item, grant, reason)
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

    /// Before a delivery attempt: takes the ticket's delivery claim for
    /// `claim` (counting the attempt), so that no other dispatcher's attempt
    /// runs at the same time, and reads the pool: once the grant's lease was
    /// returned or expired (or its pool deleted), no attempt starts and the
    /// ticket ends `failed`, saying why. (A return landing between this read
    /// and the POST, a few milliseconds, is the one it cannot see.)
    pub async fn begin_attempt(
        &self,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        claim: DeliveryClaim,
    ) -> Result<Begin, Error> {
        let tickets = self.ticket_store()?;
        let mut call = Budget::default();
        let mut ctx = self.ctx(&mut call, Duration::ZERO);
        // Side by side: the attempt waits for one store round trip, not two.
        let (claimed, record) = ctx
            .call(async {
                tokio::try_join!(
                    tickets.claim_attempt(key, item.digest(), grant.fence, claim, now_ms()),
                    self.store.load(key),
                )
            })
            .await?;
        if !matches!(claimed, TicketUpdated::Written(_)) {
            return Ok(Begin::NotOurs);
        }
        self.begin_from(&mut ctx, key, item, grant, record).await
    }

    /// Ends the delivery claim of `by` on the ticket of `item` early (its
    /// attempt is over, undecided), so that another dispatcher's may start
    /// at once: the claim, renewed to lapse now. (The store counts it as an
    /// attempt claimed.) A claim of another's, or a ticket that moved on,
    /// is left as it is.
    pub async fn release_claim(
        &self,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        by: u64,
    ) -> Result<(), Error> {
        let tickets = self.ticket_store()?;
        let mut call = Budget::default();
        let mut ctx = self.ctx(&mut call, Duration::ZERO);
        let now = now_ms();
        let lapsed = DeliveryClaim { by, until_ms: now };
        ctx.call(tickets.claim_attempt(key, item.digest(), grant.fence, lapsed, now))
            .await?;
        Ok(())
    }

    /// [`Service::begin_attempt`] for an attempt whose claim is taken (by
    /// the step that recorded the grant, for the first attempt): the pool's
    /// read alone.
    pub async fn begin_claimed(
        &self,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
    ) -> Result<Begin, Error> {
        let mut call = Budget::default();
        let mut ctx = self.ctx(&mut call, Duration::ZERO);
        let record = ctx.call(self.store.load(key)).await?;
        self.begin_from(&mut ctx, key, item, grant, record).await
    }

    /// Whether the claimed attempt starts, from the pool as read (`None`:
    /// gone): not once the grant's lease was returned or expired, or its
    /// pool deleted (the ticket then fails, saying why).
    async fn begin_from(
        &self,
        ctx: &mut Harness<'_>,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        record: Option<Record>,
    ) -> Result<Begin, Error> {
        let Some(reason) = undeliverable(record.as_ref(), item, &grant, now_ms()) else {
            return Ok(Begin::Go);
        };
        let ended = self.fail_granted(ctx, key, item, grant, reason).await?;
        Ok(match ended.state {
            TicketState::Failed { reason } => Begin::Ended(reason),
            _ => Begin::NotOurs,
        })
    }
}

/// Why the grant `grant` of the ticket of `item` can no longer be delivered
/// at `now_ms`, from its pool as read (`None`: gone), if so.
fn undeliverable(
    record: Option<&Record>,
    item: &TicketItem,
    grant: &TicketGrant,
    now_ms: u64,
) -> Option<String> {
    match record.filter(|r| r.incarnation == item.incarnation) {
        Some(record) => record
            .pool
            .undeliverable(item.digest(), grant, now_ms)
            .map(str::to_string),
        None => Some("its pool was deleted".to_string()),
    }
}

impl Service {
    /// Ends the ticket granted `grant` `failed` for `reason` (once: unless it
    /// ended otherwise first): the ticket as it is after.
    async fn fail_granted(
        &self,
        ctx: &mut Harness<'_>,
        key: &PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        reason: String,
    ) -> Result<TicketItem, Error> {
        let failed = TicketState::Failed { reason };
        Ok(self
            .move_ticket(ctx, key, granted(item, grant), failed)
            .await?
            .0)
    }
}

/// `item` as granted `grant`: the state a delivery's writes move it from.
fn granted(item: &TicketItem, grant: TicketGrant) -> TicketItem {
    TicketItem {
        state: TicketState::Granted(grant),
        ..item.clone()
    }
}

/// Whether a delivery makes its next attempt ([`Service::begin_attempt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Claimed and counted: attempt now.
    Go,
    /// Not this delivery's to make: another dispatcher's claim is live, or
    /// the ticket ended (delivered, failed) meanwhile.
    NotOurs,
    /// Its lease ended undelivered: the ticket failed for this reason.
    Ended(String),
}
