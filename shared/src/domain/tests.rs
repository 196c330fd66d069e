use super::*;

fn d(n: u8) -> LeaseDigest {
    LeaseDigest([n; 8])
}

fn h(n: u8, ttl_ms: u64) -> Holder {
    Holder {
        digest: d(n),
        ttl_ms,
    }
}

const WAITERS: usize = 100;

/// Borrows as a newcomer with no wait, applying the plan; the position.
fn borrow(pool: &mut Pool, n: u8, ttl: u64, now: u64) -> Option<u16> {
    loop {
        match pool.plan_borrow(h(n, ttl), now, now, WAITERS) {
            BorrowPlan::Take { update, position } => {
                *pool = pool.apply(&update).expect("a fresh plan holds");
                return Some(position);
            }
            BorrowPlan::Held(lease) => return Some(lease.position),
            BorrowPlan::Prune(update) => *pool = pool.apply(&update).expect("a fresh prune holds"),
            _ => return None,
        }
    }
}

/// Joins the queue (as a borrower that waits until `give_up_ms`).
fn join(pool: &mut Pool, n: u8, ttl: u64, give_up_ms: u64, now: u64) {
    match pool.plan_borrow(h(n, ttl), give_up_ms, now, WAITERS) {
        BorrowPlan::Join(update) => *pool = pool.apply(&update).expect("a fresh join holds"),
        other => panic!("expected a join, got {other:?}"),
    }
}

fn give_back(pool: &mut Pool, n: u8, now: u64) -> bool {
    match pool.plan_return(d(n), now) {
        ReturnPlan::Return(_, update) => {
            *pool = pool.apply(&update).expect("a fresh return holds");
            true
        }
        _ => false,
    }
}

fn holder_at(pool: &Pool, position: usize) -> Option<LeaseDigest> {
    match pool.slots()[position] {
        Slot::Held { holder, .. } => Some(holder.digest),
        Slot::Free => None,
    }
}

#[test]
fn holders_round_trip_in_few_bytes() {
    for ttl in [1, 255, 256, 30_000, 3_600_000, 31_536_000_000, u64::MAX] {
        let holder = h(7, ttl);
        let bytes = holder.to_bytes();
        assert_eq!(Holder::from_bytes(&bytes), Some(holder), "{ttl}");
    }
    assert_eq!(h(1, 30_000).to_bytes().len(), 10, "30 s in two bytes");
    assert_eq!(h(1, 1).to_bytes().len(), 9);
    assert_eq!(Holder::from_bytes(&[0; 8]), None, "no ttl byte");
    assert_eq!(Holder::from_bytes(&[0; 17]), None);
}

#[test]
fn borrow_takes_lowest_free_position() {
    let mut pool = Pool::new(3, 0);
    assert_eq!(borrow(&mut pool, 1, 100, 0), Some(0));
    assert_eq!(borrow(&mut pool, 2, 100, 0), Some(1));
    assert_eq!(borrow(&mut pool, 3, 100, 0), Some(2));
    assert_eq!(borrow(&mut pool, 4, 100, 0), None);
    assert!(give_back(&mut pool, 2, 1));
    assert_eq!(borrow(&mut pool, 5, 100, 1), Some(1));
}

#[test]
fn fences_rise_with_every_grant_from_the_creation_time() {
    let mut pool = Pool::new(2, 5999);
    borrow(&mut pool, 1, 100, 5);
    borrow(&mut pool, 2, 100, 5);
    give_back(&mut pool, 1, 6);
    borrow(&mut pool, 3, 100, 6);
    let fences: Vec<u64> = pool.leases().iter().map(|l| l.fence).collect();
    assert_eq!(fences, vec![6002, 6001]);
}

