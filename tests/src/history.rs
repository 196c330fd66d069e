//! A record of what clients saw of the API, and a checker of API.md's promises
//! against it.
//!
//! Times are wall-clock Unix milliseconds, the clock the server judges expiry
//! by (`semaphore::service::now_ms`): a lease is live at ms `t` iff
//! `t < expires_at_ms`. Recorded times are that clock read just before the
//! call and just after it, so every server reading of the clock and every store
//! effect of a call lies inside its window `[invoke_ms, response_ms]`.
//!
//! The checker reports only what holds for *every* placement of effects inside
//! their windows, so each report is a definite violation, never a scheduling
//! artefact. The one heuristic is rule [`Rule::LostWakeup`]'s tolerance.
//!
//! Each granted lease gets two spans of whole milliseconds:
//! - *surely live* `[borrow response + 1, earliest possible end)`: stored and
//!   unexpired throughout each ms; the end is its earliest possible expiry or
//!   the invoke of any return of it or any delete of its pool;
//! - *possibly live* `[earliest grant, latest possible end)`: the end is its
//!   latest possible expiry or just after a return/delete that surely ended it.
//!
//! With faults, a call answered 5xx may or may not have taken effect. A borrow
//! answered 5xx may have stored a lease nobody knows: an *unknown* lease,
//! possibly live from its invoke until its response + ttl, whose position is
//! unknown. Returns, deletes and registers answered 5xx may have landed.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;

use serde_json::{Map, Value};

/// What a client asked.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Register {
        count: u32,
    },
    Inspect,
    Delete,
    /// `ttl_ms`/`wait_ms` as sent (before the server's clamping).
    Borrow {
        ttl_ms: u64,
        wait_ms: u64,
    },
    Return {
        lease: String,
    },
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Call::Register { .. } => "PUT",
            Call::Inspect => "GET",
            Call::Delete => "DELETE",
            Call::Borrow { .. } => "borrow",
            Call::Return { .. } => "return",
        }
    }
}

/// One completed call: who, what, the answer, and when.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    /// The pool UUID as sent.
    pub pool: String,
    pub call: Call,
    pub status: u16,
    pub body: Value,
    pub invoke_ms: u64,
    pub response_ms: u64,
}

/// Collects ops from many concurrent clients.
#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&self, op: Op) {
        self.lock().push(op);
    }

    pub fn snapshot(&self) -> Vec<Op> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        // A panicking client leaves at most a missing op, never a torn one.
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the checker must know about the server and the run.
#[derive(Clone, Copy, Debug)]
pub struct CheckConfig {
    /// The server's `max_ttl_ms`: `expires_in` must be the ttl clamped to it.
    pub max_ttl_ms: u64,
    /// A 409 is flagged when a slot was definitely free for this long inside
    /// its wait (pollers see a return within ~100 ms; slack for a loaded machine).
    pub wakeup_tolerance_ms: u64,
    /// The store may fail: 502s are expected, and a call answered 5xx has an
    /// unknown outcome.
    pub faults: bool,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            max_ttl_ms: 3_600_000,
            wakeup_tolerance_ms: 250,
            faults: false,
        }
    }
}

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

/// Checks a complete history (every call answered). Returns every definite
/// violation found, described with op numbers (indices into `ops`) and times
/// relative to the first invoke.
pub fn check(ops: &[Op], config: &CheckConfig) -> Vec<Violation> {
    let mut checker = Checker {
        ops,
        config,
        t0: ops.iter().map(|o| o.invoke_ms).min().unwrap_or(0),
        out: Vec::new(),
    };
    let outcomes: Vec<Outcome> = (0..ops.len()).map(|i| checker.outcome(i)).collect();
    let mut by_pool: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        by_pool.entry(op.pool.to_lowercase()).or_default().push(i);
    }
    let models: Vec<PoolModel> = by_pool
        .iter()
        .map(|(pool, members)| PoolModel::build(&mut checker, &outcomes, pool, members))
        .collect();
    // Every granted lease, by UUID, to judge returns sent to any pool.
    let mut owners: HashMap<&str, (usize, usize)> = HashMap::new();
    for (m, model) in models.iter().enumerate() {
        for (l, lease) in model.leases.iter().enumerate() {
            if owners.insert(lease.id.as_str(), (m, l)).is_some() {
                let message = format!(
                    "{} handed out a lease UUID already granted",
                    checker.describe(lease.op)
                );
                checker.flag(Rule::BadResponse, message);
            }
        }
    }
    for model in &models {
        checker.check_pool(model, &outcomes, &models, &owners);
    }
    checker.out
}

