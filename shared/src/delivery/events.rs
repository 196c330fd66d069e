//! The dispatcher's Lambda events: a batch of the table's stream records or
//! of wake queue messages (typed by `aws_lambda_events`), each record read
//! as the pool it names, and the partial batch response naming the records
//! that failed (`ReportBatchItemFailures` in template.yaml).
//!
//! Records are read one by one, so that one that cannot be read fails alone:
//! it is reported as a failed item, never a panic or a failed batch.

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use serde::{Deserialize, Serialize};
use serde_dynamo::AttributeValue;
use serde_json::Value;

use super::wake::{pool_key_from_bytes, Wake};
use crate::keys::PoolKey;
use crate::store::dynamodb::{PK, POOL_ITEM, SK, TICKET_ITEM};

/// Where a batch comes from: its records' `eventSource`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The table's stream (`aws:dynamodb`): a record per change that passed
    /// the event source's filter; its id is `dynamodb.SequenceNumber`.
    Stream,
    /// The wake queue (`aws:sqs`): a wake per message; its id is `messageId`.
    Queue,
}

impl Source {
    fn of(record: &Value) -> Option<Source> {
        match record.get("eventSource")?.as_str()? {
            "aws:dynamodb" => Some(Source::Stream),
            "aws:sqs" => Some(Source::Queue),
            _ => None,
        }
    }
}

/// One record of a batch, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A record naming a pool: a change of one of its items, or a wake of it
    /// (`wake_at`: the time the wake was sent for).
    Pool {
        id: String,
        key: PoolKey,
        wake_at: Option<u64>,
    },
    /// A record that names no pool, and why (safe to log). `id`: its item
    /// identifier, if it has one.
    Unreadable { id: Option<String>, why: String },
}

/// A batch as Lambda invokes the dispatcher with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub source: Source,
    pub items: Vec<Item>,
}

impl Batch {
    /// The batch in an invocation's payload; an error for a payload that is
    /// neither a stream nor an SQS batch (the invocation's error, not a panic).
    pub fn from_payload(payload: Value) -> Result<Batch, String> {
        let Some(Value::Array(records)) = payload.get("Records") else {
            return Err("the event has no Records: not a stream or SQS batch".into());
        };
        let Some(first) = records.first() else {
            // Never sent by Lambda; nothing to do.
            return Ok(Batch {
                source: Source::Stream,
                items: Vec::new(),
            });
        };
        let source = Source::of(first)
            .ok_or("the first record's eventSource is neither aws:dynamodb nor aws:sqs")?;
        let items = records.iter().map(|raw| read(source, raw)).collect();
        Ok(Batch { source, items })
    }
}

/// One record, typed by its source, as the pool it names.
fn read(source: Source, raw: &Value) -> Item {
    let id_of = |raw: &Value| {
        let id = match source {
            Source::Stream => raw.get("dynamodb")?.get("SequenceNumber")?,
            Source::Queue => raw.get("messageId")?,
        };
        id.as_str().map(str::to_string)
    };
    let unreadable = |why: String| Item::Unreadable {
        id: id_of(raw),
        why,
    };
    if Source::of(raw) != Some(source) {
        return unreadable("a record of another source in the batch".into());
    }
    match source {
        Source::Stream => match EventRecord::deserialize(raw) {
            Ok(record) => match (record.change.sequence_number.clone(), changed_pool(&record)) {
                (Some(id), Ok(key)) => Item::Pool {
                    id,
                    key,
                    wake_at: None,
                },
                (id, Ok(_)) => Item::Unreadable {
                    id,
                    why: "a stream record without a SequenceNumber".into(),
                },
                (id, Err(why)) => Item::Unreadable { id, why },
            },
            Err(e) => unreadable(format!("not a stream record: {}", shape(&e))),
        },
        Source::Queue => match SqsMessage::deserialize(raw) {
            Ok(message) => {
                let wake = message
                    .body
                    .as_deref()
                    .ok_or_else(|| "a message without a body".to_string())
                    .and_then(Wake::from_body);
                match (message.message_id, wake) {
                    (Some(id), Ok(wake)) => Item::Pool {
                        id,
                        key: wake.key,
                        wake_at: wake.at_ms,
                    },
                    (None, Ok(_)) => unreadable("a message without a messageId".into()),
                    (id, Err(why)) => Item::Unreadable { id, why },
                }
            }
            Err(e) => unreadable(format!("not an SQS message: {}", shape(&e))),
        },
    }
}

/// What is wrong with a record's shape, safe to log: serde's message for a
/// field missing, never one that may quote a value (an image may hold a
/// callback token).
fn shape(e: &serde_json::Error) -> String {
    let message = e.to_string();
    if message.starts_with("missing field") {
        message
    } else {
        "a field of the wrong type".to_string()
    }
}

/// The pool whose item changed: its `pk`, 16 bytes, with the sort key of a
/// pool item (`00`) or of a ticket item (`01` ‖ lease digest).
fn changed_pool(record: &EventRecord) -> Result<PoolKey, String> {
    let binary = |name: &str| match record.change.keys.get(name) {
        Some(AttributeValue::B(bytes)) => Ok(bytes.as_slice()),
        _ => Err(format!("the record's key has no binary `{name}`")),
    };
    let sk = binary(SK)?;
    let ticket_sk = sk.len() == 9 && sk[0] == TICKET_ITEM;
    if sk != POOL_ITEM && !ticket_sk {
        return Err("the record's item is neither a pool nor a ticket".into());
    }
    pool_key_from_bytes(binary(PK)?)
}

