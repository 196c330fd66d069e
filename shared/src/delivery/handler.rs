//! The dispatcher as a Lambda function: each batch (the table's stream, or
//! the wake queue) handled pool by pool, the pools side by side — step, arm
//! the next wake, deliver — and answered with the records that failed, so
//! that one pool's failure never makes the others' records run again, and
//! one pool's slow receiver never holds up another's delivery.
//!
//! Only wake queue batches deliver. A stream shard's next batch waits for
//! the current invocation to end, so a stream batch that delivered would
//! hold every later change of its shard's pools behind its slowest
//! receiver: it steps (recording grants) and hands what is to deliver to
//! the wake queue, a wake without delay, whose invocation delivers it (a
//! granted ticket is delivered again by any later step until it ends).
//!
//! The pending wake (`WakeStore`) is what keeps wakes few: an invocation
//! sends one only when its conditional write of the pool's wake lands.
//! Several may still be queued for one pool: an earlier wake replaces a
//! later pending one (whose message stays queued), a wake due but not yet
//! received counts as past, and SQS delivers at least once. A stray costs
//! one step and arms nothing unless the pool needs it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_http::lambda_runtime::LambdaEvent;
use serde_json::Value;
use tokio::task::JoinSet;

use super::events::{Batch, BatchResponse, Item, Source};
use super::wake::{delay, SqsWakes, Wake, WakeSender, EARLY, MAX_DELAY};
use super::{Caller, Dispatcher, DELIVERY_BOUND};
use crate::clock::{deadline_instant, now_ms};
use crate::config;
use crate::keys::PoolKey;
use crate::metrics::{LogFormat, PoolKeyPrefix};
use crate::store::WakeStore;

/// Time a round keeps for its deliveries (the bound) and their records.
const ROUND: Duration = Duration::from_secs(DELIVERY_BOUND.as_secs() + 10);

/// Time kept for a step before a round's deliveries (the claims it takes
/// must not be left unmade for want of time).
const STEP: Duration = Duration::from_secs(10);

/// Rounds per pool and invocation at most: another round only after a
/// delivery failed (its lease returned, the slot handed on).
const ROUNDS: usize = 16;

/// The dispatcher function's state, built once at init (cloned into each
/// pool's task).
#[derive(Clone)]
pub struct Handler {
    dispatcher: Arc<Dispatcher>,
    wakes: Arc<dyn WakeStore>,
    sender: Arc<dyn WakeSender>,
    max_delay: Duration,
}

/// The records of one pool in a batch.
#[derive(Default)]
struct PoolRecords {
    ids: Vec<String>,
    /// The times of the wakes among them (wake queue batches).
    wakes: Vec<u64>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

impl Handler {
    pub fn new(
        dispatcher: Arc<Dispatcher>,
        wakes: Arc<dyn WakeStore>,
        sender: Arc<dyn WakeSender>,
    ) -> Self {
        Handler {
            dispatcher,
            wakes,
            sender,
            max_delay: MAX_DELAY,
        }
    }

    /// The longest delay a wake is sent with (SQS's 15 minutes; tests lower it).
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The function's state from its environment: the service and table of
    /// [`config::service_and_store_from_lookup`], callbacks as it allows
    /// them, the wake queue `WAKE_QUEUE_URL`.
    pub async fn from_env() -> Result<Handler, String> {
        let (config, queue_url) =
            config::dispatcher_settings_from_lookup(|name| std::env::var(name).ok())?;
        let (service, store) = config::service_and_store(config).await;
        let caller = Caller::new(service.callback_policy(), Duration::from_secs(5))
            .map_err(|e| format!("the callbacks' HTTP client: {e}"))?;
        let dispatcher = Dispatcher::new(Arc::new(service), caller).with_log(LogFormat::Json);
        let sqs = aws_sdk_sqs::Client::new(&aws_config::load_from_env().await);
        Ok(Handler::new(
            Arc::new(dispatcher),
            store,
            Arc::new(SqsWakes::new(sqs, queue_url)),
        ))
    }

