//! The rules: each promise of API.md checked against a pool's model.

use std::collections::HashMap;
use std::fmt;

use super::decode::Outcome;
use super::model::{Lease, PoolModel};
use super::record::{Call, Op};
use super::spans::breakpoints;
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

    /// The returns in this pool of the lease UUID borrow `b` sent (none if it
    /// sent none).
    fn returns_of<'m>(&self, model: &'m PoolModel, b: usize) -> impl Iterator<Item = usize> + 'm
    where
        'h: 'm,
    {
        let ops = self.ops;
        let lease = match &ops[b].call {
            Call::Borrow {
                lease: Some(lease), ..
            } => Some(lease.as_str()),
            _ => None,
        };
        model
            .calls
            .iter()
            .copied()
            .filter(move |&r| match (lease, &ops[r].call) {
                (Some(lease), Call::Return { lease: returned }) => {
                    returned.eq_ignore_ascii_case(lease)
                }
                _ => false,
            })
    }

    /// Whether borrow `b`'s wait was given up: a return of its lease UUID was
    /// sent before it answered.
    fn given_up(&self, model: &PoolModel, b: usize) -> bool {
        let answered = self.ops[b].response_ms;
        self.returns_of(model, b)
            .any(|r| self.ops[r].invoke_ms <= answered)
    }

    /// Whether return `r` overlaps a borrow of its lease UUID in this pool
    /// that was not granted (refused, or no answer): it gave that wait up.
    fn gave_up_waiting(&self, model: &PoolModel, r: usize) -> bool {
        let (invoke, response) = (self.ops[r].invoke_ms, self.ops[r].response_ms);
        let Call::Return { lease: returned } = &self.ops[r].call else {
            return false;
        };
        // One pass over the pool's calls (not one per borrow: a soak's pool
        // has thousands of calls).
        model.calls.iter().any(|&b| {
            let borrow = &self.ops[b];
            matches!(&borrow.call, Call::Borrow { lease: Some(lease), .. }
                     if lease.eq_ignore_ascii_case(returned))
                && borrow.status != 200
                && borrow.invoke_ms <= response
                && invoke <= borrow.response_ms
        })
    }

    /// [`Rule::GrantedAfterGivingUp`].
    fn granted_after_giving_up(&mut self, model: &PoolModel, b: usize) {
        let invoke = self.ops[b].invoke_ms;
        let Some(granted) = model.leases.iter().find(|l| l.op == b).map(|l| l.grant_lo) else {
            return;
        };
        let cancel = self.returns_of(model, b).find(|&r| {
            let op = &self.ops[r];
            op.invoke_ms >= invoke
                && op.response_ms < granted
                && op.body.get("returned") == Some(&serde_json::Value::Bool(false))
        });
        if let Some(r) = cancel {
            let message = format!(
                "{}: granted after {} gave its wait up",
                self.describe(b),
                self.describe(r)
            );
            self.flag(Rule::GrantedAfterGivingUp, message);
        }
    }

    /// [`Rule::SharedPosition`]: no two leases surely live at once share a
    /// position.
    fn shared_positions(&mut self, model: &PoolModel) {
        let mut order: Vec<usize> = (0..model.leases.len()).collect();
        order.sort_by_key(|&l| (model.leases[l].position, model.leases[l].sure_start()));
        let mut previous: Option<usize> = None;
        for l in order {
            let lease = &model.leases[l];
            if let Some(p) = previous.filter(|&p| model.leases[p].position == lease.position) {
                let before = &model.leases[p];
                if lease.sure_start() < before.sure_end(None)
                    && lease.sure_start() < lease.sure_end(None)
                {
                    let message = format!(
                        "position {} held twice: {} was surely live until +{} but {} was surely live from +{}",
                        lease.position,
                        self.describe(before.op),
                        self.rel(before.sure_end(None)),
                        self.describe(lease.op),
                        self.rel(lease.sure_start()),
                    );
                    self.flag(Rule::SharedPosition, message);
                }
                // Keep the lease whose surely-live span reaches further.
                if before.sure_end(None) >= lease.sure_end(None) {
                    continue;
                }
            }
            previous = Some(l);
        }
    }

    /// The rules about one grant, in this order.
    fn grant(&mut self, model: &PoolModel, l: usize, lease: &Lease) {
        self.over_issue(model, l, lease);
        self.position_out_of_range(model, lease);
        self.not_lowest_position(model, l, lease);
    }

    /// [`Rule::OverIssue`]: at the write, the surely-live others plus this one
    /// fit `count`, for at least one placement of the write in its window.
    fn over_issue(&mut self, model: &PoolModel, l: usize, lease: &Lease) {
        let (a, b) = (lease.grant_lo, lease.response);
        let points = breakpoints(
            a,
            b,
            model
                .sure
                .touching(a, b)
                .chain(model.regime_spans.touching(a, b)),
        );
        let fits = points
            .iter()
            .any(|&t| (model.sure.at(t, Some(l)).count() as u64) < model.max_count(t));
        if !fits {
            let others = model.sure.at(a, Some(l)).count();
            let message = format!(
                "{} granted while {others} other leases were surely live and count was at most {} (at +{})",
                self.describe(lease.op),
                model.max_count(a),
                self.rel(a)
            );
            self.flag(Rule::OverIssue, message);
        }
    }

    /// [`Rule::PositionOutOfRange`]: the position is below some `count` in
    /// force while the server read its clock for the grant, in
    /// `[grant_lo, grant_hi]`.
    fn position_out_of_range(&mut self, model: &PoolModel, lease: &Lease) {
        let (a, b) = (lease.grant_lo, lease.grant_hi);
        let points = breakpoints(a, b, model.regime_spans.touching(a, b));
        if points.iter().all(|&t| lease.position >= model.max_count(t)) {
            let message = format!(
                "{}: position ≥ every count then in force",
                self.describe(lease.op)
            );
            self.flag(Rule::PositionOutOfRange, message);
        }
    }

    /// [`Rule::NotLowestPosition`]: no lower position was free throughout the
    /// grant, counting every lease possibly live then as holding its own. A
    /// borrow that could wait may have been handed its slot by another call
    /// (a return, or a waiter handing a freed slot to the head of the queue)
    /// that chose the position from its own read: any time in the window of
    /// a call that may have written the grant.
    fn not_lowest_position(&mut self, model: &PoolModel, l: usize, lease: &Lease) {
        let (mut a, b) = (lease.grant_lo, lease.grant_hi);
        if matches!(self.ops[lease.op].call, Call::Borrow { wait_ms, .. } if wait_ms > 0) {
            let ops = self.ops;
            let writers = model.calls.iter().map(|&c| &ops[c]).filter(|op| {
                let hands_off = match op.call {
                    Call::Return { .. } => true,
                    Call::Borrow { wait_ms, .. } => wait_ms > 0,
                    _ => false,
                };
                hands_off && op.invoke_ms <= b && op.response_ms >= lease.grant_lo
            });
            a = writers.map(|op| op.invoke_ms).fold(a, u64::min);
        }
        if model.unknown.touching(a, b).next().is_some() {
            // A lease nobody knows may hold any position.
            return;
        }
        let mut held: Vec<u64> = model
            .maybe
            .touching(a, b)
            .filter(|s| s.id != l)
            .filter_map(|s| model.leases.get(s.id))
            .map(|other| other.position)
            .collect();
        held.sort_unstable();
        held.dedup();
        let lowest_free = held
            .iter()
            .enumerate()
            .find(|(k, p)| *k as u64 != **p)
            .map_or(held.len() as u64, |(k, _)| k as u64);
        // Free throughout also means below every count possibly in force.
        let points = breakpoints(a, b, model.regime_spans.touching(a, b));
        let within_count = points.iter().all(|&t| lowest_free < model.min_count(t));
        if lowest_free < lease.position && within_count {
            let message = format!(
                "{}: position {lowest_free} was free throughout the grant",
                self.describe(lease.op)
            );
            self.flag(Rule::NotLowestPosition, message);
        }
    }

    /// [`Rule::ReturnedDeadLease`]: `returned: true` only for a live lease of
    /// this pool; [`Rule::LostLease`]: `false` never for one surely live.
    fn returned(
        &mut self,
        model: &PoolModel,
        r: usize,
        returned: bool,
        owner: Option<(&PoolModel, usize)>,
    ) {
        let op = &self.ops[r];
        let (invoke, response) = (op.invoke_ms, op.response_ms);
        let mine = owner
            .filter(|(m, _)| m.pool == model.pool)
            .map(|(m, l)| &m.leases[l]);
        let why = match (returned, owner, mine) {
            // The grant of a borrow given up while it waited, taken back
            // by this very return (the borrow then answers 409).
            (true, None, _) if self.gave_up_waiting(model, r) => None,
            (true, None, _) => Some("no such lease was ever granted".to_string()),
            (true, Some(_), None) => Some("the lease belongs to another pool".to_string()),
            (true, _, Some(lease)) => {
                let end = lease.maybe_end(Some(r));
                (end <= invoke || lease.grant_lo > response).then(|| {
                    format!(
                        "lease of {} was surely dead from +{}",
                        self.describe(lease.op),
                        self.rel(end)
                    )
                })
            }
            (false, _, Some(lease)) => {
                let end = lease.sure_end(Some(r));
                if lease.sure_start() <= invoke && response < end {
                    let message = format!(
                        "{}: returned false, but the lease of {} was surely live until +{}",
                        self.describe(r),
                        self.describe(lease.op),
                        self.rel(end)
                    );
                    self.flag(Rule::LostLease, message);
                }
                None
            }
            (false, _, None) => None,
        };
        if let Some(why) = why {
            let message = format!("{}: {why}", self.describe(r));
            self.flag(Rule::ReturnedDeadLease, message);
        }
    }

    /// [`Rule::LostWakeup`]: a 409 only when the pool was full, or its free
    /// slots were owed to borrowers that may have been waiting ahead: never
    /// definitely free (beyond those) all through the call (every read saw a
    /// free slot), nor for `wakeup_tolerance_ms` on end while it was waiting
    /// (a poller reads far more often than that).
    fn refused(&mut self, model: &PoolModel, w: usize) {
        let (a, b) = (self.ops[w].invoke_ms, self.ops[w].response_ms);
        let Call::Borrow { wait_ms, .. } = self.ops[w].call else {
            return;
        };
        let points = breakpoints(
            a,
            b,
            model
                .maybe
                .touching(a, b)
                .chain(model.regime_spans.touching(a, b))
                .chain(model.waiters.touching(a, b)),
        );
        let ops = self.ops;
        // Waiters that may have joined the queue before this borrower and
        // may still wait have the first claim on free slots (fair waiting).
        // A borrower that waits surely joined within the tolerance of its
        // invoke (the same allowance as [`Rule::Overtaken`]'s); one that does
        // not wait had all its call for others to join before it.
        let joined_by = if wait_ms.min(self.config.max_wait_ms) >= self.config.wakeup_tolerance_ms {
            b.min(a + self.config.wakeup_tolerance_ms)
        } else {
            b
        };
        let ahead = |t: u64| {
            model
                .waiters
                .at(t, Some(w))
                .filter(|s| ops[s.id].invoke_ms < joined_by)
                .count() as u64
        };
        let free = |t: u64| model.maybe.at(t, None).count() as u64 + ahead(t) < model.min_count(t);
        // Maximal runs [start, end) of definitely free ms.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (k, &t) in points.iter().enumerate() {
            let next = points.get(k + 1).copied().unwrap_or(b + 1);
            if !free(t) {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.1 == t => run.1 = next,
                _ => runs.push((t, next)),
            }
        }
        let waited_until = b.min(a.saturating_add(wait_ms)) + 1;
        let lost = runs.iter().find(|&&(start, end)| {
            (start == a && end == b + 1)
                || end.min(waited_until).saturating_sub(start) >= self.config.wakeup_tolerance_ms
        });
        if let Some(&(start, end)) = lost {
            let message = format!(
                "{}: a slot was definitely free from +{} to +{}",
                self.describe(w),
                self.rel(start),
                self.rel(end)
            );
            self.flag(Rule::LostWakeup, message);
        }
    }

    /// [`Rule::Overtaken`]: refused waiter `w` had surely joined the queue
    /// `wakeup_tolerance_ms` after its invoke and surely still waited until
    /// that long before its wait ended; no borrow that started after it
    /// joined may be granted in between.
    fn overtaken(&mut self, model: &PoolModel, w: usize) {
        let tolerance = self.config.wakeup_tolerance_ms;
        let Call::Borrow { wait_ms, .. } = self.ops[w].call else {
            return;
        };
        let invoke = self.ops[w].invoke_ms;
        let joined = invoke + tolerance;
        let waited_until = (invoke + wait_ms.min(self.config.max_wait_ms))
            .min(self.ops[w].response_ms)
            .saturating_sub(tolerance);
        if waited_until <= joined {
            return;
        }
        let ops = self.ops;
        let overtaker = model
            .leases
            .iter()
            .find(|lease| ops[lease.op].invoke_ms > joined && lease.response < waited_until);
        if let Some(lease) = overtaker {
            let message = format!(
                "{} waited from +{} to +{}, but {} started later and was granted first",
                self.describe(w),
                self.rel(joined),
                self.rel(waited_until),
                self.describe(lease.op)
            );
            self.flag(Rule::Overtaken, message);
        }
    }

    /// [`Rule::FenceOrder`]: a grant surely written before another (answered
    /// before the other was sent) has the lower fence; no two grants share one.
    fn fence_order(&mut self, model: &PoolModel) {
        let ops = self.ops;
        let mut by_fence: Vec<&Lease> = model.leases.iter().collect();
        by_fence.sort_by_key(|l| (std::cmp::Reverse(l.fence), l.response));
        // Sweeping from the highest fence down: the earliest answer among the
        // grants with a fence at least this one's.
        let mut earliest: Option<&Lease> = None;
        for (k, lease) in by_fence.iter().enumerate() {
            if let Some(twin) = by_fence.get(k + 1).filter(|next| next.fence == lease.fence) {
                let message = format!(
                    "{} and {} have the same fence {}",
                    self.describe(lease.op),
                    self.describe(twin.op),
                    lease.fence
                );
                self.flag(Rule::FenceOrder, message);
            }
            if let Some(before) = earliest.filter(|e| e.response < ops[lease.op].invoke_ms) {
                let message = format!(
                    "{} has fence {}, not above {} of {}, answered before it was sent",
                    self.describe(lease.op),
                    lease.fence,
                    before.fence,
                    self.describe(before.op)
                );
                self.flag(Rule::FenceOrder, message);
            }
            if earliest.is_none_or(|e| lease.response < e.response) {
                earliest = Some(lease);
            }
        }
    }

    /// [`Rule::ImpossibleState`]: a reported state must have held at some
    /// instant of the call.
    fn state(&mut self, model: &PoolModel, i: usize, count: u64, in_use: u64) {
        let (a, b) = (self.ops[i].invoke_ms, self.ops[i].response_ms);
        let at_least = model
            .sure
            .touching(a, b)
            .filter(|s| s.start <= a && s.end > b)
            .count() as u64;
        let at_most = model.maybe.touching(a, b).count() as u64;
        let count_possible = matches!(self.ops[i].call, Call::Register { .. })
            || model
                .regime_spans
                .touching(a, b)
                .any(|s| model.regimes[s.id].count == Some(count));
        if !(at_least..=at_most).contains(&in_use) || !count_possible {
            let message = format!(
                "{}: in_use must be in {at_least}..={at_most} and count one then in force",
                self.describe(i)
            );
            self.flag(Rule::ImpossibleState, message);
        }
    }

    /// [`Rule::WrongExistence`]: "no pool" only when it may have been absent;
    /// a pool's answer only when it may have existed.
    fn existence(&mut self, model: &PoolModel, i: usize, outcome: &Outcome) {
        let (a, b) = (self.ops[i].invoke_ms, self.ops[i].response_ms);
        let needs_pool = match (&self.ops[i].call, outcome) {
            (_, Outcome::NotFound | Outcome::Deleted(false)) => false,
            (Call::Register { .. }, _) | (_, Outcome::Unknown) => return,
            _ => true,
        };
        if !model.possibly(needs_pool, a, b, i) {
            let message = format!(
                "{}: the pool surely {} throughout",
                self.describe(i),
                if needs_pool {
                    "did not exist"
                } else {
                    "existed"
                }
            );
            self.flag(Rule::WrongExistence, message);
        }
    }
}

fn short(uuid: &str) -> String {
    uuid.chars().take(8).collect()
}