#[test]
fn an_expired_position_is_reused_by_the_write_that_takes_it() {
    let mut pool = Pool::new(2, 0);
    borrow(&mut pool, 1, 50, 0);
    borrow(&mut pool, 2, 100, 0);
    assert_eq!(borrow(&mut pool, 3, 200, 49), None);
    let BorrowPlan::Take { update, position } = pool.plan_borrow(h(3, 200), 50, 50, WAITERS) else {
        panic!()
    };
    assert_eq!(position, 0);
    assert!(update
        .expect
        .iter()
        .any(|e| matches!(e, Expect::SlotStamp { position: 0, .. })));
    pool = pool.apply(&update).unwrap();
    assert_eq!(holder_at(&pool, 0), Some(d(3)));
}

#[test]
fn a_return_with_waiters_hands_its_slot_to_the_head_without_naming_it() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100, 0);
    join(&mut pool, 2, 500, 10_000, 1);
    join(&mut pool, 3, 500, 10_000, 1);
    let ReturnPlan::Return(_, update) = pool.plan_return(d(1), 2) else {
        panic!()
    };
    // Conditioned on its own lease only: no ticket, no other slot.
    assert_eq!(update.expect.len(), 2, "{update:?}");
    assert!(matches!(
        update.expect[0],
        Expect::SlotStamp { position: 0, .. }
    ));
    assert_eq!(update.expect[1], Expect::Count(pool.sizing()));
    assert_eq!(
        update.changes,
        vec![Change::HandOff {
            position: 0,
            from: 0,
            nth: 0,
            now_ms: 2
        }]
    );
    pool = pool.apply(&update).unwrap();
    assert_eq!(holder_at(&pool, 0), Some(d(2)));
    assert_eq!(pool.queue().len(), 1);
    let lease = pool.live_lease(d(2), 2).unwrap();
    assert_eq!((lease.granted_ms, lease.expires_at_ms), (2, 502));
}

#[test]
fn two_returns_that_read_the_same_queue_serve_two_tickets() {
    let mut pool = Pool::new(2, 0);
    borrow(&mut pool, 1, 100, 0);
    borrow(&mut pool, 2, 100, 0);
    join(&mut pool, 3, 500, 10_000, 1);
    join(&mut pool, 4, 500, 10_000, 1);
    let ReturnPlan::Return(_, a) = pool.plan_return(d(1), 2) else {
        panic!()
    };
    let ReturnPlan::Return(_, b) = pool.plan_return(d(2), 2) else {
        panic!()
    };
    pool = pool.apply(&a).unwrap();
    pool = pool.apply(&b).expect("returns never collide");
    assert_eq!(holder_at(&pool, 0), Some(d(3)));
    assert_eq!(holder_at(&pool, 1), Some(d(4)));
    assert!(pool.queue().is_empty());
    let fences: Vec<u64> = pool.leases().iter().map(|l| l.fence).collect();
    assert!(fences[0] < fences[1], "fences rise in grant order");
}

#[test]
fn a_return_hands_a_lower_free_slot_and_frees_its_own() {
    let mut pool = Pool::new(3, 0);
    borrow(&mut pool, 1, 50, 0);
    borrow(&mut pool, 2, 1000, 0);
    borrow(&mut pool, 3, 1000, 0);
    join(&mut pool, 4, 500, 10_000, 1);
    // Position 0 expired at 50 but nobody saw it yet; position 2 returns.
    let ReturnPlan::Return(_, update) = pool.plan_return(d(3), 60) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    assert_eq!(holder_at(&pool, 0), Some(d(4)), "the head gets the lowest");
    assert_eq!(holder_at(&pool, 2), None);
}

#[test]
fn a_return_without_waiters_frees_and_a_late_joiner_hands_it_to_itself() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100, 0);
    let ReturnPlan::Return(_, free) = pool.plan_return(d(1), 1) else {
        panic!()
    };
    assert_eq!(free.changes, vec![Change::Free(0)]);
    // A borrower that read the pool full joins before the return lands.
    join(&mut pool, 2, 100, 10_000, 1);
    pool = pool
        .apply(&free)
        .expect("a free conditions on its lease alone");
    // The joiner sees the free slot on its next read and hands it to the head.
    let WaitPlan::Waiting {
        needed: 0,
        duty: Some(duty),
        ..
    } = pool.plan_wait(&h(2, 100), 1, 2)
    else {
        panic!("{:?}", pool.plan_wait(&h(2, 100), 1, 2))
    };
    pool = pool.apply(&duty).unwrap();
    assert!(matches!(pool.plan_wait(&h(2, 100), 1, 3), WaitPlan::Granted(l) if l.position == 0));
}

