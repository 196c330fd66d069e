//! The interval model of one pool: when each lease can have been live and
//! which `count` can have been in force, as spans of whole milliseconds.

use std::collections::HashMap;

use super::decode::Outcome;
use super::record::{Call, Op};
use super::spans::{Span, Spans};

/// A granted lease and what we know of its life.
pub(super) struct Lease {
    pub(super) op: usize,
    pub(super) id: String,
    pub(super) position: u64,
    /// Bounds of the server's clock reading at the grant.
    pub(super) grant_lo: u64,
    pub(super) grant_hi: u64,
    pub(super) response: u64,
    pub(super) expiry_lo: u64,
    pub(super) expiry_hi: u64,
    pub(super) enders: Vec<Ender>,
}

/// A call that may have ended a lease (a return of it, a delete of its pool).
pub(super) struct Ender {
    pub(super) op: usize,
    /// It may be dead from this ms on.
    pub(super) from: u64,
    /// It is surely dead from this ms on, if the call surely took effect.
    pub(super) by: Option<u64>,
}

impl Lease {
    /// End of the surely-live span, ignoring ender `except`.
    pub(super) fn sure_end(&self, except: Option<usize>) -> u64 {
        self.enders
            .iter()
            .filter(|e| Some(e.op) != except)
            .map(|e| e.from)
            .fold(self.expiry_lo, u64::min)
    }

    /// End of the possibly-live span, ignoring ender `except`.
    pub(super) fn maybe_end(&self, except: Option<usize>) -> u64 {
        self.enders
            .iter()
            .filter(|e| Some(e.op) != except)
            .filter_map(|e| e.by)
            .fold(self.expiry_hi, u64::min)
    }

    pub(super) fn sure_start(&self) -> u64 {
        self.response + 1
    }
}

/// A `count` (or no pool: `None`) set by a register or delete (or, op `None`,
/// the absence before any); when it is possibly in force is in `regime_spans`.
pub(super) struct Regime {
    pub(super) op: Option<usize>,
    pub(super) count: Option<u64>,
}

/// Everything known about one pool's history.
pub(super) struct PoolModel {
    pub(super) pool: String,
    /// This pool's calls: indices into the history, in order.
    pub(super) calls: Vec<usize>,
    pub(super) leases: Vec<Lease>,
    /// Surely-live spans of `leases` (id = lease index).
    pub(super) sure: Spans,
    /// Possibly-live spans: known leases (id = index) and unknown ones
    /// (id ≥ `leases.len()`).
    pub(super) maybe: Spans,
    pub(super) unknown: Spans,
    pub(super) regimes: Vec<Regime>,
    /// Spans of `regimes` (id = regime index).
    pub(super) regime_spans: Spans,
}

impl PoolModel {
    /// The model of `pool` from its calls (indices into `ops`, in order), and
    /// the grants left out of it because their expiry contradicts their call's
    /// window (op index, why).
    pub(super) fn build(
        ops: &[Op],
        outcomes: &[Outcome],
        max_ttl_ms: u64,
        pool: String,
        calls: Vec<usize>,
    ) -> (Self, Vec<(usize, String)>) {
        let members = &calls[..];
        let mut bad_grants = Vec::new();
        let window = |i: usize| (ops[i].invoke_ms, ops[i].response_ms);

        // Counts in force: a register or delete is possibly in force from its
        // invoke until a later call that surely took effect has answered.
        let mut definite: Vec<(u64, u64)> = members
            .iter()
            .filter(|&&i| {
                matches!(
                    (&ops[i].call, &outcomes[i]),
                    (Call::Register { .. }, Outcome::State { .. })
                        | (Call::Delete, Outcome::Deleted(_))
                )
            })
            .map(|&i| window(i))
            .collect();
        definite.sort_unstable();
        let mut earliest_answer_from = vec![u64::MAX; definite.len() + 1];
        for k in (0..definite.len()).rev() {
            earliest_answer_from[k] = earliest_answer_from[k + 1].min(definite[k].1);
        }
        let superseded_at = |after: u64| {
            let k = definite.partition_point(|(inv, _)| *inv <= after);
            earliest_answer_from[k].saturating_add(1)
        };
        // Before its first register, no pool.
        let mut regimes = vec![Regime {
            op: None,
            count: None,
        }];
        let mut regime_spans = vec![Span {
            start: 0,
            end: superseded_at(0),
            id: 0,
        }];
        for &i in members {
            let count = match (&ops[i].call, &outcomes[i]) {
                (Call::Register { count }, Outcome::State { .. } | Outcome::Unknown) => {
                    Some(u64::from(*count))
                }
                (Call::Delete, Outcome::Deleted(_) | Outcome::Unknown) => None,
                _ => continue,
            };
            regime_spans.push(Span {
                start: ops[i].invoke_ms,
                end: superseded_at(ops[i].response_ms),
                id: regimes.len(),
            });
            regimes.push(Regime { op: Some(i), count });
        }

        let deletes: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| ops[i].call == Call::Delete)
            .collect();
        // The first answer of a delete that surely took effect after `after`.
        let surely_deleted_by = |after: u64| {
            deletes
                .iter()
                .filter(|&&d| {
                    matches!(outcomes[d], Outcome::Deleted(_)) && ops[d].invoke_ms > after
                })
                .map(|&d| ops[d].response_ms + 1)
                .min()
        };

