//! The rules about grants: positions, `count`, and fences.

use super::{Checker, Rule};
use crate::history::model::{Lease, PoolModel};
use crate::history::record::Call;
use crate::history::spans::breakpoints;

impl Checker<'_> {
    /// [`Rule::SharedPosition`]: no two leases surely live at once share a
    /// position.
    pub(super) fn shared_positions(&mut self, model: &PoolModel) {
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
    pub(super) fn grant(&mut self, model: &PoolModel, l: usize, lease: &Lease) {
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

    /// [`Rule::FenceOrder`]: a grant surely written before another (answered
    /// before the other was sent) has the lower fence; no two grants share one.
    pub(super) fn fence_order(&mut self, model: &PoolModel) {
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
}
