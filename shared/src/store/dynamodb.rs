//! DynamoDB: one item per pool, changed by conditional `UpdateItem`s that
//! name only the slots, tickets and counters they depend on. The attributes
//! and every write's expressions are in `docs/DESIGN.md`; in short:
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | B | first 16 bytes of SHA-256 of the pool UUID (partition key) |
//! | `sk` | B | `00`: the pool item (sort key) |
//! | `i`  | N | incarnation: random per creation; every update is conditioned on it |
//! | `c`  | N | resizes × 10⁴ + count: a count condition names one resize |
//! | `b`  | N | creation time in µs: fences are `b` + a grant's relative fence |
//! | `f`  | N | the next grant's relative fence × 10¹³ |
//! | `s`  | L | slots by position: `0` (free) or the holder (B: digest 8 ‖ ttl ms) |
//! | `g`  | L | per position: relative fence × 10¹³ + grant ms (+ 5·10¹² when handed to a waiter; `0` when freed) |
//! | `q`  | L | waiting tickets in arrival order: the holder (B), as in `s` |
//! | `w`  | L | per ticket: its give-up time in Unix seconds |
//! | `x`  | M | lease ids given up before their borrow was seen: digest → until (s) |
//! | `r0`…`r15` | B | short grants handed to a waiter, expired and reused: a ring, grant in `r{fence % 16}`: digest ‖ position ‖ grant ms ‖ fence |
//! | `n`  | N | async mode: the next ticket number (absent until a first ticket) |
//! | `a`  | N | async mode: the first ticket number not yet admitted to `q` (`a = n`: no backlog) |
//! | `y`  | M | async mode: async tickets in `q`, or granted and not yet delivered: digest → ticket number |
//! | `z`  | N | async mode: `1` while the pool has async work (the stream's filter); removed once settled |
//! | `wk` | N | async mode, AWS only: the dispatcher's pending wake of the pool (Unix ms), so that one is pending at a time (functions/dispatcher) |
//!
//! A hand-off is `SET s[P] = if_not_exists(q[0], :free), g[P] = f + :now,
//! f = f + :step REMOVE q[0], w[0]`: every right-hand side reads the item as
//! it was before the update, so DynamoDB picks the head of the queue and the
//! fence atomically, and two returns landing together serve two tickets.
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
    LocalSecondaryIndex, Projection, ProjectionType, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, StreamSpecification, StreamViewType,
    TableStatus,
};
use aws_sdk_dynamodb::Client;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::{Created, PoolStore, Record, StoreError, StoreErrorKind, Updated};
use crate::domain::{
    Change, Ended, Expect, Holder, LeaseDigest, Line, Pool, Sizing, Slot, Stamp, Ticket, Tomb,
    Update, ENDED_RING, MAX_COUNT,
};
use crate::keys::PoolKey;

/// The partition key: the pool's key, 16 bytes.
pub const PK: &str = "pk";
/// The sort key: [`POOL_ITEM`] for the pool item.
pub const SK: &str = "sk";
/// The pool item's sort key.
pub const POOL_ITEM: [u8; 1] = [0];

const INCARNATION: &str = "i";
const COUNT: &str = "c";
const BASE: &str = "b";
const FENCE: &str = "f";
const SLOTS: &str = "s";
const STAMPS: &str = "g";
const QUEUE: &str = "q";
const GIVE_UP: &str = "w";
const TOMBS: &str = "x";
/// The ring of reused short grants: one attribute per place, `r0`, `r1`, …
const ENDED: &str = "r";
/// The map of ended grants by lease id that an older version kept (without
/// bound): dropped by the next write that reuses a slot, returns or resizes.
const LEGACY_ENDED: &str = "e";
const NEXT_TICKET: &str = "n";
const ADMITTED: &str = "a";
const ASYNCS: &str = "y";
/// The async-work flag (see [`dispatches`]).
pub const ACTIVE: &str = "z";

/// Milliseconds fit in 13 decimal digits until the year 2286: a stamp is
/// the relative fence in the digits above them.
const STAMP_SCALE: u128 = 10_000_000_000_000;
/// Added to the grant ms of a slot handed to a waiter (year 2128 in ms:
/// below it, every grant ms is a real time).
const HANDED: u64 = 5_000_000_000_000;

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

    /// Asks DynamoDB for consumed capacity on every call and adds it up
    /// (for the benchmark: the functions never ask).
    #[cfg(any(test, feature = "measure"))]
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
}

