//! The baseline: the aws-samples Step Functions semaphore's way, on the same
//! domain and store. Every write is pinned to the whole pool as read ([`pins`],
//! the equivalent of a version check), a lost write is followed by a fresh
//! read (the record it handed back is ignored), and a borrower that finds the
//! pool full sleeps a fixed 3 s before reading again. No queue: whoever reads
//! and writes first after a slot frees gets it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::clock::now_ms;
use semaphore::domain::{BorrowPlan, Expect, Holder, Lease, Pool, ReturnPlan, Slot, Update};
use semaphore::keys::{LeaseId, PoolKey};
use semaphore::store::{PoolStore, StoreError, StoreErrorKind, Updated};

pub const FULL_SLEEP: Duration = Duration::from_secs(3);

pub struct Naive {
    pub store: Arc<dyn PoolStore>,
}

fn gone() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "pool vanished")
}

/// Expectations that fail on any change at all to `pool`: what a whole-item
/// version check amounts to.
pub fn pins(pool: &Pool) -> Vec<Expect> {
    let mut pins = vec![
        Expect::Count(pool.sizing()),
        Expect::SlotsLen(pool.slots().len()),
        Expect::QueueLen(pool.queue().len()),
    ];
    for (position, slot) in pool.slots().iter().enumerate() {
        let position = position as u16;
        pins.push(match slot {
            Slot::Free => Expect::SlotFree(position),
            Slot::Held { stamp, .. } => Expect::SlotStamp {
                position,
                stamp: *stamp,
            },
        });
    }
    for (index, ticket) in pool.queue().iter().enumerate() {
        pins.push(Expect::TicketAt {
            index,
            holder: ticket.holder,
        });
    }
    pins
}

/// `update`, also conditioned on every part of `pool` as read.
fn pinned(update: Update, pool: &Pool) -> Update {
    let mut all = update;
    all.expect.extend(pins(pool));
    all
}

impl Naive {
    /// The granted lease, or `None` if `give_up` passed while the pool was full.
    pub async fn borrow(
        &self,
        key: &PoolKey,
        ttl_ms: u64,
        give_up: Instant,
    ) -> Result<Option<Lease>, StoreError> {
        let holder = Holder {
            digest: LeaseId::new_random().digest(),
            ttl_ms,
        };
        loop {
            let record = self.store.load(key).await?.ok_or_else(gone)?;
            let now = now_ms();
            // It never waits in the queue: a join means the pool is full.
            let update = match record.pool.plan_borrow(holder, now, now, usize::MAX) {
                BorrowPlan::Held(lease) => return Ok(Some(lease)),
                BorrowPlan::Take { update, .. } | BorrowPlan::Prune(update) => update,
                _ => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    tokio::time::sleep(FULL_SLEEP.min(left)).await;
                    continue;
                }
            };
            let update = pinned(update, &record.pool);
            match self.store.update(key, &record, &update).await? {
                Updated::Written(now_stored) => {
                    if let Some(lease) = now_stored.pool.live_lease(holder.digest, now_ms()) {
                        return Ok(Some(lease));
                    }
                    // A prune landed: read and plan again.
                }
                Updated::Lost(_) => {}
                Updated::Gone => return Err(gone()),
            }
        }
    }

    /// Whether a live lease was freed.
    pub async fn return_lease(&self, key: &PoolKey, lease: &Lease) -> Result<bool, StoreError> {
        loop {
            let record = self.store.load(key).await?.ok_or_else(gone)?;
            let ReturnPlan::Return(_, update) = record.pool.plan_return(lease.digest, now_ms())
            else {
                return Ok(false);
            };
            let update = pinned(update, &record.pool);
            match self.store.update(key, &record, &update).await? {
                Updated::Written(_) => return Ok(true),
                Updated::Lost(_) => {}
                Updated::Gone => return Err(gone()),
            }
        }
    }
}
