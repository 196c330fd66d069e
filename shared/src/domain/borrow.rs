//! A newcomer's borrow: take a free slot, join the queue, or be refused.

use super::{
    Change, Expect, GiveUp, Holder, Lease, Pool, Ticket, Update, MAX_HAND_OFFS, MAX_PRUNE,
};

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

impl Pool {
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
        match self.given_up_of(digest) {
            Some(given_up) if given_up.is_live(now_ms) => return BorrowPlan::Cancelled,
            Some(given_up) => {
                update.expect.push(Expect::GivenUpIs(given_up));
                update.changes.push(Change::ForgetGivenUp(digest));
            }
            None => update.expect.push(Expect::NotGivenUp(digest)),
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
            return self.plan_take(update, holder, stale, &free, live_waiters, now_ms);
        }
        if live_waiters >= max_waiters {
            return BorrowPlan::Full;
        }
        self.plan_join(update, holder, give_up_ms, stale, max_waiters, now_ms)
    }

    /// A newcomer's take of the lowest of the `free` positions (more are free
    /// than the `live_waiters` are owed), on top of `update` (the conditions
    /// its plan has so far); an expired lease of its own (`stale`) is freed.
    /// With more than [`MAX_HAND_OFFS`] live tickets, the hand-off of free
    /// slots to the first of them comes first.
    fn plan_take(
        &self,
        mut update: Update,
        holder: Holder,
        stale: Option<Lease>,
        free: &[u16],
        live_waiters: usize,
        now_ms: u64,
    ) -> BorrowPlan {
        if live_waiters == 0 {
            if self.queue.len() > MAX_PRUNE {
                return BorrowPlan::Prune(self.prune_front(now_ms));
            }
            // Every ticket is dead: they leave with this take.
            let dead = self.remove_tickets((0..self.queue.len()).collect());
            update.expect.extend(dead.expect);
            update.changes.extend(dead.changes);
        }
        if live_waiters > MAX_HAND_OFFS {
            // The conditions below would be one per owed slot, past what one
            // DynamoDB condition may hold on a split pool: hand the first of
            // them on (as the queue's head would), then plan again.
            if let Some(serve) = self.plan_serve(now_ms) {
                return BorrowPlan::Prune(serve);
            }
        }
        let position = free[0];
        // The queue is not pinned: a borrower whose join lands between this
        // read and this write had not joined when this take began, so either
        // may go first, and the slot's own condition keeps the take off a
        // slot handed on meanwhile. Pinning the queue's length made every join
        // fail the takes in flight (half the takes lost with room to spare).
        // Only a twin request's ticket for this holder must not be there.
        update.expect.push(Expect::NotQueued(holder));
        // The slots the live tickets it saw are owed stay free (as read): a
        // take in flight from before they joined may land first, and this
        // one, which started after they joined, must not then leave them
        // short.
        for &owed in &free[1..=live_waiters] {
            update.expect.push(self.slot_as_read(owed));
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
        BorrowPlan::Take { update, position }
    }

    /// A newcomer's join at the end of the queue (fewer than `max_waiters`
    /// live tickets wait), on top of `update`, or the prune of dead tickets
    /// that fill it first; an expired lease of its own (`stale`) is freed.
    fn plan_join(
        &self,
        mut update: Update,
        holder: Holder,
        give_up_ms: u64,
        stale: Option<Lease>,
        max_waiters: usize,
        now_ms: u64,
    ) -> BorrowPlan {
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
            give_up: GiveUp::Seconds(give_up_ms.div_ceil(1000)),
        }));
        BorrowPlan::Join(update)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ConditionFailed, TICKET_GRACE_MS};
    use super::*;

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
    fn fences_rise_with_every_grant_from_the_creation_time() {
        let mut pool = Pool::new(2, 5999);
        borrow(&mut pool, 1, 100, 5);
        borrow(&mut pool, 2, 100, 5);
        give_back(&mut pool, 1, 6);
        borrow(&mut pool, 3, 100, 6);
        let fences: Vec<u64> = pool.leases().iter().map(|l| l.fence).collect();
        assert_eq!(fences, vec![6002, 6001]);
    }

    #[test]
    fn an_expired_position_is_reused_by_the_write_that_takes_it() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 50, 0);
        borrow(&mut pool, 2, 100, 0);
        assert_eq!(borrow(&mut pool, 3, 200, 49), None);
        let BorrowPlan::Take { update, position } = pool.plan_borrow(h(3, 200), 50, 50, WAITERS)
        else {
            panic!()
        };
        assert_eq!(position, 0);
        assert!(update
            .expect
            .iter()
            .any(|e| matches!(e, Expect::SlotStamp { position: 0, .. })));
        pool = pool.apply(&update).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(3)));
    }

    #[test]
    fn newcomers_wait_behind_live_tickets_and_dead_ones_leave() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        join(&mut pool, 2, 100, 5_000, 0);
        // A slot expired and a live ticket waits: a newcomer joins behind it.
        assert!(matches!(
            pool.plan_borrow(h(4, 100), 30_000, 200, WAITERS),
            BorrowPlan::Join(_)
        ));
        // A dead ticket (past its give-up and grace) holds no place: a newcomer
        // takes the free slot and the dead ticket leaves in the same write.
        let now = 5_000 + TICKET_GRACE_MS;
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(5, 100), now, now, WAITERS) else {
            panic!()
        };
        assert!(update.expect.contains(&Expect::TicketAt {
            index: 0,
            holder: h(2, 100)
        }));
        pool = pool.apply(&update).unwrap();
        assert!(pool.queue().is_empty());
        assert_eq!(holder_at(&pool, 0), Some(d(5)));
    }

    #[test]
    fn a_join_does_not_fail_a_racing_take_but_a_twin_ticket_does() {
        let mut pool = Pool::new(2, 0);
        let BorrowPlan::Take { update, position } = pool.plan_borrow(h(1, 100), 0, 0, WAITERS)
        else {
            panic!()
        };
        assert_eq!(position, 0);
        // Another borrower joins between the take's read and its write (it
        // lost a take of its own): the take still lands on its free slot.
        join(&mut pool, 2, 100, 500, 0);
        let taken = pool.apply(&update).unwrap();
        assert_eq!(holder_at(&taken, 0), Some(d(1)));
        assert_eq!(taken.queue().len(), 1);
        // A twin request of the same lease id that joined meanwhile fails it.
        join(&mut pool, 1, 100, 500, 0);
        assert_eq!(
            pool.apply(&update),
            Err(ConditionFailed(Expect::NotQueued(h(1, 100))))
        );
        // So does another take of the slot.
        let mut raced = Pool::new(2, 0);
        borrow(&mut raced, 3, 100, 0);
        assert_eq!(
            raced.apply(&update),
            Err(ConditionFailed(Expect::SlotFree(0)))
        );
    }

    #[test]
    fn a_take_keeps_the_slots_owed_to_the_waiters_it_saw() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 2, 50, 0);
        // An older take, planned before anyone waited, is still in flight.
        let BorrowPlan::Take { update: older, .. } = pool.plan_borrow(h(3, 100), 0, 0, WAITERS)
        else {
            panic!()
        };
        // A borrower joins, and the lease at position 0 expires.
        join(&mut pool, 4, 100, 5_000, 10);
        // A newcomer sees two free slots and one waiter: it may take one.
        let BorrowPlan::Take {
            update: newer,
            position,
        } = pool.plan_borrow(h(5, 100), 60, 60, WAITERS)
        else {
            panic!()
        };
        assert_eq!(position, 0);
        // The older take lands first, on the slot the waiter is owed: the
        // newcomer, which started after the waiter joined, must not leave
        // it without one.
        let pool = pool.apply(&older).unwrap();
        assert_eq!(
            pool.apply(&newer),
            Err(ConditionFailed(Expect::SlotFree(1)))
        );
    }

    #[test]
    fn a_take_past_many_waiters_first_hands_their_slots_on() {
        let waiters = MAX_HAND_OFFS as u8 + 4;
        let mut pool = Pool::new(u16::from(waiters) + 2, 0).split_above(0);
        for n in 0..waiters {
            join(&mut pool, n, 100, 5_000, 0);
        }
        // More slots are free than tickets wait: a borrower that may not wait
        // takes one, but first the first 16 tickets are served.
        let BorrowPlan::Prune(serve) = pool.plan_borrow(h(99, 100), 0, 1, WAITERS) else {
            panic!()
        };
        pool = landed(&pool, &serve).unwrap();
        assert_eq!(pool.waiting(1), usize::from(waiters) - MAX_HAND_OFFS);
        let BorrowPlan::Take { update, position } = pool.plan_borrow(h(99, 100), 0, 1, WAITERS)
        else {
            panic!()
        };
        assert_eq!(usize::from(position), MAX_HAND_OFFS);
        let (lowered, _) = pool.lower(&update);
        let owed = lowered
            .expect
            .iter()
            .filter(|e| matches!(e, Expect::Cold { .. } | Expect::SlotFree(_)))
            .count();
        // Its own slot and the four the waiters left are owed.
        assert_eq!(owed, 1 + 4);
        pool = pool.apply(&lowered).unwrap();
        assert_eq!(holder_at(&pool, MAX_HAND_OFFS), Some(d(99)));
    }

    #[test]
    fn an_idempotent_borrow_answers_the_held_lease_and_a_twin_waits_on_the_queued_ticket() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        assert!(matches!(
            pool.plan_borrow(h(1, 100), 0, 10, WAITERS),
            BorrowPlan::Held(l) if l.position == 0
        ));
        join(&mut pool, 2, 300, 10_000, 10);
        assert_eq!(
            pool.plan_borrow(h(2, 999), 10_000, 11, WAITERS),
            BorrowPlan::Queued(h(2, 300))
        );
        // The same holder cannot be queued or held twice.
        let mut twin = pool.clone();
        twin.queue.clear();
        let BorrowPlan::Join(again) = twin.plan_borrow(h(2, 300), 10_000, 11, WAITERS) else {
            panic!()
        };
        assert_eq!(
            pool.apply(&again),
            Err(ConditionFailed(Expect::NotQueued(h(2, 300))))
        );
    }

    #[test]
    fn a_queue_at_its_cap_refuses_or_prunes_dead_tickets_first() {
        let mut pool = Pool::new(0, 0);
        for n in 0..3 {
            pool = match pool.plan_borrow(h(n, 100), 1_000, 0, 3) {
                BorrowPlan::Join(update) => pool.apply(&update).unwrap(),
                other => panic!("{other:?}"),
            };
        }
        assert_eq!(pool.plan_borrow(h(9, 100), 1_000, 0, 3), BorrowPlan::Full);
        let later = 1_000 + TICKET_GRACE_MS;
        let BorrowPlan::Prune(prune) = pool.plan_borrow(h(9, 100), later + 1_000, later, 3) else {
            panic!()
        };
        pool = pool.apply(&prune).unwrap();
        assert!(pool.queue().is_empty());
    }
}
