//! Counting what an operation costs (for `calls_per_operation` and the bench): HTTP requests as the SDK sends them (an
//! interceptor, so SDK retries count too), logical store calls and conflicts (a
//! `PoolStore` wrapper), and capacity units — both a model from item sizes and
//! whatever DynamoDB reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_sdk_dynamodb::config::interceptors::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use semaphore::domain::{CompactionPlan, Update};
use semaphore::keys::PoolKey;
use semaphore::store::dynamodb::item_size;
use semaphore::store::{Created, PoolStore, Record, StoreError, Updated};

/// Shared by every client of one scenario; read as [`Snapshot`] differences.
#[derive(Default, Debug)]
pub struct Counters {
    pub http_get: AtomicU64,
    /// PutItem and UpdateItem: the conditional writes.
    pub http_put: AtomicU64,
    pub http_delete: AtomicU64,
    pub http_other: AtomicU64,
    pub loads: AtomicU64,
    pub writes: AtomicU64,
    pub deletes: AtomicU64,
    /// Conditional writes whose condition failed (`Conflict` / `Exists`).
    pub conflicts: AtomicU64,
    /// The part of `conflicts` lost inside a return (see [`Phase`]).
    pub return_conflicts: AtomicU64,
    /// Modelled capacity, in thousandths of a unit.
    pub model_wcu_milli: AtomicU64,
    pub model_rcu_milli: AtomicU64,
    /// The pool item's modelled size after each write that landed, summed,
    /// and how many landed: how large the item every write bills is.
    pub landed_bytes: AtomicU64,
    pub landed: AtomicU64,
    /// What DynamoDB put in `ConsumedCapacity` (successful calls only), × 1000.
    pub reported_milli: Arc<AtomicU64>,
    /// Every attempt on the wire, by operation and outcome (see [`Outcome`]).
    pub wire: Mutex<BTreeMap<(String, Outcome), u64>>,
    /// What DynamoDB bills, read off the wire (× 1000): each answer's
    /// `ConsumedCapacity`, and each failed conditional write at the size of
    /// the item it handed back (DynamoDB Local reports no capacity for
    /// those). Split by the phase the caller was in (see [`IN_RETURN`]).
    pub billed: Mutex<Billed>,
}

/// Capacity units billed on the wire, × 1000, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    pub borrow_wcu_milli: u64,
    pub borrow_rcu_milli: u64,
    pub return_wcu_milli: u64,
    pub return_rcu_milli: u64,
}

impl Billed {
    pub fn since(&self, before: &Billed) -> Billed {
        Billed {
            borrow_wcu_milli: self.borrow_wcu_milli - before.borrow_wcu_milli,
            borrow_rcu_milli: self.borrow_rcu_milli - before.borrow_rcu_milli,
            return_wcu_milli: self.return_wcu_milli - before.return_wcu_milli,
            return_rcu_milli: self.return_rcu_milli - before.return_rcu_milli,
        }
    }

    pub fn wcu_milli(&self) -> u64 {
        self.borrow_wcu_milli + self.return_wcu_milli
    }

    pub fn rcu_milli(&self) -> u64 {
        self.borrow_rcu_milli + self.return_rcu_milli
    }
}

/// How one HTTP attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Ok,
    /// A conditional write whose condition failed: billed like a write.
    ConditionFailed,
    /// Any other error answer, or none (a timeout, a reset connection).
    Failed,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub http_get: u64,
    pub http_put: u64,
    pub http_delete: u64,
    pub http_other: u64,
    pub loads: u64,
    pub writes: u64,
    pub deletes: u64,
    pub conflicts: u64,
    pub return_conflicts: u64,
    pub model_wcu_milli: u64,
    pub model_rcu_milli: u64,
    pub landed_bytes: u64,
    pub landed: u64,
    pub reported_milli: u64,
}

