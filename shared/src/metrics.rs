//! One structured log line per request. In JSON it is also CloudWatch
//! Embedded Metric Format: CloudWatch turns the line into metrics, with no
//! extra API call and no CloudWatch client in the functions.
//!
//! The only dimension is the route (a handful of values). The pool id never
//! is one (unbounded cardinality, and it is a credential): the line carries
//! only its first 8 hex digits, to correlate.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::clock::now_ms;
use crate::keys::{self, PoolId};
use crate::service::Stats;

/// How a request's line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line, with the EMF metadata (Lambda, and
    /// `local-api --log-format json`).
    Json,
    /// A human line through `tracing` (the local server's default).
    Text,
}

/// The metrics of every request, by name and unit.
pub const METRICS: [(&str, &str); 9] = [
    ("Requests", "Count"),
    ("Latency", "Milliseconds"),
    ("Status4xx", "Count"),
    ("Status409", "Count"),
    ("Status5xx", "Count"),
    ("Conflicts", "Count"),
    ("StoreCalls", "Count"),
    ("StoreErrors", "Count"),
    ("WaitTime", "Milliseconds"),
];

/// The namespace metrics go to: `METRICS_NAMESPACE`, else `HttpSemaphore`.
pub fn namespace() -> &'static str {
    static NAMESPACE: OnceLock<String> = OnceLock::new();
    NAMESPACE.get_or_init(|| {
        std::env::var("METRICS_NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "HttpSemaphore".to_string())
    })
}

/// What one request did.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestLog<'a> {
    /// The route key (`POST /l/{id}/borrow`), or `$default`.
    pub route: &'a str,
    pub pool: Option<PoolId>,
    pub status: u16,
    pub duration: Duration,
    pub stats: Stats,
}

impl RequestLog<'_> {
    /// The line as an EMF JSON object, stamped `timestamp_ms`.
    pub fn to_json(&self, namespace: &str, timestamp_ms: u64) -> Value {
        let metrics: Vec<Value> = METRICS
            .iter()
            .map(|(name, unit)| json!({ "Name": name, "Unit": unit }))
            .collect();
        let status = self.status;
        let flag = |hit: bool| u32::from(hit);
        let mut line = envelope(namespace, timestamp_ms, metrics);
        line.insert("Route".into(), json!(self.route));
        let values = [
            json!(1),
            json!(millis(self.duration)),
            json!(flag((400..500).contains(&status))),
            json!(flag(status == 409)),
            json!(flag(status >= 500)),
            json!(self.stats.conflicts),
            json!(self.stats.store_calls),
            json!(self.stats.store_errors),
            json!(millis(self.stats.waited)),
        ];
        for ((name, _), value) in METRICS.iter().zip(values) {
            line.insert((*name).into(), value);
        }
        line.insert("message".into(), json!("request"));
        line.insert("status".into(), json!(status));
        line.insert("pool".into(), json!(self.pool_prefix()));
        Value::Object(line)
    }

    /// The pool id's first 8 hex digits, or `-`.
    fn pool_prefix(&self) -> String {
        self.pool
            .map_or_else(|| "-".to_string(), |id| keys::short(&id.0))
    }

    /// Writes the line in `format`.
    pub fn emit(&self, format: LogFormat) {
        match format {
            LogFormat::Json => println!("{}", self.to_json(namespace(), now_ms())),
            LogFormat::Text => tracing::info!(
                route = self.route,
                pool = %self.pool_prefix(),
                status = self.status,
                ms = millis(self.duration),
                store_calls = self.stats.store_calls,
                conflicts = self.stats.conflicts,
                waited_ms = millis(self.stats.waited),
                "request"
            ),
        }
    }
}

/// Async mode's metrics, one line per event of the dispatcher (route
/// `dispatcher`): a delivery's end, or a pool's queue after a step.
pub const ASYNC_METRICS: [(&str, &str); 5] = [
    ("Delivered", "Count"),
    ("DeliveryFailed", "Count"),
    ("DeliveryAttempts", "Count"),
    ("EnqueueToDelivery", "Milliseconds"),
    ("QueueDepth", "Count"),
];

/// What the dispatcher saw: a delivery that ended, or a pool's queue depth
/// (backlog and queue) after a step.
#[derive(Clone, Debug, PartialEq)]
pub enum AsyncLog {
    Delivery {
        pool: PoolKeyPrefix,
        delivered: bool,
        attempts: u32,
        /// From the enqueue to the delivery's end.
        since_enqueue: Duration,
    },
    Queue {
        pool: PoolKeyPrefix,
        depth: u64,
    },
}

/// A pool key's first 4 bytes in hex (the key is a digest of the pool id,
/// not the id: still only a prefix, to correlate lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolKeyPrefix(pub [u8; 4]);

impl PoolKeyPrefix {
    pub fn of(key: &crate::keys::PoolKey) -> Self {
        PoolKeyPrefix([key.0[0], key.0[1], key.0[2], key.0[3]])
    }
}

