//! A waiter's read: its grant or its place; the free slots handed to the
//! queue's head; a cancel.

use super::{Change, Expect, Holder, Lease, Pool, Update, MAX_PRUNE, TICKET_GRACE_MS};

/// Most slots one write hands to waiting tickets (when several free at
/// once), for the expression limit that [`MAX_PRUNE`] keeps to; the next
/// read hands the rest.
pub const MAX_HAND_OFFS: usize = 16;

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

impl Pool {
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
    pub(super) fn hand_off(&self, position: u16, now_ms: u64) -> Option<Update> {
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
    /// go in one write (handing them one by one would grant a higher
    /// position while a lower one is still free). When the first tickets are
    /// all live, the `i`-th slot goes to whoever is `i`-th in line when the
    /// write lands, as a return's hand-off does, so a return that serves the
    /// head meanwhile does not make it fail: it expects only that no ticket
    /// it serves has died. Otherwise it expects every ticket up to the last
    /// one served as read (the dead ones leave with it).
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
            // The head as the write finds it must still be live: a return
            // hands on conditioned on its own lease alone, but this write
            // comes from a reader, and the ticket it reads first may leave
            // (a cancel) for a dead one behind it.
            let mut update = self.hand_off(*free.first()?, now_ms)?;
            update.expect.push(Expect::TicketLiveAt {
                index: first,
                now_ms,
            });
            return Some(update);
        }
        let last = served[served.len() - 1];
        let mut update = Update::default();
        if last + 1 == served.len() {
            update
                .expect
                .extend((0..=last).map(|index| Expect::TicketLiveAt { index, now_ms }));
        } else {
            update.expect.extend(self.tickets_as_read(last + 1));
        }
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
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::ReturnPlan;
    use super::*;

