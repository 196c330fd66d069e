//! Async mode's dispatcher: invoked by the table's stream (filtered to pool
//! items with async work and new tickets) and by its wake queue, it steps
//! each pool named (admit, hand on, record grants), delivers the grants to
//! their callbacks, and arms the pool's next wake: an SQS message delayed
//! until its next lease expiry or ticket deadline (at most 15 minutes;
//! re-armed then), at most one pending per pool (`wk` on the pool item).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use lambda_http::lambda_runtime::{self, service_fn, LambdaEvent};
use lambda_http::Error;
use semaphore::callback::CallbackPolicy;
use semaphore::clock::now_ms;
use semaphore::config;
use semaphore::delivery::{Caller, Dispatcher, DELIVERY_BOUND};
use semaphore::keys::PoolKey;
use semaphore::metrics::LogFormat;
use semaphore::store::DynamoDbStore;
use serde_json::{json, Value};
use tokio::task::JoinSet;

/// SQS delays a message by at most 15 minutes.
const MAX_DELAY_S: u64 = 900;

struct State {
    dispatcher: Dispatcher,
    sqs: aws_sdk_sqs::Client,
    wake_queue: String,
    store: Arc<DynamoDbStore>,
}

/// Time a round keeps for its deliveries (the bound) and their records.
const ROUND: Duration = Duration::from_secs(DELIVERY_BOUND.as_secs() + 10);

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let (service, store) = config::service_and_store_from_env().await?;
    let service = Arc::new(service);
    let caller = Caller::new(CallbackPolicy::default(), Duration::from_secs(5))?;
    let wake_queue = std::env::var("WAKE_QUEUE_URL").map_err(|_| "WAKE_QUEUE_URL must be set")?;
    let aws = aws_config::load_from_env().await;
    let state = Arc::new(State {
        dispatcher: Dispatcher::new(service, caller).with_log(LogFormat::Json),
        sqs: aws_sdk_sqs::Client::new(&aws),
        wake_queue,
        store,
    });
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let state = state.clone();
        async move {
            let deadline_ms = event.context.deadline;
            handle(state, event.payload, deadline_ms).await
        }
    }))
    .await
}

/// Steps every pool the batch names, arming its next wake at once (before
/// any delivery, which may outlast this invocation) and making its
/// deliveries side by side, round after round while they leave work and
/// time. A failure fails the batch: the stream or the queue retries it (and,
/// past its retries, sends it to the dead-letter queue).
async fn handle(state: Arc<State>, event: Value, deadline_ms: u64) -> Result<Value, Error> {
    for key in pools(&event) {
        for _ in 0..16 {
            let stepped = state.dispatcher.step(key).await?;
            if let Some(at) = stepped.wake_ms {
                arm(&state, key, at).await?;
            }
            if stepped.deliver.is_empty() {
                break;
            }
            if now_ms() + ROUND.as_millis() as u64 > deadline_ms {
                // No time to deliver and record: the next invocation will.
                state.dispatcher.abandon(key, &stepped.deliver);
                arm(&state, key, now_ms()).await?;
                break;
            }
            let mut deliveries = JoinSet::new();
            for delivery in stepped.deliver {
                let state = state.clone();
                deliveries.spawn(async move { state.dispatcher.deliver(key, delivery).await });
            }
            while deliveries.join_next().await.is_some() {}
        }
    }
    Ok(json!({}))
}

/// Arms a wake of the pool at `at_ms` unless one at or before it is pending
/// (recorded on the pool item, so that invocations never start a second
/// chain of wakes): a conditional write, then an SQS message delayed until
/// then (at most 15 minutes; the wake re-arms the rest).
async fn arm(state: &State, key: PoolKey, at_ms: u64) -> Result<(), Error> {
    let now = now_ms();
    if !state.store.arm_wake(&key, at_ms, now).await? {
        // An earlier wake is pending, or the pool is gone.
        return Ok(());
    }
    state
        .sqs
        .send_message()
        .queue_url(&state.wake_queue)
        .delay_seconds(delay_s(at_ms, now))
        .message_body(json!({"pool": STANDARD.encode(key.0), "at": at_ms}).to_string())
        .send()
        .await?;
    Ok(())
}

/// The pools a batch names: stream records' keys, wake messages' bodies.
fn pools(event: &Value) -> BTreeSet<PoolKey> {
    let records = event["Records"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    records
        .iter()
        .filter_map(|record| {
            let encoded = match record["eventSource"].as_str()? {
                "aws:dynamodb" => record["dynamodb"]["Keys"]["pk"]["B"].as_str()?.to_string(),
                "aws:sqs" => {
                    let body: Value = serde_json::from_str(record["body"].as_str()?).ok()?;
                    body["pool"].as_str()?.to_string()
                }
                _ => return None,
            };
            let bytes = STANDARD.decode(encoded).ok()?;
            Some(PoolKey(bytes.try_into().ok()?))
        })
        .collect()
}

/// Seconds until `at_ms`, rounded up, within SQS's limit (a later wake is
/// re-armed when this one fires).
fn delay_s(at_ms: u64, now_ms: u64) -> i32 {
    at_ms.saturating_sub(now_ms).div_ceil(1000).min(MAX_DELAY_S) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_records_and_wakes_name_pools_once() {
        let key = [7u8; 16];
        let b64 = STANDARD.encode(key);
        let event = json!({"Records": [
            {"eventSource": "aws:dynamodb", "dynamodb": {"Keys": {"pk": {"B": b64}, "sk": {"B": "AA=="}}}},
            {"eventSource": "aws:sqs", "body": json!({"pool": b64}).to_string()},
            {"eventSource": "aws:sqs", "body": "not json"},
            {"eventSource": "aws:dynamodb", "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode([1u8; 3])}}}},
            {"eventSource": "aws:s3"},
        ]});
        assert_eq!(
            pools(&event).into_iter().collect::<Vec<_>>(),
            [PoolKey(key)]
        );
        assert!(pools(&json!({})).is_empty());
    }

    #[test]
    fn wakes_are_delayed_within_sqs_limits() {
        assert_eq!(delay_s(10_500, 10_000), 1);
        assert_eq!(delay_s(9_000, 10_000), 0, "overdue: at once");
        assert_eq!(delay_s(10_000 + 3_600_000, 10_000), 900);
    }
}
