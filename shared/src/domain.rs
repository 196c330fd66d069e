//! The pool as a value: slots, leases, the queue of waiting borrowers, expiry
//! and resize. No I/O and no clock — every operation takes `now_ms` (Unix
//! milliseconds) so tests never sleep.
//!
//! Every change to a pool is an [`Update`]: the conditions it depends on and
//! the changes it makes, each naming one slot, one lease, one ticket or one
//! counter. [`Pool::apply`] is what an update means; the in-memory store is
//! that function, and the DynamoDB store turns the same update into one
//! conditional `UpdateItem`. The planners (`plan_*`) decide what to write from
//! a pool as read, conditioned on exactly what the decision depended on, so
//! that unrelated writes never collide: a return conditions only on its own
//! lease, a borrow on its slot, the count, the live-lease counter and the
//! queue in front of it.
//!
//! Fairness: a borrower that has to wait appends a [`Ticket`] to the queue.
//! A newcomer takes a slot only when no live ticket waits; a ticket's owner
//! takes one only when fewer live tickets are ahead of it than slots are free.
//! So slots freed by a return, an expiry or a count raise go to waiters in
//! the order they joined.

/// Largest `count` a pool may have (API.md: `0 … 1000`).
pub const MAX_COUNT: u16 = 1000;

/// Most expired leases or dead tickets one write removes, so that every
/// expression stays far below DynamoDB's 4 KB limit; more take more writes.
pub const MAX_PRUNE: usize = 32;

/// A ticket is dead (its owner gone) this long after its give-up time. Owners
/// cancel their own ticket at their give-up time; the grace only covers clock
/// skew between servers and a cancel still in flight.
pub const TICKET_GRACE_MS: u64 = 1000;

/// The stored form of a lease UUID: the first 16 bytes of its SHA-256.
/// 128 bits keep a stolen table dump from granting anything, at half the bytes
/// of a full digest (every byte of the item is billed on every write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseDigest(pub [u8; 16]);

/// One stored lease: a held slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub digest: LeaseDigest,
    pub position: u16,
    /// The lease is live while `now_ms < expires_at_ms`.
    pub expires_at_ms: u64,
    /// The pool's fence counter after this grant: unique per grant.
    pub fence: u64,
}

impl Lease {
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// A waiting borrower's place in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub digest: LeaseDigest,
    /// When its owner stops waiting and cancels the ticket.
    pub give_up_ms: u64,
}

impl Ticket {
    /// Whether its owner may still be waiting; a dead ticket holds no place.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.give_up_ms.saturating_add(TICKET_GRACE_MS)
    }
}

/// What `GET` shows: never lease UUIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub count: u16,
    pub in_use: u32,
    pub available: u32,
}

/// A pool: `count` numbered slots, the leases on them (at most one per
/// position and one per digest, positions possibly ≥ `count` after a shrink),
/// the queue of waiting borrowers in arrival order, and the fence counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    count: u16,
    fence: u64,
    /// Live or not yet pruned, sorted by position.
    leases: Vec<Lease>,
    queue: Vec<Ticket>,
}

/// A pool's stored parts break an invariant: a bug or a corrupt item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistent(pub &'static str);

/// One thing an update depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `count` is this.
    Count(u16),
    /// Fewer than this many leases are stored (live or not yet pruned).
    StoredBelow(u32),
    /// No lease is stored at this position.
    SlotFree(u16),
    /// The lease with this fence is stored at this position (fences are
    /// unique per grant, so this names exactly one lease).
    SlotHeldBy { position: u16, fence: u64 },
    /// No lease with this digest is stored.
    LeaseAbsent(LeaseDigest),
    /// The queue is exactly this long.
    QueueLen(usize),
    /// The queue is shorter than this.
    QueueShorterThan(usize),
    /// This ticket is at this index of the queue.
    TicketAt { index: usize, ticket: Ticket },
}

/// One change an update makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Stores a new lease; its fence is the counter plus one.
    Grant {
        position: u16,
        digest: LeaseDigest,
        expires_at_ms: u64,
    },
    /// Removes a stored lease (returned, or pruned after expiry).
    RemoveLease {
        position: u16,
        digest: LeaseDigest,
    },
    /// Removes the ticket at this index (indices name the queue as read).
    RemoveTicket(usize),
    /// Adds a ticket at the end of the queue.
    AppendTicket(Ticket),
    SetCount(u16),
}

/// A conditional change: every expectation holds, or nothing changes.
/// At most one `Grant`; `AppendTicket` never with `RemoveTicket` (DynamoDB
/// cannot write a list and one of its elements in one update).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub expect: Vec<Expect>,
    pub changes: Vec<Change>,
}

/// An expectation of an update did not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionFailed(pub Expect);

/// What a borrower can do with the pool as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BorrowPlan {
    /// A live lease with the borrower's digest is stored already (its own
    /// earlier write, or an idempotent retry): that is the grant.
    Held(Lease),
    /// Write this to take `position`.
    Take { update: Update, position: u16 },
    /// Too much to prune in one write: write this first, then plan again.
    Prune(Update),
    /// No slot for this borrower now. `ahead` live tickets wait before it (all
    /// of them, for a borrower without a ticket), `free` slots are free, and
    /// it can be served once `needed` more leases end.
    Wait {
        ahead: usize,
        free: u32,
        needed: usize,
    },
}

/// Why a borrower cannot join the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinPlan {
    Join(Update),
    /// Dead tickets fill the queue: write this first, then plan again.
    Prune(Update),
    /// `cap` live tickets wait already.
    Full,
}

impl Pool {
    /// A new, empty pool created at `created_us` (µs since the epoch). `count`
    /// must already be validated (≤ [`MAX_COUNT`]). The fence counter starts
    /// above every fence a pool of the same id can have issued before: those
    /// started at an earlier creation time and grew by one per grant, and no
    /// pool grants once per µs (each grant is a conditional write to one item,
    /// which DynamoDB takes at most about once per ms). Below 2^53 until 2255.
    pub fn new(count: u16, created_us: u64) -> Self {
        Pool {
            count,
            fence: created_us.saturating_add(1),
            leases: Vec::new(),
            queue: Vec::new(),
        }
    }

