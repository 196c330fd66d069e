//! The dispatcher: a pool stepped, its grants delivered to their callbacks
//! with capped, jittered retries, the outcome recorded.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;

use semaphore_wire::{Backoff, Delivery, Jitter, Seconds};

use super::{Attempt, Caller};
use crate::clock::now_ms;
use crate::domain::{DeliveryClaim, LeaseDigest, TicketGrant, TicketItem, GAP_MS};
use crate::keys::PoolKey;
use crate::metrics::{AsyncLog, LogFormat, PoolKeyPrefix};
use crate::service::{Begin, Budget, Claiming, Service, Step, ToDeliver};
use crate::Error;

/// Longest a grant may go undelivered: then its lease is returned and the
/// ticket fails (a receiver that stays down must not hold a slot longer).
pub const DELIVERY_BOUND: Duration = Duration::from_secs(60);

/// What a delivery claim covers beyond its attempt and the pause after it:
/// clocks that differ a little between servers.
const CLAIM_MARGIN: Duration = Duration::from_secs(2);

/// Longest a dispatcher leaves be a ticket it found claimed by another,
/// before it reads it again.
const ELSEWHERE_RECHECK: Duration = Duration::from_millis(500);

/// How a delivery made here ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver took it (2xx), recorded `delivered`.
    Taken,
    /// It failed (refused, or not taken within its lease or the bound):
    /// recorded `failed` and its lease returned, unless another ended it
    /// first or the record itself failed (a step then decides). The pool
    /// may have changed.
    Failed,
    /// Nothing more of ours to do: another dispatcher's delivery, its lease
    /// ended (before an attempt, or between ours), or no callback.
    NotOurs,
    /// Given up here undecided: a step goes on with it.
    Left,
}

pub struct Dispatcher {
    service: Arc<Service>,
    caller: Caller,
    retry: Backoff,
    bound: Duration,
    /// Deliveries under way here: a step that sees one again (its ticket
    /// is listed until it ends) leaves it be.
    in_flight: Mutex<HashSet<(PoolKey, LeaseDigest)>>,
    /// Deliveries another dispatcher claimed, until their claims lapse: its
    /// steps leave them be (each would only find them claimed again) and
    /// look again at the lapse, in case their claimer died.
    elsewhere: Mutex<HashMap<(PoolKey, LeaseDigest), u64>>,
    log: LogFormat,
}

impl Dispatcher {
    pub fn new(service: Arc<Service>, caller: Caller) -> Self {
        Dispatcher {
            service,
            caller,
            retry: Backoff {
                first: Duration::from_millis(100),
                cap: Duration::from_secs(5),
                jitter: Jitter::Equal,
            },
            bound: DELIVERY_BOUND,
            in_flight: Mutex::new(HashSet::new()),
            elsewhere: Mutex::new(HashMap::new()),
            log: LogFormat::Text,
        }
    }

    /// How it writes its metric lines (Json: CloudWatch EMF, as in Lambda).
    pub fn with_log(mut self, log: LogFormat) -> Self {
        self.log = log;
        self
    }

