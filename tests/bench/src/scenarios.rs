//! The measurements. Each scenario builds its own clients and counters and
//! works on fresh pools (random UUIDs), deleting them afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use semaphore::clock::now_ms;
use semaphore::domain::{
    BorrowPlan, Compaction, Holder, Layout, Lease, Pool, Slot, Stamp, FLAT_MAX, SEGMENT_SLOTS,
};
use semaphore::keys::{LeaseId, PoolId};
use semaphore::service::{BorrowRequest, Budget, Grant, Timing};
use semaphore::store::Record;
use semaphore::{Error, Limits, Service};
use semaphore_tests::rng::Rng;
use serde::Serialize;
use uuid::Uuid;

use crate::backend::{service_over, Backend, Breakdown};
use crate::naive::Naive;
use crate::report::{BilledRow, ContentionRow, ItemRow, OpRow, PollRow, WakeRow};
use crate::stats::{jain, round3, summarize};
use semaphore_tests::counting::{
    pool_item_size, read_units, write_units, Counters, Snapshot, IN_RETURN,
};

/// Long enough that no lease of a run expires by accident.
pub const LONG_TTL_MS: u64 = 60_000;
/// The pool size of the contention runs (issues #5 and #13).
pub const CONTENTION_COUNT: u16 = 4;

pub fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

pub fn new_pool() -> PoolId {
    PoolId(Uuid::new_v4())
}

pub fn seed() -> u64 {
    Uuid::new_v4().as_u64_pair().0
}

pub fn fail(what: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

pub fn per(total: u64, n: usize) -> f64 {
    round3(total as f64 / n.max(1) as f64)
}

pub fn units(milli: u64, n: usize) -> f64 {
    round3(milli as f64 / 1000.0 / n.max(1) as f64)
}

pub fn wall_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// A request with no Lambda deadline, as the local server makes.
pub fn call() -> Budget {
    Budget::new(None)
}

pub fn request(ttl_ms: u64, wait_ms: u64) -> BorrowRequest {
    BorrowRequest {
        ttl_ms,
        wait_ms,
        lease: LeaseId::new_random(),
    }
}

/// What is compared: the service, or the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The service as shipped: hand-off, fair waiting.
    New,
    /// [`Naive`]: whole-item conditions, re-read after every conflict,
    /// fixed 3 s sleep when full.
    Naive,
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Strategy {
    pub const ALL: [Strategy; 2] = [Strategy::New, Strategy::Naive];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::New => "new",
            Strategy::Naive => "naive",
        }
    }

    /// Whether this is the service (the rest are baselines).
    pub fn is_service(self) -> bool {
        self == Strategy::New
    }

    /// An error unless this is the service: `what` is measured for it only.
    fn service_only(self, what: &str) -> Result<(), String> {
        if self.is_service() {
            Ok(())
        } else {
            Err(format!("{what} is measured for the service only"))
        }
    }
}

/// Builds services (or the naive baseline) for one backend and timing.
#[derive(Clone)]
pub struct Env {
    pub backend: Backend,
    pub timing: Timing,
    pub limits: Limits,
}

impl Env {
    pub async fn service(&self, counters: &Arc<Counters>) -> Service {
        self.backend
            .service(counters, self.timing, self.limits)
            .await
    }

    /// A service of the default policy whose calls nobody counts: set-up
    /// and tear-down.
    pub async fn setup(&self) -> Service {
        self.service(&Arc::new(Counters::default())).await
    }

    /// A client of `strategy` whose writes are counted into `counters` and
    /// classified into `breakdown`.
    pub async fn worker(
        &self,
        counters: &Arc<Counters>,
        breakdown: &Arc<Breakdown>,
        strategy: Strategy,
    ) -> Worker {
        let store = self.backend.classified_store(counters, breakdown).await;
        if strategy.is_service() {
            Worker::Service(Box::new(service_over(store, self.timing, self.limits)))
        } else {
            Worker::Naive(Naive { store })
        }
    }
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

pub fn add(a: &Snapshot, b: &Snapshot) -> Snapshot {
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
        landed_bytes: a.landed_bytes + b.landed_bytes,
        landed: a.landed + b.landed,
        reported_milli: a.reported_milli + b.reported_milli,
    }
}

