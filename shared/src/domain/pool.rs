//! The pool: rebuilt from its stored parts (checked), and what can be read
//! from it.

use super::{
    AsyncLine, Ended, GivenUp, Inconsistent, Layout, Lease, LeaseDigest, PoolState, Sizing, Slot,
    Ticket, FLAT_MAX,
};

/// Largest `count` a pool may have (API.md: `0 … 1000`).
pub use semaphore_wire::MAX_COUNT;

/// A pool: `count` numbered slots (the list may run past `count` while
/// leases from before a shrink live there), the queue of waiting borrowers
/// in arrival order, recently given-up lease ids, and the fence counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub(super) count: u16,
    /// Resizes so far (see [`Sizing`]).
    pub(super) resizes: u64,
    /// Creation time in µs: fences are `base_us + stamp.fence`, so they stay
    /// above those of any earlier pool of the same id.
    pub(super) base_us: u64,
    /// The relative fence of the next grant.
    pub(super) next_fence: u64,
    pub(super) slots: Vec<Slot>,
    pub(super) queue: Vec<Ticket>,
    /// Sorted by digest.
    pub(super) given_up: Vec<GivenUp>,
    /// Sorted by place, one per place.
    pub(super) ended: Vec<Ended>,
    /// Stored by a version that kept ended grants in a map that grew without
    /// bound: the next write that reuses a slot, returns or resizes drops it.
    pub(super) legacy_ended: bool,
    pub(super) line: AsyncLine,
    /// Where the slots are stored (the pool's truth is `slots` either way).
    pub(super) layout: Layout,
}

impl Pool {
    /// A new, empty pool created at `created_us` (µs since the epoch), with
    /// `count` free slots. `count` must already be validated (≤ [`MAX_COUNT`]).
    /// Fences start above every fence a pool of the same id can have issued
    /// before: those started at an earlier creation time and grew by one per
    /// grant, and no pool grants once per µs (each grant is a conditional
    /// write to one item, which DynamoDB takes at most about once per ms).
    /// Above [`FLAT_MAX`] it starts split, with no slot hot.
    pub fn new(count: u16, created_us: u64) -> Self {
        Pool {
            count,
            resizes: 0,
            base_us: created_us,
            next_fence: 1,
            slots: vec![Slot::Free; usize::from(count)],
            queue: Vec::new(),
            given_up: Vec::new(),
            ended: Vec::new(),
            legacy_ended: false,
            line: AsyncLine::default(),
            layout: Layout::Flat,
        }
        .split_above(FLAT_MAX)
    }

    /// Rebuilds a pool from stored parts, checking its invariants.
    pub fn from_parts(
        sizing: Sizing,
        base_us: u64,
        next_fence: u64,
        slots: Vec<Slot>,
        queue: Vec<Ticket>,
        mut given_up: Vec<GivenUp>,
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
        given_up.sort_by_key(|t| t.digest);
        if given_up.windows(2).any(|w| w[0].digest == w[1].digest) {
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
            given_up,
            ended,
            legacy_ended: false,
            line: AsyncLine::default(),
            layout: Layout::Flat,
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
    pub fn with_line(mut self, mut line: AsyncLine) -> Result<Self, Inconsistent> {
        if line.admitted > line.next {
            return Err(Inconsistent("admitted past the next ticket number"));
        }
        line.listed.sort_by_key(|(digest, _)| *digest);
        if line.listed.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Inconsistent("two async tickets of one lease id"));
        }
        self.line = line;
        Ok(self)
    }

    pub fn line(&self) -> &AsyncLine {
        &self.line
    }

    /// The number of the async ticket with this digest, if it is listed.
    pub fn listed_number(&self, digest: LeaseDigest) -> Option<u64> {
        self.line
            .listed
            .binary_search_by_key(&digest, |(d, _)| *d)
            .ok()
            .map(|i| self.line.listed[i].1)
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

    pub fn given_up(&self) -> &[GivenUp] {
        &self.given_up
    }

    pub fn ended(&self) -> &[Ended] {
        &self.ended
    }

    /// The lease a held slot stands for.
    pub(super) fn lease_at(&self, position: usize) -> Option<Lease> {
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
    pub(super) fn ended_of(&self, digest: LeaseDigest) -> Option<Ended> {
        self.ended
            .iter()
            .filter(|e| e.digest == digest)
            .max_by_key(|e| e.stamp.fence)
            .copied()
    }

    /// The ended grant remembered in `place`.
    pub(super) fn ended_at(&self, place: u8) -> Option<Ended> {
        self.ended
            .binary_search_by_key(&place, |e| e.place())
            .ok()
            .map(|i| self.ended[i])
    }

    pub(super) fn given_up_of(&self, digest: LeaseDigest) -> Option<GivenUp> {
        self.given_up
            .binary_search_by_key(&digest, |t| t.digest)
            .ok()
            .map(|i| self.given_up[i])
    }

    /// Slots free for new grants: `count` less the live leases.
    fn free(&self, now_ms: u64) -> u32 {
        u32::from(self.count).saturating_sub(self.in_use(now_ms))
    }

    /// Positions below `count` that no live lease holds, lowest first, as
    /// many as are free for grants.
    pub(super) fn free_positions(&self, now_ms: u64) -> Vec<u16> {
        let free = self.free(now_ms) as usize;
        (0..self.count)
            .filter(|&p| !self.live_at(usize::from(p), now_ms))
            .take(free)
            .collect()
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
}
