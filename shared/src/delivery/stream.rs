//! A table's DynamoDB stream, followed in-process: in local runs on DynamoDB
//! Local, the stand-in for the dispatcher's event source mapping in AWS,
//! passing the same changes ([`dispatches`]) to the same dispatcher.
//!
//! It speaks DynamoDB Streams' JSON protocol itself, unsigned (DynamoDB Local
//! checks no signature): the SDK's client cannot read DynamoDB Local's
//! records, which write an empty map attribute as `{}` instead of `{"M":{}}`
//! (every pool item has one), and this reader needs only the keys, the event
//! name and which attributes the new image has. Not for a real table: in AWS
//! the event source mapping does this.

use std::collections::HashMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use crate::keys::PoolKey;
use crate::service::Watch;
use crate::store::dynamodb::{dispatches, PK, SK};

/// How often an idle stream is read again.
const IDLE: Duration = Duration::from_millis(20);
/// How often new shards are looked for.
const SHARDS: Duration = Duration::from_secs(1);

/// Follows the stream at `arn` of the DynamoDB Local at `endpoint`, telling
/// `watch` of every change the dispatcher is for, until the runtime ends.
/// It reads from the moment it returns (its shards' positions are taken
/// first: a change made after it returns is never missed). Failed reads are
/// logged and retried.
pub async fn follow(endpoint: &str, arn: String, watch: Watch) -> Result<(), String> {
    let streams = Streams {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?,
        endpoint: endpoint.to_string(),
    };
    // Shard id → where to read next (`None`: the shard closed, read out).
    let mut shards: HashMap<String, Option<String>> = HashMap::new();
    streams.discover(&arn, &mut shards, true).await?;
    tokio::spawn(async move {
        let mut looked = Some(tokio::time::Instant::now());
        loop {
            if looked.is_none_or(|at| at.elapsed() >= SHARDS) {
                looked = Some(tokio::time::Instant::now());
                if let Err(err) = streams.discover(&arn, &mut shards, false).await {
                    tracing::warn!(error = %err, "reading the table's stream failed; retrying");
                }
            }
            let mut read = 0;
            let mut lost = Vec::new();
            for (id, next) in shards.iter_mut() {
                let Some(iterator) = next.clone() else {
                    continue;
                };
                match streams
                    .call("GetRecords", json!({"ShardIterator": iterator}))
                    .await
                {
                    Ok(out) => {
                        let records = out["Records"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                        for record in records {
                            read += 1;
                            if let Some(key) = pool_of(record) {
                                watch(key);
                            }
                        }
                        *next = out["NextShardIterator"].as_str().map(str::to_string);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "reading a stream shard failed; retrying");
                        // An expired iterator, or one past what the shard
                        // keeps (DynamoDB Local answers a LATEST iterator so
                        // at times): read the shard again from its oldest
                        // record. A change seen twice only costs a step.
                        lost.push(id.clone());
                    }
                }
            }
            if !lost.is_empty() {
                for id in lost {
                    shards.remove(&id);
                }
                looked = None;
            }
            if read == 0 {
                tokio::time::sleep(IDLE).await;
            }
        }
    });
    Ok(())
}

struct Streams {
    http: reqwest::Client,
    endpoint: String,
}

impl Streams {
    /// One DynamoDB Streams call (JSON 1.0), signed with nothing.
    async fn call(&self, operation: &str, body: Value) -> Result<Value, String> {
        let answer = self
            .http
            .post(&self.endpoint)
            .header("Content-Type", "application/x-amz-json-1.0")
            .header(
                "X-Amz-Target",
                format!("DynamoDBStreams_20120810.{operation}"),
            )
            // DynamoDB Local wants a credential, and checks nothing of it.
            .header(
                "Authorization",
                "AWS4-HMAC-SHA256 Credential=x/20260101/us-east-1/dynamodb/aws4_request, \
                 SignedHeaders=host, Signature=0",
            )
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("{operation}: {}", e.without_url()))?;
        let status = answer.status();
        let text = answer
            .text()
            .await
            .map_err(|e| format!("{operation}: {}", e.without_url()))?;
        if !status.is_success() {
            return Err(format!("{operation}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{operation}: {e}"))
    }

    /// Adds the stream's shards not yet followed: from now on (`latest`, at
    /// start) or from their first record (shards that opened since).
    async fn discover(
        &self,
        arn: &str,
        shards: &mut HashMap<String, Option<String>>,
        latest: bool,
    ) -> Result<(), String> {
        let described = self
            .call("DescribeStream", json!({"StreamArn": arn}))
            .await?;
        let listed = described["StreamDescription"]["Shards"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for shard in listed {
            let Some(id) = shard["ShardId"].as_str() else {
                continue;
            };
            if shards.contains_key(id) {
                continue;
            }
            let kind = if latest { "LATEST" } else { "TRIM_HORIZON" };
            let iterator = self
                .call(
                    "GetShardIterator",
                    json!({"StreamArn": arn, "ShardId": id, "ShardIteratorType": kind}),
                )
                .await?;
            shards.insert(
                id.to_string(),
                iterator["ShardIterator"].as_str().map(str::to_string),
            );
        }
        Ok(())
    }
}

/// The pool a stream record is for, when the dispatcher is for it.
fn pool_of(record: &Value) -> Option<PoolKey> {
    let change = &record["dynamodb"];
    let key = |name: &str| STANDARD.decode(change["Keys"][name]["B"].as_str()?).ok();
    let image = change["NewImage"].as_object()?;
    let inserted = record["eventName"] == "INSERT";
    if !dispatches(&key(SK)?, |name| image.contains_key(name), inserted) {
        return None;
    }
    Some(PoolKey(key(PK)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(event: &str, sk: &[u8], attributes: &[&str]) -> Value {
        let image: serde_json::Map<String, Value> = attributes
            .iter()
            // DynamoDB Local writes an empty map as `{}`.
            .map(|name| (name.to_string(), json!({})))
            .collect();
        json!({"eventName": event, "dynamodb": {
            "Keys": {"pk": {"B": STANDARD.encode([9u8; 16])}, "sk": {"B": STANDARD.encode(sk)}},
            "NewImage": image}})
    }

    #[test]
    fn passes_what_the_event_source_filter_passes() {
        let pool = Some(PoolKey([9; 16]));
        assert_eq!(pool_of(&record("MODIFY", &[0], &["i", "z", "e"])), pool);
        assert_eq!(
            pool_of(&record("MODIFY", &[0], &["i", "e"])),
            None,
            "sync-only"
        );
        assert_eq!(
            pool_of(&record("INSERT", &[1, 2], &["tn", "st"])),
            pool,
            "a new ticket"
        );
        assert_eq!(
            pool_of(&record("MODIFY", &[1, 2], &["tn", "st"])),
            None,
            "a ticket's state"
        );
        assert_eq!(
            pool_of(&json!({"eventName": "REMOVE", "dynamodb": {}})),
            None
        );
    }
}
