//! The dispatcher's wakes in AWS: a message that steps a pool again at a
//! time, sent to the wake queue delayed until then. SQS delays a message by
//! at most 15 minutes, so a later wake arrives early, and the step it runs
//! arms the rest (see `handler.rs`).
//!
//! A wake without a time steps the pool at once: what a route function
//! sends when its write hands a slot to an async ticket ([`WakeOnGrant`]),
//! and what a stream batch hands its deliveries on with. It bypasses the
//! pending wake (`wk`): a step is idempotent, and a stray one costs a step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::domain::{LeaseDigest, TicketGrant};
use crate::keys::PoolKey;
use crate::metrics::PoolKeyPrefix;
use crate::service::OnAsyncGrant;

/// SQS delays a message by at most 15 minutes.
pub const MAX_DELAY: Duration = Duration::from_secs(900);

/// A wake's body: the pool's key (base64, as DynamoDB sends binary keys) and
/// when it is due (Unix ms), as `{"pool": "…", "at": 1732170000000}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    pub key: PoolKey,
    /// Absent in a wake sent by hand: it then is handled as a stray.
    pub at_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct Body {
    pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<u64>,
}

impl Wake {
    pub fn to_body(&self) -> String {
        let body = Body {
            pool: STANDARD.encode(self.key.0),
            at: self.at_ms,
        };
        serde_json::to_string(&body).unwrap_or_default()
    }

    /// The wake a message's body names, or why it names none (safe to log:
    /// it never repeats the body).
    pub fn from_body(body: &str) -> Result<Wake, String> {
        let body: Body = serde_json::from_str(body)
            .map_err(|e| format!("the body is not a wake ({})", e.classify_name()))?;
        Ok(Wake {
            key: pool_key_from_base64(&body.pool)?,
            at_ms: body.at,
        })
    }
}

/// A pool key from its bytes (a stream record's `pk`, a wake's `pool`).
#[cfg_attr(not(feature = "dispatch"), allow(dead_code))]
pub(super) fn pool_key_from_bytes(bytes: &[u8]) -> Result<PoolKey, String> {
    <[u8; 16]>::try_from(bytes)
        .map(PoolKey)
        .map_err(|_| format!("the pool key is {} bytes, not 16", bytes.len()))
}

fn pool_key_from_base64(encoded: &str) -> Result<PoolKey, String> {
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|_| "the pool key is not base64".to_string())?;
    pool_key_from_bytes(&bytes)
}

/// serde_json's error kinds by name (its messages may quote the input).
trait Classify {
    fn classify_name(&self) -> &'static str;
}

impl Classify for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON",
            serde_json::error::Category::Data => "not a pool and a time",
        }
    }
}

/// How long SQS should hold a wake due at `at_ms`: until then, rounded down
/// to a second (SQS's unit), at most `max` (a later wake is re-armed when
/// this arrives). Early by less than [`EARLY`], never late: the handler
/// waits out the rest (rounded up, it would come up to a second late, and
/// so would the grant of a lease's expiry).
pub fn delay(at_ms: u64, now_ms: u64, max: Duration) -> Duration {
    let seconds = at_ms.saturating_sub(now_ms) / 1000;
    Duration::from_secs(seconds).min(max)
}

/// How early a wake may arrive for its delay's rounding: one of SQS's seconds.
pub const EARLY: Duration = Duration::from_secs(1);

/// Where wakes are sent: the SQS wake queue, or a fake in tests.
#[async_trait]
pub trait WakeSender: Send + Sync {
    /// Sends `wake`, to be received after `delay` (whole seconds).
    async fn send(&self, wake: &Wake, delay: Duration) -> Result<(), String>;
}

/// The wake queue (`WAKE_QUEUE_URL`): one `SendMessage` per wake.
pub struct SqsWakes {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsWakes {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: String) -> Self {
        SqsWakes { client, queue_url }
    }
}

#[async_trait]
impl WakeSender for SqsWakes {
    async fn send(&self, wake: &Wake, delay: Duration) -> Result<(), String> {
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .delay_seconds(i32::try_from(delay.as_secs()).unwrap_or(i32::MAX))
            .message_body(wake.to_body())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
    }
}

/// A wake of the pool without delay, as an [`OnAsyncGrant`]: the dispatcher
/// steps it and delivers within tens of milliseconds instead of after the
/// table's stream (about 200 ms, and a shard's batches wait for each other).
/// In AWS what a route's own delivery leaves
/// ([`DeliverOnGrant`](super::DeliverOnGrant)). A failed send is logged,
/// never the request's failure: the stream still invokes the dispatcher for
/// the same write.
pub struct WakeOnGrant {
    sender: Arc<dyn WakeSender>,
}

impl WakeOnGrant {
    pub fn new(sender: Arc<dyn WakeSender>) -> Self {
        WakeOnGrant { sender }
    }
}

#[async_trait]
impl OnAsyncGrant for WakeOnGrant {
    async fn granted(&self, key: &PoolKey, _: &[(LeaseDigest, TicketGrant)], _: Instant) {
        let wake = Wake {
            key: *key,
            at_ms: None,
        };
        if let Err(err) = self.sender.send(&wake, Duration::ZERO).await {
            tracing::warn!(pool = %PoolKeyPrefix::of(key), error = %err,
                "the dispatcher was not woken for a grant: the table's stream delivers it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_are_delayed_within_sqs_limits() {
        let delay_s = |at, now| delay(at, now, MAX_DELAY).as_secs();
        assert_eq!(delay_s(10_500, 10_000), 0, "rounded down: never late");
        assert_eq!(delay_s(11_999, 10_000), 1, "early by less than a second");
        assert!(Duration::from_millis(11_999 - 10_000) - delay(11_999, 10_000, MAX_DELAY) < EARLY);
        assert_eq!(delay_s(9_000, 10_000), 0, "overdue: at once");
        assert_eq!(delay_s(10_000 + 3_600_000, 10_000), 900);
        assert_eq!(delay(70_000, 0, Duration::from_secs(60)).as_secs(), 60);
    }

    #[test]
    fn a_wake_body_round_trips_and_bad_ones_say_why() {
        let wake = Wake {
            key: PoolKey([7; 16]),
            at_ms: Some(1_732_170_000_000),
        };
        assert_eq!(
            wake.to_body(),
            r#"{"pool":"BwcHBwcHBwcHBwcHBwcHBw==","at":1732170000000}"#
        );
        assert_eq!(Wake::from_body(&wake.to_body()), Ok(wake));
        let hand_sent = Wake::from_body(r#"{"pool":"BwcHBwcHBwcHBwcHBwcHBw=="}"#);
        assert_eq!(hand_sent.map(|w| w.at_ms), Ok(None));
        for (body, why) in [
            ("not json", "not JSON"),
            (r#"{"at": 5}"#, "not a pool and a time"),
            (r#"{"pool": "%%%"}"#, "not base64"),
            (r#"{"pool": "AQID"}"#, "3 bytes, not 16"),
        ] {
            let err = Wake::from_body(body).unwrap_err();
            assert!(err.contains(why), "{body}: {err}");
        }
    }
}
