//! A return: free the lease (handing on), cancel a waiting ticket, or
//! remember the id as given up.

use super::{Change, Expect, GiveUp, GivenUp, Lease, LeaseDigest, Pool, Slot, Update};

/// How long the id of a lease given up before its borrow was seen is
/// remembered: a borrow with that id arriving later is refused, so a cancel
/// that overtakes its borrow still cancels it. Longer than any request lives
/// behind API Gateway (30 s).
pub const GIVEN_UP_MS: u64 = 30_000;

/// Most lease ids a pool remembers as given up at once: a flood of returns
/// of unknown lease ids replaces the oldest, and never grows the item past
/// a few hundred bytes (each write that adds one is conditioned on the
/// number stored, so racing writes cannot overshoot).
pub const MAX_GIVEN_UP: usize = 16;

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

impl Pool {
    /// Whether the first live ticket's borrower waits in its own request,
    /// reading the pool at the head's pace: it joined the queue itself, not
    /// through async mode's line (an async ticket reads nothing, and a
    /// borrower admitted from the backlog may still be napping there).
    fn head_reads(&self, now_ms: u64) -> bool {
        !self.line.active
            && self
                .queue
                .iter()
                .find(|t| t.is_live(now_ms))
                .is_some_and(|t| matches!(t.give_up, GiveUp::Seconds(_)))
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
        match self.given_up_of(digest) {
            Some(given_up) if given_up.is_live(now_ms) => ReturnPlan::Remembered,
            stale => ReturnPlan::Remember(self.remember(digest, stale, now_ms)),
        }
    }

    /// Remembers `digest` as given up (overwriting its `stale` tombstone):
    /// stale tombstones go, and the oldest live ones while more than
    /// [`MAX_GIVEN_UP`] would be left, so the write is conditioned on how many
    /// are stored (racing writes cannot overshoot the bound).
    fn remember(&self, digest: LeaseDigest, stale: Option<GivenUp>, now_ms: u64) -> Update {
        let mut update = self.prune_given_up(now_ms, Some(digest));
        let mut removed = update
            .changes
            .iter()
            .filter(|c| matches!(c, Change::ForgetGivenUp(_)))
            .count();
        let added = usize::from(stale.is_none());
        let mut live: Vec<&GivenUp> = self
            .given_up
            .iter()
            .filter(|t| t.is_live(now_ms) && t.digest != digest)
            .collect();
        live.sort_by_key(|t| t.until_s);
        let left = self.given_up.len() - removed + added;
        for oldest in live.iter().take(left.saturating_sub(MAX_GIVEN_UP)) {
            update.expect.push(Expect::GivenUpIs(**oldest));
            update.changes.push(Change::ForgetGivenUp(oldest.digest));
            removed += 1;
        }
        update.expect.push(match stale {
            Some(given_up) => Expect::GivenUpIs(given_up),
            None => Expect::NotGivenUp(digest),
        });
        // As read, this leaves `given_up - removed + added` (at most the bound,
        // or what an item stored by an older version held, never more).
        let bound = MAX_GIVEN_UP.max(self.given_up.len() - removed + added);
        update
            .expect
            .push(Expect::GivenUpAtMost(bound + removed - added));
        update.changes.push(Change::SetGivenUp(GivenUp {
            digest,
            until_s: (now_ms + GIVEN_UP_MS).div_ceil(1000),
        }));
        update
    }