#[test]
fn newcomers_wait_behind_live_tickets_and_dead_ones_leave() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100, 0);
    join(&mut pool, 2, 100, 5_000, 0);
    // A slot expired and a live ticket waits: a newcomer joins behind it.
    assert!(matches!(
        pool.plan_borrow(h(4, 100), 30_000, 200, WAITERS),
        BorrowPlan::Join(_)
    ));
    // A dead ticket (past its give-up and grace) holds no place: a newcomer
    // takes the free slot and the dead ticket leaves in the same write.
    let now = 5_000 + TICKET_GRACE_MS;
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(5, 100), now, now, WAITERS) else {
        panic!()
    };
    assert!(update.expect.contains(&Expect::QueueLen(1)));
    pool = pool.apply(&update).unwrap();
    assert!(pool.queue().is_empty());
    assert_eq!(holder_at(&pool, 0), Some(d(5)));
}

#[test]
fn a_join_makes_a_racing_newcomer_conflict() {
    let mut pool = Pool::new(1, 0);
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(1, 100), 0, 0, WAITERS) else {
        panic!()
    };
    borrow(&mut pool, 9, 100, 0);
    join(&mut pool, 2, 100, 500, 0);
    assert!(pool.apply(&update).is_err());
}

#[test]
fn readers_hand_the_slots_of_a_raise_to_the_queue_in_order() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 1000, 0);
    for n in 2..=4 {
        join(&mut pool, n, 500, 10_000, 0);
    }
    pool = pool.apply(&pool.plan_resize(3, 1).unwrap()).unwrap();
    assert_eq!(pool.slots().len(), 3);
    // Two slots free: the readers one and two places from the front are
    // each owed one, and each plans the one write that serves both; the
    // third waits.
    let WaitPlan::Waiting {
        duty: Some(first), ..
    } = pool.plan_wait(&h(2, 500), 0, 2)
    else {
        panic!()
    };
    let WaitPlan::Waiting {
        duty: Some(second), ..
    } = pool.plan_wait(&h(3, 500), 0, 2)
    else {
        panic!()
    };
    assert_eq!(
        first, second,
        "every reader owed a slot plans the same write"
    );
    assert!(matches!(
        pool.plan_wait(&h(4, 500), 0, 2),
        WaitPlan::Waiting {
            ahead: 2,
            needed: 1,
            duty: None,
            ..
        }
    ));
    // Whichever lands first serves the first two in line, lowest position
    // first, with the next two fences; the other then fails its conditions.
    let fence = pool.next_fence;
    pool = pool.apply(&second).unwrap();
    assert!(pool.apply(&first).is_err());
    assert_eq!(
        (holder_at(&pool, 1), holder_at(&pool, 2)),
        (Some(d(2)), Some(d(3)))
    );
    let fences: Vec<u64> = pool.leases()[1..]
        .iter()
        .map(|l| l.fence - pool.base_us)
        .collect();
    assert_eq!(fences, [fence, fence + 1]);
    assert_eq!(pool.queue().len(), 1);
}

#[test]
fn the_head_hands_itself_an_expired_slot() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 50, 0);
    join(&mut pool, 2, 500, 10_000, 0);
    assert_eq!(pool.nth_expiry(1, 10), Some(50));
    assert!(matches!(
        pool.plan_wait(&h(2, 500), 0, 49),
        WaitPlan::Waiting {
            needed: 1,
            duty: None,
            ..
        }
    ));
    let WaitPlan::Waiting {
        duty: Some(duty), ..
    } = pool.plan_wait(&h(2, 500), 0, 50)
    else {
        panic!()
    };
    pool = pool.apply(&duty).unwrap();
    assert_eq!(pool.live_lease(d(2), 51).map(|l| l.position), Some(0));
}

