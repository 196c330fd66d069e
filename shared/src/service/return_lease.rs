//! `POST …/return`: a lease freed (handed on), a waiting ticket cancelled,
//! or an unknown lease id remembered.

use std::time::Duration;

use crate::clock::now_ms;
use crate::domain::{Lease, ReturnPlan};
use crate::error::Error;
use crate::keys::{LeaseId, PoolId, PoolKey};
use crate::store::{Record, Updated};

use super::harness::write;
use super::{Budget, Service};

impl Service {
    /// `POST …/return`: whether a live lease was freed. A return of a lease
    /// id whose borrow still waits takes its ticket out of the queue (and
    /// answers `false`: nothing was held); one of an id the pool has never
    /// seen is remembered for a while, so that a borrow with that id
    /// arriving after it is refused (a cancel may overtake its borrow).
    pub async fn return_lease(
        &self,
        id: PoolId,
        lease: LeaseId,
        call: &mut Budget,
    ) -> Result<bool, Error> {
        self.return_key(id.key(), lease, call).await
    }

    /// [`Service::return_lease`] on the pool stored under `key`.
    pub(super) async fn return_key(
        &self,
        key: PoolKey,
        lease: LeaseId,
        call: &mut Budget,
    ) -> Result<bool, Error> {
        let digest = lease.digest();
        let mut ctx = self.ctx(call, Duration::ZERO);
        let mut record = ctx.load_existing(&key).await?;
        let incarnation = record.incarnation;
        let mut lost = 0u32;
        loop {
            if record.incarnation != incarnation {
                // Deleted and registered again: the lease ended with the delete.
                return Ok(false);
            }
            // A lease id left holding two slots (or a slot and a ticket)
            // is repaired first, so that the return frees all it holds.
            if let Some(repair) = record.pool.plan_repair(digest, now_ms()) {
                record = write(&mut ctx, &key, &record, &repair, &mut lost).await?;
                continue;
            }
            let (held, update, remember) = match record.pool.plan_return(digest, now_ms()) {
                ReturnPlan::Return(held, update) => (Some(held), update, false),
                ReturnPlan::Cancel(update) => (None, update, false),
                ReturnPlan::Remember(update) => (None, update, true),
                ReturnPlan::Expired(_) | ReturnPlan::Remembered => return Ok(false),
            };
            let fresh = match ctx.write(&key, &record, &update).await {
                // Its borrow's take or ticket landed between our read and
                // the tombstone (which they are conditioned against, but not
                // it against them): give that up too, as if read first.
                Ok(Updated::Written(new)) if remember && new.pool.asks(digest, now_ms()) => new,
                Ok(Updated::Written(_)) => return Ok(held.is_some()),
                Ok(Updated::Gone) => return Err(Error::PoolNotFound),
                Ok(Updated::Lost(fresh)) => {
                    if ctx.lost(&mut lost).await? {
                        ctx.load_existing(&key).await?
                    } else {
                        fresh
                    }
                }
                Err(err) => ctx.reload(&key, err).await?.ok_or(Error::PoolNotFound)?,
            };
            if let Some(held) = held {
                if gone_while_live(&fresh, incarnation, &held) {
                    return Ok(true);
                }
            }
            record = fresh;
        }
    }
}

/// After a return whose write was lost or failed: the lease is no longer
/// stored although it had not expired, so a write of ours (an earlier SDK
/// attempt, or this one before its answer was lost) or a twin return of the
/// same lease removed it: the return happened.
fn gone_while_live(fresh: &Record, incarnation: u64, held: &Lease) -> bool {
    fresh.incarnation == incarnation
        && held.is_live(now_ms())
        && !fresh
            .pool
            .leases()
            .iter()
            .any(|l| l.position == held.position && l.fence == held.fence)
}
