//! `PUT`: create a pool, or resize it keeping its leases.

use std::time::Duration;

use crate::clock::{now_ms, now_us};
use crate::domain::{Pool, PoolState, ResizeSeen, RESIZE_NONCE_BITS};
use crate::error::Error;
use crate::keys::{PoolId, PoolKey};
use crate::store::{Created, Record, StoreError, StoreErrorKind, Updated};

use super::harness::Harness;
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
            let current = match ctx.call(ctx.store.create(&key, &fresh)).await {
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
            if let Some(state) = resize(&mut ctx, &key, current, count, &mut lost).await? {
                return Ok(state);
            }
            ctx.lost(&mut lost).await?;
            fresh = Record::new(Pool::new(count, now_us()).split_above(split_above));
        }
    }
}

/// Sets the count of the pool read as `current` to `count`: the pool at the
/// instant its count became `count` (or was seen to be it), or `None` when
/// the pool was deleted meanwhile (the caller creates it again).
///
/// A PUT takes effect once. A store sends a resize once (DynamoDB's SDK
/// does not retry it: a retry of a write that landed would fail its
/// condition on that very write), so a lost condition means it did not
/// land. After an error its outcome is unknown: its resize number names
/// this request ([`Pool::plan_resize_as`]), so it tells from the item read
/// again whether its resize landed, and never applies its count again
/// after another PUT's. When it landed, or may have, but the pool as it
/// landed is unknown, the answer is a 502: a retried PUT of the same count
/// writes nothing and answers the pool as it then is.
async fn resize(
    ctx: &mut Harness<'_>,
    key: &PoolKey,
    mut current: Record,
    count: u16,
    lost: &mut u32,
) -> Result<Option<PoolState>, Error> {
    let nonce = fastrand::u32(..1 << RESIZE_NONCE_BITS);
    // The pool at the instant its count became `count`: later writes that
    // only trim free slots past it do not move that instant.
    let mut answer: Option<PoolState> = None;
    loop {
        let now = now_ms();
        let Some(update) = current.pool.plan_resize_as(count, now, nonce) else {
            return Ok(Some(answer.unwrap_or_else(|| current.pool.state(now))));
        };
        let sets_count = update.sets_count();
        if !sets_count && answer.is_none() {
            answer = Some(current.pool.state(now));
        }
        // The pool after the write, and whether it is a fresh read.
        let (seen, fresh) = match ctx.write(key, &current, &update).await {
            Ok(Updated::Written(record)) => {
                if sets_count {
                    let landed = ctx.landed.take().unwrap_or_else(|| record.clone());
                    answer = Some(landed.pool.state(now_ms()));
                }
                current = record;
                continue;
            }
            Ok(Updated::Lost(record)) if record.incarnation == current.incarnation => {
                (record, false)
            }
            Ok(Updated::Lost(_) | Updated::Gone) => return Ok(None),
            Err(err) => match ctx.reload(key, err).await? {
                Some(now) if now.incarnation == current.incarnation => (now, true),
                _ => return Ok(None),
            },
        };
        if sets_count && fresh {
            match current.pool.resize_seen(&seen.pool, nonce) {
                ResizeSeen::NotLanded => {}
                ResizeSeen::Landed | ResizeSeen::Unknown => return Err(unconfirmed()),
            }
        }
        current = if fresh || !ctx.lost(lost).await? {
            seen
        } else {
            // Read afresh; deleted meanwhile, a PUT creates it again (never
            // a 404: that is no answer to a PUT).
            match ctx.load(key).await? {
                Some(now) if now.incarnation == current.incarnation => now,
                _ => return Ok(None),
            }
        };
    }
}

/// A resize that may have landed, or did, at an instant whose pool is not
/// known: a 502, retryable (a PUT again of the same count writes nothing).
fn unconfirmed() -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::TimedOut,
        "the database did not confirm the resize; it may have taken effect",
    ))
}