#[test]
fn hand_offs_skip_dead_tickets_conditioned_on_them() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100_000, 0);
    join(&mut pool, 2, 500, 1_000, 0);
    join(&mut pool, 3, 500, 60_000, 0);
    let now = 1_000 + TICKET_GRACE_MS;
    let ReturnPlan::Return(_, update) = pool.plan_return(d(1), now) else {
        panic!()
    };
    assert!(update.expect.contains(&Expect::TicketAt {
        index: 0,
        holder: h(2, 500)
    }));
    pool = pool.apply(&update).unwrap();
    assert_eq!(holder_at(&pool, 0), Some(d(3)));
    assert!(pool.queue().is_empty());
}

#[test]
fn a_cancelled_ticket_frees_its_place_at_once() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100_000, 0);
    join(&mut pool, 2, 500, 60_000, 0);
    join(&mut pool, 3, 500, 60_000, 0);
    // A return naming the waiting borrow's lease id cancels its ticket.
    let ReturnPlan::Cancel(cancel) = pool.plan_return(d(2), 1) else {
        panic!()
    };
    pool = pool.apply(&cancel).unwrap();
    assert_eq!(pool.waiting(1), 1);
    assert_eq!(pool.plan_wait(&h(2, 500), 0, 1), WaitPlan::Gone);
    give_back(&mut pool, 1, 2);
    assert_eq!(
        holder_at(&pool, 0),
        Some(d(3)),
        "the next in line is served"
    );
}

#[test]
fn a_cancel_that_overtakes_its_borrow_is_remembered() {
    let mut pool = Pool::new(1, 0);
    let ReturnPlan::Remember(update) = pool.plan_return(d(5), 1_000) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    assert_eq!(pool.plan_return(d(5), 2_000), ReturnPlan::Remembered);
    assert_eq!(
        pool.plan_borrow(h(5, 100), 9_000, 2_000, WAITERS),
        BorrowPlan::Cancelled
    );
    // Once forgotten, the id may borrow again (its stale tomb leaves with it).
    let later = 1_000 + TOMB_MS + 1_000;
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(5, 100), later, later, WAITERS) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    assert!(pool.tombs().is_empty());
}

#[test]
fn a_flood_of_unknown_returns_keeps_the_newest_few() {
    let mut pool = Pool::new(1, 0);
    for n in 0..(MAX_TOMBS as u8 + 10) {
        let ReturnPlan::Remember(update) = pool.plan_return(d(n), 1_000 + u64::from(n) * 1_000)
        else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
    }
    assert_eq!(pool.tombs().len(), MAX_TOMBS);
    assert!(pool.tombs().iter().all(|t| t.digest.0[0] >= 10));
}

#[test]
fn returns_of_expired_and_unknown_leases_free_nothing() {
    let mut pool = Pool::new(2, 0);
    borrow(&mut pool, 1, 10, 0);
    assert!(matches!(pool.plan_return(d(1), 10), ReturnPlan::Expired(_)));
    assert!(matches!(
        pool.plan_return(d(9), 10),
        ReturnPlan::Remember(_)
    ));
    assert!(give_back(&mut pool, 1, 5));
    assert!(!give_back(&mut pool, 1, 6), "already returned");
}

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

