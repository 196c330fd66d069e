//! The stores the bench drives, and the clients built over them: every client
//! is what one Lambda container would hold (its own `Service` and, for
//! DynamoDB, its own SDK client and connection pool).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use semaphore::domain::{Change, CompactionPlan, Expect, Update};
use semaphore::keys::PoolKey;
use semaphore::service::Timing;
use semaphore::store::{
    dynamodb, Created, DynamoDbStore, MemoryStore, PoolStore, Record, StoreError, Updated,
};
use semaphore::{config, Limits, Service};

use semaphore_tests::counting::{on_the_wire, Counters, CountingStore, IN_RETURN};
use semaphore_tests::forward::{Around, Forward};

use crate::report::{WriteTally, DYNAMODB, MEMORY};

pub const TABLE: &str = "semaphore-bench";

#[derive(Clone)]
pub enum Store {
    DynamoDb {
        endpoint: String,
    },
    /// One store shared by all clients, as one table would be.
    Memory(Arc<MemoryStore>),
}

#[derive(Clone)]
pub struct Backend {
    pub store: Store,
    /// Added to every store call, half before and half after it: a stand-in for
    /// the network between a Lambda and DynamoDB, which DynamoDB Local lacks.
    pub added_latency: Duration,
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self.store {
            Store::DynamoDb { .. } => DYNAMODB,
            Store::Memory(_) => MEMORY,
        }
    }

    pub fn is_dynamodb(&self) -> bool {
        matches!(self.store, Store::DynamoDb { .. })
    }

    /// The same store with another simulated network delay.
    pub fn with_latency(&self, added_latency: Duration) -> Backend {
        Backend {
            store: self.store.clone(),
            added_latency,
        }
    }

    /// Creates the bench table if needed.
    pub async fn prepare(&self) -> Result<(), String> {
        if let Store::DynamoDb { endpoint } = &self.store {
            let client = config::dynamodb_client(Some(endpoint)).await;
            dynamodb::ensure_table(&client, TABLE)
                .await
                .map_err(|e| format!("DynamoDB at {endpoint}: {e}"))?;
        }
        Ok(())
    }

    /// A store counted into `counters`: for DynamoDB a client of its own
    /// (its own connection pool, like one Lambda container).
    pub async fn store(&self, counters: &Arc<Counters>) -> Arc<dyn PoolStore> {
        let mut inner: Arc<dyn PoolStore> = match &self.store {
            Store::DynamoDb { endpoint } => {
                let base = config::dynamodb_client(Some(endpoint)).await;
                let client = on_the_wire(&base, counters.clone());
                Arc::new(
                    DynamoDbStore::new(client, TABLE)
                        .with_capacity_tracking(counters.reported_milli.clone()),
                )
            }
            Store::Memory(store) => store.clone(),
        };
        if !self.added_latency.is_zero() {
            inner = Arc::new(Delayed {
                inner,
                half: self.added_latency / 2,
            });
        }
        Arc::new(CountingStore::new(inner, counters.clone()))
    }

    /// A store counted into `counters` whose conditional writes are also
    /// classified into `breakdown`.
    pub async fn classified_store(
        &self,
        counters: &Arc<Counters>,
        breakdown: &Arc<Breakdown>,
    ) -> Arc<dyn PoolStore> {
        Arc::new(Forward(Classified {
            inner: self.store(counters).await,
            breakdown: breakdown.clone(),
        }))
    }

    /// A service of its own over a store of its own, counted into `counters`.
    pub async fn service(
        &self,
        counters: &Arc<Counters>,
        timing: Timing,
        limits: Limits,
    ) -> Service {
        service_over(self.store(counters).await, timing, limits)
    }
}

pub fn service_over(store: Arc<dyn PoolStore>, timing: Timing, limits: Limits) -> Service {
    Service::new(store, limits).with_timing(timing)
}

/// A store whose every call takes `2 × half` longer, the state read or written
/// in the middle, as over a network.
struct Delayed {
    inner: Arc<dyn PoolStore>,
    half: Duration,
}

impl Delayed {
    async fn around<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        tokio::time::sleep(self.half).await;
        let out = call.await;
        tokio::time::sleep(self.half).await;
        out
    }
}

#[async_trait]
impl PoolStore for Delayed {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        self.around(self.inner.load(key)).await
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        self.around(self.inner.create(key, record)).await
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        self.around(self.inner.update(key, read, update)).await
    }

    /// Two requests (the segment, then the pool item): delayed twice.
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        self.around(self.around(self.inner.compact(key, read, plan)))
            .await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.around(self.inner.delete(key)).await
    }
}