    /// Rebuilds a pool from stored parts, checking its invariants.
    pub fn from_parts(
        count: u16,
        fence: u64,
        mut leases: Vec<Lease>,
        queue: Vec<Ticket>,
    ) -> Result<Self, Inconsistent> {
        if count > MAX_COUNT {
            return Err(Inconsistent("count above the maximum"));
        }
        leases.sort_by_key(|l| l.position);
        if leases.windows(2).any(|w| w[0].position == w[1].position) {
            return Err(Inconsistent("two leases on one position"));
        }
        let mut digests: Vec<LeaseDigest> = leases.iter().map(|l| l.digest).collect();
        digests.sort_unstable();
        if digests.windows(2).any(|w| w[0] == w[1]) {
            return Err(Inconsistent("two leases with one digest"));
        }
        if leases.iter().any(|l| l.fence > fence) {
            return Err(Inconsistent("a lease fence above the counter"));
        }
        Ok(Pool {
            count,
            fence,
            leases,
            queue,
        })
    }

    pub fn count(&self) -> u16 {
        self.count
    }

    /// The fence counter: the fence of the latest grant.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Stored leases, live or not yet pruned, sorted by position.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// Waiting borrowers' tickets in arrival order, live or dead.
    pub fn queue(&self) -> &[Ticket] {
        &self.queue
    }

