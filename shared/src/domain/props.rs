//! Randomized races of plans against the promises of API.md.

use super::test_support::*;
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
    /// A compaction is planned on the pool as read (split pools): as by
    /// the claim's holder, or by another after a claim lapsed (they race).
    Compact,
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
        2 => Just(Op::Compact),
    ]
}

/// What one landed update may do: checked `prev` → `next` at `now`.
/// `seen`: the tickets queued when the write was planned.
fn check_landed(
    prev: &Pool,
    next: &Pool,
    update: &Update,
    seen: &[LeaseDigest],
    now: u64,
) -> Result<(), TestCaseError> {
    let rebuilt = Pool::from_parts(
        next.sizing(),
        next.base_us,
        next.next_fence,
        next.slots.clone(),
        next.queue.clone(),
        next.given_up.clone(),
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
        // those owed to the live tickets it could see (one that joined
        // after its read overlaps it: either may go first).
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
                prev.queue
                    .iter()
                    .filter(|t| t.is_live(now) && seen.contains(&t.holder.digest))
                    .count()
                    < prev.free_positions(now).len(),
                "a newcomer took a slot owed to a waiter"
            ),
        }
    }
    Ok(())
}

/// A write planned and not yet landed: as the pool item checks it, the
/// plan itself, the holder whose `NotHeld` the item could not check; or a
/// compaction's segment write.
enum InFlight {
    Write {
        lowered: Update,
        planned: Update,
        unchecked: Option<Holder>,
        seen: Vec<LeaseDigest>,
    },
    Segment(CompactionPlan),
    /// A compaction's pool item write (`update`) after its segments in
    /// `landed` did: when it loses, made again on the pool as it is
    /// ([`CompactionPlan::again_on`]), as the harness does.
    Compaction {
        first: CompactionPlan,
        landed: Vec<u16>,
        update: Update,
    },
}

fn plan(pool: &Pool, update: Update) -> InFlight {
    let (lowered, unchecked) = pool.lower(&update);
    InFlight::Write {
        lowered,
        planned: update,
        unchecked,
        seen: pool.queue.iter().map(|t| t.holder.digest).collect(),
    }
}

/// A segment item of the model: its version and slots.
type Segments = std::collections::BTreeMap<u16, (u32, Vec<Slot>)>;

/// Each segment holds the truth of every position not hot.
fn check_segments(pool: &Pool, segments: &Segments) -> Result<(), TestCaseError> {
    let Layout::Split(split) = pool.layout() else {
        return Ok(());
    };
    for (p, slot) in pool.slots.iter().enumerate() {
        let position = p as u16;
        if split.hot.contains(&position) {
            continue;
        }
        let segment = segment_of(position);
        let stored = segments.get(&segment).map_or(Slot::Free, |(_, slots)| {
            slots[usize::from(position % SEGMENT_SLOTS)]
        });
        prop_assert_eq!(
            stored,
            *slot,
            "cold position {} is not its segment's",
            position
        );
    }
    Ok(())
}

