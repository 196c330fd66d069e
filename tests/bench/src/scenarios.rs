//! The measurements. Each scenario builds its own clients and counters and
//! works on fresh pools (random UUIDs), deleting them afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use semaphore::domain::{LeaseDigest, Pool};
use semaphore::keys::{LeaseId, PoolId};
use semaphore::service::{now_ms, Backoff, BorrowRequest};
use semaphore::{Error, Service};
use semaphore_tests::rng::Rng;
use uuid::Uuid;

use crate::backend::Backend;
use crate::naive::Naive;
use crate::report::{ContentionRow, ItemRow, OpRow, PollRow, WakeRow};
use crate::stats::{round3, summarize};
use semaphore_tests::counting::{
    pool_item_size, read_units, write_units, Counters, Snapshot, IN_RETURN,
};

/// Long enough that no lease of a run expires by accident.
const LONG_TTL_MS: u64 = 60_000;
/// The pool size of the contention runs (issue #5).
pub const CONTENTION_COUNT: u16 = 4;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn new_pool() -> PoolId {
    PoolId(Uuid::new_v4())
}

fn seed() -> u64 {
    Uuid::new_v4().as_u64_pair().0
}

fn fail(what: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn per(total: u64, n: usize) -> f64 {
    round3(total as f64 / n.max(1) as f64)
}

fn units(milli: u64, n: usize) -> f64 {
    round3(milli as f64 / 1000.0 / n.max(1) as f64)
}

/// Accumulates counter deltas and latencies per named operation, in order.
struct Recorder {
    counters: Arc<Counters>,
    rows: Vec<(&'static str, Snapshot, Vec<f64>)>,
}

impl Recorder {
    fn start(&self) -> (Snapshot, Instant) {
        (self.counters.snapshot(), Instant::now())
    }

    fn stop(&mut self, name: &'static str, (before, t0): (Snapshot, Instant)) {
        let latency = ms(t0);
        let delta = self.counters.snapshot().since(&before);
        let i = match self.rows.iter().position(|r| r.0 == name) {
            Some(i) => i,
            None => {
                self.rows.push((name, Snapshot::default(), Vec::new()));
                self.rows.len() - 1
            }
        };
        let row = &mut self.rows[i];
        row.1 = add(&row.1, &delta);
        row.2.push(latency);
    }
}

fn add(a: &Snapshot, b: &Snapshot) -> Snapshot {
    Snapshot {
        http_get: a.http_get + b.http_get,
        http_put: a.http_put + b.http_put,
        http_delete: a.http_delete + b.http_delete,
        http_other: a.http_other + b.http_other,
        loads: a.loads + b.loads,
        writes: a.writes + b.writes,
        deletes: a.deletes + b.deletes,
        conflicts: a.conflicts + b.conflicts,
        return_conflicts: a.return_conflicts + b.return_conflicts,
        model_wcu_milli: a.model_wcu_milli + b.model_wcu_milli,
        model_rcu_milli: a.model_rcu_milli + b.model_rcu_milli,
        reported_milli: a.reported_milli + b.reported_milli,
    }
}

/// Every route once per sample, uncontended, one client.
pub async fn operations(
    backend: &Backend,
    backoff: Backoff,
    samples: usize,
) -> Result<Vec<OpRow>, String> {
    let counters = Arc::new(Counters::default());
    let service = backend.service(&counters, backoff).await;
    let mut rec = Recorder {
        counters: counters.clone(),
        rows: Vec::new(),
    };
    let free = BorrowRequest {
        ttl_ms: LONG_TTL_MS,
        wait_ms: 0,
    };
    for _ in 0..samples {
        let id = new_pool();
        let t = rec.start();
        service
            .register(id, 1, None)
            .await
            .map_err(fail("register"))?;
        rec.stop("register (new pool)", t);
        let t = rec.start();
        service
            .register(id, 1, None)
            .await
            .map_err(fail("register"))?;
        rec.stop("register (existing, same count)", t);
        let t = rec.start();
        let grant = service
            .borrow(id, free, None)
            .await
            .map_err(fail("borrow"))?;
        rec.stop("borrow (free slot)", t);
        let t = rec.start();
        match service.borrow(id, free, None).await {
            Err(Error::Exhausted) => rec.stop("borrow (pool full, wait 0)", t),
            other => return Err(format!("borrow on a full pool gave {other:?}")),
        }
        let t = rec.start();
        service.inspect(id).await.map_err(fail("inspect"))?;
        rec.stop("inspect", t);
        let t = rec.start();
        let returned = service
            .return_lease(id, grant.lease, None)
            .await
            .map_err(fail("return"))?;
        rec.stop("return", t);
        if !returned {
            return Err("return of a live lease gave false".into());
        }
        let t = rec.start();
        service
            .return_lease(id, grant.lease, None)
            .await
            .map_err(fail("return"))?;
        rec.stop("return (already returned)", t);
        let t = rec.start();
        service
            .register(id, 2, None)
            .await
            .map_err(fail("register"))?;
        rec.stop("register (existing, new count)", t);
        let t = rec.start();
        service.delete(id).await.map_err(fail("delete"))?;
        rec.stop("delete", t);
    }
    let reported = backend.is_dynamodb();
    Ok(rec
        .rows
        .into_iter()
        .map(|(name, s, latencies)| {
            let n = latencies.len();
            OpRow {
                backend: backend.name().into(),
                operation: name.into(),
                samples: n,
                calls: per(s.calls(), n),
                get_item: per(if reported { s.http_get } else { s.loads }, n),
                put_item: per(if reported { s.http_put } else { s.writes }, n),
                delete_item: per(if reported { s.http_delete } else { s.deletes }, n),
                conditional_failures: per(s.conflicts, n),
                model_wcu: units(s.model_wcu_milli, n),
                model_rcu: units(s.model_rcu_milli, n),
                reported_capacity: reported.then(|| units(s.reported_milli, n)),
                latency: summarize(&latencies),
            }
        })
        .collect())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// The shared `Service`.
    Ours,
    /// [`Naive`]: re-read on conflict, fixed 3 s sleep when full.
    Naive,
}

impl Strategy {
    pub const ALL: [Strategy; 2] = [Strategy::Ours, Strategy::Naive];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ours => "ours",
            Strategy::Naive => "naive",
        }
    }
}

