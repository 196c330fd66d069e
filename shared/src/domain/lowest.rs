//! A grant is of the lowest free position at the instant it lands.
//!
//! A write that grants position `P` (a take, or a hand-off to the queue's
//! head) was planned on a read in which every position below `P` was held.
//! A return landing between that read and the write could free one of them,
//! and the grant would then go to a higher position while a lower one is
//! free. So the write also expects each position below `P` that it does not
//! write itself to be still held. A hand-off of that position meanwhile
//! keeps it held and does not fail the grant; only a slot freed does.
//!
//! A split pool item holds only its hot slots: the cold ones below `P`
//! would need a condition each, past DynamoDB's expression limits on a
//! large pool. There every write that frees a slot counts it in its
//! segment (`Split::freed`), and the grant expects, for each segment where
//! it expects a slot still held, that count as read: one condition a
//! segment, which a slot freed and taken again meanwhile does not fool
//! either. A slot above `P` freed in `P`'s own segment fails the grant
//! too; it plans again from the item handed back.
//!
//! A lease that expires inside the write's own round trip frees its slot
//! without a write, so no condition can see it: the grant lands above a
//! slot that expired a few milliseconds before (docs/API.md says so).

use std::collections::BTreeSet;

use super::{segment_of, Change, Expect, Layout, Pool, Slot, Update};

impl Pool {
    /// The conditions `update` (planned on this pool) needs so that every
    /// position it grants is the lowest free one when it lands: each
    /// position below the highest it grants that it does not write, held
    /// as read, still held; on a split pool, no slot freed since the read
    /// in the segments of those positions.
    pub(super) fn lower_positions_held(&self, update: &Update) -> Vec<Expect> {
        let held = self.held_below_grants(update);
        match &self.layout {
            Layout::Flat => held.into_iter().map(Expect::SlotHeld).collect(),
            Layout::Split(split) => held
                .into_iter()
                .map(segment_of)
                .collect::<BTreeSet<u16>>()
                .into_iter()
                .map(|segment| Expect::FreedIn {
                    segment,
                    frees: split.freed(segment),
                })
                .collect(),
        }
    }

