//! The segments this process has read or written, so that a read of a
//! split pool asks DynamoDB only for the segments compacted since.
//!
//! Safe without any invalidation: a segment item is only ever written with
//! a new version, conditioned on the one before (`put_segment`), and its
//! sort key names the pool's incarnation. So one (pool, incarnation,
//! segment, version) always holds the same slots, and a read that finds the
//! version its pool item records in here has the segment as DynamoDB has it.
//!
//! What the cache cannot know is a segment written ahead of its pool item
//! by a compaction that stopped halfway (another process's, say): its pool
//! item does not record it yet. Reading it is not needed for the truth (the
//! pool item still holds every position it moved), only for catching the
//! pool item up. A compaction that may have left one, or finds one (its
//! segment write refused or failed, its pool item write lost or failed),
//! marks the pool doubted, and the next read queries every segment.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::codec::Cold;
use crate::domain::Slot;
use crate::keys::PoolKey;

/// Segments kept at most (about 3 KB each in memory fully held: 6 MB).
/// When full the cache starts again empty: a miss costs a read, never a
/// mistake. Doubted pools are bounded the same way: a doubt forgotten is
/// found again by the next refused segment write.
const CAPACITY: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SegmentId {
    pool: PoolKey,
    incarnation: u64,
    segment: u16,
}

/// One segment's held positions (absolute) at `version`.
struct Kept {
    version: u32,
    held: Arc<[(u16, Slot)]>,
}

#[derive(Default)]
struct Inner {
    segments: HashMap<SegmentId, Kept>,
    /// Pools (of an incarnation) that may have a segment ahead of its pool
    /// item: read all their segments next time. Each doubt is numbered, so
    /// that a read clears only the doubt it saw before it started.
    doubted: HashMap<(PoolKey, u64), u64>,
    doubts: u64,
}

#[derive(Default)]
pub(super) struct SegmentCache {
    inner: Mutex<Inner>,
}

/// What the cache holds of the segments a pool item records.
pub(super) struct Lookup {
    /// The cached ones, at the recorded versions.
    pub(super) cold: Cold,
    /// The recorded segments it does not hold at their versions.
    pub(super) missing: Vec<u16>,
    /// Whether every segment must be read (see the module's doc): the
    /// doubt to clear once they are.
    pub(super) doubted: Option<u64>,
}

