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
    pub(super) fence: u64,
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
    /// When each borrow with a wait may have been waiting in the queue (id =
    /// op index): all through its call, as the moment it joined and the one
    /// it was granted (or gave up) can be anywhere in it.
    pub(super) waiters: Spans,
}

impl PoolModel {
    /// The model of `pool` from its calls (indices into `ops`, in order), and
    /// the grants left out of it because their expiry contradicts their call's
    /// window (op index, why).
    pub(super) fn build(
        ops: &[Op],
        outcomes: &[Outcome],
        config: &super::CheckConfig,
        pool: String,
        calls: Vec<usize>,
    ) -> (Self, Vec<(usize, String)>) {
        let history = PoolCalls {
            ops,
            outcomes,
            calls: &calls,
        };
        let (regimes, regime_spans) = history.regimes();
        let found = history.leases(config);
        let unknown: Vec<Span> = found
            .unknown
            .iter()
            .enumerate()
            .map(|(k, &(start, end))| Span {
                start,
                end,
                id: found.known.len() + k,
            })
            .collect();
        let waiters = Spans::new(history.waiters(&found.known, config.max_wait_ms));
        let model = PoolModel {
            waiters,
            pool,
            calls,
            sure: Spans::new(surely_live(&found.known)),
            maybe: Spans::new(possibly_live(&found.known, &unknown)),
            unknown: Spans::new(unknown),
            leases: found.known,
            regimes,
            regime_spans,
        };
        (model, found.bad_grants)
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

/// One pool's calls and their answers: what [`PoolModel::build`] reads.
struct PoolCalls<'a> {
    ops: &'a [Op],
    outcomes: &'a [Outcome],
    calls: &'a [usize],
}

/// The leases one pool's borrows may have stored.
struct FoundLeases {
    known: Vec<Lease>,
    /// `[start, end)` of each lease a borrow answered 5xx may have stored.
    unknown: Vec<(u64, u64)>,
    /// Grants whose expiry contradicts their window: (op index, why).
    bad_grants: Vec<(usize, String)>,
}

impl PoolCalls<'_> {
    fn window(&self, i: usize) -> (u64, u64) {
        (self.ops[i].invoke_ms, self.ops[i].response_ms)
    }

    /// Every `count` (or absence) set and when it is possibly in force: from
    /// the invoke of the register or delete that set it until a later one
    /// that surely took effect has answered. Regime 0 is the absence before
    /// the first register.
    fn regimes(&self) -> (Vec<Regime>, Spans) {
        let superseded = Superseded::new(self.definite_changes());
        let mut regimes = vec![Regime {
            op: None,
            count: None,
        }];
        let mut spans = vec![Span {
            start: 0,
            end: superseded.at(0),
            id: 0,
        }];
        for &i in self.calls {
            let count = match (&self.ops[i].call, &self.outcomes[i]) {
                (Call::Register { count }, Outcome::State { .. } | Outcome::Unknown) => {
                    Some(u64::from(*count))
                }
                (Call::Delete, Outcome::Deleted(_) | Outcome::Unknown) => None,
                _ => continue,
            };
            let (invoke, response) = self.window(i);
            spans.push(Span {
                start: invoke,
                end: superseded.at(response),
                id: regimes.len(),
            });
            regimes.push(Regime { op: Some(i), count });
        }
        (regimes, Spans::new(spans))
    }

    /// The windows of the registers and deletes that surely took effect.
    fn definite_changes(&self) -> Vec<(u64, u64)> {
        self.calls
            .iter()
            .filter(|&&i| {
                matches!(
                    (&self.ops[i].call, &self.outcomes[i]),
                    (Call::Register { .. }, Outcome::State { .. })
                        | (Call::Delete, Outcome::Deleted(_))
                )
            })
            .map(|&i| self.window(i))
            .collect()
    }

    fn deletes(&self) -> Vec<usize> {
        self.calls
            .iter()
            .copied()
            .filter(|&i| self.ops[i].call == Call::Delete)
            .collect()
    }

    /// The returns sent to this pool, by lowercase lease UUID.
    fn returns_by_lease(&self) -> HashMap<String, Vec<usize>> {
        let mut returns: HashMap<String, Vec<usize>> = HashMap::new();
        for &i in self.calls {
            if let Call::Return { lease } = &self.ops[i].call {
                returns.entry(lease.to_lowercase()).or_default().push(i);
            }
        }
        returns
    }