/// Every route once per sample, uncontended, one client of the default policy.
pub async fn operations(env: &Env, samples: usize) -> Result<Vec<OpRow>, String> {
    let counters = Arc::new(Counters::default());
    let service = env.service(&counters).await;
    let mut rec = Recorder {
        counters: counters.clone(),
        rows: Vec::new(),
    };
    for _ in 0..samples {
        let id = new_pool();
        let t = rec.start();
        service
            .register(id, 1, &mut call())
            .await
            .map_err(fail("register"))?;
        rec.stop("register (new pool)", t);
        let t = rec.start();
        service
            .register(id, 1, &mut call())
            .await
            .map_err(fail("register"))?;
        rec.stop("register (existing, same count)", t);
        let t = rec.start();
        let grant = service
            .borrow(id, request(LONG_TTL_MS, 0), &mut call())
            .await
            .map_err(fail("borrow"))?;
        rec.stop("borrow (free slot)", t);
        let t = rec.start();
        match service
            .borrow(id, request(LONG_TTL_MS, 0), &mut call())
            .await
        {
            Err(Error::Exhausted) => rec.stop("borrow (pool full, wait 0)", t),
            other => return Err(format!("borrow on a full pool gave {other:?}")),
        }
        let t = rec.start();
        service
            .inspect(id, &mut call())
            .await
            .map_err(fail("inspect"))?;
        rec.stop("inspect", t);
        let t = rec.start();
        let returned = service
            .return_lease(id, grant.lease, &mut call())
            .await
            .map_err(fail("return"))?;
        rec.stop("return", t);
        if !returned {
            return Err("return of a live lease gave false".into());
        }
        let t = rec.start();
        service
            .return_lease(id, grant.lease, &mut call())
            .await
            .map_err(fail("return"))?;
        rec.stop("return (already returned)", t);
        let t = rec.start();
        service
            .register(id, 2, &mut call())
            .await
            .map_err(fail("register"))?;
        rec.stop("register (existing, new count)", t);
        let t = rec.start();
        service
            .delete(id, &mut call())
            .await
            .map_err(fail("delete"))?;
        rec.stop("delete", t);
    }
    let reported = env.backend.is_dynamodb();
    Ok(rec
        .rows
        .into_iter()
        .map(|(name, s, latencies)| {
            let n = latencies.len();
            OpRow {
                backend: env.backend.name().into(),
                operation: name.into(),
                samples: n,
                calls: per(s.calls(), n),
                get_item: per(if reported { s.http_get } else { s.loads }, n),
                update_item: per(if reported { s.http_put } else { s.writes }, n),
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

#[derive(Default)]
struct ClientTally {
    cycles: u64,
    timeouts: u64,
    errors: Vec<String>,
    borrow_ms: Vec<f64>,
}

/// One client: a service of one policy, or the naive baseline.
pub enum Worker {
    Service(Box<Service>),
    Naive(Naive),
}

/// What a worker holds between its borrow and its return.
pub enum Held {
    Lease(LeaseId),
    Naive(Lease),
}

/// A granted borrow: what to return, its fence (grant order), and what its
/// lease had left when answered.
pub struct Granted {
    pub held: Held,
    pub fence: u64,
    pub left_ms: u64,
}

impl Worker {
    /// `Ok(None)`: no slot within `wait_ms` (a 409).
    pub async fn borrow(
        &self,
        id: PoolId,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<Option<Granted>, String> {
        match self {
            Worker::Service(service) => {
                match service
                    .borrow(id, request(ttl_ms, wait_ms), &mut call())
                    .await
                {
                    Ok(Grant {
                        lease,
                        fence,
                        expires_in_ms,
                        ..
                    }) => Ok(Some(Granted {
                        held: Held::Lease(lease),
                        fence,
                        left_ms: expires_in_ms,
                    })),
                    Err(Error::Exhausted) => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            }
            Worker::Naive(naive) => {
                let give_up = Instant::now() + Duration::from_millis(wait_ms);
                let lease = naive
                    .borrow(&id.key(), ttl_ms, give_up)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(lease.map(|lease| Granted {
                    held: Held::Naive(lease),
                    fence: lease.fence,
                    left_ms: lease.expires_at_ms.saturating_sub(now_ms()),
                }))
            }
        }
    }

    pub async fn give_back(&self, id: PoolId, held: Held) -> Result<bool, String> {
        match (self, held) {
            (Worker::Service(service), Held::Lease(lease)) => service
                .return_lease(id, lease, &mut call())
                .await
                .map_err(|e| e.to_string()),
            (Worker::Naive(naive), Held::Naive(lease)) => naive
                .return_lease(&id.key(), &lease)
                .await
                .map_err(|e| e.to_string()),
            _ => Err("a lease of another strategy".into()),
        }
    }

    /// One borrow → hold → return cycle. `Err` only for a broken semaphore
    /// (a live lease that would not return), which ends the run.
    /// One borrow → hold → return; churning, a lease of 1–3 s that is
    /// returned only half the time (else left to expire).
    async fn cycle(
        &self,
        id: PoolId,
        end: Instant,
        hold: Duration,
        churn: bool,
    ) -> Result<Outcome, String> {
        let t0 = Instant::now();
        let wait_ms = end.saturating_duration_since(t0).as_millis() as u64;
        let ttl_ms = if churn {
            fastrand::u64(1_000..=3_000)
        } else {
            LONG_TTL_MS
        };
        let granted = match self.borrow(id, ttl_ms, wait_ms.max(1)).await {
            Ok(Some(granted)) => granted,
            Ok(None) => return Ok(Outcome::TimedOut),
            Err(e) => return Ok(Outcome::Failed(format!("borrow: {e}"))),
        };
        let latency = ms(t0);
        // When the lease runs out by this client's clock (a waiter may learn
        // of a short grant late): a return after it may find it gone.
        let runs_out = Instant::now() + Duration::from_millis(granted.left_ms);
        if !hold.is_zero() {
            // Even a zero sleep waits for the timer's next millisecond tick.
            tokio::time::sleep(hold).await;
        }
        if churn && fastrand::bool() {
            return Ok(Outcome::Cycle(latency));
        }
        match IN_RETURN
            .scope(true, self.give_back(id, granted.held))
            .await
        {
            Ok(true) => Ok(Outcome::Cycle(latency)),
            // Within a few ms of its end, the lease may be gone by the
            // service's clock: only a lease returned well before is broken.
            Ok(false) if Instant::now() + Duration::from_millis(5) >= runs_out => {
                Ok(Outcome::Cycle(latency))
            }
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

/// `clients` clients cycling borrow(wait = rest of the run) → hold → return
/// on one pool of count 4, each with its own service and store client.
pub async fn contention(
    env: &Env,
    strategy: Strategy,
    clients: usize,
    seconds: f64,
    hold: Duration,
) -> Result<ContentionRow, String> {
    let shape = Shape {
        count: CONTENTION_COUNT,
        held: 0,
        churn: false,
    };
    contention_on(env, strategy, clients, seconds, hold, shape).await
}

/// A pool's count, and how many of its slots stay held throughout a run;
/// or, with `churn`, every slot churning.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub count: u16,
    pub held: u16,
    pub churn: bool,
}

/// [`contention`] on a pool of `shape`: its `held` slots borrowed for the
/// whole run before the clients start.
pub async fn contention_on(
    env: &Env,
    strategy: Strategy,
    clients: usize,
    seconds: f64,
    hold: Duration,
    shape: Shape,
) -> Result<ContentionRow, String> {
    let setup = env.setup().await;
    let id = new_pool();
    setup
        .register(id, shape.count, &mut call())
        .await
        .map_err(fail("register"))?;
    for _ in 0..shape.held {
        setup
            .borrow(id, request(LONG_TTL_MS, 0), &mut call())
            .await
            .map_err(fail("holding a slot before the run"))?;
    }
    if shape.churn {
        // Every slot held, the leases ending at random throughout the run
        // (and the few seconds filling the pool takes), so that grants land
        // all over the pool rather than on a few positions.
        let last_ms = (seconds * 1000.0) as u64 + 10_000;
        for _ in 0..shape.count {
            setup
                .borrow(id, request(fastrand::u64(1_000..=last_ms), 0), &mut call())
                .await
                .map_err(fail("filling the pool before the run"))?;
        }
    }
    if shape.count > FLAT_MAX && (shape.held > 0 || shape.churn) {
        // Steady state: a split pool filled just now holds its fill's
        // grants in its pool item until they are old enough to move to
        // their segments; let them age, then a few writes compact them.
        tokio::time::sleep(Duration::from_millis(
            Compaction::DEFAULT.cold_after_ms + 500,
        ))
        .await;
        for _ in 0..shape.count / SEGMENT_SLOTS + 2 {
            if let Ok(grant) = setup.borrow(id, request(1_000, 0), &mut call()).await {
                let _ = setup.return_lease(id, grant.lease, &mut call()).await;
            }
        }
    }
    let counters = Arc::new(Counters::default());
    let breakdown = Arc::new(Breakdown::default());
    let mut workers = Vec::with_capacity(clients);
    for _ in 0..clients {
        workers.push(env.worker(&counters, &breakdown, strategy).await);
    }
    let before = counters.snapshot();
    let billed_before = counters.billed();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    // Steady state: the counters as the run ends, before the borrows still
    // waiting then give up (they all would at once, cancelling together).
    let at_end = {
        let counters = counters.clone();
        let breakdown = breakdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(end.into()).await;
            (counters.snapshot(), counters.billed(), breakdown.tallies())
        })
    };
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|worker| {
            tokio::spawn(async move {
                let mut tally = ClientTally::default();
                while Instant::now() < end {
                    match worker.cycle(id, end, hold, shape.churn).await? {
                        // Only cycles finished within the run count.
                        Outcome::Cycle(latency) if Instant::now() <= end => {
                            tally.cycles += 1;
                            tally.borrow_ms.push(latency);
                        }
                        Outcome::Cycle(_) => {}
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
    let (snapshot, billed_after, writes_by_kind) =
        at_end.await.map_err(|e| format!("snapshot task: {e}"))?;
    let elapsed = seconds;
    let s = snapshot.since(&before);
    let billed = billed_after.since(&billed_before);
    let _ = setup.delete(id, &mut call()).await;
    let attempts = s.write_attempts();
    let successes = s.writes.saturating_sub(s.conflicts);
    let cycles = total.cycles as usize;
    let wcu = units(s.model_wcu_milli, cycles);
    let rcu = units(s.model_rcu_milli, cycles);
    Ok(ContentionRow {
        backend: env.backend.name().into(),
        strategy,
        latency_ms: env.backend.added_latency.as_millis() as u64,
        clients,
        count: shape.count,
        held: shape.held,
        churn: shape.churn,
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
        attempts_per_cycle: per(attempts, cycles),
        calls_per_cycle: per(s.calls(), cycles),
        reads_per_cycle: per(s.reads(), cycles),
        model_wcu_per_cycle: wcu,
        model_rcu_per_cycle: rcu,
        pool_item_bytes: round3(s.landed_bytes as f64 / s.landed.max(1) as f64),
        usd_per_million_cycles: crate::report::usd_per_million(wcu, rcu),
        sdk_retries: s.http_total().saturating_sub(s.store_calls()),
        fairness: round3(jain(&per_client)),
        starved_clients: per_client.iter().filter(|c| **c == 0.0).count(),
        timeouts: total.timeouts,
        errors: total.errors.len() as u64,
        first_error: total.errors.first().cloned(),
        borrow: summarize(&total.borrow_ms),
        writes_by_kind,
        billed: (billed.wcu_milli() > 0).then(|| BilledRow {
            borrow_wcu: units(billed.borrow_wcu_milli, cycles),
            return_wcu: units(billed.return_wcu_milli, cycles),
            wcu: units(billed.wcu_milli(), cycles),
            borrow_rcu: units(billed.borrow_rcu_milli, cycles),
            return_rcu: units(billed.return_rcu_milli, cycles),
            rcu: units(billed.rcu_milli(), cycles),
        }),
    })
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

/// One holder, one waiter on a pool of count 1; the time from the slot
/// freeing up to the waiter's grant (its borrow call returning).
async fn wake_sample(
    holder: &Service,
    waiter: &Arc<Service>,
    trigger: Trigger,
    rng: &mut Rng,
) -> Result<(f64, u32), String> {
    let id = new_pool();
    holder
        .register(id, 1, &mut call())
        .await
        .map_err(fail("register"))?;
    let hold_ttl = match trigger {
        // Expiries land at random points of the waiter's polling.
        Trigger::Expiry => rng.range(150, 450),
        _ => LONG_TTL_MS,
    };
    let held = holder
        .borrow(id, request(hold_ttl, 0), &mut call())
        .await
        .map_err(fail("holder borrow"))?;
    let waiter = waiter.clone();
    let waiting = tokio::spawn(async move {
        let mut call = call();
        let result = waiter
            .borrow(id, request(LONG_TTL_MS, 10_000), &mut call)
            .await;
        (result, Instant::now(), wall_us(), call.stats.store_calls)
    });
    // Past the first polls, so the freeing lands in steady-state polling at
    // a random phase.
    let nap = Duration::from_millis(rng.range(150, 450));
    let freed = match trigger {
        Trigger::Return => {
            tokio::time::sleep(nap).await;
            holder
                .return_lease(id, held.lease, &mut call())
                .await
                .map_err(fail("return"))?;
            Some(Instant::now())
        }
        Trigger::Raise => {
            tokio::time::sleep(nap).await;
            holder
                .register(id, 2, &mut call())
                .await
                .map_err(fail("raise"))?;
            Some(Instant::now())
        }
        Trigger::Expiry => None,
    };
    let (result, granted, granted_wall_us, calls) =
        waiting.await.map_err(|e| format!("waiter task: {e}"))?;
    let _ = holder.delete(id, &mut call()).await;
    result.map_err(fail("waiter borrow"))?;
    let delay = match freed {
        Some(freed) => granted.saturating_duration_since(freed).as_secs_f64() * 1000.0,
        None => {
            let expired_us = u128::from(held.expires_at_ms) * 1000;
            granted_wall_us.saturating_sub(expired_us) as f64 / 1000.0
        }
    };
    Ok((delay, calls))
}

/// Wake delays after `trigger`, measured on `lanes` independent pools at once.
pub async fn wake(
    env: &Env,
    strategy: Strategy,
    trigger: Trigger,
    samples: usize,
    lanes: usize,
) -> Result<WakeRow, String> {
    strategy.service_only("wake delay")?;
    let lanes = lanes.clamp(1, samples.max(1));
    let mut tasks = Vec::with_capacity(lanes);
    // The waiter's calls only: what a wake costs, and which writes it lost.
    let counters = Arc::new(Counters::default());
    let breakdown = Arc::new(Breakdown::default());
    for lane in 0..lanes {
        let holder = env.setup().await;
        let store = env.backend.classified_store(&counters, &breakdown).await;
        let waiter = Arc::new(service_over(store, env.timing, env.limits));
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
    let mut calls = Vec::with_capacity(samples);
    for task in tasks {
        for (delay, n) in task.await.map_err(|e| format!("wake lane: {e}"))?? {
            delays.push(delay);
            calls.push(n);
        }
    }
    let s = counters.snapshot();
    let n = delays.len();
    Ok(WakeRow {
        backend: env.backend.name().into(),
        strategy,
        trigger: trigger.name().into(),
        waiter_reads_per_sample: per(s.reads(), n),
        waiter_writes_per_sample: per(s.write_attempts(), n),
        writes_by_kind: breakdown.tallies(),
        delay: summarize(&delays),
        delays_ms: delays.iter().map(|d| round3(*d)).collect(),
        waiter_calls: calls,
    })
}

/// Reads (and writes) one waiter spends per second while nothing frees up.
pub async fn polling(env: &Env, strategy: Strategy, seconds: f64) -> Result<PollRow, String> {
    strategy.service_only("polling")?;
    let holder = env.setup().await;
    let counters = Arc::new(Counters::default());
    let waiter = env.service(&counters).await;
    let id = new_pool();
    holder
        .register(id, 1, &mut call())
        .await
        .map_err(fail("register"))?;
    holder
        .borrow(id, request(LONG_TTL_MS, 0), &mut call())
        .await
        .map_err(fail("holder borrow"))?;
    let t0 = Instant::now();
    let outcome = waiter
        .borrow(
            id,
            request(LONG_TTL_MS, (seconds * 1000.0) as u64),
            &mut call(),
        )
        .await;
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = holder.delete(id, &mut call()).await;
    match outcome {
        Err(Error::Exhausted) => {}
        other => return Err(format!("a waiter on a full pool got {other:?}")),
    }
    let s = counters.snapshot();
    let reads = s.reads();
    Ok(PollRow {
        backend: env.backend.name().into(),
        strategy,
        seconds: round3(elapsed),
        reads,
        writes: s.write_attempts(),
        reads_per_s: round3(reads as f64 / elapsed),
    })
}

/// A pool with every slot held by a distinct live lease (ttl 1 h) and
/// `waiting` tickets queued, a million grants old; flat, as the DynamoDB
/// store keeps every pool for now.
pub fn full_pool(count: u16, waiting: usize) -> Result<Pool, String> {
    let now = now_ms();
    let mut pool = Pool::new(count, now).with_layout(Layout::Flat);
    let holder = || Holder {
        digest: LeaseId::new_random().digest(),
        ttl_ms: 3_600_000,
    };
    for _ in 0..count {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(), now, now, usize::MAX)
        else {
            return Err("a pool with a free slot would not grant".into());
        };
        pool = pool.apply(&update).map_err(|e| format!("{e:?}"))?;
    }
    for _ in 0..waiting {
        let BorrowPlan::Join(update) = pool.plan_borrow(holder(), now + 25_000, now, usize::MAX)
        else {
            return Err("a ticket would not join".into());
        };
        pool = pool.apply(&update).map_err(|e| format!("{e:?}"))?;
    }
    // A million grants into its life: fences have the digits they would.
    const AGE: u64 = 1_000_000;
    let slots = pool
        .slots()
        .iter()
        .map(|slot| match *slot {
            Slot::Held { holder, stamp } => Slot::Held {
                holder,
                stamp: Stamp {
                    fence: stamp.fence + AGE,
                    ..stamp
                },
            },
            Slot::Free => Slot::Free,
        })
        .collect();
    Pool::from_parts(
        pool.sizing(),
        pool.base_us(),
        pool.next_fence() + AGE,
        slots,
        pool.queue().to_vec(),
        pool.given_up().to_vec(),
        pool.ended().to_vec(),
    )
    .map_err(|e| format!("{e:?}"))
}

/// Item sizes of fully held pools (count, waiting tickets); on DynamoDB also
/// what it reports for writing and reading such an item.
pub async fn item_sizes(
    backend: Option<&Backend>,
    shapes: &[(u16, usize)],
) -> Result<Vec<ItemRow>, String> {
    let mut rows = Vec::with_capacity(shapes.len());
    for &(count, waiting) in shapes {
        let record = Record::new(full_pool(count, waiting)?);
        let key = new_pool().key();
        let bytes = pool_item_size(&key, &record);
        let wcu = write_units(bytes);
        let mut row = ItemRow {
            count,
            waiting,
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
                .create(&key, &record)
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
