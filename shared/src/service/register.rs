//! `PUT`: create a pool, or resize it keeping its leases.

use std::time::Duration;

use crate::clock::{now_ms, now_us};
use crate::domain::{Pool, PoolState};
use crate::error::Error;
use crate::keys::{PoolId, PoolKey};
use crate::store::{Created, Record, Updated};

use super::{Budget, Service};

impl Service {
    /// `PUT`: creates the pool, or sets its count keeping live leases.
    pub async fn register(
        &self,
        id: PoolId,
        count: u16,
        call: &mut Budget,
    ) -> Result<PoolState, Error> {
        self.register_key(id.key(), count, call).await
    }

    /// [`Service::register`] of the pool stored under `key`.
    pub(super) async fn register_key(
        &self,
        key: PoolKey,
        count: u16,
        call: &mut Budget,
    ) -> Result<PoolState, Error> {
        let mut ctx = self.ctx(call, Duration::ZERO);
        let split_above = self.timing.compaction.split_above;
        let mut fresh = Record::new(Pool::new(count, now_us()).split_above(split_above));
        let mut lost = 0u32;
        loop {
            let mut current = match ctx.call(ctx.store.create(&key, &fresh)).await {
                Ok(Created::Created(record)) => return Ok(record.pool.state(now_ms())),
                Ok(Created::Exists(current)) => current,
                // Unknown outcome: our create may have landed.
                Err(err) => match ctx.reload(&key, err).await? {
                    // Ours landed: answer the pool as our write left it,
                    // not as later calls may have changed it since.
                    Some(current) if current.incarnation == fresh.incarnation => {
                        return Ok(fresh.pool.state(now_ms()));
                    }
                    Some(current) => current,
                    None => continue,
                },
            };
            // Resize the pool that exists, deciding again from each record
            // a lost write hands back; start over if it is deleted.
            loop {
                let Some(update) = current.pool.plan_resize(count, now_ms()) else {
                    return Ok(current.pool.state(now_ms()));
                };
                match ctx.write(&key, &current, &update).await {
                    Ok(Updated::Written(record)) => {
                        if record.pool.plan_resize(count, now_ms()).is_none() {
                            return Ok(record.pool.state(now_ms()));
                        }
                        // More to trim than one write carries.
                        current = record;
                    }
                    Ok(Updated::Lost(record)) if record.incarnation == current.incarnation => {
                        if !ctx.lost(&mut lost).await? {
                            current = record;
                            continue;
                        }
                        // Read afresh; deleted meanwhile, a PUT creates it
                        // again (never a 404: that is no answer to a PUT).
                        match ctx.load(&key).await? {
                            Some(now) if now.incarnation == current.incarnation => current = now,
                            _ => break,
                        }
                    }
                    Ok(Updated::Lost(_) | Updated::Gone) => break,
                    Err(err) => match ctx.reload(&key, err).await? {
                        Some(now) if now.incarnation == current.incarnation => current = now,
                        _ => break,
                    },
                }
            }
            ctx.lost(&mut lost).await?;
            fresh = Record::new(Pool::new(count, now_us()).split_above(split_above));
        }
    }
}
