//! Helpers the domain's tests share: digests and holders by number, and
//! whole operations planned and applied at once.

use super::{
    BorrowPlan, Callback, Holder, LeaseDigest, Pool, ReturnPlan, Slot, TicketItem, TicketState,
};

pub(super) fn d(n: u8) -> LeaseDigest {
    LeaseDigest([n; 8])
}

pub(super) fn h(n: u8, ttl_ms: u64) -> Holder {
    Holder {
        digest: d(n),
        ttl_ms,
    }
}

pub(super) const WAITERS: usize = 100;

/// `update`, planned on `pool`, landed as a store lands it (as the pool
/// item can check it: see `Pool::lower`).
pub(super) fn landed(pool: &Pool, update: &super::Update) -> Result<Pool, super::ConditionFailed> {
    pool.apply(&pool.lower(update).0)
}

/// Borrows as a newcomer with no wait, applying the plan; the position.
pub(super) fn borrow(pool: &mut Pool, n: u8, ttl: u64, now: u64) -> Option<u16> {
    loop {
        match pool.plan_borrow(h(n, ttl), now, now, WAITERS) {
            BorrowPlan::Take { update, position } => {
                *pool = landed(pool, &update).expect("a fresh plan holds");
                return Some(position);
            }
            BorrowPlan::Held(lease) => return Some(lease.position),
            BorrowPlan::Prune(update) => {
                *pool = landed(pool, &update).expect("a fresh prune holds")
            }
            _ => return None,
        }
    }
}

/// Joins the queue (as a borrower that waits until `give_up_ms`), even past
/// free slots (as one that lost a take does).
pub(super) fn join(pool: &mut Pool, n: u8, ttl: u64, give_up_ms: u64, now: u64) {
    match pool.plan_borrow_or_join(h(n, ttl), give_up_ms, now, WAITERS, false) {
        BorrowPlan::Join(update) => *pool = landed(pool, &update).expect("a fresh join holds"),
        other => panic!("expected a join, got {other:?}"),
    }
}

pub(super) fn give_back(pool: &mut Pool, n: u8, now: u64) -> bool {
    match pool.plan_return(d(n), now) {
        ReturnPlan::Return(_, update) => {
            *pool = landed(pool, &update).expect("a fresh return holds");
            true
        }
        _ => false,
    }
}

pub(super) fn holder_at(pool: &Pool, position: usize) -> Option<LeaseDigest> {
    match pool.slots()[position] {
        Slot::Held { holder, .. } => Some(holder.digest),
        Slot::Free => None,
    }
}

/// A backlog ticket numbered `number`, async when `callback`.
pub(super) fn backlog_item(n: u8, number: u64, joined_ms: u64, callback: bool) -> TicketItem {
    TicketItem {
        number,
        holder: h(n, 1_000),
        incarnation: 1,
        joined_ms,
        wait_until_ms: joined_ms + 600_000,
        callback: callback.then(|| Callback {
            url: "https://example.com/hook".into(),
            token: "t".into(),
        }),
        state: TicketState::Waiting,
        attempts: 0,
        claim: None,
    }
}

/// Takes `n` ticket numbers, as enqueues do.
pub(super) fn number(pool: &mut Pool, n: usize) {
    for _ in 0..n {
        *pool = pool
            .apply(&Pool::plan_number())
            .expect("numbers never collide");
    }
}