/// Per op: counts by call and status, for a run's log line.
pub fn summary(ops: &[Op]) -> String {
    let mut counts: BTreeMap<(&str, u16), usize> = BTreeMap::new();
    for op in ops {
        *counts.entry((op.call.name(), op.status)).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|((name, status), n)| format!("{name} {status}: {n}"))
        .collect();
    format!("{} ops ({})", ops.len(), parts.join(", "))
}

/// An answer, decoded and validated against API.md.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// `PUT`/`GET` 200.
    State {
        count: u64,
        in_use: u64,
        available: u64,
    },
    Deleted(bool),
    Granted {
        lease: String,
        position: u64,
        expires_at_unix: u64,
        ttl_ms: u64,
    },
    Returned(bool),
    NotFound,
    Exhausted,
    /// 5xx, or an answer already reported as bad: it may or may not have landed.
    Unknown,
}

/// A granted lease and what we know of its life.
struct Lease {
    op: usize,
    id: String,
    position: u64,
    /// Bounds of the server's clock reading at the grant.
    grant_lo: u64,
    grant_hi: u64,
    response: u64,
    expiry_lo: u64,
    expiry_hi: u64,
    enders: Vec<Ender>,
}

/// A call that may have ended a lease (a return of it, a delete of its pool).
struct Ender {
    op: usize,
    /// It may be dead from this ms on.
    from: u64,
    /// It is surely dead from this ms on, if the call surely took effect.
    by: Option<u64>,
}

impl Lease {
    /// End of the surely-live span, ignoring ender `except`.
    fn sure_end(&self, except: Option<usize>) -> u64 {
        self.enders
            .iter()
            .filter(|e| Some(e.op) != except)
            .map(|e| e.from)
            .fold(self.expiry_lo, u64::min)
    }

    /// End of the possibly-live span, ignoring ender `except`.
    fn maybe_end(&self, except: Option<usize>) -> u64 {
        self.enders
            .iter()
            .filter(|e| Some(e.op) != except)
            .filter_map(|e| e.by)
            .fold(self.expiry_hi, u64::min)
    }

    fn sure_start(&self) -> u64 {
        self.response + 1
    }
}

/// A `count` (or no pool: `None`) set by a register or delete (or, op `None`,
/// the absence before any); when it is possibly in force is in `regime_spans`.
struct Regime {
    op: Option<usize>,
    count: Option<u64>,
}

/// Half-open ms spans `[start, end)` tagged with an id, queried by window.
struct Spans {
    bounded: Vec<Span>,
    longest: u64,
    unbounded: Vec<Span>,
}

#[derive(Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
    id: usize,
}

impl Spans {
    fn new(spans: Vec<Span>) -> Self {
        let (mut bounded, unbounded): (Vec<Span>, Vec<Span>) =
            spans.into_iter().partition(|s| s.end != u64::MAX);
        bounded.sort_by_key(|s| s.start);
        let longest = bounded
            .iter()
            .map(|s| s.end.saturating_sub(s.start))
            .max()
            .unwrap_or(0);
        Spans {
            bounded,
            longest,
            unbounded,
        }
    }

    /// Spans covering at least one ms of the closed window `[a, b]`.
    fn touching(&self, a: u64, b: u64) -> impl Iterator<Item = &Span> + '_ {
        let first = self
            .bounded
            .partition_point(|s| s.start < a.saturating_sub(self.longest));
        self.bounded[first..]
            .iter()
            .take_while(move |s| s.start <= b)
            .chain(self.unbounded.iter().filter(move |s| s.start <= b))
            .filter(move |s| s.end > a && s.end > s.start)
    }

    /// Spans covering ms `t`, other than `except`.
    fn at(&self, t: u64, except: Option<usize>) -> impl Iterator<Item = &Span> + '_ {
        self.touching(t, t).filter(move |s| Some(s.id) != except)
    }
}