    /// Frees the live `lease`, conditioned only on that lease: with live
    /// tickets waiting and a slot to spare, its own goes to the head of the
    /// queue in the same write when it is the lowest free position. When a
    /// lower one is free, a waiting borrower at the head hands that one on
    /// itself (with any others free, in one write), and the return only
    /// frees its own: a return that moved the lower slot would race that
    /// waiter, and every other return, for it. While async mode's line is
    /// in use the head may read nothing (an async ticket) or late, so the
    /// return hands it the lower slot.
    pub(super) fn give_back(&self, lease: &Lease, now_ms: u64) -> Update {
        let position = lease.position;
        let mut after = self.clone();
        after.slots[usize::from(position)] = Slot::Free;
        let mut update = self.prune_given_up(now_ms, None);
        update.expect.push(self.slot_as_read(position));
        let target = after.free_positions(now_ms).first().copied();
        let handed = match target {
            Some(target) if target != position && self.head_reads(now_ms) => None,
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
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{BorrowPlan, Ticket, WaitPlan};
    use super::*;

    #[test]
    fn a_return_with_waiters_hands_its_slot_to_the_head_without_naming_it() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100, 0);
        join(&mut pool, 2, 500, 10_000, 1);
        join(&mut pool, 3, 500, 10_000, 1);
        let ReturnPlan::Return(_, update) = pool.plan_return(d(1), 2) else {
            panic!()
        };
        // Conditioned on its own lease only: no ticket, no other slot.
        assert_eq!(update.expect.len(), 2, "{update:?}");
        assert!(matches!(
            update.expect[0],
            Expect::SlotStamp { position: 0, .. }
        ));
        assert_eq!(update.expect[1], Expect::Count(pool.sizing()));
        assert_eq!(
            update.changes,
            vec![Change::HandOff {
                position: 0,
                from: 0,
                nth: 0,
                now_ms: 2
            }]
        );
        pool = pool.apply(&update).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(2)));
        assert_eq!(pool.queue().len(), 1);
        let lease = pool.live_lease(d(2), 2).unwrap();
        assert_eq!((lease.granted_ms, lease.expires_at_ms), (2, 502));
    }

    #[test]
    fn two_returns_that_read_the_same_queue_serve_two_tickets() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 100, 0);
        borrow(&mut pool, 2, 100, 0);
        join(&mut pool, 3, 500, 10_000, 1);
        join(&mut pool, 4, 500, 10_000, 1);
        let ReturnPlan::Return(_, a) = pool.plan_return(d(1), 2) else {
            panic!()
        };
        let ReturnPlan::Return(_, b) = pool.plan_return(d(2), 2) else {
            panic!()
        };
        pool = pool.apply(&a).unwrap();
        pool = pool.apply(&b).expect("returns never collide");
        assert_eq!(holder_at(&pool, 0), Some(d(3)));
        assert_eq!(holder_at(&pool, 1), Some(d(4)));
        assert!(pool.queue().is_empty());
        let fences: Vec<u64> = pool.leases().iter().map(|l| l.fence).collect();
        assert!(fences[0] < fences[1], "fences rise in grant order");
    }

    /// Position 0 expired at 50 but nobody saw it yet; position 2 returns
    /// at 60 while ticket 4 waits: `async_head` makes that ticket an async
    /// one (it reads nothing). The pool after the return.
    fn return_above_a_lower_free_slot(async_head: bool) -> (Update, Pool) {
        let mut pool = Pool::new(3, 0);
        borrow(&mut pool, 1, 50, 0);
        borrow(&mut pool, 2, 1000, 0);
        borrow(&mut pool, 3, 1000, 0);
        if async_head {
            let ticket = Ticket {
                holder: h(4, 500),
                give_up: GiveUp::Exact(10_000),
            };
            let append = Update {
                expect: Vec::new(),
                changes: vec![Change::Append(ticket)],
            };
            pool = pool.apply(&append).unwrap();
        } else {
            join(&mut pool, 4, 500, 10_000, 1);
        }
        let ReturnPlan::Return(_, update) = pool.plan_return(d(3), 60) else {
            panic!()
        };
        let after = pool.apply(&update).unwrap();
        (update, after)
    }

    #[test]
    fn a_return_above_a_lower_free_slot_frees_its_own_and_the_waiting_head_hands_on() {
        let (update, mut pool) = return_above_a_lower_free_slot(false);
        // Conditioned on its own lease only: the lower slot is the head's to
        // hand on, so the return never races it (nor other returns) for it.
        assert_eq!(update.expect.len(), 1, "{update:?}");
        assert!(matches!(
            update.expect[0],
            Expect::SlotStamp { position: 2, .. }
        ));
        assert_eq!(update.changes, vec![Change::Free(2)]);
        assert_eq!(holder_at(&pool, 2), None);
        // The head reads: it hands itself the lowest free slot.
        let WaitPlan::Waiting {
            ahead: 0,
            duty: Some(duty),
            ..
        } = pool.plan_wait(&h(4, 500), 1, 61)
        else {
            panic!("{:?}", pool.plan_wait(&h(4, 500), 1, 61))
        };
        pool = pool.apply(&duty).unwrap();
        assert_eq!(holder_at(&pool, 0), Some(d(4)), "the head gets the lowest");
        assert_eq!(holder_at(&pool, 2), None);
    }

    #[test]
    fn a_return_hands_a_lower_free_slot_to_an_async_head_and_frees_its_own() {
        let (_, pool) = return_above_a_lower_free_slot(true);
        assert_eq!(holder_at(&pool, 0), Some(d(4)), "the head gets the lowest");
        assert_eq!(holder_at(&pool, 2), None);
    }

    #[test]
    fn a_cancelled_ticket_frees_its_place_at_once() {
        let mut pool = Pool::new(1, 0);
        borrow(&mut pool, 1, 100_000, 0);
        join(&mut pool, 2, 500, 60_000, 0);
        join(&mut pool, 3, 500, 60_000, 0);
        // A return naming the waiting borrow's lease id cancels its ticket.
        let ReturnPlan::Cancel(cancel) = pool.plan_return(d(2), 1) else {
            panic!()
        };
        pool = pool.apply(&cancel).unwrap();
        assert_eq!(pool.waiting(1), 1);
        assert_eq!(pool.plan_wait(&h(2, 500), 0, 1), WaitPlan::Gone);
        give_back(&mut pool, 1, 2);
        assert_eq!(
            holder_at(&pool, 0),
            Some(d(3)),
            "the next in line is served"
        );
    }

    #[test]
    fn a_cancel_that_overtakes_its_borrow_is_remembered() {
        let mut pool = Pool::new(1, 0);
        let ReturnPlan::Remember(update) = pool.plan_return(d(5), 1_000) else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
        assert_eq!(pool.plan_return(d(5), 2_000), ReturnPlan::Remembered);
        assert_eq!(
            pool.plan_borrow(h(5, 100), 9_000, 2_000, WAITERS),
            BorrowPlan::Cancelled
        );
        // Once forgotten, the id may borrow again (its stale given-up entry leaves with it).
        let later = 1_000 + GIVEN_UP_MS + 1_000;
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(h(5, 100), later, later, WAITERS)
        else {
            panic!()
        };
        pool = pool.apply(&update).unwrap();
        assert!(pool.given_up().is_empty());
    }

    #[test]
    fn a_flood_of_unknown_returns_keeps_the_newest_few() {
        let mut pool = Pool::new(1, 0);
        for n in 0..(MAX_GIVEN_UP as u8 + 10) {
            let ReturnPlan::Remember(update) = pool.plan_return(d(n), 1_000 + u64::from(n) * 1_000)
            else {
                panic!()
            };
            pool = pool.apply(&update).unwrap();
        }
        assert_eq!(pool.given_up().len(), MAX_GIVEN_UP);
        assert!(pool.given_up().iter().all(|t| t.digest.0[0] >= 10));
    }

    #[test]
    fn returns_of_expired_and_unknown_leases_free_nothing() {
        let mut pool = Pool::new(2, 0);
        borrow(&mut pool, 1, 10, 0);
        assert!(matches!(pool.plan_return(d(1), 10), ReturnPlan::Expired(_)));
        assert!(matches!(
            pool.plan_return(d(9), 10),
            ReturnPlan::Remember(_)
        ));
        assert!(give_back(&mut pool, 1, 5));
        assert!(!give_back(&mut pool, 1, 6), "already returned");
    }
}
