//! The rules about waits, returns, states and existence.

use super::{Checker, Rule};
use crate::history::decode::Outcome;
use crate::history::model::PoolModel;
use crate::history::record::Call;
use crate::history::spans::breakpoints;

impl<'h> Checker<'h> {
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
    pub(super) fn given_up(&self, model: &PoolModel, b: usize) -> bool {
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
    pub(super) fn granted_after_giving_up(&mut self, model: &PoolModel, b: usize) {
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

    /// [`Rule::ReturnedDeadLease`]: `returned: true` only for a live lease of
    /// this pool; [`Rule::LostLease`]: `false` never for one surely live.
    pub(super) fn returned(
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
    pub(super) fn refused(&mut self, model: &PoolModel, w: usize) {
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
        // A waiter reads no faster than the store answers: how late it
        // answered past its wait's end shows how long its last store call
        // took then (hundreds of ms on a loaded machine), so a free run
        // that short may fall between two of its reads.
        let deadline = a.saturating_add(wait_ms.min(self.config.max_wait_ms));
        let tolerance = self.config.wakeup_tolerance_ms + b.saturating_sub(deadline);
        let lost = runs.iter().find(|&&(start, end)| {
            (start == a && end == b + 1) || end.min(waited_until).saturating_sub(start) >= tolerance
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
    pub(super) fn overtaken(&mut self, model: &PoolModel, w: usize) {
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

    /// [`Rule::ImpossibleState`]: a reported state must have held at some
    /// instant of the call.
    pub(super) fn state(&mut self, model: &PoolModel, i: usize, count: u64, in_use: u64) {
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
    pub(super) fn existence(&mut self, model: &PoolModel, i: usize, outcome: &Outcome) {
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