#[derive(Default)]
struct ClientTally {
    cycles: u64,
    timeouts: u64,
    errors: Vec<String>,
    borrow_ms: Vec<f64>,
}

enum Worker {
    Ours(Service),
    Naive(Naive),
}

/// What a worker holds between its borrow and its return.
enum Held {
    Lease(LeaseId),
    Digest(LeaseDigest),
}

impl Worker {
    /// `Ok(None)` when `end` passed while waiting.
    async fn borrow(&self, id: PoolId, end: Instant) -> Result<Option<Held>, String> {
        let key = id.key();
        let held = match self {
            Worker::Ours(service) => {
                let wait_ms = end.saturating_duration_since(Instant::now()).as_millis() as u64;
                let request = BorrowRequest {
                    ttl_ms: LONG_TTL_MS,
                    wait_ms: wait_ms.max(1),
                };
                match service.borrow(id, request, None).await {
                    Ok(grant) => Some(Held::Lease(grant.lease)),
                    Err(Error::Exhausted) => None,
                    Err(e) => return Err(e.to_string()),
                }
            }
            Worker::Naive(naive) => naive
                .borrow(&key, LONG_TTL_MS, end)
                .await
                .map_err(|e| e.to_string())?
                .map(Held::Digest),
        };
        Ok(held)
    }

    async fn give_back(&self, id: PoolId, held: Held) -> Result<bool, String> {
        let key = id.key();
        match (self, held) {
            (Worker::Ours(service), Held::Lease(lease)) => service
                .return_lease(id, lease, None)
                .await
                .map_err(|e| e.to_string()),
            (Worker::Naive(naive), Held::Digest(digest)) => naive
                .return_lease(&key, digest)
                .await
                .map_err(|e| e.to_string()),
            _ => Err("a lease of another strategy".into()),
        }
    }

