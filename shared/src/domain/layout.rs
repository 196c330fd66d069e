//! Where a pool's slots live. A small pool keeps every slot in the pool
//! item ([`Layout::Flat`]). A large one ([`Layout::Split`]) keeps only its
//! *hot* slots there (granted or freed recently) and the others, *cold*, in
//! segment items of [`SEGMENT_SLOTS`] slots that only compaction writes: so
//! the item every borrow, return and hand-off writes stays small, and
//! DynamoDB, which bills a write by the whole item, bills about one unit.
//!
//! The truth for a position is its hot entry if it has one, else its
//! segment's (a segment never written holds free slots). Because only
//! compaction writes a segment, and every compaction advances the
//! segment's version in the pool item, a write that depends on a cold slot
//! conditions on the pool item alone: no hot entry there, and the segment's
//! version as read ([`Expect::Cold`]).
//!
//! The planners work on the pool's whole truth and know nothing of this:
//! [`Pool::lower`] turns what they expect of a slot into what the pool item
//! can show, and every write goes through it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{Change, Expect, Holder, Lease, LeaseDigest, Pool, Slot, Update};

/// Pools created with a count up to this keep every slot in the pool item:
/// fully held with a few waiters, that item stays within one write unit.
pub const FLAT_MAX: u16 = 48;

/// Slots per segment item: fully held, about 1.3 KB.
pub const SEGMENT_SLOTS: u16 = 64;

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

/// Where a pool's slots are stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Every slot in the pool item, by position.
    #[default]
    Flat,
    /// Hot slots in the pool item, the rest in segment items.
    Split(Box<Split>),
}

/// A split pool's bookkeeping, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Positions the pool item holds an entry for.
    pub(super) hot: BTreeSet<u16>,
    /// Per segment, its version as the pool item records it (absent: 0,
    /// never compacted).
    pub(super) versions: BTreeMap<u16, u32>,
    /// Per segment item, its own version as read (absent: 0, no item). It
    /// runs ahead of `versions` after a compaction that wrote its segment
    /// but not the pool item.
    pub(super) stored: BTreeMap<u16, u32>,
    /// The compaction claim as read (0: none): its end (Unix ms) in the
    /// high bits, its writer's nonce in the low [`CLAIM_NONCE_BITS`].
    pub(super) claim: u64,
}

impl Split {
    pub fn new(
        hot: BTreeSet<u16>,
        versions: BTreeMap<u16, u32>,
        stored: BTreeMap<u16, u32>,
    ) -> Self {
        Split {
            hot,
            versions,
            stored,
            claim: 0,
        }
    }

    /// With the compaction claim `claim` as read (0: none).
    pub fn with_claim(mut self, claim: u64) -> Self {
        self.claim = claim;
        self
    }

    /// The compaction claim as read (0: none).
    pub fn claim(&self) -> u64 {
        self.claim
    }

    /// Whether a compaction claim is live at `now_ms`.
    fn claimed_at(&self, now_ms: u64) -> bool {
        self.claim != 0 && now_ms < self.claim >> CLAIM_NONCE_BITS
    }

    pub fn hot(&self) -> &BTreeSet<u16> {
        &self.hot
    }

    pub fn versions(&self) -> &BTreeMap<u16, u32> {
        &self.versions
    }

    /// The segment's version as the pool item records it.
    pub fn version(&self, segment: u16) -> u32 {
        self.versions.get(&segment).copied().unwrap_or(0)
    }

    /// Every segment item's own version as read.
    pub fn stored_versions(&self) -> &BTreeMap<u16, u32> {
        &self.stored
    }

    /// The segment item's own version as read.
    pub fn stored(&self, segment: u16) -> u32 {
        self.stored.get(&segment).copied().unwrap_or(0)
    }
}