/// Conditional writes by kind and outcome: which writes collide, and on what.
#[derive(Default)]
pub struct Breakdown {
    tally: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Breakdown {
    fn add(&self, kind: &'static str, outcome: &'static str) {
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        *tally.entry((kind, outcome)).or_default() += 1;
    }

    pub fn tallies(&self) -> Vec<WriteTally> {
        let tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        tally
            .iter()
            .map(|(&(kind, outcome), &n)| WriteTally {
                kind: kind.into(),
                outcome: outcome.into(),
                n,
            })
            .collect()
    }
}

/// What a write is for, from its changes (the naive baseline's pins do not
/// change the kind).
fn write_kind(update: &Update) -> &'static str {
    let has = |f: fn(&Change) -> bool| update.changes.iter().any(f);
    let in_return = IN_RETURN.try_with(|r| *r).unwrap_or(false);
    if has(|c| matches!(c, Change::Take { .. })) {
        "take (newcomer)"
    } else if has(|c| matches!(c, Change::HandOff { .. })) {
        let several = update
            .changes
            .iter()
            .filter(|c| matches!(c, Change::HandOff { .. }))
            .count()
            > 1;
        // A return hands on one slot at most.
        match (in_return, several) {
            (true, _) => "return, handing off",
            (false, false) => "hand-off (waiter)",
            (false, true) => "hand-off (waiter), several",
        }
    } else if has(|c| matches!(c, Change::Append(_))) {
        "join queue"
    } else if has(|c| matches!(c, Change::SetCount(_) | Change::Extend(_))) {
        "resize"
    } else if has(|c| matches!(c, Change::Free(_))) {
        if in_return {
            "return, freeing"
        } else {
            "free"
        }
    } else if has(|c| matches!(c, Change::SetGivenUp(_))) {
        "remember a given-up id"
    } else if has(|c| matches!(c, Change::RemoveTicket(_))) {
        "cancel or prune tickets"
    } else if has(|c| matches!(c, Change::SetSegmentVersion { .. })) {
        "compaction"
    } else if has(|c| matches!(c, Change::Split)) {
        "split a flat pool"
    } else {
        "other"
    }
}

/// The expectation that failed, by kind.
fn expect_kind(expect: &Expect) -> &'static str {
    match expect {
        Expect::Count(_) => "lost: Count",
        Expect::SlotsLen(_) => "lost: SlotsLen",
        Expect::SlotFree(_) => "lost: SlotFree",
        Expect::SlotHeld(_) => "lost: SlotHeld",
        Expect::FreedIn { .. } => "lost: FreedIn",
        Expect::SlotStamp { .. } => "lost: SlotStamp",
        Expect::QueueLen(_) => "lost: QueueLen",
        Expect::QueueBelow(_) => "lost: QueueBelow",
        Expect::TicketAt { .. } => "lost: TicketAt",
        Expect::TicketLiveAt { .. } => "lost: TicketLiveAt",
        Expect::NotQueued(_) => "lost: NotQueued",
        Expect::NotHeld(_) => "lost: NotHeld",
        Expect::NotGivenUp(_) => "lost: NotGivenUp",
        Expect::GivenUpIs(_) => "lost: GivenUpIs",
        Expect::EndedIs(_) => "lost: EndedIs",
        Expect::GivenUpAtMost(_) => "lost: GivenUpAtMost",
        Expect::NoBacklog => "lost: NoBacklog",
        Expect::Admitted(_) => "lost: Admitted",
        Expect::ListedIsOrNot(..) => "lost: ListedIsOrNot",
        Expect::Settled => "lost: Settled",
        Expect::Cold { .. } => "lost: Cold",
        Expect::SegmentVersion { .. } => "lost: SegmentVersion",
        Expect::FlatAsRead { .. } => "lost: FlatAsRead",
    }
}

/// Classifies every conditional write into a [`Breakdown`]. A lost write's
/// failed expectation is found by applying it to the record the failure
/// handed back (the item as the condition saw it).
struct Classified {
    inner: Arc<dyn PoolStore>,
    breakdown: Arc<Breakdown>,
}

#[async_trait]
impl Around for Classified {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let kind = write_kind(update);
        let outcome = self.inner.update(key, read, update).await;
        let how = match &outcome {
            Ok(Updated::Written(_)) => "won",
            Ok(Updated::Gone) => "lost: pool gone",
            Ok(Updated::Lost(current)) if current.incarnation != read.incarnation => {
                "lost: read.incarnation"
            }
            Ok(Updated::Lost(current)) => match current.pool.apply(update) {
                Err(failed) => expect_kind(&failed.0),
                Ok(_) => "lost: not reproduced",
            },
            Err(_) => "failed call",
        };
        self.breakdown.add(kind, how);
        outcome
    }

    /// A compaction's two writes, as one: whether its pool item write landed.
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        let kind = if plan.segments.iter().all(|s| s.slots.is_empty()) {
            "compaction (catch-up)"
        } else {
            "compaction"
        };
        let outcome = self.inner.compact(key, read, plan).await;
        let how = match &outcome {
            Ok(Updated::Written(_)) => "won",
            Ok(Updated::Gone) => "lost: pool gone",
            Ok(Updated::Lost(_)) => "lost: segment or pool item",
            Err(_) => "failed call",
        };
        self.breakdown.add(kind, how);
        outcome
    }
}

/// DynamoDB Local started by `tests/dynamodb-local`, stopped on drop (also on
/// error paths and Ctrl-C, which unwind through `main`).
pub struct LocalDynamoDb {
    pub endpoint: String,
    pid: String,
}

fn script() -> PathBuf {
    crate::cli::workspace_root().join("tests/dynamodb-local")
}

impl LocalDynamoDb {
    pub fn start() -> Result<Self, String> {
        let script = script();
        eprintln!("bench: starting DynamoDB Local ({})", script.display());
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} start failed ({}); pass --dynamodb URL to use a running DynamoDB",
                script.display(),
                out.status
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        match (value("DYNAMODB_ENDPOINT"), value("DYNAMODB_PID")) {
            (Some(endpoint), Some(pid)) => Ok(LocalDynamoDb { endpoint, pid }),
            _ => Err(format!(
                "{} start printed no DYNAMODB_ENDPOINT/DYNAMODB_PID: {stdout:?}",
                script.display()
            )),
        }
    }
}

impl Drop for LocalDynamoDb {
    fn drop(&mut self) {
        eprintln!("bench: stopping DynamoDB Local (pid {})", self.pid);
        let status = Command::new("bash")
            .arg(script())
            .args(["stop", &self.pid])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("bench: could not stop DynamoDB Local pid {}", self.pid);
        }
    }
}
