//! The pool as a value: slots, the queue of waiting borrowers, expiry, hand-off
//! and resize. No I/O and no clock: every operation takes `now_ms` (Unix
//! milliseconds), so tests never sleep.
//!
//! Every change to a pool is an [`Update`]: the conditions it depends on and
//! the changes it makes. [`Pool::apply`] is what an update means; the
//! in-memory store is that function, and the DynamoDB store turns the same
//! update into one conditional `UpdateItem` (see `docs/DESIGN.md`).
//!
//! **Hand-off.** Borrowers that cannot have a slot at once join a queue. The
//! write that frees a slot gives it to the head of the queue *as the queue is
//! when the write lands* ([`Change::HandOff`]): it names no ticket, so two
//! returns landing together serve two different tickets and neither
//! conditions on the other's slot. A waiter learns of its grant by reading.
//! A slot freed without a write (an expiry, a raised `count`) is handed to
//! the head the same way by the head's waiter when it reads. Several slots
//! free at once go to as many tickets in one write, lowest position first,
//! written by whichever waiter owed one of them reads first (the others'
//! identical writes then fail their conditions and find their grants).
//!
//! **Fairness.** A newcomer takes a free slot only when more slots are free
//! than live tickets wait (they are owed that many); otherwise it joins the
//! queue behind them. Slots freed while tickets wait go to them in the order
//! they joined.

use std::cmp::Ordering;

/// Largest `count` a pool may have (API.md: `0 … 1000`).
pub use semaphore_wire::MAX_COUNT;

/// Most dead tickets, stale tombstones or trailing free slots one write
/// removes, so that every expression stays far below DynamoDB's 4 KB limit;
/// more take more writes.
pub const MAX_PRUNE: usize = 32;

/// Most slots one write hands to waiting tickets (when several free at
/// once), for the same limit; the next read hands the rest.
pub const MAX_HAND_OFFS: usize = 16;

/// A ticket is dead (its owner gone) this long after its give-up time.
/// Owners cancel their own ticket when they give up; the grace covers clock
/// skew between servers and a cancel still in flight.
pub const TICKET_GRACE_MS: u64 = 1000;

/// Most backlog tickets one admission appends (the expression limit again).
pub const MAX_ADMITS: usize = 16;

/// A ticket number with no ticket item is passed by admission once a ticket
/// numbered after it was written this long ago: longer than any request
/// lives behind API Gateway (30 s), so the missing write has landed or never
/// will.
pub const GAP_MS: u64 = 60_000;

/// How long the id of a lease given up before its borrow was seen is
/// remembered: a borrow with that id arriving later is refused, so a cancel
/// that overtakes its borrow still cancels it. Longer than any request lives
/// behind API Gateway (30 s).
pub const TOMB_MS: u64 = 30_000;

/// A slot handed to a waiter is answered by the waiter's next read. A
/// grant this short can expire before that read (and its slot be reused):
/// the write that reuses it remembers it (see [`ENDED_RING`]), so that its
/// waiter still answers it. Longer grants are read long before they end.
pub const SHORT_GRANT_MS: u64 = 5_000;

/// How long after its grant a reused short grant is worth remembering; an
/// older memory is taken out by the next return or resize.
pub const ENDED_KEEP_MS: u64 = 10_000;

/// How many reused short grants a pool remembers: a ring, each grant in
/// place `fence % ENDED_RING`. A reuse overwrites the place of a grant about
/// `ENDED_RING` grants older, so memories never collide as conditions and
/// never outnumber the ring, however fast short leases churn (a map by lease
/// id grew by every reuse: 370 bytes a second, until DynamoDB refused the
/// item). A waiter whose memory was overwritten before it read it answers
/// `409`, as if it had not been served: its grant had ended by then anyway.
pub const ENDED_RING: usize = 16;

/// Most lease ids a pool remembers as given up at once: a flood of returns
/// of unknown lease ids replaces the oldest, and never grows the item past
/// a few hundred bytes (each write that adds one is conditioned on the
/// number stored, so racing writes cannot overshoot).
pub const MAX_TOMBS: usize = 16;

/// Most async tickets a pool lists at once (in its queue, or granted and not
/// yet recorded by the dispatcher): admission waits while the list is full.
/// Only admission lists, one at a time (each is conditioned on the first
/// number not yet admitted, as read), so its read of the list is exact.
pub const MAX_LISTED: usize = 32;

/// The stored form of a lease UUID: the first 8 bytes of its SHA-256. The
/// pool UUID, not this, is the credential (nothing is read or written
/// without it); 64 bits keep two leases of one pool from ever sharing a
/// digest by chance (about 1 in 10¹⁶ per borrow at 1,000 leases).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseDigest(pub [u8; 8]);

/// A lease as a slot or a queued ticket stores it: whose, and for how long
/// after its grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub digest: LeaseDigest,
    /// The clamped ttl; the lease runs from its grant for this long.
    pub ttl_ms: u64,
}

/// When a slot was granted, and the grant's place in the pool's fence
/// sequence (relative to the pool's base; unique per grant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub fence: u64,
    pub granted_ms: u64,
    /// Handed to a waiter (which learns of it by reading), not taken by
    /// the borrower's own write.
    pub handed: bool,
}

/// One position of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Free,
    Held { holder: Holder, stamp: Stamp },
}

/// A waiting borrower's place in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub holder: Holder,
    /// When its owner stops waiting, in whole Unix seconds (rounded up).
    pub give_up_s: u64,
}

impl Ticket {
    /// Whether its owner may still be waiting; a dead ticket holds no place.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < (self.give_up_s * 1000).saturating_add(TICKET_GRACE_MS)
    }
}

/// A lease id given up while no lease or ticket of it was in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tomb {
    pub digest: LeaseDigest,
    /// Remembered until this Unix second.
    pub until_s: u64,
}

impl Tomb {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.until_s.saturating_mul(1000)
    }
}

/// A short grant handed to a waiter whose slot was reused after it expired
/// (see [`SHORT_GRANT_MS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub digest: LeaseDigest,
    pub position: u16,
    pub stamp: Stamp,
}

impl Ended {
    fn is_kept(&self, now_ms: u64) -> bool {
        now_ms < self.stamp.granted_ms.saturating_add(ENDED_KEEP_MS)
    }

    /// Its place in the ring of [`ENDED_RING`] memories.
    pub fn place(&self) -> u8 {
        (self.stamp.fence % ENDED_RING as u64) as u8
    }
}

