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

/// How many of the fullest segments elected compactions take turns at.
const COMPACTION_SPREAD: usize = 3;

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
    /// Which writes compact ([`Pool::compaction_turn`]): one in this many,
    /// so that writers landing together do not all plan the same
    /// compaction, of which only one can land (1: every write).
    pub every: u64,
}

impl Compaction {
    pub const DEFAULT: Compaction = Compaction {
        split_above: FLAT_MAX,
        hot_max: 32,
        cold_after_ms: 100,
        every: 2,
    };

    /// Past this many hot entries every write compacts, elected or not: an
    /// elected compaction that lost is not tried again until the next one.
    pub fn hot_limit(&self) -> usize {
        self.hot_max.saturating_mul(3)
    }
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
        }
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

/// A compaction step: write the segment, then the pool item. The segment's
/// write is conditioned on its version being the pool item's as read (no
/// other compaction of it under way), so that the pool item's write, when
/// it lands, cools its entries over this very segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionPlan {
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
    /// The pool item's write: the moved entries as read and the segment's
    /// version as read; it removes them and advances the version.
    pub update: Update,
}

impl Pool {
    pub fn layout(&self) -> &Layout {
        &self.layout
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
    /// pool item with compaction, a segment a write. Conditioned on its
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

    /// Whether the write that left this pool compacts it, having taken
    /// `fences` fences ([`Update::fences`]), and if so its turn (for
    /// [`Pool::plan_compaction`]). Compaction is due past `hot_max` hot
    /// entries, and every writer would see it due; one in `every` is
    /// elected without a word between them. Writes land one at a time, so
    /// the fences a write took are its own (the last `fences` below the
    /// counter it left): the writer that took a fence that is a multiple of
    /// `every` compacts. A write that granted nothing (a join, a free, a
    /// prune) has no fence of its own, and the hot entries it left would
    /// not tell a run of them apart (a free of a hot slot leaves their
    /// number as it was): it is elected by its writer's random `draw`, one
    /// in `every`. Past [`Compaction::hot_limit`] every writer compacts.
    ///
    /// [`Update::fences`]: super::Update::fences
    pub fn compaction_turn(&self, config: Compaction, fences: u64, draw: u64) -> Option<u64> {
        let Layout::Split(split) = &self.layout else {
            return None;
        };
        let hot = split.hot.len() as u64;
        let every = config.every.max(1);
        if hot <= config.hot_max as u64 {
            return None;
        }
        let elected = if fences == 0 {
            draw.is_multiple_of(every).then_some(draw / every)
        } else {
            (self.next_fence.saturating_sub(fences)..self.next_fence)
                .find(|f| f.is_multiple_of(every))
                .map(|f| f / every)
        };
        elected.or_else(|| {
            (hot > config.hot_limit() as u64).then_some(self.next_fence.wrapping_add(hot))
        })
    }

    /// The compaction due on this pool at `now_ms`, if any, for the writer
    /// of turn `turn` ([`Pool::compaction_turn`]): one segment's hot entries
    /// that may leave the pool item (free ones, expired ones, and live ones
    /// older than `cold_after_ms`), but not the free or expired ones written
    /// next (the lowest: one for each waiter, and one for each lease younger
    /// than `cold_after_ms` up to `hot_max`, for the takes of borrowers that
    /// cycle), which would be written again at once. The segment is the one with the most
    /// such entries, or by turns one of the next fullest (up to three, with
    /// at least half as many): writers elected one after another may
    /// compact at the same time, and two writing one segment cannot both
    /// land.
    pub fn plan_compaction(
        &self,
        config: Compaction,
        now_ms: u64,
        turn: u64,
    ) -> Option<CompactionPlan> {
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
        let fullest = ranked.first()?.1.len();
        let spread = ranked
            .iter()
            .take(COMPACTION_SPREAD)
            .filter(|(_, positions)| positions.len() * 2 >= fullest)
            .count();
        let (segment, moved) = ranked.swap_remove((turn % spread as u64) as usize);
        let from = usize::from(segment) * usize::from(SEGMENT_SLOTS);
        let slots: Vec<Slot> = (from..from + usize::from(SEGMENT_SLOTS))
            .map(|p| self.slots.get(p).copied().unwrap_or(Slot::Free))
            .collect();
        let recorded = split.version(segment);
        let stored = split.stored(segment);
        let mut update = Update::default();
        update.expect.push(Expect::SegmentVersion {
            segment,
            version: recorded,
        });
        if stored > recorded {
            // A compaction wrote the segment and not (yet) the pool item.
            // The segment holds the truth of every position that is cold,
            // as it did before (a position that turned hot since never
            // turned cold again without the pool item's version moving), so
            // the pool item catches up, cooling nothing; a compaction may
            // then write the segment again. Until then none may: a pool item
            // write landing after a second segment write would cool its
            // entries over a segment that is not its own.
            update.changes.push(Change::SetSegmentVersion {
                segment,
                version: stored,
            });
            return Some(CompactionPlan {
                segment,
                stored,
                version: stored,
                slots: Vec::new(),
                update,
            });
        }
        let version = recorded + 1;
        for &position in &moved {
            update.expect.push(self.slot_as_read(position));
            update.changes.push(Change::Cool(position));
        }
        update
            .changes
            .push(Change::SetSegmentVersion { segment, version });
        Some(CompactionPlan {
            segment,
            stored,
            version,
            slots,
            update,
        })
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
