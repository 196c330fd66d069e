//! Never over-issue, never lose a lease: seeded random workloads of every call,
//! from concurrent clients over several service instances, checked by the
//! history checker — on the in-memory store, on DynamoDB Local, and on
//! DynamoDB Local behind injected store faults.
//!
//! `SEMAPHORE_SEED=N` replays a seed's choices (printed by every run);
//! `SEMAPHORE_SOAK=1` runs at least 100,000 operations per test.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::api;
use semaphore::domain::Compaction;
use semaphore::service::Timing;
use semaphore::store::{DynamoDbStore, PoolStore};
use semaphore::Limits;
use semaphore_tests::faults::{FaultCounts, FaultPlan, FaultyStore};
use semaphore_tests::forward::Forward;
use semaphore_tests::harness::{dynamodb_client, dynamodb_store, memory_store, ApiClient, TABLE};
use semaphore_tests::history::{self, check, Call, CheckConfig, History, Op, Rule};
use semaphore_tests::truth::{self, Recorder, Truth};
use semaphore_tests::workload::{self, Workload};

/// Service instances ("Lambda containers").
const INSTANCES: usize = 4;

/// Small clamps, so that clamping happens in the mix: ttls go up to 400 ms,
/// waits up to 600 ms.
const LIMITS: Limits = Limits {
    max_ttl_ms: 300,
    max_wait_ms: 500,
    max_waiters: 100,
    max_async_wait_ms: 60_000,
    max_tickets: 10_000,
    waiting_budget: 0,
};

/// The room regime's clamps: ttls are not clamped (they stay at most 400 ms),
/// so that its after-run check can hold a pool's full count (up to 24) at
/// once on a loaded machine.
const ROOM_LIMITS: Limits = Limits {
    max_ttl_ms: 3_000,
    ..LIMITS
};

fn seed() -> u64 {
    let seed = match std::env::var("SEMAPHORE_SEED") {
        Ok(raw) => raw
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("SEMAPHORE_SEED must be a u64, got {raw:?}")),
        Err(_) => uuid::Uuid::new_v4().as_u64_pair().0,
    };
    eprintln!("randomized: seed {seed} (reproduce with SEMAPHORE_SEED={seed})");
    seed
}

/// Operations per run: a few thousand in CI, ≥ 100,000 with `SEMAPHORE_SOAK=1`.
fn operations(ci: usize) -> usize {
    if std::env::var("SEMAPHORE_SOAK").is_ok_and(|v| v == "1") {
        100_000
    } else {
        ci
    }
}

/// Wraps a store in a recorder of `truth`.
fn recorded(store: Arc<dyn PoolStore>, truth: &Arc<Truth>) -> Arc<dyn PoolStore> {
    Arc::new(Recorder::new(store, truth.clone()))
}

fn instances(stores: Vec<Arc<dyn PoolStore>>, limits: Limits) -> Vec<Arc<ApiClient>> {
    stores
        .into_iter()
        .map(|store| Arc::new(ApiClient::new(store, limits)))
        .collect()
}

/// [`INSTANCES`] service instances on DynamoDB Local, each store recorded in
/// `truth`, and a clean one (unrecorded) to settle and verify with.
async fn dynamodb_instances(
    truth: &Arc<Truth>,
    limits: Limits,
) -> (Vec<Arc<ApiClient>>, ApiClient) {
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(recorded(dynamodb_store().await, truth));
    }
    (
        instances(stores, limits),
        ApiClient::new(dynamodb_store().await, limits),
    )
}

fn config(faults: bool, limits: Limits) -> CheckConfig {
    CheckConfig {
        max_ttl_ms: limits.max_ttl_ms,
        max_wait_ms: limits.max_wait_ms,
        wakeup_tolerance_ms: 250,
        faults,
    }
}

/// Runs the workload, then the after-run checks on a fault-free instance, then
/// the checker over everything; fails with the seed and every violation.
async fn run_and_check(
    name: &str,
    workload: Workload,
    instances: &[Arc<ApiClient>],
    truth: &Truth,
    clean: &ApiClient,
    faults: bool,
) -> Vec<Op> {
    run_and_check_orphans(name, workload, instances, truth, clean, faults, false)
        .await
        .0
}