impl Counters {
    /// The attempts on the wire so far, by operation and outcome.
    pub fn wire(&self) -> BTreeMap<(String, Outcome), u64> {
        self.wire.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Attempts between two [`Counters::wire`] readings, leaving out zeros.
    pub fn wire_since(
        now: &BTreeMap<(String, Outcome), u64>,
        before: &BTreeMap<(String, Outcome), u64>,
    ) -> BTreeMap<(String, Outcome), u64> {
        now.iter()
            .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The capacity billed on the wire so far.
    pub fn billed(&self) -> Billed {
        *self.billed.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            http_get: get(&self.http_get),
            http_put: get(&self.http_put),
            http_delete: get(&self.http_delete),
            http_other: get(&self.http_other),
            loads: get(&self.loads),
            writes: get(&self.writes),
            deletes: get(&self.deletes),
            conflicts: get(&self.conflicts),
            return_conflicts: get(&self.return_conflicts),
            model_wcu_milli: get(&self.model_wcu_milli),
            model_rcu_milli: get(&self.model_rcu_milli),
            landed_bytes: get(&self.landed_bytes),
            landed: get(&self.landed),
            reported_milli: get(&self.reported_milli),
        }
    }
}

impl Snapshot {
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        Snapshot {
            http_get: self.http_get - before.http_get,
            http_put: self.http_put - before.http_put,
            http_delete: self.http_delete - before.http_delete,
            http_other: self.http_other - before.http_other,
            loads: self.loads - before.loads,
            writes: self.writes - before.writes,
            deletes: self.deletes - before.deletes,
            conflicts: self.conflicts - before.conflicts,
            return_conflicts: self.return_conflicts - before.return_conflicts,
            model_wcu_milli: self.model_wcu_milli - before.model_wcu_milli,
            model_rcu_milli: self.model_rcu_milli - before.model_rcu_milli,
            landed_bytes: self.landed_bytes - before.landed_bytes,
            landed: self.landed - before.landed,
            reported_milli: self.reported_milli - before.reported_milli,
        }
    }

    pub fn http_total(&self) -> u64 {
        self.http_get + self.http_put + self.http_delete + self.http_other
    }

    pub fn store_calls(&self) -> u64 {
        self.loads + self.writes + self.deletes
    }

    /// Database calls: HTTP requests when a real client was used (they include
    /// SDK retries), else the store calls (in-memory store).
    pub fn calls(&self) -> u64 {
        if self.http_total() > 0 {
            self.http_total()
        } else {
            self.store_calls()
        }
    }

    /// Conditional writes attempted (PutItem and UpdateItem requests, or store
    /// writes in memory).
    pub fn write_attempts(&self) -> u64 {
        if self.http_total() > 0 {
            self.http_put
        } else {
            self.writes
        }
    }

    pub fn reads(&self) -> u64 {
        if self.http_total() > 0 {
            self.http_get
        } else {
            self.loads
        }
    }
}

tokio::task_local! {
    /// Set by a contention client around its return, so a conflict can be
    /// told apart from one lost inside a borrow.
    pub static IN_RETURN: bool;
}

/// Counts every HTTP request the SDK transmits, by DynamoDB operation.
#[derive(Debug)]
pub struct HttpCounter(pub Arc<Counters>);

/// `client` with every HTTP attempt counted into `counters` (by operation
/// and outcome: what DynamoDB bills).
pub fn on_the_wire(
    client: &aws_sdk_dynamodb::Client,
    counters: Arc<Counters>,
) -> aws_sdk_dynamodb::Client {
    let conf = client
        .config()
        .to_builder()
        .interceptor(HttpCounter(counters))
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

/// The operation of the attempt each task has on the wire (a task makes
/// one store call at a time): the request is gone when the attempt ends.
fn in_flight() -> &'static Mutex<HashMap<Option<tokio::task::Id>, String>> {
    static IN_FLIGHT: std::sync::OnceLock<Mutex<HashMap<Option<tokio::task::Id>, String>>> =
        std::sync::OnceLock::new();
    IN_FLIGHT.get_or_init(Mutex::default)
}

