//! Async mode under a random mix, on both stores, with two dispatchers over
//! the one store (as a stream batch and a wake can step a pool at once in
//! AWS) and the requests delivering their own writes' grants (as the route
//! functions do): sync borrowers and async tickets on one pool, receivers that take
//! their grant, answer slowly, answer too late (after the attempt's timeout:
//! the retry is a duplicate, answered 2xx as docs/API.md tells receivers to),
//! fail (5xx), refuse (410) or hang, and tickets cancelled at random. Then:
//! every ticket ended, in one final state; no two holders (a sync borrower
//! between its answer and its return, a receiver from the callback it took
//! until its return) ever shared a position or held more than `count` slots
//! at once, so the service never took a grant back from a receiver that
//! holds it; no two attempts to deliver one ticket were ever under way at
//! once; every grant's fence is unique; no slot of a receiver that failed or
//! hung is held past the delivery bound (its lease outlives the bound).
//!
//! `SEMAPHORE_SEED=N` replays a seed's choices; `SEMAPHORE_SOAK=1` runs
//! five minutes per store instead of four seconds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use semaphore::callback::CallbackPolicy;
use semaphore::delivery::wake::{Wake, WakeOnGrant, WakeSender};
use semaphore::delivery::{Caller, DeliverOnGrant, Dispatcher, Local};
use semaphore::domain::TicketState;
use semaphore::keys::{LeaseId, PoolId};
use semaphore::Limits;
use semaphore_tests::harness::{pool_id, ApiClient, Backend};
use semaphore_tests::receiver::{answer, read_request};
use serde_json::json;
use tokio::net::TcpListener;

on_both_stores!(workers = 4; tickets_end_once_and_holders_never_overlap);

const COUNT: usize = 3;
/// Delivery bound of this test's dispatcher, and its per-attempt timeout.
const BOUND: Duration = Duration::from_millis(2_000);
const ATTEMPT: Duration = Duration::from_millis(300);
/// Leases outlive the bound: a slot freed within it was freed by the bound.
const TTL_S: f64 = 5.0;

/// How a receiver treats a callback (by the URL's path), weighted: half
/// take their grant at once.
const MODES: [&str; 11] = [
    "ok", "ok", "ok", "ok", "ok", "slow", "late", "late", "fail", "gone", "hang",
];

#[derive(Clone, Copy, Debug)]
struct Hold {
    position: u64,
    fence: u64,
    from: Instant,
    to: Instant,
}

#[derive(Default)]
struct Seen {
    holds: Mutex<Vec<Hold>>,
    /// Grants taken, by ticket number (its first callback; later ones are
    /// duplicates).
    delivered: Mutex<HashSet<u64>>,
    /// Each callback answered within the attempt's timeout, by ticket
    /// number: when it arrived and when it was answered.
    attempts: Mutex<HashMap<u64, Vec<(Instant, Instant)>>>,
    /// Ticket number → lease, as enqueues answered.
    leases: Mutex<HashMap<u64, String>>,
    /// Every sync borrow: its lease, and how it was answered (so that a
    /// slot left held names whose it was).
    borrows: Mutex<Vec<(String, String)>>,
}

/// The wake queue, as both dispatchers: each wake tells them at once.
struct TellBoth(semaphore::service::Watch);