/// The partial batch response: the records that failed, which Lambda
/// retries (a stream from the first of them, SQS each on its own); the
/// others are done.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    #[serde(rename = "batchItemFailures")]
    pub batch_item_failures: Vec<ItemFailure>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemFailure {
    #[serde(rename = "itemIdentifier")]
    pub item_identifier: String,
}

impl BatchResponse {
    pub fn failed(&mut self, id: &str) {
        self.batch_item_failures.push(ItemFailure {
            item_identifier: id.to_string(),
        });
    }

    /// The failed items' identifiers.
    pub fn ids(&self) -> Vec<&str> {
        self.batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde_json::json;

    use super::*;

    fn stream_record(seq: &str, pk: &[u8], sk: &[u8]) -> Value {
        json!({
            "eventID": "1", "eventName": "MODIFY", "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
            "dynamodb": {
                "Keys": {"pk": {"B": STANDARD.encode(pk)}, "sk": {"B": STANDARD.encode(sk)}},
                "NewImage": {"pk": {"B": STANDARD.encode(pk)}, "sk": {"B": STANDARD.encode(sk)}, "z": {"N": "1"}},
                "SequenceNumber": seq, "SizeBytes": 40, "StreamViewType": "NEW_IMAGE"
            },
            "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2024-11-21T00:00:00.000"
        })
    }

    fn message(id: &str, body: &str) -> Value {
        json!({
            "messageId": id, "receiptHandle": "r", "body": body, "attributes": {},
            "messageAttributes": {}, "md5OfBody": "x", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:wake", "awsRegion": "us-east-1"
        })
    }

    #[test]
    fn stream_records_name_pools_and_bad_keys_fail_alone() {
        let key = [7u8; 16];
        let mut ticket_sk = vec![TICKET_ITEM];
        ticket_sk.extend([3; 8]);
        let mut no_seq = stream_record("", &key, &POOL_ITEM);
        no_seq["dynamodb"]
            .as_object_mut()
            .map(|d| d.remove("SequenceNumber"));
        let mut no_size = stream_record("6", &key, &POOL_ITEM);
        no_size["dynamodb"]
            .as_object_mut()
            .map(|d| d.remove("SizeBytes"));
        let payload = json!({"Records": [
            stream_record("1", &key, &POOL_ITEM),
            stream_record("2", &key, &ticket_sk),
            stream_record("3", &[1, 2, 3], &POOL_ITEM),
            stream_record("4", &key, &[9]),
            message("5", "{}"),
            no_size,
            no_seq,
        ]});
        let batch = Batch::from_payload(payload).expect("a batch");
        assert_eq!(batch.source, Source::Stream);
        let pool = |id: &str| Item::Pool {
            id: id.into(),
            key: PoolKey(key),
            wake_at: None,
        };
        assert_eq!(batch.items[..2], [pool("1"), pool("2")]);
        let ids: Vec<Option<&str>> = batch.items[2..]
            .iter()
            .map(|item| match item {
                Item::Unreadable { id, .. } => id.as_deref(),
                Item::Pool { .. } => panic!("{item:?} read"),
            })
            .collect();
        assert_eq!(ids, [Some("3"), Some("4"), None, Some("6"), None]);
        let Item::Unreadable { why, .. } = &batch.items[5] else {
            unreachable!()
        };
        assert!(why.contains("missing field `SizeBytes`"), "{why}");
        let mut secret = stream_record("7", &key, &POOL_ITEM);
        secret["dynamodb"]["NewImage"]["ct"] = json!({"S": 12345678});
        let batch = Batch::from_payload(json!({ "Records": [secret] })).expect("a batch");
        let Item::Unreadable { id, why } = &batch.items[0] else {
            panic!("{:?} read", batch.items[0])
        };
        assert_eq!(
            (id.as_deref(), why.contains("12345678")),
            (Some("7"), false)
        );
    }

    #[test]
    fn wake_messages_name_pools_and_bad_bodies_fail_alone() {
        let wake = Wake {
            key: PoolKey([7; 16]),
            at_ms: Some(1_732_170_000_000),
        };
        let payload = json!({"Records": [
            message("a", &wake.to_body()),
            message("b", "not json"),
            message("c", r#"{"pool": "AQID", "at": 1}"#),
        ]});
        let batch = Batch::from_payload(payload).expect("a batch");
        assert_eq!(batch.source, Source::Queue);
        assert_eq!(
            batch.items[0],
            Item::Pool {
                id: "a".into(),
                key: wake.key,
                wake_at: wake.at_ms
            }
        );
        for (item, id) in batch.items[1..].iter().zip(["b", "c"]) {
            assert!(
                matches!(item, Item::Unreadable { id: Some(got), .. } if got == id),
                "{item:?}"
            );
        }
    }

    #[test]
    fn a_payload_that_is_no_batch_is_an_error() {
        assert!(Batch::from_payload(json!({})).is_err());
        assert!(Batch::from_payload(json!({"Records": "x"})).is_err());
        assert!(Batch::from_payload(json!({"Records": [{"eventSource": "aws:s3"}]})).is_err());
        let empty = Batch::from_payload(json!({"Records": []})).expect("empty batch");
        assert!(empty.items.is_empty());
    }

    #[test]
    fn the_response_is_lambdas_partial_batch_response() {
        let mut response = BatchResponse::default();
        assert_eq!(json!(response), json!({"batchItemFailures": []}));
        response.failed("4");
        assert_eq!(
            json!(response),
            json!({"batchItemFailures": [{"itemIdentifier": "4"}]})
        );
    }
}