    /// One borrow → hold → return cycle. `Err` only for a broken semaphore
    /// (a live lease that would not return), which ends the run.
    async fn cycle(&self, id: PoolId, end: Instant, hold: Duration) -> Result<Outcome, String> {
        let t0 = Instant::now();
        let held = match self.borrow(id, end).await {
            Ok(Some(held)) => held,
            Ok(None) => return Ok(Outcome::TimedOut),
            Err(e) => return Ok(Outcome::Failed(format!("borrow: {e}"))),
        };
        let latency = ms(t0);
        if !hold.is_zero() {
            // Even a zero sleep waits for the timer's next millisecond tick.
            tokio::time::sleep(hold).await;
        }
        match IN_RETURN.scope(true, self.give_back(id, held)).await {
            Ok(true) => Ok(Outcome::Cycle(latency)),
            Ok(false) => Err("a live lease did not return: the semaphore is broken".into()),
            Err(e) => Ok(Outcome::Failed(format!("return: {e}"))),
        }
    }
}

enum Outcome {
    /// Borrowed and returned; the borrow's latency in ms.
    Cycle(f64),
    /// The run ended while the borrow was waiting.
    TimedOut,
    /// A database call failed (counted, not fatal).
    Failed(String),
}

/// `clients` clients cycling borrow(wait) → hold → return on one pool of count 4.
pub async fn contention(
    backend: &Backend,
    strategy: Strategy,
    clients: usize,
    seconds: f64,
    hold: Duration,
    backoff: Backoff,
) -> Result<ContentionRow, String> {
    let setup = backend
        .service(&Arc::new(Counters::default()), backoff)
        .await;
    let id = new_pool();
    setup
        .register(id, CONTENTION_COUNT, None)
        .await
        .map_err(fail("register"))?;
    let counters = Arc::new(Counters::default());
    let mut workers = Vec::with_capacity(clients);
    for _ in 0..clients {
        workers.push(match strategy {
            Strategy::Ours => Worker::Ours(backend.service(&counters, backoff).await),
            Strategy::Naive => Worker::Naive(Naive {
                store: backend.store(&counters).await,
            }),
        });
    }
    let before = counters.snapshot();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|worker| {
            tokio::spawn(async move {
                let mut tally = ClientTally::default();
                while Instant::now() < end {
                    match worker.cycle(id, end, hold).await? {
                        Outcome::Cycle(latency) => {
                            tally.cycles += 1;
                            tally.borrow_ms.push(latency);
                        }
                        Outcome::TimedOut => tally.timeouts += 1,
                        Outcome::Failed(e) => {
                            tally.errors.push(e);
                            // A failing database should not be hammered in a loop.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    // The in-memory store never returns Pending: without this a
                    // client would keep its worker thread and starve the others.
                    tokio::task::yield_now().await;
                }
                Ok::<_, String>(tally)
            })
        })
        .collect();
    let mut total = ClientTally::default();
    let mut per_client = Vec::with_capacity(clients);
    for task in tasks {
        let tally = task.await.map_err(|e| format!("client task: {e}"))??;
        per_client.push(tally.cycles as f64);
        total.cycles += tally.cycles;
        total.timeouts += tally.timeouts;
        total.errors.extend(tally.errors);
        total.borrow_ms.extend(tally.borrow_ms);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let s = counters.snapshot().since(&before);
    let _ = setup.delete(id).await;
    let attempts = s.write_attempts();
    let successes = s.writes.saturating_sub(s.conflicts);
    let cycles = total.cycles as usize;
    Ok(ContentionRow {
        backend: backend.name().into(),
        strategy: strategy.name().into(),
        clients,
        count: CONTENTION_COUNT,
        hold_ms: hold.as_millis() as u64,
        seconds: round3(elapsed),
        cycles: total.cycles,
        cycles_per_s: round3(total.cycles as f64 / elapsed),
        write_attempts: attempts,
        write_successes: successes,
        conditional_failures: s.conflicts,
        successes_per_attempt: round3(successes as f64 / attempts.max(1) as f64),
        borrow_conflicts_per_cycle: per(s.conflicts - s.return_conflicts, cycles),
        return_conflicts_per_cycle: per(s.return_conflicts, cycles),
        attempts_per_success: round3(attempts as f64 / successes.max(1) as f64),
        calls_per_cycle: per(s.calls(), cycles),
        reads_per_cycle: per(s.reads(), cycles),
        model_wcu_per_cycle: units(s.model_wcu_milli, cycles),
        sdk_retries: s.http_total().saturating_sub(s.store_calls()),
        fairness: round3(jain(&per_client)),
        starved_clients: per_client.iter().filter(|c| **c == 0.0).count(),
        timeouts: total.timeouts,
        errors: total.errors.len() as u64,
        first_error: total.errors.first().cloned(),
        borrow: summarize(&total.borrow_ms),
    })
}

/// Jain's fairness index of per-client cycles: 1 when all got the same,
/// 1/n when one client got everything.
fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Return,
    Expiry,
    Raise,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Return => "return",
            Trigger::Expiry => "expiry",
            Trigger::Raise => "count raise",
        }
    }
}

