//! A step's claims, for a caller that delivers what the step hands out at
//! once: each grant recorded with its first attempt claimed in one write,
//! and grants recorded before claimed again, side by side.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{DeliveryClaim, LeaseDigest, TicketGrant, TicketItem, TicketState};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::service::harness::Harness;
use crate::service::{Budget, Service};
use crate::store::{StoreError, TicketStore, TicketUpdated};

use super::step::ToDeliver;

/// What became of a grant recorded, or a delivery claimed, by a step that
/// claims what it hands out.
pub(super) enum Claimed {
    /// Recorded and claimed, or claimed: to deliver.
    Deliver(ToDeliver),
    /// Another dispatcher's claim on it is live until then (Unix ms).
    Elsewhere(LeaseDigest, u64),
    /// Its grant was not recorded: the ticket as it is, and whether the
    /// grant's lease is live.
    NotRecorded(TicketItem, bool),
    /// Nothing to do with it now (it moved on).
    Passed,
    Failed(Error),
}

type CallFuture<'c> = Pin<Box<dyn Future<Output = Result<TicketUpdated, StoreError>> + Send + 'c>>;

impl Service {
    /// Records the grant that a request's own write handed the ticket of
    /// `digest` (`waiting` → `granted`) with its first attempt's `claim`, in
    /// one write: the ticket as written, or `None` when it had moved
    /// (cancelled, expired, or recorded by a step first: a step decides).
    pub async fn record_own_grant(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        grant: TicketGrant,
        claim: DeliveryClaim,
        call: &mut Budget,
    ) -> Result<Option<TicketItem>, Error> {
        let tickets = self.ticket_store()?;
        let mut ctx = self.ctx(call, Duration::ZERO);
        let waiting = TicketState::Waiting;
        match ctx
            .call(tickets.record_grant(key, digest, &waiting, grant, Some(claim)))
            .await?
        {
            TicketUpdated::Written(item) => Ok(Some(item)),
            TicketUpdated::Lost(_) | TicketUpdated::Gone => Ok(None),
        }
    }

    /// Records `grants` with their first attempts claimed in the same
    /// writes, and claims the `redeliver`ies' next attempts, side by side.
    /// (Each first attempt still reads the pool after its claim, right
    /// before its POST: a read beside the claim, done as the round's writes
    /// all end, let a lease returned meanwhile be delivered.)
    pub(super) async fn record_and_claim(
        &self,
        ctx: &mut Harness<'_>,
        tickets: &dyn TicketStore,
        key: &PoolKey,
        span: Duration,
        grants: Vec<(TicketItem, TicketGrant, bool)>,
        redeliver: Vec<ToDeliver>,
    ) -> Vec<Claimed> {
        let now = now_ms();
        let claims = |n: usize| -> Vec<DeliveryClaim> {
            (0..n)
                .map(|_| DeliveryClaim {
                    by: fastrand::u64(..),
                    until_ms: now + span.as_millis() as u64,
                })
                .collect()
        };
        let grant_claims = claims(grants.len());
        let redeliver_claims = claims(redeliver.len());
        let mut calls: Vec<CallFuture<'_>> = Vec::new();
        for ((item, grant, _), claim) in grants.iter().zip(&grant_claims) {
            calls.push(Box::pin(async move {
                tickets
                    .record_grant(key, item.digest(), &item.state, *grant, Some(*claim))
                    .await
            }));
        }
        for (delivery, claim) in redeliver.iter().zip(&redeliver_claims) {
            calls.push(Box::pin(async move {
                let digest = delivery.item.digest();
                tickets
                    .claim_attempt(key, digest, delivery.grant.fence, *claim, now)
                    .await
            }));
        }
        let outcomes = ctx.side_by_side(calls).await;
        let mut outcomes = outcomes.into_iter();
        let mut claimed = Vec::new();
        for ((item, grant, live), claim) in grants.into_iter().zip(grant_claims) {
            claimed.push(match outcomes.next() {
                Some(Ok(TicketUpdated::Written(item))) => Claimed::Deliver(ToDeliver {
                    item,
                    grant,
                    claim: Some(claim),
                }),
                Some(Ok(TicketUpdated::Lost(now_as))) => {
                    match claimed_by_its_recorder(&now_as, grant, now) {
                        Some(until_ms) => Claimed::Elsewhere(now_as.digest(), until_ms),
                        None => Claimed::NotRecorded(now_as, live),
                    }
                }
                Some(Ok(TicketUpdated::Gone)) => Claimed::NotRecorded(item, live),
                Some(Err(err)) => Claimed::Failed(err.into()),
                None => Claimed::Passed,
            });
        }
        for (delivery, claim) in redeliver.into_iter().zip(redeliver_claims) {
            claimed.push(match outcomes.next() {
                Some(Ok(TicketUpdated::Written(item))) => Claimed::Deliver(ToDeliver {
                    item,
                    claim: Some(claim),
                    ..delivery
                }),
                Some(Ok(TicketUpdated::Lost(item))) => {
                    match item.claim.filter(|c| c.until_ms > now) {
                        Some(other) => Claimed::Elsewhere(item.digest(), other.until_ms),
                        None => Claimed::Passed,
                    }
                }
                // Unknown whether it landed: if it did, its claim lapses and
                // a later step hands the delivery out again.
                Some(Err(err)) => Claimed::Failed(err.into()),
                _ => Claimed::Passed,
            });
        }
        claimed
    }
}

/// When a ticket's grant was recorded by another with a claim that is live
/// at `now_ms` (a route delivering its own write's grant, or another step):
/// the claim's lapse, until which the delivery is its recorder's.
pub(super) fn claimed_by_its_recorder(
    item: &TicketItem,
    grant: TicketGrant,
    now_ms: u64,
) -> Option<u64> {
    (item.state == TicketState::Granted(grant))
        .then_some(item.claim)
        .flatten()
        .map(|c| c.until_ms)
        .filter(|until| *until > now_ms)
}
