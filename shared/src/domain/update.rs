//! The update language (conditions, changes) and what an update means.

use super::{Ended, GivenUp, Holder, LeaseDigest, Pool, Sizing, Slot, Stamp, Ticket};

/// One thing an update depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `count` is this, set by this many resizes.
    Count(Sizing),
    /// The slot list is this long.
    SlotsLen(usize),
    /// This position is free.
    SlotFree(u16),
    /// This position is held by a lease (perhaps one past its expiry): no
    /// write freed it since it was read so. A grant expects it of each
    /// position below its own (see `lowest.rs`).
    SlotHeld(u16),
    /// A split pool's segment has had this many of its slots freed: no
    /// write freed one since it was read. A grant expects it of each
    /// segment below its own position where a slot is held (`lowest.rs`).
    FreedIn { segment: u16, frees: u32 },
    /// This position holds the grant with this stamp (stamps are unique per
    /// grant, so this names exactly one lease).
    SlotStamp { position: u16, stamp: Stamp },
    /// The queue is exactly this long.
    QueueLen(usize),
    /// The queue is shorter than this.
    QueueBelow(usize),
    /// This ticket is at this index of the queue.
    TicketAt { index: usize, holder: Holder },
    /// Whatever ticket is at this index of the queue (if any) is live at
    /// `now_ms`: a write that hands a slot to whoever is there when it
    /// lands never grants one to a ticket whose borrower has given up.
    TicketLiveAt { index: usize, now_ms: u64 },
    /// No ticket in the queue is exactly this.
    NotQueued(Holder),
    /// No slot holds exactly this.
    NotHeld(Holder),
    /// This lease id is not remembered as given up.
    NotGivenUp(LeaseDigest),
    /// This lease id is remembered exactly so.
    GivenUpIs(GivenUp),
    /// This ended grant is remembered exactly so (in its place).
    EndedIs(Ended),
    /// At most this many lease ids are remembered as given up.
    GivenUpAtMost(usize),
    /// No ticket waits in the backlog (or the item predates async mode).
    NoBacklog,
    /// The first number not yet admitted is this.
    Admitted(u64),
    /// This async ticket is listed with this number, or not at all (another
    /// unlisting of it landed first: removing it again changes nothing).
    ListedIsOrNot(LeaseDigest, u64),
    /// No backlog and no async ticket listed.
    Settled,
    /// A split pool's position has no hot entry, and its segment the version
    /// the pool item records as this: the cold slot is as read (see
    /// `layout.rs`). Only [`Pool::lower`] writes it.
    Cold { position: u16, version: u32 },
    /// The pool item records this version of the segment.
    SegmentVersion { segment: u16, version: u32 },
    /// A flat pool item whose slots are as read: no grant since (the fence
    /// counter is `fence`) and every slot held by whom it was (`holders`, a
    /// digest of them: [`Pool::holders_digest`]). Only [`Pool::plan_split`]
    /// writes it.
    FlatAsRead { fence: u64, holders: u64 },
}

/// One change an update makes. Indices and positions name the pool as the
/// write finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `holder` takes `position`, granted at `now_ms` with the next fence.
    Take {
        position: u16,
        holder: Holder,
        now_ms: u64,
    },
    /// `position` goes to the ticket at index `from` of the queue as the
    /// write finds it (stamped `now_ms` with the write's `nth` fence: the
    /// counter plus `nth`), or is left free when there is none; tickets
    /// `0 ..= from` leave the queue. `from` is the first live ticket as read,
    /// after dead ones the update expects (or, handing several slots at
    /// once, a later live one, every ticket before it expected as read).
    HandOff {
        position: u16,
        from: usize,
        nth: u16,
        now_ms: u64,
    },
    Free(u16),
    /// Adds a ticket at the end of the queue.
    Append(Ticket),
    RemoveTicket(usize),
    SetGivenUp(GivenUp),
    ForgetGivenUp(LeaseDigest),
    /// Remembers a reused short grant in its place (overwriting the place).
    SetEnded(Ended),
    /// Forgets the ended grant in this place.
    RemoveEnded(u8),
    /// Drops the unbounded map of ended grants an older version stored.
    DropLegacyEnded,
    /// Sets `count`, one resize more than as read.
    SetCount(Sizing),
    /// Appends this many free slots.
    Extend(usize),
    /// Removes the slots at positions `from .. len` (`len`: the list's
    /// length as read, which the update expects).
    Truncate {
        from: usize,
        len: usize,
    },
    /// Takes the next ticket number (the write's new record tells which).
    NumberTicket,
    /// Sets the first number not yet admitted.
    SetAdmitted(u64),
    /// Lists an async ticket with its number.
    SetListed(LeaseDigest, u64),
    RemoveListed(LeaseDigest),
    /// Clears the async-work flag.
    Settle,
    /// A split pool's hot entry at this position leaves the pool item (its
    /// segment holds it now).
    Cool(u16),
    /// Records the segment's version (a compaction wrote it).
    SetSegmentVersion {
        segment: u16,
        version: u32,
    },
    /// A flat pool item becomes split: each held slot a hot entry, every
    /// segment unwritten (free), for compaction to cool.
    Split,
    /// Claims a split pool's compaction for the writer of `token`
    /// ([`Pool::compaction_claim`]), carried by a write of its own: set
    /// unless a claim is there when `over` (the claim as read) is 0, else
    /// set over it (it had lapsed).
    ///
    /// [`Pool::compaction_claim`]: super::Pool::compaction_claim
    ClaimCompaction {
        token: u64,
        over: u64,
    },
    /// Ends the compaction claim (the compaction's own pool item write).
    EndCompactionClaim,
}

