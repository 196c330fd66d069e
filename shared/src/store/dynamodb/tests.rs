use super::*;
use crate::domain::{BorrowPlan, ReturnPlan};

/// A realistic clock: stamps and give-up times have today's digit counts.
const NOW: u64 = 1_763_900_000_000;

fn holder(n: u16, ttl_ms: u64) -> Holder {
    let mut d = [0xab; 8];
    d[..2].copy_from_slice(&n.to_be_bytes());
    Holder {
        digest: LeaseDigest(d),
        ttl_ms,
    }
}

/// A pool of `count` with every slot held (ttl 30 s) and `waiting` tickets
/// queued, after `grants` grants in all (fences grow with a pool's age).
fn full_pool(count: u16, waiting: u16, grants: u64) -> Record {
    let mut pool = Pool::new(count, NOW * 1000);
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
            pool.tombs().to_vec(),
            pool.ended().to_vec(),
        )
        .unwrap(),
    }
}

#[test]
fn items_round_trip() {
    let key = PoolKey([7; 16]);
    for (count, waiting) in [(0, 0), (1, 3), (4, 0), (1000, 10)] {
        let record = full_pool(count, waiting, 0);
        assert_eq!(decode(&encode(&key, &record)).unwrap(), record);
    }
    // Free slots, tombstones and a shrunk list round-trip too.
    let mut pool = full_pool(3, 1, 0).pool;
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, NOW + 1) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    let ReturnPlan::Remember(update) = pool.plan_return(holder(77, 1).digest, NOW + 2) else {
        panic!()
    };
    pool = pool.apply(&update).unwrap();
    let record = Record {
        incarnation: 1,
        pool,
    };
    assert_eq!(decode(&encode(&key, &record)).unwrap(), record);
}

/// Issue #16's item targets, in DynamoDB's own size rules.
#[test]
fn items_are_small() {
    let key = PoolKey([7; 16]);
    // A million grants into the pool's life (7-digit fences).
    let size32 = item_size(&key, &full_pool(32, 0, 1_000_000));
    assert!(size32 <= 1024, "count 32 fully held is {size32} bytes");
    let size1000 = item_size(&key, &full_pool(1000, 0, 1_000_000));
    assert!(
        size1000 <= 25 * 1024,
        "count 1000 fully held is {size1000} bytes"
    );
    let per_ticket = (item_size(&key, &full_pool(4, 100, 1_000_000))
        - item_size(&key, &full_pool(4, 0, 1_000_000)))
        / 100;
    assert!(per_ticket <= 24, "{per_ticket} bytes per waiting ticket");
    println!("count 32 fully held: {size32} B; count 1000: {size1000} B; per waiting ticket: {per_ticket} B");
    // Uncontended pools stay within one write unit.
    assert!(item_size(&key, &full_pool(4, 0, 1_000_000)) <= 1024);
}

#[test]
fn corrupt_items_are_errors_not_panics() {
    let key = PoolKey([7; 16]);
    let good = encode(&key, &full_pool(2, 1, 0));
    let blob = |b: &[u8]| AttributeValue::B(Blob::new(b.to_vec()));
    let broken: Vec<(&str, AttributeValue)> = vec![
        (QUEUE, AttributeValue::L(vec![blob(&[1, 2, 3])])),
        (QUEUE, AttributeValue::L(vec![])),
        (COUNT, number(1001)),
        (COUNT, number(3)),
        (FENCE, number(1)),
        (FENCE, number(10)),
        (SLOTS, AttributeValue::L(vec![number(0)])),
        (SLOTS, AttributeValue::L(vec![number(1), number(0)])),
        (
            STAMPS,
            AttributeValue::L(vec![number(0), AttributeValue::S("x".into())]),
        ),
        (
            TOMBS,
            AttributeValue::M(HashMap::from([("x".to_string(), number(1))])),
        ),
        (TOMBS, AttributeValue::L(vec![])),
        (INCARNATION, AttributeValue::S("x".into())),
        (INCARNATION, number("1e40")),
    ];
    for (name, value) in broken {
        let mut item = good.clone();
        item.insert(name.into(), value.clone());
        assert_eq!(
            decode(&item).unwrap_err().kind,
            StoreErrorKind::Corrupt,
            "{name} = {value:?}"
        );
    }
    let mut item = good;
    item.remove(INCARNATION);
    assert_eq!(decode(&item).unwrap_err().kind, StoreErrorKind::Corrupt);
}

#[test]
fn expressions_name_only_what_they_touch() {
    let mut pool = full_pool(2, 0, 0).pool;
    // A return without waiters: its own lease, nothing else.
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(1, 30_000).digest, NOW + 1) else {
        panic!()
    };
    let e = Expression::of(7, &update);
    assert_eq!(e.condition, "i = :v0 AND g[1] = :v1");
    assert_eq!(e.update, "SET s[1] = :v2, g[1] = :v2");
    // With a waiter: the hand-off names no ticket and no other slot.
    let BorrowPlan::Join(join) = pool.plan_borrow(holder(9, 500), NOW + 25_000, NOW, 100) else {
        panic!()
    };
    pool = pool.apply(&join).unwrap();
    let e = Expression::of(7, &join);
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
    let e = Expression::of(7, &update);
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
    pool = pool.apply(&update).unwrap();
    let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(2, 10_000), now, now, 100) else {
        panic!()
    };
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
    writes.push(("return, handing off", update.clone()));
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
    writes
}

/// docs/DESIGN.md shows every write's exact expressions, as the code makes them.
#[test]
fn the_design_document_shows_every_write() {
    let design = include_str!("../../../../docs/DESIGN.md");
    let mut missing = Vec::new();
    for (name, update) in every_write() {
        let e = Expression::of(7, &update);
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
    assert!(
        missing.is_empty(),
        "not in docs/DESIGN.md:\n{}",
        missing.join("\n")
    );
}
