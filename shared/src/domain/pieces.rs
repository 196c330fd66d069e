//! Conditions and changes several operations share: the queue's head, a
//! slot or tickets as read, a slot's reuse, pruning dead tickets and stale
//! memories.

use super::{Change, Ended, Expect, LeaseDigest, Pool, Slot, Update, SHORT_GRANT_MS};

/// Most dead tickets, stale tombstones or trailing free slots one write
/// removes, so that every expression stays far below DynamoDB's 4 KB limit;
/// more take more writes.
pub const MAX_PRUNE: usize = 32;

impl Pool {
    /// The condition that `position` is as read: free, or held by the
    /// (expired) grant with its stamp.
    pub(super) fn slot_as_read(&self, position: u16) -> Expect {
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
    pub(super) fn reuse(&self, position: u16, now_ms: u64, update: &mut Update) {
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

    /// Index of the first live ticket, and the dead ones before it (at most
    /// [`MAX_PRUNE`]; `None` when more dead ones come first).
    pub(super) fn head(&self, now_ms: u64) -> Option<(Option<usize>, usize)> {
        let first_live = self.queue.iter().position(|t| t.is_live(now_ms));
        let dead_before = first_live.unwrap_or(self.queue.len());
        (dead_before <= MAX_PRUNE).then_some((first_live, dead_before))
    }

    /// Conditions that the first `n` tickets are as read (dead ones about
    /// to leave the queue).
    pub(super) fn tickets_as_read(&self, n: usize) -> impl Iterator<Item = Expect> + '_ {
        self.queue[..n]
            .iter()
            .enumerate()
            .map(|(index, t)| Expect::TicketAt {
                index,
                holder: t.holder,
            })
    }

    /// Takes out up to [`MAX_PRUNE`] dead tickets from the front.
    pub(super) fn prune_front(&self, now_ms: u64) -> Update {
        let dead = self
            .queue
            .iter()
            .take_while(|t| !t.is_live(now_ms))
            .count()
            .min(MAX_PRUNE);
        self.remove_tickets((0..dead).collect())
    }

    /// Removes the tickets at `indices`, each conditioned on being there.
    pub(super) fn remove_tickets(&self, indices: Vec<usize>) -> Update {
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

    /// Drops the unbounded map of ended grants an older version stored.
    pub(super) fn drop_legacy(&self, update: &mut Update) {
        if self.legacy_ended && !update.changes.contains(&Change::DropLegacyEnded) {
            update.changes.push(Change::DropLegacyEnded);
        }
    }

    /// Takes out up to [`MAX_PRUNE`] stale tombstones (but `keep`'s, which
    /// the caller overwrites) and ended grants no waiter can need any more,
    /// each conditioned on being as read.
    pub(super) fn prune_given_up(&self, now_ms: u64, keep: Option<LeaseDigest>) -> Update {
        let mut update = Update::default();
        self.drop_legacy(&mut update);
        for given_up in self
            .given_up
            .iter()
            .filter(|t| !t.is_live(now_ms) && Some(t.digest) != keep)
            .take(MAX_PRUNE)
        {
            update.expect.push(Expect::GivenUpIs(*given_up));
            update.changes.push(Change::ForgetGivenUp(given_up.digest));
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
}
