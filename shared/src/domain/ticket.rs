//! Tickets in items of their own (async mode; see `docs/DESIGN.md`): a
//! ticket that waits in the pool's backlog, then is granted, delivered to
//! its callback, or ends otherwise. Whatever grows without bound lives here,
//! not in the pool item. Pure: no I/O, no clock.

use super::{Holder, Lease, LeaseDigest};

/// Where a granted ticket is delivered, and how it proves itself there. The
/// token is stored as given, since it must be sent (the contract says so).
#[derive(Clone, PartialEq, Eq)]
pub struct Callback {
    pub url: String,
    pub token: String,
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither is logged: the URL may carry the receiver's own secrets.
        f.write_str("Callback { .. }")
    }
}

/// The grant a ticket got: its slot, fence and lease times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TicketGrant {
    pub position: u16,
    /// The absolute fence.
    pub fence: u64,
    pub granted_ms: u64,
    pub expires_at_ms: u64,
}

impl TicketGrant {
    /// The grant that `lease` is.
    pub fn of(lease: &Lease) -> TicketGrant {
        TicketGrant {
            position: lease.position,
            fence: lease.fence,
            granted_ms: lease.granted_ms,
            expires_at_ms: lease.expires_at_ms,
        }
    }
}

/// One dispatcher's claim on a granted ticket's delivery: nobody else starts
/// an attempt before `until_ms`, so that at most one attempt is in flight per
/// ticket across every dispatcher. Taken (and renewed) before each attempt by
/// a conditional write; it covers the attempt and the pause after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryClaim {
    /// Who claims: one delivery's random id.
    pub by: u64,
    pub until_ms: u64,
}

/// How long after a delivery's claim lapses its outcome may still be on its
/// way to the store (an attempt answered 2xx, its `delivered` write slow): a
/// step ends a claimed ticket whose lease ended only after this, so that a
/// grant delivered in time never reads `failed`.
pub const OUTCOME_GRACE_MS: u64 = 10_000;

/// Where a ticket is in its life. Each state is entered at most once, in
/// the order [`TicketState::may_become`] allows, and a final one never
/// changes: every ticket ends exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TicketState {
    /// In line (in the backlog, or admitted to the pool's queue).
    Waiting,
    /// A slot was granted; delivery is under way.
    Granted(TicketGrant),
    /// The receiver answered 2xx.
    Delivered {
        grant: TicketGrant,
        delivered_ms: u64,
    },
    /// Not delivered, for `reason` (its lease, if any, was returned).
    Failed { reason: String },
    /// Its holder gave it up.
    Cancelled,
    /// Not granted within its wait.
    Expired,
}

impl TicketState {
    /// The state's name in the API and in the stored item.
    pub fn name(&self) -> &'static str {
        match self {
            TicketState::Waiting => "waiting",
            TicketState::Granted(_) => "granted",
            TicketState::Delivered { .. } => "delivered",
            TicketState::Failed { .. } => "failed",
            TicketState::Cancelled => "cancelled",
            TicketState::Expired => "expired",
        }
    }

    pub fn is_final(&self) -> bool {
        !matches!(self, TicketState::Waiting | TicketState::Granted(_))
    }

    /// The grant, once there is one.
    pub fn grant(&self) -> Option<TicketGrant> {
        match self {
            TicketState::Granted(grant) | TicketState::Delivered { grant, .. } => Some(*grant),
            _ => None,
        }
    }

    /// Whether a ticket in this state may move to `next`: waiting → granted,
    /// cancelled, expired or failed (its pool deleted); granted → delivered
    /// or failed. Nothing leaves a final state.
    pub fn may_become(&self, next: &TicketState) -> bool {
        match (self, next) {
            (TicketState::Waiting, TicketState::Waiting) => false,
            (TicketState::Waiting, TicketState::Delivered { .. }) => false,
            (TicketState::Waiting, _) => true,
            (
                TicketState::Granted(grant),
                TicketState::Delivered {
                    grant: delivered, ..
                },
            ) => grant == delivered,
            (TicketState::Granted(_), TicketState::Failed { .. }) => true,
            _ => false,
        }
    }
}

