//! Async mode under a burst (issue #17's targets): N enqueues on a pool of
//! count C, each callback's receiver holding its slot H ms, then returning
//! it. Prints whether every ticket was delivered once and in ticket order,
//! the time to drain against the ideal (N × H / C), the callback delay after
//! the return that freed its slot (p50, p99), and DynamoDB's requests and
//! consumed capacity per ticket.
//!
//!   cargo run --release -p bench --bin burst -- [--tickets N] [--count C] [--hold-ms H]
//!                                               [--dynamodb URL]
//!
//! Without --dynamodb it runs on the in-memory store. Everything runs in this
//! process: the service, the dispatcher (local-api's: on DynamoDB it follows
//! the table's stream), and a loopback receiver.
//!
//!   cargo run -p bench --bin burst -- --api URL [--tickets N] …
//!
//! runs the same burst against a served API instead (`tests/aws-local --bench --burst N`
//! runs it against the deployed shape, with that stack's own request counts). The
//! receiver stays in this process and must be reachable from the API's dispatcher (a
//! local one: the API must allow loopback callbacks).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use semaphore::api;
use semaphore::callback::CallbackPolicy;
use semaphore::delivery::{Caller, Dispatcher, Local};
use semaphore::service::{Budget, Limits, Service};
use semaphore::store::{dynamodb, DynamoDbStore, MemoryStore, PoolStore, TicketStore};
use semaphore_tests::counting::{on_the_wire, Counters};
use semaphore_tests::receiver::{answer, read_request};
use serde_json::{json, Value};
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(name = "burst")]
struct Args {
    /// Tickets enqueued at once.
    #[arg(long, default_value_t = 10_000)]
    tickets: usize,
    /// The pool's count.
    #[arg(long, default_value_t = 10)]
    count: u16,
    /// How long each receiver holds its slot before returning it, ms.
    #[arg(long = "hold-ms", default_value_t = 50)]
    hold_ms: u64,
    /// Enqueue requests in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// A DynamoDB (Local) endpoint; without it, the in-memory store.
    #[arg(long, value_name = "URL", conflicts_with = "api")]
    dynamodb: Option<String>,
    /// A served API (http://host:port) to burst instead of an in-process service.
    #[arg(long, value_name = "URL")]
    api: Option<String>,
}

/// Where the burst's requests go.
#[derive(Clone)]
enum Target {
    InProcess(Arc<Service>),
    Http(reqwest::Client, String),
}

/// What the receiver saw of one delivery.
#[derive(Clone, Copy, Debug)]
struct Got {
    ticket: u64,
    fence: u64,
    at: Instant,
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let counters = Arc::new(Counters::default());
    let capacity = Arc::new(AtomicU64::new(0));
    let (target, name) = match &args.api {
        Some(url) => (
            Target::Http(reqwest::Client::new(), url.trim_end_matches('/').to_owned()),
            "served API",
        ),
        None => in_process(&args, &counters, &capacity).await?,
    };

    let pool = uuid::Uuid::new_v4().to_string();
    let (status, body) = call(
        &target,
        "PUT",
        &format!("/l/{pool}"),
        json!({"count": args.count}),
    )
    .await;
    if status != 200 {
        return Err(format!("register: {status} {body}"));
    }