    pub fn in_use(&self, now_ms: u64) -> u32 {
        self.leases.iter().filter(|l| l.is_live(now_ms)).count() as u32
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
        }
    }

    /// The live lease with this digest.
    pub fn live_lease(&self, digest: LeaseDigest, now_ms: u64) -> Option<&Lease> {
        self.leases
            .iter()
            .find(|l| l.digest == digest && l.is_live(now_ms))
    }

    /// Where this ticket is in the queue.
    pub fn ticket_index(&self, ticket: &Ticket) -> Option<usize> {
        self.queue.iter().position(|t| t == ticket)
    }

    /// When the `n`-th (1-based) of the live leases to expire does: a waiter
    /// that needs `n` leases to end sleeps no longer than this.
    pub fn nth_expiry(&self, n: usize, now_ms: u64) -> Option<u64> {
        let mut expiries: Vec<u64> = self
            .leases
            .iter()
            .filter(|l| l.is_live(now_ms))
            .map(|l| l.expires_at_ms)
            .collect();
        expiries.sort_unstable();
        n.checked_sub(1).and_then(|i| expiries.get(i).copied())
    }

    /// Slots free for new grants: `count` less the live leases.
    fn free(&self, now_ms: u64) -> u32 {
        u32::from(self.count).saturating_sub(self.in_use(now_ms))
    }

    /// The lowest position in `0 … count-1` no live lease holds.
    fn lowest_free_position(&self, now_ms: u64) -> Option<u16> {
        let mut held: Vec<u16> = self
            .leases
            .iter()
            .filter(|l| l.is_live(now_ms))
            .map(|l| l.position)
            .collect();
        held.sort_unstable();
        (0..self.count).find(|p| held.binary_search(p).is_err())
    }

    /// What a borrower with `digest` can do now: its own live lease, a write
    /// that takes the lowest free slot, or wait. `mine` is its ticket, if it
    /// has joined the queue.
    pub fn plan_borrow(
        &self,
        digest: LeaseDigest,
        expires_at_ms: u64,
        now_ms: u64,
        mine: Option<&Ticket>,
    ) -> BorrowPlan {
        if let Some(lease) = self.live_lease(digest, now_ms) {
            return BorrowPlan::Held(*lease);
        }
        let my_index = mine.and_then(|t| self.ticket_index(t));
        // Without a ticket, every ticket is in front; with one, those before it.
        let front = &self.queue[..my_index.unwrap_or(self.queue.len())];
        let ahead = front.iter().filter(|t| t.is_live(now_ms)).count();
        let free = self.free(now_ms);
        if ahead >= free as usize {
            let in_use = self.in_use(now_ms) as usize;
            let needed = (ahead + 1 + in_use).saturating_sub(usize::from(self.count));
            return BorrowPlan::Wait {
                ahead,
                free,
                needed,
            };
        }
        let Some(position) = self.lowest_free_position(now_ms) else {
            // Fewer than `count` live leases means a free position below it.
            return BorrowPlan::Wait {
                ahead,
                free: 0,
                needed: 1,
            };
        };
        let dead: Vec<usize> = (0..front.len())
            .filter(|&i| !front[i].is_live(now_ms))
            .collect();
        let expired: Vec<Lease> = self
            .leases
            .iter()
            .filter(|l| !l.is_live(now_ms))
            .copied()
            .collect();
        // Rare: more to prune (or, for a newcomer, to pin) than one write
        // should carry. Prune first, or wait in the queue.
        if expired.len() > MAX_PRUNE {
            return BorrowPlan::Prune(self.prune_update(&expired[..MAX_PRUNE], &[]));
        }
        if dead.len() > MAX_PRUNE {
            return BorrowPlan::Prune(self.prune_update(&[], &dead[..MAX_PRUNE]));
        }
        if my_index.is_none() && front.len() > MAX_PRUNE {
            if !dead.is_empty() {
                return BorrowPlan::Prune(self.prune_update(&[], &dead));
            }
            let needed = ahead + 1;
            return BorrowPlan::Wait {
                ahead,
                free,
                needed,
            };
        }

        let mut update = self.prune_update(&expired, &dead);
        // Capacity: the pruned leases are conditioned on, so after this write
        // `n - pruned + 1` are stored, all but the pruned ones possibly live.
        update.expect.push(Expect::Count(self.count));
        update.expect.push(Expect::StoredBelow(
            u32::from(self.count) + expired.len() as u32,
        ));
        if !expired.iter().any(|l| l.position == position) {
            update.expect.push(Expect::SlotFree(position));
        }
        if !expired.iter().any(|l| l.digest == digest) {
            update.expect.push(Expect::LeaseAbsent(digest));
        }
        match (my_index, mine) {
            // Tickets ahead can only leave (taking a slot or not), never
            // join ahead, so `ahead < free` stays true without pinning them.
            (Some(index), Some(ticket)) => {
                update.expect.push(Expect::TicketAt {
                    index,
                    ticket: *ticket,
                });
                update.changes.push(Change::RemoveTicket(index));
            }
            // A newcomer pins the whole queue: no ticket may join, leave or
            // take a slot before it, or it would be served out of turn.
            _ => {
                update.expect.push(Expect::QueueLen(self.queue.len()));
                for (index, ticket) in self.queue.iter().enumerate() {
                    if !dead.contains(&index) {
                        update.expect.push(Expect::TicketAt {
                            index,
                            ticket: *ticket,
                        });
                    }
                }
            }
        }
        update.changes.push(Change::Grant {
            position,
            digest,
            expires_at_ms,
        });
        BorrowPlan::Take { update, position }
    }

    /// Removes the `expired` leases and the tickets at `dead`, each
    /// conditioned on being there as read.
    fn prune_update(&self, expired: &[Lease], dead: &[usize]) -> Update {
        let mut update = Update::default();
        for lease in expired {
            update.expect.push(Expect::SlotHeldBy {
                position: lease.position,
                fence: lease.fence,
            });
            update.changes.push(Change::RemoveLease {
                position: lease.position,
                digest: lease.digest,
            });
        }
        for &index in dead {
            update.expect.push(Expect::TicketAt {
                index,
                ticket: self.queue[index],
            });
            update.changes.push(Change::RemoveTicket(index));
        }
        update
    }

    /// Joins the queue with `ticket`, unless `cap` live tickets wait already.
    pub fn plan_join(&self, ticket: Ticket, cap: usize, now_ms: u64) -> JoinPlan {
        if self.queue.len() < cap {
            return JoinPlan::Join(Update {
                expect: vec![Expect::QueueShorterThan(cap)],
                changes: vec![Change::AppendTicket(ticket)],
            });
        }
        if self.waiting(now_ms) >= cap {
            return JoinPlan::Full;
        }
        let dead: Vec<usize> = (0..self.queue.len())
            .filter(|&i| !self.queue[i].is_live(now_ms))
            .collect();
        JoinPlan::Prune(self.prune_update(&[], &dead[..dead.len().min(MAX_PRUNE)]))
    }

    /// Removes `ticket` from the queue; `None` when it is not there.
    pub fn plan_cancel(&self, ticket: &Ticket) -> Option<Update> {
        let index = self.ticket_index(ticket)?;
        Some(Update {
            expect: vec![Expect::TicketAt {
                index,
                ticket: *ticket,
            }],
            changes: vec![Change::RemoveTicket(index)],
        })
    }

    /// Frees a live lease, conditioned only on that lease being stored: a
    /// return never collides with writes to other slots. `None` for an
    /// unknown, returned or expired lease (no write needed).
    pub fn plan_return(&self, digest: LeaseDigest, now_ms: u64) -> Option<(Lease, Update)> {
        let lease = *self.live_lease(digest, now_ms)?;
        let update = Update {
            expect: vec![Expect::SlotHeldBy {
                position: lease.position,
                fence: lease.fence,
            }],
            changes: vec![Change::RemoveLease {
                position: lease.position,
                digest,
            }],
        };
        Some((lease, update))
    }

    /// Sets `count`, keeping every lease (a shrink only withholds new
    /// borrows); waiters see a raise on their next read. `None` when the count
    /// is already this (no write needed).
    pub fn plan_resize(&self, count: u16) -> Option<Update> {
        (self.count != count).then(|| Update {
            expect: Vec::new(),
            changes: vec![Change::SetCount(count)],
        })
    }

    /// Expectations that fail on any change at all to this pool: what a
    /// whole-item version check amounts to (the old write path, kept for
    /// benchmarks). One per position up to the highest held or counted.
    pub fn pins(&self) -> Vec<Expect> {
        let top = self
            .leases
            .iter()
            .map(|l| l.position + 1)
            .max()
            .unwrap_or(0)
            .max(self.count);
        let mut pins = vec![
            Expect::Count(self.count),
            Expect::QueueLen(self.queue.len()),
        ];
        for position in 0..top {
            pins.push(match self.leases.iter().find(|l| l.position == position) {
                Some(lease) => Expect::SlotHeldBy {
                    position,
                    fence: lease.fence,
                },
                None => Expect::SlotFree(position),
            });
        }
        for (index, ticket) in self.queue.iter().enumerate() {
            pins.push(Expect::TicketAt {
                index,
                ticket: *ticket,
            });
        }
        pins
    }

    /// What an update means: the pool after it, or the first expectation that
    /// does not hold. Ticket indices name the queue as it was before.
    pub fn apply(&self, update: &Update) -> Result<Pool, ConditionFailed> {
        for expect in &update.expect {
            if !self.holds(expect) {
                return Err(ConditionFailed(*expect));
            }
        }
        let mut next = self.clone();
        let mut removed_tickets: Vec<usize> = Vec::new();
        for change in &update.changes {
            match *change {
                Change::RemoveLease { position, digest } => next
                    .leases
                    .retain(|l| l.position != position && l.digest != digest),
                Change::RemoveTicket(index) => removed_tickets.push(index),
                Change::SetCount(count) => next.count = count,
                Change::Grant { .. } | Change::AppendTicket(_) => {}
            }
        }
        removed_tickets.sort_unstable();
        removed_tickets.dedup();
        for index in removed_tickets.into_iter().rev() {
            if index < next.queue.len() {
                next.queue.remove(index);
            }
        }
        for change in &update.changes {
            match *change {
                Change::AppendTicket(ticket) => next.queue.push(ticket),
                Change::Grant {
                    position,
                    digest,
                    expires_at_ms,
                } => {
                    // A grant overwrites whatever its slot and digest held.
                    next.leases
                        .retain(|l| l.position != position && l.digest != digest);
                    next.fence = next.fence.saturating_add(1);
                    let at = next.leases.partition_point(|l| l.position < position);
                    next.leases.insert(
                        at,
                        Lease {
                            digest,
                            position,
                            expires_at_ms,
                            fence: next.fence,
                        },
                    );
                }
                _ => {}
            }
        }
        Ok(next)
    }

    fn holds(&self, expect: &Expect) -> bool {
        match *expect {
            Expect::Count(count) => self.count == count,
            Expect::StoredBelow(limit) => (self.leases.len() as u32) < limit,
            Expect::SlotFree(position) => self.leases.iter().all(|l| l.position != position),
            Expect::SlotHeldBy { position, fence } => self
                .leases
                .iter()
                .any(|l| l.position == position && l.fence == fence),
            Expect::LeaseAbsent(digest) => self.leases.iter().all(|l| l.digest != digest),
            Expect::QueueLen(len) => self.queue.len() == len,
            Expect::QueueShorterThan(len) => self.queue.len() < len,
            Expect::TicketAt { index, ticket } => self.queue.get(index) == Some(&ticket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> LeaseDigest {
        LeaseDigest([n; 16])
    }

    fn ticket(n: u8, give_up_ms: u64) -> Ticket {
        Ticket {
            digest: d(n),
            give_up_ms,
        }
    }

    /// Borrows as a newcomer, applying the plan; the granted position.
    fn borrow(pool: &mut Pool, n: u8, expires_at_ms: u64, now: u64) -> Option<u16> {
        match pool.plan_borrow(d(n), expires_at_ms, now, None) {
            BorrowPlan::Take { update, position } => {
                *pool = pool.apply(&update).expect("plan holds on its own pool");
                Some(position)
            }
            BorrowPlan::Held(lease) => Some(lease.position),
            _ => None,
        }
    }

    fn give_back(pool: &mut Pool, n: u8, now: u64) -> bool {
        match pool.plan_return(d(n), now) {
            Some((_, update)) => {
                *pool = pool.apply(&update).unwrap();
                true
            }
            None => false,
        }
    }

    fn join(pool: &mut Pool, t: Ticket, now: u64) {
        match pool.plan_join(t, 100, now) {
            JoinPlan::Join(update) => *pool = pool.apply(&update).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn borrow_takes_lowest_free_position() {
        let mut pool = Pool::new(3, 0);
        assert_eq!(borrow(&mut pool, 1, 100, 0), Some(0));
        assert_eq!(borrow(&mut pool, 2, 100, 0), Some(1));
        assert_eq!(borrow(&mut pool, 3, 100, 0), Some(2));
        assert_eq!(borrow(&mut pool, 4, 100, 0), None);
        assert!(give_back(&mut pool, 2, 1));
        assert_eq!(borrow(&mut pool, 5, 100, 1), Some(1));
    }

    #[test]
    fn fences_increase_with_every_grant_from_the_creation_time() {
        let mut pool = Pool::new(2, 5999);
        assert_eq!(pool.fence(), 6000);
        borrow(&mut pool, 1, 100, 5);
        borrow(&mut pool, 2, 100, 5);
        give_back(&mut pool, 1, 6);
        borrow(&mut pool, 3, 100, 6);
        let fences: Vec<u64> = pool.leases().iter().map(|l| l.fence).collect();
        assert_eq!(fences, vec![6003, 6002]);
        assert_eq!(pool.fence(), 6003);
    }

    #[test]
    fn expired_position_is_pruned_in_the_write_that_reuses_it() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 50, 0);
        borrow(&mut pool, 2, 100, 0);
        assert_eq!(borrow(&mut pool, 3, 200, 49), None);
        let BorrowPlan::Take { update, position } = pool.plan_borrow(d(3), 200, 50, None) else {
            panic!()
        };
        assert_eq!(position, 0);
        assert!(update.expect.contains(&Expect::SlotHeldBy {
            position: 0,
            fence: 2
        }));
        assert!(!update.expect.contains(&Expect::SlotFree(0)));
        pool = pool.apply(&update).unwrap();
        assert_eq!(pool.leases().len(), 2);
        assert_eq!(pool.leases()[0].digest, d(3));
    }

    #[test]
    fn return_conditions_only_on_its_own_lease() {
        let mut pool = Pool::new(3, 0);
        borrow(&mut pool, 1, 100, 0);
        let (_, update) = pool.plan_return(d(1), 1).unwrap();
        assert_eq!(
            update.expect,
            vec![Expect::SlotHeldBy {
                position: 0,
                fence: 2
            }]
        );
        // Another borrow lands first: the return still applies.
        borrow(&mut pool, 2, 100, 1);
        pool = pool.apply(&update).unwrap();
        assert_eq!(pool.in_use(1), 1);
        assert!(!give_back(&mut pool, 1, 1), "already returned");
        borrow(&mut pool, 3, 10, 1);
        assert!(!give_back(&mut pool, 3, 10), "expired");
    }

    #[test]
    fn racing_borrows_of_one_slot_conflict_and_the_loser_moves_on() {
        let mut pool = Pool::new(2, 0);
        let BorrowPlan::Take { update: a, .. } = pool.plan_borrow(d(1), 100, 0, None) else {
            panic!()
        };
        let BorrowPlan::Take { update: b, .. } = pool.plan_borrow(d(2), 100, 0, None) else {
            panic!()
        };
        pool = pool.apply(&a).unwrap();
        assert_eq!(pool.apply(&b), Err(ConditionFailed(Expect::SlotFree(0))));
        assert_eq!(borrow(&mut pool, 2, 100, 0), Some(1));
    }

    #[test]
    fn count_zero_never_grants() {
        let mut pool = Pool::new(0, 0);
        assert_eq!(borrow(&mut pool, 1, 100, 0), None);
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
    fn shrink_keeps_live_leases_and_withholds_borrows() {
        let mut pool = Pool::new(4, 0);
        for n in 0..4 {
            borrow(&mut pool, n, 100, 0);
        }
        pool = pool.apply(&pool.plan_resize(2).unwrap()).unwrap();
        let state = pool.state(1);
        assert_eq!((state.count, state.in_use, state.available), (2, 4, 0));
        assert!(give_back(&mut pool, 0, 2));
        assert_eq!(borrow(&mut pool, 9, 100, 2), None);
        assert!(give_back(&mut pool, 2, 3));
        assert!(give_back(&mut pool, 3, 3));
        assert_eq!(borrow(&mut pool, 9, 100, 3), Some(0));
        assert_eq!(borrow(&mut pool, 10, 100, 3), None);
        assert_eq!(pool.plan_resize(2), None);
    }

    #[test]
    fn a_stale_plan_cannot_over_issue_after_a_shrink() {
        // Count 3 shrunk to 2 with leases on positions 1 and 2: one borrower
        // read before another's grant; the lease counter stops the second.
        let mut pool = Pool::new(3, 0);
        for n in 0..3 {
            borrow(&mut pool, n, 100, 0);
        }
        give_back(&mut pool, 0, 1);
        give_back(&mut pool, 1, 1);
        pool = pool.apply(&pool.plan_resize(2).unwrap()).unwrap();
        // One live lease (position 2) of count 2: one grant allowed.
        let BorrowPlan::Take { update: a, .. } = pool.plan_borrow(d(7), 100, 1, None) else {
            panic!()
        };
        pool = pool.apply(&a).unwrap();
        // A plan from before that grant, aimed at another position.
        let mut stale = a.clone();
        stale.changes = vec![Change::Grant {
            position: 1,
            digest: d(8),
            expires_at_ms: 100,
        }];
        stale.expect.retain(|e| !matches!(e, Expect::SlotFree(_)));
        stale.expect.push(Expect::SlotFree(1));
        assert_eq!(
            pool.apply(&stale),
            Err(ConditionFailed(Expect::StoredBelow(2)))
        );
    }

    #[test]
    fn newcomers_wait_behind_live_tickets_and_ignore_dead_ones() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        let waiter = ticket(2, 500);
        join(&mut pool, waiter, 0);
        give_back(&mut pool, 1, 10);
        // A slot is free but a ticket waits: the newcomer waits too.
        assert_eq!(
            pool.plan_borrow(d(3), 200, 10, None),
            BorrowPlan::Wait {
                ahead: 1,
                free: 1,
                needed: 1
            }
        );
        // The ticket's owner takes it.
        let BorrowPlan::Take { update, position } = pool.plan_borrow(d(2), 200, 10, Some(&waiter))
        else {
            panic!()
        };
        assert_eq!(position, 0);
        pool = pool.apply(&update).unwrap();
        assert!(pool.queue().is_empty());

        // A dead ticket (owner gone past its grace) holds no place.
        let gone = ticket(4, 20);
        join(&mut pool, gone, 20);
        give_back(&mut pool, 2, 30);
        let now = 20 + TICKET_GRACE_MS;
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(d(5), now + 100, now, None) else {
            panic!()
        };
        assert!(update.expect.contains(&Expect::QueueLen(1)));
        pool = pool.apply(&update).unwrap();
        assert!(pool.queue().is_empty(), "the dead ticket was pruned");
    }

    #[test]
    fn a_join_makes_a_racing_newcomer_conflict() {
        let mut pool = Pool::new(1, 0);
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(d(1), 100, 0, None) else {
            panic!()
        };
        join(&mut pool, ticket(2, 500), 0);
        assert_eq!(
            pool.apply(&update),
            Err(ConditionFailed(Expect::QueueLen(0)))
        );
    }

    #[test]
    fn waiters_are_served_in_order_and_several_at_once_after_a_raise() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        let (a, b, c) = (ticket(2, 900), ticket(3, 900), ticket(4, 900));
        for t in [a, b, c] {
            join(&mut pool, t, 0);
        }
        for t in [b, c] {
            assert!(matches!(
                pool.plan_borrow(t.digest, 500, 1, Some(&t)),
                BorrowPlan::Wait { .. }
            ));
        }
        pool = pool.apply(&pool.plan_resize(3).unwrap()).unwrap();
        // Two slots free: a and b may take, c (third in line) may not.
        assert!(matches!(
            pool.plan_borrow(c.digest, 500, 1, Some(&c)),
            BorrowPlan::Wait {
                ahead: 2,
                free: 2,
                needed: 1
            }
        ));
        let BorrowPlan::Take { update: ub, .. } = pool.plan_borrow(b.digest, 500, 1, Some(&b))
        else {
            panic!()
        };
        let BorrowPlan::Take { update: ua, .. } = pool.plan_borrow(a.digest, 500, 1, Some(&a))
        else {
            panic!()
        };
        pool = pool.apply(&ub).unwrap();
        // Both aimed at position 1: a loses, and plans again from the record
        // its lost write hands back (its index did not move: b was behind it).
        assert_eq!(pool.apply(&ua), Err(ConditionFailed(Expect::SlotFree(1))));
        let BorrowPlan::Take {
            update: ua,
            position,
        } = pool.plan_borrow(a.digest, 500, 1, Some(&a))
        else {
            panic!()
        };
        assert_eq!(position, 2);
        pool = pool.apply(&ua).unwrap();
        assert_eq!(pool.queue(), &[c]);
        assert_eq!(pool.in_use(1), 3);
    }

    #[test]
    fn a_cancel_and_a_take_of_one_ticket_exclude_each_other() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        let t = ticket(2, 50);
        join(&mut pool, t, 0);
        give_back(&mut pool, 1, 40);
        let cancel = pool.plan_cancel(&t).unwrap();
        let BorrowPlan::Take { update: take, .. } = pool.plan_borrow(t.digest, 200, 40, Some(&t))
        else {
            panic!()
        };
        let taken = pool.apply(&take).unwrap();
        assert!(taken.apply(&cancel).is_err(), "the take won: no cancel");
        assert_eq!(taken.plan_cancel(&t), None);
        assert!(matches!(
            taken.plan_borrow(t.digest, 200, 41, Some(&t)),
            BorrowPlan::Held(_)
        ));
        let cancelled = pool.apply(&cancel).unwrap();
        assert!(cancelled.apply(&take).is_err(), "the cancel won: no grant");
    }

    #[test]
    fn one_digest_never_holds_two_slots() {
        let mut pool = Pool::new(3, 0);
        let BorrowPlan::Take { update: first, .. } = pool.plan_borrow(d(1), 100, 0, None) else {
            panic!()
        };
        borrow(&mut pool, 2, 100, 0);
        // The same digest planned again from the newer read: position 1.
        let BorrowPlan::Take { update: second, .. } = pool.plan_borrow(d(1), 100, 0, None) else {
            panic!()
        };
        let both = Pool::new(3, 0).apply(&first).unwrap();
        assert!(both.apply(&second).is_err());
        assert!(matches!(
            both.plan_borrow(d(1), 100, 0, None),
            BorrowPlan::Held(_)
        ));
    }

    #[test]
    fn a_full_queue_refuses_and_dead_tickets_make_room() {
        let mut pool = Pool::new(0, 0);
        pool = pool
            .apply(&pool.plan_join(ticket(1, 10), 2, 0).into_update())
            .unwrap();
        pool = pool
            .apply(&pool.plan_join(ticket(2, 5000), 2, 0).into_update())
            .unwrap();
        assert_eq!(pool.plan_join(ticket(3, 5000), 2, 0), JoinPlan::Full);
        let later = 10 + TICKET_GRACE_MS;
        let JoinPlan::Prune(prune) = pool.plan_join(ticket(3, 9000), 2, later) else {
            panic!()
        };
        pool = pool.apply(&prune).unwrap();
        assert!(matches!(
            pool.plan_join(ticket(3, 9000), 2, later),
            JoinPlan::Join(_)
        ));
    }

    #[test]
    fn waiters_sleep_to_the_expiry_that_serves_them() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 30, 0);
        borrow(&mut pool, 2, 10, 0);
        assert_eq!(pool.nth_expiry(1, 0), Some(10));
        assert_eq!(pool.nth_expiry(2, 0), Some(30));
        assert_eq!(pool.nth_expiry(3, 0), None);
        assert_eq!(pool.nth_expiry(0, 0), None);
        let t = ticket(3, 900);
        join(&mut pool, t, 0);
        join(&mut pool, ticket(4, 900), 0);
        let BorrowPlan::Wait { needed, .. } = pool.plan_borrow(d(4), 100, 0, Some(&ticket(4, 900)))
        else {
            panic!()
        };
        assert_eq!(needed, 2, "second in line needs both leases to end");
    }

    #[test]
    fn stored_parts_are_checked() {
        let lease = |p: u16, n: u8, fence: u64| Lease {
            digest: d(n),
            position: p,
            expires_at_ms: 9,
            fence,
        };
        assert!(Pool::from_parts(3, 9, vec![lease(2, 2, 2), lease(0, 0, 1)], vec![]).is_ok());
        assert!(Pool::from_parts(3, 9, vec![lease(1, 1, 1), lease(1, 2, 2)], vec![]).is_err());
        assert!(Pool::from_parts(3, 9, vec![lease(0, 1, 1), lease(1, 1, 2)], vec![]).is_err());
        assert!(Pool::from_parts(3, 1, vec![lease(0, 1, 5)], vec![]).is_err());
        assert!(Pool::from_parts(1001, 9, vec![], vec![]).is_err());
    }

    impl JoinPlan {
        fn into_update(self) -> Update {
            match self {
                JoinPlan::Join(update) | JoinPlan::Prune(update) => update,
                JoinPlan::Full => panic!("queue full"),
            }
        }
    }
}

