//! Item sizes as DynamoDB bills them: the tests and the benchmark count
//! what a pool item costs.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::codec::encode;
use crate::keys::PoolKey;
use crate::store::Record;

/// Bytes DynamoDB bills for an item, by its item-size rules: attribute names
/// plus values; a number is one byte per two significant digits plus one; a
/// map or list is 3 bytes plus, per element, its key, its value and one byte.
/// For tests and the benchmark, which count what DynamoDB bills.
#[cfg(any(test, feature = "measure"))]
pub fn item_size(key: &PoolKey, record: &Record) -> usize {
    stored_size(&encode(key, record))
}

/// [`item_size`] of an item as stored (as `GetItem` returns it).
#[cfg(any(test, feature = "measure"))]
pub fn stored_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

/// One attribute value's size, by DynamoDB's rules.
#[cfg(any(test, feature = "measure"))]
fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => {
            let digits: String = n.chars().filter(char::is_ascii_digit).collect();
            let significant = digits.trim_start_matches('0').trim_end_matches('0');
            significant.len().div_ceil(2) + 1
        }
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::number;
    use super::super::schema::pool_item::ENDED;
    use super::super::test_support::{full_pool, NOW};
    use super::*;
    use crate::domain::{
        AsyncLine, Ended, GivenUp, Holder, LeaseDigest, Pool, Sizing, Slot, Stamp, Ticket,
        MAX_COUNT,
    };

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

    /// The largest pool item the bounds allow (docs/DESIGN.md, "Every attribute
    /// has a bound"): count 1,000 fully held and `MAX_WAITERS` 1,000 waiting,
    /// every lease at the longest ttl, fences and ticket numbers a trillion
    /// grants old, every given-up id, ring place and async listing in use.
    #[test]
    fn the_largest_item_fits() {
        use crate::config::{TTL_SECONDS, WAITERS};
        use crate::domain::{GiveUp, ENDED_RING, MAX_GIVEN_UP, MAX_LISTED};
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
                // Listed async tickets keep exact ms (a longer number).
                give_up: if n < MAX_LISTED as u64 {
                    GiveUp::Exact(NOW + 604_799_999)
                } else {
                    GiveUp::Seconds(NOW / 1000 + 600_000)
                },
            })
            .collect();
        let given_up = (0..MAX_GIVEN_UP as u64)
            .map(|n| GivenUp {
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
        let line = AsyncLine {
            next: OLD,
            admitted: OLD - 1,
            listed: (0..MAX_LISTED as u64)
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
            given_up,
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
}

#[cfg(test)]
mod split_tests {
    use super::super::test_support::{holder, NOW};
    use super::*;
    use crate::domain::{BorrowPlan, Compaction, Layout, Pool};

    /// Compaction is due past `Compaction::DEFAULT.hot_max` hot entries
    /// (docs/DESIGN.md, "Compaction"): that many live leases in a split pool
    /// item, with a few waiters, stay within one write unit.
    #[test]
    fn a_split_item_at_the_hot_bound_with_waiters_fits_one_write_unit() {
        let key = PoolKey([7; 16]);
        let mut pool = Pool::new(100, NOW * 1000);
        assert!(matches!(pool.layout(), Layout::Split(_)));
        let hot = Compaction::DEFAULT.hot_max as u16;
        for n in 0..hot {
            let BorrowPlan::Take { update, .. } =
                pool.plan_borrow(holder(n, 30_000), NOW, NOW, 1000)
            else {
                panic!("slot {n}")
            };
            let (lowered, _) = pool.lower(&update);
            pool = pool.apply(&lowered).unwrap();
        }
        // And eight waiters, as a pool whose clients cycle keeps a few.
        for n in 0..8 {
            let BorrowPlan::Join(update) =
                pool.plan_borrow_or_join(holder(1000 + n, 30_000), NOW + 25_000, NOW, 1000, false)
            else {
                panic!("join {n}")
            };
            pool = pool.apply(&pool.lower(&update).0).unwrap();
        }
        assert_eq!(pool.queue().len(), 8);
        let size = item_size(
            &key,
            &Record {
                incarnation: 1,
                pool,
            },
        );
        println!("split item with {hot} hot leases and 8 waiters: {size} B");
        // With room for fences a million grants old (3 B more per lease).
        assert!(size + 3 * usize::from(hot) <= 1024, "{size} B");
    }
}