/// A held slot, as the API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub digest: LeaseDigest,
    pub position: u16,
    pub ttl_ms: u64,
    pub granted_ms: u64,
    /// Live while `now_ms < expires_at_ms`.
    pub expires_at_ms: u64,
    /// The absolute fence (the pool's base plus the grant's place).
    pub fence: u64,
}

impl Lease {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// A pool's `count` and how many resizes set it: every count condition
/// names one resize, so a count set again to what it was (1 → 2 → 1) never
/// lets a write planned before those resizes land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sizing {
    pub count: u16,
    pub resizes: u64,
}

/// What `GET` shows: never lease UUIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub count: u16,
    pub in_use: u32,
    pub available: u32,
    /// Live tickets in the queue.
    pub waiting: u32,
}

/// Async mode's line numbers and the async tickets the pool item holds
/// (see `docs/DESIGN.md`). Every borrower that waits while a backlog exists,
/// and every async ticket, takes the next number; tickets numbered
/// `admitted` and above wait in the backlog (items of their own) until
/// admission appends them to the queue in number order. No backlog
/// (`admitted == next`): sync borrowers take and join as without async mode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Line {
    /// The next ticket number.
    pub next: u64,
    /// The first number not yet admitted.
    pub admitted: u64,
    /// Async tickets admitted to the queue, or handed a slot and not yet
    /// recorded as granted by the dispatcher: digest → ticket number.
    /// Sorted by digest.
    pub asyncs: Vec<(LeaseDigest, u64)>,
    /// The pool has async work (set with every ticket number, cleared by
    /// the dispatcher once no backlog and no async ticket is left): the
    /// table stream's filter invokes the dispatcher for these pools only.
    pub active: bool,
}

impl Line {
    pub fn has_backlog(&self) -> bool {
        self.admitted < self.next
    }

    /// No backlog and no async ticket: nothing for the dispatcher.
    pub fn is_settled(&self) -> bool {
        !self.has_backlog() && self.asyncs.is_empty()
    }
}

/// A pool: `count` numbered slots (the list may run past `count` while
/// leases from before a shrink live there), the queue of waiting borrowers
/// in arrival order, recently given-up lease ids, and the fence counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    count: u16,
    /// Resizes so far (see [`Sizing`]).
    resizes: u64,
    /// Creation time in µs: fences are `base_us + stamp.fence`, so they stay
    /// above those of any earlier pool of the same id.
    base_us: u64,
    /// The relative fence of the next grant.
    next_fence: u64,
    slots: Vec<Slot>,
    queue: Vec<Ticket>,
    /// Sorted by digest.
    tombs: Vec<Tomb>,
    /// Sorted by place, one per place.
    ended: Vec<Ended>,
    /// Stored by a version that kept ended grants in a map that grew without
    /// bound: the next write that reuses a slot, returns or resizes drops it.
    legacy_ended: bool,
    line: Line,
}

/// A pool's stored parts break an invariant: a bug or a corrupt item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistent(pub &'static str);

/// One thing an update depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `count` is this, set by this many resizes.
    Count(Sizing),
    /// The slot list is this long.
    SlotsLen(usize),
    /// This position is free.
    SlotFree(u16),
    /// This position holds the grant with this stamp (stamps are unique per
    /// grant, so this names exactly one lease).
    SlotStamp { position: u16, stamp: Stamp },
    /// The queue is exactly this long.
    QueueLen(usize),
    /// The queue is shorter than this.
    QueueBelow(usize),
    /// This ticket is at this index of the queue.
    TicketAt { index: usize, holder: Holder },
    /// No ticket in the queue is exactly this.
    NotQueued(Holder),
    /// No slot holds exactly this.
    NotHeld(Holder),
    /// This lease id is not remembered as given up.
    NoTomb(LeaseDigest),
    /// This lease id is remembered exactly so.
    TombIs(Tomb),
    /// This ended grant is remembered exactly so (in its place).
    EndedIs(Ended),
    /// At most this many lease ids are remembered as given up.
    TombsAtMost(usize),
    /// No ticket waits in the backlog (or the item predates async mode).
    NoBacklog,
    /// The first number not yet admitted is this.
    Admitted(u64),
    /// This async ticket is listed with this number.
    AsyncIs(LeaseDigest, u64),
    /// No backlog and no async ticket listed.
    Settled,
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
    SetTomb(Tomb),
    RemoveTomb(LeaseDigest),
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
    SetAsync(LeaseDigest, u64),
    RemoveAsync(LeaseDigest),
    /// Clears the async-work flag.
    Settle,
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
    fn settle_ended(&mut self) {
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

    /// Whether this update removes the slot at `position`.
    fn truncates(&self, position: u16) -> bool {
        self.changes
            .iter()
            .any(|c| matches!(*c, Change::Truncate { from, .. } if from <= usize::from(position)))
    }
}

/// An expectation of an update did not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionFailed(pub Expect);

/// What a borrower can do with the pool as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BorrowPlan {
    /// A live lease with the borrower's lease id is held (its own earlier
    /// request, or an idempotent repeat): that is the grant.
    Held(Lease),
    /// A ticket with the borrower's lease id waits already (a twin request):
    /// wait on that ticket.
    Queued(Holder),
    /// The lease id was given up before this request was seen: refuse it.
    Cancelled,
    /// Write this to take `position` at once.
    Take { update: Update, position: u16 },
    /// Write this to join the queue.
    Join(Update),
    /// Dead tickets or stale state first: write this, then plan again.
    Prune(Update),
    /// As many live tickets wait as a pool allows.
    Full,
    /// Tickets wait in the backlog: the borrower takes a number and waits
    /// there too, to be admitted in its turn.
    Backlog,
}

/// What a waiter learns from the pool as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitPlan {
    /// Its lease: a slot was handed to its ticket.
    Granted(Lease),
    /// Still in the queue: `ahead` live tickets before it, `free` slots free,
    /// and its turn comes once `needed` more slots free up (0: the free slots
    /// are handed on right now, by `duty`).
    Waiting {
        ahead: usize,
        free: u32,
        needed: usize,
        /// The free slots this reader hands on, being owed one of them: the
        /// lowest to the head of the queue (several in one write).
        duty: Option<Update>,
    },
    /// Its ticket left the queue without a grant: cancelled by a return of
    /// its lease id, or pruned as dead.
    Gone,
}