/// Properties of the planners and `apply` under concurrency: plans are made
/// from snapshots of any age and applied later, in any order, as racing
/// requests do. Whatever lands keeps the pool's promises.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A newcomer (or, with `ticket`, the owner of the `ticket`-th ticket) plans a borrow.
        PlanBorrow {
            who: u8,
            ticket: Option<usize>,
        },
        /// Someone joins the queue, waiting `wait` ms.
        Join {
            who: u8,
            wait: u64,
        },
        /// The owner of the `which`-th ticket plans to cancel it.
        PlanCancel {
            which: usize,
        },
        /// The holder of the `which`-th stored lease plans to return it.
        PlanReturn {
            which: usize,
        },
        Resize {
            count: u16,
        },
        /// A planned update lands (or conflicts), `which` of those in flight.
        Land {
            which: usize,
        },
        Advance {
            ms: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..12, proptest::option::of(0usize..6))
                .prop_map(|(who, ticket)| Op::PlanBorrow { who, ticket }),
            2 => (0u8..12, 0u64..40).prop_map(|(who, wait)| Op::Join { who, wait }),
            1 => (0usize..6).prop_map(|which| Op::PlanCancel { which }),
            2 => (0usize..6).prop_map(|which| Op::PlanReturn { which }),
            1 => (0u16..5).prop_map(|count| Op::Resize { count }),
            6 => (0usize..8).prop_map(|which| Op::Land { which }),
            2 => (0u64..15).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    fn digest(who: u8) -> LeaseDigest {
        LeaseDigest([who; 16])
    }

    /// API.md's model, written as plainly as possible: live leases are those
    /// with `now < expires_at`; a borrow takes the lowest position of
    /// `0..count` no live lease holds, if fewer than `count` are live.
    mod model {
        use super::super::{Lease, LeaseDigest};
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        pub enum Op {
            Borrow {
                ttl: u64,
            },
            Return {
                which: u8,
            },
            Resize {
                count: u16,
            },
            Advance {
                ms: u64,
            },
            /// Round-trip through stored parts, leases in a shuffled order.
            Reload {
                shuffle: u64,
            },
        }

        pub fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                5 => (1u64..60).prop_map(|ttl| Op::Borrow { ttl }),
                2 => any::<u8>().prop_map(|which| Op::Return { which }),
                1 => (0u16..8).prop_map(|count| Op::Resize { count }),
                3 => (0u64..25).prop_map(|ms| Op::Advance { ms }),
                1 => any::<u64>().prop_map(|shuffle| Op::Reload { shuffle }),
            ]
        }

        #[derive(Clone, Debug, Default)]
        pub struct Model {
            pub count: u16,
            pub leases: Vec<(LeaseDigest, u16, u64)>,
        }

        impl Model {
            pub fn live(&self, now: u64) -> Vec<(LeaseDigest, u16)> {
                let mut live: Vec<(LeaseDigest, u16)> = self
                    .leases
                    .iter()
                    .filter(|l| now < l.2)
                    .map(|l| (l.0, l.1))
                    .collect();
                live.sort_by_key(|l| (l.1, l.0));
                live
            }

            pub fn borrow(
                &mut self,
                digest: LeaseDigest,
                expires_at: u64,
                now: u64,
            ) -> Option<u16> {
                let live = self.live(now);
                if live.len() >= usize::from(self.count) {
                    return None;
                }
                let position = (0..self.count).find(|p| live.iter().all(|l| l.1 != *p))?;
                self.leases.retain(|l| now < l.2);
                self.leases.push((digest, position, expires_at));
                Some(position)
            }

            pub fn return_lease(&mut self, digest: LeaseDigest, now: u64) -> bool {
                let before = self.live(now).len();
                self.leases.retain(|l| now < l.2 && l.0 != digest);
                self.live(now).len() != before
            }
        }

        pub fn live(leases: &[Lease], now: u64) -> Vec<(LeaseDigest, u16)> {
            let mut live: Vec<(LeaseDigest, u16)> = leases
                .iter()
                .filter(|l| l.is_live(now))
                .map(|l| (l.digest, l.position))
                .collect();
            live.sort_by_key(|l| (l.1, l.0));
            live
        }

        /// A deterministic shuffle (Fisher–Yates on a xorshift stream).
        pub fn shuffled(mut leases: Vec<Lease>, mut seed: u64) -> Vec<Lease> {
            for i in (1..leases.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                leases.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            leases
        }
    }

    /// Checks one landed update: `prev` → `next` at `now`.
    fn check_landed(prev: &Pool, next: &Pool, now: u64) -> Result<(), TestCaseError> {
        let rebuilt = Pool::from_parts(
            next.count,
            next.fence,
            next.leases.clone(),
            next.queue.clone(),
        );
        prop_assert!(rebuilt.is_ok(), "invariants broken: {:?}", rebuilt);
        let granted: Vec<&Lease> = next
            .leases
            .iter()
            .filter(|l| !prev.leases.iter().any(|p| p.fence == l.fence))
            .collect();
        prop_assert!(granted.len() <= 1);
        if let Some(lease) = granted.first() {
            prop_assert!(lease.fence > prev.fence, "fences only grow");
            prop_assert!(lease.position < next.count, "position within count");
            prop_assert!(
                prev.leases
                    .iter()
                    .all(|l| l.position != lease.position || !l.is_live(now)),
                "granted a position a live lease held"
            );
            prop_assert!(next.in_use(now) <= u32::from(next.count), "over-issue");
            // FIFO: fewer live tickets were ahead of the grantee than slots
            // were free, so no earlier waiter lost its turn.
            let ahead = match prev.queue.iter().position(|t| t.digest == lease.digest) {
                Some(k) => &prev.queue[..k],
                None => &prev.queue[..],
            };
            let ahead_live = ahead.iter().filter(|t| t.is_live(now)).count();
            prop_assert!(
                (ahead_live as u32) < prev.free(now),
                "served out of turn: {} live ahead, {} free",
                ahead_live,
                prev.free(now)
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn racing_plans_never_break_the_pools_promises(
            initial in 0u16..4,
            ops in proptest::collection::vec(op(), 1..160),
        ) {
            let mut now = 1_000u64;
            let mut pool = Pool::new(initial, now);
            let mut in_flight: Vec<Update> = Vec::new();
            let mut tickets: Vec<Ticket> = Vec::new();
            for op in ops {
                match op {
                    Op::PlanBorrow { who, ticket } => {
                        let mine = ticket.and_then(|i| tickets.get(i)).copied();
                        let who = mine.map_or(digest(who), |t| t.digest);
                        match pool.plan_borrow(who, now + 20, now, mine.as_ref()) {
                            BorrowPlan::Take { update, position } => {
                                // A fresh plan takes the lowest free position.
                                prop_assert_eq!(Some(position), pool.lowest_free_position(now));
                                in_flight.push(update);
                            }
                            BorrowPlan::Prune(update) => in_flight.push(update),
                            BorrowPlan::Held(lease) => prop_assert!(lease.is_live(now)),
                            BorrowPlan::Wait { .. } => {}
                        }
                    }
                    Op::Join { who, wait } => {
                        let ticket = Ticket { digest: digest(who), give_up_ms: now + wait };
                        if let JoinPlan::Join(update) | JoinPlan::Prune(update) =
                            pool.plan_join(ticket, 4, now)
                        {
                            in_flight.push(update);
                            tickets.push(ticket);
                        }
                    }
                    Op::PlanCancel { which } => {
                        if let Some(update) = tickets.get(which).and_then(|t| pool.plan_cancel(t)) {
                            in_flight.push(update);
                        }
                    }
                    Op::PlanReturn { which } => {
                        if let Some(lease) = pool.leases.get(which).copied() {
                            match pool.plan_return(lease.digest, now) {
                                Some((held, update)) => {
                                    prop_assert_eq!(held, lease);
                                    in_flight.push(update);
                                }
                                None => prop_assert!(!lease.is_live(now)),
                            }
                        }
                    }
                    Op::Resize { count } => {
                        let before = pool.in_use(now);
                        if let Some(update) = pool.plan_resize(count) {
                            pool = pool.apply(&update).expect("a resize has no condition");
                        }
                        prop_assert_eq!(pool.in_use(now), before, "resize never revokes");
                    }
                    Op::Land { which } => {
                        if !in_flight.is_empty() {
                            let update = in_flight.remove(which % in_flight.len());
                            if let Ok(next) = pool.apply(&update) {
                                check_landed(&pool, &next, now)?;
                                pool = next;
                            }
                        }
                    }
                    Op::Advance { ms } => now += ms,
                }
                let state = pool.state(now);
                prop_assert_eq!(state.available, u32::from(state.count).saturating_sub(state.in_use));
            }
        }

        /// Applied one at a time, fresh plans agree with API.md's plain model
        /// after every step: no operation loses, moves or resurrects a lease,
        /// every grant is the lowest free position, and reloading the pool
        /// from its stored parts, in any order, changes nothing.
        #[test]
        fn sequential_plans_agree_with_the_model(
            initial in 0u16..8,
            ops in proptest::collection::vec(model::op(), 1..250),
        ) {
            let mut pool = Pool::new(initial, 0);
            let mut model = model::Model { count: initial, leases: Vec::new() };
            let mut now = 0u64;
            let mut issued = 0u8;
            for op in ops {
                match op {
                    model::Op::Borrow { ttl } => {
                        let d = digest(issued);
                        issued = issued.wrapping_add(1);
                        let expected = model.borrow(d, now + ttl, now);
                        let got = loop {
                            match pool.plan_borrow(d, now + ttl, now, None) {
                                BorrowPlan::Take { update, position } => {
                                    pool = pool.apply(&update).expect("a fresh plan holds");
                                    break Some(position);
                                }
                                BorrowPlan::Prune(update) => {
                                    pool = pool.apply(&update).expect("a fresh prune holds")
                                }
                                BorrowPlan::Wait { .. } => break None,
                                BorrowPlan::Held(_) => prop_assert!(false, "a new digest is held"),
                            }
                        };
                        prop_assert_eq!(got, expected);
                    }
                    model::Op::Return { which } => {
                        let d = digest(which % issued.max(1));
                        let returned = match pool.plan_return(d, now) {
                            Some((_, update)) => {
                                pool = pool.apply(&update).expect("a fresh return holds");
                                true
                            }
                            None => false,
                        };
                        prop_assert_eq!(returned, model.return_lease(d, now));
                    }
                    model::Op::Resize { count } => {
                        if let Some(update) = pool.plan_resize(count) {
                            pool = pool.apply(&update).unwrap();
                        }
                        model.count = count;
                    }
                    model::Op::Advance { ms } => now += ms,
                    model::Op::Reload { shuffle } => {
                        let reloaded = Pool::from_parts(
                            pool.count,
                            pool.fence,
                            model::shuffled(pool.leases.clone(), shuffle | 1),
                            pool.queue.clone(),
                        );
                        prop_assert_eq!(reloaded.as_ref(), Ok(&pool), "stored order matters");
                    }
                }
                prop_assert_eq!(model::live(&pool.leases, now), model.live(now));
                prop_assert_eq!(pool.in_use(now) as usize, model.live(now).len());
            }
        }

        /// From any state, borrows at one instant succeed exactly
        /// max(0, count − in_use) times, on the free positions in ascending
        /// order, and a waiter sleeping to `nth_expiry(1)` finds a lease ended.
        #[test]
        fn a_pool_grants_exactly_its_free_capacity(
            count in 1u16..8,
            ttls in proptest::collection::vec(1u64..100, 0..10),
            shrink_to in 0u16..8,
            grow in 0u16..4,
            now in 0u64..120,
        ) {
            let mut pool = Pool::new(count, 0);
            for (i, ttl) in ttls.into_iter().enumerate() {
                if let BorrowPlan::Take { update, .. } = pool.plan_borrow(digest(i as u8), ttl, 0, None) {
                    pool = pool.apply(&update).unwrap();
                }
            }
            for resize in [shrink_to, shrink_to + grow] {
                if let Some(update) = pool.plan_resize(resize) {
                    pool = pool.apply(&update).unwrap();
                }
            }
            if let Some(at) = pool.nth_expiry(1, now) {
                prop_assert!(at > now && pool.in_use(at) < pool.in_use(now));
                prop_assert_eq!(pool.in_use(at - 1), pool.in_use(now));
            }
            let count = pool.count;
            let held: Vec<u16> = model::live(&pool.leases, now).iter().map(|l| l.1).collect();
            let mut free: Vec<u16> = (0..count).filter(|p| !held.contains(p)).collect();
            free.truncate(usize::from(count).saturating_sub(held.len()));
            let mut granted = Vec::new();
            for i in 0..usize::from(count) + 2 {
                match pool.plan_borrow(digest(100 + i as u8), now + 10, now, None) {
                    BorrowPlan::Take { update, position } => {
                        pool = pool.apply(&update).unwrap();
                        granted.push(position);
                    }
                    BorrowPlan::Wait { .. } => break,
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            prop_assert_eq!(&granted, &free);
            prop_assert_eq!(pool.state(now).available, 0);
        }

        /// A return that lands frees exactly its lease, whatever landed
        /// before it; one that does not land changes nothing.
        #[test]
        fn returns_touch_only_their_own_lease(
            count in 1u16..5,
            others in proptest::collection::vec(0u8..20, 0..6),
        ) {
            let now = 5;
            let mut pool = Pool::new(count, 0);
            let BorrowPlan::Take { update, .. } = pool.plan_borrow(digest(200), 100, now, None) else {
                return Ok(());
            };
            pool = pool.apply(&update).unwrap();
            let (_, give_back) = pool.plan_return(digest(200), now).unwrap();
            for who in others {
                if let BorrowPlan::Take { update, .. } = pool.plan_borrow(digest(who), 100, now, None) {
                    pool = pool.apply(&update).unwrap();
                }
            }
            let before = pool.leases.len();
            let after = pool.apply(&give_back).expect("a return never conflicts with other slots");
            prop_assert_eq!(after.leases.len(), before - 1);
            prop_assert!(after.live_lease(digest(200), now).is_none());
        }
    }
}
