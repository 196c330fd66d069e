//! Tests of `expression.rs`.

use aws_sdk_dynamodb::types::AttributeValue;

use super::super::codec::{decode, encode};
use super::super::test_support::{churned_pool, full_pool, holder, NOW};
use super::*;
use crate::domain::{BorrowPlan, Ended, GiveUp, Pool, ReturnPlan, Sizing, Slot, Stamp, Ticket};
use crate::keys::PoolKey;

#[test]
fn expressions_name_only_what_they_touch() {
    let mut pool = full_pool(2, 0, 0).pool;
    // A return without waiters: its own lease, nothing else.
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, NOW + 1) else {
        panic!()
    };
    let e = Expression::of(7, &update, false);
    assert_eq!(e.condition, "i = :v0 AND g[1] = :v1");
    assert_eq!(e.update, "SET s[1] = :v2, g[1] = :v2");
    // With a waiter: the hand-off names no ticket and no other slot.
    let BorrowPlan::Join(join) = pool.plan_borrow(holder(9, 500), NOW + 25_000, NOW, 100) else {
        panic!()
    };
    pool = pool.apply(&join).unwrap();
    let e = Expression::of(7, &join, false);
    assert_eq!(
        e.condition,
        "i = :v0 AND attribute_not_exists(x.#t0) AND (attribute_not_exists(n) OR a = n) AND size(q) < :v1 AND NOT contains(q, :v2) AND NOT contains(s, :v2)"
    );
    assert_eq!(
        e.update,
        "SET q = list_append(q, :v3), w = list_append(w, :v4)"
    );
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, NOW + 1) else {
        panic!()
    };
    let e = Expression::of(7, &update, false);
    assert_eq!(e.condition, "i = :v0 AND g[1] = :v1 AND c = :v2");
    assert_eq!(
        e.update,
        "SET s[1] = if_not_exists(q[0], :v3), g[1] = f + :v4, f = f + :v5 REMOVE q[0], w[0]"
    );
}

/// Every kind of write, as the planners make it on a small pool: (name, update).
fn every_write() -> Vec<(&'static str, Update)> {
    use crate::domain::{BorrowPlan, ReturnPlan, WaitPlan};
    let now = NOW;
    let mut writes = Vec::new();
    let mut pool = Pool::new(2, now * 1000);
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(1, 10_000), now, now, 100) else {
        panic!()
    };
    writes.push(("take", update.clone()));
    // A take past a live ticket (a borrower that may not wait): the slot the
    // ticket is owed must still be free.
    let mut three = Pool::new(3, now * 1000);
    let BorrowPlan::Join(join) =
        three.plan_borrow_or_join(holder(8, 10_000), now + 25_000, now, 100, false)
    else {
        panic!()
    };
    three = three.apply(&join).unwrap();
    let BorrowPlan::Take { update: past, .. } = three.plan_borrow(holder(9, 10_000), now, now, 100)
    else {
        panic!()
    };
    writes.push(("take, a ticket waiting", past));
    pool = pool.apply(&update).unwrap();
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(2, 10_000), now, now, 100) else {
        panic!()
    };
    // As the store sends it: the slot below is expected still held.
    writes.push(("take above a held slot", pool.lower(&update).0));
    pool = pool.apply(&update).unwrap();
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(2, 10_000).digest, now) else {
        panic!()
    };
    writes.push(("return, nobody waiting", update));
    let BorrowPlan::Join(update) = pool.plan_borrow(holder(3, 30_000), now + 25_000, now, 100)
    else {
        panic!()
    };
    writes.push(("join", update.clone()));
    pool = pool.apply(&update).unwrap();
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(2, 10_000).digest, now) else {
        panic!()
    };
    writes.push(("return, handing off", pool.lower(&update).0));
    let ReturnPlan::Cancel(update) = pool.plan_return(holder(3, 30_000).digest, now) else {
        panic!()
    };
    writes.push(("cancel", update));
    let ReturnPlan::Remember(update) = pool.plan_return(holder(7, 30_000).digest, now) else {
        panic!()
    };
    writes.push(("remember a given-up id", update));
    // A waiter hands an expired slot to the head (itself).
    let later = now + 10_000;
    let WaitPlan::Waiting {
        duty: Some(update), ..
    } = pool.plan_wait(&holder(3, 30_000), now, later)
    else {
        panic!()
    };
    writes.push(("a waiter hands a free slot on", update));
    writes.push(("resize", pool.plan_resize(3, now).unwrap()));
    // Two slots free at once (a raise) and three waiting: one write serves
    // the first two in line.
    let mut pool = Pool::new(1, now * 1000);
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(1, 10_000), now, now, 100) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    for n in 3..6 {
        let BorrowPlan::Join(update) = pool.plan_borrow(holder(n, 30_000), now + 25_000, now, 100)
        else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
    }
    pool = pool.apply(&pool.plan_resize(3, now).unwrap()).unwrap();
    let WaitPlan::Waiting {
        duty: Some(update), ..
    } = pool.plan_wait(&holder(4, 30_000), now, now)
    else {
        panic!()
    };
    writes.push(("waiters hand several free slots on at once", update));
    // A short grant handed to a waiter, expired unread: the hand-off that
    // reuses its slot remembers it in the ring.
    let mut pool = churned_pool(1);
    let joined = now + 1_500;
    let BorrowPlan::Join(update) = pool.plan_borrow(holder(2, 1_000), joined + 20_000, joined, 100)
    else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    let WaitPlan::Waiting {
        duty: Some(update), ..
    } = pool.plan_wait(&holder(2, 1_000), joined, joined + 1_500)
    else {
        panic!()
    };
    assert!(update
        .changes
        .iter()
        .any(|c| matches!(c, Change::SetEnded(_))));
    writes.push(("a hand-off that reuses a short grant's slot", update));
    writes
}

