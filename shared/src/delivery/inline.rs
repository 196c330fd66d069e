//! The route functions' deliveries: a request whose write hands slots to
//! async tickets delivers them itself before it answers, rather than wake
//! the dispatcher (the wake queue's long poll, an invocation, its reads of
//! the pool and the ticket: on AWS SQS → Lambda alone is about 16 ms at p50
//! and 105 ms at p99). What it cannot finish within a short bound, or did
//! not record, it leaves to the dispatcher through a wake; the table's
//! stream stays the backstop of both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::join_all;

use super::dispatcher::Outcome;
use super::wake::WakeOnGrant;
use super::Dispatcher;
use crate::clock::now_ms;
use crate::domain::{LeaseDigest, TicketGrant};
use crate::keys::PoolKey;
use crate::service::OnAsyncGrant;

/// How long a request tries to deliver what its write granted before it
/// answers (attempts retried as the dispatcher does, each cut at
/// [`INLINE_ATTEMPT`]), and never past its hook's time less [`INLINE_TAIL`];
/// what is left then is the dispatcher's, woken at once.
pub const INLINE_BOUND: Duration = Duration::from_secs(2);

/// The longest one of a request's own attempts waits for its receiver: a
/// receiver that answers later (it took the grant: [`INLINE_BOUND`] leaves
/// time for the retry, a duplicate it answers at once) has it again.
pub const INLINE_ATTEMPT: Duration = Duration::from_secs(1);

/// What the hook keeps after it gives up: the claim's release or the
/// outcome's record, and the wake.
const INLINE_TAIL: Duration = Duration::from_millis(1_500);

/// The service's [`OnAsyncGrant`] in the route functions: each grant
/// delivered before the request answers, side by side; the dispatcher woken
/// only for what is left (a grant not taken in time, or not recorded here,
/// or one that failed and returned its slot, which may go on to the next
/// ticket). A delivered ticket stays listed until a step unlists it: the
/// stream's step for the granting write, or the step at its claim's lapse
/// when that one found the delivery under way.
pub struct DeliverOnGrant {
    dispatcher: Arc<Dispatcher>,
    /// None without a wake queue: the table's stream alone then.
    wake: Option<WakeOnGrant>,
    bound: Duration,
}

impl DeliverOnGrant {
    /// `dispatcher`: built on the service without this hook, so that its own
    /// writes (a failed delivery's returned lease) do not deliver again in
    /// turn; `wake` tells the dispatcher of what is left.
    pub fn new(dispatcher: Arc<Dispatcher>, wake: Option<WakeOnGrant>) -> Self {
        DeliverOnGrant {
            dispatcher,
            wake,
            bound: INLINE_BOUND,
        }
    }

    pub fn with_bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }
}

#[async_trait]
impl OnAsyncGrant for DeliverOnGrant {
    async fn granted(&self, key: &PoolKey, grants: &[(LeaseDigest, TicketGrant)], by: Instant) {
        let time = by
            .saturating_duration_since(Instant::now())
            .saturating_sub(INLINE_TAIL)
            .min(self.bound);
        // Too little time left (a slow write before it): the dispatcher's.
        let give_up_ms = now_ms() + time.as_millis() as u64;
        let outcomes = if time.is_zero() {
            Vec::new()
        } else {
            join_all(grants.iter().map(|(digest, grant)| {
                self.dispatcher
                    .deliver_granted(*key, *digest, *grant, give_up_ms)
            }))
            .await
        };
        // None granted yet (an enqueue that found a slot free): a step's.
        let done = !grants.is_empty()
            && outcomes.len() == grants.len()
            && outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Taken | Outcome::NotOurs));
        if let Some(wake) = self.wake.as_ref().filter(|_| !done) {
            wake.granted(key, grants, by).await;
        }
    }
}

#[cfg(test)]
#[path = "inline_tests.rs"]
mod tests;
