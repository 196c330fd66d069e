//! A new count: extend the slots, or trim free ones past it.

use super::{Change, Expect, Pool, Sizing, Slot, Update, MAX_PRUNE};

/// The low bits of a resize number that name the request that set it; the
/// bits above count resizes.
pub const RESIZE_NONCE_BITS: u32 = 20;

/// What a pool read after a resize write of unknown outcome says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeSeen {
    /// No resize landed since the read it was planned on, or another one
    /// landed in its place (it was conditioned on the count as read, so it
    /// cannot land after that one): it did not land, and may be planned again.
    NotLanded,
    /// It landed and is the last resize. Its count is in force, but the
    /// pool as it landed is not known: the item may show later writes.
    Landed,
    /// More than one resize landed since the read: it may have landed before
    /// the others, or not at all. Writing it again could apply its count a
    /// second time, after a later request's.
    Unknown,
}

impl Pool {
    /// Removes free slots from the end of the list past `count` (up to
    /// [`MAX_PRUNE`]), each conditioned on being free, and the count as read.
    pub(super) fn trim(&self, count: u16) -> Option<Update> {
        let len = self.slots.len();
        let keep = usize::from(count).max(
            self.slots
                .iter()
                .rposition(|s| *s != Slot::Free)
                .map_or(0, |p| p + 1),
        );
        if keep >= len {
            return None;
        }
        let from = keep.max(len.saturating_sub(MAX_PRUNE));
        let mut update = Update::default();
        // A resize landing first may need these slots.
        update.expect.push(Expect::Count(self.sizing()));
        update.expect.push(Expect::SlotsLen(len));
        for p in from..len {
            update.expect.push(Expect::SlotFree(p as u16));
        }
        update.changes.push(Change::Truncate { from, len });
        Some(update)
    }

    /// Sets `count`, keeping every lease (a shrink only withholds new
    /// borrows), growing the slot list to it or trimming free slots past it.
    /// Waiters see a raise on their next read and hand its slots to the head.
    /// `None` when nothing needs writing.
    pub fn plan_resize(&self, count: u16, now_ms: u64) -> Option<Update> {
        self.plan_resize_as(count, now_ms, 0)
    }

    /// [`Pool::plan_resize`] by the request that drew `nonce` (below
    /// 2^[`RESIZE_NONCE_BITS`]): the resize number it sets is the next
    /// sequence number with `nonce` in its low bits, so that a request whose
    /// write's outcome it never learned can tell its own resize in the item
    /// ([`Pool::resize_seen`]) and never applies its count a second time.
    pub fn plan_resize_as(&self, count: u16, now_ms: u64, nonce: u32) -> Option<Update> {
        let len = self.slots.len();
        let mut update = self.prune_given_up(now_ms, None);
        if self.count != count {
            // Conditioned on the count as read: resizes go one at a time.
            update.expect.push(Expect::Count(self.sizing()));
            update.changes.push(Change::SetCount(Sizing {
                count,
                resizes: self.next_resize(nonce),
            }));
        }
        if usize::from(count) > len {
            update.expect.push(Expect::SlotsLen(len));
            update
                .changes
                .push(Change::Extend(usize::from(count) - len));
        } else if count > self.count {
            // A raise into slots kept past the old count (held after a
            // shrink) needs them still there: a return may trim them first.
            update.expect.push(Expect::SlotsLen(len));
        } else {
            if let Some(trim) = self.trim(count) {
                update.expect.extend(trim.expect);
                update.changes.extend(trim.changes);
            }
        }
        (!update.changes.is_empty()).then_some(update)
    }
}

impl Pool {
    /// The resize number the next resize by the request of `nonce` sets.
    fn next_resize(&self, nonce: u32) -> u64 {
        let mask = (1u64 << RESIZE_NONCE_BITS) - 1;
        ((self.resizes >> RESIZE_NONCE_BITS) + 1) << RESIZE_NONCE_BITS | (u64::from(nonce) & mask)
    }

