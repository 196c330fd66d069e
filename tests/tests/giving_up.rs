//! A return of a borrow's lease id while the borrow runs gives the borrow
//! up (API.md, "Giving up a wait"): nothing stays held for that id, even
//! when the borrow's own take or join landed first and the answer to it
//! already shows the return (a compaction after a write hands back the item
//! as the compaction left it, with others' writes in between). And a grant
//! that answer already shows ended is still answered.

use std::sync::Arc;

use async_trait::async_trait;
use semaphore::domain::{Change, Update};
use semaphore::keys::PoolKey;
use semaphore::store::{PoolStore, Record, StoreError, Updated};
use semaphore::Limits;
use semaphore_tests::forward::{Around, Forward};
use semaphore_tests::harness::{pool_id, ApiClient, Backend};
use serde_json::Value;
use tokio::sync::{Mutex, Notify};

/// Once a write with a take or a join lands, does `meanwhile` through
/// another client, then answers the write as landed with the item as that
/// left it.
struct ReturnedMeanwhile {
    inner: Arc<dyn PoolStore>,
    pool: String,
    meanwhile: Meanwhile,
    seen: Arc<Seen>,
}

/// What happens between a borrow's write landing and its answer.
#[derive(Clone)]
enum Meanwhile {
    /// A return of this lease id (the borrow's own: giving it up).
    Return(String),
    /// A return of this other lease, which hands its slot to the waiting
    /// borrow; then the borrow's short grant runs out, and another borrow
    /// takes the slot.
    ServedExpiredReused(String),
}

/// What [`ReturnedMeanwhile`] did, for the test to read.
#[derive(Default)]
struct Seen {
    /// The return's answer, once sent.
    returned: Mutex<Option<Value>>,
    done: Notify,
}

impl ReturnedMeanwhile {
    /// A client whose store does `meanwhile` on pool `id`.
    fn client(
        inner: &Arc<dyn PoolStore>,
        id: &str,
        meanwhile: Meanwhile,
    ) -> (ApiClient, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let store = ReturnedMeanwhile {
            inner: inner.clone(),
            pool: id.to_string(),
            meanwhile,
            seen: seen.clone(),
        };
        (
            ApiClient::new(Arc::new(Forward(store)), Limits::default()),
            seen,
        )
    }
}

#[async_trait]
impl Around for ReturnedMeanwhile {
    fn inner(&self) -> &dyn PoolStore {
        &*self.inner
    }
    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let updated = self.inner.update(key, read, update).await?;
        let placing = update
            .changes
            .iter()
            .any(|c| matches!(c, Change::Take { .. } | Change::Append(_)));
        let mut returned = self.seen.returned.lock().await;
        if !placing || returned.is_some() || !matches!(updated, Updated::Written(_)) {
            return Ok(updated);
        }
        let client = ApiClient::new(self.inner.clone(), Limits::default());
        let lease = match &self.meanwhile {
            Meanwhile::Return(lease) | Meanwhile::ServedExpiredReused(lease) => lease,
        };
        let (status, body) = client.return_lease(&self.pool, lease).await;
        assert_eq!(status, 200, "{body}");
        *returned = Some(body);
        if let Meanwhile::ServedExpiredReused(_) = self.meanwhile {
            tokio::time::sleep(std::time::Duration::from_millis(SHORT_TTL_MS + 50)).await;
            let (status, body) = client.borrow(&self.pool, 30.0, 0.0).await;
            assert_eq!(status, 200, "the expired slot is taken: {body}");
        }
        self.seen.done.notify_one();
        match self.inner.load(key).await? {
            Some(now) => Ok(Updated::Written(now)),
            None => Ok(Updated::Gone),
        }
    }
}

/// A pool of count 1 on `backend`'s store, a client on that store, and a
/// lease id for the borrow under test; with `held`, the slot held by
/// another lease (its id returned too).
struct Setup {
    inner: Arc<dyn PoolStore>,
    plain: ApiClient,
    id: String,
    lease: String,
    holder: Option<String>,
}

