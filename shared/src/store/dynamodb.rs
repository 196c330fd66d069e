//! DynamoDB: one item per pool, changed by conditional `UpdateItem`s that
//! name only the slots, leases and tickets they touch.
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | S | hex SHA-256 of the pool UUID (partition key) |
//! | `i`  | N | incarnation: random per creation; every update is conditioned on it |
//! | `c`  | N | count |
//! | `n`  | N | leases stored (live or not yet pruned): the capacity check |
//! | `f`  | N | fence counter: the fence of the latest grant |
//! | `s`  | M | slots: position → the fence of the lease holding it |
//! | `h`  | M | holders: lease digest (base64url) → position (2 B) ‖ expiry ms (6 B) |
//! | `q`  | L | tickets of waiting borrowers, in arrival order: digest (16 B) ‖ give-up ms (6 B) |
//!
//! A grant is `SET f = f + 1, s.P = f + 1, h.D = …`: every right-hand side
//! reads the item before the update, so the fence comes from an atomic
//! counter and concurrent grants of different slots never conflict over it.
//! A failed condition hands back the current item (`ALL_OLD`), a success the
//! new one (`ALL_NEW`), so the caller never needs a read to decide again.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConsumedCapacity, KeySchemaElement, KeyType,
    ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TableStatus,
};
use aws_sdk_dynamodb::Client;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::{Created, PoolStore, Record, StoreError, StoreErrorKind, Updated};
use crate::domain::{Change, Expect, Lease, LeaseDigest, Pool, Ticket, Update, MAX_COUNT};
use crate::keys::PoolKey;

const PK: &str = "pk";
const INCARNATION: &str = "i";
const COUNT: &str = "c";
const STORED: &str = "n";
const FENCE: &str = "f";
const SLOTS: &str = "s";
const HOLDERS: &str = "h";
const QUEUE: &str = "q";

/// position (2) + expiry ms (6: good until year 10889).
const HOLDER_BYTES: usize = 8;
/// digest (16) + give-up ms (6).
const TICKET_BYTES: usize = 22;

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

    fn key(key: &PoolKey) -> AttributeValue {
        AttributeValue::S(key.to_hex())
    }

    /// The record of a stored item, in either format.
    fn current(item: &Item) -> Result<Record, StoreError> {
        match legacy::decode(item)? {
            Some(record) => Ok(record),
            None => decode(item),
        }
    }

    /// Rewrites an item of the old format (read as `record`) in this one,
    /// unless it changed since. Pools stored before per-slot updates keep
    /// their count and leases; only a write needs this, so read-only
    /// functions never upgrade.
    async fn upgrade(&self, key: &PoolKey, record: &Record) -> Result<(), StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(key, record)))
            .condition_expression("#v = :v AND attribute_not_exists(#i)")
            .expression_attribute_names("#v", legacy::VERSION)
            .expression_attribute_names("#i", INCARNATION)
            .expression_attribute_values(":v", number(record.incarnation))
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match put {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(())
            }
            // Upgraded, changed or deleted by someone else meanwhile: the
            // retried update will see.
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(PutItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(store_error(err)),
        }
    }

    /// One conditional `UpdateItem`.
    async fn update_once(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let expr = Expression::of(incarnation, update);
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, Self::key(key))
            .update_expression(expr.update)
            .condition_expression(expr.condition)
            // DynamoDB refuses an empty map of names.
            .set_expression_attribute_names((!expr.names.is_empty()).then_some(expr.names))
            .set_expression_attribute_values(Some(expr.values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record(out.consumed_capacity());
                let item = out.attributes().ok_or_else(|| {
                    StoreError::new(StoreErrorKind::Unavailable, "update returned no item")
                })?;
                Ok(Updated::Written(decode(item)?))
            }
            Err(err) => match err.as_service_error() {
                // A failed condition is still a billed write.
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item() {
                        Some(item) => Ok(Updated::Lost(Self::current(item)?)),
                        None => Ok(Updated::Gone),
                    }
                }
                _ => Err(store_error(err)),
            },
        }
    }
}

