//! Every attribute of the pool has a bound, whatever the workload (see
//! docs/DESIGN.md, "Every attribute has a bound"): random sequences of every
//! operation, planned from stale reads and landing in any order, over
//! simulated hours, never leave one past its bound.

use proptest::prelude::*;

use super::*;

/// The queue's bound in these runs (`MAX_WAITERS`).
const WAITERS: usize = 12;

fn holder(who: u16, ttl_ms: u64) -> Holder {
    let mut digest = [0x5a; 8];
    digest[..2].copy_from_slice(&who.to_be_bytes());
    Holder {
        digest: LeaseDigest(digest),
        ttl_ms,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A newcomer plans a borrow: mostly short leases left to expire.
    Borrow {
        who: u16,
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// A waiter reads and plans its duty (hand-offs, prunes).
    Read {
        which: usize,
    },
    /// A waiter gives up and plans its cancel.
    GiveUp {
        which: usize,
    },
    /// A return of a holder's lease id, or of one never seen (a stranger's).
    Return {
        who: u16,
    },
    Resize {
        count: u16,
    },
    /// An enqueue (async, or a sync borrower that found a backlog) takes a
    /// number and writes its ticket item.
    Enqueue {
        who: u16,
        ttl_ms: u64,
        callback: bool,
    },
    /// Admission plans from the backlog as read.
    Admit,
    /// The dispatcher unlists an async ticket it recorded or found ended.
    Unlist {
        which: usize,
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
        6 => (0u16..400, prop_oneof![4 => 500u64..=5_000, 1 => 5_000u64..120_000], 0u64..20_000)
            .prop_map(|(who, ttl_ms, wait_ms)| Op::Borrow { who, ttl_ms, wait_ms }),
        5 => any::<usize>().prop_map(|which| Op::Read { which }),
        1 => any::<usize>().prop_map(|which| Op::GiveUp { which }),
        3 => (0u16..2_000).prop_map(|who| Op::Return { who }),
        1 => (0u16..6).prop_map(|count| Op::Resize { count }),
        2 => (0u16..400, 500u64..=5_000, any::<bool>())
            .prop_map(|(who, ttl_ms, callback)| Op::Enqueue { who, ttl_ms, callback }),
        2 => Just(Op::Admit),
        2 => any::<usize>().prop_map(|which| Op::Unlist { which }),
        10 => any::<usize>().prop_map(|which| Op::Land { which }),
        4 => prop_oneof![8 => 0u64..3_000, 1 => 3_000u64..600_000].prop_map(|ms| Op::Advance { ms }),
    ]
}

/// Every bound of docs/DESIGN.md's table.
fn check_bounds(pool: &Pool) -> Result<(), TestCaseError> {
    prop_assert!(pool.slots().len() <= usize::from(MAX_COUNT), "slots");
    prop_assert!(
        pool.queue().len() <= WAITERS,
        "queue: {}",
        pool.queue().len()
    );
    prop_assert!(
        pool.given_up().len() <= MAX_GIVEN_UP,
        "given-up ids: {}",
        pool.given_up().len()
    );
    prop_assert!(
        pool.ended().len() <= ENDED_RING,
        "ended: {}",
        pool.ended().len()
    );
    prop_assert!(
        pool.line().listed.len() <= MAX_LISTED,
        "async listings: {}",
        pool.line().listed.len()
    );
    Ok(())
}

/// DynamoDB refuses an update that names one attribute twice: no update
/// changes one place of the ring of ended grants twice.
fn names_each_place_once(update: &Update) -> Result<(), TestCaseError> {
    let mut places: Vec<u8> = update
        .changes
        .iter()
        .filter_map(|c| match *c {
            Change::SetEnded(ended) => Some(ended.place()),
            Change::RemoveEnded(place) => Some(place),
            _ => None,
        })
        .collect();
    let named = places.len();
    places.sort_unstable();
    places.dedup();
    prop_assert_eq!(places.len(), named, "a place named twice: {:?}", update);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bounds_hold_over_hours_of_random_operations(
        initial in 0u16..4,
        ops in proptest::collection::vec(op(), 500..3_000),
    ) {
        let mut now = 1_764_000_000_000u64;
        let mut pool = Pool::new(initial, now * 1000);
        let mut in_flight: Vec<Update> = Vec::new();
        let mut waiters: Vec<(Holder, u64)> = Vec::new();
        // Ticket items, in number order (the backlog as the store keeps it).
        let mut tickets: Vec<TicketItem> = Vec::new();
        for op in ops {
            let planned = in_flight.len();
            match op {
                Op::Borrow { who, ttl_ms, wait_ms } => {
                    let mine = holder(who, ttl_ms);
                    match pool.plan_borrow(mine, now + wait_ms, now, WAITERS) {
                        BorrowPlan::Take { update, .. } | BorrowPlan::Prune(update) => {
                            in_flight.push(update)
                        }
                        BorrowPlan::Join(update) => {
                            in_flight.push(update);
                            waiters.push((mine, now));
                        }
                        _ => {}
                    }
                }
                Op::Read { which } => {
                    if let Some(&(mine, joined)) = waiters.get(which % waiters.len().max(1)) {
                        match pool.plan_wait(&mine, joined, now) {
                            WaitPlan::Waiting { duty: Some(update), .. } => in_flight.push(update),
                            WaitPlan::Waiting { needed: 0, .. } => {
                                in_flight.extend(pool.plan_prune(now));
                            }
                            WaitPlan::Granted(_) | WaitPlan::Gone => {
                                waiters.retain(|(h, _)| *h != mine);
                            }
                            WaitPlan::Waiting { .. } => {}
                        }
                    }
                    // The dispatcher's duty for async heads.
                    in_flight.extend(pool.plan_serve(now));
                }
                Op::GiveUp { which } => {
                    if let Some(&(mine, _)) = waiters.get(which % waiters.len().max(1)) {
                        in_flight.extend(pool.plan_cancel(&mine));
                    }
                }
                Op::Return { who } => match pool.plan_return(holder(who, 0).digest, now) {
                    ReturnPlan::Return(_, update)
                    | ReturnPlan::Cancel(update)
                    | ReturnPlan::Remember(update) => in_flight.push(update),
                    ReturnPlan::Expired(_) | ReturnPlan::Remembered => {}
                },
                Op::Resize { count } => in_flight.extend(pool.plan_resize(count, now)),
                Op::Enqueue { who, ttl_ms, callback } => {
                    let Ok(next) = pool.apply(&Pool::plan_number()) else {
                        unreachable!("numbers never collide");
                    };
                    tickets.push(TicketItem {
                        number: next.line().next - 1,
                        holder: holder(1_000 + who, ttl_ms),
                        incarnation: 1,
                        joined_ms: now,
                        wait_until_ms: now + 3_600_000,
                        callback: callback.then(|| Callback {
                            url: "https://example.com/hook".into(),
                            token: "t".into(),
                        }),
                        state: TicketState::Waiting,
                        attempts: 0,
                        claim: None,
                    });
                    pool = next;
                }
                Op::Admit => {
                    in_flight.extend(pool.plan_admit(&tickets, now, WAITERS, 16));
                }
                Op::Unlist { which } => {
                    let listed = &pool.line().listed;
                    if let Some(&(digest, _)) = listed.get(which % listed.len().max(1)) {
                        in_flight.extend(pool.plan_unlist(digest));
                    }
                }
                Op::Land { which } => {
                    if !in_flight.is_empty() {
                        let update = in_flight.remove(which % in_flight.len());
                        if let Ok(next) = pool.apply(&update) {
                            pool = next;
                        }
                    }
                }
                Op::Advance { ms } => now += ms,
            }
            for update in in_flight.iter().skip(planned) {
                names_each_place_once(update)?;
            }
            check_bounds(&pool)?;
        }
    }
}

/// Short leases handed to waiters and left to expire (the workload that
/// grew the map of ended grants by 370 bytes a second): hours of it keep
/// the ring full and never past its size.
#[test]
fn hours_of_expiring_short_hand_offs_keep_the_ring_full_and_bounded() {
    let mut now = 1_764_000_000_000u64;
    let mut pool = Pool::new(4, now * 1000);
    let mut who = 0u16;
    let mut waiters: Vec<(Holder, u64)> = Vec::new();
    // Three simulated hours, a step every 250 ms.
    for _ in 0..(3 * 3600 * 4) {
        now += 250;
        who = who.wrapping_add(1);
        let mine = holder(who, 2_000);
        match pool.plan_borrow(mine, now + 10_000, now, WAITERS) {
            BorrowPlan::Take { update, .. } | BorrowPlan::Prune(update) => {
                pool = pool.apply(&update).expect("a fresh plan holds");
            }
            BorrowPlan::Join(update) => {
                pool = pool.apply(&update).expect("a fresh join holds");
                waiters.push((mine, now));
            }
            _ => {}
        }
        let mut still = Vec::new();
        for (mine, joined) in waiters.drain(..) {
            match pool.plan_wait(&mine, joined, now) {
                WaitPlan::Waiting {
                    duty: Some(update), ..
                } => {
                    pool = pool.apply(&update).expect("a fresh hand-off holds");
                    still.push((mine, joined));
                }
                WaitPlan::Waiting { .. } => still.push((mine, joined)),
                WaitPlan::Granted(_) | WaitPlan::Gone => {}
            }
        }
        waiters = still;
        assert!(pool.ended().len() <= ENDED_RING);
        assert!(pool.queue().len() <= WAITERS);
    }
    assert_eq!(
        pool.ended().len(),
        ENDED_RING,
        "short hand-offs were reused"
    );
}