/// [`run_and_check`]; with `dying`, slots stranded by waiters whose client
/// died are allowed, each at most its ttl, and returned (in ms) for the
/// report; any other orphaned slot fails the run.
async fn run_and_check_orphans(
    name: &str,
    workload: Workload,
    instances: &[Arc<ApiClient>],
    truth: &Truth,
    clean: &ApiClient,
    faults: bool,
    dying: bool,
) -> (Vec<Op>, truth::Orphans) {
    // The clamps the run's instances and the clean one share.
    let limits = clean.service.limits();
    let run = workload::run(&workload, instances).await;
    let history = History::new();
    for op in run.ops {
        history.record(op);
    }
    for (caller, index) in run.callers {
        history.note_caller(caller, index);
    }
    settle_and_verify(&workload, &run.pools, clean, &history, limits).await;
    let ops = history.snapshot();
    if let Ok(path) = std::env::var("SEMAPHORE_DUMP") {
        let lines: Vec<String> = ops.iter().map(|o| format!("{o:?}")).collect();
        std::fs::write(format!("{path}.{name}"), lines.join("\n")).expect("dump");
    }
    let checked = std::time::Instant::now();
    let violations = check(&ops, &config(faults, limits));
    let mut latencies: Vec<u64> = ops.iter().map(|o| o.response_ms - o.invoke_ms).collect();
    latencies.sort_unstable();
    eprintln!(
        "{name}: {} in {:.1}s, checked in {:.1}s; latency p50 {} ms, p99 {} ms, max {} ms",
        history::summary(&ops),
        run.elapsed.as_secs_f64(),
        checked.elapsed().as_secs_f64(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        latencies[latencies.len() - 1],
    );
    let stored = truth.leases();
    let orphans = truth::orphans(&stored, &ops, &history.callers());
    eprintln!(
        "{name}: {} leases stored, {} orphaned, {:.3} orphaned slot-seconds",
        stored.len(),
        orphans.leases.len(),
        orphans.slot_seconds()
    );
    let callers = history.callers();
    // Allowed: a lease handed to a waiter whose client died, while its
    // ticket lived (its give-up time, rounded up to a second, and a grace
    // second), for one ttl.
    let stranded_by_the_dead = |l: &truth::StoredLease| {
        let Some(dead) = l
            .borrower
            .and_then(|c| callers.get(&c))
            .map(|&i| &ops[i])
            .filter(|op| op.status == history::NO_ANSWER)
        else {
            return false;
        };
        let Call::Borrow { wait_ms, .. } = dead.call else {
            return false;
        };
        let ticket_ends = dead.invoke_ms + wait_ms + 1000 + semaphore::domain::TICKET_GRACE_MS;
        dying
            && l.granted_ms <= ticket_ends
            && l.expires_at_ms.saturating_sub(l.granted_ms) <= limits.max_ttl_ms
    };
    let described: Vec<String> = orphans
        .leases
        .iter()
        .filter(|l| !stranded_by_the_dead(l))
        .map(|l| truth::describe(l, &ops, &callers))
        .collect();
    // A lease written by a call that then failed, and deleted with its pool
    // before that call answered, was never held by an untold lease: 0 ms.
    assert!(
        described.is_empty(),
        "{name}: slots held by leases no client was told about (SEMAPHORE_SEED={}):\n{}",
        workload.seed,
        described.join("\n")
    );
    let shown: Vec<String> = violations.iter().take(20).map(|v| v.to_string()).collect();
    assert!(
        violations.is_empty(),
        "{name}: {} violations with SEMAPHORE_SEED={} (first 20):\n{}",
        violations.len(),
        workload.seed,
        shown.join("\n")
    );
    (ops, orphans)
}

/// After the run, once every lease has surely expired: every pool reads back
/// (200 with its full count available, or 404), and a pool's full count can
/// be borrowed at positions 0‥count-1 and no more — whatever was left behind
/// by calls that failed half-way only cost its ttl. Recorded as client
/// `clients + 1`, so the checker judges these calls too.
async fn settle_and_verify(
    workload: &Workload,
    pools: &[String],
    clean: &ApiClient,
    history: &History,
    limits: Limits,
) {
    let client = workload.clients + 1;
    // A ticket whose owner is gone (died, or failed to cancel) can be handed
    // a slot until its give-up time (rounded up to a second) and a second of
    // grace; that lease then runs its ttl.
    let last_grant = limits.max_wait_ms + 1000 + semaphore::domain::TICKET_GRACE_MS;
    tokio::time::sleep(Duration::from_millis(last_grant + limits.max_ttl_ms + 100)).await;
    for pool in pools {
        let (status, body) = workload::call(clean, history, client, pool, Call::Inspect).await;
        assert!(
            status == 200 || status == 404,
            "{pool}: GET after the run → {status} {body}"
        );
        if status == 404 {
            continue;
        }
        let count = body["count"].as_u64().expect("count");
        assert_eq!(
            body["available"], count,
            "{pool}: not fully available after every ttl: {body}"
        );
        // The leases last the clamped ttl: on a slow machine the check
        // may outlast them, and then proves nothing. Then again, later.
        // (Every lease is granted after `started`, so one that finished
        // within the ttl had them all live until its last return.)
        let mut slow = Duration::ZERO;
        for _ in 0..8 {
            let started = Instant::now();
            let failures = fill_and_empty(clean, history, client, pool, count).await;
            slow = started.elapsed();
            if slow < Duration::from_millis(limits.max_ttl_ms.saturating_sub(2)) {
                assert!(failures.is_empty(), "{pool}: {failures:#?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(limits.max_ttl_ms + 100)).await;
            slow = Duration::MAX;
        }
        assert!(
            slow != Duration::MAX,
            "{pool}: the store was too slow to check the pool within its leases' ttl"
        );
    }
}

/// Borrows `count` leases (positions 0‥count-1), one more (409), then
/// returns them all: what went otherwise.
async fn fill_and_empty(
    clean: &ApiClient,
    history: &History,
    client: usize,
    pool: &str,
    count: u64,
) -> Vec<String> {
    let mut failures = Vec::new();
    let borrow = || Call::Borrow {
        ttl_ms: 60_000,
        wait_ms: 0,
        lease: None,
    };
    let mut leases = Vec::new();
    for position in 0..count {
        let (status, body) = workload::call(clean, history, client, pool, borrow()).await;
        if (status, body["position"].as_u64()) != (200, Some(position)) {
            failures.push(format!("borrow for position {position}: {status} {body}"));
        }
        if let Some(lease) = body["lease"].as_str() {
            leases.push(lease.to_string());
        }
    }
    let (status, _) = workload::call(clean, history, client, pool, borrow()).await;
    if status != 409 {
        failures.push(format!("borrowed more than count {count}: {status}"));
    }
    for lease in leases {
        let (status, body) =
            workload::call(clean, history, client, pool, Call::Return { lease }).await;
        if (status, body["returned"].as_bool()) != (200, Some(true)) {
            failures.push(format!("return: {status} {body}"));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let store = recorded(memory_store(), &truth);
    // One database, several service instances over it.
    let apis = instances((0..INSTANCES).map(|_| store.clone()).collect(), LIMITS);
    let clean = ApiClient::new(store, LIMITS);
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("memory", workload, &apis, &truth, &clean, false).await;
}

/// A waiter that dies after it joins (its request dropped: no cancel, no
/// answer) strands at most one lease's ttl: its ticket keeps its place until
/// its give-up time and a second, and a slot handed to it before then stays
/// held by nobody until its ttl ends. Every other promise holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_dying_waiters_strand_at_most_their_ttl() {
    let truth = Arc::new(Truth::default());
    let (apis, clean) = dynamodb_instances(&truth, LIMITS).await;
    let workload = Workload::new(seed(), operations(3000)).with_dying_waiters(6);
    let (ops, orphans) = run_and_check_orphans(
        "dynamodb+dying",
        workload,
        &apis,
        &truth,
        &clean,
        false,
        true,
    )
    .await;
    let died = ops
        .iter()
        .filter(|o| o.status == history::NO_ANSWER)
        .count();
    eprintln!(
        "dynamodb+dying: {died} waiters died; {} leases stranded, {:.3} slot-seconds (at most {} ms each)",
        orphans.leases.len(),
        orphans.slot_seconds(),
        LIMITS.max_ttl_ms
    );
    assert!(died > 0, "no waiter died: the mode was not exercised");
    assert!(orphans.slot_ms <= orphans.leases.len() as u64 * LIMITS.max_ttl_ms);
}

/// Pools larger than their clients (issue #33): borrowers mostly find free
/// slots and take them, or join behind waiters and are handed spare ones;
/// expiries, give-ups and resizes as in the mix above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_with_room_to_spare_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let store = recorded(memory_store(), &truth);
    let apis = instances((0..INSTANCES).map(|_| store.clone()).collect(), ROOM_LIMITS);
    let clean = ApiClient::new(store, ROOM_LIMITS);
    let workload = Workload::new(seed(), operations(3000)).with_room();
    run_and_check("memory+room", workload, &apis, &truth, &clean, false).await;
}

/// Every pool split between its pool item and segments (issue #34), small
/// so that borrowers contend: each write as the pool item can check it,
/// compaction at every chance (live leases once 100 ms old: this mix sends
/// no lease id twice at once, whose grant a longer age keeps hot), a slot
/// taken twice by one lease id given back.
fn split_timing() -> Timing {
    Timing {
        compaction: Compaction {
            split_above: 0,
            hot_max: 1,
            cold_after_ms: 100,
            // Short, so that claims lapse and are claimed over while their
            // compactions are still under way: compactions race too.
            claim_ms: 200,
        },
        ..Timing::default()
    }
}

fn split_instances(stores: Vec<Arc<dyn PoolStore>>) -> Vec<Arc<ApiClient>> {
    stores
        .into_iter()
        .map(|store| Arc::new(ApiClient::with_timing(store, LIMITS, split_timing())))
        .collect()
}

/// The run compacted often.
fn compacted(name: &str, truth: &Truth) {
    let compactions = truth.compactions.load(Ordering::Relaxed);
    eprintln!("{name}: {compactions} compactions landed");
    assert!(
        compactions > 10,
        "compaction was not exercised: {compactions}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_split_pools_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let store = recorded(memory_store(), &truth);
    let apis = split_instances((0..INSTANCES).map(|_| store.clone()).collect());
    let clean = ApiClient::with_timing(store, LIMITS, split_timing());
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("memory+split", workload, &apis, &truth, &clean, false).await;
    compacted("memory+split", &truth);
}

/// The same on DynamoDB Local: segments in items of their own, each
/// compaction writing its segment before the pool item, reads after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_split_pools_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(recorded(dynamodb_store().await, &truth));
    }
    let apis = split_instances(stores);
    let clean = ApiClient::with_timing(dynamodb_store().await, LIMITS, split_timing());
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("dynamodb+split", workload, &apis, &truth, &clean, false).await;
    compacted("dynamodb+split", &truth);
}

/// Timing of a process that stores every pool flat (as every version
/// before the split layout did), beside [`split_timing`]'s.
fn flat_timing() -> Timing {
    Timing {
        compaction: Compaction {
            split_above: u16::MAX,
            ..split_timing().compaction
        },
        ..Timing::default()
    }
}

/// Half the instances over `stores` store every pool flat and never split
/// one, half split every flat pool they write (and compact).
fn upgrading_instances(stores: Vec<Arc<dyn PoolStore>>) -> Vec<Arc<ApiClient>> {
    stores
        .into_iter()
        .enumerate()
        .map(|(i, store)| {
            let timing = if i % 2 == 0 {
                flat_timing()
            } else {
                split_timing()
            };
            Arc::new(ApiClient::with_timing(store, LIMITS, timing))
        })
        .collect()
}

/// Pools were split in place during the run.
fn split_in_place(name: &str, truth: &Truth) {
    let splits = truth.splits.load(Ordering::Relaxed);
    eprintln!("{name}: {splits} pools split in place");
    assert!(splits > 3, "no pool was split in place: {splits}");
    compacted(name, truth);
}

/// An upgrade under load: pools are split while they are borrowed, waited
/// on, returned, resized and deleted, and served by both kinds of process
/// after ([`upgrading_instances`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_pools_split_in_place_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(recorded(dynamodb_store().await, &truth));
    }
    let apis = upgrading_instances(stores);
    let clean = ApiClient::with_timing(dynamodb_store().await, LIMITS, flat_timing());
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("dynamodb+upgrade", workload, &apis, &truth, &clean, false).await;
    split_in_place("dynamodb+upgrade", &truth);
}

