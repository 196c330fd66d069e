//! Tests of `layout.rs`.

use super::super::test_support::*;
use super::super::{BorrowPlan, CompactionPlan, ReturnPlan};
use super::*;

const NOW: u64 = 1_000_000;

fn split(pool: &Pool) -> &Split {
    match pool.layout() {
        Layout::Split(split) => split,
        Layout::Flat => panic!("not split"),
    }
}

/// A split pool of `count` with holder `n` on position `n` for each of
/// `held`, each written (so hot), granted at `at`.
fn held_pool(count: u16, held: &[u8], at: u64) -> Pool {
    let mut pool = Pool::new(count, 0);
    for &n in held {
        // Takes land as lowered, so this is what the pool item shows.
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(n, 60_000), at, at, 100) else {
            panic!("no take for {n}")
        };
        let (lowered, _) = pool.lower(&update);
        pool = pool.apply(&lowered).expect("a fresh take lands");
    }
    pool
}

#[test]
fn a_pool_above_the_flat_maximum_starts_split_with_nothing_hot() {
    assert_eq!(Pool::new(FLAT_MAX, 0).layout(), &Layout::Flat);
    let pool = Pool::new(FLAT_MAX + 1, 0);
    assert_eq!(pool.layout(), &Layout::Split(Box::default()));
    assert_eq!(pool.slots().len(), usize::from(FLAT_MAX) + 1);
    // A flat pool's writes are as planned.
    let flat = Pool::new(4, 0);
    let BorrowPlan::Take { update, .. } = flat.plan_borrow(h(1, 100), NOW, NOW, 100) else {
        panic!()
    };
    assert_eq!(flat.lower(&update), (update, None));
}

/// A take of a cold slot conditions on its segment's version and that
/// no hot entry shadows it; the slot is hot after. `NotHeld` is left to
/// the caller.
#[test]
fn a_write_on_a_cold_slot_conditions_on_its_segment_version() {
    let pool = Pool::new(200, 0);
    let BorrowPlan::Take { update, position } = pool.plan_borrow(h(1, 100), NOW, NOW, 100) else {
        panic!()
    };
    assert_eq!(position, 0);
    let (lowered, unchecked) = pool.lower(&update);
    assert!(lowered.expect.contains(&Expect::Cold {
        position: 0,
        version: 0
    }));
    assert!(!lowered.expect.iter().any(|e| matches!(
        e,
        Expect::SlotFree(_) | Expect::NotHeld(_) | Expect::SlotsLen(_)
    )));
    assert_eq!(unchecked, Some(h(1, 100)));
    let after = pool.apply(&lowered).unwrap();
    assert!(split(&after).hot().contains(&0));
    // Planned again on the pool as it was: the slot is hot now.
    assert!(after.apply(&lowered).is_err());
}

