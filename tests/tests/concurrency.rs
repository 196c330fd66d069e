//! Many borrowers on one pool, spread over several independent "Lambda
//! containers" (each its own service and DynamoDB client), never over-issue
//! and never share a position. Against DynamoDB Local.

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::Limits;
use semaphore_tests::harness::{dynamodb_store, pool_id, ApiClient};

const CONTAINERS: usize = 4;

async fn containers() -> Vec<Arc<ApiClient>> {
    let mut out = Vec::new();
    for _ in 0..CONTAINERS {
        out.push(Arc::new(ApiClient::new(
            dynamodb_store().await,
            Limits::default(),
        )));
    }
    out
}

/// 48 simultaneous one-shot borrows on count 7: exactly 7 win, on 7 distinct
/// positions, and the rest get 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_borrows_grant_exactly_count() {
    let apis = containers().await;
    let id = pool_id();
    apis[0].register(&id, 7).await;
    let tasks: Vec<_> = (0..48)
        .map(|i| {
            let (api, id) = (apis[i % CONTAINERS].clone(), id.clone());
            tokio::spawn(async move { api.borrow(&id, 60.0, 0.0).await })
        })
        .collect();
    let mut positions = Vec::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            (200, body) => positions.push(body["position"].as_u64().unwrap()),
            (409, _) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    positions.sort_unstable();
    assert_eq!(positions, (0..7).collect::<Vec<_>>());
    assert_eq!(refused, 41);
    assert_eq!(apis[1].inspect(&id).await.1["in_use"], 7);
}

/// One held lease, as the client saw it: from the borrow's response until the
/// return was sent. Over that span the server surely counted it live.
struct Hold {
    position: u64,
    from: Instant,
    to: Instant,
}

/// 24 workers cycle borrow (waiting) → hold → return on count 3 for a while.
/// No position is ever surely held twice at once, and never more than 3 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cycling_borrowers_never_share_a_position() {
    const COUNT: usize = 3;
    let apis = containers().await;
    let id = pool_id();
    apis[0].register(&id, COUNT as u32).await;
    let run_until = Instant::now() + Duration::from_secs(4);
    let workers: Vec<_> = (0..24)
        .map(|i| {
            let (api, id) = (apis[i % CONTAINERS].clone(), id.clone());
            tokio::spawn(async move {
                let mut holds = Vec::new();
                while Instant::now() < run_until {
                    let (status, body) = api.borrow(&id, 30.0, 2.0).await;
                    if status == 409 {
                        continue;
                    }
                    assert_eq!(status, 200, "{body}");
                    let from = Instant::now();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let to = Instant::now();
                    let lease = body["lease"].as_str().unwrap();
                    let (status, returned) = api.return_lease(&id, lease).await;
                    assert_eq!(
                        (status, &returned["returned"]),
                        (200, &serde_json::json!(true))
                    );
                    holds.push(Hold {
                        position: body["position"].as_u64().unwrap(),
                        from,
                        to,
                    });
                }
                holds
            })
        })
        .collect();
    let mut holds = Vec::new();
    for worker in workers {
        holds.extend(worker.await.unwrap());
    }
    assert!(holds.len() >= 30, "only {} cycles completed", holds.len());
    for (i, a) in holds.iter().enumerate() {
        assert!((a.position as usize) < COUNT);
        // Held at the instant `a` began (counting pairs that overlap `a`
        // would count a long hold's successive neighbours as simultaneous).
        let at_once = holds
            .iter()
            .filter(|b| b.from <= a.from && a.from < b.to)
            .count();
        assert!(at_once <= COUNT, "{at_once} leases held at once");
        for b in &holds[i + 1..] {
            assert!(
                a.position != b.position || a.to <= b.from || b.to <= a.from,
                "position {} held twice at once",
                a.position
            );
        }
    }
    assert_eq!(apis[0].inspect(&id).await.1["in_use"], 0);
}