/// The ms of `[a, b]` where any of these spans starts or ends, with `a`,
/// sorted: between neighbours, every span count is constant.
fn breakpoints<'s>(a: u64, b: u64, spans: impl Iterator<Item = &'s Span>) -> Vec<u64> {
    let mut points = vec![a];
    for s in spans {
        points.extend([s.start, s.end].into_iter().filter(|t| *t > a && *t <= b));
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// Everything known about one pool's history.
struct PoolModel {
    pool: String,
    leases: Vec<Lease>,
    /// Surely-live spans of `leases` (id = lease index).
    sure: Spans,
    /// Possibly-live spans: known leases (id = index) and unknown ones
    /// (id ≥ `leases.len()`).
    maybe: Spans,
    unknown: Spans,
    regimes: Vec<Regime>,
    /// Spans of `regimes` (id = regime index).
    regime_spans: Spans,
}

impl PoolModel {
    fn build(checker: &mut Checker, outcomes: &[Outcome], pool: &str, members: &[usize]) -> Self {
        let ops = checker.ops;
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
                        let message = format!(
                            "{}: expires_at_unix {expires_at_unix} with ttl {ttl_ms} ms is outside the call's window",
                            checker.describe(i)
                        );
                        checker.flag(Rule::BadResponse, message);
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
                    let ttl = asked_ttl_ms.clamp(1, checker.config.max_ttl_ms);
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
        PoolModel {
            pool: pool.to_string(),
            leases,
            sure: Spans::new(sure),
            maybe: Spans::new(maybe),
            unknown: Spans::new(unknown_spans),
            regimes,
            regime_spans: Spans::new(regime_spans),
        }
    }

    /// Counts (no pool = 0) possibly in force at some instant of ms `t`.
    fn counts_at(&self, t: u64) -> impl Iterator<Item = u64> + '_ {
        self.regime_spans
            .at(t, None)
            .map(|s| self.regimes[s.id].count.unwrap_or(0))
    }

    fn max_count(&self, t: u64) -> u64 {
        self.counts_at(t).max().unwrap_or(0)
    }

    fn min_count(&self, t: u64) -> u64 {
        self.counts_at(t).min().unwrap_or(0)
    }

    /// Whether some regime other than `except`'s, with (`present`) or without a
    /// pool, is possibly in force during `[a, b]`.
    fn possibly(&self, present: bool, a: u64, b: u64, except: usize) -> bool {
        self.regime_spans
            .touching(a, b)
            .map(|s| &self.regimes[s.id])
            .any(|r| r.op != Some(except) && r.count.is_some() == present)
    }
}

struct Checker<'h> {
    ops: &'h [Op],
    config: &'h CheckConfig,
    t0: u64,
    out: Vec<Violation>,
}

