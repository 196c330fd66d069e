//! Every answer is of one instant, and every effect happens once: a PUT
//! whose landed write the service did not learn of is not applied again
//! after a later PUT, never answers the pool of a later instant, and a
//! borrow lands on the lowest free position at the instant it is granted,
//! not only as it read the pool.
//! Each test makes the race happen at a set point, through a store that
//! runs another client's call around one write.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use semaphore::domain::{Change, Compaction, CompactionPlan, Update};
use semaphore::keys::PoolKey;
use semaphore::service::Timing;
use semaphore::store::{PoolStore, Record, StoreError, StoreErrorKind, Updated};
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
    /// After the write landed, whose answer is then lost: its caller gets
    /// an error (a timeout), and reads the item as the other call left it.
    AfterThenError,
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
            When::AfterThenError => {
                let landed = self.inner.update(key, read, update).await?;
                assert!(matches!(landed, Updated::Written(_)), "the write must land");
                between().await;
                Err(StoreError::new(
                    StoreErrorKind::TimedOut,
                    "the answer to a write that landed was lost",
                ))
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
    racing_with(inner, matches, when, between, Timing::default())
}

/// [`racing`], with the service's `timing` (compaction, layout).
fn racing_with(
    inner: &Arc<dyn PoolStore>,
    matches: fn(&Update) -> bool,
    when: When,
    between: Between,
    timing: Timing,
) -> ApiClient {
    let store = Racing {
        inner: inner.clone(),
        matches,
        when,
        between: Mutex::new(Some(between)),
    };
    ApiClient::with_timing(Arc::new(Forward(store)), Limits::default(), timing)
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
    a_put_that_lost_to_two_others_sets_its_count,
    a_take_lands_on_the_lowest_position_free_when_it_lands,
    a_take_lands_on_the_lowest_position_free_when_it_lands_split,
    a_take_lands_on_a_lower_slot_taken_and_given_back_meanwhile,
    a_take_lands_on_a_lower_slot_taken_and_given_back_meanwhile_split,
    a_take_that_landed_is_granted_though_a_later_read_shows_its_slot_reused,
);

/// `PUT 2` lands, `PUT 7` lands after it, and the answer to the first
/// write is lost (a timeout). The PUT must not set 2 again: that would
/// apply it twice, after the PUT of 7. Its answer is a 502 (it may have
/// taken effect; the pool as it landed is not known), and 7 stays.
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
    let api = racing(&inner, Update::sets_count, When::AfterThenError, other);
    let (status, body) = api.register(&id, 2).await;
    assert_eq!(
        status, 502,
        "its resize landed; the pool as it landed is unknown: {body}"
    );
    let (_, state) = plain.inspect(&id).await;
    assert_eq!(state["count"], 7, "the PUT of 2 took effect twice: {state}");
}

/// `PUT 2` lands on a pool with no lease; a borrow lands after it; the
/// answer to the PUT's write is lost, and a read shows both. An answer of
/// `in_use` 1 would be of the borrow's instant, not the PUT's.
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
    let api = racing(&inner, Update::sets_count, When::AfterThenError, other);
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

/// `PUT 7` and then `PUT 5` land between a `PUT 2`'s read and its write:
/// its condition fails, which says that it did not land (a resize is sent
/// once), so it plans again and sets 2, answered 200 with no fault in play
/// (it answered 502, as if its write might have landed before the others).
async fn a_put_that_lost_to_two_others_sets_its_count(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::new(inner.clone(), Limits::default()));
    assert_eq!(plain.register(&id, 1).await.0, 200);
    let others = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                for count in [7, 5] {
                    let (status, body) = plain.register(&id, count).await;
                    assert_eq!((status, body["count"].as_u64()), (200, Some(count.into())));
                }
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing(&inner, Update::sets_count, When::Before, others);
    let (status, body) = api.register(&id, 2).await;
    assert_eq!((status, body["count"].as_u64()), (200, Some(2)), "{body}");
    let (_, state) = plain.inspect(&id).await;
    assert_eq!(state["count"], 2, "{state}");
}

/// A pool of count 3 with slots 0 and 1 held for an hour, through a client
/// with `timing`: the store, that client, the pool id and slot 0's lease.
struct TwoHeld {
    inner: Arc<dyn PoolStore>,
    plain: Arc<ApiClient>,
    id: String,
    lease: String,
}

async fn two_held(backend: Backend, timing: Timing) -> TwoHeld {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::with_timing(
        inner.clone(),
        Limits::default(),
        timing,
    ));
    assert_eq!(plain.register(&id, 3).await.0, 200);
    let (_, first) = plain.borrow(&id, 3600.0, 0.0).await;
    let (_, second) = plain.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(
        (first["position"].as_u64(), second["position"].as_u64()),
        (Some(0), Some(1))
    );
    let lease = first["lease"].as_str().unwrap().to_string();
    TwoHeld {
        inner,
        plain,
        id,
        lease,
    }
}

