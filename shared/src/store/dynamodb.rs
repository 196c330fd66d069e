//! DynamoDB: one item per pool.
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | S | hex SHA-256 of the pool UUID (partition key) |
//! | `v`  | N | version token, replaced on every write |
//! | `c`  | N | count |
//! | `l`  | B | leases, packed 24 bytes each; absent when there are none |
//!
//! Every write is a `PutItem` whose condition sits next to it and which asks
//! for the old item on a failed condition, so a conflict costs no extra read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConsumedCapacity, KeySchemaElement, KeyType,
    ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TableStatus,
};
use aws_sdk_dynamodb::Client;

use super::{
    new_version, Created, PoolStore, Replaced, StoreError, StoreErrorKind, Version, Versioned,
};
use crate::domain::{Lease, LeaseDigest, Pool, MAX_COUNT};
use crate::keys::PoolKey;

const PK: &str = "pk";
const VERSION: &str = "v";
const COUNT: &str = "c";
const LEASES: &str = "l";

/// position (2) + expiry ms (6: good until year 10889) + digest (16).
const LEASE_BYTES: usize = 24;

type Item = HashMap<String, AttributeValue>;

#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    /// Consumed write/read units × 1000, when tracking was asked for (benchmarks).
    consumed_milli_units: Option<Arc<AtomicU64>>,
}

impl DynamoDbStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoDbStore {
            client,
            table: table.into(),
            consumed_milli_units: None,
        }
    }

    /// Asks DynamoDB for consumed capacity on every call and adds it up.
    pub fn with_capacity_tracking(mut self, total: Arc<AtomicU64>) -> Self {
        self.consumed_milli_units = Some(total);
        self
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn capacity_mode(&self) -> Option<ReturnConsumedCapacity> {
        self.consumed_milli_units
            .as_ref()
            .map(|_| ReturnConsumedCapacity::Total)
    }

    fn record(&self, consumed: Option<&ConsumedCapacity>) {
        if let (Some(total), Some(units)) = (
            &self.consumed_milli_units,
            consumed.and_then(|c| c.capacity_units()),
        ) {
            total.fetch_add((units * 1000.0).round() as u64, Ordering::Relaxed);
        }
    }

    async fn put(
        &self,
        key: &PoolKey,
        pool: &Pool,
        version: Version,
        condition: &str,
        expected: Option<Version>,
    ) -> Result<Result<(), Option<Item>>, StoreError> {
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(key, pool, version)))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.capacity_mode());
        if let Some(expected) = expected {
            request = request
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_values(":v", AttributeValue::N(expected.to_string()));
        }
        match request.send().await {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(Ok(()))
            }
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    // A failed condition is still a billed write.
                    Ok(Err(failed.item().cloned()))
                }
                _ => Err(store_error(err)),
            },
        }
    }
}

#[async_trait]
impl PoolStore for DynamoDbStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, AttributeValue::S(key.to_hex()))
            // A borrower must see the latest return, or it would wait for nothing.
            .consistent_read(true)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await
            .map_err(store_error)?;
        self.record(out.consumed_capacity());
        out.item().map(decode).transpose()
    }

    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError> {
        let version = new_version();
        match self
            .put(key, pool, version, "attribute_not_exists(pk)", None)
            .await?
        {
            Ok(()) => Ok(Created::Created(version)),
            Err(Some(item)) => {
                let current = decode(&item)?;
                // Our own write landed on an earlier SDK attempt.
                if current.version == version {
                    Ok(Created::Created(version))
                } else {
                    Ok(Created::Exists(current))
                }
            }
            Err(None) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "create failed its condition but returned no item",
            )),
        }
    }

    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError> {
        let version = new_version();
        match self
            .put(key, pool, version, "#v = :v", Some(expected))
            .await?
        {
            Ok(()) => Ok(Replaced::Replaced(version)),
            Err(Some(item)) => {
                let current = decode(&item)?;
                // The SDK retried a write that had landed: the item carries our token.
                if current.version == version {
                    Ok(Replaced::Replaced(version))
                } else {
                    Ok(Replaced::Conflict(Some(current)))
                }
            }
            Err(None) => Ok(Replaced::Conflict(None)),
        }
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(PK, AttributeValue::S(key.to_hex()))
            // Only the key comes back useful; ALL_OLD is how DeleteItem says "it was there".
            .return_values(ReturnValue::AllOld)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await
            .map_err(store_error)?;
        self.record(out.consumed_capacity());
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }
}

/// Creates the table if it does not exist and checks its key schema, failing
/// early and clearly when it is keyed differently. For local runs and tests;
/// deployed functions rely on the SAM template.
pub async fn ensure_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(PK)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| StoreError::new(StoreErrorKind::Unavailable, e.to_string()))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| StoreError::new(StoreErrorKind::Unavailable, e.to_string()))?,
        )
        .send()
        .await;
    if let Err(err) = created {
        if err.code() != Some("ResourceInUseException") {
            return Err(store_error(err));
        }
    }
    for _ in 0..100 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(store_error)?;
        let Some(desc) = described.table() else {
            break;
        };
        let keyed_right = matches!(
            desc.key_schema(),
            [k] if k.attribute_name() == PK && k.key_type() == &KeyType::Hash
        );
        if !keyed_right {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("table {table} must have the single string partition key `{PK}`"),
            ));
        }
        if desc.table_status() == Some(&TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(StoreError::new(
        StoreErrorKind::Unavailable,
        format!("table {table} did not become active"),
    ))
}

