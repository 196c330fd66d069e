//! Properties of the pure domain beyond the invariants proptest in
//! `shared/src/domain.rs`: the pool agrees with a plain model of API.md after
//! every step (so no operation loses, moves or resurrects a lease), reloading
//! from stored parts in any order changes nothing, pruning is invisible,
//! sleeping to `next_expiry` always makes progress, and a pool grants exactly
//! its free capacity, lowest positions first.

use proptest::prelude::*;
use semaphore::domain::{Exhausted, Lease, LeaseDigest, Pool};

/// API.md's model, written as plainly as possible: live leases are those with
/// `now < expires_at`; a borrow takes the lowest position of `0..count` no
/// live lease holds, if fewer than `count` are live.
#[derive(Clone, Debug, Default)]
struct Model {
    count: u16,
    leases: Vec<Lease>,
}

impl Model {
    fn live(&self, now: u64) -> Vec<Lease> {
        let mut live: Vec<Lease> = self
            .leases
            .iter()
            .copied()
            .filter(|l| now < l.expires_at_ms)
            .collect();
        live.sort_by_key(|l| (l.position, l.digest));
        live
    }

    fn borrow(&mut self, digest: LeaseDigest, expires_at_ms: u64, now: u64) -> Option<u16> {
        let live = self.live(now);
        if live.len() >= usize::from(self.count) {
            return None;
        }
        let position = (0..self.count).find(|p| live.iter().all(|l| l.position != *p))?;
        self.leases = live;
        self.leases.push(Lease {
            digest,
            position,
            expires_at_ms,
        });
        Some(position)
    }

    fn return_lease(&mut self, digest: LeaseDigest, now: u64) -> bool {
        let before = self.live(now).len();
        self.leases = self
            .live(now)
            .into_iter()
            .filter(|l| l.digest != digest)
            .collect();
        self.leases.len() != before
    }
}

fn live_of(pool: &Pool, now: u64) -> Vec<Lease> {
    let mut live: Vec<Lease> = pool
        .leases()
        .iter()
        .copied()
        .filter(|l| l.is_live(now))
        .collect();
    live.sort_by_key(|l| (l.position, l.digest));
    live
}

fn digest(n: usize) -> LeaseDigest {
    LeaseDigest((n as u128 + 1).to_le_bytes())
}

#[derive(Clone, Debug)]
enum Op {
    Borrow {
        ttl: u64,
    },
    Return {
        which: usize,
    },
    Resize {
        count: u16,
    },
    Advance {
        ms: u64,
    },
    Prune,
    /// Round-trip through stored parts, leases in a shuffled order.
    Reload {
        shuffle: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..60).prop_map(|ttl| Op::Borrow { ttl }),
        2 => (0usize..200).prop_map(|which| Op::Return { which }),
        1 => (0u16..8).prop_map(|count| Op::Resize { count }),
        3 => (0u64..25).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Prune),
        1 => any::<u64>().prop_map(|shuffle| Op::Reload { shuffle }),
    ]
}