impl Setup {
    async fn new(backend: Backend, held: bool) -> Self {
        let inner = backend.store().await;
        let plain = ApiClient::new(inner.clone(), Limits::default());
        let id = pool_id();
        assert_eq!(plain.register(&id, 1).await.0, 200);
        let mut holder = None;
        if held {
            let (status, body) = plain.borrow(&id, 30.0, 0.0).await;
            assert_eq!(status, 200, "{body}");
            holder = body["lease"].as_str().map(str::to_string);
        }
        Setup {
            inner,
            plain,
            id,
            lease: uuid::Uuid::new_v4().to_string(),
            holder,
        }
    }
}

fn borrow_body(lease: &str) -> String {
    format!(r#"{{"ttl":30,"wait":5,"lease":"{lease}"}}"#)
}

/// A take that landed, then was returned: the borrow answers 409 and takes
/// no other slot (before, it joined the queue and was handed the slot the
/// return freed).
async fn a_take_returned_before_its_answer_is_given_up(backend: Backend) {
    let Setup {
        inner,
        plain,
        id,
        lease,
        ..
    } = Setup::new(backend, false).await;
    let (api, seen) = ReturnedMeanwhile::client(&inner, &id, Meanwhile::Return(lease.clone()));
    let (status, body) = api
        .call("POST", &format!("/l/{id}/borrow"), &borrow_body(&lease))
        .await;
    let returned = seen.returned.lock().await.clone();
    assert_eq!(returned, Some(serde_json::json!({"returned": true})));
    assert_eq!(
        status, 409,
        "given up, it must not be granted again: {body}"
    );
    let state = plain.inspect(&id).await.1;
    assert_eq!(
        (&state["in_use"], &state["waiting"]),
        (&0.into(), &0.into()),
        "{state}"
    );
}

/// A join that landed, then was cancelled: the borrow answers 409 and does
/// not join again, so the slot freed later goes to nobody.
async fn a_join_cancelled_before_its_answer_is_given_up(backend: Backend) {
    let Setup {
        inner,
        plain,
        id,
        lease,
        holder,
    } = Setup::new(backend, true).await;
    let (api, seen) = ReturnedMeanwhile::client(&inner, &id, Meanwhile::Return(lease.clone()));
    let waiter = {
        let (id, lease) = (id.clone(), lease.clone());
        tokio::spawn(async move {
            api.call("POST", &format!("/l/{id}/borrow"), &borrow_body(&lease))
                .await
        })
    };
    seen.done.notified().await;
    let returned = seen.returned.lock().await.clone();
    assert_eq!(returned, Some(serde_json::json!({"returned": false})));
    // The slot frees while the borrow may still wait: it must not get it.
    let holder = holder.expect("held");
    assert_eq!(plain.return_lease(&id, &holder).await.1["returned"], true);
    let (status, body) = waiter.await.unwrap();
    assert_eq!(status, 409, "given up, it must not be granted: {body}");
    let state = plain.inspect(&id).await.1;
    assert_eq!(
        (&state["in_use"], &state["waiting"]),
        (&0.into(), &0.into()),
        "{state}"
    );
}

/// The borrow's grant in [`Meanwhile::ServedExpiredReused`], ms.
const SHORT_TTL_MS: u64 = 60;

/// A join that landed, then was handed a slot whose short grant ran out and
/// was reused, all before the borrow read again: the grant is answered (a
/// waiter never answers 409 with a slot granted to it), not refused.
async fn a_join_served_before_its_answer_still_answers_its_grant(backend: Backend) {
    let Setup {
        inner,
        id,
        lease,
        holder,
        ..
    } = Setup::new(backend, true).await;
    let served = Meanwhile::ServedExpiredReused(holder.expect("held"));
    let (api, seen) = ReturnedMeanwhile::client(&inner, &id, served);
    let body = format!(
        r#"{{"ttl":{},"wait":5,"lease":"{lease}"}}"#,
        SHORT_TTL_MS as f64 / 1000.0
    );
    let (status, granted) = api.call("POST", &format!("/l/{id}/borrow"), &body).await;
    let returned = seen.returned.lock().await.clone();
    assert_eq!(returned, Some(serde_json::json!({"returned": true})));
    assert_eq!(status, 200, "its grant, though ended: {granted}");
    assert_eq!(granted["lease"], Value::from(lease));
    assert_eq!(granted["position"], 0);
}

on_both_stores!(
    a_take_returned_before_its_answer_is_given_up,
    a_join_cancelled_before_its_answer_is_given_up,
    a_join_served_before_its_answer_still_answers_its_grant,
);