impl std::fmt::Display for PoolKeyPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl AsyncLog {
    /// The line as an EMF JSON object: only the metrics this event has.
    pub fn to_json(&self, namespace: &str, timestamp_ms: u64) -> Value {
        let (pool, values): (PoolKeyPrefix, Vec<(&str, Value)>) = match self {
            AsyncLog::Delivery {
                pool,
                delivered,
                attempts,
                since_enqueue,
            } => (
                *pool,
                vec![
                    ("Delivered", json!(u32::from(*delivered))),
                    ("DeliveryFailed", json!(u32::from(!*delivered))),
                    ("DeliveryAttempts", json!(attempts)),
                    ("EnqueueToDelivery", json!(millis(*since_enqueue))),
                ],
            ),
            AsyncLog::Queue { pool, depth } => (*pool, vec![("QueueDepth", json!(depth))]),
        };
        let metrics: Vec<Value> = values
            .iter()
            .map(|(name, _)| {
                let unit = ASYNC_METRICS
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("Count", |(_, unit)| unit);
                json!({ "Name": name, "Unit": unit })
            })
            .collect();
        let mut line = envelope(namespace, timestamp_ms, metrics);
        line.insert("Route".into(), json!("dispatcher"));
        for (name, value) in values {
            line.insert(name.into(), value);
        }
        line.insert("message".into(), json!("dispatch"));
        line.insert("pool".into(), json!(pool.to_string()));
        Value::Object(line)
    }

    pub fn emit(&self, format: LogFormat) {
        match format {
            LogFormat::Json => println!("{}", self.to_json(namespace(), now_ms())),
            LogFormat::Text => match self {
                AsyncLog::Delivery {
                    pool,
                    delivered,
                    attempts,
                    since_enqueue,
                } => tracing::info!(
                    pool = %pool,
                    delivered,
                    attempts,
                    since_enqueue_ms = millis(*since_enqueue),
                    "delivery"
                ),
                AsyncLog::Queue { pool, depth } => {
                    tracing::debug!(pool = %pool, depth, "queue")
                }
            },
        }
    }
}

/// An EMF line's metadata: its metrics, with the route as only dimension.
fn envelope(namespace: &str, timestamp_ms: u64, metrics: Vec<Value>) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [["Route"]],
                "Metrics": metrics,
            }],
        }),
    );
    line
}

/// Milliseconds with a tenth of precision: enough for latency percentiles.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";

    fn line(status: u16) -> Value {
        RequestLog {
            route: "POST /l/{id}/borrow",
            pool: Some(PoolId(uuid::Uuid::parse_str(ID).unwrap())),
            status,
            duration: Duration::from_micros(12_345),
            stats: Stats {
                store_calls: 3,
                store_errors: 1,
                conflicts: 2,
                waited: Duration::from_millis(250),
            },
        }
        .to_json("HttpSemaphore", 1_700_000_000_000)
    }

    /// What CloudWatch requires of an EMF line: the `_aws` block with a
    /// timestamp and metric directives, every dimension and metric a
    /// top-level member, numeric values, known units.
    fn assert_valid_emf(line: &Value) {
        let aws = &line["_aws"];
        assert!(aws["Timestamp"].is_u64());
        let directives = aws["CloudWatchMetrics"].as_array().unwrap();
        assert_eq!(directives.len(), 1);
        let directive = &directives[0];
        assert!(directive["Namespace"].is_string());
        for set in directive["Dimensions"].as_array().unwrap() {
            for dimension in set.as_array().unwrap() {
                assert!(line[dimension.as_str().unwrap()].is_string());
            }
        }
        for metric in directive["Metrics"].as_array().unwrap() {
            let name = metric["Name"].as_str().unwrap();
            assert!(line[name].is_number(), "{name}");
            assert!(["Count", "Milliseconds"].contains(&metric["Unit"].as_str().unwrap()));
        }
    }

    #[test]
    fn lines_are_emf_with_the_route_as_only_dimension() {
        for status in [200, 409, 502] {
            let line = line(status);
            assert_valid_emf(&line);
            assert_eq!(
                line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
                json!([["Route"]])
            );
            assert_eq!(line["Status409"], u32::from(status == 409));
            assert_eq!(line["Status4xx"], u32::from(status == 409));
            assert_eq!(line["Status5xx"], u32::from(status == 502));
        }
        let line = line(200);
        assert_eq!(line["Latency"], 12.3);
        assert_eq!(line["WaitTime"], 250.0);
        assert_eq!(line["StoreCalls"], 3);
        assert_eq!(line["Conflicts"], 2);
    }

    #[test]
    fn async_lines_are_emf() {
        let pool = PoolKeyPrefix([0xab, 0, 1, 2]);
        let delivery = AsyncLog::Delivery {
            pool,
            delivered: false,
            attempts: 3,
            since_enqueue: Duration::from_millis(1500),
        }
        .to_json("HttpSemaphore", 1);
        assert_valid_emf(&delivery);
        assert_eq!(
            (&delivery["DeliveryFailed"], &delivery["Delivered"]),
            (&json!(1), &json!(0))
        );
        assert_eq!(delivery["EnqueueToDelivery"], 1500.0);
        assert_eq!(delivery["pool"], "ab000102");
        let queue = AsyncLog::Queue { pool, depth: 7 }.to_json("HttpSemaphore", 1);
        assert_valid_emf(&queue);
        assert_eq!(queue["QueueDepth"], 7);
        assert!(queue.get("Delivered").is_none());
    }

    #[test]
    fn no_line_holds_a_whole_uuid() {
        let text = line(200).to_string();
        assert!(text.contains("\"pool\":\"9f1c2e7a\""), "{text}");
        assert!(!text.contains(ID) && !text.contains(&ID.replace('-', "")));
    }
}