/// A ticket stored as an item of its own under its pool's partition key,
/// keyed by its lease digest (one ticket per lease id: enqueue is idempotent)
/// and ordered by its number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketItem {
    /// Its place in the pool's one line, from the pool's ticket counter.
    pub number: u64,
    /// The lease it waits to become: digest and clamped ttl.
    pub holder: Holder,
    /// The pool's incarnation when it joined: a ticket of a pool since
    /// deleted (and perhaps registered again) is not that pool's.
    pub incarnation: u64,
    pub joined_ms: u64,
    /// When it stops waiting (it then ends `expired`).
    pub wait_until_ms: u64,
    /// `None` for a synchronous borrower waiting in the backlog.
    pub callback: Option<Callback>,
    pub state: TicketState,
    /// Delivery attempts so far.
    pub attempts: u32,
    /// The latest claim on its delivery (see [`DeliveryClaim`]).
    pub claim: Option<DeliveryClaim>,
}

impl TicketItem {
    pub fn digest(&self) -> LeaseDigest {
        self.holder.digest
    }

    /// Whether a delivery attempt may be under way at `now_ms` by someone
    /// other than `by`.
    pub fn claimed_by_another(&self, by: u64, now_ms: u64) -> bool {
        self.claim
            .is_some_and(|c| c.by != by && now_ms < c.until_ms)
    }

    /// Whether `claim` may be taken at `now_ms` for an attempt to deliver
    /// the grant of `fence`: still that grant, undelivered, and no live
    /// claim of another's.
    pub fn may_claim(&self, fence: u64, claim: DeliveryClaim, now_ms: u64) -> bool {
        matches!(self.state, TicketState::Granted(g) if g.fence == fence)
            && !self.claimed_by_another(claim.by, now_ms)
    }

    /// Whether it still waits for a slot at `now_ms`.
    pub fn is_waiting(&self, now_ms: u64) -> bool {
        self.state == TicketState::Waiting && now_ms < self.wait_until_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(fence: u64) -> TicketGrant {
        TicketGrant {
            position: 1,
            fence,
            granted_ms: 10,
            expires_at_ms: 20,
        }
    }

    #[test]
    fn every_ticket_ends_once_and_in_order() {
        let waiting = TicketState::Waiting;
        let granted = TicketState::Granted(grant(7));
        let delivered = TicketState::Delivered {
            grant: grant(7),
            delivered_ms: 15,
        };
        let failed = TicketState::Failed {
            reason: "receiver answered HTTP 410".into(),
        };
        let finals = [
            delivered.clone(),
            failed.clone(),
            TicketState::Cancelled,
            TicketState::Expired,
        ];
        assert!(finals.iter().all(TicketState::is_final));
        assert!(!waiting.is_final() && !granted.is_final());
        for next in [
            &granted,
            &failed,
            &TicketState::Cancelled,
            &TicketState::Expired,
        ] {
            assert!(waiting.may_become(next), "waiting → {}", next.name());
        }
        assert!(!waiting.may_become(&waiting));
        assert!(!waiting.may_become(&delivered), "never delivered ungranted");
        assert!(granted.may_become(&delivered));
        assert!(granted.may_become(&failed));
        assert!(!granted.may_become(&TicketState::Cancelled));
        assert!(!granted.may_become(&TicketState::Expired));
        assert!(!granted.may_become(&TicketState::Granted(grant(8))));
        assert!(
            !granted.may_become(&TicketState::Delivered {
                grant: grant(8),
                delivered_ms: 15
            }),
            "delivered as another grant"
        );
        for end in &finals {
            for next in [
                &waiting,
                &granted,
                &delivered,
                &failed,
                &TicketState::Expired,
            ] {
                assert!(!end.may_become(next), "{} → {}", end.name(), next.name());
            }
        }
        assert_eq!(delivered.grant(), Some(grant(7)));
        assert_eq!(failed.grant(), None);
    }

    #[test]
    fn callbacks_are_never_printed() {
        let callback = Callback {
            url: "https://example.com/hook?key=secret".into(),
            token: "t0ken".into(),
        };
        let debug = format!("{callback:?}");
        assert!(
            !debug.contains("secret") && !debug.contains("t0ken"),
            "{debug}"
        );
    }
}
