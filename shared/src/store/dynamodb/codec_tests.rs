//! Tests of `codec.rs`.

use super::super::test_support::{churned_pool, full_pool, holder, NOW};
use super::*;
use crate::domain::ReturnPlan;

/// A split pool item with its cold slots: every slot where it was,
/// hot ones in the item, the others from `Cold`.
#[test]
fn split_items_round_trip_with_their_cold_slots() {
    use crate::domain::{Compaction, FLAT_MAX};
    let key = PoolKey([9; 16]);
    let full = full_pool(100, 2, 0);
    let split = full.pool.clone().split_above(FLAT_MAX);
    assert!(matches!(split.layout(), Layout::Split(_)));
    // Nothing hot yet: the slots are all cold.
    let record = Record {
        incarnation: 5,
        pool: split.clone(),
    };
    let item = encode(&key, &record);
    assert!(is_split(&item) && !item.contains_key(SLOTS));
    let cold = Cold {
        stored: BTreeMap::new(),
        held: split
            .slots()
            .iter()
            .enumerate()
            .map(|(p, s)| (p as u16, *s))
            .collect(),
    };
    assert_eq!(decode_split(&item, &cold).unwrap(), record);
    // A return hands position 70 to the first waiter (hot); once that
    // lease is old enough, compaction moves it to segment 1.
    let ReturnPlan::Return(_, update) = split.plan_return(holder(70, 30_000).digest, NOW + 1)
    else {
        panic!()
    };
    let after = split.apply(&split.lower(&update).0).unwrap();
    let config = Compaction {
        hot_max: 0,
        ..Compaction::DEFAULT
    };
    let plan = after.plan_compaction(config, NOW + 10_000).unwrap();
    assert_eq!(plan.segments[0].segment, 1);
    let after = after.apply(&plan.update).unwrap();
    let record = Record {
        incarnation: 5,
        pool: after.clone(),
    };
    let mut cold = cold.clone();
    cold.held.insert(70, plan.segments[0].slots[70 - 64]);
    cold.stored.insert(1, 1);
    let decoded = decode_split(&encode(&key, &record), &cold).unwrap();
    assert_eq!(decoded.pool.slots(), after.slots());
    assert_eq!(decoded, record);
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

#[test]
fn give_up_times_keep_their_kind() {
    let item = Item::new();
    let a = Attrs { item: &item };
    for give_up in [
        GiveUp::Seconds(1_764_201_600),
        GiveUp::Exact(1_764_201_600_123),
        // Whatever their size, seconds and exact ms never read as each other.
        GiveUp::Exact(5),
        GiveUp::Seconds(1_764_201_600_123),
    ] {
        assert_eq!(a.give_up(&give_up_value(give_up)).unwrap(), give_up);
    }
    // What every earlier version stored reads as whole seconds.
    assert_eq!(
        a.give_up(&number(1_764_201_600u64)).unwrap(),
        GiveUp::Seconds(1_764_201_600)
    );
    for bad in ["-", "--5", "1.5", "-x"] {
        assert!(a.give_up(&AttributeValue::N(bad.into())).is_err(), "{bad}");
    }
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
            GIVEN_UP,
            AttributeValue::M(HashMap::from([("x".to_string(), number(1))])),
        ),
        (GIVEN_UP, AttributeValue::L(vec![])),
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