fn race(initial: u16, ops: Vec<Op>, split: bool) -> Result<(), TestCaseError> {
    let mut now = 1_000u64;
    let mut pool = Pool::new(initial, now * 1000);
    if split {
        pool = pool.with_layout(Layout::Split(Box::default()));
    }
    // Compact at every chance, and live leases after 100 ms.
    let compaction = Compaction {
        split_above: 0,
        hot_max: 0,
        cold_after_ms: 100,
        claim_ms: 1_000,
    };
    let mut segments = Segments::new();
    let mut in_flight: Vec<InFlight> = Vec::new();
    // Tickets of waiters that joined: (holder, joined at).
    let mut waiters: Vec<(Holder, u64)> = Vec::new();
    for op in ops {
        match op {
            Op::Borrow { who, wait } => {
                let holder = h(who, 50 + u64::from(who) * 7);
                match pool.plan_borrow(holder, now + wait, now, 6) {
                    BorrowPlan::Take { update, position } => {
                        prop_assert_eq!(Some(position), pool.free_positions(now).first().copied());
                        in_flight.push(plan(&pool, update));
                    }
                    BorrowPlan::Join(update) => {
                        in_flight.push(plan(&pool, update));
                        waiters.push((holder, now));
                    }
                    BorrowPlan::Prune(update) => in_flight.push(plan(&pool, update)),
                    // A lease id held twice (a duplicate not undone yet)
                    // answers one of its leases.
                    BorrowPlan::Held(lease) => prop_assert!(lease.is_live(now)),
                    BorrowPlan::Queued(_) | BorrowPlan::Cancelled | BorrowPlan::Full => {}
                    BorrowPlan::Backlog => prop_assert!(false, "no backlog without tickets"),
                }
            }
            Op::Read { which } => {
                if let Some((holder, joined)) = waiters.get(which % waiters.len().max(1)).copied() {
                    match pool.plan_wait(&holder, joined, now) {
                        WaitPlan::Waiting {
                            duty: Some(update), ..
                        } => in_flight.push(plan(&pool, update)),
                        WaitPlan::Waiting {
                            needed: 0,
                            duty: None,
                            ..
                        } => {
                            if let Some(update) = pool.plan_prune(now) {
                                in_flight.push(plan(&pool, update));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Op::GiveUp { which } => {
                if let Some((holder, _)) = waiters.get(which % waiters.len().max(1)).copied() {
                    if let Some(update) = pool.plan_cancel(&holder) {
                        in_flight.push(plan(&pool, update));
                    }
                }
            }
            Op::Return { who } => match pool.plan_return(d(who), now) {
                ReturnPlan::Return(lease, update) => {
                    prop_assert!(lease.is_live(now));
                    in_flight.push(plan(&pool, update));
                }
                ReturnPlan::Cancel(update) | ReturnPlan::Remember(update) => {
                    in_flight.push(plan(&pool, update))
                }
                ReturnPlan::Expired(lease) => prop_assert!(!lease.is_live(now)),
                ReturnPlan::Remembered => {}
            },
            Op::Resize { count } => {
                if let Some(update) = pool.plan_resize(count, now) {
                    let (lowered, _) = pool.lower(&update);
                    prop_assert!(pool.apply(&lowered).is_ok(), "a fresh resize holds");
                    in_flight.push(plan(&pool, update));
                }
            }
            Op::Compact => {
                // As a store reads it: the segment items' own versions.
                let mut read = pool.clone();
                if let Layout::Split(split) = &pool.layout {
                    let stored = segments.iter().map(|(k, (v, _))| (*k, *v)).collect();
                    read = read.with_layout(Layout::Split(Box::new(Split::new(
                        split.hot.clone(),
                        split.versions.clone(),
                        stored,
                    ))));
                }
                if let Some(compaction) = read.plan_compaction(compaction, now) {
                    in_flight.push(InFlight::Segment(compaction));
                }
            }
            Op::Land { which } => {
                if in_flight.is_empty() {
                    continue;
                }
                match in_flight.remove(which % in_flight.len()) {
                    InFlight::Segment(compaction) => {
                        // Each segment conditioned on its item's version as
                        // read; the pool item's write, for those that
                        // landed, follows them, landing later.
                        let mut lost = Vec::new();
                        for segment in compaction.segments.iter().filter(|s| !s.slots.is_empty()) {
                            let stored = segments.get(&segment.segment).map_or(0, |(v, _)| *v);
                            if stored == segment.stored {
                                segments.insert(
                                    segment.segment,
                                    (segment.version, segment.slots.clone()),
                                );
                            } else {
                                lost.push(segment.segment);
                            }
                        }
                        if let Some(update) = compaction.without(&lost) {
                            let landed = compaction
                                .segments
                                .iter()
                                .filter(|s| !s.slots.is_empty() && !lost.contains(&s.segment))
                                .map(|s| s.segment)
                                .collect();
                            in_flight.push(InFlight::Compaction {
                                first: compaction,
                                landed,
                                update,
                            });
                        }
                    }
                    InFlight::Compaction {
                        first,
                        landed,
                        update,
                    } => match pool.apply(&update) {
                        Ok(next) => {
                            check_landed(&pool, &next, &update, &[], now)?;
                            pool = next;
                        }
                        Err(_) => {
                            if let Some(again) = first.again_on(&pool, &landed) {
                                in_flight.push(InFlight::Compaction {
                                    first,
                                    landed,
                                    update: again.update,
                                });
                            }
                        }
                    },
                    InFlight::Write {
                        lowered,
                        planned,
                        unchecked,
                        seen,
                    } => {
                        if let Ok(next) = pool.apply(&lowered) {
                            // What the pool item checked implies what was planned.
                            for expect in &planned.expect {
                                if !matches!(expect, Expect::NotHeld(_) | Expect::SlotsLen(_))
                                    || !split
                                {
                                    prop_assert!(
                                        pool.holds(expect),
                                        "landed though {:?} does not hold",
                                        expect
                                    );
                                }
                            }
                            check_landed(&pool, &next, &planned, &seen, now)?;
                            if planned
                                .changes
                                .iter()
                                .any(|c| matches!(c, Change::SetCount(_)))
                            {
                                prop_assert_eq!(
                                    next.in_use(now),
                                    pool.in_use(now),
                                    "resize never revokes"
                                );
                            }
                            if let Some(holder) = unchecked {
                                if let Some(undo) = next.duplicate_of(holder, &planned, now) {
                                    in_flight.push(plan(&next, undo));
                                }
                            }
                            pool = next;
                        }
                    }
                }
            }
            Op::Advance { ms } => now += ms,
        }
        let state = pool.state(now);
        prop_assert_eq!(
            state.available,
            u32::from(state.count).saturating_sub(state.in_use)
        );
        prop_assert!(pool.slots.len() >= usize::from(pool.count));
        check_segments(&pool, &segments)?;
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
        race(initial, ops, false)?;
    }

    /// The same races on a pool whose slots are split between the pool item
    /// and segments, with compaction interleaved at random points (its two
    /// writes landing apart, or the second never): every write as the pool
    /// item can check it ([`Pool::lower`]), and each segment holds the truth
    /// of every position the pool item does not.
    #[test]
    fn racing_plans_and_compaction_never_break_a_split_pools_promises(
        initial in 0u16..4,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        race(initial, ops, true)?;
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