    pub fn with_bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<(PoolKey, LeaseDigest)>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<(PoolKey, LeaseDigest), u64>> {
        self.elsewhere.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One step on the pool: the grants to deliver (none already under way
    /// here; each is marked under way until [`Dispatcher::deliver`] ends),
    /// and the pool's next wake: when to step it again (Unix ms), while it
    /// has async tickets. For a caller that hands its deliveries on rather
    /// than make them (so it takes no claim on them).
    pub async fn step(&self, key: PoolKey) -> Result<Step, Error> {
        self.step_with(key, None).await
    }

    /// [`Dispatcher::step`] for a caller that delivers what it gets at once:
    /// the step claims each delivery's first attempt as it records the grant
    /// (so that no other dispatcher hands it out meanwhile).
    pub async fn step_to_deliver(&self, key: PoolKey) -> Result<Step, Error> {
        let claiming = Claiming {
            span: self.claim_span(Duration::ZERO),
            hand: None,
        };
        self.step_with(key, Some(claiming)).await
    }

    /// [`Dispatcher::step_to_deliver`] that starts each delivery (in
    /// `deliveries`) as soon as its claim lands, before the step's other
    /// writes: the step's `deliver` lists none of them. The deliveries run
    /// whatever the step's outcome: join `deliveries` either way.
    pub async fn step_and_deliver(
        self: &Arc<Self>,
        key: PoolKey,
        deliveries: &mut JoinSet<bool>,
    ) -> Result<Step, Error> {
        let started = Mutex::new(std::mem::take(deliveries));
        let hand = |delivery: ToDeliver| {
            if !self.in_flight().insert((key, delivery.item.digest())) {
                return;
            }
            let dispatcher = self.clone();
            started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .spawn(async move { dispatcher.deliver(key, delivery).await });
        };
        let claiming = Claiming {
            span: self.claim_span(Duration::ZERO),
            hand: Some(&hand),
        };
        let stepped = self.step_with(key, Some(claiming)).await;
        *deliveries = started.into_inner().unwrap_or_else(|e| e.into_inner());
        stepped
    }

    /// How long a claim taken now covers an attempt that starts after up
    /// to two store calls and pauses `nap` after it: no other dispatcher
    /// starts one meanwhile; and a little more for clocks that differ
    /// between servers.
    fn claim_span(&self, nap: Duration) -> Duration {
        2 * self.service.timing().call_timeout + self.caller.timeout() + nap + CLAIM_MARGIN
    }

    /// `claiming`: how the step claims what it hands out, if it does.
    async fn step_with(&self, key: PoolKey, claiming: Option<Claiming<'_>>) -> Result<Step, Error> {
        let mut delivering: Vec<LeaseDigest> = self
            .in_flight()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, digest)| *digest)
            .collect();
        // Claimed elsewhere, the claim live: left be until it lapses.
        let now = now_ms();
        let lapses = {
            let mut elsewhere = self.elsewhere();
            elsewhere.retain(|_, until| *until > now);
            let mut lapses = None::<u64>;
            for (&(k, digest), &until) in elsewhere.iter() {
                if k == key {
                    delivering.push(digest);
                    lapses = Some(lapses.map_or(until, |l| l.min(until)));
                }
            }
            lapses
        };
        let mut budget = Budget::new(None);
        let step = match claiming {
            Some(claiming) => {
                self.service
                    .dispatch_step_claiming(&key, &delivering, claiming, &mut budget)
                    .await?
            }
            None => {
                self.service
                    .dispatch_step(&key, &delivering, &mut budget)
                    .await?
            }
        };
        if step.active {
            AsyncLog::Queue {
                pool: prefix(&key),
                depth: step.depth,
            }
            .emit(self.log);
        }
        let deliver = step
            .deliver
            .into_iter()
            .filter(|d| self.in_flight().insert((key, d.item.digest())))
            .collect();
        {
            // Looked at again soon whatever its claim says: a route that
            // gives up its own delivery releases its claim early.
            let recheck = now_ms() + ELSEWHERE_RECHECK.as_millis() as u64;
            let mut elsewhere = self.elsewhere();
            for &(digest, until) in &step.claimed_elsewhere {
                elsewhere.insert((key, digest), until.min(recheck));
            }
        }
        let wake_ms = match (step.active, step.wake_ms.into_iter().chain(lapses).min()) {
            (false, _) => None,
            (true, Some(at)) => Some(at),
            // Active without a timer: every change invokes a step; look
            // again in a while all the same (a backstop, not a poll).
            (true, None) => Some(now_ms() + GAP_MS),
        };
        Ok(Step {
            deliver,
            wake_ms,
            ..step
        })
    }