#[async_trait]
impl PoolStore for DynamoDbStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, Self::key(key))
            // A borrower must see the latest return, or it would wait for nothing.
            .consistent_read(true)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await
            .map_err(store_error)?;
        self.record(out.consumed_capacity());
        out.item().map(Self::current).transpose()
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let sent = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(key, record)))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(Created::Created(record.clone()))
            }
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    let item = failed.item().ok_or_else(|| {
                        StoreError::new(
                            StoreErrorKind::Unavailable,
                            "create failed its condition but returned no item",
                        )
                    })?;
                    let current = Self::current(item)?;
                    Ok(if current.incarnation == record.incarnation {
                        // Our own create, landed on an earlier SDK attempt.
                        Created::Created(current)
                    } else {
                        Created::Exists(current)
                    })
                }
                _ => Err(store_error(err)),
            },
        }
    }

    async fn update(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let outcome = self.update_once(key, incarnation, update).await?;
        match &outcome {
            // Planned from an item of the old format, still as read: bring
            // it to this format, then the update applies as planned.
            Updated::Lost(current) if current.incarnation == incarnation => {
                self.upgrade(key, current).await?;
                self.update_once(key, incarnation, update).await
            }
            _ => Ok(outcome),
        }
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(PK, Self::key(key))
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

/// One update as DynamoDB expressions. Top-level attribute names are single
/// letters, none of them reserved words; map keys and list indices that come
/// from data go through placeholders.
struct Expression {
    condition: String,
    update: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expression {
    fn of(incarnation: u64, update: &Update) -> Self {
        let mut e = ExpressionBuilder::default();
        let inc = e.value(number(incarnation));
        let mut conditions = vec![format!("{INCARNATION} = {inc}")];
        for expect in &update.expect {
            conditions.push(match *expect {
                Expect::Count(count) => format!("{COUNT} = {}", e.value(number(count))),
                Expect::StoredBelow(limit) => format!("{STORED} < {}", e.value(number(limit))),
                Expect::SlotFree(position) => {
                    format!("attribute_not_exists({})", e.slot(position))
                }
                Expect::SlotHeldBy { position, fence } => {
                    format!("{} = {}", e.slot(position), e.value(number(fence)))
                }
                Expect::LeaseAbsent(digest) => {
                    format!("attribute_not_exists({})", e.holder(digest))
                }
                Expect::QueueLen(len) => format!("size({QUEUE}) = {}", e.value(number(len))),
                Expect::QueueShorterThan(len) => {
                    format!("size({QUEUE}) < {}", e.value(number(len)))
                }
                Expect::TicketAt { index, ticket } => {
                    format!("{QUEUE}[{index}] = {}", e.value(ticket_value(&ticket)))
                }
            });
        }

        let granted = update.changes.iter().find_map(|c| match *c {
            Change::Grant {
                position, digest, ..
            } => Some((position, digest)),
            _ => None,
        });
        let mut sets = Vec::new();
        // Paths removed; a grant's own slot and digest are overwritten instead
        // (DynamoDB refuses to SET and REMOVE one path in one update).
        let mut removes = BTreeSet::new();
        let mut stored_delta: i64 = 0;
        for change in &update.changes {
            match *change {
                Change::Grant {
                    position,
                    digest,
                    expires_at_ms,
                } => {
                    let one = e.value(number(1));
                    sets.push(format!("{FENCE} = {FENCE} + {one}"));
                    sets.push(format!("{} = {FENCE} + {one}", e.slot(position)));
                    let holder = e.value(AttributeValue::B(Blob::new(holder_bytes(
                        position,
                        expires_at_ms,
                    ))));
                    sets.push(format!("{} = {holder}", e.holder(digest)));
                    stored_delta += 1;
                }
                Change::RemoveLease { position, digest } => {
                    if granted.map(|(p, _)| p) != Some(position) {
                        removes.insert(e.slot(position));
                    }
                    if granted.map(|(_, d)| d) != Some(digest) {
                        removes.insert(e.holder(digest));
                    }
                    stored_delta -= 1;
                }
                Change::RemoveTicket(index) => {
                    removes.insert(format!("{QUEUE}[{index}]"));
                }
                Change::AppendTicket(ticket) => {
                    let list = e.value(AttributeValue::L(vec![ticket_value(&ticket)]));
                    sets.push(format!("{QUEUE} = list_append({QUEUE}, {list})"));
                }
                Change::SetCount(count) => {
                    sets.push(format!("{COUNT} = {}", e.value(number(count))));
                }
            }
        }
        if stored_delta != 0 {
            let delta = e.value(AttributeValue::N(stored_delta.to_string()));
            sets.push(format!("{STORED} = {STORED} + {delta}"));
        }
        let mut clauses = Vec::new();
        if !sets.is_empty() {
            clauses.push(format!("SET {}", sets.join(", ")));
        }
        if !removes.is_empty() {
            let removes: Vec<String> = removes.into_iter().collect();
            clauses.push(format!("REMOVE {}", removes.join(", ")));
        }
        if clauses.is_empty() {
            // Nothing to change: still a conditional write, so that it checks.
            clauses.push(format!("SET {INCARNATION} = {inc}"));
        }
        Expression {
            condition: conditions.join(" AND "),
            update: clauses.join(" "),
            names: e.names,
            values: e.values,
        }
    }
}

#[derive(Default)]
struct ExpressionBuilder {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl ExpressionBuilder {
    fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    fn name(&mut self, prefix: &str, raw: String) -> String {
        let placeholder = format!("#{prefix}{raw}");
        let placeholder = if prefix == "d" {
            // Digest keys may hold '-': placeholders allow only [A-Za-z0-9_].
            format!("#d{}", self.names.len())
        } else {
            placeholder
        };
        if let Some((existing, _)) = self.names.iter().find(|(_, v)| **v == raw) {
            return existing.clone();
        }
        self.names.insert(placeholder.clone(), raw);
        placeholder
    }

    fn slot(&mut self, position: u16) -> String {
        format!("{SLOTS}.{}", self.name("p", position.to_string()))
    }

    fn holder(&mut self, digest: LeaseDigest) -> String {
        format!("{HOLDERS}.{}", self.name("d", digest_key(&digest)))
    }
}

/// Creates the table if it does not exist and checks its key schema, failing
/// early and clearly when it is keyed differently. For local runs and tests;
/// deployed functions rely on the SAM template.
pub async fn ensure_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        StoreError::new(StoreErrorKind::Unavailable, e.to_string())
    };
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(PK)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(invalid)?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(invalid)?,
        )
        .send()
        .await;
    if let Err(err) = created {
        if !matches!(
            err.as_service_error(),
            Some(CreateTableError::ResourceInUseException(_))
        ) {
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
        ) && desc
            .attribute_definitions()
            .iter()
            .any(|a| a.attribute_name() == PK && a.attribute_type() == &ScalarAttributeType::S);
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
    let kind = match (&err, err.code()) {
        (SdkError::TimeoutError(_), _) => StoreErrorKind::TimedOut,
        (
            _,
            Some(
                "ProvisionedThroughputExceededException"
                | "RequestLimitExceeded"
                | "ThrottlingException",
            ),
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

fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn digest_key(digest: &LeaseDigest) -> String {
    URL_SAFE_NO_PAD.encode(digest.0)
}

fn holder_bytes(position: u16, expires_at_ms: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HOLDER_BYTES);
    out.extend_from_slice(&position.to_be_bytes());
    out.extend_from_slice(&expires_at_ms.to_be_bytes()[2..]);
    out
}

fn ticket_value(ticket: &Ticket) -> AttributeValue {
    let mut out = Vec::with_capacity(TICKET_BYTES);
    out.extend_from_slice(&ticket.digest.0);
    out.extend_from_slice(&ticket.give_up_ms.to_be_bytes()[2..]);
    AttributeValue::B(Blob::new(out))
}

/// Six big-endian bytes as milliseconds.
fn ms48(bytes: &[u8]) -> u64 {
    let mut full = [0u8; 8];
    full[2..].copy_from_slice(bytes);
    u64::from_be_bytes(full)
}

fn encode(key: &PoolKey, record: &Record) -> Item {
    let pool = &record.pool;
    let slots = pool
        .leases()
        .iter()
        .map(|l| (l.position.to_string(), number(l.fence)))
        .collect();
    let holders = pool
        .leases()
        .iter()
        .map(|l| {
            (
                digest_key(&l.digest),
                AttributeValue::B(Blob::new(holder_bytes(l.position, l.expires_at_ms))),
            )
        })
        .collect();
    let queue = pool.queue().iter().map(ticket_value).collect();
    HashMap::from([
        (PK.to_string(), AttributeValue::S(key.to_hex())),
        (INCARNATION.to_string(), number(record.incarnation)),
        (COUNT.to_string(), number(pool.count())),
        (STORED.to_string(), number(pool.leases().len())),
        (FENCE.to_string(), number(pool.fence())),
        (SLOTS.to_string(), AttributeValue::M(slots)),
        (HOLDERS.to_string(), AttributeValue::M(holders)),
        (QUEUE.to_string(), AttributeValue::L(queue)),
    ])
}

fn decode(item: &Item) -> Result<Record, StoreError> {
    let corrupt =
        |what: &str| StoreError::new(StoreErrorKind::Corrupt, format!("pool item: {what}"));
    let number = |value: Option<&AttributeValue>, what: &str| -> Result<u64, StoreError> {
        match value {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| corrupt(what)),
            _ => Err(corrupt(what)),
        }
    };
    let incarnation = number(item.get(INCARNATION), INCARNATION)?;
    let count = u16::try_from(number(item.get(COUNT), COUNT)?)
        .ok()
        .filter(|c| *c <= MAX_COUNT)
        .ok_or_else(|| corrupt(COUNT))?;
    let stored = number(item.get(STORED), STORED)?;
    let fence = number(item.get(FENCE), FENCE)?;
    let (Some(AttributeValue::M(slots)), Some(AttributeValue::M(holders))) =
        (item.get(SLOTS), item.get(HOLDERS))
    else {
        return Err(corrupt("slots or holders"));
    };
    let Some(AttributeValue::L(queue)) = item.get(QUEUE) else {
        return Err(corrupt(QUEUE));
    };
    if slots.len() != holders.len() || holders.len() as u64 != stored {
        return Err(corrupt("slots, holders and the lease count disagree"));
    }
    let mut leases = Vec::with_capacity(holders.len());
    for (key, value) in holders {
        let digest = URL_SAFE_NO_PAD
            .decode(key)
            .ok()
            .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
            .ok_or_else(|| corrupt("holder key"))?;
        let AttributeValue::B(blob) = value else {
            return Err(corrupt("holder"));
        };
        let bytes = blob.as_ref();
        if bytes.len() != HOLDER_BYTES {
            return Err(corrupt("holder"));
        }
        let position = u16::from_be_bytes([bytes[0], bytes[1]]);
        let fence = number(slots.get(&position.to_string()), "slot of a holder")?;
        leases.push(Lease {
            digest: LeaseDigest(digest),
            position,
            expires_at_ms: ms48(&bytes[2..]),
            fence,
        });
    }
    let queue = queue
        .iter()
        .map(|value| match value {
            AttributeValue::B(blob) if blob.as_ref().len() == TICKET_BYTES => {
                let bytes = blob.as_ref();
                let digest = <[u8; 16]>::try_from(&bytes[..16]).ok()?;
                Some(Ticket {
                    digest: LeaseDigest(digest),
                    give_up_ms: ms48(&bytes[16..]),
                })
            }
            _ => None,
        })
        .collect::<Option<Vec<Ticket>>>()
        .ok_or_else(|| corrupt("ticket"))?;
    let pool = Pool::from_parts(count, fence, leases, queue).map_err(|e| corrupt(e.0))?;
    Ok(Record { incarnation, pool })
}

/// The item format before per-slot updates: `v` (version token), `c`
/// (count), `l` (leases packed 24 bytes each: position 2, expiry ms 6,
/// digest 16). Read only, to upgrade such items in place.
mod legacy {
    use super::*;

    pub(super) const VERSION: &str = "v";
    const LEASES: &str = "l";
    const LEASE_BYTES: usize = 24;

    /// `None` for an item of the current format; else the pool it holds, as
    /// the record its upgrade writes: the version token as incarnation (so a
    /// plan made from this read still applies after the upgrade), fences
    /// 1…n in position order (the old format issued none, and a pool
    /// registered after a delete starts far above).
    pub(super) fn decode(item: &Item) -> Result<Option<Record>, StoreError> {
        if item.contains_key(INCARNATION) {
            return Ok(None);
        }
        let Some(AttributeValue::N(version)) = item.get(VERSION) else {
            return Ok(None);
        };
        let corrupt =
            |what: &str| StoreError::new(StoreErrorKind::Corrupt, format!("old pool item: {what}"));
        let version: u64 = version.parse().map_err(|_| corrupt(VERSION))?;
        let count = match item.get(COUNT) {
            Some(AttributeValue::N(n)) => n.parse::<u16>().ok().filter(|c| *c <= MAX_COUNT),
            _ => None,
        }
        .ok_or_else(|| corrupt(COUNT))?;
        let packed: &[u8] = match item.get(LEASES) {
            None => &[],
            Some(AttributeValue::B(blob)) => blob.as_ref(),
            Some(_) => return Err(corrupt(LEASES)),
        };
        if !packed.len().is_multiple_of(LEASE_BYTES) {
            return Err(corrupt(LEASES));
        }
        let mut leases = Vec::new();
        for chunk in packed.chunks_exact(LEASE_BYTES) {
            let digest = <[u8; 16]>::try_from(&chunk[8..]).map_err(|_| corrupt(LEASES))?;
            leases.push(Lease {
                digest: LeaseDigest(digest),
                position: u16::from_be_bytes([chunk[0], chunk[1]]),
                expires_at_ms: ms48(&chunk[2..8]),
                fence: 0,
            });
        }
        leases.sort_by_key(|l| l.position);
        for (k, lease) in leases.iter_mut().enumerate() {
            lease.fence = k as u64 + 1;
        }
        let fence = leases.len() as u64;
        let pool = Pool::from_parts(count, fence, leases, Vec::new()).map_err(|e| corrupt(e.0))?;
        Ok(Some(Record {
            incarnation: version,
            pool,
        }))
    }

    /// An item as the old format wrote it (tests).
    #[cfg(test)]
    pub(super) fn encode(key: &PoolKey, count: u16, leases: &[Lease], version: u64) -> Item {
        let mut packed = Vec::new();
        for lease in leases {
            packed.extend_from_slice(&lease.position.to_be_bytes());
            packed.extend_from_slice(&lease.expires_at_ms.to_be_bytes()[2..]);
            packed.extend_from_slice(&lease.digest.0);
        }
        HashMap::from([
            (PK.to_string(), AttributeValue::S(key.to_hex())),
            (VERSION.to_string(), number(version)),
            (COUNT.to_string(), number(count)),
            (LEASES.to_string(), AttributeValue::B(Blob::new(packed))),
        ])
    }
}

/// Bytes DynamoDB bills for an item, by its item-size rules: attribute names
/// plus values; a number is about one byte per two digits plus one; a map or
/// list is 3 bytes plus, per element, its key, its value and one byte.
pub fn item_size(key: &PoolKey, record: &Record) -> usize {
    fn value_size(value: &AttributeValue) -> usize {
        match value {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::M(m) => {
                3 + m
                    .iter()
                    .map(|(k, v)| k.len() + value_size(v) + 1)
                    .sum::<usize>()
            }
            AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
            _ => 1,
        }
    }
    encode(key, record)
        .iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::BorrowPlan;

    const NOW: u64 = 1_900_000_000_000;

    fn digest(n: u16) -> LeaseDigest {
        let mut d = [0xab; 16];
        d[..2].copy_from_slice(&n.to_be_bytes());
        LeaseDigest(d)
    }

    /// A pool of `count` with every slot held and `waiting` tickets queued.
    fn full_pool(count: u16, waiting: u16) -> Record {
        let mut pool = Pool::new(count, NOW);
        for n in 0..count {
            let BorrowPlan::Take { update, .. } =
                pool.plan_borrow(digest(n), NOW + 3_600_000, NOW, None)
            else {
                panic!("slot {n}")
            };
            pool = pool.apply(&update).unwrap();
        }
        for n in 0..waiting {
            let ticket = Ticket {
                digest: digest(1000 + n),
                give_up_ms: NOW + 25_000,
            };
            let crate::domain::JoinPlan::Join(update) = pool.plan_join(ticket, 1000, NOW) else {
                panic!()
            };
            pool = pool.apply(&update).unwrap();
        }
        Record {
            incarnation: u64::MAX,
            pool,
        }
    }

    #[test]
    fn items_round_trip() {
        let key = PoolKey([7; 32]);
        for (count, waiting) in [(0, 0), (1, 3), (4, 0), (1000, 10)] {
            let record = full_pool(count, waiting);
            assert_eq!(decode(&encode(&key, &record)).unwrap(), record);
        }
    }

    #[test]
    fn items_stay_within_one_write_unit_at_count_16() {
        let key = PoolKey([7; 32]);
        let size16 = item_size(&key, &full_pool(16, 0));
        assert!(size16 <= 1024, "count 16 fully held is {size16} bytes");
        let size4 = item_size(&key, &full_pool(4, 28));
        assert!(size4 <= 1024, "count 4 with 28 waiting is {size4} bytes");
        assert!(item_size(&key, &full_pool(1000, 1000)) < 400 * 1024);
    }

    #[test]
    fn corrupt_items_are_errors_not_panics() {
        let key = PoolKey([7; 32]);
        let good = encode(&key, &full_pool(2, 1));
        let broken: Vec<(&str, AttributeValue)> = vec![
            (
                QUEUE,
                AttributeValue::L(vec![AttributeValue::B(Blob::new(vec![1, 2, 3]))]),
            ),
            (COUNT, number(1001)),
            (STORED, number(3)),
            (FENCE, number(1)),
            (SLOTS, AttributeValue::M(HashMap::new())),
            (HOLDERS, AttributeValue::S("x".into())),
            (INCARNATION, AttributeValue::S("x".into())),
        ];
        for (name, value) in broken {
            let mut item = good.clone();
            item.insert(name.into(), value);
            assert_eq!(
                decode(&item).unwrap_err().kind,
                StoreErrorKind::Corrupt,
                "{name}"
            );
        }
        let mut item = good;
        item.remove(INCARNATION);
        assert_eq!(decode(&item).unwrap_err().kind, StoreErrorKind::Corrupt);
    }

    #[test]
    fn items_of_the_old_format_are_read_with_their_leases() {
        let key = PoolKey([7; 32]);
        let leases = full_pool(3, 0).pool.leases().to_vec();
        let old = legacy::encode(&key, 3, &leases, 42);
        let record = legacy::decode(&old).unwrap().expect("an old item");
        assert_eq!(record.incarnation, 42, "the version is the incarnation");
        assert_eq!(record.pool.count(), 3);
        let kept: Vec<(LeaseDigest, u16, u64)> = record
            .pool
            .leases()
            .iter()
            .map(|l| (l.digest, l.position, l.expires_at_ms))
            .collect();
        let before: Vec<(LeaseDigest, u16, u64)> = leases
            .iter()
            .map(|l| (l.digest, l.position, l.expires_at_ms))
            .collect();
        assert_eq!(kept, before);
        let fences: Vec<u64> = record.pool.leases().iter().map(|l| l.fence).collect();
        assert_eq!(fences, [1, 2, 3]);
        assert_eq!(
            legacy::decode(&old).unwrap(),
            Some(record.clone()),
            "deterministic"
        );
        assert_eq!(legacy::decode(&encode(&key, &record)).unwrap(), None);
    }

    #[test]
    fn expressions_name_only_what_they_touch() {
        let pool = full_pool(2, 0).pool;
        let (_, update) = pool.plan_return(digest(1), NOW).unwrap();
        let e = Expression::of(7, &update);
        assert_eq!(e.condition, "i = :v0 AND s.#p1 = :v1");
        assert_eq!(e.update, "SET n = n + :v2 REMOVE h.#d1, s.#p1");
        // A grant that reuses an expired slot overwrites it instead of removing it.
        let later = NOW + 3_600_000;
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(digest(9), later + 10, later, None)
        else {
            panic!()
        };
        let e = Expression::of(7, &update);
        assert!(e.update.starts_with("SET f = f + "), "{}", e.update);
        assert!(!e.update.contains("REMOVE s.#p0"), "{}", e.update);
        assert!(e.condition.contains("size(q) = "), "{}", e.condition);
    }
}