#[test]
fn an_idempotent_borrow_answers_the_held_lease_and_a_twin_waits_on_the_queued_ticket() {
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 100, 0);
    assert!(matches!(
        pool.plan_borrow(h(1, 100), 0, 10, WAITERS),
        BorrowPlan::Held(l) if l.position == 0
    ));
    join(&mut pool, 2, 300, 10_000, 10);
    assert_eq!(
        pool.plan_borrow(h(2, 999), 10_000, 11, WAITERS),
        BorrowPlan::Queued(h(2, 300))
    );
    // The same holder cannot be queued or held twice.
    let mut twin = pool.clone();
    twin.queue.clear();
    let BorrowPlan::Join(again) = twin.plan_borrow(h(2, 300), 10_000, 11, WAITERS) else {
        panic!()
    };
    assert_eq!(
        pool.apply(&again),
        Err(ConditionFailed(Expect::NotQueued(h(2, 300))))
    );
}

#[test]
fn a_queue_at_its_cap_refuses_or_prunes_dead_tickets_first() {
    let mut pool = Pool::new(0, 0);
    for n in 0..3 {
        pool = match pool.plan_borrow(h(n, 100), 1_000, 0, 3) {
            BorrowPlan::Join(update) => pool.apply(&update).unwrap(),
            other => panic!("{other:?}"),
        };
    }
    assert_eq!(pool.plan_borrow(h(9, 100), 1_000, 0, 3), BorrowPlan::Full);
    let later = 1_000 + TICKET_GRACE_MS;
    let BorrowPlan::Prune(prune) = pool.plan_borrow(h(9, 100), later + 1_000, later, 3) else {
        panic!()
    };
    pool = pool.apply(&prune).unwrap();
    assert!(pool.queue().is_empty());
}