/// A write that finds compaction due carries a claim; of writers landing
/// together the first claim stands, and only its writer compacts (its
/// compaction ends the claim). A claim that lapsed is claimed over. A flat
/// pool never compacts.
#[test]
fn a_write_that_finds_compaction_due_claims_it_and_only_its_claimer_compacts() {
    let config = Compaction {
        hot_max: 16,
        ..Compaction::DEFAULT
    };
    let pool = held_pool(200, &(0..16).collect::<Vec<u8>>(), NOW - 10_000);
    // At the bound: not due; a take that passes it leaves it due.
    assert_eq!(pool.compaction_claim(config, NOW, 1), None);
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(99, 60_000), NOW, NOW, 100) else {
        panic!()
    };
    let take = pool.lower(&update).0;
    assert!(matches!(
        pool.compaction_claim_after(&take, config, NOW, 1),
        Some(Change::ClaimCompaction { over: 0, .. })
    ));
    let below = Compaction {
        hot_max: 17,
        ..config
    };
    assert_eq!(pool.compaction_claim_after(&take, below, NOW, 1), None);
    let pool = held_pool(200, &(0..17).collect::<Vec<u8>>(), NOW - 10_000);
    let Some(Change::ClaimCompaction { token: a, over: 0 }) = pool.compaction_claim(config, NOW, 1)
    else {
        panic!("due, unclaimed")
    };
    let Some(Change::ClaimCompaction { token: b, over: 0 }) = pool.compaction_claim(config, NOW, 2)
    else {
        panic!("due, unclaimed")
    };
    assert_ne!(a, b, "told apart by their nonces");
    let carry = |pool: &Pool, claim: Change| {
        pool.apply(&Update {
            expect: Vec::new(),
            changes: vec![claim],
        })
        .expect("a claim has no condition")
    };
    // Both land: the first claim stands.
    let claimed = carry(&pool, Change::ClaimCompaction { token: a, over: 0 });
    let claimed = carry(&claimed, Change::ClaimCompaction { token: b, over: 0 });
    assert!(claimed.holds_compaction_claim(a));
    assert!(!claimed.holds_compaction_claim(b));
    // Live: nobody claims again.
    assert_eq!(
        claimed.compaction_claim(config, NOW + config.claim_ms - 1, 3),
        None
    );
    // Lapsed: claimed over.
    let Some(over) = claimed.compaction_claim(config, NOW + config.claim_ms, 3) else {
        panic!("lapsed")
    };
    assert!(matches!(over, Change::ClaimCompaction { over, .. } if over == a));
    let Change::ClaimCompaction { token: c, .. } = over else {
        unreachable!()
    };
    assert!(carry(&claimed, over).holds_compaction_claim(c));
    // The compaction ends the claim.
    let plan = claimed.plan_compaction(config, NOW).expect("due");
    assert!(plan.update.changes.contains(&Change::EndCompactionClaim));
    let after = claimed
        .apply(&plan.update)
        .expect("a fresh compaction lands");
    assert_eq!(split(&after).claim(), 0);
    assert!(split(&after).hot().is_empty(), "every old entry left");
    // A flat pool never compacts.
    let mut flat = Pool::new(FLAT_MAX, 0);
    for n in 0..FLAT_MAX as u8 {
        borrow(&mut flat, n, 60_000, NOW - 10_000);
    }
    assert_eq!(flat.compaction_claim(config, NOW, 1), None);
    assert_eq!(flat.plan_compaction(config, NOW), None);
}

#[test]
fn compaction_moves_the_fullest_segments_free_expired_and_old_entries() {
    // Holders on positions 0..3 granted long ago, 3..70 just now:
    // only the old ones may leave, whatever the others' number.
    let mut pool = held_pool(200, &[0, 1, 2], NOW - 10_000);
    // 3..64 taken now too, so that the next takes land in segment 1.
    for n in 3..70u8 {
        borrow(&mut pool, n, 60_000, NOW);
    }
    let config = Compaction {
        split_above: FLAT_MAX,
        hot_max: 4,
        cold_after_ms: 4_000,
        claim_ms: 1_000,
    };
    let plan = pool.plan_compaction(config, NOW).expect("compaction due");
    assert_eq!(plan.segments.len(), 1, "segment 1's are all young");
    let segment = &plan.segments[0];
    assert_eq!(segment.segment, 0);
    let moved: Vec<u16> = plan
        .update
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Cool(p) => Some(*p),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![0, 1, 2], "only the old grants leave");
    assert_eq!(segment.slots.len(), usize::from(SEGMENT_SLOTS));
    assert_eq!(segment.slots[..64], pool.slots()[..64]);
    assert_eq!((segment.stored, segment.version), (0, 1));
    let after = pool.apply(&plan.update).expect("a fresh compaction lands");
    assert!(!split(&after).hot().contains(&0));
    assert_eq!(split(&after).version(0), 1);
    assert_eq!(after.slots(), pool.slots(), "the truth is unchanged");
    // Not due below the bound.
    let relaxed = Compaction {
        hot_max: 1_000,
        ..config
    };
    assert_eq!(pool.plan_compaction(relaxed, NOW), None);
    // Once they have aged, the fullest segment first; segment 1's 6 would
    // take the write past 64 entries: the next compaction's.
    let later = after
        .plan_compaction(config, NOW + 4_000)
        .expect("compaction due");
    let segments: Vec<u16> = later.segments.iter().map(|s| s.segment).collect();
    assert_eq!(segments, [0], "61 old entries of segment 0 first");
}