    /// One invocation: its batch handled by its deadline (through the same
    /// guard as the HTTP routes'). An error only for a payload that is no
    /// batch.
    pub async fn handle(&self, event: LambdaEvent<Value>) -> Result<BatchResponse, Failure> {
        let deadline = deadline_instant(event.context.deadline);
        self.handle_batch(event.payload, deadline).await
    }

    /// [`Handler::handle`] with the deadline given.
    pub async fn handle_batch(
        &self,
        payload: Value,
        deadline: Option<Instant>,
    ) -> Result<BatchResponse, Failure> {
        let batch = Batch::from_payload(payload)?;
        let mut response = BatchResponse::default();
        let mut pools: BTreeMap<PoolKey, PoolRecords> = BTreeMap::new();
        for item in batch.items {
            match item {
                Item::Pool { id, key, wake_at } => {
                    let records = pools.entry(key).or_default();
                    records.ids.push(id);
                    records.wakes.extend(wake_at);
                }
                Item::Unreadable { id, why } => {
                    let source = match batch.source {
                        Source::Stream => "stream",
                        Source::Queue => "wake queue",
                    };
                    tracing::error!(source, item = id.as_deref().unwrap_or("-"), reason = %why,
                        "a record that names no pool: reported as failed");
                    // Without an id (Lambda always sends one) it cannot be
                    // reported alone; failing the batch would retry the rest.
                    if let Some(id) = id {
                        response.failed(&id);
                    }
                }
            }
        }
        // Each pool in a task of its own: one pool's receiver, however
        // slow, delays no other pool's delivery.
        let mut running = JoinSet::new();
        let mut ids: HashMap<tokio::task::Id, (PoolKey, Vec<String>)> = HashMap::new();
        for (key, records) in pools {
            let handler = self.clone();
            let source = batch.source;
            let task = running.spawn(async move {
                handler
                    .run_pool(key, source, records.wakes, deadline)
                    .await
                    .map_err(|e| e.to_string())
            });
            ids.insert(task.id(), (key, records.ids));
        }
        let mut failed: BTreeMap<PoolKey, Vec<String>> = BTreeMap::new();
        while let Some(joined) = running.join_next_with_id().await {
            let (task, error) = match joined {
                Ok((_, Ok(()))) => continue,
                Ok((task, Err(err))) => (task, err),
                // A panic fails that pool's records alone.
                Err(err) => (err.id(), format!("its task failed: {err}")),
            };
            if let Some((key, records)) = ids.remove(&task) {
                tracing::warn!(pool = %PoolKeyPrefix::of(&key), error = %error,
                    records = records.len(), "a pool's records failed: reported as failed");
                failed.insert(key, records);
            }
        }
        // In the pools' order, whatever order their tasks ended in.
        for id in failed.values().flatten() {
            response.failed(id);
        }
        Ok(response)
    }