    /// The leases granted (with what may have ended them) and the unknown
    /// ones: a borrow answered 5xx may have stored one.
    fn leases(&self, config: &super::CheckConfig) -> FoundLeases {
        let max_ttl_ms = config.max_ttl_ms;
        let deletes = self.deletes();
        let returns = self.returns_by_lease();
        let mut found = FoundLeases {
            known: Vec::new(),
            unknown: Vec::new(),
            bad_grants: Vec::new(),
        };
        for &i in self.calls {
            let Call::Borrow { ttl_ms: asked, .. } = self.ops[i].call else {
                continue;
            };
            match &self.outcomes[i] {
                Outcome::Granted {
                    lease,
                    position,
                    expires_at_unix,
                    left_ms,
                    ttl_ms,
                    fence,
                } => match self.granted(i, lease, *position, *expires_at_unix, *left_ms, *ttl_ms) {
                    Ok(mut granted) => {
                        granted.fence = *fence;
                        let returns = returns.get(lease).map(Vec::as_slice).unwrap_or_default();
                        granted.enders = self.enders(&granted, returns, &deletes);
                        found.known.push(granted);
                    }
                    Err(why) => found.bad_grants.push((i, why)),
                },
                Outcome::Unknown => {
                    let ttl = asked.clamp(1, max_ttl_ms);
                    found
                        .unknown
                        .push(self.unknown_lease(i, ttl, config.max_wait_ms, &deletes));
                }
                // Given up, and a return of its lease UUID sent meanwhile
                // answered `true`: a slot may have been handed to it and
                // taken back by that return.
                Outcome::Exhausted => {
                    if let Some(end) = self.taken_back(i, &returns) {
                        found.unknown.push((self.window(i).0, end + 1));
                    }
                }
                // Told the pool was not found: its write may have landed
                // before a delete took the pool (and the lease) during the
                // call, so it may have held a position until its answer.
                Outcome::NotFound => {
                    let (invoke, response) = self.window(i);
                    found.unknown.push((invoke, response + 1));
                }
                _ => {}
            }
        }
        found
    }

    /// A granted lease's grant and expiry bounds, from its call's window and
    /// the answer: it expires `left_ms` after the server's clock reading for
    /// the answer (`expires_at_unix` is whole seconds, so it bounds the
    /// expiry to a second), and was granted `ttl_ms` before it expires (a
    /// slot handed to a waiter before it answered); `Err` if they contradict
    /// each other.
    fn granted(
        &self,
        i: usize,
        lease: &str,
        position: u64,
        expires_at_unix: u64,
        left_ms: u64,
        ttl_ms: u64,
    ) -> Result<Lease, String> {
        let (invoke, response) = self.window(i);
        let second = expires_at_unix.saturating_mul(1000);
        let expiry_lo = (invoke + left_ms).max(second);
        let expiry_hi = (response + left_ms).min(second + 999);
        if expiry_lo > expiry_hi {
            return Err(format!(
                "expires_at_unix {expires_at_unix} with {left_ms} ms left is outside the call's window"
            ));
        }
        Ok(Lease {
            op: i,
            id: lease.to_string(),
            position,
            fence: 0,
            grant_lo: expiry_lo.saturating_sub(ttl_ms).max(invoke),
            grant_hi: expiry_hi.saturating_sub(ttl_ms).max(invoke),
            response,
            expiry_lo,
            expiry_hi,
            enders: Vec::new(),
        })
    }

    /// The returns of `lease` and the deletes of its pool that may have ended it.
    fn enders(&self, lease: &Lease, returns: &[usize], deletes: &[usize]) -> Vec<Ender> {
        let ops = self.ops;
        let mut enders = Vec::new();
        for &r in returns {
            // A return sent after the grant was answered, and answered
            // 200, surely ran after the lease was stored.
            let after = ops[r].invoke_ms >= lease.response;
            let answered = matches!(self.outcomes[r], Outcome::Returned(_));
            enders.push(Ender {
                op: r,
                from: ops[r].invoke_ms,
                by: (after && answered).then_some(ops[r].response_ms + 1),
            });
        }
        for &d in deletes {
            if ops[d].response_ms >= lease.grant_lo {
                let answered = matches!(self.outcomes[d], Outcome::Deleted(_));
                enders.push(Ender {
                    op: d,
                    from: ops[d].invoke_ms,
                    by: (answered && ops[d].invoke_ms > lease.response)
                        .then_some(ops[d].response_ms + 1),
                });
            }
        }
        enders
    }