    #[test]
    fn a_return_without_waiters_frees_and_a_late_joiner_hands_it_to_itself() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        let ReturnPlan::Return(_, free) = pool.plan_return(d(1), 1) else {
            panic!()
        };
        assert_eq!(free.changes, vec![Change::Free(0)]);
        // A borrower that read the pool full joins before the return lands.
        join(&mut pool, 2, 100, 10_000, 1);
        pool = pool
            .apply(&free)
            .expect("a free conditions on its lease alone");
        // The joiner sees the free slot on its next read and hands it to the head.
        let WaitPlan::Waiting {
            needed: 0,
            duty: Some(duty),
            ..
        } = pool.plan_wait(&h(2, 100), 1, 2)
        else {
            panic!("{:?}", pool.plan_wait(&h(2, 100), 1, 2))
        };
        pool = pool.apply(&duty).unwrap();
        assert!(
            matches!(pool.plan_wait(&h(2, 100), 1, 3), WaitPlan::Granted(l) if l.position == 0)
        );
    }

    #[test]
    fn readers_hand_the_slots_of_a_raise_to_the_queue_in_order() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 1000, 0);
        for n in 2..=4 {
            join(&mut pool, n, 500, 10_000, 0);
        }
        pool = pool.apply(&pool.plan_resize(3, 1).unwrap()).unwrap();
        assert_eq!(pool.slots().len(), 3);
        // Two slots free: the readers one and two places from the front are
        // each owed one, and each plans the one write that serves both; the
        // third waits.
        let WaitPlan::Waiting {
            duty: Some(first), ..
        } = pool.plan_wait(&h(2, 500), 0, 2)
        else {
            panic!()
        };
        let WaitPlan::Waiting {
            duty: Some(second), ..
        } = pool.plan_wait(&h(3, 500), 0, 2)
        else {
            panic!()
        };
        assert_eq!(
            first, second,
            "every reader owed a slot plans the same write"
        );
        assert!(matches!(
            pool.plan_wait(&h(4, 500), 0, 2),
            WaitPlan::Waiting {
                ahead: 2,
                needed: 1,
                duty: None,
                ..
            }
        ));
        // Whichever lands first serves the first two in line, lowest position
        // first, with the next two fences; the other then fails its conditions.
        let fence = pool.next_fence;
        pool = pool.apply(&second).unwrap();
        assert!(pool.apply(&first).is_err());
        assert_eq!(
            (holder_at(&pool, 1), holder_at(&pool, 2)),
            (Some(d(2)), Some(d(3)))
        );
        let fences: Vec<u64> = pool.leases()[1..]
            .iter()
            .map(|l| l.fence - pool.base_us)
            .collect();
        assert_eq!(fences, [fence, fence + 1]);
        assert_eq!(pool.queue().len(), 1);
    }

    #[test]
    fn several_slots_go_to_whoever_is_in_line_when_the_write_lands() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 1000, 0);
        borrow(&mut pool, 2, 1000, 0);
        for n in 3..=5 {
            join(&mut pool, n, 500, 10_000, 0);
        }
        pool = pool.apply(&pool.plan_resize(4, 1).unwrap()).unwrap();
        // The head reads two slots free (2 and 3) and plans to serve 3 and 4.
        let WaitPlan::Waiting {
            ahead: 0,
            duty: Some(duty),
            ..
        } = pool.plan_wait(&h(3, 500), 0, 2)
        else {
            panic!()
        };
        assert!(
            !duty
                .expect
                .iter()
                .any(|e| matches!(e, Expect::TicketAt { .. })),
            "it names no ticket: {duty:?}"
        );
        // Meanwhile a return hands its own slot (the lowest free) to the head.
        let ReturnPlan::Return(_, back) = pool.plan_return(d(1), 3) else {
            panic!()
        };
        pool = pool.apply(&back).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(3)));
        // The waiter's write still lands: the next two in line, in order.
        let fence = pool.next_fence;
        pool = pool.apply(&duty).expect("a return does not make it fail");
        assert_eq!(
            (holder_at(&pool, 2), holder_at(&pool, 3)),
            (Some(d(4)), Some(d(5)))
        );
        let fences: Vec<u64> = pool.leases()[2..]
            .iter()
            .map(|l| l.fence - pool.base_us)
            .collect();
        assert_eq!(fences, [fence, fence + 1], "rising in queue order");
        assert!(pool.queue().is_empty());
    }

    #[test]
    fn several_slots_go_only_to_tickets_live_by_the_planners_clock() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100_000, 0);
        join(&mut pool, 2, 500, 60_000, 0);
        join(&mut pool, 3, 500, 60_000, 0);
        // Gives up at 2 s, dead from 3 s: live at the read, third in line.
        join(&mut pool, 4, 500, 2_000, 0);
        pool = pool.apply(&pool.plan_resize(3, 1).unwrap()).unwrap();
        let WaitPlan::Waiting {
            duty: Some(duty), ..
        } = pool.plan_wait(&h(2, 500), 0, 2_999)
        else {
            panic!()
        };
        // Ticket 2 cancels meanwhile: ticket 4 would be second in line.
        pool = pool.apply(&pool.plan_cancel(&h(2, 500)).unwrap()).unwrap();
        assert!(pool.apply(&duty).is_ok(), "live when planned, at 2,999 ms");
        let late = Update {
            expect: duty
                .expect
                .iter()
                .map(|e| match *e {
                    Expect::TicketLiveAt { index, .. } => Expect::TicketLiveAt {
                        index,
                        now_ms: 3_000,
                    },
                    other => other,
                })
                .collect(),
            changes: duty.changes.clone(),
        };
        assert!(pool.apply(&late).is_err(), "dead at 3,000 ms: {late:?}");
    }

    #[test]
    fn a_waiters_hand_off_never_serves_a_dead_ticket_that_a_cancel_moved_first() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 50, 0);
        join(&mut pool, 2, 500, 60_000, 0);
        // Gave up at 1 s: dead from 2 s.
        join(&mut pool, 3, 500, 1_000, 0);
        // Slot 0 expired; the head reads and plans to hand it on.
        let WaitPlan::Waiting {
            ahead: 0,
            duty: Some(duty),
            ..
        } = pool.plan_wait(&h(2, 500), 0, 2_500)
        else {
            panic!()
        };
        // Another request of its borrower cancels the head's ticket: the
        // dead ticket is now first in line.
        pool = pool.apply(&pool.plan_cancel(&h(2, 500)).unwrap()).unwrap();
        assert!(pool.apply(&duty).is_err(), "{duty:?}");
    }

    #[test]
    fn the_head_hands_itself_an_expired_slot() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 50, 0);
        join(&mut pool, 2, 500, 10_000, 0);
        assert_eq!(pool.nth_expiry(1, 10), Some(50));
        assert!(matches!(
            pool.plan_wait(&h(2, 500), 0, 49),
            WaitPlan::Waiting {
                needed: 1,
                duty: None,
                ..
            }
        ));
        let WaitPlan::Waiting {
            duty: Some(duty), ..
        } = pool.plan_wait(&h(2, 500), 0, 50)
        else {
            panic!()
        };
        pool = pool.apply(&duty).unwrap();
        assert_eq!(pool.live_lease(d(2), 51).map(|l| l.position), Some(0));
    }

    #[test]
    fn hand_offs_skip_dead_tickets_conditioned_on_them() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100_000, 0);
        join(&mut pool, 2, 500, 1_000, 0);
        join(&mut pool, 3, 500, 60_000, 0);
        let now = 1_000 + TICKET_GRACE_MS;
        let ReturnPlan::Return(_, update) = pool.plan_return(d(1), now) else {
            panic!()
        };
        assert!(update.expect.contains(&Expect::TicketAt {
            index: 0,
            holder: h(2, 500)
        }));
        pool = pool.apply(&update).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(3)));
        assert!(pool.queue().is_empty());
    }
}