/// Borrowers that cycle take the lowest free slots again at once: as many
/// of those as leases were granted within `cold_after_ms` stay hot (a
/// compaction cooling them would lose to those takes); higher free ones,
/// and old grants, leave.
#[test]
fn compaction_leaves_hot_the_free_slots_cycling_borrowers_take_next() {
    let mut pool = held_pool(100, &(0..20).collect::<Vec<u8>>(), NOW - 10_000);
    assert!(give_back(&mut pool, 19, NOW - 9_000));
    for n in 1..=6 {
        assert!(give_back(&mut pool, n, NOW - 1));
    }
    // Two borrowers cycle: they hold 1 and 2 now, 3..=6 and 19 are free.
    assert_eq!(borrow(&mut pool, 50, 60_000, NOW), Some(1));
    assert_eq!(borrow(&mut pool, 51, 60_000, NOW), Some(2));
    let config = Compaction {
        split_above: FLAT_MAX,
        hot_max: 4,
        cold_after_ms: 4_000,
        claim_ms: 1_000,
    };
    let moved = cooled(&pool.plan_compaction(config, NOW).expect("due"));
    let expected: Vec<u16> = [0].into_iter().chain(5..=18).chain([19]).collect();
    assert_eq!(moved, expected, "3 and 4 are the next takes'");
    // Once those grants are old, nothing cycles: every free slot may leave.
    let later = cooled(&pool.plan_compaction(config, NOW + 4_000).expect("due"));
    assert_eq!(later, (0..20).collect::<Vec<u16>>());
    // More borrowers cycle than `hot_max`: no more than `hot_max` free slots
    // stay hot for them (the pool item's size stays bounded).
    for n in 52..56 {
        borrow(&mut pool, n, 60_000, NOW);
    }
    assert!(give_back(&mut pool, 52, NOW));
    assert!(give_back(&mut pool, 53, NOW));
    // Four young grants (1, 2, 5, 6); 3, 4 and 19 free, hot. Uncapped, the
    // four lowest free (3, 4, 19, 20) would stay; capped at 2, only 3 and 4.
    let capped = Compaction {
        hot_max: 2,
        ..config
    };
    let moved = cooled(&pool.plan_compaction(capped, NOW).expect("due"));
    assert!(!moved.contains(&3) && !moved.contains(&4), "{moved:?}");
    assert!(moved.contains(&19), "{moved:?}");
}

/// The positions a compaction moves.
fn cooled(plan: &CompactionPlan) -> Vec<u16> {
    plan.update
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Cool(p) => Some(*p),
            _ => None,
        })
        .collect()
}

/// One compaction cools the fullest segments' entries in one pool item
/// write (the most first, up to a bound of entries), and leaves hot the
/// free slots the queue's waiters are handed next.
#[test]
fn a_compaction_takes_the_fullest_segments_and_leaves_the_waiters_next_slots() {
    // Old grants on 0..140 (those on 3 and 5 run out at NOW - 2 s), of
    // which 0..10, 64..74 and 128..131 are hot.
    let mut pool = Pool::new(200, 0);
    for n in 0..140u8 {
        let ttl = if n == 3 || n == 5 { 8_000 } else { 60_000 };
        assert_eq!(borrow(&mut pool, n, ttl, NOW - 10_000), Some(u16::from(n)));
    }
    let hot = (0..10).chain(64..74).chain(128..131).collect();
    let mut pool = pool.with_layout(Layout::Split(Box::new(Split::new(
        hot,
        BTreeMap::new(),
        BTreeMap::new(),
    ))));
    let config = Compaction {
        hot_max: 4,
        ..Compaction::DEFAULT
    };
    let plan = pool.plan_compaction(config, NOW).unwrap();
    let segments: Vec<u16> = plan.segments.iter().map(|s| s.segment).collect();
    assert_eq!(segments, [0, 1, 2]);
    assert_eq!(cooled(&plan).len(), 23);
    let after = pool.apply(&plan.update).expect("a fresh compaction lands");
    assert!(split(&after).hot().is_empty());
    assert_eq!(after.slots(), pool.slots(), "the truth is unchanged");
    // One waiter in line since before 3 and 5 ran out: the lowest of them
    // is its next, and stays; the other leaves with the rest.
    join(&mut pool, 200, 60_000, NOW + 5_000, NOW - 5_000);
    assert_eq!(pool.queue().len(), 1);
    let moved = cooled(&pool.plan_compaction(config, NOW).unwrap());
    assert!(!moved.contains(&3) && moved.contains(&5), "{moved:?}");
    assert_eq!(moved.len(), 22);
    // Many segments' worth: the first segments up to the bound of
    // entries, the rest left for the next compaction.
    let mut full = Pool::new(1_000, 0);
    for n in 0..200u8 {
        borrow(&mut full, n, 60_000, NOW - 10_000);
    }
    for n in 0..200u8 {
        assert!(give_back(&mut full, n, NOW - 10_000));
    }
    let plan = full.plan_compaction(config, NOW).unwrap();
    assert!(cooled(&plan).len() <= 64);
    assert!(plan.segments.len() < 4, "{:?}", plan.segments.len());
}

