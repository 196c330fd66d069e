//! Every answer is of one instant, and every effect happens once: a PUT
//! whose landed write the service did not learn of is not applied again
//! after a later PUT, never answers the pool of a later instant, and a
//! borrow lands on the lowest free position at the instant it is granted,
//! not only as it read the pool.
//! Each test makes the race happen at a set point, through a store that
//! runs another client's call around one write.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use semaphore::domain::{Change, Update};
use semaphore::keys::PoolKey;
use semaphore::store::{PoolStore, Record, StoreError, Updated};
use semaphore::Limits;
use semaphore_tests::forward::{Around, Forward};
use semaphore_tests::harness::{pool_id, ApiClient, Backend};

/// What runs around the first write that `matches`, once.
type Between =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// Where the other call goes, against the write it races.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// Before the write reaches the store: it lands first.
    Before,
    /// After the write landed, whose caller is then told its condition
    /// failed, with the item as it is now (the SDK's retry of a write that
    /// had landed, its condition failed on what the third writer changed).
    AfterThenLost,
}

struct Racing {
    inner: Arc<dyn PoolStore>,
    matches: fn(&Update) -> bool,
    when: When,
    between: Mutex<Option<Between>>,
}

impl Racing {
    fn take(&self, update: &Update) -> Option<Between> {
        if !(self.matches)(update) {
            return None;
        }
        self.between.lock().unwrap().take()
    }
}

#[async_trait]
impl Around for Racing {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let Some(between) = self.take(update) else {
            return self.inner.update(key, read, update).await;
        };
        match self.when {
            When::Before => {
                between().await;
                self.inner.update(key, read, update).await
            }
            When::AfterThenLost => {
                let landed = self.inner.update(key, read, update).await?;
                assert!(matches!(landed, Updated::Written(_)), "the write must land");
                between().await;
                let now = self.inner.load(key).await?.expect("the pool");
                Ok(Updated::Lost(now))
            }
        }
    }
}

/// A client on `inner` whose first write that `matches` races `between`.
fn racing(
    inner: &Arc<dyn PoolStore>,
    matches: fn(&Update) -> bool,
    when: When,
    between: Between,
) -> ApiClient {
    let store = Racing {
        inner: inner.clone(),
        matches,
        when,
        between: Mutex::new(Some(between)),
    };
    ApiClient::new(Arc::new(Forward(store)), Limits::default())
}

fn sets_count(update: &Update) -> bool {
    update
        .changes
        .iter()
        .any(|c| matches!(c, Change::SetCount(_)))
}

fn takes_position_2(update: &Update) -> bool {
    update
        .changes
        .iter()
        .any(|c| matches!(c, Change::Take { position: 2, .. }))
}

on_both_stores!(
    a_put_whose_landed_write_was_retried_is_not_applied_again,
    a_put_never_answers_the_pool_of_a_later_instant,
    a_take_lands_on_the_lowest_position_free_when_it_lands,
    a_take_lands_on_a_lower_slot_taken_and_given_back_meanwhile,
);

/// `PUT 2` lands, `PUT 7` lands after it, and the service is told that its
/// write lost (the SDK retried it; the retry's condition failed on the
/// count 7). The PUT must not set 2 again: that would apply it twice, after
/// the PUT of 7. Its answer is a 502 (it took effect; the pool as it landed
/// is not known), and 7 stays.
async fn a_put_whose_landed_write_was_retried_is_not_applied_again(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::new(inner.clone(), Limits::default()));
    assert_eq!(plain.register(&id, 1).await.0, 200);
    let other = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                let (status, body) = plain.register(&id, 7).await;
                assert_eq!((status, body["count"].as_u64()), (200, Some(7)), "{body}");
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing(&inner, sets_count, When::AfterThenLost, other);
    let (status, body) = api.register(&id, 2).await;
    assert_eq!(
        status, 502,
        "its resize landed; the pool as it landed is unknown: {body}"
    );
    let (_, state) = plain.inspect(&id).await;
    assert_eq!(state["count"], 7, "the PUT of 2 took effect twice: {state}");
}

