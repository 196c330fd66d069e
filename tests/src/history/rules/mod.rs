//! The rules: each promise of API.md checked against a pool's model.

mod grants;
mod waits;

use std::collections::HashMap;
use std::fmt;

use super::decode::Outcome;
use super::model::PoolModel;
use super::record::{Call, Op};
use super::CheckConfig;

/// Which promise was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// A status or body API.md does not allow for this call.
    BadResponse,
    /// Two leases surely live at once on one position.
    SharedPosition,
    /// A grant while `count` or more other leases were surely live.
    OverIssue,
    /// A position ≥ every `count` that can have been in force at the grant.
    PositionOutOfRange,
    /// `returned: true` for a lease that cannot have been live then.
    ReturnedDeadLease,
    /// `returned: false` for its own pool's lease while it was surely live.
    LostLease,
    /// A 409 while a slot was definitely free (all the call, or ≥ tolerance).
    LostWakeup,
    /// A grant above a position that was definitely free throughout it.
    NotLowestPosition,
    /// "No pool" while one surely existed, or a pool's answer while none did.
    WrongExistence,
    /// A state (`count`, `in_use`) that cannot have held during the call.
    ImpossibleState,
    /// A grant's fence not above the fence of a grant surely before it (in
    /// the same pool id, deletes and re-registers included), or two grants
    /// with one fence.
    FenceOrder,
    /// A waiter refused after a borrower that started after it had joined
    /// was granted while it surely still waited.
    Overtaken,
    /// A position held by a lease no client was ever told about (found with
    /// the store's ground truth, `crate::truth`).
    OrphanedSlot,
    /// A borrow granted after its wait was given up: a return of the lease
    /// UUID it sent, sent after it, answered `returned: false` before the
    /// grant surely happened (a short grant can end before the return and be
    /// answered after it).
    GrantedAfterGivingUp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: Rule,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.rule, self.message)
    }
}

/// Collects violations, and describes ops in their messages.
pub(super) struct Checker<'h> {
    ops: &'h [Op],
    config: &'h CheckConfig,
    /// The first invoke: messages give times relative to it.
    t0: u64,
    out: Vec<Violation>,
}

impl<'h> Checker<'h> {
    pub(super) fn new(ops: &'h [Op], config: &'h CheckConfig) -> Self {
        Checker {
            ops,
            config,
            t0: ops.iter().map(|o| o.invoke_ms).min().unwrap_or(0),
            out: Vec::new(),
        }
    }

    pub(super) fn violations(self) -> Vec<Violation> {
        self.out
    }

    fn flag(&mut self, rule: Rule, message: String) {
        self.out.push(Violation { rule, message });
    }

    /// [`Rule::BadResponse`] for op `i`, `why` saying how it breaks API.md.
    pub(super) fn bad_response(&mut self, i: usize, why: &str) {
        let message = format!("{}: {why}", self.describe(i));
        self.flag(Rule::BadResponse, message);
    }
    /// `#12 client 3 borrow 9f1c2e7a… [+1200, +1234] ms → 200 {...}`
    fn describe(&self, i: usize) -> String {
        let op = &self.ops[i];
        let call = match &op.call {
            Call::Register { count } => format!("PUT count {count}"),
            Call::Borrow {
                ttl_ms,
                wait_ms,
                lease,
            } => format!(
                "borrow ttl {ttl_ms} ms wait {wait_ms} ms{}",
                lease
                    .as_deref()
                    .map(|l| format!(" as {}", short(l)))
                    .unwrap_or_default()
            ),
            Call::Return { lease } => format!("return {}", short(lease)),
            other => other.name().to_string(),
        };
        format!(
            "#{i} client {} {call} on {} [+{}, +{}] ms → {} {}",
            op.client,
            short(&op.pool),
            self.rel(op.invoke_ms),
            self.rel(op.response_ms),
            op.status,
            op.body
        )
    }

    fn rel(&self, t: u64) -> i64 {
        t as i64 - self.t0 as i64
    }

    /// Every granted lease by UUID (model index, lease index), to judge
    /// returns sent to any pool. [`Rule::BadResponse`]: a UUID granted twice.
    pub(super) fn lease_owners<'m>(
        &mut self,
        models: &'m [PoolModel],
    ) -> HashMap<&'m str, (usize, usize)> {
        let mut owners = HashMap::new();
        for (m, model) in models.iter().enumerate() {
            for (l, lease) in model.leases.iter().enumerate() {
                if owners.insert(lease.id.as_str(), (m, l)).is_some() {
                    let message = format!(
                        "{} handed out a lease UUID already granted",
                        self.describe(lease.op)
                    );
                    self.flag(Rule::BadResponse, message);
                }
            }
        }
        owners
    }

    pub(super) fn check_pool(
        &mut self,
        model: &PoolModel,
        outcomes: &[Outcome],
        models: &[PoolModel],
        owners: &HashMap<&str, (usize, usize)>,
    ) {
        self.shared_positions(model);
        self.fence_order(model);
        for (l, lease) in model.leases.iter().enumerate() {
            self.grant(model, l, lease);
        }
        let ops = self.ops;
        for &i in &model.calls {
            let op = &ops[i];
            self.existence(model, i, &outcomes[i]);
            match (&op.call, &outcomes[i]) {
                (Call::Return { lease }, Outcome::Returned(returned)) => {
                    let owner = owners
                        .get(lease.to_lowercase().as_str())
                        .map(|&(m, l)| (&models[m], l));
                    self.returned(model, i, *returned, owner);
                }
                // A borrow given up answers 409 when it was given up: no
                // wake-up was lost and nobody overtook it.
                (Call::Borrow { .. }, Outcome::Exhausted) if !self.given_up(model, i) => {
                    self.refused(model, i);
                    self.overtaken(model, i);
                }
                (Call::Borrow { .. }, Outcome::Granted { .. }) => {
                    self.granted_after_giving_up(model, i);
                }
                (_, Outcome::State { count, in_use, .. }) => self.state(model, i, *count, *in_use),
                _ => {}
            }
        }
    }
}

fn short(uuid: &str) -> String {
    uuid.chars().take(8).collect()
}