impl SegmentCache {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave an entry half-written: keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The segments at the versions `recorded` (segment → version, as the
    /// pool item records them) that are kept here, and those that are not.
    pub(super) fn lookup(
        &self,
        pool: &PoolKey,
        incarnation: u64,
        recorded: &BTreeMap<u16, u32>,
    ) -> Lookup {
        let inner = self.inner();
        let mut found = Lookup {
            cold: Cold::default(),
            missing: Vec::new(),
            doubted: inner.doubted.get(&(*pool, incarnation)).copied(),
        };
        for (&segment, &version) in recorded {
            let id = SegmentId {
                pool: *pool,
                incarnation,
                segment,
            };
            match inner
                .segments
                .get(&id)
                .filter(|kept| kept.version == version)
            {
                Some(kept) => {
                    found.cold.held.extend(kept.held.iter().copied());
                    found.cold.stored.insert(segment, version);
                }
                None => found.missing.push(segment),
            }
        }
        found
    }

    /// Keeps a segment as read or written at `version` (a later version
    /// replaces an earlier one; an earlier never replaces a later).
    pub(super) fn keep(
        &self,
        pool: &PoolKey,
        incarnation: u64,
        segment: u16,
        version: u32,
        held: impl IntoIterator<Item = (u16, Slot)>,
    ) {
        let id = SegmentId {
            pool: *pool,
            incarnation,
            segment,
        };
        let mut inner = self.inner();
        if inner
            .segments
            .get(&id)
            .is_some_and(|kept| kept.version >= version)
        {
            return;
        }
        if inner.segments.len() >= CAPACITY {
            inner.segments.clear();
        }
        let held = held.into_iter().collect();
        inner.segments.insert(id, Kept { version, held });
    }

    /// The pool may have a segment ahead of its pool item.
    pub(super) fn doubt(&self, pool: &PoolKey, incarnation: u64) {
        let mut inner = self.inner();
        if inner.doubted.len() >= CAPACITY {
            inner.doubted.clear();
        }
        inner.doubts += 1;
        let doubt = inner.doubts;
        inner.doubted.insert((*pool, incarnation), doubt);
    }

    /// Every segment of the pool was read, after its lookup saw `seen`: a
    /// doubt raised since stays.
    pub(super) fn trust(&self, pool: &PoolKey, incarnation: u64, seen: Option<u64>) {
        let mut inner = self.inner();
        if seen.is_some() && inner.doubted.get(&(*pool, incarnation)) == seen.as_ref() {
            inner.doubted.remove(&(*pool, incarnation));
        }
    }

    /// The pool is gone: its segments are never read again.
    pub(super) fn forget(&self, pool: &PoolKey) {
        let mut inner = self.inner();
        inner.segments.retain(|id, _| id.pool != *pool);
        inner.doubted.retain(|(p, _), _| p != pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Holder, LeaseDigest, Stamp};

    fn held(position: u16) -> (u16, Slot) {
        (
            position,
            Slot::Held {
                holder: Holder {
                    digest: LeaseDigest([position as u8; 8]),
                    ttl_ms: 60_000,
                },
                stamp: Stamp {
                    fence: u64::from(position),
                    granted_ms: 1,
                    handed: false,
                },
            },
        )
    }

    #[test]
    fn a_segment_is_found_only_at_the_version_recorded() {
        let cache = SegmentCache::default();
        let pool = PoolKey([1; 16]);
        cache.keep(&pool, 7, 0, 2, [held(3)]);
        let recorded = BTreeMap::from([(0, 2), (1, 1)]);
        let found = cache.lookup(&pool, 7, &recorded);
        assert_eq!(found.cold.held.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(found.cold.stored, BTreeMap::from([(0, 2)]));
        assert_eq!(found.missing, [1]);
        assert!(found.doubted.is_none());
        // Another version, another incarnation, another pool: not found.
        assert_eq!(
            cache.lookup(&pool, 7, &BTreeMap::from([(0, 3)])).missing,
            [0]
        );
        assert_eq!(
            cache.lookup(&pool, 8, &BTreeMap::from([(0, 2)])).missing,
            [0]
        );
        let other = PoolKey([2; 16]);
        assert_eq!(
            cache.lookup(&other, 7, &BTreeMap::from([(0, 2)])).missing,
            [0]
        );
    }

    #[test]
    fn a_later_version_replaces_an_earlier_never_the_reverse() {
        let cache = SegmentCache::default();
        let pool = PoolKey([1; 16]);
        cache.keep(&pool, 7, 0, 2, [held(3)]);
        cache.keep(&pool, 7, 0, 1, [held(4)]);
        assert!(cache.lookup(&pool, 7, &BTreeMap::from([(0, 1)])).missing == [0]);
        cache.keep(&pool, 7, 0, 3, [held(5)]);
        let found = cache.lookup(&pool, 7, &BTreeMap::from([(0, 3)]));
        assert_eq!(found.cold.held.keys().copied().collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn a_doubted_pool_is_read_whole_until_trusted_and_a_forgotten_one_is_gone() {
        let cache = SegmentCache::default();
        let pool = PoolKey([1; 16]);
        cache.keep(&pool, 7, 0, 1, [held(3)]);
        cache.doubt(&pool, 7);
        let seen = cache.lookup(&pool, 7, &BTreeMap::new()).doubted;
        assert!(seen.is_some());
        assert!(cache.lookup(&pool, 8, &BTreeMap::new()).doubted.is_none());
        cache.trust(&pool, 7, seen);
        assert!(cache.lookup(&pool, 7, &BTreeMap::new()).doubted.is_none());
        cache.forget(&pool);
        assert_eq!(
            cache.lookup(&pool, 7, &BTreeMap::from([(0, 1)])).missing,
            [0]
        );
    }

    #[test]
    fn a_doubt_raised_while_the_segments_were_read_stays() {
        let cache = SegmentCache::default();
        let pool = PoolKey([1; 16]);
        cache.doubt(&pool, 7);
        let seen = cache.lookup(&pool, 7, &BTreeMap::new()).doubted;
        // Another request's compaction is refused during this read.
        cache.doubt(&pool, 7);
        cache.trust(&pool, 7, seen);
        assert!(cache.lookup(&pool, 7, &BTreeMap::new()).doubted.is_some());
        // A read that started undoubted clears nothing either.
        cache.trust(&pool, 7, None);
        assert!(cache.lookup(&pool, 7, &BTreeMap::new()).doubted.is_some());
    }
}