/// What a return of a lease id does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReturnPlan {
    /// A live lease: write this to free it (handing it, or a lower free
    /// slot, to the head of the queue).
    Return(Lease, Update),
    /// Its lease has expired: nothing to free.
    Expired(Lease),
    /// Its borrow still waits: write this to take its ticket out of the queue.
    Cancel(Update),
    /// Not in the pool: write this to remember the id as given up, in case
    /// its borrow has not arrived yet.
    Remember(Update),
    /// Remembered as given up already.
    Remembered,
}

impl Holder {
    /// The stored form of a live or queued lease: digest, then the ttl in as
    /// few big-endian bytes as it needs (at least one).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ttl = self.ttl_ms.max(1).to_be_bytes();
        let skip = ttl.iter().take_while(|b| **b == 0).count().min(7);
        let mut out = Vec::with_capacity(8 + 8 - skip);
        out.extend_from_slice(&self.digest.0);
        out.extend_from_slice(&ttl[skip..]);
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Holder> {
        if !(9..=16).contains(&bytes.len()) {
            return None;
        }
        let digest = LeaseDigest(bytes[..8].try_into().ok()?);
        let mut ttl = [0u8; 8];
        ttl[16 - bytes.len()..].copy_from_slice(&bytes[8..]);
        Some(Holder {
            digest,
            ttl_ms: u64::from_be_bytes(ttl),
        })
    }
}

impl Pool {
    /// A new, empty pool created at `created_us` (µs since the epoch), with
    /// `count` free slots. `count` must already be validated (≤ [`MAX_COUNT`]).
    /// Fences start above every fence a pool of the same id can have issued
    /// before: those started at an earlier creation time and grew by one per
    /// grant, and no pool grants once per µs (each grant is a conditional
    /// write to one item, which DynamoDB takes at most about once per ms).
    pub fn new(count: u16, created_us: u64) -> Self {
        Pool {
            count,
            resizes: 0,
            base_us: created_us,
            next_fence: 1,
            slots: vec![Slot::Free; usize::from(count)],
            queue: Vec::new(),
            tombs: Vec::new(),
            ended: Vec::new(),
            legacy_ended: false,
            line: Line::default(),
        }
    }

    /// Rebuilds a pool from stored parts, checking its invariants.
    pub fn from_parts(
        sizing: Sizing,
        base_us: u64,
        next_fence: u64,
        slots: Vec<Slot>,
        queue: Vec<Ticket>,
        mut tombs: Vec<Tomb>,
        mut ended: Vec<Ended>,
    ) -> Result<Self, Inconsistent> {
        let Sizing { count, resizes } = sizing;
        if count > MAX_COUNT {
            return Err(Inconsistent("count above the maximum"));
        }
        if slots.len() < usize::from(count) {
            return Err(Inconsistent("fewer slots than count"));
        }
        if slots.len() > usize::from(u16::MAX) {
            return Err(Inconsistent("too many slots"));
        }
        let fence_above = slots.iter().all(|s| match s {
            Slot::Held { stamp, .. } => stamp.fence < next_fence,
            Slot::Free => true,
        });
        if !fence_above {
            return Err(Inconsistent("a grant's fence at or above the counter"));
        }
        tombs.sort_by_key(|t| t.digest);
        if tombs.windows(2).any(|w| w[0].digest == w[1].digest) {
            return Err(Inconsistent("two tombstones of one lease id"));
        }
        ended.sort_by_key(|e| e.place());
        if ended.windows(2).any(|w| w[0].place() == w[1].place()) {
            return Err(Inconsistent("two ended grants in one place"));
        }
        Ok(Pool {
            count,
            resizes,
            base_us,
            next_fence,
            slots,
            queue,
            tombs,
            ended,
            legacy_ended: false,
            line: Line::default(),
        })
    }

    /// The pool as stored by a version whose map of ended grants had no
    /// bound (its entries are not read: each was worth keeping for seconds).
    pub fn with_legacy_ended(mut self, legacy: bool) -> Self {
        self.legacy_ended = legacy;
        self
    }

    pub fn has_legacy_ended(&self) -> bool {
        self.legacy_ended
    }