/// A conditional change: every expectation holds, or nothing changes. The
/// changes that take a fence (one `Take`, or `HandOff`s) take the next ones
/// in order (`nth` 0, 1, …); `Append`s (any number, in order) never with
/// another queue change, nor `Extend`/`Truncate` with another slot change
/// (DynamoDB cannot write a list and one of its elements in one update).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub expect: Vec<Expect>,
    pub changes: Vec<Change>,
}

impl Update {
    /// Of several changes to one place of the ring of ended grants, only
    /// the newest grant's memory stands (DynamoDB refuses an update that
    /// names one attribute twice): a removal of a place this update sets
    /// goes, with its condition, and so does an older memory set there.
    pub(super) fn settle_ended(&mut self) {
        let mut newest: Vec<Ended> = Vec::new();
        for change in &self.changes {
            if let Change::SetEnded(ended) = *change {
                match newest.iter_mut().find(|e| e.place() == ended.place()) {
                    Some(e) if e.stamp.fence < ended.stamp.fence => *e = ended,
                    Some(_) => {}
                    None => newest.push(ended),
                }
            }
        }
        let set = |place: u8| newest.iter().any(|e| e.place() == place);
        self.changes.retain(|c| match *c {
            Change::SetEnded(ended) => newest.contains(&ended),
            Change::RemoveEnded(place) => !set(place),
            _ => true,
        });
        self.expect
            .retain(|e| !matches!(*e, Expect::EndedIs(ended) if set(ended.place())));
    }

    /// How many fences this update takes: one per slot it grants (a
    /// `Take`, or a `HandOff`, even one that finds nobody in line).
    pub fn fences(&self) -> u64 {
        self.changes
            .iter()
            .filter(|c| matches!(c, Change::Take { .. } | Change::HandOff { .. }))
            .count() as u64
    }

    /// Whether this update removes the slot at `position`.
    pub(super) fn truncates(&self, position: u16) -> bool {
        self.changes
            .iter()
            .any(|c| matches!(*c, Change::Truncate { from, .. } if from <= usize::from(position)))
    }
}

/// An expectation of an update did not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionFailed(pub Expect);

impl Update {
    /// Whether it sets the count (a resize).
    pub fn sets_count(&self) -> bool {
        self.changes
            .iter()
            .any(|c| matches!(c, Change::SetCount(_)))
    }
}

impl Pool {
    /// What an update means: the pool after it, or the first expectation that
    /// does not hold.
    pub fn apply(&self, update: &Update) -> Result<Pool, ConditionFailed> {
        for expect in &update.expect {
            let holds = self
                .holds_layout(expect)
                .unwrap_or_else(|| self.holds(expect));
            if !holds {
                return Err(ConditionFailed(*expect));
            }
        }
        let mut next = self.clone();
        // Every right-hand side reads the pool as it was (as DynamoDB does).
        let fence = self.next_fence;
        let mut removed: Vec<usize> = Vec::new();
        for change in &update.changes {
            apply_change(&mut next, self, *change, fence, &mut removed);
            Pool::apply_layout(&mut next, *change);
        }
        // Indices name the queue as it was; removing one past its end is a
        // no-op, as in DynamoDB.
        removed.sort_unstable();
        removed.dedup();
        for index in removed.into_iter().rev() {
            if index < next.queue.len() {
                next.queue.remove(index);
            }
        }
        next.settle_len();
        Ok(next)
    }

    /// Sets a slot as DynamoDB sets a list element: one past the end of the
    /// list is appended. (Planners only name positions the list has; a store
    /// that skips conditions, in tests, must not make this panic.)
    fn set_slot(&mut self, position: u16, slot: Slot) {
        match self.slots.get_mut(usize::from(position)) {
            Some(existing) => *existing = slot,
            None => self.slots.push(slot),
        }
    }