    /// The positions below the highest that `update` grants which it does
    /// not write, held as read and not already expected by it.
    fn held_below_grants(&self, update: &Update) -> Vec<u16> {
        let mut written = Vec::new();
        let mut top = None;
        for change in &update.changes {
            match *change {
                Change::Take { position, .. } | Change::HandOff { position, .. } => {
                    written.push(position);
                    top = top.max(Some(position));
                }
                Change::Free(position) => written.push(position),
                _ => {}
            }
        }
        let Some(top) = top else {
            return Vec::new();
        };
        (0..top)
            .filter(|p| !written.contains(p))
            .filter(|&p| matches!(self.slots.get(usize::from(p)), Some(Slot::Held { .. })))
            // The grant as read is already expected: it is held.
            .filter(|&p| {
                !update
                    .expect
                    .iter()
                    .any(|e| matches!(*e, Expect::SlotStamp { position, .. } if position == p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{BorrowPlan, ConditionFailed, ReturnPlan};
    use super::*;

    const HOUR: u64 = 3_600_000;

    /// Slots 0 and 1 held, 2 free: a take of 2 planned now.
    fn planned_take() -> (Pool, Update) {
        let mut pool = Pool::new(3, 0);
        assert_eq!(borrow(&mut pool, 1, HOUR, 10), Some(0));
        assert_eq!(borrow(&mut pool, 2, HOUR, 10), Some(1));
        match pool.plan_borrow(h(3, HOUR), 20, 20, WAITERS) {
            BorrowPlan::Take { update, position } => {
                assert_eq!(position, 2);
                (pool, update)
            }
            other => panic!("expected a take, got {other:?}"),
        }
    }

    #[test]
    fn a_take_expects_every_lower_position_still_held() {
        let (pool, take) = planned_take();
        let lowered = pool.lower(&take).0;
        for p in [0, 1] {
            assert!(lowered.expect.contains(&Expect::SlotHeld(p)), "{lowered:?}");
        }
        assert!(!lowered.expect.contains(&Expect::SlotHeld(2)));
    }

    #[test]
    fn a_take_fails_once_a_lower_slot_is_returned_and_the_next_plan_takes_it() {
        let (mut pool, take) = planned_take();
        let lowered = pool.lower(&take).0;
        let ReturnPlan::Return(_, ret) = pool.plan_return(d(1), 30) else {
            panic!("slot 0 is held");
        };
        pool = landed(&pool, &ret).unwrap();
        assert_eq!(
            pool.apply(&lowered),
            Err(ConditionFailed(Expect::SlotHeld(0)))
        );
        assert_eq!(borrow(&mut pool, 3, HOUR, 40), Some(0));
    }

    #[test]
    fn a_hand_off_of_a_lower_slot_meanwhile_keeps_it_held() {
        let (mut pool, take) = planned_take();
        let lowered = pool.lower(&take).0;
        // A waiter joins and is handed slot 0 by its return: still held.
        join(&mut pool, 4, HOUR, 60_000, 25);
        let ReturnPlan::Return(_, ret) = pool.plan_return(d(1), 30) else {
            panic!("slot 0 is held");
        };
        pool = landed(&pool, &ret).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(4)));
        let after = pool.apply(&lowered).expect("no lower slot was freed");
        assert_eq!(holder_at(&after, 2), Some(d(3)));
    }

    #[test]
    fn a_return_that_hands_its_slot_on_expects_the_lower_ones_held() {
        let mut pool = Pool::new(2, 0);
        assert_eq!(borrow(&mut pool, 1, HOUR, 10), Some(0));
        assert_eq!(borrow(&mut pool, 2, HOUR, 10), Some(1));
        join(&mut pool, 3, HOUR, 60_000, 20);
        let ReturnPlan::Return(_, ret) = pool.plan_return(d(2), 30) else {
            panic!("slot 1 is held");
        };
        assert!(ret
            .changes
            .iter()
            .any(|c| matches!(c, Change::HandOff { position: 1, .. })));
        assert!(pool.lower(&ret).0.expect.contains(&Expect::SlotHeld(0)));
    }

    /// A split pool of `count` with positions `0..held` held (and hot).
    fn split_with_held(count: u16, held: u8) -> Pool {
        let mut pool = Pool::new(count, 0).split_above(0);
        for n in 0..held {
            assert_eq!(borrow(&mut pool, n, HOUR, 10), Some(u16::from(n)));
        }
        pool
    }

    fn take(pool: &Pool, n: u8) -> (Update, u16) {
        match pool.plan_borrow(h(n, HOUR), 20, 20, WAITERS) {
            BorrowPlan::Take { update, position } => (pool.lower(&update).0, position),
            other => panic!("expected a take, got {other:?}"),
        }
    }

    #[test]
    fn a_split_take_expects_no_slot_freed_in_the_segments_below_it() {
        let pool = split_with_held(200, 130);
        let (lowered, position) = take(&pool, 200);
        assert_eq!(position, 130);
        let segments: Vec<u16> = lowered
            .expect
            .iter()
            .filter_map(|e| match *e {
                Expect::FreedIn { segment, frees: 0 } => Some(segment),
                _ => None,
            })
            .collect();
        assert_eq!(segments, vec![0, 1, 2]);
        assert!(!lowered
            .expect
            .iter()
            .any(|e| matches!(e, Expect::SlotHeld(_))));
    }

    #[test]
    fn a_split_take_fails_once_a_lower_slot_is_freed_even_if_taken_again() {
        let mut pool = split_with_held(100, 70);
        let (lowered, position) = take(&pool, 200);
        assert_eq!(position, 70);
        // Slot 3 is returned and taken again before the take lands.
        let ReturnPlan::Return(_, ret) = pool.plan_return(d(3), 30) else {
            panic!("slot 3 is held");
        };
        pool = landed(&pool, &ret).unwrap();
        assert_eq!(borrow(&mut pool, 201, HOUR, 40), Some(3));
        assert_eq!(
            pool.apply(&lowered),
            Err(ConditionFailed(Expect::FreedIn {
                segment: 0,
                frees: 0
            }))
        );
        // Planned again, it takes the lowest free slot as it now is.
        assert_eq!(borrow(&mut pool, 200, HOUR, 50), Some(70));
    }

    #[test]
    fn a_split_take_is_not_failed_by_a_hand_off_below_it() {
        let mut pool = split_with_held(100, 3);
        let (lowered, _) = take(&pool, 200);
        join(&mut pool, 9, HOUR, 60_000, 25);
        let ReturnPlan::Return(_, ret) = pool.plan_return(d(0), 30) else {
            panic!("slot 0 is held");
        };
        pool = landed(&pool, &ret).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(9)));
        let after = pool.apply(&lowered).expect("no slot was freed");
        assert_eq!(holder_at(&after, 3), Some(d(200)));
    }
}
