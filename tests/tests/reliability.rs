//! No stranded slot, no answer that is not our JSON, honest errors: writes
//! whose outcome is unknown are recognised, a database that never answers
//! gets a 502 in time, a corrupt item is a 500, endless lost races a 502
//! that says so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use semaphore::domain::{CompactionPlan, Update};
use semaphore::keys::PoolKey;
use semaphore::store::{Created, PoolStore, Record, StoreError, StoreErrorKind, Updated};
use semaphore::Limits;
use semaphore_tests::forward::{Around, Forward};
use semaphore_tests::harness::{dynamodb_client, pool_id, ApiClient, Backend, TABLE};
use serde_json::Value;

/// How the first `n` writes go wrong.
#[derive(Clone, Copy)]
enum Twist {
    /// The write lands; the caller gets an error (a timeout, a reset connection).
    LandedThenFailed,
    /// The write lands; the caller is told its condition failed, with the
    /// item as it now is (the SDK retried a write that had landed).
    LandedThenLost,
}

/// Applies `twist` to the first `n` writes (creates and updates).
struct Twisted {
    inner: Arc<dyn PoolStore>,
    twist: Twist,
    left: AtomicUsize,
}

impl Twisted {
    fn new(inner: Arc<dyn PoolStore>, twist: Twist, n: usize) -> Self {
        Twisted {
            inner,
            twist,
            left: AtomicUsize::new(n),
        }
    }

    fn twisting(&self) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

fn lost_answer() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "connection reset after the write",
    )
}

#[async_trait]
impl Around for Twisted {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }
    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let created = self.inner.create(key, record).await?;
        match (self.twisting(), self.twist) {
            (false, _) => Ok(created),
            (true, Twist::LandedThenFailed) => Err(lost_answer()),
            (true, Twist::LandedThenLost) => match created {
                Created::Created(now) | Created::Exists(now) => Ok(Created::Exists(now)),
            },
        }
    }
    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let updated = self.inner.update(key, read, update).await?;
        match (self.twisting(), self.twist, updated) {
            (false, _, updated) => Ok(updated),
            (true, Twist::LandedThenFailed, _) => Err(lost_answer()),
            (true, Twist::LandedThenLost, Updated::Written(now) | Updated::Lost(now)) => {
                Ok(Updated::Lost(now))
            }
            (true, Twist::LandedThenLost, Updated::Gone) => Ok(Updated::Gone),
        }
    }
}

on_both_stores!(
    unknown_outcomes_never_strand_a_slot,
    a_store_that_never_answers_gets_502_in_time,
    endless_lost_races_are_a_502_that_says_so,
    a_put_racing_a_delete_creates_the_pool_again,
);