    /// What `seen` (the pool read, or handed back by a lost write, after a
    /// resize by the request of `nonce` planned on `self`) says of that
    /// resize. A count set by no resize since `self` is `NotLanded` too.
    pub fn resize_seen(&self, seen: &Pool, nonce: u32) -> ResizeSeen {
        let ours = self.next_resize(nonce);
        let sequence = |resizes: u64| resizes >> RESIZE_NONCE_BITS;
        if seen.resizes == self.resizes {
            ResizeSeen::NotLanded
        } else if seen.resizes == ours {
            ResizeSeen::Landed
        } else if sequence(seen.resizes) == sequence(ours) {
            ResizeSeen::NotLanded
        } else {
            ResizeSeen::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ConditionFailed, PoolState, ReturnPlan};
    use super::*;

    #[test]
    fn count_zero_never_grants() {
        let mut pool = Pool::new(0, 0);
        assert_eq!(borrow(&mut pool, 1, 100, 0), None);
        assert_eq!(
            pool.state(0),
            PoolState {
                count: 0,
                in_use: 0,
                available: 0,
                waiting: 0
            }
        );
    }

    #[test]
    fn a_shrink_keeps_live_leases_withholds_borrows_and_trims_freed_slots() {
        let mut pool = Pool::new(4, 0);
        for n in 0..4 {
            borrow(&mut pool, n, 100, 0);
        }
        pool = pool.apply(&pool.plan_resize(2, 1).unwrap()).unwrap();
        let state = pool.state(1);
        assert_eq!((state.count, state.in_use, state.available), (2, 4, 0));
        assert_eq!(pool.slots().len(), 4, "held positions past count stay");
        assert!(give_back(&mut pool, 0, 2));
        assert_eq!(borrow(&mut pool, 9, 100, 2), None);
        assert!(give_back(&mut pool, 3, 3));
        assert_eq!(
            pool.slots().len(),
            3,
            "a free slot at the end past count goes"
        );
        assert!(give_back(&mut pool, 2, 3));
        assert_eq!(pool.slots().len(), 2);
        assert_eq!(borrow(&mut pool, 9, 100, 3), Some(0));
        assert_eq!(borrow(&mut pool, 10, 100, 3), None);
        assert_eq!(pool.plan_resize(2, 3), None);
    }

    #[test]
    fn a_raise_into_slots_kept_past_a_shrink_conflicts_with_their_trim() {
        let mut pool = Pool::new(4, 0);
        for n in 0..4 {
            borrow(&mut pool, n, 100, 0);
        }
        pool = pool.apply(&pool.plan_resize(2, 1).unwrap()).unwrap();
        // Both planned from one read: the raise counts on position 3, which the
        // return of its lease trims.
        let raise = pool.plan_resize(4, 2).unwrap();
        let ReturnPlan::Return(_, trim) = pool.plan_return(d(3), 2) else {
            panic!()
        };
        let trimmed = pool.apply(&trim).unwrap();
        assert_eq!(trimmed.slots().len(), 3);
        assert_eq!(
            trimmed.apply(&raise).err(),
            Some(ConditionFailed(Expect::SlotsLen(4))),
            "count 4 over 3 slots would be an unreadable pool"
        );
        let raised = trimmed.apply(&trimmed.plan_resize(4, 3).unwrap()).unwrap();
        assert_eq!((raised.count(), raised.slots().len()), (4, 4));
    }

    #[test]
    fn a_return_after_a_shrink_hands_off_only_what_count_allows() {
        let mut pool = Pool::new(3, 0);
        for n in 0..3 {
            borrow(&mut pool, n, 100, 0);
        }
        join(&mut pool, 9, 100, 60_000, 0);
        pool = pool.apply(&pool.plan_resize(1, 1).unwrap()).unwrap();
        // Three live on a count of one: the first two returns free, the third hands off.
        for n in [2, 1] {
            let ReturnPlan::Return(_, update) = pool.plan_return(d(n), 2) else {
                panic!()
            };
            assert!(!update
                .changes
                .iter()
                .any(|c| matches!(c, Change::HandOff { .. })));
            pool = pool.apply(&update).unwrap();
        }
        let ReturnPlan::Return(_, update) = pool.plan_return(d(0), 3) else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(9)));
    }
}

#[cfg(test)]
mod seen_tests {
    use super::*;

    fn resized(pool: &Pool, count: u16, nonce: u32) -> Pool {
        pool.apply(&pool.plan_resize_as(count, 0, nonce).unwrap())
            .unwrap()
    }

    #[test]
    fn a_put_tells_its_own_resize_from_anothers() {
        let read = Pool::new(1, 0);
        let ours = resized(&read, 2, 7);
        assert_eq!(read.resize_seen(&read, 7), ResizeSeen::NotLanded);
        assert_eq!(read.resize_seen(&ours, 7), ResizeSeen::Landed);
        // Another PUT's resize from the same read landed instead.
        let theirs = resized(&read, 5, 9);
        assert_eq!(read.resize_seen(&theirs, 7), ResizeSeen::NotLanded);
        // Ours, then another after it; or another, then a third: either.
        assert_eq!(
            read.resize_seen(&resized(&ours, 7, 9), 7),
            ResizeSeen::Unknown
        );
        assert_eq!(
            read.resize_seen(&resized(&theirs, 7, 9), 7),
            ResizeSeen::Unknown
        );
    }

    #[test]
    fn resize_numbers_rise_whatever_the_nonces() {
        let mut pool = Pool::new(1, 0);
        let mut last = pool.sizing().resizes;
        for (count, nonce) in [(2, (1 << RESIZE_NONCE_BITS) - 1), (3, 0), (4, 5)] {
            pool = resized(&pool, count, nonce);
            assert!(pool.sizing().resizes > last);
            last = pool.sizing().resizes;
        }
    }
}
