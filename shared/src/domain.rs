//! The pool as a value: slots, leases, expiry and resize. No I/O and no clock —
//! every operation takes `now_ms` (Unix milliseconds) so tests never sleep.

/// Largest `count` a pool may have (API.md: `0 … 1000`).
pub const MAX_COUNT: u16 = 1000;

/// The stored form of a lease UUID: the first 16 bytes of its SHA-256.
/// 128 bits keep a stolen table dump from granting anything, at half the bytes
/// of a full digest (every byte of the item is billed on every write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseDigest(pub [u8; 16]);

/// One held slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub digest: LeaseDigest,
    pub position: u16,
    /// The lease is live while `now_ms < expires_at_ms`.
    pub expires_at_ms: u64,
}

impl Lease {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// What `GET` shows: never lease UUIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub count: u16,
    pub in_use: u32,
    pub available: u32,
}

/// Every slot in `0 … count-1` is held by a live lease (or more leases are live
/// than `count` allows, after a shrink).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exhausted;

/// A pool: `count` numbered slots and the leases on them. Leases are kept
/// sorted by position; positions may be ≥ `count` after a shrink.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    count: u16,
    leases: Vec<Lease>,
}

impl Pool {
    /// An empty pool. `count` must already be validated (≤ [`MAX_COUNT`]).
    pub fn new(count: u16) -> Self {
        Pool {
            count,
            leases: Vec::new(),
        }
    }

    /// Rebuilds a pool from stored parts, restoring the sorted-by-position order.
    pub fn from_parts(count: u16, mut leases: Vec<Lease>) -> Self {
        leases.sort_by_key(|l| (l.position, l.expires_at_ms));
        Pool { count, leases }
    }

    pub fn count(&self) -> u16 {
        self.count
    }