/// Every write of a borrow, a wait, a return and a register lands but its
/// answer is lost (an error, or a lost condition with the item as it is
/// now): the service recognises its own lease, ticket, return and pool. A
/// lock is never held by a lease nobody was told about.
async fn unknown_outcomes_never_strand_a_slot(backend: Backend) {
    for twist in [Twist::LandedThenFailed, Twist::LandedThenLost] {
        let inner = backend.store().await;
        let id = pool_id();
        let plain = ApiClient::new(inner.clone(), Limits::default());
        let twisted = |n| {
            ApiClient::new(
                Arc::new(Forward(Twisted::new(inner.clone(), twist, n))),
                Limits::default(),
            )
        };
        assert_eq!(twisted(1).register(&id, 1).await.0, 200);
        assert_eq!(plain.inspect(&id).await.1["count"], 1);

        let (status, first) = twisted(1).borrow(&id, 30.0, 0.0).await;
        assert_eq!(status, 200, "a landed borrow must be answered: {first}");
        assert_eq!(first["expires_in"], 30);
        assert_eq!(plain.inspect(&id).await.1["in_use"], 1, "one slot, not two");

        // A waiter whose join and whose take both land unanswered.
        let waiter = {
            let api = twisted(2);
            let id = id.clone();
            tokio::spawn(async move { api.borrow(&id, 30.0, 5.0).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let lease = first["lease"].as_str().unwrap();
        let (status, body) = twisted(1).return_lease(&id, lease).await;
        assert_eq!((status, body["returned"].as_bool()), (200, Some(true)));
        let (status, second) = waiter.await.unwrap();
        assert_eq!((status, second["position"].as_u64()), (200, Some(0)));
        let state = plain.inspect(&id).await.1;
        assert_eq!(state["in_use"], 1, "{state}");
        let lease = second["lease"].as_str().unwrap();
        assert_eq!(plain.return_lease(&id, lease).await.1["returned"], true);
        assert_eq!(plain.inspect(&id).await.1["in_use"], 0);
    }
}

/// Never answers.
struct Hung;

#[async_trait]
impl PoolStore for Hung {
    async fn load(&self, _: &PoolKey) -> Result<Option<Record>, StoreError> {
        std::future::pending().await
    }
    async fn create(&self, _: &PoolKey, _: &Record) -> Result<Created, StoreError> {
        std::future::pending().await
    }
    async fn update(&self, _: &PoolKey, _: &Record, _: &Update) -> Result<Updated, StoreError> {
        std::future::pending().await
    }
    async fn compact(
        &self,
        _: &PoolKey,
        _: &Record,
        _: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        std::future::pending().await
    }
    async fn delete(&self, _: &PoolKey) -> Result<bool, StoreError> {
        std::future::pending().await
    }
}

/// Every route, against a database that never answers: a JSON 502 before
/// the Lambda's deadline (less the time to send it), and, without one, within
/// `wait` + 5 s. (The store is unused by the backend; the test runs twice
/// only so that it sits beside the others.)
async fn a_store_that_never_answers_gets_502_in_time(_: Backend) {
    let api = Arc::new(ApiClient::new(Arc::new(Hung), Limits::default()));
    let id = pool_id();
    let lease = uuid::Uuid::new_v4();
    let requests = [
        ("PUT", format!("/l/{id}"), r#"{"count":2}"#.to_string(), 0.0),
        ("GET", format!("/l/{id}"), String::new(), 0.0),
        ("DELETE", format!("/l/{id}"), String::new(), 0.0),
        (
            "POST",
            format!("/l/{id}/borrow"),
            r#"{"ttl":5,"wait":1}"#.into(),
            1.0,
        ),
        (
            "POST",
            format!("/l/{id}/return"),
            format!(r#"{{"lease":"{lease}"}}"#),
            0.0,
        ),
    ];
    let mut tasks = Vec::new();
    for (method, path, body, wait) in requests {
        for deadline in [Some(Duration::from_millis(1500)), None] {
            let (api, path, body) = (api.clone(), path.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let response = api
                    .raw(
                        method,
                        &path,
                        body.as_bytes(),
                        deadline.map(|d| started + d),
                    )
                    .await;
                let took = started.elapsed();
                let bound = deadline
                    .map(|d| d - Duration::from_millis(300))
                    .unwrap_or(Duration::from_secs_f64(wait + 5.0));
                assert_eq!(response.status, 502, "{method} {path}: {}", response.body);
                let message = response.body["error"].as_str().unwrap();
                assert!(message.contains("in time"), "{message}");
                // Timers on a loaded CI machine fire late by tens of ms;
                // the answer is still well before the deadline.
                assert!(
                    took <= bound + Duration::from_millis(150),
                    "{method} {path} with deadline {deadline:?}: answered after {took:?}"
                );
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Loses every conditional write (as if always beaten by another writer).
struct AlwaysBeaten(Arc<dyn PoolStore>);

#[async_trait]
impl Around for AlwaysBeaten {
    fn inner(&self) -> &dyn PoolStore {
        &*self.0
    }
    async fn update(&self, key: &PoolKey, _: &Record, _: &Update) -> Result<Updated, StoreError> {
        Ok(self.0.load(key).await?.map_or(Updated::Gone, Updated::Lost))
    }
}

async fn endless_lost_races_are_a_502_that_says_so(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    ApiClient::new(inner.clone(), Limits::default())
        .register(&id, 1)
        .await;
    let api = ApiClient::new(Arc::new(Forward(AlwaysBeaten(inner))), Limits::default());
    let started = Instant::now();
    let response = api
        .raw(
            "POST",
            &format!("/l/{id}/borrow"),
            br#"{"ttl":5}"#,
            Some(started + Duration::from_secs(1)),
        )
        .await;
    assert_eq!(response.status, 502, "{}", response.body);
    let message = response.body["error"].as_str().unwrap();
    assert!(message.contains("contention"), "{message}");
    assert!(started.elapsed() < Duration::from_millis(800));
}

/// Loses the resizes of a pool, and deletes it just after losing the third
/// (another caller's delete, landed before the loser reads the pool again).
struct ResizedThenDeleted {
    inner: Arc<dyn PoolStore>,
    lost: AtomicUsize,
}

#[async_trait]
impl Around for ResizedThenDeleted {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }
    async fn update(&self, key: &PoolKey, _: &Record, _: &Update) -> Result<Updated, StoreError> {
        let now = self.inner.load(key).await?;
        if self.lost.fetch_add(1, Ordering::SeqCst) == 2 {
            // Gone by the time the loser reads the pool again.
            self.inner.delete(key).await?;
        }
        Ok(now.map_or(Updated::Gone, Updated::Lost))
    }
}

/// A PUT whose resize keeps losing to other writers while the pool is
/// deleted creates the pool again: 404 is no answer to a PUT (the
/// randomized checker found one on DynamoDB Local).
async fn a_put_racing_a_delete_creates_the_pool_again(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let (status, _) = ApiClient::new(inner.clone(), Limits::default())
        .register(&id, 1)
        .await;
    assert_eq!(status, 200);
    let store = ResizedThenDeleted {
        inner: inner.clone(),
        lost: AtomicUsize::new(0),
    };
    let api = ApiClient::new(Arc::new(Forward(store)), Limits::default());
    let (status, body) = api.register(&id, 3).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["count"], 3, "{body}");
    let (status, body) = ApiClient::new(inner, Limits::default()).inspect(&id).await;
    assert_eq!((status, &body["count"]), (200, &Value::from(3)), "{body}");
}

/// A stored item that cannot be decoded is a server bug: 500 with a JSON
/// error on every route that reads it, never a retryable 502.
#[tokio::test]
async fn a_corrupt_item_is_a_500() {
    let client = dynamodb_client().await;
    let id = pool_id();
    let key = semaphore::api::parse_pool_id(&id).unwrap().key();
    client
        .put_item()
        .table_name(TABLE)
        .set_item(Some(semaphore::store::dynamodb::pool_key(&key)))
        .item("c", AttributeValue::S("not a number".into()))
        .send()
        .await
        .unwrap();
    let api = ApiClient::for_backend(Backend::DynamoDb).await;
    let lease = uuid::Uuid::new_v4();
    for (method, path, body) in [
        ("GET", format!("/l/{id}"), String::new()),
        ("PUT", format!("/l/{id}"), r#"{"count":1}"#.to_string()),
        ("POST", format!("/l/{id}/borrow"), r#"{"ttl":5}"#.into()),
        (
            "POST",
            format!("/l/{id}/return"),
            format!(r#"{{"lease":"{lease}"}}"#),
        ),
    ] {
        let (status, body): (u16, Value) = api.call(method, &path, &body).await;
        assert_eq!(status, 500, "{method} {path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("bug"), "{body}");
    }
    // It can still be deleted, and the id registered again.
    assert_eq!(api.delete(&id).await.1["deleted"], true);
    assert_eq!(api.register(&id, 1).await.0, 200);
}