    /// Steps the pool and arms its next wake; from the wake queue, makes its
    /// deliveries side by side, each started as the step claims it, and
    /// steps again only while a delivery failed and time is left; from the
    /// stream, hands them to the wake queue.
    /// `handled`: the wakes of it being handled (they may arrive early, and
    /// are no longer pending).
    async fn run_pool(
        &self,
        key: PoolKey,
        source: Source,
        mut handled: Vec<u64>,
        deadline: Option<Instant>,
    ) -> Result<(), Failure> {
        // A wake comes up to a second early (SQS delays in whole seconds,
        // rounded down): wait out the rest, rather than step too soon and
        // wake again a second late. Only this pool's task waits.
        let now = now_ms();
        let early_by = |at: u64| Duration::from_millis(at.saturating_sub(now));
        if let Some(wait) = handled
            .iter()
            .map(|&at| early_by(at))
            .filter(|w| *w <= EARLY)
            .max()
        {
            if deadline.is_none_or(|d| Instant::now() + wait + STEP + ROUND <= d) {
                tokio::time::sleep(wait).await;
            }
        }
        let mut armed_any = false;
        for _ in 0..ROUNDS {
            // Only a wake with the time to step, deliver and record delivers
            // (and so claims what its step hands out).
            let delivers = source == Source::Queue
                && deadline.is_none_or(|d| Instant::now() + STEP + ROUND <= d);
            // Each delivery starts as soon as the step claims it, before
            // the step's other writes.
            let mut deliveries = JoinSet::new();
            let stepped = if delivers {
                self.dispatcher.step_and_deliver(key, &mut deliveries).await
            } else {
                self.dispatcher.step(key).await
            };
            let stepped = match stepped {
                Ok(stepped) => stepped,
                Err(err) => {
                    // Those it started are made all the same.
                    while deliveries.join_next().await.is_some() {}
                    return Err(format!("{err:?}").into());
                }
            };
            if delivers && (stepped.handed > 0 || !stepped.deliver.is_empty()) {
                // The wake's arming beside the deliveries (two store calls
                // the first attempt need not wait for). A failed arming
                // fails the records once the deliveries end: their retry
                // steps the pool again.
                for delivery in stepped.deliver {
                    let dispatcher = self.dispatcher.clone();
                    deliveries.spawn(async move { dispatcher.deliver(key, delivery).await });
                }
                let armed = match stepped.wake_ms {
                    Some(at) => self.arm(key, at, &mut handled).await.map(|()| true),
                    None => Ok(false),
                };
                let mut changed = false;
                while let Some(changed_by) = deliveries.join_next().await {
                    changed |= changed_by.unwrap_or(true);
                }
                armed_any |= armed?;
                if !changed {
                    // The pool changes next when a receiver returns its
                    // lease, which wakes it: no round to wait for here, so
                    // the invocation ends and its poller takes the next wake.
                    break;
                }
                continue;
            }
            if let Some(at) = stepped.wake_ms {
                if let Err(err) = self.arm(key, at, &mut handled).await {
                    // Unmarked, or this sandbox's later steps would pass
                    // them by: the records' retry delivers them.
                    self.dispatcher.abandon(key, &stepped.deliver);
                    return Err(err);
                }
                armed_any = true;
            }
            if stepped.deliver.is_empty() {
                break;
            }
            if source == Source::Stream {
                // Not here: the shard's next batch would wait for the
                // receivers. A wake without delay (outside the pending
                // wake: a stray costs a step) has them delivered.
                self.dispatcher.abandon(key, &stepped.deliver);
                let now = Wake { key, at_ms: None };
                self.sender
                    .send(&now, Duration::ZERO)
                    .await
                    .map_err(|err| format!("the deliveries were not handed on: {err}"))?;
                break;
            }
            // From the wake queue with no time left to deliver and record
            // (the case above had the time): the next invocation will.
            self.dispatcher.abandon(key, &stepped.deliver);
            self.arm(key, now_ms(), &mut handled).await?;
            return Ok(());
        }
        // A wake handled before its time that armed no other would hold off
        // a later one until its time: clear it.
        let now = now_ms();
        if !armed_any && handled.iter().any(|&at| at > now) {
            self.wakes.disarm_wake(&key, &handled).await?;
        }
        Ok(())
    }

    /// Arms a wake of the pool at `at_ms` unless another is pending (a
    /// conditional write of the pool's wake, so that invocations never
    /// start a second chain of wakes), then sends it delayed until then (at
    /// most `max_delay`: a later wake arrives early and re-arms the rest).
    async fn arm(&self, key: PoolKey, at_ms: u64, handled: &mut Vec<u64>) -> Result<(), Failure> {
        let now = now_ms();
        if !self.wakes.arm_wake(&key, at_ms, now, handled).await? {
            // Another wake is pending, or the pool is gone.
            return Ok(());
        }
        // The wakes handled are pending no longer: this one replaced them.
        handled.clear();
        let wake = Wake {
            key,
            at_ms: Some(at_ms),
        };
        if let Err(err) = self
            .sender
            .send(&wake, delay(at_ms, now, self.max_delay))
            .await
        {
            // Not sent: clear it, so that the record's retry arms it again.
            let _ = self.wakes.disarm_wake(&key, &[at_ms]).await;
            return Err(format!("the wake was not sent: {err}").into());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod tests;