fn wall_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// One holder, one waiter on a pool of count 1; the time from the slot
/// freeing up to the waiter's grant (its borrow call returning).
async fn wake_sample(
    holder: &Service,
    waiter: &Arc<Service>,
    trigger: Trigger,
    rng: &mut Rng,
) -> Result<f64, String> {
    let id = new_pool();
    holder
        .register(id, 1, None)
        .await
        .map_err(fail("register"))?;
    let hold_ttl = match trigger {
        // Expiries land at random points of the waiter's polling.
        Trigger::Expiry => rng.range(150, 450),
        _ => LONG_TTL_MS,
    };
    let held = holder
        .borrow(
            id,
            BorrowRequest {
                ttl_ms: hold_ttl,
                wait_ms: 0,
            },
            None,
        )
        .await
        .map_err(fail("holder borrow"))?;
    let waiter = waiter.clone();
    let waiting = tokio::spawn(async move {
        let request = BorrowRequest {
            ttl_ms: LONG_TTL_MS,
            wait_ms: 10_000,
        };
        let result = waiter.borrow(id, request, None).await;
        (result, Instant::now(), wall_us())
    });
    // Past the first backoff steps, so the freeing lands in steady-state polling
    // at a random phase.
    let nap = Duration::from_millis(rng.range(150, 450));
    let freed = match trigger {
        Trigger::Return => {
            tokio::time::sleep(nap).await;
            holder
                .return_lease(id, held.lease, None)
                .await
                .map_err(fail("return"))?;
            Some(Instant::now())
        }
        Trigger::Raise => {
            tokio::time::sleep(nap).await;
            holder.register(id, 2, None).await.map_err(fail("raise"))?;
            Some(Instant::now())
        }
        Trigger::Expiry => None,
    };
    let (result, granted, granted_wall_us) =
        waiting.await.map_err(|e| format!("waiter task: {e}"))?;
    let _ = holder.delete(id).await;
    result.map_err(fail("waiter borrow"))?;
    Ok(match freed {
        Some(freed) => granted.saturating_duration_since(freed).as_secs_f64() * 1000.0,
        None => {
            let expired_us = u128::from(held.expires_at_ms) * 1000;
            granted_wall_us.saturating_sub(expired_us) as f64 / 1000.0
        }
    })
}

/// Wake delays after `trigger`, measured on `lanes` independent pools at once.
pub async fn wake(
    backend: &Backend,
    trigger: Trigger,
    samples: usize,
    lanes: usize,
    backoff: Backoff,
) -> Result<WakeRow, String> {
    let lanes = lanes.clamp(1, samples.max(1));
    let mut tasks = Vec::with_capacity(lanes);
    for lane in 0..lanes {
        let counters = Arc::new(Counters::default());
        let holder = backend.service(&counters, backoff).await;
        let waiter = Arc::new(backend.service(&counters, backoff).await);
        // Spread the remainder over the first lanes.
        let n = samples / lanes + usize::from(lane < samples % lanes);
        let mut rng = Rng::new(seed());
        tasks.push(tokio::spawn(async move {
            let mut delays = Vec::with_capacity(n);
            for _ in 0..n {
                delays.push(wake_sample(&holder, &waiter, trigger, &mut rng).await?);
            }
            Ok::<_, String>(delays)
        }));
    }
    let mut delays = Vec::with_capacity(samples);
    for task in tasks {
        delays.extend(task.await.map_err(|e| format!("wake lane: {e}"))??);
    }
    Ok(WakeRow {
        backend: backend.name().into(),
        trigger: trigger.name().into(),
        delay: summarize(&delays),
        delays_ms: delays.iter().map(|d| round3(*d)).collect(),
    })
}