/// The writes of a split pool, as its pool item checks them.
fn every_split_write() -> Vec<(&'static str, Update)> {
    use crate::domain::{BorrowPlan, Compaction, ReturnPlan};
    let now = NOW;
    let mut writes = Vec::new();
    let lowered = |pool: &Pool, update: &Update| pool.lower(update).0;
    let mut pool = Pool::new(100, now * 1000);
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(1, 10_000), now, now, 100) else {
        panic!()
    };
    let update = lowered(&pool, &update);
    writes.push(("split: take a cold slot", update.clone()));
    pool = pool.apply(&update).unwrap();
    let config = Compaction {
        hot_max: 0,
        ..Compaction::DEFAULT
    };
    let later = now + 5_000;
    // A take that finds compaction due carries the claim.
    let BorrowPlan::Take { mut update, .. } =
        pool.plan_borrow(holder(2, 10_000), later, later, 100)
    else {
        panic!()
    };
    update
        .changes
        .push(pool.compaction_claim(config, later, 5).expect("due"));
    let update = lowered(&pool, &update);
    writes.push(("split: a take that claims compaction", update.clone()));
    pool = pool.apply(&update).unwrap();
    let plan = pool.plan_compaction(config, later).unwrap();
    writes.push(("split: compaction", plan.update.clone()));
    pool = pool.apply(&plan.update).unwrap();
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 10_000).digest, later) else {
        panic!()
    };
    writes.push(("split: return a cold lease", lowered(&pool, &update)));
    // A hot slot handed to the head of the queue by its return.
    let mut pool = Pool::new(1, now * 1000).split_above(0);
    for (n, give_up) in [(1, now), (2, now + 25_000)] {
        let update = match pool.plan_borrow(holder(n, 30_000), give_up, now, 100) {
            BorrowPlan::Take { update, .. } | BorrowPlan::Join(update) => update,
            other => panic!("{other:?}"),
        };
        pool = pool.apply(&lowered(&pool, &update)).unwrap();
    }
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, now) else {
        panic!()
    };
    writes.push(("split: return, handing off", lowered(&pool, &update)));
    writes
}

