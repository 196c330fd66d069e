//! The pool's parts: a lease's digest, a holder (and its stored form), a
//! grant's stamp, a slot, a ticket, a given-up id, an ended grant, a lease,
//! the sizing, what `GET` shows, async mode's line.

use std::cmp::Ordering;

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

/// A ticket is dead (its owner gone) this long after its give-up time.
/// Owners cancel their own ticket when they give up; the grace covers clock
/// skew between servers and a cancel still in flight.
pub const TICKET_GRACE_MS: u64 = 1000;

/// When a queued ticket's owner stops waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// A borrower waiting in its own request: the Unix second its wait ends
    /// (rounded up). It holds its place [`TICKET_GRACE_MS`] longer, since it
    /// reads its grant itself and cancels its own ticket when it gives up.
    Seconds(u64),
    /// An async ticket: the Unix ms its wait ends. Nobody reads for it, so
    /// no grace: it is never handed a slot at or after this instant.
    Exact(u64),
}

impl GiveUp {
    /// The first instant (Unix ms) its ticket is dead.
    pub fn dead_from_ms(&self) -> u64 {
        match *self {
            GiveUp::Seconds(s) => s.saturating_mul(1000).saturating_add(TICKET_GRACE_MS),
            GiveUp::Exact(ms) => ms,
        }
    }
}

/// A waiting borrower's place in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub holder: Holder,
    pub give_up: GiveUp,
}

impl Ticket {
    /// Whether its owner may still be waiting; a dead ticket holds no place.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.give_up.dead_from_ms()
    }
}

/// A lease id given up while no lease or ticket of it was in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GivenUp {
    pub digest: LeaseDigest,
    /// Remembered until this Unix second.
    pub until_s: u64,
}

impl GivenUp {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.until_s.saturating_mul(1000)
    }
}

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

/// A short grant handed to a waiter whose slot was reused after it expired
/// (see [`SHORT_GRANT_MS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub digest: LeaseDigest,
    pub position: u16,
    pub stamp: Stamp,
}

impl Ended {
    pub(super) fn is_kept(&self, now_ms: u64) -> bool {
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

/// A pool's `count` and the number of the resize that set it: every count
/// condition names one resize, so a count set again to what it was
/// (1 → 2 → 1) never lets a write planned before those resizes land. The
/// number grows with every resize, and its low bits name the request that
/// made it (see [`Pool::resize_seen`](super::Pool::resize_seen)).
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
pub struct AsyncLine {
    /// The next ticket number.
    pub next: u64,
    /// The first number not yet admitted.
    pub admitted: u64,
    /// Async tickets admitted to the queue, or handed a slot and not yet
    /// recorded as granted by the dispatcher: digest → ticket number.
    /// Sorted by digest.
    pub listed: Vec<(LeaseDigest, u64)>,
    /// The pool has async work (set with every ticket number, cleared by
    /// the dispatcher once no backlog and no async ticket is left): the
    /// table stream's filter invokes the dispatcher for these pools only.
    pub active: bool,
}

impl AsyncLine {
    pub fn has_backlog(&self) -> bool {
        self.admitted < self.next
    }

    /// No backlog and no async ticket: nothing for the dispatcher.
    pub fn is_settled(&self) -> bool {
        !self.has_backlog() && self.listed.is_empty()
    }
}

/// A pool's stored parts break an invariant: a bug or a corrupt item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistent(pub &'static str);

/// Orders leases by position (for reports and tests).
pub fn by_position(a: &Lease, b: &Lease) -> Ordering {
    a.position.cmp(&b.position)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn holders_round_trip_in_few_bytes() {
        for ttl in [1, 255, 256, 30_000, 3_600_000, 31_536_000_000, u64::MAX] {
            let holder = h(7, ttl);
            let bytes = holder.to_bytes();
            assert_eq!(Holder::from_bytes(&bytes), Some(holder), "{ttl}");
        }
        assert_eq!(h(1, 30_000).to_bytes().len(), 10, "30 s in two bytes");
        assert_eq!(h(1, 1).to_bytes().len(), 9);
        assert_eq!(Holder::from_bytes(&[0; 8]), None, "no ttl byte");
        assert_eq!(Holder::from_bytes(&[0; 17]), None);
    }
}