    /// The waiting spans of this pool's borrows with a wait (see
    /// [`PoolModel::waiters`]).
    fn waiters(&self, granted: &[Lease], max_wait_ms: u64) -> Vec<Span> {
        let granted: std::collections::HashSet<usize> = granted.iter().map(|l| l.op).collect();
        self.calls
            .iter()
            .filter(|&&i| matches!(self.ops[i].call, Call::Borrow { wait_ms, .. } if wait_ms > 0))
            .filter_map(|&i| {
                let (invoke, response) = self.window(i);
                let end = match self.outcomes[i] {
                    // Refused, told the pool was deleted while it waited, or
                    // granted at any time up to its answer.
                    Outcome::Exhausted | Outcome::NotFound => response + 1,
                    Outcome::Granted { .. } if granted.contains(&i) => response + 1,
                    // No answer (a 5xx, or its client died): its ticket may
                    // wait on until its give-up time and the grace after.
                    Outcome::Unknown => {
                        let Call::Borrow { wait_ms, .. } = self.ops[i].call else {
                            return None;
                        };
                        let ticket_ends = invoke
                            + wait_ms.min(max_wait_ms)
                            + 1000
                            + semaphore::domain::TICKET_GRACE_MS;
                        response.max(ticket_ends) + 1
                    }
                    _ => return None,
                };
                Some(Span {
                    start: invoke,
                    end,
                    id: i,
                })
            })
            .collect()
    }

    /// For borrow `i` answered 409 after a return of the lease UUID it sent
    /// was sent: when the last such return that answered `true` did (a slot
    /// handed to it then may have been what that return freed).
    pub(super) fn taken_back(
        &self,
        i: usize,
        returns: &HashMap<String, Vec<usize>>,
    ) -> Option<u64> {
        let (invoke, answered) = self.window(i);
        let Call::Borrow {
            lease: Some(lease), ..
        } = &self.ops[i].call
        else {
            return None;
        };
        returns
            .get(&lease.to_lowercase())?
            .iter()
            .map(|&r| &self.ops[r])
            .filter(|r| r.invoke_ms <= answered && r.response_ms >= invoke)
            .filter(|r| r.body.get("returned") == Some(&serde_json::Value::Bool(true)))
            .map(|r| r.response_ms)
            .max()
    }

    /// `[start, end)` of the lease borrow `i` (answered 5xx, or not at all)
    /// may have stored: from its invoke until its ttl after the last moment
    /// it can have been granted, or until a delete that surely took effect
    /// after that. A borrow that waited left a ticket that can be handed a
    /// slot until its give-up time (rounded up to a second) and a second of
    /// grace, whatever became of its call.
    fn unknown_lease(
        &self,
        i: usize,
        ttl_ms: u64,
        max_wait_ms: u64,
        deletes: &[usize],
    ) -> (u64, u64) {
        let (invoke, answered) = self.window(i);
        let response = match self.ops[i].call {
            Call::Borrow { wait_ms, .. } if wait_ms > 0 => answered
                .max(invoke + wait_ms.min(max_wait_ms) + 1000 + semaphore::domain::TICKET_GRACE_MS),
            _ => answered,
        };
        let deleted = deletes
            .iter()
            .filter(|&&d| {
                matches!(self.outcomes[d], Outcome::Deleted(_)) && self.ops[d].invoke_ms > answered
            })
            .map(|&d| self.ops[d].response_ms + 1)
            .min();
        let end = deleted.map_or(response + ttl_ms, |d| d.min(response + ttl_ms));
        (invoke, end)
    }
}

/// When a register or delete stops being possibly in force: once a later one
/// that surely took effect has answered.
struct Superseded {
    /// Windows of the changes that surely took effect, by invoke.
    definite: Vec<(u64, u64)>,
    /// `earliest_answer_from[k]`: the earliest answer among `definite[k..]`.
    earliest_answer_from: Vec<u64>,
}

impl Superseded {
    fn new(mut definite: Vec<(u64, u64)>) -> Self {
        definite.sort_unstable();
        let mut earliest_answer_from = vec![u64::MAX; definite.len() + 1];
        for k in (0..definite.len()).rev() {
            earliest_answer_from[k] = earliest_answer_from[k + 1].min(definite[k].1);
        }
        Superseded {
            definite,
            earliest_answer_from,
        }
    }

    /// The first ms by which a change invoked after ms `after` has surely
    /// landed (`u64::MAX`: none is known to).
    fn at(&self, after: u64) -> u64 {
        let k = self
            .definite
            .partition_point(|(invoke, _)| *invoke <= after);
        self.earliest_answer_from[k].saturating_add(1)
    }
}

/// Surely-live spans of the leases (id = lease index).
fn surely_live(leases: &[Lease]) -> Vec<Span> {
    leases
        .iter()
        .enumerate()
        .map(|(id, l)| Span {
            start: l.sure_start(),
            end: l.sure_end(None),
            id,
        })
        .collect()
}

/// Possibly-live spans of the known leases (id = lease index), then the
/// unknown ones.
fn possibly_live(leases: &[Lease], unknown: &[Span]) -> Vec<Span> {
    leases
        .iter()
        .enumerate()
        .map(|(id, l)| Span {
            start: l.grant_lo,
            end: l.maybe_end(None),
            id,
        })
        .chain(unknown.iter().copied())
        .collect()
}