#[async_trait::async_trait]
impl WakeSender for TellBoth {
    async fn send(&self, wake: &Wake, _: Duration) -> Result<(), String> {
        (self.0)(wake.key);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn tickets_end_once_and_holders_never_overlap(backend: Backend) {
    let seed = std::env::var("SEMAPHORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    eprintln!("async_random: seed {seed} (reproduce with SEMAPHORE_SEED={seed})");
    let soak = std::env::var("SEMAPHORE_SOAK").is_ok_and(|v| v == "1");
    let run_for = Duration::from_secs(if soak { 300 } else { 4 });

    let (store, tickets) = backend.stores().await;
    let policy = CallbackPolicy { allow_local: true };
    // Two dispatchers, each with its own service, both told of every change.
    let (one, two) = (Local::new(), Local::new());
    let (tell_one, tell_two) = (one.watch(), two.watch());
    let tell_both: semaphore::service::Watch = Arc::new(move |key| {
        tell_one(key);
        tell_two(key);
    });
    let routes = semaphore::Service::new(store.clone(), Limits::default())
        .with_tickets(tickets.clone())
        .with_callback_policy(policy)
        .with_watch(tell_both.clone());
    // As the route functions do: a write's grants delivered before it
    // answers, side by side with the dispatchers' steps, which a wake tells
    // of what it leaves.
    let own = Dispatcher::new(
        Arc::new(routes.clone()),
        Caller::new(policy, ATTEMPT).expect("caller"),
    )
    .with_bound(BOUND);
    let wake = WakeOnGrant::new(Arc::new(TellBoth(tell_both)));
    // Time for a retry, as the route functions leave (INLINE_BOUND).
    let hook = DeliverOnGrant::new(Arc::new(own), Some(wake)).with_bound(ATTEMPT * 3);
    let api = Arc::new(ApiClient {
        service: routes.with_on_async_grant(Arc::new(hook)),
    });
    for local in [one, two] {
        let dispatcher_service = Arc::new(
            semaphore::Service::new(store.clone(), Limits::default())
                .with_tickets(tickets.clone())
                .with_callback_policy(policy),
        );
        let caller = Caller::new(policy, ATTEMPT).expect("caller");
        local.start(Arc::new(
            Dispatcher::new(dispatcher_service, caller).with_bound(BOUND),
        ));
    }
    let pool = pool_id();
    api.register(&pool, COUNT as u32).await;
    let seen = Arc::new(Seen::default());
    let base = receiver(api.clone(), pool.clone(), seen.clone()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    // Sync borrowers.
    for i in 0..3u64 {
        let (api, pool, seen, stop) = (api.clone(), pool.clone(), seen.clone(), stop.clone());
        let mut rng = fastrand::Rng::with_seed(seed ^ i);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let lease = uuid::Uuid::new_v4().to_string();
                let body = json!({"ttl": TTL_S, "wait": 1.0, "lease": lease});
                let (status, grant) = api
                    .call("POST", &format!("/l/{pool}/borrow"), &body.to_string())
                    .await;
                lock(&seen.borrows).push((lease.clone(), format!("{status} {grant}")));
                if status != 200 {
                    assert_eq!(status, 409, "{grant}");
                    continue;
                }
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(rng.u64(5..40))).await;
                let to = Instant::now();
                api.return_lease(&pool, &lease).await;
                lock(&seen.holds).push(Hold {
                    position: grant["position"].as_u64().unwrap_or(u64::MAX),
                    fence: grant["fence"].as_u64().unwrap_or(0),
                    from,
                    to,
                });
            }
        }));
    }
    // Enqueuers, and the tickets they made: (lease, mode).
    let made: Arc<Mutex<Vec<(String, &'static str)>>> = Arc::default();
    for i in 0..2u64 {
        let (api, pool, seen, stop, made, base) = (
            api.clone(),
            pool.clone(),
            seen.clone(),
            stop.clone(),
            made.clone(),
            base.clone(),
        );
        let mut rng = fastrand::Rng::with_seed(seed ^ (100 + i));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mode = MODES[rng.usize(..MODES.len())];
                let lease = uuid::Uuid::new_v4().to_string();
                let body = json!({"ttl": TTL_S, "wait": rng.f64() * 4.0, "lease": lease,
                    "callback": {"url": format!("{base}/{mode}"), "token": "t"}});
                let (status, answer) = api
                    .call("POST", &format!("/l/{pool}/enqueue"), &body.to_string())
                    .await;
                assert_eq!(status, 202, "{answer}");
                let number = answer["ticket"].as_u64().expect("a ticket");
                lock(&seen.leases).insert(number, lease.clone());
                lock(&made).push((lease.clone(), mode));
                if rng.u8(..10) == 0 {
                    let (status, body) = api
                        .call(
                            "POST",
                            &format!("/l/{pool}/cancel"),
                            &json!({"lease": lease}).to_string(),
                        )
                        .await;
                    assert_eq!(status, 200, "{body}");
                }
                tokio::time::sleep(Duration::from_millis(rng.u64(50..250))).await;
            }
        }));
    }
    tokio::time::sleep(run_for).await;
    // A loaded machine (the whole suite at once) may have made too few
    // grants in that time for the checks below to mean much: the mix goes
    // on until enough happened, for at most 20 s more.
    let enough_by = Instant::now() + Duration::from_secs(20);
    while (lock(&seen.holds).len() < 20 || lock(&seen.delivered).len() < 3)
        && Instant::now() < enough_by
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a client task");
    }
    // Every ticket ends: its wait (≤ 3 s), then delivery within the bound.
    let key = PoolId(pool.parse().expect("uuid")).key();
    let made = lock(&made).clone();
    let deadline = Instant::now() + Duration::from_secs(4) + BOUND + Duration::from_secs(3);
    let mut ends: HashMap<&'static str, usize> = HashMap::new();
    let mut finals: HashMap<String, String> = HashMap::new();
    for (lease, mode) in &made {
        let digest = LeaseId(lease.parse().expect("uuid")).digest();
        let item = loop {
            let item = tickets
                .ticket(&key, digest)
                .await
                .expect("read")
                .expect("stored");
            if item.state.is_final() || Instant::now() > deadline {
                break item;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            item.state.is_final(),
            "{mode} ticket {} still {}",
            item.number,
            item.state.name()
        );
        match (&item.state, *mode) {
            (TicketState::Delivered { .. }, "ok" | "slow" | "late") => {}
            (TicketState::Failed { reason }, "fail" | "gone" | "hang") => {
                assert!(!reason.is_empty())
            }
            (TicketState::Cancelled | TicketState::Expired, _) => {}
            (state, mode) => panic!("a {mode} receiver's ticket {} ended {state:?}", item.number),
        }
        *ends.entry(item.state.name()).or_default() += 1;
        finals.insert(lease.clone(), format!("{} {:?}", item.number, item.state));
    }
    // Receivers that took their grant return it (hold ≤ 40 ms); those that
    // failed or hung had theirs returned within the bound. Both well before
    // the 5-s leases would end: a slot still held 2 s on was stranded (a
    // loaded machine may take longer than the 200 ms this once waited).
    let returned_by = Instant::now() + Duration::from_secs(2);
    let state = loop {
        let (_, state) = api.inspect(&pool).await;
        if state["in_use"] == 0 || Instant::now() > returned_by {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if state["in_use"] != 0 {
        let held = store
            .load(&key)
            .await
            .ok()
            .flatten()
            .map(|r| r.pool.leases())
            .unwrap_or_default();
        let whose = |digest| {
            let tickets = made.iter().map(|(l, m)| {
                let end = finals.get(l).cloned().unwrap_or_default();
                (l, format!("ticket {end}, {m} receiver"))
            });
            let borrows = lock(&seen.borrows).clone();
            let borrows = borrows
                .into_iter()
                .map(|(l, a)| (l, format!("sync borrow, {a}")));
            tickets
                .map(|(l, w)| (l.clone(), w))
                .chain(borrows)
                .find(|(l, _)| LeaseId(l.parse().expect("uuid")).digest() == digest)
                .map_or("nobody's".to_string(), |(_, w)| w)
        };
        let held: Vec<String> = held
            .iter()
            .map(|l| format!("fence {} at {}: {}", l.fence, l.position, whose(l.digest)))
            .collect();
        panic!("a slot is still held: {state}; {held:?}");
    }

    let holds = lock(&seen.holds).clone();
    let delivered = lock(&seen.delivered).clone();
    // At most one attempt in flight per ticket, across both dispatchers.
    for (ticket, attempts) in lock(&seen.attempts).iter_mut() {
        attempts.sort();
        for pair in attempts.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "ticket {ticket}: two attempts at once: {pair:?}"
            );
        }
    }
    let mut fences = HashSet::new();
    for hold in &holds {
        assert!((hold.position as usize) < COUNT, "{hold:?}");
        assert!(
            fences.insert(hold.fence),
            "fence {} granted twice",
            hold.fence
        );
    }
    for (i, a) in holds.iter().enumerate() {
        let at_once = holds
            .iter()
            .filter(|b| b.from <= a.from && a.from < b.to)
            .count();
        assert!(at_once <= COUNT, "{at_once} holders at once");
        for b in &holds[i + 1..] {
            assert!(
                a.position != b.position || a.to <= b.from || b.to <= a.from,
                "position {} held twice at once: {a:?} {b:?}",
                a.position
            );
        }
    }
    eprintln!(
        "async_random: {} holds ({} by receivers), {} tickets: {ends:?}",
        holds.len(),
        delivered.len(),
        made.len()
    );
    assert!(
        delivered.len() >= 3 && holds.len() >= 20,
        "too little happened"
    );
}

