//! DynamoDB: one item per pool, changed by conditional `UpdateItem`s that
//! name only the slots, tickets and counters they depend on. The attributes
//! and every write's expressions are in `docs/DESIGN.md` (the attributes of
//! both item kinds also in [`schema`]); in short:
//!
//! A hand-off is `SET s[P] = if_not_exists(q[0], :free), g[P] = f + :now,
//! f = f + :step REMOVE q[0], w[0]`: every right-hand side reads the item as
//! it was before the update, so DynamoDB picks the head of the queue and the
//! fence atomically, and two returns landing together serve two tickets.
//! A failed condition hands back the current item (`ALL_OLD`), a success the
//! new one (`ALL_NEW`), so the caller never needs a read to decide again.
//!
//! The files: [`schema`] (every key and attribute name), `codec` (a pool
//! item to and from its attributes), `expression` (an update as one
//! conditional `UpdateItem`), `tickets` (ticket items), `admin` (the table),
//! `segments` (a split pool's cold slots), `segment_cache` (the segments a
//! process has read), `wake` (the dispatcher's pending wake), `size` (item sizes as DynamoDB
//! bills them, for tests and the benchmark).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, DeleteRequest, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, WriteRequest,
};
use aws_sdk_dynamodb::Client;
use futures_util::future::join_all;

use super::{Created, Numbered, PoolStore, Record, StoreError, StoreErrorKind, Updated};
use crate::domain::{Change, CompactionPlan, Layout, Pool, Update};
use crate::keys::PoolKey;
use codec::{encode, number, Item};
use expression::Expression;
use schema::pool_item::{INCARNATION, NEXT_TICKET};
use schema::ticket_item::EXPIRES_AT;
use segment_cache::SegmentCache;
use segments::cold_after;

mod admin;
mod codec;
mod expression;
pub mod schema;
mod segment_cache;
mod segments;
#[cfg(any(test, feature = "measure"))]
mod size;
#[cfg(test)]
mod test_support;
mod tickets;
mod wake;

pub(crate) use admin::warm_up;
pub use admin::{ensure_table, stream_arn, ttl_attribute};
pub use codec::pool_key;
pub use schema::{dispatches, ACTIVE, BY_TICKET, NUMBER, PK, POOL_ITEM, SK, TICKET_ITEM};
#[cfg(any(test, feature = "measure"))]
pub use size::{item_size, stored_size};

#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    /// Consumed write/read units × 1000, when tracking was asked for (benchmarks).
    consumed_milli_units: Option<Arc<AtomicU64>>,
    /// How long after its last write a pool item may go (`xp`, DynamoDB TTL),
    /// when idle pools expire (`IDLE_POOL_DAYS`).
    idle_expiry: Option<std::time::Duration>,
    /// Split pools' segments as last read or written here (shared by clones).
    segments: Arc<SegmentCache>,
}