/// The same on the in-memory store, which checks a write planned on a flat
/// pool split since as DynamoDB does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_pools_split_in_place_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let store = recorded(memory_store(), &truth);
    let apis = upgrading_instances((0..INSTANCES).map(|_| store.clone()).collect());
    let clean = ApiClient::with_timing(store, LIMITS, flat_timing());
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("memory+upgrade", workload, &apis, &truth, &clean, false).await;
    split_in_place("memory+upgrade", &truth);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "issue 62: under CI's load a borrow on a flat pool with room is still answered 409 while a slot is free throughout its call (LostWakeup, 1 run in 8 with it in the whole suite on 2026-12-07; route not found yet); out of the gate until fixed; run by `tests/run --randomized`"]
async fn dynamodb_with_room_to_spare_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let (apis, clean) = dynamodb_instances(&truth, ROOM_LIMITS).await;
    let workload = Workload::new(seed(), operations(3000)).with_room();
    run_and_check("dynamodb+room", workload, &apis, &truth, &clean, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_random_history_is_correct() {
    let truth = Arc::new(Truth::default());
    let (apis, clean) = dynamodb_instances(&truth, LIMITS).await;
    let workload = Workload::new(seed(), operations(3000));
    run_and_check("dynamodb", workload, &apis, &truth, &clean, false).await;
}

/// Store calls fail before or after landing, land and are then reported lost
/// (an SDK retry of a landed write), are throttled or delayed. The API must
/// still never over-issue, never answer 200 for a lease it did not store,
/// never leave a lease stored that no client was told about, answer failures
/// as 502 `{"error": …}`, and leave every pool whole: readable, decodable,
/// and fully available once the ttls have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_with_store_faults_random_history_is_correct() {
    let seed = seed();
    let counts = Arc::new(FaultCounts::default());
    let mut stores: Vec<Arc<dyn PoolStore>> = Vec::new();
    let truth = Arc::new(Truth::default());
    for i in 0..INSTANCES {
        let inner = recorded(dynamodb_store().await, &truth);
        let faulty = FaultyStore::new(
            inner,
            FaultPlan {
                first_delete_fails_after: true,
                ..FaultPlan::default()
            },
            seed ^ (i as u64 + 1),
            counts.clone(),
        );
        stores.push(Arc::new(faulty));
    }
    let apis = instances(stores, LIMITS);
    let clean = ApiClient::new(dynamodb_store().await, LIMITS);
    let mut workload = Workload::new(seed, operations(2000));
    // Own leases returned more often: every 200 must name a stored lease.
    workload.weights[2] = 30;
    let ops = run_and_check("dynamodb+faults", workload, &apis, &truth, &clean, true).await;
    eprintln!("dynamodb+faults: {counts}");

    assert!(counts.failed_after.load(Ordering::Relaxed) > 0, "{counts}");
    assert!(counts.retries_lost.load(Ordering::Relaxed) > 0, "{counts}");
    assert!(counts.throttled.load(Ordering::Relaxed) > 0, "{counts}");
    let failed = ops.iter().filter(|o| o.status == 502).count();
    assert!(failed > 0, "no call failed: faults were not exercised");

    // Every pool's item still decodes.
    let raw = DynamoDbStore::new(dynamodb_client().await, TABLE);
    let pools: std::collections::BTreeSet<String> =
        ops.iter().map(|o| o.pool.to_lowercase()).collect();
    for pool in pools {
        let id = api::parse_pool_id(&pool).expect("pool id");
        raw.load(&id.key())
            .await
            .unwrap_or_else(|e| panic!("{pool}: stored item does not decode: {e}"));
    }
}