/// Randomized races of plans against the promises of API.md.
mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A newcomer plans a borrow (holder `who`).
        Borrow {
            who: u8,
            wait: u64,
        },
        /// A waiter reads and plans its duty.
        Read {
            which: usize,
        },
        /// A waiter gives up (plans its cancel).
        GiveUp {
            which: usize,
        },
        /// A holder (or a stranger) returns a lease id.
        Return {
            who: u8,
        },
        Resize {
            count: u16,
        },
        /// One planned write lands (or fails its conditions).
        Land {
            which: usize,
        },
        Advance {
            ms: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..24, 0u64..400).prop_map(|(who, wait)| Op::Borrow { who, wait }),
            4 => any::<usize>().prop_map(|which| Op::Read { which }),
            1 => any::<usize>().prop_map(|which| Op::GiveUp { which }),
            3 => (0u8..24).prop_map(|who| Op::Return { who }),
            1 => (0u16..5).prop_map(|count| Op::Resize { count }),
            8 => any::<usize>().prop_map(|which| Op::Land { which }),
            3 => (0u64..60).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    /// What one landed update may do: checked `prev` → `next` at `now`.
    fn check_landed(
        prev: &Pool,
        next: &Pool,
        update: &Update,
        now: u64,
    ) -> Result<(), TestCaseError> {
        let rebuilt = Pool::from_parts(
            next.sizing(),
            next.base_us,
            next.next_fence,
            next.slots.clone(),
            next.queue.clone(),
            next.tombs.clone(),
            next.ended.clone(),
        );
        prop_assert!(rebuilt.is_ok(), "invariants broken: {:?}", rebuilt);
        let old: Vec<u64> = prev.leases().iter().map(|l| l.fence).collect();
        let mut granted: Vec<Lease> = next
            .leases()
            .into_iter()
            .filter(|l| !old.contains(&l.fence))
            .collect();
        granted.sort_by_key(|l| l.fence);
        let served: Vec<LeaseDigest> = granted.iter().map(|l| l.digest).collect();
        // Several grants in one write: to tickets in queue order, on rising
        // positions, with the next fences.
        for (nth, pair) in granted.windows(2).enumerate() {
            prop_assert!(
                pair[0].position < pair[1].position,
                "lowest first: {granted:?}"
            );
            prop_assert_eq!(pair[1].fence, pair[0].fence + 1);
            let index = |d: LeaseDigest| prev.queue.iter().position(|t| t.holder.digest == d);
            prop_assert!(
                matches!((index(pair[0].digest), index(pair[1].digest)), (Some(a), Some(b)) if a < b),
                "grant {} of one write out of queue order: {granted:?}",
                nth + 1
            );
        }
        for lease in &granted {
            prop_assert!(
                lease.fence > prev.base_us + prev.next_fence - 1,
                "fences only grow"
            );
            prop_assert!(lease.position < next.count, "position within count");
            // A live lease's position is granted only by its own return.
            if let Some(held) = prev
                .lease_at(usize::from(lease.position))
                .filter(|l| l.is_live(now))
            {
                let own_return = update.expect.iter().any(|e| {
                    matches!(*e,
                    Expect::SlotStamp { position, stamp } if position == held.position
                        && prev.base_us + stamp.fence == held.fence)
                });
                prop_assert!(own_return, "granted a position a live lease held");
            }
            prop_assert!(
                next.in_use(now) <= u32::from(next.count),
                "over-issue: {:?}\n{:?}\n{:?}\nnow {}",
                prev,
                update,
                next,
                now
            );
            // FIFO: no live ticket was ahead of the one served (dead ones the
            // write expects may be), and a newcomer took only a slot beyond
            // those the live tickets are owed.
            match prev
                .queue
                .iter()
                .position(|t| t.holder.digest == lease.digest)
            {
                Some(index) => prop_assert!(
                    prev.queue[..index]
                        .iter()
                        .all(|t| !t.is_live(now) || served.contains(&t.holder.digest)),
                    "served out of turn: {:?} ahead of {:?}",
                    &prev.queue[..index],
                    lease
                ),
                None => prop_assert!(
                    prev.waiting(now) < prev.free_positions(now).len(),
                    "a newcomer took a slot owed to a waiter"
                ),
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn racing_plans_never_break_the_pools_promises(
            initial in 0u16..4,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut now = 1_000u64;
            let mut pool = Pool::new(initial, now * 1000);
            // Planned writes not yet landed, each with the time it was planned.
            let mut in_flight: Vec<(Update, u64)> = Vec::new();
            // Tickets of waiters that joined: (holder, joined at).
            let mut waiters: Vec<(Holder, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Borrow { who, wait } => {
                        let holder = h(who, 50 + u64::from(who) * 7);
                        match pool.plan_borrow(holder, now + wait, now, 6) {
                            BorrowPlan::Take { update, position } => {
                                prop_assert_eq!(Some(position), pool.free_positions(now).first().copied());
                                in_flight.push((update, now));
                            }
                            BorrowPlan::Join(update) => {
                                in_flight.push((update, now));
                                waiters.push((holder, now));
                            }
                            BorrowPlan::Prune(update) => in_flight.push((update, now)),
                            BorrowPlan::Held(lease) => prop_assert!(lease.is_live(now)),
                            BorrowPlan::Queued(_) | BorrowPlan::Cancelled | BorrowPlan::Full => {}
                            BorrowPlan::Backlog => prop_assert!(false, "no backlog without tickets"),
                        }
                    }
                    Op::Read { which } => {
                        if let Some((holder, joined)) = waiters.get(which % waiters.len().max(1)).copied() {
                            match pool.plan_wait(&holder, joined, now) {
                                WaitPlan::Waiting { duty: Some(update), .. } => in_flight.push((update, now)),
                                WaitPlan::Waiting { needed: 0, duty: None, .. } => {
                                    if let Some(update) = pool.plan_prune(now) {
                                        in_flight.push((update, now));
                                    }
                                }
                                _ => {}
                            }
                        }
                    }
                    Op::GiveUp { which } => {
                        if let Some((holder, _)) = waiters.get(which % waiters.len().max(1)).copied() {
                            if let Some(update) = pool.plan_cancel(&holder) {
                                in_flight.push((update, now));
                            }
                        }
                    }
                    Op::Return { who } => match pool.plan_return(d(who), now) {
                        ReturnPlan::Return(lease, update) => {
                            prop_assert!(lease.is_live(now));
                            in_flight.push((update, now));
                        }
                        ReturnPlan::Cancel(update) | ReturnPlan::Remember(update) => {
                            in_flight.push((update, now))
                        }
                        ReturnPlan::Expired(lease) => prop_assert!(!lease.is_live(now)),
                        ReturnPlan::Remembered => {}
                    },
                    Op::Resize { count } => {
                        if let Some(update) = pool.plan_resize(count, now) {
                            prop_assert!(pool.apply(&update).is_ok(), "a fresh resize holds");
                            in_flight.push((update, now));
                        }
                    }
                    Op::Land { which } => {
                        if !in_flight.is_empty() {
                            let (update, _) = in_flight.remove(which % in_flight.len());
                            if let Ok(next) = pool.apply(&update) {
                                check_landed(&pool, &next, &update, now)?;
                                if update.changes.iter().any(|c| matches!(c, Change::SetCount(_))) {
                                    prop_assert_eq!(next.in_use(now), pool.in_use(now), "resize never revokes");
                                }
                                pool = next;
                            }
                        }
                    }
                    Op::Advance { ms } => now += ms,
                }
                let state = pool.state(now);
                prop_assert_eq!(state.available, u32::from(state.count).saturating_sub(state.in_use));
                prop_assert!(pool.slots.len() >= usize::from(pool.count));
            }
        }

        /// From any state, newcomers at one instant get exactly the free
        /// capacity, on the free positions in ascending order.
        #[test]
        fn a_pool_grants_exactly_its_free_capacity(
            count in 1u16..8,
            ttls in proptest::collection::vec(1u64..100, 0..10),
            shrink_to in 0u16..8,
            grow in 0u16..4,
            now in 0u64..120,
        ) {
            let mut pool = Pool::new(count, 0);
            for (i, ttl) in ttls.into_iter().enumerate() {
                borrow(&mut pool, i as u8, ttl, 0);
            }
            for resize in [shrink_to, shrink_to + grow] {
                if let Some(update) = pool.plan_resize(resize, 0) {
                    pool = pool.apply(&update).unwrap();
                }
            }
            if let Some(at) = pool.nth_expiry(1, now) {
                prop_assert!(at > now && pool.in_use(at) < pool.in_use(now));
            }
            let free = pool.free_positions(now);
            let mut granted = Vec::new();
            for i in 0..usize::from(pool.count) + 2 {
                match borrow(&mut pool, 100 + i as u8, 10, now) {
                    Some(position) => granted.push(position),
                    None => break,
                }
            }
            prop_assert_eq!(&granted, &free);
            prop_assert_eq!(pool.state(now).available, 0);
        }

        /// A return that lands frees exactly its lease, whatever landed
        /// before it; one that does not land changes nothing.
        #[test]
        fn returns_touch_only_their_own_lease(
            count in 1u16..5,
            others in proptest::collection::vec(0u8..20, 0..6),
            waiting in 0u8..3,
        ) {
            let now = 5;
            let mut pool = Pool::new(count, 0);
            prop_assume!(borrow(&mut pool, 200, 100, now).is_some());
            let ReturnPlan::Return(_, give_back) = pool.plan_return(d(200), now) else {
                panic!()
            };
            for who in others {
                borrow(&mut pool, who, 100, now);
            }
            // Fill the pool first, so that they wait.
            let mut filler = 100;
            while waiting > 0 && borrow(&mut pool, filler, 100, now).is_some() {
                filler += 1;
            }
            for n in 0..waiting {
                join(&mut pool, 150 + n, 100, 60_000, now);
            }
            let after = pool.apply(&give_back).expect("a return never conflicts with other slots or tickets");
            prop_assert!(after.live_lease(d(200), now).is_none());
            // Planned while nobody waited, it frees the slot (a joiner
            // then hands it to itself on its next read).
            prop_assert_eq!(after.in_use(now), pool.in_use(now) - 1);
        }
    }
}