/// The receivers: `{base}/{mode}`. `ok` and `slow` (answers after 150 ms)
/// take their grant, hold it, and return it; `fail` answers 500, `gone` 410,
/// `hang` never answers in time.
async fn receiver(api: Arc<ApiClient>, pool: String, seen: Arc<Seen>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (api, pool, seen) = (api.clone(), pool.clone(), seen.clone());
            tokio::spawn(async move {
                let Some(delivered) = read_request(&mut stream).await else {
                    return;
                };
                let (path, body) = (delivered.path, delivered.body);
                let ticket = body["ticket"].as_u64().unwrap_or(u64::MAX);
                let from = Instant::now();
                let mode = path.trim_start_matches('/').to_string();
                let status = match mode.as_str() {
                    "ok" | "slow" | "late" => 200,
                    "fail" => 500,
                    "gone" => 410,
                    _ => {
                        tokio::time::sleep(ATTEMPT * 4).await;
                        return;
                    }
                };
                // A duplicate of a grant taken is answered 2xx at once (as
                // docs/API.md says), never taken twice.
                let first = status == 200 && lock(&seen.delivered).insert(ticket);
                match mode.as_str() {
                    "slow" => tokio::time::sleep(ATTEMPT / 2).await,
                    // Taken, but answered after the attempt's timeout.
                    "late" if first => tokio::time::sleep(ATTEMPT * 3 / 2).await,
                    _ => {}
                }
                let answered = answer(&mut stream, status).await;
                if mode != "late" || !first {
                    lock(&seen.attempts)
                        .entry(ticket)
                        .or_default()
                        .push((from, Instant::now()));
                }
                if !first || (mode != "late" && !answered) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                let lease = loop {
                    if let Some(lease) = lock(&seen.leases).get(&ticket).cloned() {
                        break lease;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                };
                let to = Instant::now();
                api.return_lease(&pool, &lease).await;
                lock(&seen.holds).push(Hold {
                    position: body["position"].as_u64().unwrap_or(u64::MAX),
                    fence: body["fence"].as_u64().unwrap_or(0),
                    from,
                    to,
                });
            });
        }
    });
    base
}