impl Intercept for HttpCounter {
    fn name(&self) -> &'static str {
        "semaphore_tests::HttpCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        // Called once per attempt, so retries are counted.
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or("");
        in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                tokio::task::try_id(),
                target.rsplit('.').next().unwrap_or("?").to_string(),
            );
        let counter = match target.rsplit('.').next() {
            Some("GetItem") => &self.0.http_get,
            Some("PutItem" | "UpdateItem") => &self.0.http_put,
            Some("DeleteItem") => &self.0.http_delete,
            _ => &self.0.http_other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let operation = in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&tokio::task::try_id())
            .unwrap_or_else(|| "?".to_string());
        let body = context
            .response()
            .and_then(|r| r.body().bytes())
            .unwrap_or_default();
        let outcome = match context.response() {
            Some(response) if response.status().is_success() => Outcome::Ok,
            Some(_) if String::from_utf8_lossy(body).contains("ConditionalCheckFailed") => {
                Outcome::ConditionFailed
            }
            _ => Outcome::Failed,
        };
        let milli = billed_milli(body, outcome);
        if milli > 0 {
            let reading = matches!(operation.as_str(), "GetItem" | "Query" | "BatchGetItem");
            let in_return = IN_RETURN.try_with(|r| *r).unwrap_or(false);
            let mut billed = self.0.billed.lock().unwrap_or_else(|e| e.into_inner());
            *match (reading, in_return) {
                (false, false) => &mut billed.borrow_wcu_milli,
                (true, false) => &mut billed.borrow_rcu_milli,
                (false, true) => &mut billed.return_wcu_milli,
                (true, true) => &mut billed.return_rcu_milli,
            } += milli;
        }
        *self
            .0
            .wire
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((operation, outcome))
            .or_default() += 1;
        Ok(())
    }
}

/// The units (× 1000) one answer bills: its `ConsumedCapacity` (asked for
/// on every call the bench makes), or, for a failed conditional write, one
/// write unit per started KB of the item it handed back (`ALL_OLD`; one
/// unit when there is none), by DynamoDB's size rules.
pub fn billed_milli(body: &[u8], outcome: Outcome) -> u64 {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) else {
        return 0;
    };
    match outcome {
        Outcome::Ok => json
            .get("ConsumedCapacity")
            .and_then(|c| c.get("CapacityUnits"))
            .and_then(serde_json::Value::as_f64)
            .map_or(0, |units| (units * 1000.0).round() as u64),
        Outcome::ConditionFailed => {
            let size = json
                .get("Item")
                .and_then(serde_json::Value::as_object)
                .map_or(0, |item| {
                    item.iter()
                        .map(|(name, value)| name.len() + wire_value_size(value))
                        .sum()
                });
            write_units(size) * 1000
        }
        Outcome::Failed => 0,
    }
}

/// One attribute value's size as DynamoDB bills it, from its JSON form
/// (`{"N": "12"}`, `{"B": "<base64>"}`, `{"L": [...]}`, …).
fn wire_value_size(value: &serde_json::Value) -> usize {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    let text = inner.as_str().unwrap_or("");
    match kind.as_str() {
        "S" => text.len(),
        "N" => number_size(text),
        "B" => base64_len(text),
        "M" => {
            3 + inner.as_object().map_or(0, |m| {
                m.iter()
                    .map(|(k, v)| k.len() + wire_value_size(v) + 1)
                    .sum::<usize>()
            })
        }
        "L" => {
            3 + inner.as_array().map_or(0, |l| {
                l.iter().map(|v| wire_value_size(v) + 1).sum::<usize>()
            })
        }
        "SS" => strings(inner).map(str::len).sum(),
        "NS" => strings(inner).map(number_size).sum(),
        "BS" => strings(inner).map(base64_len).sum(),
        _ => 1,
    }
}

fn strings(value: &serde_json::Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
}

fn number_size(n: &str) -> usize {
    let digits: String = n.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    significant.len().div_ceil(2) + 1
}