/// The primary key of a pool's item.
pub fn pool_key(key: &PoolKey) -> Item {
    HashMap::from([
        (PK.to_string(), AttributeValue::B(Blob::new(key.0.to_vec()))),
        (
            SK.to_string(),
            AttributeValue::B(Blob::new(POOL_ITEM.to_vec())),
        ),
    ])
}

/// A conditional write's outcome, as DynamoDB hands the item back.
enum Written {
    /// It landed: the item as it is now (`ALL_NEW`).
    Now(Item),
    /// Its condition failed (still a billed write): the item as it is
    /// (`ALL_OLD`), or `None` when there is none.
    Lost(Option<Item>),
}

impl DynamoDbStore {
    /// A strongly consistent `GetItem`: a waiter must see the latest
    /// hand-off, a dispatcher the latest state, or they act on old news.
    async fn get(&self, key: Item) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await
            .map_err(store_error)?;
        self.record(out.consumed_capacity());
        Ok(out.item().cloned())
    }

    /// A `PutItem` unless an item with its key exists: `None` when it was
    /// written, else the item that is there.
    async fn put_new(&self, item: Item) -> Result<Option<Item>, StoreError> {
        let sent = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(format!("attribute_not_exists({PK})"))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(None)
            }
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    failed.item().cloned().map(Some).ok_or_else(|| {
                        StoreError::new(
                            StoreErrorKind::Unavailable,
                            "a put failed its condition but returned no item",
                        )
                    })
                }
                _ => Err(store_error(err)),
            },
        }
    }

    /// One conditional `UpdateItem`, never retried here: the item comes
    /// back either way, so the caller decides again without a read.
    async fn update_item(&self, key: Item, call: Expression) -> Result<Written, StoreError> {
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .update_expression(call.update)
            .condition_expression(call.condition)
            // DynamoDB refuses an empty map of names.
            .set_expression_attribute_names((!call.names.is_empty()).then_some(call.names))
            .set_expression_attribute_values(Some(call.values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record(out.consumed_capacity());
                out.attributes().cloned().map(Written::Now).ok_or_else(|| {
                    StoreError::new(StoreErrorKind::Unavailable, "update returned no item")
                })
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    Ok(Written::Lost(failed.item().cloned()))
                }
                _ => Err(store_error(err)),
            },
        }
    }
}

#[async_trait]
impl PoolStore for DynamoDbStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.get(pool_key(key))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let Some(item) = self.put_new(encode(key, record)).await? else {
            return Ok(Created::Created(record.clone()));
        };
        let current = decode(&item)?;
        Ok(if current.incarnation == record.incarnation {
            // Our own create, landed on an earlier SDK attempt.
            Created::Created(current)
        } else {
            Created::Exists(current)
        })
    }

    /// One conditional `UpdateItem`: a lost condition is one billed write,
    /// answered with the item as it is (`ALL_OLD`), never retried here.
    async fn update(
        &self,
        key: &PoolKey,
        incarnation: u64,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let expr = Expression::of(incarnation, update);
        Ok(match self.update_item(pool_key(key), expr).await? {
            Written::Now(item) => Updated::Written(decode(&item)?),
            Written::Lost(Some(item)) => Updated::Lost(decode(&item)?),
            Written::Lost(None) => Updated::Gone,
        })
    }

    /// One `UpdateItem`, conditioned only on the pool existing.
    async fn number_ticket(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        let mut expr = Expression::of(0, &Pool::plan_number());
        expr.condition = format!("attribute_exists({INCARNATION})");
        expr.values
            .retain(|placeholder, _| expr.update.contains(placeholder.as_str()));
        Ok(match self.update_item(pool_key(key), expr).await? {
            Written::Now(item) => Some(decode(&item)?),
            Written::Lost(_) => None,
        })
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(pool_key(key)))
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

