//! Compaction: when a split pool's hot entries leave the pool item for
//! their segments, who compacts (one writer at a time, by a claim carried
//! in a write), and what one compaction writes (several segments, then the
//! pool item once), or writes again after its pool item write lost.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::layout::{segment_of, Layout, Split, FLAT_MAX, SEGMENT_SLOTS};
use super::{Change, Expect, Pool, Slot, Update};

/// At most this many segments in one compaction, and at most this many hot
/// entries moved (the pool item's write conditions on each): hot entries
/// scatter over every segment when all slots churn, and one segment a
/// compaction, with a pool item write each, could not keep up.
pub const COMPACTION_SEGMENTS: usize = 8;
const COMPACTION_ENTRIES: usize = 64;

/// Low bits of a compaction claim that tell apart writers that claim in the
/// same millisecond (the rest is the claim's end, Unix ms).
const CLAIM_NONCE_BITS: u32 = 10;

/// Which new pools are split, and when the pool item's hot entries move to
/// their segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// Pools created with a larger count are split ([`FLAT_MAX`]; tests
    /// split small pools too, so that they contend).
    pub split_above: u16,
    /// More hot entries than this, and compaction is due.
    pub hot_max: usize,
    /// A live lease younger than this stays hot: a slot just granted is the
    /// likeliest to be written again soon (returned at once, handed on),
    /// and a write to a hot slot conditions on it alone, not on its
    /// segment's version. Short: every live lease kept hot makes every
    /// write of the pool item larger, and a busy pool grants many a second.
    pub cold_after_ms: u64,
    /// How long a compaction claim lasts ([`Pool::compaction_claim`]): a
    /// compaction takes two round trips; a claim whose compactor died
    /// lapses after this, and the next write claims again.
    pub claim_ms: u64,
}

impl Compaction {
    pub const DEFAULT: Compaction = Compaction {
        split_above: FLAT_MAX,
        hot_max: 32,
        cold_after_ms: 100,
        claim_ms: 1_000,
    };
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction::DEFAULT
    }
}

impl Split {
    /// Whether a compaction claim is live at `now_ms`.
    fn claimed_at(&self, now_ms: u64) -> bool {
        self.claim != 0 && now_ms < self.claim >> CLAIM_NONCE_BITS
    }
}

/// One segment of a compaction: its item written first, conditioned on
/// its version being the pool item's as read (no other compaction of it
/// under way), so that the pool item's write, when it lands, cools its
/// entries over this very segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentWrite {
    pub segment: u16,
    /// The segment item's version as read: its write is conditioned on it.
    pub stored: u32,
    /// The version both items have after.
    pub version: u32,
    /// The segment's slots after, by position from `segment ×`
    /// [`SEGMENT_SLOTS`]: the pool's truth as read (a hot entry left in
    /// the pool item shadows its copy). Empty when the segment is not
    /// written (the pool item catches up with a segment written before).
    pub slots: Vec<Slot>,
}

/// A compaction step: write its segments (side by side), then the pool
/// item once for all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionPlan {
    pub segments: Vec<SegmentWrite>,
    /// The pool item's write: per segment, the moved entries as read and
    /// its version as read; it removes them, advances the versions and
    /// ends the compaction claim.
    pub update: Update,
}

impl CompactionPlan {
    /// The pool item's write without the segments in `lost` (their writes
    /// did not land: another compaction wrote them first), or `None` when
    /// no segment is left.
    pub fn without(&self, lost: &[u16]) -> Option<Update> {
        if lost.is_empty() {
            return Some(self.update.clone());
        }
        if self.segments.iter().all(|s| lost.contains(&s.segment)) {
            return None;
        }
        let kept = |position: u16| !lost.contains(&segment_of(position));
        let mut update = self.update.clone();
        update.expect.retain(|e| match *e {
            Expect::SegmentVersion { segment, .. } => !lost.contains(&segment),
            Expect::SlotFree(position) | Expect::SlotStamp { position, .. } => kept(position),
            _ => true,
        });
        update.changes.retain(|c| match *c {
            Change::SetSegmentVersion { segment, .. } => !lost.contains(&segment),
            Change::Cool(position) => kept(position),
            _ => true,
        });
        Some(update)
    }
}