impl DynamoDbStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoDbStore {
            client,
            table: table.into(),
            consumed_milli_units: None,
            idle_expiry: None,
            segments: Arc::default(),
        }
    }

    /// Every write of a pool item sets its `xp` to now + `after`: DynamoDB
    /// deletes a pool nobody has written for that long. Safe because no
    /// decision reads `xp` (TTL deletes days late), and `after` outlasts any
    /// lease or ticket the last write could have left live.
    pub fn with_idle_expiry(mut self, after: std::time::Duration) -> Self {
        self.idle_expiry = Some(after);
        self
    }

    /// The `xp` a pool write sets, if idle pools expire; else it removes one
    /// an earlier setting left (TTL would delete the pool on that date, in
    /// use or not).
    fn touch(&self, expr: &mut Expression) {
        let Some(at) = self.idle_until() else {
            expr.update = match expr.update.split_once("REMOVE ") {
                Some((before, rest)) => format!("{before}REMOVE {EXPIRES_AT}, {rest}"),
                None => format!("{} REMOVE {EXPIRES_AT}", expr.update),
            };
            return;
        };
        expr.values.insert(":idle".into(), at);
        expr.update = match expr.update.strip_prefix("SET ") {
            Some(rest) => format!("SET {EXPIRES_AT} = :idle, {rest}"),
            None => format!("SET {EXPIRES_AT} = :idle {}", expr.update),
        };
    }

    /// A new pool item, with its `xp` if idle pools expire.
    fn touched(&self, mut item: Item) -> Item {
        if let Some(at) = self.idle_until() {
            item.insert(EXPIRES_AT.into(), at);
        }
        item
    }

    /// The `xp` a pool write sets now (Unix s), if idle pools expire.
    fn idle_until(&self) -> Option<AttributeValue> {
        let after = self.idle_expiry?;
        Some(number(crate::clock::now_ms() / 1000 + after.as_secs()))
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

impl DynamoDbStore {
    /// Deletes the items of `keys` (ticket or segment items, `what`), in
    /// batches of 25; unprocessed deletes (throttling) are sent again, a few
    /// times.
    async fn delete_keys(&self, keys: &[Item], what: &str) -> Result<(), StoreError> {
        for batch in keys.chunks(25) {
            let mut requests: Vec<WriteRequest> = batch
                .iter()
                .map(|key| {
                    DeleteRequest::builder()
                        .set_key(Some(key.clone()))
                        .build()
                        .map(|delete| WriteRequest::builder().delete_request(delete).build())
                        .map_err(|e| StoreError::new(StoreErrorKind::Unavailable, e.to_string()))
                })
                .collect::<Result<_, _>>()?;
            for _ in 0..5 {
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, requests)
                    .send()
                    .await
                    .map_err(store_error)?;
                requests = out
                    .unprocessed_items()
                    .and_then(|u| u.get(&self.table))
                    .cloned()
                    .unwrap_or_default();
                if requests.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            if !requests.is_empty() {
                return Err(StoreError::new(
                    StoreErrorKind::Throttled,
                    format!("{what} deletes left unprocessed"),
                ));
            }
        }
        Ok(())
    }
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
    /// back either way, so the caller decides again without a read. One
    /// marked `once` is not retried by the SDK either.
    async fn update_item(&self, key: Item, call: Expression) -> Result<Written, StoreError> {
        let once = call.once;
        let request = self
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
            .set_return_consumed_capacity(self.capacity_mode());
        let sent = if once {
            // Its one attempt has the whole call's time (the SDK's attempt
            // timeout would otherwise end it at 1.2 s, unknown, where a
            // retry had an answer within the call's 2.5 s).
            let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .operation_attempt_timeout(crate::config::DYNAMODB_OPERATION_TIMEOUT)
                .operation_timeout(crate::config::DYNAMODB_OPERATION_TIMEOUT)
                .build();
            request
                .customize()
                .config_override(
                    aws_sdk_dynamodb::config::Builder::default()
                        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
                        .timeout_config(timeouts),
                )
                .send()
                .await
        } else {
            request.send().await
        };
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
    /// The pool item (`GetItem`), and a split pool's segments after it.
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        match self.get(pool_key(key)).await? {
            Some(item) => Ok(Some(self.record_of(key, &item, None).await?)),
            None => Ok(None),
        }
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let Some(item) = self.put_new(self.touched(encode(key, record))).await? else {
            return Ok(Created::Created(record.clone()));
        };
        let current = self.record_of(key, &item, None).await?;
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
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let split = matches!(read.pool.layout(), Layout::Split(_));
        let mut expr = match update.changes.as_slice() {
            [Change::Split] => {
                let after = read.pool.apply(update).map_err(|failed| {
                    StoreError::new(
                        StoreErrorKind::Corrupt,
                        format!("a split planned on a pool it does not fit: {failed:?}"),
                    )
                })?;
                Expression::splitting(read, &after)
            }
            _ => Expression::of(read.incarnation, update, split),
        };
        self.touch(&mut expr);
        Ok(match self.update_item(pool_key(key), expr).await? {
            Written::Now(item) => Updated::Written(self.record_of(key, &item, Some(read)).await?),
            Written::Lost(Some(item)) => {
                Updated::Lost(self.record_of(key, &item, Some(read)).await?)
            }
            Written::Lost(None) => Updated::Gone,
        })
    }

    /// The segment (a `PutItem` conditioned on its version as read), then
    /// the pool item. A crash between them leaves the segment ahead: a
    /// compaction that finds it (its segment write refused) has the pool's
    /// segments read whole, and the next catches the pool item up first.
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        // The segments side by side; the pool item's write then cools the
        // entries of those that landed.
        let puts = plan
            .segments
            .iter()
            .filter(|segment| !segment.slots.is_empty())
            .map(|segment| async move {
                let landed = self.put_segment(key, read.incarnation, segment).await;
                (segment.segment, landed)
            });
        let mut lost = Vec::new();
        let mut failed = None;
        for (segment, landed) in join_all(puts).await {
            match landed {
                Ok(true) => {}
                // Another compaction wrote it first.
                Ok(false) => lost.push(segment),
                Err(err) => {
                    lost.push(segment);
                    failed.get_or_insert(err);
                }
            }
        }
        let Some(update) = plan.without(&lost) else {
            return match failed {
                Some(err) => Err(err),
                None => Ok(Updated::Lost(read.clone())),
            };
        };
        let written: Vec<u16> = plan
            .segments
            .iter()
            .map(|s| s.segment)
            .filter(|s| !lost.contains(s))
            .collect();
        let mut expr = Expression::of(read.incarnation, &update, true);
        self.touch(&mut expr);
        let written_item = self.update_item(pool_key(key), expr).await;
        if written_item.is_err() {
            // Landed or not: its segments may be ahead of the pool item.
            self.segments.doubt(key, read.incarnation);
        }
        Ok(match written_item? {
            Written::Now(item) => {
                // The read's cold slots stand, with these segments as
                // written, if no other segment was compacted meanwhile.
                let mut expected = match read.pool.layout() {
                    Layout::Split(split) => split.versions().clone(),
                    Layout::Flat => Default::default(),
                };
                for segment in plan
                    .segments
                    .iter()
                    .filter(|s| written.contains(&s.segment))
                {
                    expected.insert(segment.segment, segment.version);
                }
                if codec::segment_versions(&item)? == expected {
                    Updated::Written(codec::decode_split(
                        &item,
                        &cold_after(read, plan, &written, &update),
                    )?)
                } else {
                    Updated::Written(self.record_of(key, &item, None).await?)
                }
            }
            // Its segments that landed are ahead of the pool item, for a
            // read to find. When no other compaction moved a version, the
            // item as the loss showed it, with the read's cold slots and
            // those segments written (the caller may write the pool item
            // again over them: `CompactionPlan::again_on`); else the read.
            Written::Lost(Some(item)) => {
                self.segments.doubt(key, read.incarnation);
                let unmoved = match read.pool.layout() {
                    Layout::Split(split) => codec::segment_versions(&item)? == *split.versions(),
                    Layout::Flat => false,
                };
                if unmoved && segments::incarnation_of(&item) == Some(read.incarnation) {
                    let mut cold = segments::cold_of(read);
                    for segment in plan
                        .segments
                        .iter()
                        .filter(|s| written.contains(&s.segment))
                    {
                        cold.stored.insert(segment.segment, segment.version);
                    }
                    Updated::Lost(codec::decode_split(&item, &cold)?)
                } else {
                    Updated::Lost(read.clone())
                }
            }
            Written::Lost(None) => Updated::Gone,
        })
    }

    /// One `UpdateItem`, conditioned only on the pool existing.
    async fn number_ticket(&self, key: &PoolKey, below: u64) -> Result<Numbered, StoreError> {
        let mut expr = Expression::of(0, &Pool::plan_number(), false);
        expr.values
            .retain(|placeholder, _| expr.update.contains(placeholder.as_str()));
        // The pool's first number is 0 (no attribute yet).
        expr.condition = format!(
            "attribute_exists({INCARNATION}) AND (attribute_not_exists({NEXT_TICKET}) OR {NEXT_TICKET} < :below)"
        );
        expr.values.insert(":below".into(), number(below));
        self.touch(&mut expr);
        Ok(match self.update_item(pool_key(key), expr).await? {
            Written::Now(item) => Numbered::Taken(self.record_of(key, &item, None).await?),
            Written::Lost(Some(item)) if !item.is_empty() => {
                Numbered::Full(self.record_of(key, &item, None).await?)
            }
            Written::Lost(_) => Numbered::Gone,
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
        let old = out.attributes().filter(|a| !a.is_empty());
        self.segments.forget(key);
        // A split pool's segments go with it, once it is gone: at best effort,
        // since a segment left behind is never read (its sort key names the
        // incarnation deleted) and the pool is deleted either way.
        if let Some(incarnation) = old
            .filter(|old| codec::is_split(old))
            .and_then(segments::incarnation_of)
        {
            // Within a second of its own: the answer is the delete's.
            let cleanup = self.delete_segments(key, incarnation);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), cleanup).await;
        }
        Ok(old.is_some())
    }
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