/// One update as DynamoDB expressions (for a pool item, made by [`Expression::of`]). Top-level attribute names are single
/// letters, none of them reserved words; tombstone keys come from data and
/// go through placeholders; list indices are numbers the planner chose.
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
                Expect::Count(sizing) => format!("{COUNT} = {}", e.value(sizing_value(sizing))),
                Expect::SlotsLen(len) => format!("size({SLOTS}) = {}", e.value(number(len))),
                Expect::SlotFree(position) => format!("{SLOTS}[{position}] = {}", e.zero()),
                Expect::SlotStamp { position, stamp } => {
                    format!("{STAMPS}[{position}] = {}", e.value(stamp_value(stamp)))
                }
                Expect::QueueLen(len) => format!("size({QUEUE}) = {}", e.value(number(len))),
                Expect::QueueBelow(len) => format!("size({QUEUE}) < {}", e.value(number(len))),
                Expect::TicketAt { index, holder } => {
                    format!("{QUEUE}[{index}] = {}", e.holder(holder))
                }
                Expect::NotQueued(holder) => format!("NOT contains({QUEUE}, {})", e.holder(holder)),
                Expect::NotHeld(holder) => format!("NOT contains({SLOTS}, {})", e.holder(holder)),
                Expect::NoTomb(digest) => format!("attribute_not_exists({})", e.tomb(digest)),
                Expect::TombIs(tomb) => {
                    format!(
                        "{} = {}",
                        e.tomb(tomb.digest),
                        e.value(number(tomb.until_s))
                    )
                }
                Expect::EndedIs(ended) => {
                    format!("{ENDED}{} = {}", ended.place(), e.value(ended_value(ended)))
                }
                Expect::TombsAtMost(n) => format!("size({TOMBS}) <= {}", e.value(number(n))),
                // Items from before async mode have no counters.
                Expect::NoBacklog => {
                    format!("(attribute_not_exists({NEXT_TICKET}) OR {ADMITTED} = {NEXT_TICKET})")
                }
                Expect::Admitted(admitted) => {
                    format!("{ADMITTED} = {}", e.value(number(admitted)))
                }
                Expect::AsyncIs(digest, n) => {
                    format!("{} = {}", e.asynced(digest), e.value(number(n)))
                }
                Expect::Settled => format!(
                    "{ADMITTED} = {NEXT_TICKET} AND size({ASYNCS}) = {}",
                    e.zero()
                ),
            });
        }

        let mut sets = Vec::new();
        let mut removes = BTreeSet::new();
        let mut fences: u128 = 0;
        // Appended tickets, in order: one list_append per list.
        let (mut appended, mut give_ups) = (Vec::new(), Vec::new());
        for change in &update.changes {
            match *change {
                Change::Take {
                    position,
                    holder,
                    now_ms,
                } => {
                    sets.push(format!("{SLOTS}[{position}] = {}", e.holder(holder)));
                    sets.push(format!(
                        "{STAMPS}[{position}] = {FENCE} + {}",
                        e.value(number(now_ms))
                    ));
                    fences += 1;
                }
                Change::HandOff {
                    position,
                    from,
                    nth,
                    now_ms,
                } => {
                    let zero = e.zero();
                    sets.push(format!(
                        "{SLOTS}[{position}] = if_not_exists({QUEUE}[{from}], {zero})"
                    ));
                    // The write's `nth` fence: the counter plus `nth`.
                    let stamp =
                        u128::from(now_ms.saturating_add(HANDED)) + u128::from(nth) * STAMP_SCALE;
                    let handed = e.value(AttributeValue::N(stamp.to_string()));
                    sets.push(format!("{STAMPS}[{position}] = {FENCE} + {handed}"));
                    fences += 1;
                    for index in 0..=from {
                        removes.insert(format!("{QUEUE}[{index}]"));
                        removes.insert(format!("{GIVE_UP}[{index}]"));
                    }
                }
                Change::Free(position) => {
                    let zero = e.zero();
                    sets.push(format!("{SLOTS}[{position}] = {zero}"));
                    sets.push(format!("{STAMPS}[{position}] = {zero}"));
                }
                Change::Append(ticket) => {
                    appended.push(holder_value(ticket.holder));
                    give_ups.push(number(ticket.give_up_s));
                }
                Change::RemoveTicket(index) => {
                    removes.insert(format!("{QUEUE}[{index}]"));
                    removes.insert(format!("{GIVE_UP}[{index}]"));
                }
                Change::SetTomb(tomb) => {
                    sets.push(format!(
                        "{} = {}",
                        e.tomb(tomb.digest),
                        e.value(number(tomb.until_s))
                    ));
                }
                Change::RemoveTomb(digest) => {
                    removes.insert(e.tomb(digest));
                }
                Change::SetEnded(ended) => {
                    sets.push(format!(
                        "{ENDED}{} = {}",
                        ended.place(),
                        e.value(ended_value(ended))
                    ));
                }
                Change::RemoveEnded(place) => {
                    removes.insert(format!("{ENDED}{place}"));
                }
                Change::DropLegacyEnded => {
                    removes.insert(LEGACY_ENDED.to_string());
                }
                Change::SetCount(sizing) => {
                    sets.push(format!("{COUNT} = {}", e.value(sizing_value(sizing))));
                }
                Change::Extend(n) => {
                    let zeros = e.value(AttributeValue::L(vec![number(0); n]));
                    sets.push(format!("{SLOTS} = list_append({SLOTS}, {zeros})"));
                    sets.push(format!("{STAMPS} = list_append({STAMPS}, {zeros})"));
                }
                Change::Truncate { from, len } => {
                    for position in from..len {
                        removes.insert(format!("{SLOTS}[{position}]"));
                        removes.insert(format!("{STAMPS}[{position}]"));
                    }
                }
                Change::NumberTicket => {
                    let (zero, one) = (e.zero(), e.value(number(1)));
                    let empty = e.value(AttributeValue::M(HashMap::new()));
                    sets.push(format!(
                        "{NEXT_TICKET} = if_not_exists({NEXT_TICKET}, {zero}) + {one}"
                    ));
                    sets.push(format!("{ADMITTED} = if_not_exists({ADMITTED}, {zero})"));
                    // Admission lists async tickets in it.
                    sets.push(format!("{ASYNCS} = if_not_exists({ASYNCS}, {empty})"));
                    sets.push(format!("{ACTIVE} = {one}"));
                }
                Change::SetAdmitted(admitted) => {
                    sets.push(format!("{ADMITTED} = {}", e.value(number(admitted))));
                }
                Change::SetAsync(digest, n) => {
                    sets.push(format!("{} = {}", e.asynced(digest), e.value(number(n))));
                }
                Change::RemoveAsync(digest) => {
                    removes.insert(e.asynced(digest));
                }
                Change::Settle => {
                    removes.insert(ACTIVE.to_string());
                }
            }
        }
        if !appended.is_empty() {
            let q = e.value(AttributeValue::L(appended));
            let w = e.value(AttributeValue::L(give_ups));
            sets.push(format!("{QUEUE} = list_append({QUEUE}, {q})"));
            sets.push(format!("{GIVE_UP} = list_append({GIVE_UP}, {w})"));
        }
        if fences > 0 {
            sets.push(format!(
                "{FENCE} = {FENCE} + {}",
                e.value(AttributeValue::N((fences * STAMP_SCALE).to_string()))
            ));
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
    zero: Option<String>,
}