impl CompactionPlan {
    /// After this compaction's pool item write lost (an entry it moves was
    /// written meanwhile), its segments in `landed` written: the pool item
    /// write again, on `pool` (the item as the loss showed it). Each
    /// segment as written holds the truth of its positions as first read,
    /// so an entry whose slot is still what its segment holds may leave;
    /// one written since stays hot, shadowing its copy. No segment is
    /// written again. `None` when no segment is left to record (another
    /// compaction moved its version).
    pub fn again_on(&self, pool: &Pool, landed: &[u16]) -> Option<CompactionPlan> {
        let Layout::Split(split) = &pool.layout else {
            return None;
        };
        let recorded = |segment: u16| {
            self.update.expect.iter().find_map(|e| match *e {
                Expect::SegmentVersion {
                    segment: s,
                    version,
                } if s == segment => Some(version),
                _ => None,
            })
        };
        let mut update = Update::default();
        let mut segments = Vec::new();
        for write in &self.segments {
            let written = !write.slots.is_empty();
            if written && !landed.contains(&write.segment) {
                continue;
            }
            let Some(version) =
                recorded(write.segment).filter(|v| split.version(write.segment) == *v)
            else {
                continue;
            };
            update.expect.push(Expect::SegmentVersion {
                segment: write.segment,
                version,
            });
            let base = write.segment * SEGMENT_SLOTS;
            for change in &self.update.changes {
                let Change::Cool(position) = *change else {
                    continue;
                };
                let as_written = write.slots.get(usize::from(position.wrapping_sub(base)));
                let unchanged = segment_of(position) == write.segment
                    && split.hot.contains(&position)
                    && as_written.is_some()
                    && pool.slots.get(usize::from(position)).unwrap_or(&Slot::Free)
                        == as_written.unwrap_or(&Slot::Free);
                if unchanged {
                    update.expect.push(pool.slot_as_read(position));
                    update.changes.push(Change::Cool(position));
                }
            }
            update.changes.push(Change::SetSegmentVersion {
                segment: write.segment,
                version: write.version,
            });
            segments.push(SegmentWrite {
                segment: write.segment,
                stored: write.version,
                version: write.version,
                slots: Vec::new(),
            });
        }
        if segments.is_empty() {
            return None;
        }
        if split.claim != 0 {
            update.changes.push(Change::EndCompactionClaim);
        }
        Some(CompactionPlan { segments, update })
    }
}

