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

/// A pool whose short grants were handed on, expired and reused: the ring of
/// memories they leave (one per place, however many churn).
fn churned_pool(grants: u16) -> Pool {
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

#[test]
fn ended_grants_round_trip_in_their_ring() {
    let key = PoolKey([7; 16]);
    let pool = churned_pool(40);
    assert_eq!(pool.ended().len(), crate::domain::ENDED_RING);
    let record = Record {
        incarnation: 3,
        pool,
    };
    let item = encode(&key, &record);
    assert!(item.contains_key("r0") && item.contains_key("r15") && !item.contains_key("r16"));
    assert_eq!(decode(&item).unwrap(), record);
    // A memory stored in the wrong place, or cut short, is corrupt.
    let mut wrong = item.clone();
    wrong.insert("r1".into(), item["r0"].clone());
    assert_eq!(decode(&wrong).unwrap_err().kind, StoreErrorKind::Corrupt);
    let mut short = item;
    short.insert("r0".into(), AttributeValue::B(Blob::new(vec![1; 9])));
    assert_eq!(decode(&short).unwrap_err().kind, StoreErrorKind::Corrupt);
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
    let e = Expression::of(7, &update);
    assert!(e.update.ends_with("REMOVE e"), "{}", e.update);
    assert!(!pool.apply(&update).unwrap().has_legacy_ended());
}

/// The largest pool item the bounds allow (docs/DESIGN.md, "Every attribute
/// has a bound"): count 1,000 fully held and `MAX_WAITERS` 1,000 waiting,
/// every lease at the longest ttl, fences and ticket numbers a trillion
/// grants old, every given-up id, ring place and async listing in use.
#[test]
fn the_largest_item_fits() {
    use crate::config::{TTL_SECONDS, WAITERS};
    use crate::domain::{ENDED_RING, MAX_LISTED, MAX_TOMBS};
    const OLD: u64 = 1_000_000_000_000;
    let key = PoolKey([7; 16]);
    let ttl_ms = (TTL_SECONDS.1 * 1000.0) as u64;
    let big = |n: u64| {
        let mut d = [0xff; 8];
        d[..4].copy_from_slice(&(n as u32).to_be_bytes());
        Holder {
            digest: LeaseDigest(d),
            ttl_ms,
        }
    };
    let slots = (0..u64::from(MAX_COUNT))
        .map(|n| Slot::Held {
            holder: big(n),
            stamp: Stamp {
                fence: OLD + n,
                granted_ms: NOW,
                handed: true,
            },
        })
        .collect();
    let queue = (0..WAITERS.1)
        .map(|n| Ticket {
            holder: big(10_000 + n),
            give_up_s: NOW / 1000 + 600_000,
        })
        .collect();
    let tombs = (0..MAX_TOMBS as u64)
        .map(|n| Tomb {
            digest: big(20_000 + n).digest,
            until_s: NOW / 1000 + 30,
        })
        .collect();
    let ended = (0..ENDED_RING as u64)
        .map(|n| Ended {
            digest: big(30_000 + n).digest,
            position: 999,
            stamp: Stamp {
                fence: OLD + MAX_COUNT as u64 + n,
                granted_ms: NOW,
                handed: true,
            },
        })
        .collect();
    let line = Line {
        next: OLD,
        admitted: OLD - 1,
        asyncs: (0..MAX_LISTED as u64)
            .map(|n| (big(40_000 + n).digest, OLD - 1 - n))
            .collect(),
        active: true,
    };
    let pool = Pool::from_parts(
        Sizing {
            count: MAX_COUNT,
            resizes: OLD,
        },
        NOW * 1000,
        OLD + 2 * u64::from(MAX_COUNT),
        slots,
        queue,
        tombs,
        ended,
    )
    .and_then(|pool| pool.with_line(line))
    .unwrap();
    let mut item = encode(
        &key,
        &Record {
            incarnation: u64::MAX,
            pool,
        },
    );
    // The dispatcher's pending wake (functions/dispatcher), in Unix ms.
    item.insert("wk".into(), number(NOW));
    let mut by_attribute: std::collections::BTreeMap<&str, usize> = Default::default();
    for (name, value) in &item {
        let group = match name.as_str() {
            "s" | "g" => "s, g (slots)",
            "q" | "w" => "q, w (queue)",
            "x" => "x (given-up ids)",
            n if n.starts_with(ENDED) => "r0..r15 (ring)",
            "y" => "y (async listings)",
            _ => "the rest",
        };
        *by_attribute.entry(group).or_default() +=
            stored_size(&HashMap::from([(name.clone(), value.clone())]));
    }
    let total = stored_size(&item);
    for (group, bytes) in &by_attribute {
        println!("{group}: {bytes} B");
    }
    println!("the largest item: {total} B");
    assert!(total < 400 * 1024, "{total} bytes");
    // What grows with use, apart from the slots and the queue, stays small.
    let small: usize = ["x (given-up ids)", "r0..r15 (ring)", "y (async listings)"]
        .iter()
        .map(|g| by_attribute[g])
        .sum();
    assert!(small <= 2 * 1024, "{small} bytes in x, r and y");
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
        vec![Ticket {
            holder: holder(4, 1_000),
            give_up_s: now / 1000 + 20,
        }],
        Vec::new(),
        vec![stale],
    )
    .unwrap();
    let ReturnPlan::Return(_, update) = pool.plan_return(holder(2, 60_000).digest, now) else {
        panic!()
    };
    let e = Expression::of(7, &update);
    assert_eq!(e.update.matches("r2").count(), 1, "{}", e.update);
    assert!(!e.condition.contains("r2"), "{}", e.condition);
    let after = pool.apply(&update).unwrap();
    assert_eq!(after.ended().len(), 1);
    assert_eq!(after.ended()[0].digest, holder(1, 1_000).digest);
}
