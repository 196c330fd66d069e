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

use std::collections::{BTreeMap, BTreeSet};

use super::compaction::Compaction;
use super::{Change, Expect, Holder, Lease, LeaseDigest, Pool, Slot, Update};

/// Pools created with a count up to this keep every slot in the pool item:
/// fully held with a few waiters, that item stays within one write unit.
pub const FLAT_MAX: u16 = 48;

/// Slots per segment item: fully held, about 1.3 KB.
pub const SEGMENT_SLOTS: u16 = 64;

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
    /// high bits, its writer's nonce in the low bits (`compaction.rs`).
    pub(super) claim: u64,
    /// Per segment, how many writes freed one of its slots (absent: none),
    /// as read. Every write that frees a slot of a split pool counts it
    /// here, so that a grant can expect, in one condition a segment, that
    /// no slot below its own was freed since its read (`lowest.rs`): its
    /// cold slots are too many for a condition each.
    pub(super) freed: BTreeMap<u16, u32>,
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
            freed: BTreeMap::new(),
        }
    }

    /// With the segments' counts of freed slots `freed` as read.
    pub fn with_freed(mut self, freed: BTreeMap<u16, u32>) -> Self {
        self.freed = freed;
        self
    }

    /// Every segment's count of freed slots as read (absent: none).
    pub fn freed_counts(&self) -> &BTreeMap<u16, u32> {
        &self.freed
    }

    /// How many writes freed a slot of `segment`, as read.
    pub fn freed(&self, segment: u16) -> u32 {
        self.freed.get(&segment).copied().unwrap_or(0)
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
            let mut lowered = update.clone();
            lowered.expect.extend(self.lower_positions_held(update));
            return (lowered, None);
        };
        let below = self.lower_positions_held(update);
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
        lowered.expect.extend(below);
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
            Change::Take { position, .. } | Change::HandOff { position, .. } => {
                split.hot.insert(position);
            }
            Change::Free(position) => {
                split.hot.insert(position);
                *split.freed.entry(segment_of(position)).or_insert(0) += 1;
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
            Expect::FreedIn { segment, frees } => split.is_some_and(|s| s.freed(segment) == frees),
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