impl ExpressionBuilder {
    fn value(&mut self, value: AttributeValue) -> String {
        if let Some((existing, _)) = self.values.iter().find(|(_, v)| **v == value) {
            return existing.clone();
        }
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    fn zero(&mut self) -> String {
        match &self.zero {
            Some(zero) => zero.clone(),
            None => {
                let zero = self.value(number(0));
                self.zero = Some(zero.clone());
                zero
            }
        }
    }

    fn holder(&mut self, holder: Holder) -> String {
        self.value(holder_value(holder))
    }

    /// `x.#tN` for a tombstone key (digest keys may hold '-', which
    /// placeholders must not).
    fn tomb(&mut self, digest: LeaseDigest) -> String {
        format!("{TOMBS}.{}", self.digest(digest))
    }

    /// `y.#tN` for an async ticket's key.
    fn asynced(&mut self, digest: LeaseDigest) -> String {
        format!("{ASYNCS}.{}", self.digest(digest))
    }

    fn digest(&mut self, digest: LeaseDigest) -> String {
        let raw = digest_key(&digest);
        if let Some((existing, _)) = self.names.iter().find(|(_, v)| **v == raw) {
            return existing.clone();
        }
        let placeholder = format!("#t{}", self.names.len());
        self.names.insert(placeholder.clone(), raw);
        placeholder
    }
}

/// Creates the table if it does not exist and checks its key schema, failing
/// early and clearly when it is keyed differently. For local runs and tests;
/// deployed functions rely on the SAM template.
pub async fn ensure_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        StoreError::new(StoreErrorKind::Unavailable, e.to_string())
    };
    let attribute = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(invalid)
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(invalid)
    };
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(PK, ScalarAttributeType::B)?)
        .attribute_definitions(attribute(SK, ScalarAttributeType::B)?)
        .attribute_definitions(attribute(NUMBER, ScalarAttributeType::N)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        // Async mode's dispatcher follows it (template.yaml: the same view).
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .map_err(invalid)?,
        )
        // Ticket items in ticket order (async mode); a local index, so that
        // its reads can be strongly consistent. Pool items have no `tn`.
        .local_secondary_indexes(
            LocalSecondaryIndex::builder()
                .index_name(BY_TICKET)
                .key_schema(key(PK, KeyType::Hash)?)
                .key_schema(key(NUMBER, KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
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
            [h, r] if h.attribute_name() == PK && h.key_type() == &KeyType::Hash
                && r.attribute_name() == SK && r.key_type() == &KeyType::Range
        ) && [PK, SK].iter().all(|name| {
            desc.attribute_definitions().iter().any(|a| {
                a.attribute_name() == *name && a.attribute_type() == &ScalarAttributeType::B
            })
        });
        if !keyed_right {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "table {table} must have the binary partition key `{PK}` and binary sort key `{SK}`"
                ),
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

/// The table's stream (async mode's dispatcher follows it in local runs).
pub async fn stream_arn(client: &Client, table: &str) -> Result<String, StoreError> {
    let described = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(store_error)?;
    described
        .table()
        .and_then(|t| t.latest_stream_arn())
        .map(str::to_string)
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("table {table} has no stream (async mode's dispatcher follows it)"),
            )
        })
}

