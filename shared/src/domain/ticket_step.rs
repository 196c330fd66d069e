//! What the dispatcher does with one listed async ticket, decided from its item and the pool
//! as read: the per-ticket table of the dispatcher's step (`service::async_mode::step` makes
//! the writes it names).
use super::{
    Lease, LeaseDigest, Pool, TicketGrant, TicketItem, TicketState, OUTCOME_GRACE_MS,
    TICKET_GRACE_MS,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TicketStep {
    /// Ended ungranted while a slot was being handed to it, or failed with its lease not
    /// returned: nobody holds the live slot. Return it, then unlist.
    ReturnThenUnlist,
    /// Ended: no longer the pool's business. Unlist.
    Unlist,
    /// Granted, not yet delivered, and nobody's attempt under way (a delivery
    /// cut short by a crash, or handed on): deliver again.
    Redeliver(TicketGrant),
    /// Granted, and a dispatcher's claim on its delivery is live until then:
    /// leave it to that dispatcher (look again once the claim lapses).
    Claimed { until_ms: u64 },
    /// Granted, but its lease ended undelivered (returned by its lease id,
    /// or expired): end it `failed` for this reason, unlist. No attempt
    /// starts for a lease nobody holds.
    Fail(String),
    /// A slot was handed to it: record the grant and deliver. If the ticket moved first
    /// (cancelled, expired), return the slot when `live`; unlist once the ticket is final.
    Record { grant: TicketGrant, live: bool },
    /// Waits in the queue, its wait not over.
    Wait,
    /// Its wait ended in the queue (or it ended there otherwise): end it
    /// `expired` if it still waits, take ticket `index` out, unlist.
    Expire { index: usize },
    /// Left the queue ungranted (pruned, or its lease id returned): end it so, unlist.
    End(TicketState),
}

impl Pool {
    /// Whether the listed ticket of `digest` needs its item read: not while it waits live
    /// in the queue with no slot handed to it.
    pub fn listed_needs_read(&self, digest: LeaseDigest, now_ms: u64) -> bool {
        let waits = self
            .ticket_of(digest)
            .is_some_and(|(_, t)| t.is_live(now_ms));
        !(waits && self.lease_of(digest).is_none())
    }

    /// Why the grant of a granted ticket can no longer be delivered, if so:
    /// no attempt starts once its lease has ended.
    pub fn undeliverable(
        &self,
        digest: LeaseDigest,
        grant: &TicketGrant,
        now_ms: u64,
    ) -> Option<&'static str> {
        if now_ms >= grant.expires_at_ms {
            return Some("its lease expired before its delivery was confirmed");
        }
        let held = self
            .lease_of(digest)
            .is_some_and(|lease| lease.fence == grant.fence);
        (!held).then_some("its lease was returned before its delivery was confirmed")
    }

    /// The grant handed to the ticket of `item` in this pool (not an older
    /// one of its lease id: the grace covers clock skew), held or remembered.
    pub fn grant_to(&self, item: &TicketItem) -> Option<Lease> {
        self.grant_of(&item.holder)
            .filter(|l| l.granted_ms.saturating_add(TICKET_GRACE_MS) >= item.joined_ms)
    }

    /// What the dispatcher does with the listed ticket whose item is `item`, at `now_ms`.
    pub fn ticket_step(&self, item: &TicketItem, now_ms: u64) -> TicketStep {
        let queued = self.ticket_of(item.digest());
        let grant = self.grant_to(item);
        match (&item.state, grant, queued) {
            (
                TicketState::Cancelled | TicketState::Expired | TicketState::Failed { .. },
                Some(lease),
                _,
            ) if lease.is_live(now_ms) => TicketStep::ReturnThenUnlist,
            (state, _, Some((index, _))) if state.is_final() => TicketStep::Expire { index },
            (state, ..) if state.is_final() => TicketStep::Unlist,
            (TicketState::Granted(grant), ..) => {
                let ended = self.undeliverable(item.digest(), grant, now_ms);
                // Whom the ticket is left to until when: an attempt under way,
                // and once its lease ended, the outcome still on its way.
                let owned_until = item.claim.map(|claim| match ended {
                    None => claim.until_ms,
                    Some(_) => claim.until_ms.saturating_add(OUTCOME_GRACE_MS),
                });
                match (owned_until, ended) {
                    (Some(until_ms), _) if now_ms < until_ms => TicketStep::Claimed { until_ms },
                    (_, Some(reason)) => TicketStep::Fail(reason.into()),
                    (_, None) => TicketStep::Redeliver(*grant),
                }
            }
            (_, Some(lease), _) => TicketStep::Record {
                grant: TicketGrant::of(&lease),
                live: lease.is_live(now_ms),
            },
            (_, None, Some((_, ticket))) if ticket.is_live(now_ms) => TicketStep::Wait,
            (_, None, Some((index, _))) => TicketStep::Expire { index },
            (_, None, None) => TicketStep::End(if now_ms >= item.wait_until_ms {
                TicketState::Expired
            } else {
                TicketState::Cancelled
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BorrowPlan, Callback, DeliveryClaim, GiveUp, Holder, ReturnPlan};

    const NOW: u64 = 1_000_000;
    const WAIT_MS: u64 = 600_000;

    fn h(n: u8) -> Holder {
        Holder {
            digest: LeaseDigest([n; 8]),
            ttl_ms: 1_000,
        }
    }

    /// Async ticket `number` of holder `n`, joined at NOW, in `state`.
    fn item(n: u8, number: u64, state: TicketState) -> TicketItem {
        TicketItem {
            number,
            holder: h(n),
            incarnation: 1,
            joined_ms: NOW,
            wait_until_ms: NOW + WAIT_MS,
            callback: Some(Callback {
                url: "https://example.com/hook".into(),
                token: "t".into(),
            }),
            state,
            attempts: 0,
            claim: None,
        }
    }

    /// A pool of one slot held by holder 1 (ttl 60 s), and async ticket 0
    /// of holder 2 admitted to its queue.
    fn queued() -> Pool {
        let pool = Pool::new(1, 0);
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(
            Holder {
                ttl_ms: 60_000,
                ..h(1)
            },
            NOW,
            NOW,
            100,
        ) else {
            panic!("a free slot")
        };
        let pool = pool.apply(&update).unwrap();
        let pool = pool.apply(&Pool::plan_number()).unwrap();
        let backlog = [item(2, 0, TicketState::Waiting)];
        let update = pool.plan_admit(&backlog, NOW, 100, 16).expect("admits");
        let pool = pool.apply(&update).unwrap();
        assert_eq!(pool.listed_number(h(2).digest), Some(0));
        assert_eq!(pool.ticket_of(h(2).digest).map(|(i, _)| i), Some(0));
        pool
    }

    /// `queued()` after holder 1 returned its lease: the slot handed to
    /// ticket 2 at NOW.
    fn handed() -> (Pool, TicketGrant) {
        let pool = queued();
        let ReturnPlan::Return(_, update) = pool.plan_return(h(1).digest, NOW) else {
            panic!("holder 1 holds")
        };
        let pool = pool.apply(&update).unwrap();
        let lease = pool.lease_of(h(2).digest).expect("handed to the head");
        let grant = TicketGrant {
            position: lease.position,
            fence: lease.fence,
            granted_ms: lease.granted_ms,
            expires_at_ms: lease.expires_at_ms,
        };
        (pool, grant)
    }

    #[test]
    fn a_ticket_ended_while_its_slot_was_handed_returns_it_then_unlists() {
        let (pool, _) = handed();
        for state in [
            TicketState::Cancelled,
            TicketState::Expired,
            TicketState::Failed {
                reason: "refused".into(),
            },
        ] {
            assert_eq!(
                pool.ticket_step(&item(2, 0, state), NOW + 10),
                TicketStep::ReturnThenUnlist
            );
        }
    }

    #[test]
    fn a_final_ticket_without_a_live_slot_is_unlisted() {
        let (pool, grant) = handed();
        // Its slot expired: nobody to return it for.
        let after = grant.expires_at_ms;
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Cancelled), after),
            TicketStep::Unlist
        );
        // Delivered: final, whatever the slot.
        let delivered = TicketState::Delivered {
            grant,
            delivered_ms: NOW + 5,
        };
        assert_eq!(
            pool.ticket_step(&item(2, 0, delivered), NOW + 10),
            TicketStep::Unlist
        );
        // Ended in the backlog, never queued.
        assert_eq!(
            queued().ticket_step(&item(3, 1, TicketState::Expired), NOW),
            TicketStep::Unlist
        );
    }

    #[test]
    fn a_granted_ticket_is_delivered_again_unless_another_attempt_is_under_way() {
        let (pool, grant) = handed();
        let granted = item(2, 0, TicketState::Granted(grant));
        assert_eq!(
            pool.ticket_step(&granted, NOW + 10),
            TicketStep::Redeliver(grant)
        );
        // A dispatcher's claim is live: its delivery, not this step's.
        let claimed = TicketItem {
            claim: Some(DeliveryClaim {
                by: 7,
                until_ms: NOW + 500,
            }),
            ..granted.clone()
        };
        assert_eq!(
            pool.ticket_step(&claimed, NOW + 10),
            TicketStep::Claimed {
                until_ms: NOW + 500
            }
        );
        // Lapsed (its dispatcher died): delivered again.
        assert_eq!(
            pool.ticket_step(&claimed, NOW + 500),
            TicketStep::Redeliver(grant)
        );
        // Its lease ended after an attempt was claimed: that attempt's outcome
        // may still be on its way (a 2xx being recorded), so it fails only
        // once that grace is over too.
        let expired = grant.expires_at_ms;
        let claimed_late = TicketItem {
            claim: Some(DeliveryClaim {
                by: 7,
                until_ms: expired - 100,
            }),
            ..granted
        };
        assert_eq!(
            pool.ticket_step(&claimed_late, expired),
            TicketStep::Claimed {
                until_ms: expired - 100 + OUTCOME_GRACE_MS
            }
        );
        assert_eq!(
            pool.ticket_step(&claimed_late, expired - 100 + OUTCOME_GRACE_MS),
            TicketStep::Fail("its lease expired before its delivery was confirmed".into())
        );
    }

    #[test]
    fn a_grant_whose_lease_ended_undelivered_fails_and_is_never_attempted() {
        let (pool, grant) = handed();
        let granted = item(2, 0, TicketState::Granted(grant));
        // Its slot expired.
        assert_eq!(
            pool.ticket_step(&granted, grant.expires_at_ms),
            TicketStep::Fail("its lease expired before its delivery was confirmed".into())
        );
        // Its lease id returned (by whoever holds the lease UUID).
        let ReturnPlan::Return(_, update) = pool.plan_return(h(2).digest, NOW + 10) else {
            panic!("ticket 2 holds the slot")
        };
        let returned = pool.apply(&update).unwrap();
        assert_eq!(
            returned.ticket_step(&granted, NOW + 20),
            TicketStep::Fail("its lease was returned before its delivery was confirmed".into())
        );
        assert_eq!(
            returned.undeliverable(h(2).digest, &grant, NOW + 20),
            Some("its lease was returned before its delivery was confirmed")
        );
        assert_eq!(pool.undeliverable(h(2).digest, &grant, NOW + 20), None);
    }

    #[test]
    fn a_slot_handed_to_a_waiting_ticket_is_recorded() {
        let (pool, grant) = handed();
        assert!(pool.listed_needs_read(h(2).digest, NOW + 10));
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), NOW + 10),
            TicketStep::Record { grant, live: true }
        );
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), grant.expires_at_ms),
            TicketStep::Record { grant, live: false }
        );
        // A grant from before the ticket joined (less the grace) is not its:
        // out of the queue ungranted.
        let mut late = item(2, 0, TicketState::Waiting);
        late.joined_ms = grant.granted_ms + TICKET_GRACE_MS + 1;
        assert_eq!(
            pool.ticket_step(&late, NOW + 10),
            TicketStep::End(TicketState::Cancelled)
        );
    }

    #[test]
    fn a_ticket_that_ended_in_the_queue_is_taken_out() {
        // Read as expired at its deadline (`POST …/ticket`) before the step.
        let pool = queued();
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Expired), NOW + WAIT_MS),
            TicketStep::Expire { index: 0 }
        );
    }

    #[test]
    fn an_async_ticket_is_never_handed_a_slot_at_its_deadline() {
        let pool = queued();
        let (_, ticket) = pool.ticket_of(h(2).digest).unwrap();
        // Exact, with no grace: dead at its wait's end to the millisecond.
        assert_eq!(ticket.give_up, GiveUp::Exact(NOW + WAIT_MS));
        assert!(ticket.is_live(NOW + WAIT_MS - 1));
        assert!(!ticket.is_live(NOW + WAIT_MS));
        // Holder 1's lease has expired long before: its slot is free to hand on.
        let deadline = NOW + WAIT_MS;
        let served = |at: u64| {
            pool.plan_serve(at)
                .map(|update| pool.apply(&update).unwrap())
                .and_then(|after| after.lease_of(h(2).digest))
        };
        assert_eq!(served(deadline), None, "not handed at its deadline");
        let after = served(deadline - 1);
        assert!(after.is_some(), "handed just before");
    }

    #[test]
    fn a_ticket_waiting_live_in_the_queue_waits_unread() {
        let pool = queued();
        assert!(!pool.listed_needs_read(h(2).digest, NOW));
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), NOW),
            TicketStep::Wait
        );
    }

    #[test]
    fn a_ticket_whose_wait_ended_in_the_queue_expires() {
        let pool = queued();
        let (_, ticket) = pool.ticket_of(h(2).digest).unwrap();
        let dead = ticket.give_up.dead_from_ms();
        assert!(pool.listed_needs_read(h(2).digest, dead));
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), dead),
            TicketStep::Expire { index: 0 }
        );
    }

    #[test]
    fn a_ticket_that_left_the_queue_ungranted_ends_by_its_wait() {
        let pool = queued();
        // Its lease id returned while it waited: out of the queue.
        let ReturnPlan::Cancel(update) = pool.plan_return(h(2).digest, NOW) else {
            panic!("ticket 2 waits")
        };
        let pool = pool.apply(&update).unwrap();
        assert!(pool.listed_needs_read(h(2).digest, NOW));
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), NOW + 1),
            TicketStep::End(TicketState::Cancelled)
        );
        assert_eq!(
            pool.ticket_step(&item(2, 0, TicketState::Waiting), NOW + WAIT_MS),
            TicketStep::End(TicketState::Expired)
        );
    }
}
