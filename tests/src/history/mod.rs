//! A record of what clients saw of the API, and a checker of API.md's promises
//! against it.
//!
//! Times are wall-clock Unix milliseconds, the clock the server judges expiry
//! by (`semaphore::clock::now_ms`): a lease is live at ms `t` iff
//! `t < expires_at_ms`. Recorded times are that clock read just before the
//! call and just after it, so every server reading of the clock and every store
//! effect of a call lies inside its window `[invoke_ms, response_ms]`.
//!
//! The checker reports only what holds for *every* placement of effects inside
//! their windows, so each report is a definite violation, never a scheduling
//! artefact. The one heuristic is rule [`Rule::LostWakeup`]'s tolerance (widened
//! by how late the waiter answered: its store calls were that slow then).
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
//!
//! The parts, in the order a check uses them: [`record`] (the calls),
//! [`decode`] (each answer against API.md), [`model`] (per pool, what can
//! have been in force when, as [`spans`]) and [`rules`] (each promise).

mod decode;
mod model;
mod record;
mod rules;
mod spans;

use std::collections::BTreeMap;

pub use record::{summary, Call, History, Op, NO_ANSWER};
pub use rules::{Rule, Violation};

use decode::{decode, Outcome};
use model::PoolModel;
use rules::Checker;

/// What the checker must know about the server and the run.
#[derive(Clone, Copy, Debug)]
pub struct CheckConfig {
    /// The server's `max_ttl_ms`: `expires_in` must be the ttl clamped to it.
    pub max_ttl_ms: u64,
    /// The server's `max_wait_ms`: how long a refused waiter surely waited.
    pub max_wait_ms: u64,
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
            max_wait_ms: 25_000,
            wakeup_tolerance_ms: 250,
            faults: false,
        }
    }
}

/// Checks a complete history (every call answered). Returns every definite
/// violation found, described with op numbers (indices into `ops`) and times
/// relative to the first invoke.
pub fn check(ops: &[Op], config: &CheckConfig) -> Vec<Violation> {
    let mut checker = Checker::new(ops, config);
    // An answer API.md does not allow is reported, then treated as unknown.
    let outcomes: Vec<Outcome> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            decode(op, config).unwrap_or_else(|why| {
                checker.bad_response(i, &why);
                Outcome::Unknown
            })
        })
        .collect();
    let mut by_pool: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        by_pool.entry(op.pool.to_lowercase()).or_default().push(i);
    }
    let models: Vec<PoolModel> = by_pool
        .into_iter()
        .map(|(pool, calls)| {
            let (model, bad_grants) = PoolModel::build(ops, &outcomes, config, pool, calls);
            for (i, why) in bad_grants {
                checker.bad_response(i, &why);
            }
            model
        })
        .collect();
    let owners = checker.lease_owners(&models);
    for model in &models {
        checker.check_pool(model, &outcomes, &models, &owners);
    }
    checker.violations()
}