    /// Whether `expect` holds of the pool's truth (wherever its slots are
    /// stored; see [`Pool::holds_layout`] for what a split item can show).
    pub(super) fn holds(&self, expect: &Expect) -> bool {
        match *expect {
            Expect::Count(sizing) => self.sizing() == sizing,
            Expect::SlotsLen(len) => self.slots.len() == len,
            Expect::SlotFree(position) => {
                self.slots.get(usize::from(position)) == Some(&Slot::Free)
            }
            Expect::SlotHeld(position) => matches!(
                self.slots.get(usize::from(position)),
                Some(Slot::Held { .. })
            ),
            Expect::SlotStamp { position, stamp } => matches!(
                self.slots.get(usize::from(position)),
                Some(Slot::Held { stamp: s, .. }) if *s == stamp
            ),
            Expect::QueueLen(len) => self.queue.len() == len,
            Expect::QueueBelow(len) => self.queue.len() < len,
            Expect::TicketAt { index, holder } => {
                self.queue.get(index).is_some_and(|t| t.holder == holder)
            }
            Expect::TicketLiveAt { index, now_ms } => {
                self.queue.get(index).is_none_or(|t| t.is_live(now_ms))
            }
            Expect::NotQueued(holder) => self.queue.iter().all(|t| t.holder != holder),
            Expect::NotHeld(holder) => self
                .slots
                .iter()
                .all(|s| !matches!(s, Slot::Held { holder: h, .. } if *h == holder)),
            Expect::NotGivenUp(digest) => self.given_up_of(digest).is_none(),
            Expect::GivenUpIs(given_up) => self.given_up_of(given_up.digest) == Some(given_up),
            Expect::EndedIs(ended) => self.ended_at(ended.place()) == Some(ended),
            Expect::GivenUpAtMost(n) => self.given_up.len() <= n,
            Expect::NoBacklog => !self.line.has_backlog(),
            Expect::Admitted(admitted) => self.line.admitted == admitted,
            Expect::ListedIsOrNot(digest, number) => self
                .listed_number(digest)
                .is_none_or(|listed| listed == number),
            Expect::Settled => self.line.is_settled(),
            Expect::Cold { .. }
            | Expect::SegmentVersion { .. }
            | Expect::FreedIn { .. }
            | Expect::FlatAsRead { .. } => self.holds_layout(expect).unwrap_or(false),
        }
    }
}

/// One change of an update, made on `next` (the pool so far); every
/// right-hand side reads `before` (the pool as it was, as DynamoDB does);
/// `fence` is the first one the update takes, and the queue indices it
/// takes out are added to `removed`.
fn apply_change(
    next: &mut Pool,
    before: &Pool,
    change: Change,
    fence: u64,
    removed: &mut Vec<usize>,
) {
    match change {
        Change::Take {
            position,
            holder,
            now_ms,
        } => {
            next.set_slot(
                position,
                Slot::Held {
                    holder,
                    stamp: grant(fence, now_ms, false),
                },
            );
            next.next_fence = fence + 1;
        }
        Change::HandOff {
            position,
            from,
            nth,
            now_ms,
        } => {
            let fence = fence + u64::from(nth);
            let slot = match before.queue.get(from) {
                Some(ticket) => Slot::Held {
                    holder: ticket.holder,
                    stamp: grant(fence, now_ms, true),
                },
                None => Slot::Free,
            };
            next.set_slot(position, slot);
            next.next_fence = next.next_fence.max(fence + 1);
            removed.extend(0..=from);
        }
        Change::Free(position) => next.set_slot(position, Slot::Free),
        Change::Append(ticket) => next.queue.push(ticket),
        Change::RemoveTicket(index) => removed.push(index),
        Change::SetGivenUp(given_up) => {
            next.given_up.retain(|t| t.digest != given_up.digest);
            next.given_up.push(given_up);
            next.given_up.sort_by_key(|t| t.digest);
        }
        Change::ForgetGivenUp(digest) => next.given_up.retain(|t| t.digest != digest),
        Change::SetEnded(ended) => {
            next.ended.retain(|e| e.place() != ended.place());
            next.ended.push(ended);
            next.ended.sort_by_key(|e| e.place());
        }
        Change::RemoveEnded(place) => next.ended.retain(|e| e.place() != place),
        Change::DropLegacyEnded => next.legacy_ended = false,
        Change::SetCount(sizing) => {
            next.count = sizing.count;
            next.resizes = sizing.resizes;
        }
        Change::Extend(n) => next.slots.extend(std::iter::repeat_n(Slot::Free, n)),
        Change::Truncate { from, .. } => next.slots.truncate(from),
        Change::NumberTicket => {
            next.line.next = before.line.next + 1;
            next.line.active = true;
        }
        Change::Settle => next.line.active = false,
        Change::SetAdmitted(admitted) => next.line.admitted = admitted,
        Change::SetListed(digest, number) => {
            next.line.listed.retain(|(d, _)| *d != digest);
            next.line.listed.push((digest, number));
            next.line.listed.sort_by_key(|(d, _)| *d);
        }
        Change::RemoveListed(digest) => next.line.listed.retain(|(d, _)| *d != digest),
        // Where slots are stored: see `Pool::apply_layout`.
        Change::Cool(_)
        | Change::SetSegmentVersion { .. }
        | Change::Split
        | Change::ClaimCompaction { .. }
        | Change::EndCompactionClaim => {}
    }
}

/// The stamp of a grant with this fence at `now_ms`, `handed` to a waiter or
/// taken by the borrower's own write.
fn grant(fence: u64, now_ms: u64, handed: bool) -> Stamp {
    Stamp {
        fence,
        granted_ms: now_ms,
        handed,
    }
}