    /// Stored leases, live or not yet pruned, sorted by position.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    pub fn in_use(&self, now_ms: u64) -> u32 {
        self.leases.iter().filter(|l| l.is_live(now_ms)).count() as u32
    }

    pub fn state(&self, now_ms: u64) -> PoolState {
        let in_use = self.in_use(now_ms);
        PoolState {
            count: self.count,
            in_use,
            available: u32::from(self.count).saturating_sub(in_use),
        }
    }

    /// When the next live lease expires: a waiting borrower sleeps no longer than this.
    pub fn next_expiry(&self, now_ms: u64) -> Option<u64> {
        self.leases
            .iter()
            .filter(|l| l.is_live(now_ms))
            .map(|l| l.expires_at_ms)
            .min()
    }

    /// Drops expired leases. Returns whether anything was dropped.
    pub fn prune(&mut self, now_ms: u64) -> bool {
        let before = self.leases.len();
        self.leases.retain(|l| l.is_live(now_ms));
        self.leases.len() != before
    }

    /// Takes the lowest free position in `0 … count-1` for a new lease.
    /// Fails when `count` live leases (or more, after a shrink) are held.
    pub fn borrow(
        &mut self,
        digest: LeaseDigest,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Result<u16, Exhausted> {
        self.prune(now_ms);
        if self.leases.len() >= usize::from(self.count) {
            return Err(Exhausted);
        }
        // Leases are sorted by position, so the first gap is the lowest free one.
        // Fewer than `count` leases are live, so a gap below `count` exists.
        let mut position: u16 = 0;
        let mut insert_at = self.leases.len();
        for (i, lease) in self.leases.iter().enumerate() {
            if lease.position != position {
                insert_at = i;
                break;
            }
            position += 1;
        }
        debug_assert!(position < self.count);
        self.leases.insert(
            insert_at,
            Lease {
                digest,
                position,
                expires_at_ms,
            },
        );
        Ok(position)
    }

    /// Frees a live lease. Returns false for an unknown, returned or expired one.
    /// Prunes only when the lease was found, so a `false` needs no write.
    pub fn return_lease(&mut self, digest: LeaseDigest, now_ms: u64) -> bool {
        let found = self
            .leases
            .iter()
            .position(|l| l.digest == digest && l.is_live(now_ms));
        match found {
            Some(i) => {
                self.leases.remove(i);
                self.prune(now_ms);
                true
            }
            None => false,
        }
    }

    /// Whether a live lease with this digest is held (used to recognise our own
    /// write after an ambiguous failure).
    pub fn holds(&self, digest: LeaseDigest, now_ms: u64) -> bool {
        self.leases
            .iter()
            .any(|l| l.digest == digest && l.is_live(now_ms))
    }

    /// Sets `count`, keeping every live lease (a shrink only withholds new
    /// borrows). Returns whether the pool changed, so an idempotent `PUT` needs
    /// no write.
    pub fn resize(&mut self, count: u16, now_ms: u64) -> bool {
        let pruned = self.prune(now_ms);
        let changed = self.count != count;
        self.count = count;
        pruned || changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> LeaseDigest {
        LeaseDigest([n; 16])
    }

    #[test]
    fn borrow_takes_lowest_free_position() {
        let mut pool = Pool::new(3);
        assert_eq!(pool.borrow(d(1), 100, 0), Ok(0));
        assert_eq!(pool.borrow(d(2), 100, 0), Ok(1));
        assert_eq!(pool.borrow(d(3), 100, 0), Ok(2));
        assert_eq!(pool.borrow(d(4), 100, 0), Err(Exhausted));
        assert!(pool.return_lease(d(2), 1));
        assert_eq!(pool.borrow(d(5), 100, 1), Ok(1));
    }

    #[test]
    fn expired_position_is_handed_out_next() {
        let mut pool = Pool::new(2);
        pool.borrow(d(1), 50, 0).unwrap();
        pool.borrow(d(2), 100, 0).unwrap();
        assert_eq!(pool.borrow(d(3), 200, 49), Err(Exhausted));
        // Expiry is exclusive: at exactly expires_at the lease is gone.
        assert_eq!(pool.borrow(d(3), 200, 50), Ok(0));
        assert_eq!(pool.leases().len(), 2);
    }

    #[test]
    fn count_zero_never_grants() {
        let mut pool = Pool::new(0);
        assert_eq!(pool.borrow(d(1), 100, 0), Err(Exhausted));
        assert_eq!(
            pool.state(0),
            PoolState {
                count: 0,
                in_use: 0,
                available: 0
            }
        );
    }

    #[test]
    fn state_counts_only_live_leases() {
        let mut pool = Pool::new(4);
        pool.borrow(d(1), 10, 0).unwrap();
        pool.borrow(d(2), 20, 0).unwrap();
        assert_eq!(pool.state(5).in_use, 2);
        assert_eq!(pool.state(10).in_use, 1);
        assert_eq!(pool.state(10).available, 3);
        assert_eq!(pool.state(20).in_use, 0);
    }

    #[test]
    fn shrink_keeps_live_leases_and_withholds_borrows() {
        let mut pool = Pool::new(4);
        for n in 0..4 {
            pool.borrow(d(n), 100, 0).unwrap();
        }
        assert!(pool.resize(2, 1));
        let state = pool.state(1);
        assert_eq!((state.count, state.in_use, state.available), (2, 4, 0));
        // Freeing one of positions 0/1 is not enough: 3 live leases > count 2.
        assert!(pool.return_lease(d(0), 2));
        assert_eq!(pool.borrow(d(9), 100, 2), Err(Exhausted));
        assert!(pool.return_lease(d(2), 3));
        assert!(pool.return_lease(d(3), 3));
        // Now 1 live lease (position 1): the lowest free is 0.
        assert_eq!(pool.borrow(d(9), 100, 3), Ok(0));
        assert_eq!(pool.borrow(d(10), 100, 3), Err(Exhausted));
    }

    #[test]
    fn positions_at_or_above_count_stay_held_until_they_end() {
        let mut pool = Pool::new(3);
        for n in 0..3 {
            pool.borrow(d(n), 100, 0).unwrap();
        }
        pool.resize(1, 0);
        pool.return_lease(d(0), 0);
        pool.return_lease(d(1), 0);
        // Position 2 (≥ count 1) is live, so the pool is full.
        assert_eq!(pool.borrow(d(5), 100, 0), Err(Exhausted));
        pool.resize(3, 0);
        assert_eq!(pool.borrow(d(5), 100, 0), Ok(0));
        assert_eq!(pool.borrow(d(6), 100, 0), Ok(1));
        assert_eq!(pool.borrow(d(7), 100, 0), Err(Exhausted));
    }

    #[test]
    fn return_is_idempotent_and_ignores_expired() {
        let mut pool = Pool::new(2);
        pool.borrow(d(1), 10, 0).unwrap();
        assert!(!pool.return_lease(d(2), 0), "unknown lease");
        assert!(pool.return_lease(d(1), 0));
        assert!(!pool.return_lease(d(1), 0), "already returned");
        pool.borrow(d(3), 10, 0).unwrap();
        assert!(!pool.return_lease(d(3), 10), "expired");
    }

    #[test]
    fn resize_reports_change_only_when_needed() {
        let mut pool = Pool::new(2);
        assert!(!pool.resize(2, 0));
        assert!(pool.resize(3, 0));
        pool.borrow(d(1), 5, 0).unwrap();
        assert!(!pool.resize(3, 4));
        assert!(pool.resize(3, 5), "pruning an expired lease is a change");
    }

    #[test]
    fn next_expiry_is_earliest_live() {
        let mut pool = Pool::new(3);
        assert_eq!(pool.next_expiry(0), None);
        pool.borrow(d(1), 30, 0).unwrap();
        pool.borrow(d(2), 10, 0).unwrap();
        pool.borrow(d(3), 20, 0).unwrap();
        assert_eq!(pool.next_expiry(0), Some(10));
        assert_eq!(pool.next_expiry(10), Some(20));
        assert_eq!(pool.next_expiry(30), None);
    }

    #[test]
    fn from_parts_restores_position_order() {
        let leases = vec![
            Lease {
                digest: d(2),
                position: 2,
                expires_at_ms: 9,
            },
            Lease {
                digest: d(0),
                position: 0,
                expires_at_ms: 9,
            },
        ];
        let mut pool = Pool::from_parts(3, leases);
        assert_eq!(pool.borrow(d(1), 9, 0), Ok(1));
        let positions: Vec<u16> = pool.leases().iter().map(|l| l.position).collect();
        assert_eq!(positions, vec![0, 1, 2]);
    }

    #[test]
    fn holds_sees_only_live_leases() {
        let mut pool = Pool::new(1);
        pool.borrow(d(1), 10, 0).unwrap();
        assert!(pool.holds(d(1), 9));
        assert!(!pool.holds(d(1), 10));
        assert!(!pool.holds(d(2), 0));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Borrow { ttl: u64 },
        Return { which: usize },
        Resize { count: u16 },
        Advance { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..50).prop_map(|ttl| Op::Borrow { ttl }),
            2 => (0usize..64).prop_map(|which| Op::Return { which }),
            1 => (0u16..8).prop_map(|count| Op::Resize { count }),
            2 => (0u64..20).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        /// Any sequence of operations keeps the invariants: no two live leases
        /// share a position, a grant never exceeds `count`, every grant is the
        /// lowest free position, and a return is true exactly for a live lease.
        #[test]
        fn invariants_hold(initial in 0u16..8, ops in proptest::collection::vec(op(), 1..200)) {
            let mut pool = Pool::new(initial);
            let mut now = 0u64;
            let mut issued: Vec<LeaseDigest> = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Borrow { ttl } => {
                        let digest = LeaseDigest((i as u128).to_le_bytes());
                        let live: Vec<u16> = pool.leases().iter()
                            .filter(|l| l.is_live(now)).map(|l| l.position).collect();
                        let lowest_free = (0..pool.count()).find(|p| !live.contains(p));
                        let result = pool.borrow(digest, now + ttl, now);
                        if live.len() >= usize::from(pool.count()) {
                            prop_assert_eq!(result, Err(Exhausted));
                        } else {
                            prop_assert_eq!(result.ok(), lowest_free);
                            issued.push(digest);
                        }
                    }
                    Op::Return { which } => {
                        if let Some(&digest) = issued.get(which % issued.len().max(1)) {
                            let was_live = pool.holds(digest, now);
                            prop_assert_eq!(pool.return_lease(digest, now), was_live);
                            prop_assert!(!pool.holds(digest, now));
                        }
                    }
                    Op::Resize { count } => {
                        let before = pool.in_use(now);
                        pool.resize(count, now);
                        prop_assert_eq!(pool.in_use(now), before, "resize never revokes");
                    }
                    Op::Advance { ms } => now += ms,
                }
                let mut positions: Vec<u16> = pool.leases().iter()
                    .filter(|l| l.is_live(now)).map(|l| l.position).collect();
                let n = positions.len();
                positions.sort_unstable();
                positions.dedup();
                prop_assert_eq!(positions.len(), n, "two live leases share a position");
                let state = pool.state(now);
                prop_assert_eq!(state.available, u32::from(state.count).saturating_sub(state.in_use));
            }
        }
    }
}