    /// The pool with its stored line, checked.
    pub fn with_line(mut self, mut line: Line) -> Result<Self, Inconsistent> {
        if line.admitted > line.next {
            return Err(Inconsistent("admitted past the next ticket number"));
        }
        line.asyncs.sort_by_key(|(digest, _)| *digest);
        if line.asyncs.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Inconsistent("two async tickets of one lease id"));
        }
        self.line = line;
        Ok(self)
    }

    pub fn line(&self) -> &Line {
        &self.line
    }

    /// The number of the async ticket with this digest, if it is listed.
    pub fn async_number(&self, digest: LeaseDigest) -> Option<u64> {
        self.line
            .asyncs
            .binary_search_by_key(&digest, |(d, _)| *d)
            .ok()
            .map(|i| self.line.asyncs[i].1)
    }

    pub fn count(&self) -> u16 {
        self.count
    }

    pub fn sizing(&self) -> Sizing {
        Sizing {
            count: self.count,
            resizes: self.resizes,
        }
    }

    pub fn base_us(&self) -> u64 {
        self.base_us
    }

    /// The relative fence the next grant gets.
    pub fn next_fence(&self) -> u64 {
        self.next_fence
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Waiting borrowers' tickets in arrival order, live or dead.
    pub fn queue(&self) -> &[Ticket] {
        &self.queue
    }

    pub fn tombs(&self) -> &[Tomb] {
        &self.tombs
    }

    pub fn ended(&self) -> &[Ended] {
        &self.ended
    }

    /// The lease a held slot stands for.
    fn lease_at(&self, position: usize) -> Option<Lease> {
        match self.slots.get(position)? {
            Slot::Free => None,
            Slot::Held { holder, stamp } => Some(Lease {
                digest: holder.digest,
                position: position as u16,
                ttl_ms: holder.ttl_ms,
                granted_ms: stamp.granted_ms,
                expires_at_ms: stamp.granted_ms.saturating_add(holder.ttl_ms),
                fence: self.base_us.saturating_add(stamp.fence),
            }),
        }
    }

    /// Every held slot's lease, live or expired, by position.
    pub fn leases(&self) -> Vec<Lease> {
        (0..self.slots.len())
            .filter_map(|p| self.lease_at(p))
            .collect()
    }

    fn live_at(&self, position: usize, now_ms: u64) -> bool {
        self.lease_at(position).is_some_and(|l| l.is_live(now_ms))
    }

    pub fn in_use(&self, now_ms: u64) -> u32 {
        (0..self.slots.len())
            .filter(|&p| self.live_at(p, now_ms))
            .count() as u32
    }

    /// Borrowers that may still be waiting.
    pub fn waiting(&self, now_ms: u64) -> usize {
        self.queue.iter().filter(|t| t.is_live(now_ms)).count()
    }

    pub fn state(&self, now_ms: u64) -> PoolState {
        let in_use = self.in_use(now_ms);
        PoolState {
            count: self.count,
            in_use,
            available: u32::from(self.count).saturating_sub(in_use),
            waiting: self.waiting(now_ms) as u32,
        }
    }

    /// The live lease with this digest.
    pub fn live_lease(&self, digest: LeaseDigest, now_ms: u64) -> Option<Lease> {
        self.leases()
            .into_iter()
            .find(|l| l.digest == digest && l.is_live(now_ms))
    }

    /// Any held slot's lease with this digest, live or not.
    pub fn lease_of(&self, digest: LeaseDigest) -> Option<Lease> {
        self.leases().into_iter().find(|l| l.digest == digest)
    }

    /// Whether the lease id with `digest` holds a live lease or waits.
    pub fn asks(&self, digest: LeaseDigest, now_ms: u64) -> bool {
        self.live_lease(digest, now_ms).is_some() || self.ticket_of(digest).is_some()
    }

    /// Where a ticket with this digest is in the queue.
    pub fn ticket_of(&self, digest: LeaseDigest) -> Option<(usize, Ticket)> {
        self.queue
            .iter()
            .enumerate()
            .find(|(_, t)| t.holder.digest == digest)
            .map(|(i, t)| (i, *t))
    }

    /// The latest remembered grant of this lease id.
    fn ended_of(&self, digest: LeaseDigest) -> Option<Ended> {
        self.ended
            .iter()
            .filter(|e| e.digest == digest)
            .max_by_key(|e| e.stamp.fence)
            .copied()
    }

    /// The ended grant remembered in `place`.
    fn ended_at(&self, place: u8) -> Option<Ended> {
        self.ended
            .binary_search_by_key(&place, |e| e.place())
            .ok()
            .map(|i| self.ended[i])
    }

    fn tomb_of(&self, digest: LeaseDigest) -> Option<Tomb> {
        self.tombs
            .binary_search_by_key(&digest, |t| t.digest)
            .ok()
            .map(|i| self.tombs[i])
    }

    /// Slots free for new grants: `count` less the live leases.
    fn free(&self, now_ms: u64) -> u32 {
        u32::from(self.count).saturating_sub(self.in_use(now_ms))
    }

    /// Positions below `count` that no live lease holds, lowest first, as
    /// many as are free for grants.
    fn free_positions(&self, now_ms: u64) -> Vec<u16> {
        let free = self.free(now_ms) as usize;
        (0..self.count)
            .filter(|&p| !self.live_at(usize::from(p), now_ms))
            .take(free)
            .collect()
    }

    /// The condition that `position` is as read: free, or held by the
    /// (expired) grant with its stamp.
    fn slot_as_read(&self, position: u16) -> Expect {
        match self.slots.get(usize::from(position)) {
            Some(Slot::Held { stamp, .. }) => Expect::SlotStamp {
                position,
                stamp: *stamp,
            },
            _ => Expect::SlotFree(position),
        }
    }

    /// The conditions and changes of a write that gives `position` (free or
    /// expired as read) a new lease: the slot as read, and a short grant
    /// handed to a waiter that may not have read it yet is remembered.
    fn reuse(&self, position: u16, now_ms: u64, update: &mut Update) {
        update.expect.push(self.slot_as_read(position));
        self.drop_legacy(update);
        if let Some(Slot::Held { holder, stamp }) = self.slots.get(usize::from(position)) {
            let ended = Ended {
                digest: holder.digest,
                position,
                stamp: *stamp,
            };
            if stamp.handed && holder.ttl_ms <= SHORT_GRANT_MS && ended.is_kept(now_ms) {
                update.changes.push(Change::SetEnded(ended));
                update.settle_ended();
            }
        }
    }

    /// When the `n`-th (1-based) of the live leases to expire does: a waiter
    /// whose turn needs `n` leases to end sleeps no longer than this.
    pub fn nth_expiry(&self, n: usize, now_ms: u64) -> Option<u64> {
        let mut expiries: Vec<u64> = self
            .leases()
            .iter()
            .filter(|l| l.is_live(now_ms))
            .map(|l| l.expires_at_ms)
            .collect();
        expiries.sort_unstable();
        n.checked_sub(1).and_then(|i| expiries.get(i).copied())
    }

    /// Index of the first live ticket, and the dead ones before it (at most
    /// [`MAX_PRUNE`]; `None` when more dead ones come first).
    fn head(&self, now_ms: u64) -> Option<(Option<usize>, usize)> {
        let first_live = self.queue.iter().position(|t| t.is_live(now_ms));
        let dead_before = first_live.unwrap_or(self.queue.len());
        (dead_before <= MAX_PRUNE).then_some((first_live, dead_before))
    }

    /// Conditions that the first `n` tickets are as read (dead ones about
    /// to leave the queue).
    fn tickets_as_read(&self, n: usize) -> impl Iterator<Item = Expect> + '_ {
        self.queue[..n]
            .iter()
            .enumerate()
            .map(|(index, t)| Expect::TicketAt {
                index,
                holder: t.holder,
            })
    }

    /// Takes out up to [`MAX_PRUNE`] dead tickets from the front.
    fn prune_front(&self, now_ms: u64) -> Update {
        let dead = self
            .queue
            .iter()
            .take_while(|t| !t.is_live(now_ms))
            .count()
            .min(MAX_PRUNE);
        self.remove_tickets((0..dead).collect())
    }

    /// Removes the tickets at `indices`, each conditioned on being there.
    fn remove_tickets(&self, indices: Vec<usize>) -> Update {
        let mut update = Update::default();
        for index in indices {
            update.expect.push(Expect::TicketAt {
                index,
                holder: self.queue[index].holder,
            });
            update.changes.push(Change::RemoveTicket(index));
        }
        update
    }

    /// What a borrower of `holder` that may wait until `give_up_ms` can do
    /// now: its own live lease, a write that takes the lowest free slot, or
    /// one that joins the queue (at most `max_waiters` live tickets wait).
    pub fn plan_borrow(
        &self,
        holder: Holder,
        give_up_ms: u64,
        now_ms: u64,
        max_waiters: usize,
    ) -> BorrowPlan {
        self.plan_borrow_or_join(holder, give_up_ms, now_ms, max_waiters, true)
    }

    /// [`Pool::plan_borrow`], but with `take: false` a free slot is not taken
    /// directly: the borrower joins the queue, and a free slot is then handed
    /// to the head. A newcomer that lost a take races no more: joins never
    /// collide, and the free slots go to the queue in order.
    pub fn plan_borrow_or_join(
        &self,
        holder: Holder,
        give_up_ms: u64,
        now_ms: u64,
        max_waiters: usize,
        take: bool,
    ) -> BorrowPlan {
        let digest = holder.digest;
        if let Some(lease) = self.live_lease(digest, now_ms) {
            return BorrowPlan::Held(lease);
        }
        if let Some((_, ticket)) = self.ticket_of(digest) {
            return BorrowPlan::Queued(ticket.holder);
        }
        let mut update = Update::default();
        match self.tomb_of(digest) {
            Some(tomb) if tomb.is_live(now_ms) => return BorrowPlan::Cancelled,
            Some(tomb) => {
                update.expect.push(Expect::TombIs(tomb));
                update.changes.push(Change::RemoveTomb(digest));
            }
            None => update.expect.push(Expect::NoTomb(digest)),
        }
        if self.line.has_backlog() {
            return BorrowPlan::Backlog;
        }
        // Nobody may take or join ahead of tickets in the backlog.
        update.expect.push(Expect::NoBacklog);
        // An expired lease of this very holder would fail `NotHeld`: free it.
        let stale = self
            .leases()
            .into_iter()
            .find(|l| l.digest == digest && l.ttl_ms == holder.ttl_ms);

        let live_waiters = self.waiting(now_ms);
        let free = self.free_positions(now_ms);
        // Work-conserving fairness: the live tickets are owed as many free
        // slots; a newcomer takes one only beyond those (the lowest: the
        // waiters are handed the next ones).
        if take && free.len() > live_waiters {
            if live_waiters == 0 {
                if self.queue.len() > MAX_PRUNE {
                    return BorrowPlan::Prune(self.prune_front(now_ms));
                }
                // Every ticket is dead: they leave with this take.
                let dead = self.remove_tickets((0..self.queue.len()).collect());
                update.expect.extend(dead.expect);
                update.changes.extend(dead.changes);
            }
            let position = free[0];
            // The queue is pinned, so that no ticket joins ahead of this
            // take unseen (nor a twin request's ticket for this holder).
            update.expect.push(Expect::QueueLen(self.queue.len()));
            if live_waiters > 0 {
                // A hand-off and a join since the read would leave the length
                // as read: the last ticket changes with any join.
                let last = self.queue.len() - 1;
                update.expect.push(Expect::TicketAt {
                    index: last,
                    holder: self.queue[last].holder,
                });
                update.expect.push(Expect::NotQueued(holder));
            }
            update.expect.push(Expect::Count(self.sizing()));
            self.reuse(position, now_ms, &mut update);
            match stale {
                Some(old) if old.position == position => {}
                Some(old) => {
                    update.expect.push(self.slot_as_read(old.position));
                    update.changes.push(Change::Free(old.position));
                }
                None => update.expect.push(Expect::NotHeld(holder)),
            }
            update.changes.push(Change::Take {
                position,
                holder,
                now_ms,
            });
            return BorrowPlan::Take { update, position };
        }

        if live_waiters >= max_waiters {
            return BorrowPlan::Full;
        }
        if self.queue.len() >= max_waiters {
            // Dead tickets fill the rest: take out those at the front, or
            // (rarely, dead ones behind live ones) any.
            let dead: Vec<usize> = (0..self.queue.len())
                .filter(|&i| !self.queue[i].is_live(now_ms))
                .take(MAX_PRUNE)
                .collect();
            return BorrowPlan::Prune(self.remove_tickets(dead));
        }
        update.expect.push(Expect::QueueBelow(max_waiters));
        update.expect.push(Expect::NotQueued(holder));
        match stale {
            Some(old) => {
                update.expect.push(self.slot_as_read(old.position));
                update.changes.push(Change::Free(old.position));
            }
            None => update.expect.push(Expect::NotHeld(holder)),
        }
        update.changes.push(Change::Append(Ticket {
            holder,
            give_up_s: give_up_ms.div_ceil(1000),
        }));
        BorrowPlan::Join(update)
    }

    /// What the waiter of ticket `mine`, which joined at `joined_ms`, learns
    /// from the pool as read: its grant, its place (and any free slot it
    /// should hand to the head), or that its ticket is gone.
    pub fn plan_wait(&self, mine: &Holder, joined_ms: u64, now_ms: u64) -> WaitPlan {
        // A slot with its lease id granted since it joined is its grant, even
        // if it has expired since (a grant is never left unanswered).
        let granted = self.leases().into_iter().find(|l| {
            l.digest == mine.digest
                && (l.is_live(now_ms) || l.granted_ms.saturating_add(TICKET_GRACE_MS) >= joined_ms)
        });
        if let Some(lease) = granted {
            return WaitPlan::Granted(lease);
        }
        let Some(index) = self.queue.iter().position(|t| t.holder == *mine) else {
            // Handed to it, expired and reused before it read it: its
            // grant all the same.
            return match self.ended_of(mine.digest) {
                Some(e) if e.stamp.granted_ms.saturating_add(TICKET_GRACE_MS) >= joined_ms => {
                    WaitPlan::Granted(Lease {
                        digest: mine.digest,
                        position: e.position,
                        ttl_ms: mine.ttl_ms,
                        granted_ms: e.stamp.granted_ms,
                        expires_at_ms: e.stamp.granted_ms.saturating_add(mine.ttl_ms),
                        fence: self.base_us.saturating_add(e.stamp.fence),
                    })
                }
                _ => WaitPlan::Gone,
            };
        };
        let ahead = self.queue[..index]
            .iter()
            .filter(|t| t.is_live(now_ms))
            .count();
        let free = self.free_positions(now_ms);
        if ahead >= free.len() {
            return WaitPlan::Waiting {
                ahead,
                free: free.len() as u32,
                needed: ahead + 1 - free.len(),
                duty: None,
            };
        }
        // This reader is owed one of the free slots: they go to the tickets
        // they are owed to, now.
        let duty = self.hand_off_owed(&free, now_ms);
        WaitPlan::Waiting {
            ahead,
            free: free.len() as u32,
            needed: 0,
            duty,
        }
    }

    /// An update that hands the free (or expired) `position` to the first
    /// live ticket, taking out the dead ones before it; `None` when no live
    /// ticket waits or too many dead ones come first (prune those first).
    fn hand_off(&self, position: u16, now_ms: u64) -> Option<Update> {
        let (Some(from), dead) = self.head(now_ms)? else {
            return None;
        };
        let mut update = Update::default();
        update.expect.extend(self.tickets_as_read(dead));
        update.expect.push(Expect::Count(self.sizing()));
        self.reuse(position, now_ms, &mut update);
        update.changes.push(Change::HandOff {
            position,
            from,
            nth: 0,
            now_ms,
        });
        Some(update)
    }

    /// An update that hands the `free` slots (lowest first) to as many live
    /// tickets (in queue order), at most [`MAX_HAND_OFFS`] at once. One slot
    /// goes to the head as the write finds it ([`Pool::hand_off`]); several
    /// go in one write that expects every ticket up to the last one served
    /// as read, so that each lands where it was meant to (a write handing
    /// them one by one would grant a higher position while a lower one is
    /// still free).
    fn hand_off_owed(&self, free: &[u16], now_ms: u64) -> Option<Update> {
        let (Some(first), dead) = self.head(now_ms)? else {
            return None;
        };
        let served: Vec<usize> = (first..self.queue.len())
            .filter(|&i| self.queue[i].is_live(now_ms))
            .take(free.len().min(MAX_HAND_OFFS))
            .take_while(|&i| i < dead + MAX_PRUNE)
            .collect();
        if served.len() <= 1 {
            return self.hand_off(*free.first()?, now_ms);
        }
        let last = served[served.len() - 1];
        let mut update = Update::default();
        update.expect.extend(self.tickets_as_read(last + 1));
        update.expect.push(Expect::Count(self.sizing()));
        for (nth, (&position, &from)) in free.iter().zip(&served).enumerate() {
            self.reuse(position, now_ms, &mut update);
            update.changes.push(Change::HandOff {
                position,
                from,
                nth: nth as u16,
                now_ms,
            });
        }
        Some(update)
    }

    /// Takes the next ticket number: an async ticket's, or a borrower's that
    /// waits in the backlog. No condition: numbers never collide.
    pub fn plan_number() -> Update {
        Update {
            expect: Vec::new(),
            changes: vec![Change::NumberTicket],
        }
    }

    /// How many backlog tickets an admission may append now: none without a
    /// backlog, none while more than half of `window` async tickets wait in
    /// the queue (so that admissions come in batches: one backlog read and
    /// one write per half window, not per ticket), else the room left in the
    /// queue (at most [`MAX_ADMITS`]).
    pub fn admission_room(&self, max_waiters: usize, window: usize) -> usize {
        if !self.line.has_backlog() {
            return 0;
        }
        let asyncs = self
            .queue
            .iter()
            .filter(|t| self.async_number(t.holder.digest).is_some())
            .count();
        if asyncs > window / 2 {
            return 0;
        }
        max_waiters.saturating_sub(self.queue.len()).min(MAX_ADMITS)
    }

    /// Admission: appends the backlog's next waiting tickets to the queue in
    /// number order and moves `admitted` past them (and past tickets that
    /// ended, and numbers no ticket will come for), in one write conditioned
    /// on `admitted` as read. `backlog`: the ticket items numbered from
    /// `admitted` as read, in order (of this pool's incarnation). At most
    /// `window` async tickets wait in the queue, and at most `max_waiters`
    /// tickets in all. `None` when nothing is to be admitted.
    pub fn plan_admit(
        &self,
        backlog: &[TicketItem],
        now_ms: u64,
        max_waiters: usize,
        window: usize,
    ) -> Option<Update> {
        let mut number = self.line.admitted;
        let mut admitted: Vec<&TicketItem> = Vec::new();
        let mut asyncs = self
            .queue
            .iter()
            .filter(|t| self.async_number(t.holder.digest).is_some())
            .count();
        let room = max_waiters.saturating_sub(self.queue.len()).min(MAX_ADMITS);
        // Async tickets this admission lists.
        let mut listing = 0;
        let from = self.line.admitted;
        let mut items = backlog.iter().filter(move |t| t.number >= from).peekable();
        while number < self.line.next {
            match items.peek() {
                Some(item) if item.number == number => {
                    if item.is_waiting(now_ms) && !self.asks(item.digest(), now_ms) {
                        let is_async = item.callback.is_some();
                        let listed = self.line.asyncs.len() + listing;
                        if admitted.len() >= room
                            || (is_async && (asyncs >= window || listed >= MAX_LISTED))
                        {
                            break;
                        }
                        asyncs += usize::from(is_async);
                        listing += usize::from(is_async);
                        admitted.push(item);
                    }
                    items.next();
                    number += 1;
                }
                // A number taken, its ticket not (yet) written: passed only
                // once a ticket numbered after it was written more than
                // GAP_MS ago (so this number's write has landed or never
                // will: no request lives that long).
                next => {
                    if next.is_some_and(|later| later.joined_ms.saturating_add(GAP_MS) <= now_ms) {
                        number += 1;
                    } else {
                        break;
                    }
                }
            }
        }
        if number == self.line.admitted {
            return None;
        }
        let mut update = Update::default();
        update.expect.push(Expect::Admitted(self.line.admitted));
        if !admitted.is_empty() {
            update
                .expect
                .push(Expect::QueueBelow(max_waiters + 1 - admitted.len()));
        }
        for item in admitted {
            update.expect.push(Expect::NotQueued(item.holder));
            update.changes.push(Change::Append(Ticket {
                holder: item.holder,
                give_up_s: item.wait_until_ms.div_ceil(1000),
            }));
            if item.callback.is_some() {
                update
                    .changes
                    .push(Change::SetAsync(item.digest(), item.number));
            }
        }
        update.changes.push(Change::SetAdmitted(number));
        Some(update)
    }

    /// The grant handed to `holder` (an async ticket's): its slot, held
    /// or (a short grant, expired and its slot reused) remembered.
    pub fn grant_of(&self, holder: &Holder) -> Option<Lease> {
        if let Some(lease) = self.lease_of(holder.digest) {
            return Some(lease);
        }
        self.ended_of(holder.digest).map(|e| Lease {
            digest: holder.digest,
            position: e.position,
            ttl_ms: holder.ttl_ms,
            granted_ms: e.stamp.granted_ms,
            expires_at_ms: e.stamp.granted_ms.saturating_add(holder.ttl_ms),
            fence: self.base_us.saturating_add(e.stamp.fence),
        })
    }

    /// Unlists an async ticket (its grant recorded, or it left the queue),
    /// conditioned on its listing.
    pub fn plan_unlist(&self, digest: LeaseDigest) -> Option<Update> {
        let number = self.async_number(digest)?;
        Some(Update {
            expect: vec![Expect::AsyncIs(digest, number)],
            changes: vec![Change::RemoveAsync(digest)],
        })
    }

    /// Clears the async-work flag of a pool left with no backlog and no async
    /// ticket (conditioned on that), so its writes stop invoking the
    /// dispatcher; `None` when there is nothing to clear.
    pub fn plan_settle(&self) -> Option<Update> {
        (self.line.active && self.line.is_settled()).then(|| Update {
            expect: vec![Expect::Settled],
            changes: vec![Change::Settle],
        })
    }

    /// Hands free slots owed to the queue's first live tickets (as a sync
    /// waiter owed one does on reading): the dispatcher's duty when async
    /// tickets, which read nothing, head the queue.
    pub fn plan_serve(&self, now_ms: u64) -> Option<Update> {
        let free = self.free_positions(now_ms);
        if free.is_empty() {
            return None;
        }
        self.hand_off_owed(&free, now_ms)
            .or_else(|| self.plan_prune(now_ms))
    }

    /// An update that takes out dead tickets at the front of the queue, when
    /// more of them come before the first live one than one hand-off removes.
    pub fn plan_prune(&self, now_ms: u64) -> Option<Update> {
        match self.head(now_ms) {
            None => Some(self.prune_front(now_ms)),
            Some(_) => None,
        }
    }

    /// Takes the ticket `mine` out of the queue; `None` when it is not there.
    pub fn plan_cancel(&self, mine: &Holder) -> Option<Update> {
        let index = self.queue.iter().position(|t| t.holder == *mine)?;
        Some(self.remove_tickets(vec![index]))
    }

    /// What a return of the lease id with `digest` does at `now_ms`.
    pub fn plan_return(&self, digest: LeaseDigest, now_ms: u64) -> ReturnPlan {
        if let Some(lease) = self.live_lease(digest, now_ms) {
            let update = self.give_back(&lease, now_ms);
            return ReturnPlan::Return(lease, update);
        }
        if let Some(lease) = self.lease_of(digest) {
            return ReturnPlan::Expired(lease);
        }
        if let Some((index, _)) = self.ticket_of(digest) {
            return ReturnPlan::Cancel(self.remove_tickets(vec![index]));
        }
        match self.tomb_of(digest) {
            Some(tomb) if tomb.is_live(now_ms) => ReturnPlan::Remembered,
            stale => ReturnPlan::Remember(self.remember(digest, stale, now_ms)),
        }
    }

    /// Remembers `digest` as given up (overwriting its `stale` tombstone):
    /// stale tombstones go, and the oldest live ones while more than
    /// [`MAX_TOMBS`] would be left, so the write is conditioned on how many
    /// are stored (racing writes cannot overshoot the bound).
    fn remember(&self, digest: LeaseDigest, stale: Option<Tomb>, now_ms: u64) -> Update {
        let mut update = self.prune_tombs(now_ms, Some(digest));
        let mut removed = update
            .changes
            .iter()
            .filter(|c| matches!(c, Change::RemoveTomb(_)))
            .count();
        let added = usize::from(stale.is_none());
        let mut live: Vec<&Tomb> = self
            .tombs
            .iter()
            .filter(|t| t.is_live(now_ms) && t.digest != digest)
            .collect();
        live.sort_by_key(|t| t.until_s);
        let left = self.tombs.len() - removed + added;
        for oldest in live.iter().take(left.saturating_sub(MAX_TOMBS)) {
            update.expect.push(Expect::TombIs(**oldest));
            update.changes.push(Change::RemoveTomb(oldest.digest));
            removed += 1;
        }
        update.expect.push(match stale {
            Some(tomb) => Expect::TombIs(tomb),
            None => Expect::NoTomb(digest),
        });
        // As read, this leaves `tombs - removed + added` (at most the bound,
        // or what an item stored by an older version held, never more).
        let bound = MAX_TOMBS.max(self.tombs.len() - removed + added);
        update
            .expect
            .push(Expect::TombsAtMost(bound + removed - added));
        update.changes.push(Change::SetTomb(Tomb {
            digest,
            until_s: (now_ms + TOMB_MS).div_ceil(1000),
        }));
        update
    }

    /// Drops the unbounded map of ended grants an older version stored.
    fn drop_legacy(&self, update: &mut Update) {
        if self.legacy_ended && !update.changes.contains(&Change::DropLegacyEnded) {
            update.changes.push(Change::DropLegacyEnded);
        }
    }

    /// Takes out up to [`MAX_PRUNE`] stale tombstones (but `keep`'s, which
    /// the caller overwrites) and ended grants no waiter can need any more,
    /// each conditioned on being as read.
    fn prune_tombs(&self, now_ms: u64, keep: Option<LeaseDigest>) -> Update {
        let mut update = Update::default();
        self.drop_legacy(&mut update);
        for tomb in self
            .tombs
            .iter()
            .filter(|t| !t.is_live(now_ms) && Some(t.digest) != keep)
            .take(MAX_PRUNE)
        {
            update.expect.push(Expect::TombIs(*tomb));
            update.changes.push(Change::RemoveTomb(tomb.digest));
        }
        for ended in self
            .ended
            .iter()
            .filter(|e| !e.is_kept(now_ms))
            .take(MAX_PRUNE)
        {
            update.expect.push(Expect::EndedIs(*ended));
            update.changes.push(Change::RemoveEnded(ended.place()));
        }
        update
    }

    /// Frees the live `lease`, conditioned only on that lease: with live
    /// tickets waiting and a slot to spare, the lowest free position (its own
    /// or one below it) goes to the head of the queue in the same write.
    fn give_back(&self, lease: &Lease, now_ms: u64) -> Update {
        let position = lease.position;
        let mut after = self.clone();
        after.slots[usize::from(position)] = Slot::Free;
        let mut update = self.prune_tombs(now_ms, None);
        update.expect.push(self.slot_as_read(position));
        let target = after.free_positions(now_ms).first().copied();
        let handed = match target {
            Some(target) => after.hand_off(target, now_ms),
            None => None,
        };
        match (handed, target) {
            (Some(handed), Some(target)) => {
                if target != position {
                    update.changes.push(Change::Free(position));
                }
                update.expect.extend(
                    handed
                        .expect
                        .into_iter()
                        // Its own slot is conditioned as held, above.
                        .filter(|e| *e != Expect::SlotFree(position)),
                );
                update.changes.extend(handed.changes);
            }
            _ => match after.trim(after.count) {
                // Its own slot is the last past `count`: it goes with the
                // free ones after it (conditioned as held, above).
                Some(trim) if trim.truncates(position) => {
                    update.expect.extend(
                        trim.expect
                            .into_iter()
                            .filter(|e| *e != Expect::SlotFree(position)),
                    );
                    update.changes.extend(trim.changes);
                }
                trim => {
                    update.changes.push(Change::Free(position));
                    if let Some(trim) = trim {
                        update.expect.extend(trim.expect);
                        update.changes.extend(trim.changes);
                    }
                }
            },
        }
        update.settle_ended();
        update
    }

    /// Removes free slots from the end of the list past `count` (up to
    /// [`MAX_PRUNE`]), each conditioned on being free, and the count as read.
    fn trim(&self, count: u16) -> Option<Update> {
        let len = self.slots.len();
        let keep = usize::from(count).max(
            self.slots
                .iter()
                .rposition(|s| *s != Slot::Free)
                .map_or(0, |p| p + 1),
        );
        if keep >= len {
            return None;
        }
        let from = keep.max(len.saturating_sub(MAX_PRUNE));
        let mut update = Update::default();
        // A resize landing first may need these slots.
        update.expect.push(Expect::Count(self.sizing()));
        update.expect.push(Expect::SlotsLen(len));
        for p in from..len {
            update.expect.push(Expect::SlotFree(p as u16));
        }
        update.changes.push(Change::Truncate { from, len });
        Some(update)
    }

    /// Sets `count`, keeping every lease (a shrink only withholds new
    /// borrows), growing the slot list to it or trimming free slots past it.
    /// Waiters see a raise on their next read and hand its slots to the head.
    /// `None` when nothing needs writing.
    pub fn plan_resize(&self, count: u16, now_ms: u64) -> Option<Update> {
        let len = self.slots.len();
        let mut update = self.prune_tombs(now_ms, None);
        if self.count != count {
            // Conditioned on the count as read: resizes go one at a time.
            update.expect.push(Expect::Count(self.sizing()));
            update.changes.push(Change::SetCount(Sizing {
                count,
                resizes: self.resizes + 1,
            }));
        }
        if usize::from(count) > len {
            update.expect.push(Expect::SlotsLen(len));
            update
                .changes
                .push(Change::Extend(usize::from(count) - len));
        } else if count > self.count {
            // A raise into slots kept past the old count (held after a
            // shrink) needs them still there: a return may trim them first.
            update.expect.push(Expect::SlotsLen(len));
        } else {
            if let Some(trim) = self.trim(count) {
                update.expect.extend(trim.expect);
                update.changes.extend(trim.changes);
            }
        }
        (!update.changes.is_empty()).then_some(update)
    }

    /// What an update means: the pool after it, or the first expectation that
    /// does not hold.
    pub fn apply(&self, update: &Update) -> Result<Pool, ConditionFailed> {
        for expect in &update.expect {
            if !self.holds(expect) {
                return Err(ConditionFailed(*expect));
            }
        }
        let mut next = self.clone();
        // Every right-hand side reads the pool as it was (as DynamoDB does).
        let fence = self.next_fence;
        let mut removed: Vec<usize> = Vec::new();
        for change in &update.changes {
            match *change {
                Change::Take {
                    position,
                    holder,
                    now_ms,
                } => {
                    next.set_slot(
                        position,
                        Slot::Held {
                            holder,
                            stamp: Stamp {
                                fence,
                                granted_ms: now_ms,
                                handed: false,
                            },
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
                    let slot = match self.queue.get(from) {
                        Some(ticket) => Slot::Held {
                            holder: ticket.holder,
                            stamp: Stamp {
                                fence,
                                granted_ms: now_ms,
                                handed: true,
                            },
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
                Change::SetTomb(tomb) => {
                    next.tombs.retain(|t| t.digest != tomb.digest);
                    next.tombs.push(tomb);
                    next.tombs.sort_by_key(|t| t.digest);
                }
                Change::RemoveTomb(digest) => next.tombs.retain(|t| t.digest != digest),
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
                    next.line.next = self.line.next + 1;
                    next.line.active = true;
                }
                Change::Settle => next.line.active = false,
                Change::SetAdmitted(admitted) => next.line.admitted = admitted,
                Change::SetAsync(digest, number) => {
                    next.line.asyncs.retain(|(d, _)| *d != digest);
                    next.line.asyncs.push((digest, number));
                    next.line.asyncs.sort_by_key(|(d, _)| *d);
                }
                Change::RemoveAsync(digest) => next.line.asyncs.retain(|(d, _)| *d != digest),
            }
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

    fn holds(&self, expect: &Expect) -> bool {
        match *expect {
            Expect::Count(sizing) => self.sizing() == sizing,
            Expect::SlotsLen(len) => self.slots.len() == len,
            Expect::SlotFree(position) => {
                self.slots.get(usize::from(position)) == Some(&Slot::Free)
            }
            Expect::SlotStamp { position, stamp } => matches!(
                self.slots.get(usize::from(position)),
                Some(Slot::Held { stamp: s, .. }) if *s == stamp
            ),
            Expect::QueueLen(len) => self.queue.len() == len,
            Expect::QueueBelow(len) => self.queue.len() < len,
            Expect::TicketAt { index, holder } => {
                self.queue.get(index).is_some_and(|t| t.holder == holder)
            }
            Expect::NotQueued(holder) => self.queue.iter().all(|t| t.holder != holder),
            Expect::NotHeld(holder) => self
                .slots
                .iter()
                .all(|s| !matches!(s, Slot::Held { holder: h, .. } if *h == holder)),
            Expect::NoTomb(digest) => self.tomb_of(digest).is_none(),
            Expect::TombIs(tomb) => self.tomb_of(tomb.digest) == Some(tomb),
            Expect::EndedIs(ended) => self.ended_at(ended.place()) == Some(ended),
            Expect::TombsAtMost(n) => self.tombs.len() <= n,
            Expect::NoBacklog => !self.line.has_backlog(),
            Expect::Admitted(admitted) => self.line.admitted == admitted,
            Expect::AsyncIs(digest, number) => self.async_number(digest) == Some(number),
            Expect::Settled => self.line.is_settled(),
        }
    }
}

/// Orders leases by position (for reports and tests).
pub fn by_position(a: &Lease, b: &Lease) -> Ordering {
    a.position.cmp(&b.position)
}

pub mod ticket;
mod ticket_step;

pub use ticket::{Callback, TicketGrant, TicketItem, TicketState};
pub use ticket_step::TicketStep;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bounds_tests;