/// Decoded length of standard padded base64.
fn base64_len(text: &str) -> usize {
    let padding = text.bytes().rev().take_while(|&b| b == b'=').count();
    (text.len() / 4 * 3).saturating_sub(padding)
}

/// The billing model: 1 WCU per started KB of the larger of the old and new
/// item (failed conditions billed too), 1 RCU per started 4 KB of a strongly
/// consistent read, and at least 1 unit per request.
pub fn write_units(bytes: usize) -> u64 {
    bytes.div_ceil(1024).max(1) as u64
}

pub fn read_units(bytes: usize) -> u64 {
    bytes.div_ceil(4096).max(1) as u64
}

/// A pool's item size, as DynamoDB bills it.
pub fn pool_item_size(key: &PoolKey, record: &Record) -> usize {
    item_size(key, record)
}

/// A `PoolStore` wrapper counting calls, conflicts and modelled capacity.
pub struct CountingStore {
    inner: Arc<dyn PoolStore>,
    counters: Arc<Counters>,
    /// The last item size this client saw per pool: the "old item" of its next write.
    last_size: Mutex<HashMap<PoolKey, usize>>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn PoolStore>, counters: Arc<Counters>) -> Self {
        CountingStore {
            inner,
            counters,
            last_size: Mutex::default(),
        }
    }

    fn remember(&self, key: &PoolKey, size: Option<usize>) -> Option<usize> {
        let mut sizes = self.last_size.lock().unwrap_or_else(|e| e.into_inner());
        match size {
            Some(size) => sizes.insert(*key, size),
            None => sizes.remove(key),
        }
    }

    fn wcu(&self, units: u64) {
        self.counters
            .model_wcu_milli
            .fetch_add(units * 1000, Ordering::Relaxed);
    }

    /// A write landed, leaving the pool item `size` bytes.
    fn landed(&self, size: usize) {
        self.counters
            .landed_bytes
            .fetch_add(size as u64, Ordering::Relaxed);
        self.counters.landed.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl PoolStore for CountingStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        let loaded = self.inner.load(key).await?;
        let size = loaded.as_ref().map(|r| pool_item_size(key, r));
        self.remember(key, size);
        self.counters
            .model_rcu_milli
            .fetch_add(read_units(size.unwrap_or(0)) * 1000, Ordering::Relaxed);
        Ok(loaded)
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let new_size = pool_item_size(key, record);
        let outcome = self.inner.create(key, record).await?;
        let old_size = match &outcome {
            Created::Created(_) => {
                self.landed(new_size);
                self.remember(key, Some(new_size));
                0
            }
            Created::Exists(current) => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                let size = pool_item_size(key, current);
                self.remember(key, Some(size));
                size
            }
        };
        self.wcu(write_units(new_size.max(old_size)));
        Ok(outcome)
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.update(key, read, update).await?;
        // Billed: the larger of the item before and after (a failed condition
        // is billed on the item as it is).
        let units = match &outcome {
            Updated::Written(record) => {
                let new_size = pool_item_size(key, record);
                self.landed(new_size);
                let old_size = self.remember(key, Some(new_size)).unwrap_or(new_size);
                write_units(new_size.max(old_size))
            }
            Updated::Lost(current) => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                if IN_RETURN.try_with(|r| *r).unwrap_or(false) {
                    self.counters
                        .return_conflicts
                        .fetch_add(1, Ordering::Relaxed);
                }
                let size = pool_item_size(key, current);
                self.remember(key, Some(size));
                write_units(size)
            }
            Updated::Gone => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                self.remember(key, None);
                1
            }
        };
        self.wcu(units);
        Ok(outcome)
    }

    /// Counted as one write (the wire counts what it sent: a segment too).
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.compact(key, read, plan).await?;
        if let Updated::Lost(_) | Updated::Gone = outcome {
            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        if let Updated::Written(record) | Updated::Lost(record) = &outcome {
            let size = pool_item_size(key, record);
            if matches!(outcome, Updated::Written(_)) {
                self.landed(size);
            }
            self.remember(key, Some(size));
            self.wcu(write_units(size));
        }
        Ok(outcome)
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        let old_size = self.remember(key, None).unwrap_or(0);
        let deleted = self.inner.delete(key).await?;
        self.wcu(write_units(old_size));
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_round_up_and_never_drop_to_zero() {
        assert_eq!(write_units(0), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
        assert_eq!(read_units(4096), 1);
        assert_eq!(read_units(4097), 2);
    }

    /// The wire's own sizes agree with the store's size rules: a failed
    /// write is billed at the item it hands back.
    #[test]
    fn a_failed_write_is_billed_at_the_size_of_the_item_it_hands_back() {
        // "pk" 2 + 1 byte; "n" 1 + 3 (two digit pairs and one); "l" 1 + 3 +
        // two elements of 1 + 1: 15 bytes, one write unit.
        let body = br#"{"__type":"x#ConditionalCheckFailedException","Item":{"pk":{"B":"AA=="},"n":{"N":"1234"},"l":{"L":[{"BOOL":true},{"NULL":true}]}}}"#;
        assert_eq!(wire_value_size(&serde_json::json!({"B": "AA=="})), 1);
        assert_eq!(wire_value_size(&serde_json::json!({"N": "1234"})), 3);
        assert_eq!(billed_milli(body, Outcome::ConditionFailed), 1000);
        let big = format!(r#"{{"Item":{{"s":{{"S":"{}"}}}}}}"#, "x".repeat(2048));
        assert_eq!(billed_milli(big.as_bytes(), Outcome::ConditionFailed), 3000);
        let ok = br#"{"ConsumedCapacity":{"CapacityUnits":24.0,"TableName":"t"}}"#;
        assert_eq!(billed_milli(ok, Outcome::Ok), 24000);
        assert_eq!(billed_milli(b"not json", Outcome::Failed), 0);
    }

    #[tokio::test]
    async fn a_landed_write_counts_the_pool_items_size_and_a_lost_one_does_not() {
        use semaphore::domain::{BorrowPlan, Holder, LeaseDigest, Pool};
        use semaphore::store::memory::MemoryStore;
        let counters = Arc::new(Counters::default());
        let store = CountingStore::new(Arc::new(MemoryStore::new()), counters.clone());
        let key = PoolKey([3; 16]);
        let read = Record::new(Pool::new(4, 0));
        assert!(matches!(
            store.create(&key, &read).await,
            Ok(Created::Created(_))
        ));
        let holder = Holder {
            digest: LeaseDigest([1; 8]),
            ttl_ms: 60_000,
        };
        let BorrowPlan::Take { update, .. } =
            read.pool.plan_borrow_or_join(holder, 0, 1_000, 8, true)
        else {
            panic!("a free slot: a take");
        };
        let Ok(Updated::Written(after)) = store.update(&key, &read, &update).await else {
            panic!("the take lands");
        };
        let landed = counters.snapshot();
        assert_eq!((landed.landed, landed.writes), (2, 2));
        assert_eq!(
            landed.landed_bytes,
            (item_size(&key, &read) + item_size(&key, &after)) as u64
        );
        assert!(item_size(&key, &after) > item_size(&key, &read));
        // The same take again, planned on the same read: its slot is taken.
        assert!(matches!(
            store.update(&key, &read, &update).await,
            Ok(Updated::Lost(_))
        ));
        let lost = counters.snapshot().since(&landed);
        assert_eq!((lost.landed, lost.landed_bytes, lost.writes), (0, 0, 1));
    }

    #[test]
    fn snapshot_prefers_http_counts_when_present() {
        let s = Snapshot {
            loads: 3,
            writes: 2,
            ..Snapshot::default()
        };
        assert_eq!(s.calls(), 5);
        let s = Snapshot {
            http_get: 1,
            http_put: 4,
            ..s
        };
        assert_eq!((s.calls(), s.write_attempts(), s.reads()), (5, 4, 1));
    }
}