/// A backlog ticket numbered `number`, async when `callback`.
fn backlog_item(n: u8, number: u64, joined_ms: u64, callback: bool) -> TicketItem {
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
    }
}

/// Takes `n` ticket numbers, as enqueues do.
fn number(pool: &mut Pool, n: usize) {
    for _ in 0..n {
        *pool = pool
            .apply(&Pool::plan_number())
            .expect("numbers never collide");
    }
}

#[test]
fn a_backlog_sends_newcomers_to_it_and_is_admitted_in_number_order() {
    let now = 1_000_000;
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 60_000, now);
    number(&mut pool, 3);
    assert!(pool.line().has_backlog());
    // Nobody takes or joins ahead of the backlog.
    assert_eq!(
        pool.plan_borrow(h(9, 1_000), now + 5_000, now, WAITERS),
        BorrowPlan::Backlog
    );
    // Ticket 1 ended (cancelled) before admission: stepped over.
    let mut cancelled = backlog_item(3, 1, now, true);
    cancelled.state = TicketState::Cancelled;
    let backlog = [
        backlog_item(2, 0, now, true),
        cancelled,
        backlog_item(4, 2, now, false),
    ];
    let update = pool.plan_admit(&backlog, now, WAITERS, 32).expect("admits");
    // Planned against an old `admitted`, it fails once another admission landed.
    let admitted = pool.apply(&update).expect("holds");
    assert!(admitted.apply(&update).is_err(), "admits once");
    pool = admitted;
    let queued: Vec<LeaseDigest> = pool.queue().iter().map(|t| t.holder.digest).collect();
    assert_eq!(queued, [d(2), d(4)]);
    assert_eq!(pool.async_number(d(2)), Some(0));
    assert_eq!(pool.async_number(d(4)), None, "a sync ticket is not listed");
    assert!(!pool.line().has_backlog());
    // A return hands the slot to the first admitted ticket, the async one.
    assert!(give_back(&mut pool, 1, now));
    assert_eq!(pool.grant_of(&h(2, 1_000)).map(|l| l.position), Some(0));
    let unlist = pool.plan_unlist(d(2)).expect("listed");
    pool = pool.apply(&unlist).expect("holds");
    assert_eq!(pool.async_number(d(2)), None);
}

