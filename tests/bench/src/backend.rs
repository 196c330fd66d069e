//! The stores the bench drives, and the clients built over them: every client
//! is what one Lambda container would hold (its own `Service` and, for
//! DynamoDB, its own SDK client and connection pool).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use semaphore::domain::Pool;
use semaphore::keys::PoolKey;
use semaphore::service::Backoff;
use semaphore::store::{
    dynamodb, Created, DynamoDbStore, MemoryStore, PoolStore, Replaced, StoreError, Version,
    Versioned,
};
use semaphore::{config, Limits, Service};

use semaphore_tests::counting::{Counters, CountingStore, HttpCounter};

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
            Store::DynamoDb { .. } => "dynamodb-local",
            Store::Memory(_) => "memory",
        }
    }

    pub fn is_dynamodb(&self) -> bool {
        matches!(self.store, Store::DynamoDb { .. })
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

    /// A store counted into `counters`.
    pub async fn store(&self, counters: &Arc<Counters>) -> Arc<dyn PoolStore> {
        let mut inner: Arc<dyn PoolStore> = match &self.store {
            Store::DynamoDb { endpoint } => {
                let base = config::dynamodb_client(Some(endpoint)).await;
                let conf = base
                    .config()
                    .to_builder()
                    .interceptor(HttpCounter(counters.clone()))
                    .build();
                let client = aws_sdk_dynamodb::Client::from_conf(conf);
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

    pub async fn service(&self, counters: &Arc<Counters>, backoff: Backoff) -> Service {
        Service::new(self.store(counters).await, Limits::default()).with_backoff(backoff)
    }
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
    async fn load(&self, key: &PoolKey) -> Result<Option<Versioned>, StoreError> {
        self.around(self.inner.load(key)).await
    }

    async fn create(&self, key: &PoolKey, pool: &Pool) -> Result<Created, StoreError> {
        self.around(self.inner.create(key, pool)).await
    }

    async fn replace(
        &self,
        key: &PoolKey,
        pool: &Pool,
        expected: Version,
    ) -> Result<Replaced, StoreError> {
        self.around(self.inner.replace(key, pool, expected)).await
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        self.around(self.inner.delete(key)).await
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