/// A compaction that wrote its segment but not the pool item leaves the
/// segment ahead: the next one only catches the pool item up.
#[test]
fn a_segment_ahead_of_the_pool_item_is_caught_up_before_it_is_written_again() {
    let pool = held_pool(100, &[0, 1], NOW - 10_000);
    let Layout::Split(s) = pool.layout().clone() else {
        panic!()
    };
    let ahead = pool.with_layout(Layout::Split(Box::new(Split::new(
        s.hot.clone(),
        s.versions.clone(),
        [(0, 1)].into(),
    ))));
    let config = Compaction {
        split_above: FLAT_MAX,
        hot_max: 0,
        cold_after_ms: 4_000,
        claim_ms: 1_000,
    };
    let plan = ahead.plan_compaction(config, NOW).unwrap();
    assert!(plan.segments[0].slots.is_empty(), "no segment write");
    assert_eq!(
        plan.update.changes,
        vec![Change::SetSegmentVersion {
            segment: 0,
            version: 1
        }]
    );
    let caught_up = ahead.apply(&plan.update).unwrap();
    assert_eq!(
        split(&caught_up).hot(),
        split(&ahead).hot(),
        "nothing cooled"
    );
    let next = caught_up.plan_compaction(config, NOW).unwrap();
    assert_eq!((next.segments[0].stored, next.segments[0].version), (1, 2));
}

/// A compaction whose pool item write lost (an entry it moves was returned
/// meanwhile) after its segments landed is made again on the pool as the
/// loss showed it: the entries still as their segment holds them leave,
/// the one written since stays hot, and no segment is written again.
#[test]
fn a_lost_compaction_is_made_again_over_its_segments() {
    let config = Compaction {
        hot_max: 0,
        ..Compaction::DEFAULT
    };
    // Old grants on 0..4 (segment 0) and 64..66 (segment 1).
    let mut pool = Pool::new(200, 0);
    for n in 0..66u8 {
        borrow(&mut pool, n, 60_000, NOW - 10_000);
    }
    let hot = (0..4).chain(64..66).collect();
    let pool = pool.with_layout(Layout::Split(Box::new(Split::new(
        hot,
        BTreeMap::new(),
        BTreeMap::new(),
    ))));
    let plan = pool.plan_compaction(config, NOW).expect("due");
    assert_eq!(cooled(&plan), [0, 1, 2, 3, 64, 65]);
    // Holder 2 returns between the segments' writes and the pool item's.
    let ReturnPlan::Return(_, update) = pool.plan_return(d(2), NOW) else {
        panic!()
    };
    let moved_on = pool.apply(&pool.lower(&update).0).unwrap();
    assert!(
        moved_on.apply(&plan.update).is_err(),
        "the first write loses"
    );
    // Segment 1's write was refused (another compaction's, say): only
    // segment 0's entries may leave, and not 2.
    let again = plan.again_on(&moved_on, &[0]).expect("segment 0 landed");
    assert_eq!(cooled(&again), [0, 1, 3]);
    assert!(again.segments.iter().all(|s| s.slots.is_empty()));
    assert_eq!(again.segments.len(), 1);
    let after = moved_on.apply(&again.update).expect("it lands");
    assert_eq!(split(&after).version(0), 1);
    assert_eq!(split(&after).version(1), 0);
    assert!(split(&after).hot().contains(&2), "written since: hot");
    assert_eq!(after.slots(), moved_on.slots(), "the truth is unchanged");
    // Another compaction recorded segment 0 first: nothing to make again.
    assert_eq!(plan.again_on(&after, &[0]), None);
}