/// The checker is not vacuous: a store whose writes ignore their conditions
/// (lost updates) must show over-issue, shared positions or lost leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checker_catches_a_store_that_ignores_conditions() {
    let store: Arc<dyn PoolStore> = Arc::new(Forward(broken::IgnoresConditions(memory_store())));
    let apis = instances((0..INSTANCES).map(|_| store.clone()).collect(), LIMITS);
    let workload = Workload::new(seed(), 1500);
    let run = workload::run(&workload, &apis).await;
    let violations = check(&run.ops, &config(false, LIMITS));
    let rules: std::collections::BTreeSet<_> = violations.iter().map(|v| v.rule).collect();
    eprintln!(
        "ignores conditions: {} violations, rules {rules:?}",
        violations.len()
    );
    assert!(
        rules
            .iter()
            .any(|r| matches!(r, Rule::OverIssue | Rule::SharedPosition | Rule::LostLease)),
        "lost updates went unnoticed (SEMAPHORE_SEED={}): {violations:#?}",
        workload.seed
    );
}

/// …and a store whose reads are up to half a second stale must show waiters
/// refused while a slot was free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checker_catches_a_store_with_stale_reads() {
    // Each instance caches its own reads: it sees other instances' writes
    // late (its own at once).
    let shared = memory_store();
    let apis = instances(
        (0..INSTANCES)
            .map(|_| {
                Arc::new(Forward(broken::StaleReads::new(shared.clone()))) as Arc<dyn PoolStore>
            })
            .collect(),
        LIMITS,
    );
    let mut workload = Workload::new(seed(), 1500);
    // No waiting borrowers: with waiters around, a refused newcomer may owe
    // the free slot to one of them; without, it owes it to nobody.
    workload.weights[workload::Kind::BorrowWaiting as usize] = 0;
    let run = workload::run(&workload, &apis).await;
    let violations = check(&run.ops, &config(false, LIMITS));
    let rules: std::collections::BTreeSet<_> = violations.iter().map(|v| v.rule).collect();
    eprintln!(
        "stale reads: {} violations, rules {rules:?}",
        violations.len()
    );
    assert!(
        rules.contains(&Rule::LostWakeup),
        "stale reads went unnoticed (SEMAPHORE_SEED={}): {violations:#?}",
        workload.seed
    );
}