/// The segment a position's cold slot lives in.
pub fn segment_of(position: u16) -> u16 {
    position / SEGMENT_SLOTS
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
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Records that segment `segment`'s item now has `version` (a store
    /// that keeps no segment items of its own, the in-memory one, so that
    /// its pools show a segment written ahead of the pool item as
    /// DynamoDB's do).
    pub fn segment_written(&mut self, segment: u16, version: u32) {
        if let Layout::Split(split) = &mut self.layout {
            split.stored.insert(segment, version);
        }
    }

    /// A new pool, split when its count is above `split_above`.
    pub fn split_above(self, split_above: u16) -> Self {
        let layout = if self.count > split_above {
            Layout::Split(Box::default())
        } else {
            Layout::Flat
        };
        self.with_layout(layout)
    }

    /// The write that splits a flat pool whose count is above
    /// `config.split_above`: one stored before the split layout, or raised
    /// past it by a resize. Its held slots become hot entries and leave the
    /// pool item with compaction. Conditioned on its
    /// slots as read: the same holders and no grant since (so the same
    /// stamps).
    pub fn plan_split(&self, config: Compaction) -> Option<Update> {
        if !matches!(self.layout, Layout::Flat) || self.count <= config.split_above {
            return None;
        }
        Some(Update {
            expect: vec![Expect::FlatAsRead {
                fence: self.next_fence,
                holders: self.holders_digest(),
            }],
            changes: vec![Change::Split],
        })
    }

    /// A digest of who holds each slot (free ones included, by position):
    /// with the fence counter, it tells a flat pool's slots as read.
    pub fn holders_digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        for slot in &self.slots {
            match slot {
                Slot::Free => None,
                Slot::Held { holder, .. } => Some(holder),
            }
            .hash(&mut hasher);
        }
        hasher.finish()
    }

    /// The pool as stored in `layout` (the pool's truth is unchanged).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self.settle_len();
        self
    }

    /// A split pool's slot list runs to `count`, or past it to its last
    /// held slot (as a split item is read: free slots are not stored).
    pub(super) fn settle_len(&mut self) {
        if matches!(self.layout, Layout::Flat) {
            return;
        }
        let keep = usize::from(self.count).max(
            self.slots
                .iter()
                .rposition(|s| *s != Slot::Free)
                .map_or(0, |p| p + 1),
        );
        self.slots.resize(keep, Slot::Free);
    }

    /// The write `update` (planned on this pool) as the pool item can
    /// check it, and the holder whose `NotHeld` it could not check (a
    /// split pool item's hot entries are a map, which no condition
    /// searches): the caller then looks for a duplicate in the item the
    /// write leaves ([`Pool::duplicate_of`]).
    pub fn lower(&self, update: &Update) -> (Update, Option<Holder>) {
        let Layout::Split(split) = &self.layout else {
            return (update.clone(), None);
        };
        let mut unchecked = None;
        let mut lowered = Update {
            expect: Vec::with_capacity(update.expect.len()),
            changes: update.changes.clone(),
        };
        for expect in &update.expect {
            match *expect {
                Expect::SlotFree(position) | Expect::SlotStamp { position, .. }
                    if !split.hot.contains(&position) && self.holds(expect) =>
                {
                    let segment = segment_of(position);
                    lowered.expect.push(Expect::Cold {
                        position,
                        version: split.version(segment),
                    });
                }
                Expect::NotHeld(holder) => unchecked = Some(holder),
                // Slots are not a list in a split item: none is missing.
                Expect::SlotsLen(_) => {}
                other => lowered.expect.push(other),
            }
        }
        lowered.expect.dedup();
        // Slots past the end are not removed from a split pool item: they
        // are freed there (a cold one would keep its segment's lease).
        let written: Vec<u16> = update
            .changes
            .iter()
            .filter_map(|c| match *c {
                Change::Take { position, .. }
                | Change::HandOff { position, .. }
                | Change::Free(position) => Some(position),
                _ => None,
            })
            .collect();
        for change in &update.changes {
            if let Change::Truncate { from, len } = *change {
                for position in from..len {
                    let position = position as u16;
                    let held = self
                        .slots
                        .get(usize::from(position))
                        .is_some_and(|s| *s != Slot::Free);
                    if held && !written.contains(&position) {
                        lowered.changes.insert(0, Change::Free(position));
                    }
                }
            }
        }
        (lowered, unchecked)
    }

    /// After a write whose `NotHeld(holder)` was not checked ([`Pool::lower`])
    /// landed and left this pool: the write that undoes it when `holder`
    /// now holds a slot twice, or holds one and waits too (another request
    /// of the same lease id was granted between this one's read and its
    /// write). `update` is the write that landed.
    pub fn duplicate_of(&self, holder: Holder, update: &Update, now_ms: u64) -> Option<Update> {
        let held: Vec<u16> = (0..self.slots.len() as u16)
            .filter(|&p| matches!(self.slots[usize::from(p)], Slot::Held { holder: h, .. } if h == holder))
            .collect();
        for change in &update.changes {
            match *change {
                Change::Take {
                    position,
                    holder: h,
                    ..
                } if h == holder && held.contains(&position) && held.len() > 1 => {
                    let lease = self.lease_at(usize::from(position))?;
                    return Some(self.give_back(&lease, now_ms));
                }
                Change::Append(ticket) if ticket.holder == holder && !held.is_empty() => {
                    let (index, _) = self.ticket_of(holder.digest)?;
                    return Some(self.remove_tickets(vec![index]));
                }
                _ => {}
            }
        }
        None
    }

    /// The write that repairs a lease id holding two live slots, or a live
    /// slot and a ticket: the younger slot given back, or the ticket taken
    /// out. A split pool item cannot refuse such a write (see
    /// [`Pool::lower`]); [`Pool::duplicate_of`] undoes it at once, and this
    /// repairs whatever that could not (an outcome unknown, an undo lost).
    pub fn plan_repair(&self, digest: LeaseDigest, now_ms: u64) -> Option<Update> {
        let mut live: Vec<Lease> = self
            .leases()
            .into_iter()
            .filter(|l| l.digest == digest && l.is_live(now_ms))
            .collect();
        live.sort_by_key(|l| l.fence);
        match (live.len(), self.ticket_of(digest)) {
            (0, _) | (1, None) => None,
            // The ticket first: a slot given back could go to it.
            (_, Some((index, _))) => Some(self.remove_tickets(vec![index])),
            (_, None) => live.last().map(|younger| self.give_back(younger, now_ms)),
        }
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

    /// Applies a layout change of `change` (made on `next`, the pool so far)
    /// to its bookkeeping: a slot written becomes hot, a cooled one cold.
    pub(super) fn apply_layout(next: &mut Pool, change: Change) {
        if change == Change::Split {
            if matches!(next.layout, Layout::Flat) {
                let hot = (0..next.slots.len() as u16)
                    .filter(|&p| next.slots[usize::from(p)] != Slot::Free)
                    .collect();
                next.layout = Layout::Split(Box::new(Split {
                    hot,
                    ..Split::default()
                }));
            }
            return;
        }
        let Layout::Split(split) = &mut next.layout else {
            return;
        };
        match change {
            Change::Take { position, .. }
            | Change::HandOff { position, .. }
            | Change::Free(position) => {
                split.hot.insert(position);
            }
            Change::Cool(position) => {
                split.hot.remove(&position);
            }
            Change::SetSegmentVersion { segment, version } => {
                split.versions.insert(segment, version);
                split.stored.insert(segment, version);
            }
            // As DynamoDB's `if_not_exists` when none was read (the first
            // claim to land stands), else over the lapsed claim read.
            Change::ClaimCompaction { token, over } if over != 0 || split.claim == 0 => {
                split.claim = token;
            }
            Change::EndCompactionClaim => split.claim = 0,
            // Truncated hot entries stay in the pool item (free): only
            // compaction, which writes their segment first, removes one.
            _ => {}
        }
    }

    /// Whether a layout expectation holds (`None`: not one).
    pub(super) fn holds_layout(&self, expect: &Expect) -> Option<bool> {
        let split = match &self.layout {
            Layout::Split(split) => Some(split),
            Layout::Flat => None,
        };
        Some(match *expect {
            Expect::Cold { position, version } => split.is_some_and(|s| {
                !s.hot.contains(&position) && s.version(segment_of(position)) == version
            }),
            Expect::SegmentVersion { segment, version } => {
                split.is_some_and(|s| s.version(segment) == version)
            }
            Expect::FlatAsRead { fence, holders } => {
                split.is_none() && self.next_fence == fence && self.holders_digest() == holders
            }
            // A split pool item shows a slot only while it is hot: a write
            // planned while it was, landing after compaction cooled it,
            // fails (and is planned again, on its segment's version).
            Expect::SlotFree(position) | Expect::SlotStamp { position, .. }
                if split.is_some_and(|s| !s.hot.contains(&position)) =>
            {
                false
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