/// Whether a change of the table invokes async mode's dispatcher: a write
/// that leaves a pool item (sort key `00`) with the async-work flag, or a new
/// ticket item (its number). `template.yaml`'s event source filter says the
/// same; sync-only pools never pass it.
pub fn dispatches(sort_key: &[u8], new_image_has: impl Fn(&str) -> bool, inserted: bool) -> bool {
    (sort_key == POOL_ITEM && new_image_has(ACTIVE)) || (inserted && new_image_has(NUMBER))
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

fn holder_value(holder: Holder) -> AttributeValue {
    AttributeValue::B(Blob::new(holder.to_bytes()))
}

/// Counts fit in four digits (≤ 1000).
const COUNT_SCALE: u128 = 10_000;

fn sizing_value(sizing: Sizing) -> AttributeValue {
    AttributeValue::N(
        (u128::from(sizing.resizes) * COUNT_SCALE + u128::from(sizing.count)).to_string(),
    )
}

fn stamp_number(stamp: Stamp) -> u128 {
    let ms = stamp.granted_ms + if stamp.handed { HANDED } else { 0 };
    u128::from(stamp.fence) * STAMP_SCALE + u128::from(ms)
}

fn stamp_value(stamp: Stamp) -> AttributeValue {
    AttributeValue::N(stamp_number(stamp).to_string())
}

/// The stamp of a number that [`stamp_number`] made, or `None`.
fn stamp_of(n: u128) -> Option<Stamp> {
    let ms = (n % STAMP_SCALE) as u64;
    Some(Stamp {
        fence: u64::try_from(n / STAMP_SCALE).ok()?,
        granted_ms: ms % HANDED,
        handed: ms >= HANDED,
    })
}

/// An ended grant (always handed): lease digest (8 bytes) ‖ position (2) ‖
/// grant ms (6) ‖ relative fence (big-endian, as few bytes as it needs).
fn ended_value(ended: Ended) -> AttributeValue {
    let fence = ended.stamp.fence.to_be_bytes();
    let skip = fence.iter().take_while(|b| **b == 0).count().min(7);
    let mut bytes = Vec::with_capacity(24);
    bytes.extend_from_slice(&ended.digest.0);
    bytes.extend_from_slice(&ended.position.to_be_bytes());
    bytes.extend_from_slice(&ended.stamp.granted_ms.to_be_bytes()[2..]);
    bytes.extend_from_slice(&fence[skip..]);
    AttributeValue::B(Blob::new(bytes))
}

/// The ended grant [`ended_value`] stored.
fn ended_of(bytes: &[u8]) -> Option<Ended> {
    if !(17..=24).contains(&bytes.len()) {
        return None;
    }
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&bytes[10..16]);
    let mut fence = [0u8; 8];
    fence[24 - bytes.len()..].copy_from_slice(&bytes[16..]);
    Some(Ended {
        digest: LeaseDigest(bytes[..8].try_into().ok()?),
        position: u16::from_be_bytes([bytes[8], bytes[9]]),
        stamp: Stamp {
            fence: u64::from_be_bytes(fence),
            granted_ms: u64::from_be_bytes(ms),
            handed: true,
        },
    })
}