#[test]
fn admission_waits_for_a_missing_number_until_a_later_ticket_is_old() {
    let now = 1_000_000;
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 60_000, now);
    number(&mut pool, 2);
    // Number 0 was taken, its ticket not (yet) written; 1 is there.
    let backlog = [backlog_item(2, 1, now, true)];
    assert_eq!(
        pool.plan_admit(&backlog, now + GAP_MS - 1, WAITERS, 32),
        None,
        "waits for 0"
    );
    let update = pool
        .plan_admit(&backlog, now + GAP_MS, WAITERS, 32)
        .expect("passes 0 once 1 is old");
    pool = pool.apply(&update).expect("holds");
    assert_eq!(pool.queue().len(), 1);
    assert_eq!(pool.line().admitted, 2);
}

#[test]
fn admission_keeps_to_the_window_and_the_queue_bound() {
    let now = 1_000_000;
    let mut pool = Pool::new(1, 0);
    borrow(&mut pool, 1, 60_000, now);
    number(&mut pool, 5);
    let backlog: Vec<TicketItem> = (0..5u8)
        .map(|i| backlog_item(10 + i, u64::from(i), now, true))
        .collect();
    let update = pool.plan_admit(&backlog, now, WAITERS, 2).expect("admits");
    pool = pool.apply(&update).expect("holds");
    assert_eq!(pool.queue().len(), 2, "two async tickets at once");
    assert_eq!(pool.line().admitted, 2);
    assert_eq!(
        pool.plan_admit(&backlog[2..], now, WAITERS, 2),
        None,
        "window full"
    );
    let update = pool.plan_admit(&backlog[2..], now, 3, 32).expect("admits");
    pool = pool.apply(&update).expect("holds");
    assert_eq!(pool.queue().len(), 3, "no more than max_waiters");
}
