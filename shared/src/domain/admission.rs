//! Async mode's line: ticket numbers, admission from the backlog,
//! listing, settling.

use super::{
    Change, Expect, GiveUp, Holder, Lease, LeaseDigest, Pool, Ticket, TicketGrant, TicketItem,
    Update, MAX_PRUNE,
};

/// Most backlog tickets one admission appends (the expression limit again).
pub const MAX_ADMITS: usize = 16;

/// A ticket number with no ticket item is passed by admission once a ticket
/// numbered after it was written this long ago: longer than any request
/// lives behind API Gateway (30 s), so the missing write has landed or never
/// will.
pub const GAP_MS: u64 = 60_000;

/// Most async tickets a pool lists at once (in its queue, or granted and not
/// yet recorded by the dispatcher): admission waits while the list is full.
/// Only admission lists, one at a time (each is conditioned on the first
/// number not yet admitted, as read), so its read of the list is exact.
pub const MAX_LISTED: usize = 32;

impl Pool {
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
            .filter(|t| self.listed_number(t.holder.digest).is_some())
            .count();
        if asyncs > window / 2 {
            return 0;
        }
        max_waiters.saturating_sub(self.queue.len()).min(MAX_ADMITS)
    }

    /// Whether the write that left this pool, planned from `before`, left
    /// the dispatcher work that no grant of its names: room in the line for
    /// admission that `before` had not, or a slot it left free with nobody
    /// in the line while tickets wait in the backlog, or free slots owed to
    /// async tickets in the queue (a resize up) that `before` did not owe.
    pub fn dispatch_due_since(
        &self,
        before: &Pool,
        max_waiters: usize,
        window: usize,
        now_ms: u64,
    ) -> bool {
        let admission = self.admission_room(max_waiters, window) > 0
            && (before.admission_room(max_waiters, window) == 0
                || (self.slot_idle(now_ms) && !before.slot_idle(now_ms)));
        admission || (self.owes_async(now_ms) && !before.owes_async(now_ms))
    }

    /// Free slots owed to the queue, an async ticket in it: the
    /// dispatcher's to hand on ([`Pool::plan_serve`]).
    fn owes_async(&self, now_ms: u64) -> bool {
        self.queue
            .iter()
            .any(|t| self.listed_number(t.holder.digest).is_some())
            && self.plan_serve(now_ms).is_some()
    }

    /// A slot free and nobody in the line to hand it to.
    fn slot_idle(&self, now_ms: u64) -> bool {
        let state = self.state(now_ms);
        state.available > state.waiting
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
            .filter(|t| self.listed_number(t.holder.digest).is_some())
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
                        let listed = self.line.listed.len() + listing;
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
            // A sync borrower reads for itself (and holds its place a grace
            // longer); an async ticket is never granted past its wait.
            let give_up = match item.callback {
                Some(_) => GiveUp::Exact(item.wait_until_ms),
                None => GiveUp::Seconds(item.wait_until_ms.div_ceil(1000)),
            };
            update.changes.push(Change::Append(Ticket {
                holder: item.holder,
                give_up,
            }));
            if item.callback.is_some() {
                update
                    .changes
                    .push(Change::SetListed(item.digest(), item.number));
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

    /// Whether this pool, written from `before`, holds a grant to a listed
    /// async ticket that `before` did not: the write handed it a slot, and
    /// its delivery can start at once.
    pub fn granted_async_since(&self, before: &Pool) -> bool {
        !self.async_grants_since(before).is_empty()
    }

    /// The grants to listed async tickets that this pool, written from
    /// `before`, holds and `before` did not: each ticket's lease digest and
    /// its grant, in listing order.
    pub fn async_grants_since(&self, before: &Pool) -> Vec<(LeaseDigest, TicketGrant)> {
        self.line
            .listed
            .iter()
            .filter_map(|(digest, _)| {
                let now = self.lease_of(*digest)?;
                let old = before.lease_of(*digest).map(|l| l.fence);
                (old != Some(now.fence)).then(|| (*digest, TicketGrant::of(&now)))
            })
            .collect()
    }

    /// The grants to listed async tickets made by the write that left this
    /// pool, which took its last `fences` fences: each ticket's lease digest
    /// and its grant, in listing order. Not [`Pool::async_grants_since`] the
    /// writer's read: a write conditioned on less than the whole item lands
    /// after others that granted since that read, and their grants are
    /// their writers' to deliver.
    pub fn async_grants_of_write(&self, fences: u64) -> Vec<(LeaseDigest, TicketGrant)> {
        let end = self.base_us.saturating_add(self.next_fence);
        let start = end.saturating_sub(fences);
        self.line
            .listed
            .iter()
            .filter_map(|(digest, _)| {
                let lease = self.lease_of(*digest)?;
                (start..end)
                    .contains(&lease.fence)
                    .then(|| (*digest, TicketGrant::of(&lease)))
            })
            .collect()
    }

    /// Unlists an async ticket (its grant recorded, or it left the queue),
    /// conditioned on its listing.
    pub fn plan_unlist(&self, digest: LeaseDigest) -> Option<Update> {
        self.plan_unlist_all(&[digest])
    }

    /// Unlists those of the async tickets of `digests` that are listed, in
    /// one write, each conditioned on its number or on its absence: steps
    /// that run at once find the same tickets ended, and one that unlisted
    /// some first must not make the others' writes lose (each loss cost a
    /// reread of the round's tickets and another write). Only a ticket of
    /// the same lease id listed again, with another number, makes it lose.
    /// `None` when none is listed.
    pub fn plan_unlist_all(&self, digests: &[LeaseDigest]) -> Option<Update> {
        let mut update = Update::default();
        for &digest in digests {
            if let Some(number) = self.listed_number(digest) {
                if !update.changes.contains(&Change::RemoveListed(digest)) {
                    update.expect.push(Expect::ListedIsOrNot(digest, number));
                    update.changes.push(Change::RemoveListed(digest));
                }
            }
        }
        (!update.changes.is_empty()).then_some(update)
    }

    /// Takes out dead sync tickets (at most [`MAX_PRUNE`]) of a queue that holds
    /// `max_waiters` tickets or more while tickets wait in the backlog: dead
    /// sync waiters (their requests gone without a cancel) would otherwise
    /// keep admission out until some borrower's write pruned them. `None`
    /// when the queue has room, or nothing dead.
    pub fn plan_prune_for_backlog(&self, now_ms: u64, max_waiters: usize) -> Option<Update> {
        if !self.line.has_backlog() || self.queue.len() < max_waiters {
            return None;
        }
        // Listed (async) tickets are the step's to end, `expired`, and unlist.
        let dead: Vec<usize> = (0..self.queue.len())
            .filter(|&i| {
                let ticket = &self.queue[i];
                !ticket.is_live(now_ms) && self.listed_number(ticket.holder.digest).is_none()
            })
            .take(MAX_PRUNE)
            .collect();
        (!dead.is_empty()).then(|| self.remove_tickets(dead))
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
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{BorrowPlan, TicketState};
    use super::*;

    #[test]
    fn a_backlog_sends_newcomers_to_it_and_is_admitted_in_number_order() {
        let now = 1_000_000;
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 60_000, now);
        number(&mut pool, 3);
        assert!(pool.line().has_backlog());
        // Nobody takes or joins ahead of the backlog.
        assert_eq!(
            pool.plan_borrow(h(9, 1_000), now + 5_000, now, WAITERS),
            BorrowPlan::Backlog
        );
        // Ticket 1 ended (cancelled) before admission: stepped over.
        let mut cancelled = backlog_item(3, 1, now, true);
        cancelled.state = TicketState::Cancelled;
        let backlog = [
            backlog_item(2, 0, now, true),
            cancelled,
            backlog_item(4, 2, now, false),
        ];
        let update = pool.plan_admit(&backlog, now, WAITERS, 32).expect("admits");
        // Planned against an old `admitted`, it fails once another admission landed.
        let admitted = pool.apply(&update).expect("holds");
        assert!(admitted.apply(&update).is_err(), "admits once");
        pool = admitted;
        let queued: Vec<LeaseDigest> = pool.queue().iter().map(|t| t.holder.digest).collect();
        assert_eq!(queued, [d(2), d(4)]);
        assert_eq!(pool.listed_number(d(2)), Some(0));
        assert_eq!(
            pool.listed_number(d(4)),
            None,
            "a sync ticket is not listed"
        );
        assert!(!pool.line().has_backlog());
        // A return hands the slot to the first admitted ticket, the async one.
        let admitted_before_return = pool.clone();
        assert!(!admitted_before_return.granted_async_since(&Pool::new(1, 0)));
        assert!(give_back(&mut pool, 1, now));
        assert_eq!(pool.grant_of(&h(2, 1_000)).map(|l| l.position), Some(0));
        assert!(pool.granted_async_since(&admitted_before_return));
        let granted = pool.async_grants_since(&admitted_before_return);
        assert_eq!(granted.len(), 1, "the one ticket handed a slot");
        assert_eq!((granted[0].0, granted[0].1.position), (d(2), 0));
        assert!(!pool.granted_async_since(&pool), "nothing new");
        assert_eq!(pool.async_grants_of_write(1), granted, "the return's own");
        assert!(
            pool.async_grants_of_write(0).is_empty(),
            "a write without fences"
        );
        let unlist = pool.plan_unlist(d(2)).expect("listed");
        pool = pool.apply(&unlist).expect("holds");
        assert_eq!(pool.listed_number(d(2)), None);
    }

    #[test]
    fn dead_waiters_that_fill_the_queue_are_pruned_for_the_backlog() {
        let now = 1_000_000;
        let mut pool = Pool::new(0, 0);
        // Two sync waiters whose requests died: dead a second past their wait.
        for n in 1..=2 {
            let plan = pool.plan_borrow(h(n, 1_000), now + 1_000, now, WAITERS);
            let BorrowPlan::Join(update) = plan else {
                panic!("{plan:?}");
            };
            pool = pool.apply(&update).expect("joins");
        }
        assert_eq!(pool.plan_prune_for_backlog(now, 2), None, "no backlog");
        number(&mut pool, 1);
        let later = now + 10_000;
        assert_eq!(pool.admission_room(2, 16), 0, "full of dead tickets");
        assert_eq!(pool.plan_prune_for_backlog(now, 2), None, "still live");
        assert_eq!(pool.plan_prune_for_backlog(later, 3), None, "room left");
        let prune = pool
            .plan_prune_for_backlog(later, 2)
            .expect("dead, and in the way");
        let pruned = pool.apply(&prune).expect("holds");
        assert!(pruned.queue().is_empty());
        assert_eq!(pruned.admission_room(2, 16), 2);
        // A listed (async) ticket is the step's to end and unlist: left in.
        let mut listed = pool.clone();
        listed.line.listed = vec![(h(1, 1_000).digest, 0)];
        let prune = listed
            .plan_prune_for_backlog(later, 2)
            .expect("the sync one");
        let pruned = listed.apply(&prune).expect("holds");
        assert_eq!(pruned.queue().len(), 1);
        assert_eq!(pruned.queue()[0].holder, h(1, 1_000));
    }

    #[test]
    fn ended_tickets_leave_the_list_in_one_write_conditioned_on_their_numbers() {
        let mut pool = Pool::new(0, 0);
        pool.line.listed = vec![(d(1), 4), (d(2), 5), (d(3), 6)];
        assert_eq!(pool.plan_unlist_all(&[d(9)]), None, "none listed");
        let update = pool
            .plan_unlist_all(&[d(1), d(3), d(9), d(3)])
            .expect("listed");
        assert_eq!(
            update.expect,
            vec![
                Expect::ListedIsOrNot(d(1), 4),
                Expect::ListedIsOrNot(d(3), 6)
            ]
        );
        let after = pool.apply(&update).expect("holds");
        assert_eq!(after.line().listed, vec![(d(2), 5)]);
        // Another dispatcher unlisted one of them first: the write still
        // lands, and unlists the rest.
        let mut moved = pool.clone();
        moved.line.listed.retain(|(digest, _)| *digest != d(3));
        let after = moved.apply(&update).expect("holds");
        assert_eq!(after.line().listed, vec![(d(2), 5)]);
        // The same lease id listed again under another number (a later
        // ticket of it): not this write's to remove, and it loses.
        let mut again = moved.clone();
        again.line.listed.push((d(3), 7));
        assert!(again.apply(&update).is_err());
    }

    #[test]
    fn admission_waits_for_a_missing_number_until_a_later_ticket_is_old() {
        let now = 1_000_000;
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 60_000, now);
        number(&mut pool, 2);
        // Number 0 was taken, its ticket not (yet) written; 1 is there.
        let backlog = [backlog_item(2, 1, now, true)];
        assert_eq!(
            pool.plan_admit(&backlog, now + GAP_MS - 1, WAITERS, 32),
            None,
            "waits for 0"
        );
        let update = pool
            .plan_admit(&backlog, now + GAP_MS, WAITERS, 32)
            .expect("passes 0 once 1 is old");
        pool = pool.apply(&update).expect("holds");
        assert_eq!(pool.queue().len(), 1);
        assert_eq!(pool.line().admitted, 2);
    }

    #[test]
    fn admission_keeps_to_the_window_and_the_queue_bound() {
        let now = 1_000_000;
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 60_000, now);
        number(&mut pool, 5);
        let backlog: Vec<TicketItem> = (0..5u8)
            .map(|i| backlog_item(10 + i, u64::from(i), now, true))
            .collect();
        let update = pool.plan_admit(&backlog, now, WAITERS, 2).expect("admits");
        pool = pool.apply(&update).expect("holds");
        assert_eq!(pool.queue().len(), 2, "two async tickets at once");
        assert_eq!(pool.line().admitted, 2);
        assert_eq!(
            pool.plan_admit(&backlog[2..], now, WAITERS, 2),
            None,
            "window full"
        );
        let update = pool.plan_admit(&backlog[2..], now, 3, 32).expect("admits");
        pool = pool.apply(&update).expect("holds");
        assert_eq!(pool.queue().len(), 3, "no more than max_waiters");
    }

    #[test]
    fn a_write_that_leaves_the_line_short_makes_admission_due() {
        let now = 1_000_000;
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 60_000, now);
        number(&mut pool, 3);
        let backlog: Vec<TicketItem> = (0..3u8)
            .map(|i| backlog_item(10 + i, u64::from(i), now, true))
            .collect();
        let update = pool.plan_admit(&backlog, now, WAITERS, 2).expect("admits");
        pool = pool.apply(&update).expect("holds");
        // Two in line (more than half the window of 2), one in the backlog.
        assert_eq!(pool.admission_room(WAITERS, 2), 0);
        let full = pool.clone();
        // A return hands the slot to the first: one left in line, room.
        assert!(give_back(&mut pool, 1, now));
        assert!(pool.dispatch_due_since(&full, WAITERS, 2, now), "crossed");
        // A write from a read that had the room already: not again, while
        // every slot is held.
        assert!(!pool.dispatch_due_since(&pool, WAITERS, 2, now));
        // A write that leaves a slot free with nobody in line to take it, a
        // backlog waiting: due, though its read had the room already.
        let mut idle = pool.clone();
        assert!(give_back(&mut idle, 10, now));
        let before = idle.clone();
        assert!(give_back(&mut idle, 11, now));
        assert_eq!((idle.queue().len(), idle.state(now).available), (0, 1));
        assert!(
            idle.dispatch_due_since(&before, WAITERS, 2, now),
            "a slot idle"
        );
        // From a read that had it idle already: the write that made it so woke.
        assert!(!idle.dispatch_due_since(&idle, WAITERS, 2, now));
        // No backlog: nothing to admit.
        assert!(!Pool::new(1, 0).dispatch_due_since(&full, WAITERS, 2, now));
        // A resize up leaves a slot free for the async ticket in line (no
        // backlog left): owed to it, the dispatcher's to hand on.
        let mut grown = Pool::new(1, 0);
        borrow(&mut grown, 1, 60_000, now);
        number(&mut grown, 1);
        let update = grown
            .plan_admit(&[backlog_item(10, 0, now, true)], now, WAITERS, 2)
            .expect("admits");
        grown = grown.apply(&update).expect("holds");
        let before = grown.clone();
        assert!(!before.dispatch_due_since(&before, WAITERS, 2, now));
        grown = grown
            .apply(&grown.plan_resize(2, now).expect("grows"))
            .expect("holds");
        assert!(grown.dispatch_due_since(&before, WAITERS, 2, now), "owed");
        assert!(!grown.dispatch_due_since(&grown, WAITERS, 2, now));
    }
}
