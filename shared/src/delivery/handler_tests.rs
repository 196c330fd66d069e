//! The dispatcher function's tests: batches of both sources, pools side by side,
//! wakes armed and sent, failures reported per record.
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::json;
use tokio::sync::watch;

use super::*;
use crate::callback::CallbackPolicy;
use crate::delivery::test_support::{enqueue_request, receiver, Sent};
use crate::domain::{Callback, TicketState};
use crate::keys::{LeaseId, PoolId};
use crate::service::{BorrowRequest, Budget, EnqueueRequest};
use crate::store::MemoryStore;
use crate::{Limits, Service};

struct Fixture {
    store: Arc<MemoryStore>,
    service: Arc<Service>,
    sent: Arc<Sent>,
    handler: Handler,
}

fn fixture() -> Fixture {
    let store = Arc::new(MemoryStore::new());
    let policy = CallbackPolicy { allow_local: true };
    let service = Arc::new(
        Service::new(store.clone(), Limits::default())
            .with_tickets(store.clone())
            .with_callback_policy(policy),
    );
    let caller = Caller::new(policy, Duration::from_secs(1)).unwrap();
    let dispatcher = Arc::new(Dispatcher::new(service.clone(), caller));
    let sent = Arc::new(Sent::default());
    let handler = Handler::new(dispatcher, store.clone(), sent.clone());
    Fixture {
        store,
        service,
        sent,
        handler,
    }
}

/// A pool of one slot held for 16 minutes and an async ticket waiting a
/// day: its key and the wake its step wants (the lease's expiry, past
/// SQS's 15 minutes).
async fn held_pool_with_a_ticket(f: &Fixture) -> (PoolKey, u64) {
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let borrow = BorrowRequest {
        ttl_ms: 960_000,
        wait_ms: 0,
        lease: LeaseId::new_random(),
    };
    let held = f.service.borrow(id, borrow, budget).await.unwrap();
    let enqueue = EnqueueRequest {
        ttl_ms: 30_000,
        wait_ms: Some(86_400_000),
        lease: LeaseId::new_random(),
        callback: Callback {
            url: "http://127.0.0.1:9/hook".into(),
            token: "t".into(),
        },
    };
    f.service.enqueue(id, enqueue, budget).await.unwrap();
    let step = f.service.dispatch_step(&id.key(), &[], budget).await;
    assert_eq!(step.unwrap().wake_ms, Some(held.expires_at_ms));
    (id.key(), held.expires_at_ms)
}

fn wakes(messages: &[(&str, Wake)]) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|(id, wake)| {
            json!({"messageId": id, "receiptHandle": "r", "body": wake.to_body(),
                "attributes": {}, "messageAttributes": {}, "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:wake",
                "awsRegion": "us-east-1"})
        })
        .collect();
    json!({ "Records": records })
}

fn wake(key: PoolKey, at_ms: u64) -> Wake {
    Wake {
        key,
        at_ms: Some(at_ms),
    }
}

#[tokio::test]
async fn a_wake_arriving_before_its_time_arms_the_rest() {
    let f = fixture();
    let (key, at) = held_pool_with_a_ticket(&f).await;
    // As the first arm left it: `wk` = at, its message capped at 900 s.
    assert!(f.store.arm_wake(&key, at, now_ms(), &[]).await.unwrap());
    let response = f
        .handler
        .handle_batch(wakes(&[("m1", wake(key, at))]), None)
        .await
        .unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(f.sent.taken(), [(wake(key, at), MAX_DELAY)], "re-armed");
    assert_eq!(f.store.pending_wake(&key), Some(at));
}

#[tokio::test]
async fn a_lowered_cap_sends_wakes_sooner() {
    let f = fixture();
    let (key, at) = held_pool_with_a_ticket(&f).await;
    let handler = f.handler.with_max_delay(Duration::from_secs(60));
    let stream = json!({"Records": [{"eventID": "1", "eventName": "MODIFY",
        "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
        "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode(key.0)}, "sk": {"B": "AA=="}},
            "SequenceNumber": "1", "SizeBytes": 30}}]});
    let response = handler.handle_batch(stream, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(f.sent.taken(), [(wake(key, at), Duration::from_secs(60))]);
}

