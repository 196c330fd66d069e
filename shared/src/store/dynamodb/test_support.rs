//! Helpers of the DynamoDB store's tests: a realistic clock, holders, and
//! pools full, queued or churned through the ring.

use crate::domain::{BorrowPlan, Holder, Layout, LeaseDigest, Pool, Slot, Stamp};
use crate::store::Record;

/// A realistic clock: stamps and give-up times have today's digit counts.
pub(super) const NOW: u64 = 1_763_900_000_000;

pub(super) fn holder(n: u16, ttl_ms: u64) -> Holder {
    let mut d = [0xab; 8];
    d[..2].copy_from_slice(&n.to_be_bytes());
    Holder {
        digest: LeaseDigest(d),
        ttl_ms,
    }
}

/// A pool of `count` with every slot held (ttl 30 s) and `waiting` tickets
/// queued, after `grants` grants in all (fences grow with a pool's age).
pub(super) fn full_pool(count: u16, waiting: u16, grants: u64) -> Record {
    // As this store keeps every pool: flat.
    let mut pool = Pool::new(count, NOW * 1000).with_layout(Layout::Flat);
    let mut pool_parts = (pool.clone(), grants);
    for n in 0..count {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(n, 30_000), NOW, NOW, 1000)
        else {
            panic!("slot {n}")
        };
        pool = pool.apply(&update).unwrap();
    }
    for n in 0..waiting {
        let BorrowPlan::Join(update) =
            pool.plan_borrow(holder(1000 + n, 30_000), NOW + 25_000, NOW, 1000)
        else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
    }
    // Age the fences: as if `grants` grants had happened before these.
    pool_parts.0 = pool;
    let pool = &pool_parts.0;
    let slots = pool
        .slots()
        .iter()
        .map(|s| match *s {
            Slot::Held { holder, stamp } => Slot::Held {
                holder,
                stamp: Stamp {
                    fence: stamp.fence + grants,
                    ..stamp
                },
            },
            Slot::Free => Slot::Free,
        })
        .collect();
    Record {
        incarnation: u64::MAX,
        pool: Pool::from_parts(
            pool.sizing(),
            pool.base_us(),
            pool.next_fence() + grants,
            slots,
            pool.queue().to_vec(),
            pool.given_up().to_vec(),
            pool.ended().to_vec(),
        )
        .unwrap(),
    }
}

/// A pool whose short grants were handed on, expired and reused: the ring of
/// memories they leave (one per place, however many churn).
pub(super) fn churned_pool(grants: u16) -> Pool {
    let mut pool = Pool::new(1, NOW * 1000);
    let mut now = NOW;
    // Waiters take turns on the one slot, each handed a 1-s grant that
    // expires and is reused by the next hand-off.
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(0, 1_000), now, now, 100) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    for n in 1..=grants {
        let BorrowPlan::Join(join) = pool.plan_borrow(holder(n, 1_000), now + 20_000, now, 100)
        else {
            panic!("join {n}")
        };
        pool = pool.apply(&join).unwrap();
        now += 1_500;
        let crate::domain::WaitPlan::Waiting {
            duty: Some(update), ..
        } = pool.plan_wait(&holder(n, 1_000), now - 1_500, now)
        else {
            panic!("hand-off {n}")
        };
        pool = pool.apply(&update).unwrap();
    }
    pool
}
