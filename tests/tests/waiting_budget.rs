//! `WAITING_BUDGET`: borrows that may wait at once across the whole service.
//! Past it a borrow that would wait is answered 429 at once, in JSON, naming
//! the limit; borrows that need not wait, and other routes, are untouched;
//! passes come back when their borrows answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::Limits;
use semaphore_tests::harness::{pool_id, ApiClient, Backend};

on_both_stores!(
    workers = 4;
    past_the_budget_a_borrow_that_would_wait_gets_429_at_once,
);

async fn past_the_budget_a_borrow_that_would_wait_gets_429_at_once(backend: Backend) {
    let limits = Limits {
        waiting_budget: 2,
        ..Limits::default()
    };
    let api = Arc::new(ApiClient::new(backend.store().await, limits));
    let (full, other) = (pool_id(), pool_id());
    api.register(&full, 1).await;
    api.register(&other, 1).await;
    let (_, held) = api.borrow(&full, 30.0, 0.0).await;
    let holder = held["lease"].as_str().expect("lease").to_string();
    let (_, held_other) = api.borrow(&other, 30.0, 0.0).await;
    // Two waiters take the budget.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (api, full) = (api.clone(), full.clone());
            tokio::spawn(async move { api.borrow(&full, 30.0, 4.0).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A third, on either pool, is refused at once.
    for pool in [&full, &other] {
        let started = Instant::now();
        let (status, body) = api.borrow(pool, 30.0, 4.0).await;
        assert_eq!(status, 429, "{body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("2 borrows") && error.contains("WAITING_BUDGET"),
            "{error}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    // A borrow that need not wait, or will not: no pass asked.
    let spare = pool_id();
    api.register(&spare, 1).await;
    let (status, body) = api.borrow(&spare, 30.0, 4.0).await;
    assert_eq!(status, 200, "a free slot: {body}");
    let (status, body) = api.borrow(&full, 30.0, 0.0).await;
    assert_eq!(status, 409, "wait 0 does not wait: {body}");
    // The holder returns: the head waiter is granted and gives its pass back
    // when it answers; the pass is there for the next waiter.
    api.return_lease(&full, &holder).await;
    let mut granted = None;
    for waiter in waiters {
        let (status, body) = waiter.await.expect("waiter");
        if status == 200 {
            granted = body["lease"].as_str().map(str::to_string);
        } else {
            assert_eq!(status, 409, "the other waits out its 4 s: {body}");
        }
    }
    let granted = granted.expect("one waiter got the slot");
    let other_lease = held_other["lease"].as_str().expect("lease").to_string();
    let waiting = {
        let (api, other) = (api.clone(), other.clone());
        tokio::spawn(async move { api.borrow(&other, 30.0, 4.0).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.return_lease(&other, &other_lease).await;
    let (status, body) = waiting.await.expect("waiter");
    assert_eq!(status, 200, "every pass was given back: {body}");
    api.return_lease(&full, &granted).await;
}