/// A deterministic shuffle (Fisher–Yates on a xorshift stream).
fn shuffled(mut leases: Vec<Lease>, mut seed: u64) -> Vec<Lease> {
    for i in (1..leases.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        leases.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    leases
}

/// A pool reached by borrows with varied ttls and a shrink, for the
/// single-state properties.
fn some_pool() -> impl Strategy<Value = (Pool, u64)> {
    (
        1u16..8,
        proptest::collection::vec(1u64..100, 0..10),
        0u16..8,
        0u64..120,
    )
        .prop_map(|(count, ttls, shrink_to, now)| {
            let mut pool = Pool::new(count);
            for (i, ttl) in ttls.into_iter().enumerate() {
                let _ = pool.borrow(digest(i), ttl, 0);
            }
            pool.resize(shrink_to, 0);
            (pool, now)
        })
}

proptest! {
    #[test]
    fn pool_agrees_with_the_model_after_every_step(initial in 0u16..8, ops in proptest::collection::vec(op(), 1..250)) {
        let mut pool = Pool::new(initial);
        let mut model = Model { count: initial, leases: Vec::new() };
        let mut now = 0u64;
        let mut issued = 0usize;
        for op in ops {
            match op {
                Op::Borrow { ttl } => {
                    let d = digest(issued);
                    issued += 1;
                    let got = pool.borrow(d, now + ttl, now).ok();
                    prop_assert_eq!(got, model.borrow(d, now + ttl, now));
                }
                Op::Return { which } => {
                    let d = digest(which % issued.max(1));
                    prop_assert_eq!(pool.return_lease(d, now), model.return_lease(d, now));
                }
                Op::Resize { count } => {
                    pool.resize(count, now);
                    model.count = count;
                }
                Op::Advance { ms } => now += ms,
                Op::Prune => { pool.prune(now); }
                Op::Reload { shuffle } => {
                    let reloaded = Pool::from_parts(pool.count(), shuffled(pool.leases().to_vec(), shuffle | 1));
                    prop_assert_eq!(&reloaded, &pool, "from_parts depends on stored order");
                    pool = reloaded;
                }
            }
            prop_assert_eq!(live_of(&pool, now), model.live(now), "live leases differ from the model");
            prop_assert_eq!(pool.count(), model.count);
            prop_assert_eq!(pool.in_use(now) as usize, model.live(now).len());
        }
    }

    /// Dropping expired leases changes nothing observable.
    #[test]
    fn pruning_is_invisible((pool, now) in some_pool(), ttl in 1u64..50) {
        let mut pruned = pool.clone();
        pruned.prune(now);
        prop_assert_eq!(pruned.state(now), pool.state(now));
        prop_assert_eq!(pruned.next_expiry(now), pool.next_expiry(now));
        prop_assert_eq!(live_of(&pruned, now), live_of(&pool, now));
        let (mut a, mut b) = (pool.clone(), pruned);
        let d = digest(999);
        prop_assert_eq!(a.borrow(d, now + ttl, now), b.borrow(d, now + ttl, now));
    }

    /// Liveness for waiters: `next_expiry` is the earliest live expiry, and
    /// at that instant at least one lease has ended; in between, nothing does.
    #[test]
    fn sleeping_to_next_expiry_makes_progress((pool, now) in some_pool()) {
        match pool.next_expiry(now) {
            None => prop_assert_eq!(pool.in_use(now), 0),
            Some(at) => {
                prop_assert!(at > now);
                prop_assert_eq!(pool.in_use(at - 1), pool.in_use(now), "a lease ended before next_expiry");
                prop_assert!(pool.in_use(at) < pool.in_use(now), "nothing ended at next_expiry");
                let earliest = live_of(&pool, now).iter().map(|l| l.expires_at_ms).min();
                prop_assert_eq!(Some(at), earliest);
            }
        }
    }

    /// From any state, borrows at one instant succeed exactly
    /// max(0, count − in_use) times, on the free positions in ascending order.
    #[test]
    fn a_pool_grants_exactly_its_free_capacity((pool, now) in some_pool(), grow in 0u16..4) {
        let mut pool = pool;
        let count = pool.count() + grow;
        pool.resize(count, now);
        let held: Vec<u16> = live_of(&pool, now).iter().map(|l| l.position).collect();
        let mut free: Vec<u16> = (0..count).filter(|p| !held.contains(p)).collect();
        free.truncate(usize::from(count).saturating_sub(held.len()));
        let mut granted = Vec::new();
        for i in 0..usize::from(count) + 2 {
            match pool.borrow(digest(1000 + i), now + 10, now) {
                Ok(position) => granted.push(position),
                Err(Exhausted) => break,
            }
        }
        prop_assert_eq!(&granted, &free);
        prop_assert_eq!(pool.state(now).available, 0);
    }
}