/// docs/DESIGN.md shows every write's exact expressions, as the code makes them.
#[test]
fn the_design_document_shows_every_write() {
    let design = include_str!("../../../../docs/DESIGN.md");
    let mut missing = Vec::new();
    for (name, update, split) in every_write()
        .into_iter()
        .map(|(name, update)| (name, update, false))
        .chain(
            every_split_write()
                .into_iter()
                .map(|(name, update)| (name, update, true)),
        )
    {
        let e = Expression::of(7, &update, split);
        println!(
            "{name}:\n  ConditionExpression: {}\n  UpdateExpression: {}",
            e.condition, e.update
        );
        for expr in [&e.condition, &e.update] {
            if !design.contains(expr.as_str()) {
                missing.push(format!("{name}: {expr}"));
            }
        }
    }
    // A flat pool split in place (its own expression: it needs the slots).
    let mut flat = Pool::new(60, NOW * 1000).split_above(u16::MAX);
    let BorrowPlan::Take { update, .. } = flat.plan_borrow(holder(1, 30_000), NOW, NOW, 100) else {
        panic!()
    };
    flat = flat.apply(&update).unwrap();
    let split = flat.plan_split(crate::domain::Compaction::DEFAULT).unwrap();
    let read = Record {
        incarnation: 7,
        pool: flat.clone(),
    };
    let e = Expression::splitting(&read, &flat.apply(&split).unwrap());
    println!(
        "split in place:\n  ConditionExpression: {}\n  UpdateExpression: {}",
        e.condition, e.update
    );
    for expr in [&e.condition, &e.update] {
        if !design.contains(expr.as_str()) {
            missing.push(format!("split in place: {expr}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/DESIGN.md:\n{}",
        missing.join("\n")
    );
}

/// An item stored before the ring carries the map `e` that grew without
/// bound: it is not read, and the next write that reuses a slot drops it.
#[test]
fn the_unbounded_map_of_older_items_is_dropped_by_the_next_reuse() {
    let key = PoolKey([7; 16]);
    let mut item = encode(&key, &full_pool(2, 0, 0));
    let entries = (0..1000u16)
        .map(|n| (digest_key(&holder(n, 1).digest), number(n)))
        .collect();
    item.insert(LEGACY_ENDED.into(), AttributeValue::M(entries));
    let pool = decode(&item).unwrap().pool;
    assert!(pool.has_legacy_ended());
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, NOW + 1) else {
        panic!()
    };
    let e = Expression::of(7, &update, false);
    assert!(e.update.ends_with("REMOVE e"), "{}", e.update);
    assert!(!pool.apply(&update).unwrap().has_legacy_ended());
}

/// A return that takes out a stale memory of the ring and hands on a slot
/// whose short grant expired unread, remembered in the same place: one
/// write names that place once (DynamoDB refuses a path named twice).
#[test]
fn a_write_names_each_place_of_the_ring_once() {
    let now = NOW;
    let held = |who: u16, ttl_ms: u64, fence: u64, granted_ms: u64, handed: bool| Slot::Held {
        holder: holder(who, ttl_ms),
        stamp: Stamp {
            fence,
            granted_ms,
            handed,
        },
    };
    let stale = Ended {
        digest: holder(3, 1_000).digest,
        position: 0,
        stamp: Stamp {
            fence: 2,
            granted_ms: now - 60_000,
            handed: true,
        },
    };
    let pool = Pool::from_parts(
        Sizing {
            count: 2,
            resizes: 0,
        },
        now * 1000,
        40,
        vec![
            // Fence 18: place 2, as the stale memory's fence 2.
            held(1, 1_000, 18, now - 3_000, true),
            held(2, 60_000, 35, now - 1_000, false),
        ],
        // An async ticket: a return hands it the lower (expired) slot.
        vec![Ticket {
            holder: holder(4, 1_000),
            give_up: GiveUp::Exact(now + 20_000),
        }],
        Vec::new(),
        vec![stale],
    )
    .unwrap();
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(2, 60_000).digest, now) else {
        panic!()
    };
    let e = Expression::of(7, &update, false);
    assert_eq!(e.update.matches("r2").count(), 1, "{}", e.update);
    assert!(!e.condition.contains("r2"), "{}", e.condition);
    let after = pool.apply(&update).unwrap();
    assert_eq!(after.ended().len(), 1);
    assert_eq!(after.ended()[0].digest, holder(1, 1_000).digest);
}

/// The condition that the ticket at an index is live, evaluated as
/// DynamoDB does on the stored give-up (`w[i]`, encoded by the codec),
/// agrees with the domain's `Ticket::is_live` at every instant around each
/// kind of give-up's end.
#[test]
fn a_live_ticket_condition_agrees_with_the_domain_at_the_boundaries() {
    use super::super::codec::give_up_value;
    let n = |v: &AttributeValue| match v {
        AttributeValue::N(n) => n.parse::<i128>().unwrap(),
        other => panic!("{other:?}"),
    };
    let give_ups = [
        GiveUp::Seconds(NOW / 1000),
        GiveUp::Seconds(NOW / 1000 + 1),
        GiveUp::Exact(NOW + 500),
        GiveUp::Exact(NOW + 1_000),
    ];
    for give_up in give_ups {
        let ticket = Ticket {
            holder: holder(1, 1_000),
            give_up,
        };
        let stored = n(&give_up_value(give_up));
        for now_ms in NOW - 10..NOW + 2_500 {
            let update = Update {
                expect: vec![Expect::TicketLiveAt { index: 3, now_ms }],
                changes: Vec::new(),
            };
            let e = Expression::of(7, &update, false);
            assert_eq!(
                e.condition,
                "i = :v0 AND (attribute_not_exists(w[3]) OR w[3] >= :v1 OR w[3] < :v2)"
            );
            let holds = stored >= n(&e.values[":v1"]) || stored < n(&e.values[":v2"]);
            assert_eq!(
                holds,
                ticket.is_live(now_ms),
                "{give_up:?} at {now_ms}: {:?}",
                e.values
            );
        }
    }
}

/// A take past many live tickets on a split pool stays within DynamoDB's
/// 4 KB per expression: it conditions on one slot per ticket it leaves
/// owed, so the first tickets are served before it (each serve bounded too).
#[test]
fn a_take_past_many_waiters_stays_within_dynamodbs_expression_limit() {
    let mut pool = Pool::new(1000, NOW * 1000).split_above(48);
    for n in 0..100u16 {
        let BorrowPlan::Join(join) =
            pool.plan_borrow_or_join(holder(n, 30_000), NOW + 25_000, NOW, 100, false)
        else {
            panic!()
        };
        pool = pool.apply(&join).unwrap();
    }
    let mut writes = 0;
    loop {
        let (update, done) = match pool.plan_borrow(holder(5_000, 30_000), NOW, NOW, 100) {
            BorrowPlan::Prune(update) => (update, false),
            BorrowPlan::Take { update, .. } => (update, true),
            other => panic!("{other:?}"),
        };
        let (lowered, _) = pool.lower(&update);
        let e = Expression::of(7, &lowered, true);
        assert!(e.condition.len() <= 4096, "{} bytes", e.condition.len());
        assert!(e.update.len() <= 4096, "{} bytes", e.update.len());
        pool = pool.apply(&lowered).unwrap();
        writes += 1;
        if done {
            break;
        }
    }
    // 100 tickets, 16 served a write: six serves, then the take.
    assert_eq!(writes, 7);
}

/// The largest compaction (8 segments, 64 live entries, each conditioned on
/// its stamp) stays within DynamoDB's 4 KB per expression.
#[test]
fn the_largest_compaction_fits_dynamodbs_expression_limits() {
    use crate::domain::{Compaction, Layout, Split, COMPACTION_SEGMENTS};
    use std::collections::{BTreeMap, BTreeSet};
    let mut pool = Pool::new(1_000, NOW * 1000);
    for n in 0..1_000u16 {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(n, 600_000), NOW, NOW, 1000)
        else {
            panic!("slot {n}")
        };
        pool = pool.apply(&pool.lower(&update).0).unwrap();
    }
    // 8 entries hot in each of the 16 segments: the plan takes 8 segments.
    let hot: BTreeSet<u16> = (0..16u16)
        .flat_map(|segment| (0..8).map(move |i| segment * 64 + 56 + i))
        .filter(|p| *p < 1_000)
        .collect();
    let pool = pool.with_layout(Layout::Split(Box::new(Split::new(
        hot,
        BTreeMap::new(),
        BTreeMap::new(),
    ))));
    let config = Compaction {
        hot_max: 0,
        ..Compaction::DEFAULT
    };
    let plan = pool.plan_compaction(config, NOW + 10_000).unwrap();
    assert_eq!(plan.segments.len(), COMPACTION_SEGMENTS);
    let e = Expression::of(u64::MAX, &plan.update, true);
    assert!(e.condition.len() < 4096, "{}", e.condition.len());
    assert!(e.update.len() < 4096, "{}", e.update.len());
}