fn store_error<E, R>(err: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let kind = match err.code() {
        Some(
            "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded"
            | "ThrottlingException",
        ) => StoreErrorKind::Throttled,
        _ => StoreErrorKind::Unavailable,
    };
    let message = match (err.code(), err.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => aws_sdk_dynamodb::error::DisplayErrorContext(&err).to_string(),
    };
    StoreError::new(kind, message)
}

fn encode(key: &PoolKey, pool: &Pool, version: Version) -> Item {
    let mut item = HashMap::with_capacity(4);
    item.insert(PK.to_string(), AttributeValue::S(key.to_hex()));
    item.insert(VERSION.to_string(), AttributeValue::N(version.to_string()));
    item.insert(
        COUNT.to_string(),
        AttributeValue::N(pool.count().to_string()),
    );
    if !pool.leases().is_empty() {
        item.insert(
            LEASES.to_string(),
            AttributeValue::B(Blob::new(pack(pool.leases()))),
        );
    }
    item
}

fn decode(item: &Item) -> Result<Versioned, StoreError> {
    let corrupt =
        |what: &str| StoreError::new(StoreErrorKind::Corrupt, format!("pool item: {what}"));
    let number = |name: &str| -> Result<u64, StoreError> {
        match item.get(name) {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| corrupt(name)),
            _ => Err(corrupt(name)),
        }
    };
    let version = number(VERSION)?;
    let count = u16::try_from(number(COUNT)?)
        .ok()
        .filter(|c| *c <= MAX_COUNT)
        .ok_or_else(|| corrupt(COUNT))?;
    let leases = match item.get(LEASES) {
        None => Vec::new(),
        Some(AttributeValue::B(blob)) => unpack(blob.as_ref()).ok_or_else(|| corrupt(LEASES))?,
        Some(_) => return Err(corrupt(LEASES)),
    };
    Ok(Versioned {
        pool: Pool::from_parts(count, leases),
        version,
    })
}

fn pack(leases: &[Lease]) -> Vec<u8> {
    let mut out = Vec::with_capacity(leases.len() * LEASE_BYTES);
    for lease in leases {
        out.extend_from_slice(&lease.position.to_be_bytes());
        out.extend_from_slice(&lease.expires_at_ms.to_be_bytes()[2..]);
        out.extend_from_slice(&lease.digest.0);
    }
    out
}

fn unpack(bytes: &[u8]) -> Option<Vec<Lease>> {
    if !bytes.len().is_multiple_of(LEASE_BYTES) {
        return None;
    }
    bytes
        .chunks_exact(LEASE_BYTES)
        .map(|chunk| {
            let position = u16::from_be_bytes([chunk[0], chunk[1]]);
            let mut expiry = [0u8; 8];
            expiry[2..].copy_from_slice(&chunk[2..8]);
            let digest = LeaseDigest(chunk[8..].try_into().ok()?);
            Some(Lease {
                digest,
                position,
                expires_at_ms: u64::from_be_bytes(expiry),
            })
        })
        .collect()
}

/// Bytes DynamoDB bills for an item: attribute names plus values (numbers
/// approximated as their decimal length), as in the item-size rules.
pub fn item_size(key: &PoolKey, pool: &Pool, version: Version) -> usize {
    encode(key, pool, version)
        .iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                    AttributeValue::B(b) => b.as_ref().len(),
                    _ => 0,
                }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_pool(count: u16) -> Pool {
        let mut pool = Pool::new(count);
        for n in 0..count {
            let mut digest = [0xab; 16];
            digest[..2].copy_from_slice(&n.to_be_bytes());
            pool.borrow(LeaseDigest(digest), 1_900_000_000_000 + u64::from(n), 0)
                .unwrap();
        }
        pool
    }

    #[test]
    fn items_round_trip() {
        let key = PoolKey([7; 32]);
        for count in [0, 1, 4, 1000] {
            let pool = full_pool(count);
            let decoded = decode(&encode(&key, &pool, 42)).unwrap();
            assert_eq!(decoded.pool, pool);
            assert_eq!(decoded.version, 42);
        }
    }

    #[test]
    fn items_stay_compact() {
        let key = PoolKey([7; 32]);
        let size16 = item_size(&key, &full_pool(16), u64::MAX);
        assert!(size16 <= 1024, "count 16 fully held is {size16} bytes");
        assert!(item_size(&key, &full_pool(1000), u64::MAX) < 400 * 1024);
    }

    #[test]
    fn corrupt_items_are_errors_not_panics() {
        let key = PoolKey([7; 32]);
        let mut item = encode(&key, &full_pool(2), 1);
        item.insert(LEASES.into(), AttributeValue::B(Blob::new(vec![1, 2, 3])));
        assert_eq!(decode(&item).unwrap_err().kind, StoreErrorKind::Corrupt);
        item.insert(COUNT.into(), AttributeValue::N("1001".into()));
        assert_eq!(decode(&item).unwrap_err().kind, StoreErrorKind::Corrupt);
        item.remove(VERSION);
        assert_eq!(decode(&item).unwrap_err().kind, StoreErrorKind::Corrupt);
    }
}