    /// Gives back deliveries a step handed out that the caller will not make
    /// (out of time): a later step hands them out again.
    pub fn abandon(&self, key: PoolKey, deliveries: &[ToDeliver]) {
        let mut in_flight = self.in_flight();
        for delivery in deliveries {
            in_flight.remove(&(key, delivery.item.digest()));
        }
    }

    /// Delivers one grant until the receiver takes it, refuses it, or the
    /// lease or the bound ends; records the outcome. Whether the pool may
    /// have changed for it (a failed delivery returns its lease), so that
    /// the caller steps it again.
    pub async fn deliver(&self, key: PoolKey, delivery: ToDeliver) -> bool {
        let ToDeliver { item, grant, claim } = delivery;
        let outcome = self.deliver_once(key, &item, grant, claim, None).await;
        self.in_flight().remove(&(key, item.digest()));
        outcome == Outcome::Failed
    }

    /// Delivers, before its request answers, the grant that the request's
    /// own write handed the ticket of `digest`: records it `granted` from
    /// `waiting` with the first attempt's claim in one write, then tries
    /// until the receiver takes or refuses it, each attempt cut at
    /// `give_up_ms` (Unix ms). `Left` when the dispatcher must go on with
    /// it: the grant not recorded here (the ticket moved, or a call failed),
    /// or not taken in time (its claim released, so that a step delivers it
    /// again at once).
    pub async fn deliver_granted(
        &self,
        key: PoolKey,
        digest: LeaseDigest,
        grant: TicketGrant,
        give_up_ms: u64,
    ) -> Outcome {
        let claim = DeliveryClaim {
            by: fastrand::u64(..),
            until_ms: now_ms() + self.claim_span(Duration::ZERO).as_millis() as u64,
        };
        let mut budget = Budget::new(None);
        let Ok(Some(item)) = self
            .service
            .record_own_grant(&key, digest, grant, claim, &mut budget)
            .await
        else {
            return Outcome::Left;
        };
        self.deliver_once(key, &item, grant, Some(claim), Some(give_up_ms))
            .await
    }