/// …and the orphan measure is not vacuous: when a landed write's answer is
/// lost and the service cannot see it landed (as before it read again after
/// an unknown outcome), leases nobody was told about hold slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphans_are_found_when_landed_writes_go_unseen() {
    let truth = Arc::new(Truth::default());
    let store = recorded(memory_store(), &truth);
    let store: Arc<dyn PoolStore> = Arc::new(Forward(broken::HidesLandedGrants::new(store)));
    let apis = instances((0..INSTANCES).map(|_| store.clone()).collect(), LIMITS);
    let mut workload = Workload::new(seed(), 1500);
    // No waiting borrowers: one that waits past its hidden lease's ttl
    // answers after the orphan has expired (0 ms), which left this test
    // finding nothing in about one run of three.
    workload.weights[workload::Kind::BorrowWaiting as usize] = 0;
    let run = workload::run(&workload, &apis).await;
    let orphans = truth::orphans(&truth.leases(), &run.ops, &run.callers);
    eprintln!(
        "hides landed grants: {} orphaned leases, {:.3} orphaned slot-seconds",
        orphans.leases.len(),
        orphans.slot_seconds()
    );
    assert!(
        orphans.slot_ms > 0,
        "unseen landed grants went unnoticed (SEMAPHORE_SEED={})",
        workload.seed
    );
}