#[tokio::test]
async fn a_stray_wake_arms_nothing_while_another_is_pending() {
    let f = fixture();
    let (key, at) = held_pool_with_a_ticket(&f).await;
    assert!(f.store.arm_wake(&key, at, now_ms(), &[]).await.unwrap());
    // A later wake the pending one replaced, arriving early.
    let stray = wake(key, at + 60_000);
    let response = f
        .handler
        .handle_batch(wakes(&[("m1", stray)]), None)
        .await
        .unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(f.sent.taken(), []);
    assert_eq!(f.store.pending_wake(&key), Some(at));
}

#[tokio::test]
async fn an_early_wake_that_arms_none_is_cleared() {
    let f = fixture();
    let id = PoolId(uuid::Uuid::new_v4());
    f.service
        .register(id, 1, &mut Budget::new(None))
        .await
        .unwrap();
    let at = now_ms() + 1_200_000;
    assert!(f
        .store
        .arm_wake(&id.key(), at, now_ms(), &[])
        .await
        .unwrap());
    // The pool has no async work left: nothing to wake it for.
    let batch = wakes(&[("m1", wake(id.key(), at))]);
    let response = f.handler.handle_batch(batch, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(f.sent.taken(), []);
    assert_eq!(
        f.store.pending_wake(&id.key()),
        None,
        "it would hold off later wakes"
    );
}

#[tokio::test]
async fn one_pools_failure_fails_its_records_alone() {
    let f = fixture();
    let (failing, _) = held_pool_with_a_ticket(&f).await;
    *f.sent.fail_for.lock().unwrap() = Some(failing);
    let (fine, at) = held_pool_with_a_ticket(&f).await;
    let stream = |seq: &str, key: &PoolKey| {
        json!({"eventID": seq, "eventName": "MODIFY", "eventSource": "aws:dynamodb",
            "eventVersion": "1.1", "awsRegion": "us-east-1",
            "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode(key.0)}, "sk": {"B": "AA=="}},
                "SequenceNumber": seq, "SizeBytes": 30, "StreamViewType": "NEW_IMAGE"}})
    };
    let mut poison = stream("4", &fine);
    poison["dynamodb"]["Keys"]["pk"]["B"] = json!("AQID");
    let batch = json!({"Records": [
        stream("1", &failing), stream("2", &fine), stream("3", &failing), poison,
    ]});
    let response = f.handler.handle_batch(batch, None).await.unwrap();
    assert_eq!(response.ids(), ["4", "1", "3"]);
    assert_eq!(f.sent.taken(), [(wake(fine, at), MAX_DELAY)]);
    // The unsent wake is not left pending: the retry arms it again.
    assert_eq!(f.store.pending_wake(&failing), None);
    assert_eq!(f.store.pending_wake(&fine), Some(at));
}

/// A pool of one free slot and an async ticket calling back `url`: the
/// ticket's lease id (its step grants it at once).
async fn free_pool_with_a_ticket(f: &Fixture, id: PoolId, url: String) -> LeaseId {
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let lease = LeaseId::new_random();
    let enqueue = enqueue_request(lease, url);
    f.service.enqueue(id, enqueue, budget).await.unwrap();
    lease
}

async fn state(f: &Fixture, id: PoolId, lease: LeaseId) -> TicketState {
    let budget = &mut Budget::new(None);
    f.service
        .ticket(id, lease, budget)
        .await
        .unwrap()
        .item
        .state
}

fn now_wake(key: PoolKey) -> Wake {
    Wake { key, at_ms: None }
}