    /// `taken`: the claim its step took for the first attempt, if any.
    /// `give_up_ms`: when to leave it to a later step, undecided (Unix ms).
    async fn deliver_once(
        &self,
        key: PoolKey,
        item: &TicketItem,
        grant: TicketGrant,
        mut taken: Option<DeliveryClaim>,
        give_up_ms: Option<u64>,
    ) -> Outcome {
        let Some(callback) = item.callback.clone() else {
            return Outcome::NotOurs;
        };
        let until = grant.expires_at_ms.min(
            grant
                .granted_ms
                .saturating_add(self.bound.as_millis() as u64),
        );
        // This delivery's claim on the ticket: renewed before each attempt.
        let by = taken.map_or_else(|| fastrand::u64(..), |claim| claim.by);
        let mut last = String::from("no attempt");
        let mut attempt = 0u32;
        let mut made = 0u32;
        // Where its attempts and pauses stop: the bound, or giving up first.
        let stop = give_up_ms.map_or(until, |at| at.min(until));
        let outcome = loop {
            let now = now_ms();
            if now >= stop && now < until {
                // No attempt of ours is under way: released, so that a step
                // may start the next at once (woken by our caller), rather
                // than when the claim would have lapsed.
                let released = self.service.release_claim(&key, item, grant, by).await;
                if let Err(err) = released {
                    tracing::warn!(error = %err, "a delivery claim was not released: it lapses");
                }
                return Outcome::Left;
            }
            if now >= until {
                break Err(format!(
                    "not delivered while its lease was live (within {} s): {last}",
                    until.saturating_sub(grant.granted_ms).div_ceil(1000)
                ));
            }
            let nap = self.retry.pause(attempt);
            // The step's claim serves the first attempt while it covers it
            // (the pool's read, the attempt, the pause after it).
            let first = taken.take().filter(|claim| {
                let rest = self.claim_span(nap) - self.service.timing().call_timeout;
                now + rest.as_millis() as u64 <= claim.until_ms
            });
            let (claim, begin) = match first {
                // The pool's read after the claim, right before the POST:
                // a lease returned since the step read the pool is seen.
                Some(claim) => (claim, self.service.begin_claimed(&key, item, grant).await),
                None => {
                    let claim = DeliveryClaim {
                        by,
                        until_ms: now + self.claim_span(nap).as_millis() as u64,
                    };
                    let begin = self.service.begin_attempt(&key, item, grant, claim).await;
                    (claim, begin)
                }
            };
            match begin {
                Ok(Begin::Go) => {}
                // Another dispatcher's, or it ended meanwhile: nothing to record.
                Ok(Begin::NotOurs) => return Outcome::NotOurs,
                // Its lease ended: nothing freed here.
                Ok(Begin::Ended(reason)) => {
                    self.log_delivery(&key, item, false, made);
                    tracing::info!(pool = %prefix(&key), reason = %reason, "a grant not delivered");
                    return Outcome::NotOurs;
                }
                Err(err) => {
                    // No claim, no attempt: try again after the pause.
                    last = format!("the ticket could not be claimed: {err}");
                    attempt += 1;
                    pause(nap, stop).await;
                    continue;
                }
            }
            // The attempt ends within its claim (its store calls took some of
            // it), so that no other dispatcher's can overlap it.
            let now = now_ms();
            let attempt_until = stop.min(
                claim
                    .until_ms
                    .saturating_sub(CLAIM_MARGIN.as_millis() as u64),
            );
            if attempt_until <= now {
                attempt += 1;
                continue;
            }
            let body = Delivery {
                ticket: item.number,
                position: grant.position.into(),
                fence: grant.fence,
                expires_at_unix: grant.expires_at_ms / 1000,
                expires_in: Seconds::from_millis(grant.expires_at_ms.saturating_sub(now).max(1)),
            };
            made += 1;
            let sent = tokio::time::timeout(
                Duration::from_millis(attempt_until - now),
                self.caller.call(
                    &callback.url,
                    &callback.token,
                    semaphore_wire::to_json(&body),
                ),
            )
            .await
            .unwrap_or_else(|_| Attempt::Retry("the receiver did not answer in time".into()));
            match sent {
                Attempt::Delivered => break Ok(now_ms()),
                Attempt::Failed(reason) => break Err(reason),
                Attempt::Retry(reason) => last = reason,
            }
            attempt += 1;
            pause(nap, stop).await;
        };
        let failed = outcome.is_err();
        self.log_delivery(&key, item, !failed, made);
        let ended = self
            .service
            .delivery_ended(&key, item, grant, outcome, &mut Budget::new(None))
            .await;
        match ended {
            // A failed delivery returned its lease.
            Ok(_) if failed => Outcome::Failed,
            Ok(_) => Outcome::Taken,
            Err(err) => {
                tracing::warn!(error = %err, "a delivery's outcome was not recorded");
                // Unrecorded: a step decides again (a failure's lease may
                // still be held).
                if failed {
                    Outcome::Failed
                } else {
                    Outcome::Left
                }
            }
        }
    }

    fn log_delivery(&self, key: &PoolKey, item: &TicketItem, delivered: bool, attempts: u32) {
        AsyncLog::Delivery {
            pool: prefix(key),
            delivered,
            attempts,
            since_enqueue: Duration::from_millis(now_ms().saturating_sub(item.joined_ms)),
        }
        .emit(self.log);
    }
}

/// The pause between attempts, never past `until` (Unix ms).
async fn pause(nap: Duration, until: u64) {
    tokio::time::sleep(nap.min(Duration::from_millis(until.saturating_sub(now_ms())))).await;
}

fn prefix(key: &PoolKey) -> PoolKeyPrefix {
    PoolKeyPrefix::of(key)
}