    // The receiver: answers at once, holds the slot, returns it.
    let leases: Arc<Mutex<HashMap<u64, String>>> = Arc::default();
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let returned: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}/granted",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    {
        let (target, pool, leases, got, returned) = (
            target.clone(),
            pool.clone(),
            leases.clone(),
            got.clone(),
            returned.clone(),
        );
        let hold = Duration::from_millis(args.hold_ms);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let (target, pool, leases, got, returned) = (
                    target.clone(),
                    pool.clone(),
                    leases.clone(),
                    got.clone(),
                    returned.clone(),
                );
                tokio::spawn(async move {
                    let Some(body) = read_request(&mut stream).await.map(|d| d.body) else {
                        return;
                    };
                    let at = Instant::now();
                    answer(&mut stream, 200).await;
                    let ticket = body["ticket"].as_u64().unwrap_or(u64::MAX);
                    let fence = body["fence"].as_u64().unwrap_or(0);
                    got.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Got { ticket, fence, at });
                    tokio::time::sleep(hold).await;
                    // Its lease UUID: the enqueue's answer may still be on its way.
                    let lease = loop {
                        if let Some(lease) = leases
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(&ticket)
                            .cloned()
                        {
                            break lease;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    };
                    returned
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Instant::now());
                    call(
                        &target,
                        "POST",
                        &format!("/l/{pool}/return"),
                        json!({"lease": lease}),
                    )
                    .await;
                });
            }
        });
    }

    eprintln!(
        "burst: {name}: {} tickets on count {}, {} ms holds",
        args.tickets, args.count, args.hold_ms
    );
    let before = counters.wire();
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    // When each ticket's enqueue was answered, by ticket number.
    let answered: Arc<Mutex<Vec<(u64, Duration)>>> = Arc::default();
    let enqueuers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (target, pool, url, leases, next, answered) = (
                target.clone(),
                pool.clone(),
                url.clone(),
                leases.clone(),
                next.clone(),
                answered.clone(),
            );
            let total = args.tickets as u64;
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let lease = uuid::Uuid::new_v4().to_string();
                    let body = json!({"ttl": 60, "wait": 3600, "lease": lease,
                        "callback": {"url": url, "token": "t"}});
                    let (status, answer) =
                        call(&target, "POST", &format!("/l/{pool}/enqueue"), body).await;
                    if status != 202 {
                        return Err(format!("enqueue: {status} {answer}"));
                    }
                    let ticket = answer["ticket"].as_u64().unwrap_or(u64::MAX);
                    answered
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((ticket, start.elapsed()));
                    leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(ticket, lease);
                }
                Ok(())
            })
        })
        .collect();
    for enqueuer in enqueuers {
        enqueuer.await.map_err(|e| e.to_string())??;
    }
    let enqueued = start.elapsed();
    // Drained: every ticket delivered and its slot returned. Given up on
    // four times the ideal and two minutes after the last enqueue's answer
    // (through a slow front door, the enqueues alone can take minutes).
    let limit = enqueued
        + Duration::from_millis(args.tickets as u64 * args.hold_ms / u64::from(args.count)) * 4
        + Duration::from_secs(120);
    loop {
        let done = returned.lock().unwrap_or_else(|e| e.into_inner()).len();
        if done >= args.tickets {
            break;
        }
        if start.elapsed() > limit {
            eprintln!(
                "burst: gave up after {:?} with {done} returned",
                start.elapsed()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spent = Counters::wire_since(&counters.wire(), &before);

    let mut got = got.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let returned = returned.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut per_ticket: HashMap<u64, usize> = HashMap::new();
    for g in &got {
        *per_ticket.entry(g.ticket).or_default() += 1;
    }
    let twice = per_ticket.values().filter(|n| **n > 1).count();
    let lost = (0..args.tickets as u64)
        .filter(|t| !per_ticket.contains_key(t))
        .count();
    got.sort_by_key(|g| g.fence);
    let out_of_order = got.windows(2).filter(|w| w[1].ticket < w[0].ticket).count();
    // The i-th return frees the slot of the (count + i)-th grant.
    let mut arrivals: Vec<Instant> = got.iter().map(|g| g.at).collect();
    arrivals.sort();
    let mut returns = returned.clone();
    returns.sort();
    let enqueues_done = start + enqueued;
    let pairs: Vec<(Instant, f64)> = arrivals
        .iter()
        .skip(usize::from(args.count))
        .zip(&returns)
        .map(|(arrived, freed)| {
            let ms = arrived.saturating_duration_since(*freed).as_secs_f64() * 1000.0;
            (*arrived, ms)
        })
        .collect();
    let sorted = |after: Option<Instant>| {
        let mut delays: Vec<f64> = pairs
            .iter()
            .filter(|(at, _)| after.is_none_or(|t| *at > t))
            .map(|(_, ms)| *ms)
            .collect();
        delays.sort_by(f64::total_cmp);
        delays
    };
    let pct = |delays: &[f64], p: f64| {
        delays
            .get(((delays.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let delays = sorted(None);
    let settled = sorted(Some(enqueues_done));
    let ideal = args.tickets as f64 * args.hold_ms as f64 / f64::from(args.count) / 1000.0;
    let answered = answered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let ideal_for_arrivals =
        ideal_drain(&answered, args.count, Duration::from_millis(args.hold_ms)).as_secs_f64();
    let n = args.tickets as f64;

    println!(
        "## Async burst: {name}, {} tickets, count {}, {} ms holds\n",
        args.tickets, args.count, args.hold_ms
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| delivered | {} of {} ({} twice, {} not by the end) |",
        per_ticket.len(),
        args.tickets,
        twice,
        lost
    );
    println!("| grants out of ticket order (by fence) | {out_of_order} |");
    println!("| enqueue of all | {:.1} s |", enqueued.as_secs_f64());
    println!(
        "| drain (first enqueue to last return) | {:.1} s; ideal {:.1} s; ratio {:.2} |",
        drained.as_secs_f64(),
        ideal,
        drained.as_secs_f64() / ideal
    );
    println!(
        "| the same against the ideal for these arrivals (each ticket granted in order as soon as it is enqueued and a slot is free) | ideal {:.1} s; ratio {:.2} |",
        ideal_for_arrivals,
        drained.as_secs_f64() / ideal_for_arrivals
    );
    println!(
        "| callback after the return that freed its slot | p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples) |",
        pct(&delays, 0.5),
        pct(&delays, 0.99),
        delays.last().copied().unwrap_or(f64::NAN),
        delays.len()
    );
    println!(
        "| the same, once every enqueue was answered | p50 {:.1} ms, p99 {:.1} ms ({} samples) |",
        pct(&settled, 0.5),
        pct(&settled, 0.99),
        settled.len()
    );
    if args.dynamodb.is_some() {
        let total: u64 = spent.values().sum();
        let mut by_op: Vec<String> = spent
            .iter()
            .map(|((op, outcome), count)| format!("{op} {outcome:?} {:.2}", *count as f64 / n))
            .collect();
        by_op.sort();
        println!(
            "| DynamoDB requests per ticket | {:.2}: {} |",
            total as f64 / n,
            by_op.join(", ")
        );
        println!(
            "| consumed capacity units per ticket (read + write) | {:.2} |",
            capacity.load(Ordering::Relaxed) as f64 / 1000.0 / n
        );
    }
    Ok(())
}

/// The service, its store (counted on the wire) and local-api's dispatcher, in this process.
async fn in_process(
    args: &Args,
    counters: &Arc<Counters>,
    capacity: &Arc<AtomicU64>,
) -> Result<(Target, &'static str), String> {
    let local = Local::new();
    let (store, tickets, name): (Arc<dyn PoolStore>, Arc<dyn TicketStore>, &str) =
        match &args.dynamodb {
            None => {
                let store = Arc::new(MemoryStore::new());
                (store.clone(), store, "in-memory")
            }
            Some(url) => {
                let base = semaphore::config::dynamodb_client(Some(url)).await;
                dynamodb::ensure_table(&base, "semaphore-burst")
                    .await
                    .map_err(|e| e.to_string())?;
                // The dispatcher follows the table's stream, as local-api and the
                // AWS event source do.
                let arn = dynamodb::stream_arn(&base, "semaphore-burst")
                    .await
                    .map_err(|e| e.to_string())?;
                semaphore::delivery::stream::follow(url, arn, local.watch()).await?;
                let store = Arc::new(
                    DynamoDbStore::new(on_the_wire(&base, counters.clone()), "semaphore-burst")
                        .with_capacity_tracking(capacity.clone()),
                );
                (store.clone(), store, "DynamoDB Local")
            }
        };
    let policy = CallbackPolicy { allow_local: true };
    let mut service = Service::new(store.clone(), Limits::default())
        .with_tickets(tickets.clone())
        .with_callback_policy(policy);
    if args.dynamodb.is_none() {
        // In memory the service tells the dispatcher of each change.
        service = service.with_watch(local.watch());
    }
    let service = Arc::new(service);
    let caller = Caller::new(policy, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    local.start(Arc::new(Dispatcher::new(service.clone(), caller)));
    Ok((Target::InProcess(service), name))
}

/// One API request through the route table, as local-api serves it.
async fn call(target: &Target, method: &str, path: &str, body: Value) -> (u16, Value) {
    let service = match target {
        Target::InProcess(service) => service,
        Target::Http(client, base) => return http_call(client, base, method, path, body).await,
    };
    let response = match api::resolve(method, path) {
        Ok((route, id)) => {
            let mut call = Budget::new(None);
            api::handle(service, route, id, body.to_string().as_bytes(), &mut call).await
        }
        Err(err) => api::error_response(&err),
    };
    (response.status, response.body)
}

/// One API request over HTTP; a failure to connect reads as status 0.
async fn http_call(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let sent = client
        .request(method, format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
        Err(err) => (0, Value::String(err.to_string())),
    }
}

/// When the last of the tickets would be returned by a perfect dispatcher:
/// each ticket (`(number, when its enqueue was answered)`) granted in number
/// order as soon as it is enqueued and one of `count` slots is free, held for
/// `hold`, handed on at once. The ideal the arrivals allow: when enqueues
/// come slower than `count / hold`, no dispatcher drains faster.
fn ideal_drain(answered: &[(u64, Duration)], count: u16, hold: Duration) -> Duration {
    let mut arrivals = answered.to_vec();
    arrivals.sort_by_key(|(ticket, _)| *ticket);
    // Each slot's next free instant; the earliest serves the next ticket,
    // never before the one numbered before it started.
    let mut free = vec![Duration::ZERO; usize::from(count.max(1))];
    let (mut last, mut started) = (Duration::ZERO, Duration::ZERO);
    for (_, at) in arrivals {
        let slot = (0..free.len()).min_by_key(|&i| free[i]).unwrap_or(0);
        started = free[slot].max(at).max(started);
        free[slot] = started + hold;
        last = last.max(free[slot]);
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_is_the_holds_when_tickets_come_at_once_and_the_arrivals_when_slow() {
        let ms = Duration::from_millis;
        let at_once: Vec<_> = (0..100).map(|t| (t, ms(0))).collect();
        assert_eq!(ideal_drain(&at_once, 10, ms(50)), ms(500));
        // One ticket every 100 ms, each held 50 ms: the last arrival plus its hold.
        let slow: Vec<_> = (0..100).map(|t| (t, ms(100 * t))).collect();
        assert_eq!(ideal_drain(&slow, 10, ms(50)), ms(9_950));
        // Served in number order whatever order the answers came in.
        let shuffled = vec![(1, ms(0)), (0, ms(300))];
        assert_eq!(ideal_drain(&shuffled, 1, ms(50)), ms(400));
        // And never before the ticket numbered before it, a slot free or not.
        assert_eq!(ideal_drain(&shuffled, 2, ms(50)), ms(350));
    }
}