/// `PUT 2` lands on a pool with no lease; a borrow lands after it; the
/// service is told its write lost, with the item that shows both. An
/// answer of `in_use` 1 would be of the borrow's instant, not the PUT's.
async fn a_put_never_answers_the_pool_of_a_later_instant(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::new(inner.clone(), Limits::default()));
    assert_eq!(plain.register(&id, 1).await.0, 200);
    let other = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                let (status, body) = plain.borrow(&id, 3600.0, 0.0).await;
                assert_eq!(status, 200, "{body}");
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing(&inner, sets_count, When::AfterThenLost, other);
    let (status, body) = api.register(&id, 2).await;
    match status {
        200 => assert_eq!(body["in_use"], 0, "the pool of a later instant: {body}"),
        _ => assert_eq!(status, 502, "{body}"),
    }
    let (_, state) = plain.inspect(&id).await;
    assert_eq!(
        (state["count"].as_u64(), state["in_use"].as_u64()),
        (Some(2), Some(1)),
        "{state}"
    );
}

/// Slots 0 and 1 are held; a borrow reads the pool and plans to take slot
/// 2; slot 0 is returned before its write lands. The take must fail, and
/// the borrow be granted slot 0: the lowest free position when it lands.
async fn a_take_lands_on_the_lowest_position_free_when_it_lands(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::new(inner.clone(), Limits::default()));
    assert_eq!(plain.register(&id, 3).await.0, 200);
    let (_, first) = plain.borrow(&id, 3600.0, 0.0).await;
    let (_, second) = plain.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(
        (first["position"].as_u64(), second["position"].as_u64()),
        (Some(0), Some(1))
    );
    let lease = first["lease"].as_str().unwrap().to_string();
    let other = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                let (_, body) = plain.return_lease(&id, &lease).await;
                assert_eq!(body["returned"], true, "{body}");
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing(&inner, takes_position_2, When::Before, other);
    let (status, third) = api.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(
        third["position"], 0,
        "slot 0 was free when the grant landed: {third}"
    );
    let (_, state) = plain.inspect(&id).await;
    assert_eq!(state["in_use"], 2, "{state}");
}

/// The same, but slot 0 is returned, taken by another borrow and returned
/// again before the take of slot 2 lands: slot 0 is as the take read it
/// (free in neither case), yet free when the take lands (a condition on the
/// slot's holder alone would miss it). The take must land on 0, with a
/// fence above the other borrow's.
async fn a_take_lands_on_a_lower_slot_taken_and_given_back_meanwhile(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::new(inner.clone(), Limits::default()));
    assert_eq!(plain.register(&id, 3).await.0, 200);
    let (_, first) = plain.borrow(&id, 3600.0, 0.0).await;
    let (_, second) = plain.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(
        (first["position"].as_u64(), second["position"].as_u64()),
        (Some(0), Some(1))
    );
    let lease = first["lease"].as_str().unwrap().to_string();
    let between_fence = Arc::new(Mutex::new(None));
    let other = {
        let (plain, id, fence) = (plain.clone(), id.clone(), between_fence.clone());
        Box::new(move || {
            Box::pin(async move {
                let (_, body) = plain.return_lease(&id, &lease).await;
                assert_eq!(body["returned"], true, "{body}");
                let (status, taken) = plain.borrow(&id, 3600.0, 0.0).await;
                assert_eq!(
                    (status, taken["position"].as_u64()),
                    (200, Some(0)),
                    "{taken}"
                );
                *fence.lock().unwrap() = taken["fence"].as_u64();
                let lease = taken["lease"].as_str().unwrap();
                let (_, body) = plain.return_lease(&id, lease).await;
                assert_eq!(body["returned"], true, "{body}");
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing(&inner, takes_position_2, When::Before, other);
    let (status, third) = api.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(
        third["position"], 0,
        "slot 0 was free when the grant landed: {third}"
    );
    let other_fence = between_fence.lock().unwrap().expect("the other borrow ran");
    assert!(
        third["fence"].as_u64() > Some(other_fence),
        "granted after the other borrow: {third}"
    );
}