impl Pool {
    /// [`Pool::compaction_claim`] for the write `update` (as the pool item
    /// checks it) planned on this pool: on the pool it leaves. A write that
    /// cannot take the hot entries past `hot_max` (each slot it writes adds
    /// at most one) needs no copy of the pool to tell: none is made.
    pub fn compaction_claim_after(
        &self,
        update: &Update,
        config: Compaction,
        now_ms: u64,
        nonce: u64,
    ) -> Option<Change> {
        let Layout::Split(split) = &self.layout else {
            return None;
        };
        let written = update
            .changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Change::Take { .. } | Change::HandOff { .. } | Change::Free(_)
                )
            })
            .count();
        if split.hot.len() + written <= config.hot_max {
            return None;
        }
        let after = self.apply(update).ok();
        after
            .as_ref()
            .unwrap_or(self)
            .compaction_claim(config, now_ms, nonce)
    }

    /// The change that claims this pool's compaction, for the write that
    /// leaves this pool (as planned, at `now_ms`) to carry (no request of
    /// its own, no condition: it collides with nothing): when compaction is
    /// due (more than `hot_max` hot entries, some of them movable) and no
    /// claim is live as read.
    /// Every writer landing meanwhile sees it due; the writer whose write
    /// left its own claim ([`Pool::holds_compaction_claim`]) compacts, the
    /// others do not, so that compactions do not race each other (of two
    /// writing one segment, or cooling one entry, one cannot land).
    /// `nonce` tells apart writers claiming in the same millisecond.
    pub fn compaction_claim(&self, config: Compaction, now_ms: u64, nonce: u64) -> Option<Change> {
        let Layout::Split(split) = &self.layout else {
            return None;
        };
        if split.hot.len() <= config.hot_max || split.claimed_at(now_ms) {
            return None;
        }
        self.plan_compaction(config, now_ms)?;
        let until = now_ms.saturating_add(config.claim_ms.max(1));
        let token = (until << CLAIM_NONCE_BITS) | (nonce & ((1 << CLAIM_NONCE_BITS) - 1));
        Some(Change::ClaimCompaction {
            token,
            over: split.claim,
        })
    }

    /// Whether the compaction claim `token` is this pool's (its writer
    /// compacts).
    pub fn holds_compaction_claim(&self, token: u64) -> bool {
        matches!(&self.layout, Layout::Split(split) if split.claim == token && token != 0)
    }

    /// The compaction due on this pool at `now_ms`, if any: the hot
    /// entries that may leave the pool item (free ones, expired ones, and
    /// live ones older than `cold_after_ms`), but not the free or expired
    /// ones written next (the lowest: one for each waiter, and one for each
    /// lease younger than `cold_after_ms` up to `hot_max`, for the takes of
    /// borrowers that cycle), which would be written again at once. The
    /// segments with the most such entries first, up to
    /// [`COMPACTION_SEGMENTS`] of them and 64 entries in all (a segment
    /// holds at most 64): one pool item write cools them all.
    pub fn plan_compaction(&self, config: Compaction, now_ms: u64) -> Option<CompactionPlan> {
        let Layout::Split(split) = &self.layout else {
            return None;
        };
        if split.hot.len() <= config.hot_max {
            return None;
        }
        let open = |slot: Option<&Slot>| match slot {
            None | Some(Slot::Free) => true,
            Some(Slot::Held { holder, stamp }) => {
                stamp.granted_ms.saturating_add(holder.ttl_ms) <= now_ms
            }
        };
        let young = |slot: Option<&Slot>| {
            matches!(slot, Some(Slot::Held { holder, stamp })
                if now_ms < stamp.granted_ms.saturating_add(holder.ttl_ms.min(config.cold_after_ms)))
        };
        // The slots written next: those the live tickets are handed, then
        // those the next takes get (the lowest free), about one for each
        // lease granted within `cold_after_ms` (a borrower that cycles
        // returns and is soon back), at most `hot_max`. Cooling one of them
        // is futile, and costly: the take that writes it hot again makes
        // the compaction's pool item write fail after its segment landed.
        let cycling = split
            .hot
            .iter()
            .filter(|&&p| young(self.slots.get(usize::from(p))))
            .count()
            .min(config.hot_max);
        let written_next: BTreeSet<u16> = self
            .free_positions(now_ms)
            .into_iter()
            .take(self.waiting(now_ms) + cycling)
            .collect();
        let movable = |position: u16| {
            let slot = self.slots.get(usize::from(position));
            !written_next.contains(&position)
                && (open(slot)
                    || matches!(slot, Some(Slot::Held { stamp, .. })
                        if stamp.granted_ms.saturating_add(config.cold_after_ms) <= now_ms))
        };
        let mut by_segment: BTreeMap<u16, Vec<u16>> = BTreeMap::new();
        for &position in split.hot.iter().filter(|&&p| movable(p)) {
            by_segment
                .entry(segment_of(position))
                .or_default()
                .push(position);
        }
        // The most entries first; of equals, the lowest segment.
        let mut ranked: Vec<(u16, Vec<u16>)> = by_segment.into_iter().collect();
        ranked.sort_by_key(|(segment, positions)| (Reverse(positions.len()), *segment));
        let mut update = Update::default();
        let mut segments = Vec::new();
        let mut moved_in_all = 0;
        for (segment, moved) in ranked.into_iter().take(COMPACTION_SEGMENTS) {
            // Within the bound of entries (a segment's own, at most 64,
            // when it is the first).
            if moved_in_all > 0 && moved_in_all + moved.len() > COMPACTION_ENTRIES {
                break;
            }
            let recorded = split.version(segment);
            let stored = split.stored(segment);
            update.expect.push(Expect::SegmentVersion {
                segment,
                version: recorded,
            });
            if stored > recorded {
                // A compaction wrote the segment and not (yet) the pool
                // item. The segment holds the truth of every position that
                // is cold, as it did before (a position that turned hot
                // since never turned cold again without the pool item's
                // version moving), so the pool item catches up, cooling
                // nothing of it; a compaction may then write the segment
                // again. Until then none may: a pool item write landing
                // after a second segment write would cool its entries over
                // a segment that is not its own.
                update.changes.push(Change::SetSegmentVersion {
                    segment,
                    version: stored,
                });
                segments.push(SegmentWrite {
                    segment,
                    stored,
                    version: stored,
                    slots: Vec::new(),
                });
                continue;
            }
            let version = recorded + 1;
            for &position in &moved {
                update.expect.push(self.slot_as_read(position));
                update.changes.push(Change::Cool(position));
            }
            moved_in_all += moved.len();
            update
                .changes
                .push(Change::SetSegmentVersion { segment, version });
            let from = usize::from(segment) * usize::from(SEGMENT_SLOTS);
            let slots: Vec<Slot> = (from..from + usize::from(SEGMENT_SLOTS))
                .map(|p| self.slots.get(p).copied().unwrap_or(Slot::Free))
                .collect();
            segments.push(SegmentWrite {
                segment,
                stored,
                version,
                slots,
            });
        }
        if segments.is_empty() {
            return None;
        }
        if split.claim != 0 {
            update.changes.push(Change::EndCompactionClaim);
        }
        Some(CompactionPlan { segments, update })
    }
}