/// Reads a waiter spends per second while nothing frees up.
pub async fn polling(backend: &Backend, seconds: f64, backoff: Backoff) -> Result<PollRow, String> {
    let holder = backend
        .service(&Arc::new(Counters::default()), backoff)
        .await;
    let counters = Arc::new(Counters::default());
    let waiter = backend.service(&counters, backoff).await;
    let id = new_pool();
    holder
        .register(id, 1, None)
        .await
        .map_err(fail("register"))?;
    holder
        .borrow(
            id,
            BorrowRequest {
                ttl_ms: LONG_TTL_MS,
                wait_ms: 0,
            },
            None,
        )
        .await
        .map_err(fail("holder borrow"))?;
    let t0 = Instant::now();
    let outcome = waiter
        .borrow(
            id,
            BorrowRequest {
                ttl_ms: LONG_TTL_MS,
                wait_ms: (seconds * 1000.0) as u64,
            },
            None,
        )
        .await;
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = holder.delete(id).await;
    match outcome {
        Err(Error::Exhausted) => {}
        other => return Err(format!("a waiter on a full pool got {other:?}")),
    }
    let reads = counters.snapshot().reads();
    Ok(PollRow {
        backend: backend.name().into(),
        seconds: round3(elapsed),
        reads,
        reads_per_s: round3(reads as f64 / elapsed),
    })
}

/// A pool with every slot held by a distinct live lease.
fn full_pool(count: u16) -> Pool {
    let mut pool = Pool::new(count);
    let now = now_ms();
    for _ in 0..count {
        let digest = LeaseId::new_random().digest();
        // Cannot fail: fewer than `count` leases are held.
        let _ = pool.borrow(digest, now + 3_600_000, now);
    }
    pool
}

/// Item size of fully held pools; on DynamoDB also what it reports for writing
/// and reading such an item.
pub async fn item_sizes(backend: Option<&Backend>, counts: &[u16]) -> Result<Vec<ItemRow>, String> {
    let mut rows = Vec::with_capacity(counts.len());
    for &count in counts {
        let pool = full_pool(count);
        let key = new_pool().key();
        let bytes = pool_item_size(&key, &pool);
        let wcu = write_units(bytes);
        let mut row = ItemRow {
            count,
            bytes,
            wcu_per_write: wcu,
            rcu_per_read: read_units(bytes),
            max_writes_per_s: round3(1000.0 / wcu as f64),
            max_cycles_per_s: round3(500.0 / wcu as f64),
            reported_wcu: None,
            reported_rcu: None,
        };
        if let Some(backend) = backend {
            let counters = Arc::new(Counters::default());
            let store = backend.store(&counters).await;
            let s0 = counters.snapshot();
            store
                .create(&key, &pool)
                .await
                .map_err(|e| format!("create: {e}"))?;
            let s1 = counters.snapshot();
            store.load(&key).await.map_err(|e| format!("load: {e}"))?;
            let s2 = counters.snapshot();
            let _ = store.delete(&key).await;
            row.reported_wcu = Some(units(s1.since(&s0).reported_milli, 1));
            row.reported_rcu = Some(units(s2.since(&s1).reported_milli, 1));
        }
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), 1.0);
        assert_eq!(jain(&[4.0, 0.0, 0.0, 0.0]), 0.25);
        assert_eq!(jain(&[0.0, 0.0]), 0.0);
    }
}
