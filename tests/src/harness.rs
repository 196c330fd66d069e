//! Connecting to DynamoDB Local and driving the API in process.
//!
//! `tests/run` starts DynamoDB Local and exports `DYNAMODB_ENDPOINT`. Without
//! it the DynamoDB tests fail loudly: they never skip.

use std::sync::Arc;
use std::time::Instant;

use semaphore::api::{self, ApiResponse};
use semaphore::service::{Budget, Timing};
use semaphore::store::{dynamodb, DynamoDbStore, MemoryStore, PoolStore, TicketStore};
use semaphore::{config, Limits, Service};
use serde_json::Value;

use crate::counting::{on_the_wire, Counters};

/// The table every test shares; pools are random UUIDs, so tests never collide.
pub const TABLE: &str = "semaphore-tests";

/// The DynamoDB Local endpoint `tests/run` exported.
pub fn endpoint() -> String {
    match std::env::var("DYNAMODB_ENDPOINT") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DYNAMODB_ENDPOINT is not set: run the suite with tests/run, which starts \
             DynamoDB Local (or export DYNAMODB_ENDPOINT=http://127.0.0.1:PORT)"
        ),
    }
}

/// A new DynamoDB client of its own (one per simulated Lambda container),
/// with the test table created if missing.
pub async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    let client = config::dynamodb_client(Some(&endpoint())).await;
    dynamodb::ensure_table(&client, TABLE)
        .await
        .unwrap_or_else(|e| panic!("DynamoDB Local at {}: {e}", endpoint()));
    client
}

pub async fn dynamodb_store() -> Arc<dyn PoolStore> {
    Arc::new(DynamoDbStore::new(dynamodb_client().await, TABLE))
}

/// A DynamoDB store whose every HTTP attempt is counted into `counters`
/// (by operation and outcome: what DynamoDB bills).
pub async fn dynamodb_store_on_the_wire(counters: Arc<Counters>) -> Arc<dyn PoolStore> {
    dynamodb_stores_on_the_wire(counters).await.0
}

/// [`dynamodb_store_on_the_wire`] as both traits: its pools and its tickets.
pub async fn dynamodb_stores_on_the_wire(
    counters: Arc<Counters>,
) -> (Arc<dyn PoolStore>, Arc<dyn TicketStore>) {
    let client = on_the_wire(&dynamodb_client().await, counters);
    let store = Arc::new(DynamoDbStore::new(client, TABLE));
    (store.clone(), store)
}

pub fn memory_store() -> Arc<dyn PoolStore> {
    Arc::new(MemoryStore::new())
}

/// Which store a behavioural test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Memory,
    DynamoDb,
}

impl Backend {
    pub async fn store(self) -> Arc<dyn PoolStore> {
        match self {
            Backend::Memory => memory_store(),
            Backend::DynamoDb => dynamodb_store().await,
        }
    }

    /// One store as both traits: its pools and its ticket items.
    pub async fn stores(self) -> (Arc<dyn PoolStore>, Arc<dyn TicketStore>) {
        match self {
            Backend::Memory => {
                let store = Arc::new(MemoryStore::new());
                (store.clone(), store)
            }
            Backend::DynamoDb => {
                let store = Arc::new(DynamoDbStore::new(dynamodb_client().await, TABLE));
                (store.clone(), store)
            }
        }
    }
}

/// Drives the API exactly as the local server does: route, then handle.
pub struct ApiClient {
    pub service: Service,
}

impl ApiClient {
    pub fn new(store: Arc<dyn PoolStore>, limits: Limits) -> Self {
        ApiClient {
            service: Service::new(store, limits),
        }
    }

    /// With the service's timing (polls, compaction) set.
    pub fn with_timing(store: Arc<dyn PoolStore>, limits: Limits, timing: Timing) -> Self {
        ApiClient {
            service: Service::new(store, limits).with_timing(timing),
        }
    }

    pub async fn for_backend(backend: Backend) -> Self {
        Self::new(backend.store().await, Limits::default())
    }

    /// One request; returns the status and the JSON body.
    pub async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let response = self.raw(method, path, body.as_bytes(), None).await;
        (response.status, response.body)
    }

    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        deadline: Option<Instant>,
    ) -> ApiResponse {
        match api::resolve(method, path) {
            Ok((route, id)) => {
                let mut call = Budget::new(deadline);
                api::handle(&self.service, route, id, body, &mut call).await
            }
            Err(err) => api::error_response(&err),
        }
    }

    pub async fn register(&self, id: &str, count: u32) -> (u16, Value) {
        self.call(
            "PUT",
            &format!("/l/{id}"),
            &format!(r#"{{"count":{count}}}"#),
        )
        .await
    }

    pub async fn inspect(&self, id: &str) -> (u16, Value) {
        self.call("GET", &format!("/l/{id}"), "").await
    }

    pub async fn delete(&self, id: &str) -> (u16, Value) {
        self.call("DELETE", &format!("/l/{id}"), "").await
    }

    pub async fn borrow(&self, id: &str, ttl: f64, wait: f64) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/l/{id}/borrow"),
            &format!(r#"{{"ttl":{ttl},"wait":{wait}}}"#),
        )
        .await
    }

    pub async fn return_lease(&self, id: &str, lease: &str) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/l/{id}/return"),
            &format!(r#"{{"lease":"{lease}"}}"#),
        )
        .await
    }
}

/// A fresh random pool id.
pub fn pool_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