/// A grant on the last slot of a split pool of the largest count, every slot
/// below held: one condition a segment below it (16), within DynamoDB's
/// 4 KB per expression and 300 operators.
#[test]
fn a_grant_above_every_held_slot_of_the_largest_pool_fits_dynamodbs_limits() {
    let mut pool = Pool::new(crate::domain::MAX_COUNT, NOW * 1000).split_above(0);
    let mut last = None;
    for n in 0..crate::domain::MAX_COUNT {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(n, 600_000), NOW, NOW, 1000)
        else {
            panic!("slot {n}")
        };
        let lowered = pool.lower(&update).0;
        pool = pool.apply(&lowered).unwrap();
        last = Some(lowered);
    }
    let last = last.unwrap();
    let segments = last
        .expect
        .iter()
        .filter(|e| matches!(e, Expect::FreedIn { .. }))
        .count();
    assert_eq!(
        segments,
        usize::from((crate::domain::MAX_COUNT - 1) / crate::domain::SEGMENT_SLOTS) + 1
    );
    let e = Expression::of(7, &last, true);
    assert!(e.condition.len() <= 4096, "{} bytes", e.condition.len());
    assert!(e.update.len() <= 4096, "{} bytes", e.update.len());
    let operators = e.condition.matches(" AND ").count()
        + e.condition.matches(" OR ").count()
        + e.condition.matches('(').count()
        + e.condition.matches(" = ").count()
        + e.condition.matches(" <> ").count();
    assert!(operators < 300, "{operators} operators: {}", e.condition);
}