fn encode(key: &PoolKey, record: &Record) -> Item {
    let pool = &record.pool;
    let (slots, stamps): (Vec<AttributeValue>, Vec<AttributeValue>) = pool
        .slots()
        .iter()
        .map(|slot| match slot {
            Slot::Free => (number(0), number(0)),
            Slot::Held { holder, stamp } => (holder_value(*holder), stamp_value(*stamp)),
        })
        .unzip();
    let mut item = pool_key(key);
    item.extend([
        (INCARNATION.to_string(), number(record.incarnation)),
        (COUNT.to_string(), sizing_value(pool.sizing())),
        (BASE.to_string(), number(pool.base_us())),
        (
            FENCE.to_string(),
            AttributeValue::N((u128::from(pool.next_fence()) * STAMP_SCALE).to_string()),
        ),
        (SLOTS.to_string(), AttributeValue::L(slots)),
        (STAMPS.to_string(), AttributeValue::L(stamps)),
        (
            QUEUE.to_string(),
            AttributeValue::L(
                pool.queue()
                    .iter()
                    .map(|t| holder_value(t.holder))
                    .collect(),
            ),
        ),
        (
            GIVE_UP.to_string(),
            AttributeValue::L(pool.queue().iter().map(|t| number(t.give_up_s)).collect()),
        ),
        (
            TOMBS.to_string(),
            AttributeValue::M(
                pool.tombs()
                    .iter()
                    .map(|t| (digest_key(&t.digest), number(t.until_s)))
                    .collect(),
            ),
        ),
    ]);
    item.extend(
        pool.ended()
            .iter()
            .map(|e| (format!("{ENDED}{}", e.place()), ended_value(*e))),
    );
    let line = pool.line();
    if *line != Line::default() {
        if line.active {
            item.insert(ACTIVE.to_string(), number(1));
        }
        item.extend([
            (NEXT_TICKET.to_string(), number(line.next)),
            (ADMITTED.to_string(), number(line.admitted)),
            (
                ASYNCS.to_string(),
                AttributeValue::M(
                    line.asyncs
                        .iter()
                        .map(|(digest, n)| (digest_key(digest), number(*n)))
                        .collect(),
                ),
            ),
        ]);
    }
    item
}