impl Checker<'_> {
    fn flag(&mut self, rule: Rule, message: String) {
        self.out.push(Violation { rule, message });
    }

    /// `#12 client 3 borrow 9f1c2e7a… [+1200, +1234] ms → 200 {...}`
    fn describe(&self, i: usize) -> String {
        let op = &self.ops[i];
        let call = match &op.call {
            Call::Register { count } => format!("PUT count {count}"),
            Call::Borrow { ttl_ms, wait_ms } => format!("borrow ttl {ttl_ms} ms wait {wait_ms} ms"),
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

    /// Decodes an answer, reporting (and then treating as unknown) one API.md
    /// does not allow.
    fn outcome(&mut self, i: usize) -> Outcome {
        match self.decode(&self.ops[i]) {
            Ok(outcome) => outcome,
            Err(why) => {
                let message = format!("{}: {why}", self.describe(i));
                self.flag(Rule::BadResponse, message);
                Outcome::Unknown
            }
        }
    }

    fn decode(&self, op: &Op) -> Result<Outcome, String> {
        let body = op.body.as_object().ok_or("body is not a JSON object")?;
        if op.status >= 500 {
            error_body(body)?;
            return match (op.status, self.config.faults) {
                (502, true) => Ok(Outcome::Unknown),
                (502, false) => Err("502 with no faults injected".into()),
                _ => Err("a failed call must be 502".into()),
            };
        }
        match (&op.call, op.status) {
            (Call::Register { .. } | Call::Inspect, 200) => {
                if body.get("id").and_then(Value::as_str) != Some(op.pool.to_lowercase().as_str()) {
                    return Err("id is not the pool's hyphenated lowercase UUID".into());
                }
                let (count, in_use, available) = (
                    uint(body, "count")?,
                    uint(body, "in_use")?,
                    uint(body, "available")?,
                );
                if available != count.saturating_sub(in_use) {
                    return Err("available ≠ max(0, count − in_use)".into());
                }
                if let Call::Register { count: asked } = op.call {
                    if count != u64::from(asked) {
                        return Err("count is not the one registered".into());
                    }
                }
                Ok(Outcome::State {
                    count,
                    in_use,
                    available,
                })
            }
            (Call::Delete, 200) => match body.get("deleted") {
                Some(Value::Bool(deleted)) => Ok(Outcome::Deleted(*deleted)),
                _ => Err("deleted is not a boolean".into()),
            },
            (Call::Borrow { ttl_ms: asked, .. }, 200) => {
                let lease = body
                    .get("lease")
                    .and_then(Value::as_str)
                    .filter(|l| uuid::Uuid::parse_str(l).is_ok())
                    .ok_or("lease is not a UUID string")?;
                let ttl_ms = body
                    .get("expires_in")
                    .and_then(Value::as_f64)
                    .map(|s| (s * 1000.0).round() as u64)
                    .ok_or("expires_in is not a number")?;
                if ttl_ms != (*asked).clamp(1, self.config.max_ttl_ms) {
                    return Err(format!(
                        "expires_in is not the ttl clamped to {} ms",
                        self.config.max_ttl_ms
                    ));
                }
                Ok(Outcome::Granted {
                    lease: lease.to_lowercase(),
                    position: uint(body, "position")?,
                    expires_at_unix: uint(body, "expires_at_unix")?,
                    ttl_ms,
                })
            }
            (Call::Borrow { .. }, 409) => match error_body(body)? {
                "no resource available" => Ok(Outcome::Exhausted),
                _ => Err("409 must say \"no resource available\"".into()),
            },
            (Call::Return { .. }, 200) => match body.get("returned") {
                Some(Value::Bool(returned)) => Ok(Outcome::Returned(*returned)),
                _ => Err("returned is not a boolean".into()),
            },
            (Call::Inspect | Call::Borrow { .. } | Call::Return { .. }, 404) => {
                error_body(body)?;
                Ok(Outcome::NotFound)
            }
            (_, status) => Err(format!("status {status} is not an answer to this call")),
        }
    }

    fn check_pool(
        &mut self,
        model: &PoolModel,
        outcomes: &[Outcome],
        models: &[PoolModel],
        owners: &HashMap<&str, (usize, usize)>,
    ) {
        self.shared_positions(model);
        for (l, lease) in model.leases.iter().enumerate() {
            self.grant(model, l, lease);
        }
        let ops = self.ops;
        for (i, op) in ops.iter().enumerate() {
            if op.pool.to_lowercase() != model.pool {
                continue;
            }
            self.existence(model, i, &outcomes[i]);
            match (&op.call, &outcomes[i]) {
                (Call::Return { lease }, Outcome::Returned(returned)) => {
                    let owner = owners
                        .get(lease.to_lowercase().as_str())
                        .map(|&(m, l)| (&models[m], l));
                    self.returned(model, i, *returned, owner);
                }
                (Call::Borrow { .. }, Outcome::Exhausted) => self.refused(model, i),
                (_, Outcome::State { count, in_use, .. }) => self.state(model, i, *count, *in_use),
                _ => {}
            }
        }
    }

    /// (a) No two leases surely live at once share a position.
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

    /// (b) No over-issue and no position out of range; (e) lowest free position.
    fn grant(&mut self, model: &PoolModel, l: usize, lease: &Lease) {
        // Over-issue: at the write, the surely-live others plus this one fit
        // `count` for at least one placement of the write in its window.
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

        // The clock reading of the grant is in [grant_lo, grant_hi].
        let (a, b) = (lease.grant_lo, lease.grant_hi);
        let points = breakpoints(a, b, model.regime_spans.touching(a, b));
        if points.iter().all(|&t| lease.position >= model.max_count(t)) {
            let message = format!(
                "{}: position ≥ every count then in force",
                self.describe(lease.op)
            );
            self.flag(Rule::PositionOutOfRange, message);
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
        if lowest_free < lease.position {
            let message = format!(
                "{}: position {lowest_free} was free throughout the grant",
                self.describe(lease.op)
            );
            self.flag(Rule::NotLowestPosition, message);
        }
    }

    /// (c) `returned: true` only for a live lease of this pool; `false` never
    /// for one surely live.
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

    /// (d) A 409 only when the pool was full: never definitely free all
    /// through the call (every read saw a free slot), nor for
    /// `wakeup_tolerance_ms` on end while it was waiting (a poller reads far
    /// more often than that).
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
                .chain(model.regime_spans.touching(a, b)),
        );
        let free = |t: u64| (model.maybe.at(t, None).count() as u64) < model.min_count(t);
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

    /// A reported state must have held at some instant of the call.
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

    /// "No pool" only when it may have been absent; a pool's answer only when
    /// it may have existed.
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

fn uint(body: &Map<String, Value>, key: &str) -> Result<u64, String> {
    body.get(key)
        .and_then(Value::as_u64)
        .ok_or(format!("{key} is not a non-negative integer"))
}

fn error_body(body: &Map<String, Value>) -> Result<&str, String> {
    match body.get("error") {
        Some(Value::String(reason)) if body.len() == 1 => Ok(reason),
        _ => Err("an error body must be {\"error\": \"…\"}".into()),
    }
}

fn short(uuid: &str) -> String {
    uuid.chars().take(8).collect()
}