/// Deliberately wrong stores.
mod broken {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use async_trait::async_trait;
    use semaphore::domain::{Change, Pool, Slot, Update};
    use semaphore::keys::PoolKey;
    use semaphore::store::{PoolStore, Record, StoreError, Updated};
    use semaphore_tests::forward::Around;

    /// Applies every update's changes whatever the pool is now: no condition
    /// but the incarnation is checked.
    pub struct IgnoresConditions(pub Arc<dyn PoolStore>);

    #[async_trait]
    impl Around for IgnoresConditions {
        fn inner(&self) -> &dyn PoolStore {
            &*self.0
        }
        async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
            let loaded = self.0.load(key).await;
            // Widen the read-to-write window so that writers overlap.
            tokio::time::sleep(Duration::from_millis(2)).await;
            loaded
        }
        async fn update(
            &self,
            key: &PoolKey,
            read: &Record,
            update: &Update,
        ) -> Result<Updated, StoreError> {
            let unconditional = Update {
                expect: Vec::new(),
                changes: update.changes.clone(),
            };
            self.0.update(key, read, &unconditional).await
        }
    }

    /// One grant in ten lands, then fails, and for the next 5 s every record
    /// of that pool it returns leaves the lease out: the service cannot
    /// recognise its write (as before it read again after an unknown outcome).
    pub struct HidesLandedGrants {
        inner: Arc<dyn PoolStore>,
        calls: std::sync::atomic::AtomicU64,
        hidden: Mutex<Vec<(PoolKey, semaphore::domain::LeaseDigest, Instant)>>,
    }

    impl HidesLandedGrants {
        pub fn new(inner: Arc<dyn PoolStore>) -> Self {
            HidesLandedGrants {
                inner,
                calls: Default::default(),
                hidden: Mutex::new(Vec::new()),
            }
        }

        fn hide(&self, key: &PoolKey, mut record: Record) -> Record {
            let hidden = self.hidden.lock().unwrap();
            let gone: Vec<_> = hidden
                .iter()
                .filter(|(k, _, at)| k == key && at.elapsed() < Duration::from_secs(5))
                .map(|(_, digest, _)| *digest)
                .collect();
            let pool = &record.pool;
            let slots = pool
                .slots()
                .iter()
                .map(|slot| match slot {
                    Slot::Held { holder, .. } if gone.contains(&holder.digest) => Slot::Free,
                    other => *other,
                })
                .collect();
            if let Ok(pool) = Pool::from_parts(
                pool.sizing(),
                pool.base_us(),
                pool.next_fence(),
                slots,
                pool.queue().to_vec(),
                pool.given_up().to_vec(),
                pool.ended().to_vec(),
            ) {
                record.pool = pool;
            }
            record
        }
    }

    #[async_trait]
    impl Around for HidesLandedGrants {
        fn inner(&self) -> &dyn PoolStore {
            &*self.inner
        }
        async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
            Ok(self.inner.load(key).await?.map(|r| self.hide(key, r)))
        }
        async fn update(
            &self,
            key: &PoolKey,
            read: &Record,
            update: &Update,
        ) -> Result<Updated, StoreError> {
            let granted = update.changes.iter().find_map(|c| match *c {
                Change::Take { position, .. } | Change::HandOff { position, .. } => Some(position),
                _ => None,
            });
            let n = self
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let outcome = self.inner.update(key, read, update).await?;
            // The lease the write granted: whoever holds its position now.
            let granted = match (&outcome, granted) {
                (Updated::Written(r), Some(position)) => r
                    .pool
                    .leases()
                    .into_iter()
                    .find(|l| l.position == position)
                    .map(|l| l.digest),
                _ => None,
            };
            match (granted, outcome) {
                (Some(digest), Updated::Written(_)) if n.is_multiple_of(10) => {
                    self.hidden
                        .lock()
                        .unwrap()
                        .push((*key, digest, Instant::now()));
                    Err(StoreError::new(
                        semaphore::store::StoreErrorKind::Unavailable,
                        "answer lost after the write landed",
                    ))
                }
                (_, Updated::Written(r)) => Ok(Updated::Written(self.hide(key, r))),
                (_, Updated::Lost(r)) => Ok(Updated::Lost(self.hide(key, r))),
                (_, Updated::Gone) => Ok(Updated::Gone),
            }
        }
    }

    /// Serves each pool's reads from a copy refreshed every 500 ms.
    pub struct StaleReads {
        inner: Arc<dyn PoolStore>,
        cache: Mutex<HashMap<PoolKey, (Instant, Option<Record>)>>,
    }

    impl StaleReads {
        pub fn new(inner: Arc<dyn PoolStore>) -> Self {
            StaleReads {
                inner,
                cache: Mutex::new(HashMap::new()),
            }
        }
    }

    #[async_trait]
    impl Around for StaleReads {
        fn inner(&self) -> &dyn PoolStore {
            &*self.inner
        }
        async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
            if let Some((at, cached)) = self.cache.lock().unwrap().get(key) {
                if at.elapsed() < Duration::from_millis(500) {
                    return Ok(cached.clone());
                }
            }
            let fresh = self.inner.load(key).await?;
            self.cache
                .lock()
                .unwrap()
                .insert(*key, (Instant::now(), fresh.clone()));
            Ok(fresh)
        }
        async fn update(
            &self,
            key: &PoolKey,
            read: &Record,
            update: &Update,
        ) -> Result<Updated, StoreError> {
            let outcome = self.inner.update(key, read, update).await?;
            // A writer learns the truth from its own writes (else it would only
            // lose races until the cache expires); waiters keep reading stale
            // state after a return, so their wake-ups get lost.
            if let Updated::Written(current) | Updated::Lost(current) = &outcome {
                self.cache
                    .lock()
                    .unwrap()
                    .insert(*key, (Instant::now(), Some(current.clone())));
            }
            Ok(outcome)
        }
    }
}