        let mut returns_of: HashMap<String, Vec<usize>> = HashMap::new();
        for &i in members {
            if let Call::Return { lease } = &ops[i].call {
                returns_of.entry(lease.to_lowercase()).or_default().push(i);
            }
        }

        let mut leases = Vec::new();
        let mut unknown = Vec::new();
        for &i in members {
            let Call::Borrow {
                ttl_ms: asked_ttl_ms,
                ..
            } = ops[i].call
            else {
                continue;
            };
            let (invoke, response) = window(i);
            match &outcomes[i] {
                Outcome::Granted {
                    lease,
                    position,
                    expires_at_unix,
                    ttl_ms,
                } => {
                    let second = expires_at_unix.saturating_mul(1000);
                    let expiry_lo = (invoke + ttl_ms).max(second);
                    let expiry_hi = (response + ttl_ms).min(second + 999);
                    if expiry_lo > expiry_hi {
                        bad_grants.push((
                            i,
                            format!("expires_at_unix {expires_at_unix} with ttl {ttl_ms} ms is outside the call's window"),
                        ));
                        continue;
                    }
                    let mut record = Lease {
                        op: i,
                        id: lease.clone(),
                        position: *position,
                        grant_lo: expiry_lo - ttl_ms,
                        grant_hi: expiry_hi - ttl_ms,
                        response,
                        expiry_lo,
                        expiry_hi,
                        enders: Vec::new(),
                    };
                    for &r in returns_of.get(lease).map(Vec::as_slice).unwrap_or_default() {
                        // A return sent after the grant was answered, and answered
                        // 200, surely ran after the lease was stored.
                        let after = ops[r].invoke_ms >= response;
                        let answered = matches!(outcomes[r], Outcome::Returned(_));
                        record.enders.push(Ender {
                            op: r,
                            from: ops[r].invoke_ms,
                            by: (after && answered).then_some(ops[r].response_ms + 1),
                        });
                    }
                    for &d in &deletes {
                        if ops[d].response_ms >= record.grant_lo {
                            let answered = matches!(outcomes[d], Outcome::Deleted(_));
                            record.enders.push(Ender {
                                op: d,
                                from: ops[d].invoke_ms,
                                by: (answered && ops[d].invoke_ms > response)
                                    .then_some(ops[d].response_ms + 1),
                            });
                        }
                    }
                    leases.push(record);
                }
                Outcome::Unknown => {
                    let ttl = asked_ttl_ms.clamp(1, max_ttl_ms);
                    let end = surely_deleted_by(response)
                        .map_or(response + ttl, |d| d.min(response + ttl));
                    unknown.push((invoke, end));
                }
                _ => {}
            }
        }

        let sure = leases
            .iter()
            .enumerate()
            .map(|(id, l)| Span {
                start: l.sure_start(),
                end: l.sure_end(None),
                id,
            })
            .collect();
        let n = leases.len();
        let unknown_spans: Vec<Span> = unknown
            .iter()
            .enumerate()
            .map(|(k, &(start, end))| Span {
                start,
                end,
                id: n + k,
            })
            .collect();
        let maybe = leases
            .iter()
            .enumerate()
            .map(|(id, l)| Span {
                start: l.grant_lo,
                end: l.maybe_end(None),
                id,
            })
            .chain(unknown_spans.iter().copied())
            .collect();
        let model = PoolModel {
            pool,
            calls,
            leases,
            sure: Spans::new(sure),
            maybe: Spans::new(maybe),
            unknown: Spans::new(unknown_spans),
            regimes,
            regime_spans: Spans::new(regime_spans),
        };
        (model, bad_grants)
    }

    /// Counts (no pool = 0) possibly in force at some instant of ms `t`.
    fn counts_at(&self, t: u64) -> impl Iterator<Item = u64> + '_ {
        self.regime_spans
            .at(t, None)
            .map(|s| self.regimes[s.id].count.unwrap_or(0))
    }

    pub(super) fn max_count(&self, t: u64) -> u64 {
        self.counts_at(t).max().unwrap_or(0)
    }

    pub(super) fn min_count(&self, t: u64) -> u64 {
        self.counts_at(t).min().unwrap_or(0)
    }

    /// Whether some regime other than `except`'s, with (`present`) or without a
    /// pool, is possibly in force during `[a, b]`.
    pub(super) fn possibly(&self, present: bool, a: u64, b: u64, except: usize) -> bool {
        self.regime_spans
            .touching(a, b)
            .map(|s| &self.regimes[s.id])
            .any(|r| r.op != Some(except) && r.count.is_some() == present)
    }
}