#[tokio::test]
async fn a_hanging_receiver_holds_up_no_other_pool() {
    let f = fixture();
    let (release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let mut ids = [PoolId(uuid::Uuid::new_v4()), PoolId(uuid::Uuid::new_v4())];
    // The hanging pool first in the batch's order: handled one after the
    // other, the pools would deliver the second only after it.
    ids.sort_by_key(|id| id.key().0);
    let [hanging, fine] = ids;
    let stuck = free_pool_with_a_ticket(&f, hanging, format!("http://{addr}/hang")).await;
    let taken = free_pool_with_a_ticket(&f, fine, format!("http://{addr}/ok")).await;
    let batch = wakes(&[
        ("m1", now_wake(hanging.key())),
        ("m2", now_wake(fine.key())),
    ]);
    let handler = f.handler.clone();
    let running = tokio::spawn(async move { handler.handle_batch(batch, None).await });

    // Bounded only so that a regression fails instead of hanging: the
    // hanging delivery lasts its lease's 30 s.
    let mut paths = Vec::new();
    while !paths.iter().any(|p| p == "/ok") {
        let path = tokio::time::timeout(Duration::from_secs(20), arrived.recv()).await;
        paths.push(path.expect("the other pool's callback came").unwrap());
    }
    assert!(paths.iter().any(|p| p == "/hang"), "under way: {paths:?}");
    assert!(!running.is_finished());
    assert!(matches!(
        state(&f, hanging, stuck).await,
        TicketState::Granted(_)
    ));

    release.send(true).unwrap();
    let response = running.await.unwrap().unwrap();
    assert_eq!(response, BatchResponse::default());
    for (id, lease) in [(hanging, stuck), (fine, taken)] {
        let state = state(&f, id, lease).await;
        assert!(matches!(state, TicketState::Delivered { .. }), "{state:?}");
    }
}

/// A delivery that fails returns its lease, which hands the slot to the
/// next ticket: the wake's invocation steps again and delivers that one
/// too (no other write would wake the pool here: no stream in this test).
#[tokio::test]
async fn a_failed_delivery_has_its_invocation_step_again() {
    let f = fixture();
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let refused = free_pool_with_a_ticket(&f, id, format!("http://{addr}/refuse")).await;
    let next = LeaseId::new_random();
    let enqueue = enqueue_request(next, format!("http://{addr}/ok"));
    let budget = &mut Budget::new(None);
    f.service.enqueue(id, enqueue, budget).await.unwrap();
    let batch = wakes(&[("m1", now_wake(id.key()))]);
    let response = f.handler.handle_batch(batch, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    assert!(matches!(
        state(&f, id, refused).await,
        TicketState::Failed { .. }
    ));
    let state = state(&f, id, next).await;
    assert!(matches!(state, TicketState::Delivered { .. }), "{state:?}");
    assert_eq!(arrived.recv().await.as_deref(), Some("/refuse"));
    assert_eq!(arrived.recv().await.as_deref(), Some("/ok"));
}

#[tokio::test]
async fn a_stream_batch_hands_its_deliveries_to_the_queue() {
    let f = fixture();
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let lease = free_pool_with_a_ticket(&f, id, format!("http://{addr}/ok")).await;
    let key = id.key();
    let stream = json!({"Records": [{"eventID": "1", "eventName": "MODIFY",
        "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
        "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode(key.0)}, "sk": {"B": "AA=="}},
            "SequenceNumber": "1", "SizeBytes": 30}}]});
    let response = f.handler.handle_batch(stream, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    // Granted (the step recorded it), delivered by nobody yet: the
    // wake without delay hands it on, after the pool's armed wake.
    assert!(matches!(
        state(&f, id, lease).await,
        TicketState::Granted(_)
    ));
    assert!(arrived.try_recv().is_err(), "the stream batch delivered");
    // Nor claimed it: the wake's invocation must not wait for a lapse.
    let report = f.service.ticket(id, lease, &mut Budget::new(None)).await;
    assert_eq!(report.unwrap().item.claim, None);
    let sent = f.sent.taken();
    assert_eq!(
        sent.last(),
        Some(&(now_wake(key), Duration::ZERO)),
        "{sent:?}"
    );
    assert!(sent[..sent.len() - 1]
        .iter()
        .all(|(w, _)| w.at_ms.is_some()));

    // The wake's invocation delivers it (nothing of it is left marked
    // under way by the stream's).
    let batch = wakes(&[("m1", now_wake(key))]);
    let response = f.handler.handle_batch(batch, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    assert_eq!(arrived.recv().await.as_deref(), Some("/ok"));
    let state = state(&f, id, lease).await;
    assert!(matches!(state, TicketState::Delivered { .. }), "{state:?}");
}

#[tokio::test]
async fn a_stream_batch_that_cannot_reach_the_queue_fails_and_its_retry_hands_on() {
    let f = fixture();
    let id = PoolId(uuid::Uuid::new_v4());
    let lease = free_pool_with_a_ticket(&f, id, "http://127.0.0.1:9/hook".into()).await;
    *f.sent.fail_for.lock().unwrap() = Some(id.key());
    let stream = json!({"Records": [{"eventID": "1", "eventName": "MODIFY",
        "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
        "dynamodb": {"Keys": {"pk": {"B": STANDARD.encode(id.key().0)}, "sk": {"B": "AA=="}},
            "SequenceNumber": "7", "SizeBytes": 30}}]});
    let response = f.handler.handle_batch(stream.clone(), None).await.unwrap();
    assert_eq!(response.ids(), ["7"], "retried by the stream");
    // The retry hands on the grant recorded the first time.
    *f.sent.fail_for.lock().unwrap() = None;
    let response = f.handler.handle_batch(stream, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    let sent = f.sent.taken();
    assert_eq!(
        sent.last(),
        Some(&(now_wake(id.key()), Duration::ZERO)),
        "{sent:?}"
    );
    assert!(matches!(
        state(&f, id, lease).await,
        TicketState::Granted(_)
    ));
}

#[tokio::test]
async fn a_wake_up_to_a_second_early_steps_at_its_time() {
    let f = fixture();
    let (_release, released) = watch::channel(false);
    let (addr, mut arrived) = receiver(released).await;
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let borrow = BorrowRequest {
        ttl_ms: 900,
        wait_ms: 0,
        lease: LeaseId::new_random(),
    };
    let held = f.service.borrow(id, borrow, budget).await.unwrap();
    let lease = LeaseId::new_random();
    let enqueue = enqueue_request(lease, format!("http://{addr}/ok"));
    f.service.enqueue(id, enqueue, budget).await.unwrap();
    let step = f.service.dispatch_step(&id.key(), &[], budget).await;
    assert_eq!(step.unwrap().wake_ms, Some(held.expires_at_ms));
    assert!(now_ms() < held.expires_at_ms, "the wake is early");

    let batch = wakes(&[("m1", wake(id.key(), held.expires_at_ms))]);
    let response = f.handler.handle_batch(batch, None).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    // Granted and delivered by this wake, once the lease had expired.
    assert_eq!(arrived.try_recv().ok().as_deref(), Some("/ok"));
    match state(&f, id, lease).await {
        TicketState::Delivered { grant, .. } => {
            assert!(grant.granted_ms >= held.expires_at_ms)
        }
        other => panic!("{other:?}"),
    }
    let sent = f.sent.taken();
    assert!(
        sent.iter()
            .all(|(w, _)| w.at_ms != Some(held.expires_at_ms)),
        "{sent:?}"
    );
}

#[tokio::test]
async fn out_of_time_it_delivers_nothing_and_wakes_at_once() {
    let f = fixture();
    let id = PoolId(uuid::Uuid::new_v4());
    let budget = &mut Budget::new(None);
    f.service.register(id, 1, budget).await.unwrap();
    let enqueue = enqueue_request(LeaseId::new_random(), "http://127.0.0.1:9/hook".into());
    f.service.enqueue(id, enqueue, budget).await.unwrap();
    let soon = Some(Instant::now() + Duration::from_secs(5));
    let before = now_ms();
    let batch = wakes(&[("m1", wake(id.key(), before))]);
    let response = f.handler.handle_batch(batch, soon).await.unwrap();
    assert_eq!(response, BatchResponse::default());
    // The grant's lease expiry first, then a wake at once that replaces
    // it (the first one's message is left queued: a stray).
    let sent = f.sent.taken();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let (again, delay) = &sent[1];
    let at = again.at_ms.expect("a time");
    assert!(at >= before && at <= now_ms());
    assert_eq!(*delay, Duration::ZERO);
    assert_eq!(f.store.pending_wake(&id.key()), Some(at));
}