/// A take that landed though the same holder took another slot since
/// its read (a split pool item cannot check `NotHeld`) is given back.
#[test]
fn a_slot_taken_twice_by_one_holder_is_given_back() {
    let pool = Pool::new(100, 0);
    let BorrowPlan::Take { update: first, .. } = pool.plan_borrow(h(7, 500), NOW, NOW, 100) else {
        panic!()
    };
    // Another request of the same lease id, planned on an older read,
    // took position 0 first; this one then takes position 1.
    let (lowered, _) = pool.lower(&first);
    let pool = pool.apply(&lowered).unwrap();
    let mut second = first.clone();
    second.expect.retain(|e| !matches!(e, Expect::SlotFree(0)));
    second.changes = vec![Change::Take {
        position: 1,
        holder: h(7, 500),
        now_ms: NOW,
    }];
    let (lowered, unchecked) = pool.lower(&second);
    assert_eq!(unchecked, Some(h(7, 500)));
    let twice = pool.apply(&lowered).unwrap();
    let undo = twice
        .duplicate_of(h(7, 500), &second, NOW)
        .expect("held twice");
    let (lowered, _) = twice.lower(&undo);
    let once = twice.apply(&lowered).unwrap();
    assert_eq!(holder_at(&once, 0), Some(d(7)));
    assert_eq!(holder_at(&once, 1), None);
    // Nothing to undo when the holder holds one slot.
    assert_eq!(once.duplicate_of(h(7, 500), &first, NOW), None);
    // Left undone (its outcome unknown), the next read repairs it: the
    // younger slot goes.
    assert_eq!(once.plan_repair(d(7), NOW), None);
    let repair = twice.plan_repair(d(7), NOW).expect("held twice");
    let repaired = twice.apply(&twice.lower(&repair).0).unwrap();
    assert_eq!(repaired.slots(), once.slots());
    // A live slot and a ticket of one id (the ticket's twin took the
    // slot, unconditioned here): the ticket goes.
    let mut queued = Pool::new(1, 0).split_above(0);
    borrow(&mut queued, 1, 60_000, NOW);
    join(&mut queued, 7, 500, NOW + 10_000, NOW);
    let both = queued
        .apply(&Update {
            expect: vec![],
            changes: vec![Change::Take {
                position: 0,
                holder: h(7, 500),
                now_ms: NOW,
            }],
        })
        .unwrap();
    assert!(both.ticket_of(d(7)).is_some() && both.live_lease(d(7), NOW).is_some());
    let repair = both.plan_repair(d(7), NOW).expect("a slot and a ticket");
    let repaired = both.apply(&both.lower(&repair).0).unwrap();
    assert!(repaired.ticket_of(d(7)).is_none() && repaired.live_lease(d(7), NOW).is_some());
}

#[test]
fn a_large_flat_pool_is_split_on_its_slots_as_read() {
    let config = Compaction::DEFAULT;
    let mut flat = Pool::new(60, 0).split_above(u16::MAX);
    for n in 1..=3 {
        let BorrowPlan::Take { update, .. } = flat.plan_borrow(h(n, 60_000), NOW, NOW, 100) else {
            panic!()
        };
        flat = flat.apply(&update).unwrap();
    }
    assert!(Pool::new(FLAT_MAX, 0)
        .split_above(u16::MAX)
        .plan_split(config)
        .is_none());
    let plan = flat
        .plan_split(config)
        .expect("count 60 is above the flat maximum");
    let after = flat.apply(&plan).expect("as read");
    assert_eq!(split(&after).hot(), &BTreeSet::from([0, 1, 2]));
    assert!(split(&after).versions().is_empty());
    assert_eq!(after.leases(), flat.leases(), "the truth is unchanged");
    assert!(after.plan_split(config).is_none(), "split once");
    assert!(after.apply(&plan).is_err(), "not on a split pool");

    // A grant since, or a slot freed since: not as read.
    let BorrowPlan::Take { update, .. } = flat.plan_borrow(h(4, 60_000), NOW, NOW, 100) else {
        panic!()
    };
    assert!(flat.apply(&update).unwrap().apply(&plan).is_err());
    let ReturnPlan::Return(_, update) = flat.plan_return(h(2, 60_000).digest, NOW) else {
        panic!()
    };
    assert!(flat.apply(&update).unwrap().apply(&plan).is_err());
}