/// Slots 0 and 1 are held; a borrow reads the pool and plans to take slot
/// 2; slot 0 is returned before its write lands. The take must fail, and
/// the borrow be granted slot 0: the lowest free position when it lands.
async fn a_take_lands_on_the_lowest_position_free_when_it_lands(backend: Backend) {
    take_lands_on_the_lowest_position_free_when_it_lands(backend, Timing::default()).await;
}

/// The same on a split pool, its slots compacted into segments at every
/// chance: a grant expects no slot freed in the segments below it.
async fn a_take_lands_on_the_lowest_position_free_when_it_lands_split(backend: Backend) {
    take_lands_on_the_lowest_position_free_when_it_lands(backend, compacting()).await;
}

async fn take_lands_on_the_lowest_position_free_when_it_lands(backend: Backend, timing: Timing) {
    let TwoHeld {
        inner,
        plain,
        id,
        lease,
    } = two_held(backend, timing).await;
    let other = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                let (_, body) = plain.return_lease(&id, &lease).await;
                assert_eq!(body["returned"], true, "{body}");
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = racing_with(&inner, takes_position_2, When::Before, other, timing);
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
    take_lands_on_a_lower_slot_taken_and_given_back_meanwhile(backend, Timing::default()).await;
}

/// The same on a split pool, its slots compacted into segments at every
/// chance: a grant expects no slot freed in the segments below it.
async fn a_take_lands_on_a_lower_slot_taken_and_given_back_meanwhile_split(backend: Backend) {
    take_lands_on_a_lower_slot_taken_and_given_back_meanwhile(backend, compacting()).await;
}

async fn take_lands_on_a_lower_slot_taken_and_given_back_meanwhile(
    backend: Backend,
    timing: Timing,
) {
    let TwoHeld {
        inner,
        plain,
        id,
        lease,
    } = two_held(backend, timing).await;
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
    let api = racing_with(&inner, takes_position_2, When::Before, other, timing);
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

/// Every pool split, and compaction due at every chance (as the randomized
/// split tests run it).
fn compacting() -> Timing {
    Timing {
        compaction: Compaction {
            split_above: 0,
            hot_max: 1,
            cold_after_ms: 0,
            claim_ms: 1_000,
        },
        ..Timing::default()
    }
}

/// Runs `between` before the first compaction it is asked for goes on.
struct BeforeCompaction {
    inner: Arc<dyn PoolStore>,
    between: Mutex<Option<Between>>,
}

#[async_trait]
impl Around for BeforeCompaction {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }

    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        let between = self.between.lock().unwrap().take();
        if let Some(between) = between {
            between().await;
        }
        self.inner.compact(key, read, plan).await
    }
}

/// A take of a short lease lands; the compaction its write made due runs
/// after the lease has expired and its slot was taken by another borrow, so
/// the pool after the compaction no longer shows it. The take was granted
/// at the instant it landed: the answer is that grant, never a 409 (a 409
/// would say no slot was granted while one was, and a slot free for the
/// whole call refused).
async fn a_take_that_landed_is_granted_though_a_later_read_shows_its_slot_reused(backend: Backend) {
    let inner = backend.store().await;
    let id = pool_id();
    let plain = Arc::new(ApiClient::with_timing(
        inner.clone(),
        Limits::default(),
        compacting(),
    ));
    assert_eq!(plain.register(&id, 2).await.0, 200);
    let (status, first) = plain.borrow(&id, 3600.0, 0.0).await;
    assert_eq!(
        (status, first["position"].as_u64()),
        (200, Some(0)),
        "{first}"
    );
    let other = {
        let (plain, id) = (plain.clone(), id.clone());
        Box::new(move || {
            Box::pin(async move {
                // The short lease below ends; another borrow takes its slot.
                tokio::time::sleep(std::time::Duration::from_millis(120)).await;
                let (status, body) = plain.borrow(&id, 3600.0, 0.0).await;
                assert_eq!(
                    (status, body["position"].as_u64()),
                    (200, Some(1)),
                    "{body}"
                );
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }) as Between
    };
    let api = ApiClient::with_timing(
        Arc::new(Forward(BeforeCompaction {
            inner: inner.clone(),
            between: Mutex::new(Some(other)),
        })),
        Limits::default(),
        compacting(),
    );
    let (status, body) = api.borrow(&id, 0.05, 0.0).await;
    assert_eq!(
        (status, body["position"].as_u64()),
        (200, Some(1)),
        "its take landed: {body}"
    );
}