fn decode(item: &Item) -> Result<Record, StoreError> {
    let corrupt =
        |what: &str| StoreError::new(StoreErrorKind::Corrupt, format!("pool item: {what}"));
    let big = |value: Option<&AttributeValue>, what: &str| -> Result<u128, StoreError> {
        match value {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| corrupt(what)),
            _ => Err(corrupt(what)),
        }
    };
    let small = |value: Option<&AttributeValue>, what: &str| -> Result<u64, StoreError> {
        u64::try_from(big(value, what)?).map_err(|_| corrupt(what))
    };
    let list = |name: &str| match item.get(name) {
        Some(AttributeValue::L(list)) => Ok(list),
        _ => Err(corrupt(name)),
    };
    let map = |name: &str| match item.get(name) {
        Some(AttributeValue::M(map)) => Ok(map),
        _ => Err(corrupt(name)),
    };
    let holder = |value: &AttributeValue, what: &str| match value {
        AttributeValue::B(blob) => Holder::from_bytes(blob.as_ref()).ok_or_else(|| corrupt(what)),
        _ => Err(corrupt(what)),
    };
    let stamp = |value: &AttributeValue| -> Result<Stamp, StoreError> {
        stamp_of(big(Some(value), "stamp")?).ok_or_else(|| corrupt("stamp"))
    };
    let digest = |key: &str, what: &str| {
        URL_SAFE_NO_PAD
            .decode(key)
            .ok()
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .map(LeaseDigest)
            .ok_or_else(|| corrupt(what))
    };

    let incarnation = small(item.get(INCARNATION), INCARNATION)?;
    let sized = big(item.get(COUNT), COUNT)?;
    let sizing = Sizing {
        count: u16::try_from(sized % COUNT_SCALE)
            .ok()
            .filter(|c| *c <= MAX_COUNT)
            .ok_or_else(|| corrupt(COUNT))?,
        resizes: u64::try_from(sized / COUNT_SCALE).map_err(|_| corrupt(COUNT))?,
    };
    let base_us = small(item.get(BASE), BASE)?;
    let fence = big(item.get(FENCE), FENCE)?;
    if fence % STAMP_SCALE != 0 {
        return Err(corrupt(FENCE));
    }
    let next_fence = u64::try_from(fence / STAMP_SCALE).map_err(|_| corrupt(FENCE))?;

    let (slots, stamps) = (list(SLOTS)?, list(STAMPS)?);
    if slots.len() != stamps.len() {
        return Err(corrupt("slots and stamps disagree"));
    }
    let slots = slots
        .iter()
        .zip(stamps)
        .map(|(slot, stamp_value)| match slot {
            AttributeValue::N(n) if n == "0" => Ok(Slot::Free),
            held => Ok(Slot::Held {
                holder: holder(held, "slot")?,
                stamp: stamp(stamp_value)?,
            }),
        })
        .collect::<Result<Vec<Slot>, StoreError>>()?;

    let (queue, give_ups) = (list(QUEUE)?, list(GIVE_UP)?);
    if queue.len() != give_ups.len() {
        return Err(corrupt("tickets and give-up times disagree"));
    }
    let queue = queue
        .iter()
        .zip(give_ups)
        .map(|(ticket, give_up)| {
            Ok(Ticket {
                holder: holder(ticket, "ticket")?,
                give_up_s: small(Some(give_up), "give-up time")?,
            })
        })
        .collect::<Result<Vec<Ticket>, StoreError>>()?;

    let tombs = map(TOMBS)?
        .iter()
        .map(|(key, until)| {
            Ok(Tomb {
                digest: digest(key, "tombstone key")?,
                until_s: small(Some(until), "tombstone")?,
            })
        })
        .collect::<Result<Vec<Tomb>, StoreError>>()?;

    let ended = (0..ENDED_RING)
        .filter_map(|place| {
            let name = format!("{ENDED}{place}");
            item.get(&name).map(|value| match value {
                AttributeValue::B(blob) => ended_of(blob.as_ref())
                    .filter(|e| usize::from(e.place()) == place)
                    .ok_or_else(|| corrupt(&name)),
                _ => Err(corrupt(&name)),
            })
        })
        .collect::<Result<Vec<Ended>, StoreError>>()?;

    // Absent until the pool's first ticket number.
    let line = Line {
        next: item
            .get(NEXT_TICKET)
            .map_or(Ok(0), |v| small(Some(v), NEXT_TICKET))?,
        admitted: item
            .get(ADMITTED)
            .map_or(Ok(0), |v| small(Some(v), ADMITTED))?,
        asyncs: match item.get(ASYNCS) {
            None => Vec::new(),
            Some(_) => map(ASYNCS)?
                .iter()
                .map(|(key, n)| Ok((digest(key, "async ticket key")?, small(Some(n), ASYNCS)?)))
                .collect::<Result<Vec<_>, StoreError>>()?,
        },
        active: item.contains_key(ACTIVE),
    };
    let pool = Pool::from_parts(sizing, base_us, next_fence, slots, queue, tombs, ended)
        .map(|pool| pool.with_legacy_ended(item.contains_key(LEGACY_ENDED)))
        .and_then(|pool| pool.with_line(line))
        .map_err(|e| corrupt(e.0))?;
    Ok(Record { incarnation, pool })
}

/// Bytes DynamoDB bills for an item, by its item-size rules: attribute names
/// plus values; a number is one byte per two significant digits plus one; a
/// map or list is 3 bytes plus, per element, its key, its value and one byte.
/// For tests and the benchmark, which count what DynamoDB bills.
#[cfg(any(test, feature = "measure"))]
pub fn item_size(key: &PoolKey, record: &Record) -> usize {
    stored_size(&encode(key, record))
}

/// [`item_size`] of an item as stored (as `GetItem` returns it).
#[cfg(any(test, feature = "measure"))]
pub fn stored_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

/// One attribute value's size, by DynamoDB's rules.
#[cfg(any(test, feature = "measure"))]
fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => {
            let digits: String = n.chars().filter(char::is_ascii_digit).collect();
            let significant = digits.trim_start_matches('0').trim_end_matches('0');
            significant.len().div_ceil(2) + 1
        }
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

mod tickets;

pub use tickets::{BY_TICKET, NUMBER, TICKET_ITEM};

#[cfg(test)]
mod tests;
