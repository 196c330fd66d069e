//! Benchmark of the semaphore service (issues #5, #10, #13): DynamoDB cost
//! and latency per operation; contention goodput of the new write path
//! against the old one and a naive baseline; fairness under saturation; the
//! read load of many waiters; wake delay, polling rate and item size.
//! Markdown to stdout, JSON and SVG plots to files. Run `bench --help` for
//! the options.

mod backend;
mod cli;
mod fairness;
mod naive;
mod plot;
mod report;
mod scenarios;
mod stats;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use semaphore::clock::now_ms;
use semaphore::store::MemoryStore;
use semaphore::Limits;

use crate::backend::{Backend, LocalDynamoDb, Store};
use crate::cli::{Args, Profile, RoomShape, Section, ROOM_DEFAULT};
use crate::fairness::{ReadLoadSpec, SaturationSpec};
use crate::report::{Meta, Report};
use crate::scenarios::{Env, Shape, Strategy, Trigger};

/// How much of everything a profile measures.
struct Plan {
    op_samples: usize,
    warmup_samples: usize,
    warmup_seconds: f64,
    clients: Vec<usize>,
    /// The `room` section's rows.
    room: Vec<RoomShape>,
    seconds: f64,
    saturation_seconds: f64,
    waiters: Vec<usize>,
    /// DynamoDB read-load runs only up to this many waiters.
    dynamodb_max_waiters: usize,
    read_window: Duration,
    read_gap: Duration,
    max_returns: usize,
    max_expiries: usize,
    wake_samples: usize,
    wake_lanes: usize,
    /// The smoke profile measures wake and polling for the new policy only.
    wake_old: bool,
    poll_seconds: f64,
}

impl Plan {
    fn new(args: &Args) -> Self {
        let mut plan = match args.profile {
            Profile::Smoke => Plan {
                op_samples: 5,
                warmup_samples: 3,
                warmup_seconds: 0.3,
                clients: vec![1, 16],
                room: vec![RoomShape {
                    count: 8,
                    held: 2,
                    clients: 4,
                    churn: false,
                }],
                // Long enough for naive to finish cycles at 16 clients, +8 ms,
                // on a debug build.
                seconds: 1.0,
                saturation_seconds: 1.5,
                waiters: vec![10],
                dynamodb_max_waiters: 10,
                read_window: Duration::from_millis(500),
                read_gap: Duration::from_millis(200),
                max_returns: 2,
                max_expiries: 1,
                wake_samples: 8,
                wake_lanes: 4,
                wake_old: false,
                poll_seconds: 0.5,
            },
            Profile::Full => Plan {
                op_samples: 50,
                warmup_samples: 50,
                warmup_seconds: 5.0,
                clients: vec![1, 4, 16, 64],
                room: ROOM_DEFAULT.to_vec(),
                seconds: 6.0,
                saturation_seconds: 60.0,
                waiters: vec![10, 100, 1000],
                dynamodb_max_waiters: 100,
                read_window: Duration::from_secs(4),
                read_gap: Duration::from_millis(300),
                max_returns: 15,
                max_expiries: 8,
                wake_samples: 120,
                wake_lanes: 8,
                wake_old: true,
                poll_seconds: 5.0,
            },
        };
        if let Some(clients) = &args.clients {
            plan.clients.clone_from(clients);
        }
        if let Some(room) = &args.room {
            plan.room.clone_from(room);
        }
        if let Some(seconds) = args.seconds {
            plan.seconds = seconds;
        }
        if let Some(seconds) = args.saturation_seconds {
            plan.saturation_seconds = seconds;
        }
        if let Some(waiters) = &args.waiters {
            plan.waiters.clone_from(waiters);
            plan.dynamodb_max_waiters = plan.dynamodb_max_waiters.max(100);
        }
        plan
    }

    fn read_load(&self, waiters: usize) -> ReadLoadSpec {
        ReadLoadSpec {
            waiters,
            window: self.read_window,
            returns: self.max_returns.min(waiters / 2).max(1),
            expiries: self.max_expiries.min(waiters / 4).max(1),
            gap: self.read_gap,
        }
    }
}

/// Item shapes: (count, waiting tickets), all slots held.
const ITEM_SHAPES: [(u16, usize); 8] = [
    (1, 0),
    (4, 0),
    (16, 0),
    (32, 0),
    (100, 0),
    (1000, 0),
    (4, 100),
    (4, 1000),
];

fn main() -> ExitCode {
    // Usage errors exit 2 and --help exits 0, both here.
    let args = Args::parse();
    // Declared before the runtime so it is stopped after every task is gone.
    let local = match &args.dynamodb {
        _ if !args.dynamodb_store() => None,
        Some(_) => None,
        None => match LocalDynamoDb::start() {
            Ok(local) => Some(local),
            Err(e) => {
                eprintln!("bench: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let endpoint = args
        .dynamodb
        .clone()
        .or_else(|| local.as_ref().map(|l| l.endpoint.clone()))
        .unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run(&args, &endpoint, local.is_some()) => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_string()),
        }
    });
    // Stop client tasks before DynamoDB Local goes away.
    runtime.shutdown_background();
    drop(local);
    match outcome {
        Ok(report) if args.check && !report.all_met() => {
            eprintln!("bench: some targets are not met (--check)");
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn progress(what: &str) {
    eprintln!("bench: {what}");
}

async fn run(args: &Args, endpoint: &str, started: bool) -> Result<Report, String> {
    let plan = Plan::new(args);
    let t0 = Instant::now();
    let started_unix_ms = now_ms();
    let timing = args.timing();
    let strategies = args.strategies();
    let latencies = args.latencies();
    let env = |store: Store, latency: Duration| Env {
        backend: Backend {
            store,
            added_latency: latency,
        },
        timing,
        limits: Limits::default(),
    };
    let dynamodb = env(
        Store::DynamoDb {
            endpoint: endpoint.to_string(),
        },
        Duration::ZERO,
    );
    let memory = env(Store::Memory(Arc::new(MemoryStore::new())), Duration::ZERO);
    if args.dynamodb_store() {
        dynamodb.backend.prepare().await?;
        // DynamoDB Local is a JVM: its first requests are slow until the JIT warms up.
        progress("warming up DynamoDB");
        scenarios::operations(&dynamodb, plan.warmup_samples).await?;
        let warmup = plan.warmup_seconds;
        scenarios::contention(&dynamodb, Strategy::New, 4, warmup, args.hold).await?;
    }
    let with_latency = |env: &Env, latency: Duration| Env {
        backend: env.backend.with_latency(latency),
        ..env.clone()
    };
    let fair: Vec<Strategy> = strategies
        .iter()
        .copied()
        .filter(|s| s.is_service())
        .collect();
    let wake_strategies: Vec<Strategy> = fair
        .iter()
        .copied()
        .filter(|s| plan.wake_old || *s == Strategy::New)
        .collect();
    let read_latency = latencies.iter().copied().max().unwrap_or_default();

    let mut operations = Vec::new();
    let mut contention = Vec::new();
    let mut room = Vec::new();
    let mut saturation = Vec::new();
    let mut read_load = Vec::new();
    let mut wake = Vec::new();
    let mut polling = Vec::new();
    let envs = [
        Some(&dynamodb).filter(|_| args.dynamodb_store()),
        Some(&memory).filter(|_| args.memory_store()),
    ];
    let saturation_env = envs.iter().flatten().next().copied();
    for env in envs.into_iter().flatten() {
        let name = env.backend.name();
        if args.runs(Section::Operations) {
            progress(&format!("{name}: cost per operation"));
            operations.extend(scenarios::operations(env, plan.op_samples).await?);
        }
        if args.runs(Section::Contention) {
            for &latency in &latencies {
                let delayed = with_latency(env, latency);
                for &clients in &plan.clients {
                    for &strategy in &strategies {
                        progress(&format!(
                            "{name}: contention, +{} ms, C={clients}, {}",
                            latency.as_millis(),
                            strategy.name()
                        ));
                        contention.push(
                            scenarios::contention(
                                &delayed,
                                strategy,
                                clients,
                                plan.seconds,
                                args.hold,
                            )
                            .await?,
                        );
                    }
                }
            }
        }
        if args.runs(Section::Room) {
            // At the largest delay: the one closest to a real network.
            let delayed = with_latency(env, read_latency);
            for &shape in &plan.room {
                progress(&format!(
                    "{name}: room to spare, +{} ms, count {} with {}, C={}",
                    read_latency.as_millis(),
                    shape.count,
                    if shape.churn {
                        "every slot churning".to_string()
                    } else {
                        format!("{} held", shape.held)
                    },
                    shape.clients
                ));
                room.push(
                    scenarios::contention_on(
                        &delayed,
                        Strategy::New,
                        shape.clients,
                        plan.seconds,
                        args.hold,
                        Shape {
                            count: shape.count,
                            held: shape.held,
                            churn: shape.churn,
                        },
                    )
                    .await?,
                );
            }
        }
        if args.runs(Section::Saturation) && saturation_env.is_some_and(|e| std::ptr::eq(e, env)) {
            for &strategy in &fair {
                progress(&format!(
                    "{name}: saturation, {} s, {}",
                    plan.saturation_seconds,
                    strategy.name()
                ));
                let spec = SaturationSpec::issue_10(plan.saturation_seconds);
                saturation.push(fairness::saturation(env, strategy, spec).await?);
            }
        }
        if args.runs(Section::Waiters) {
            let (delayed, max) = if env.backend.is_dynamodb() {
                (env.clone(), plan.dynamodb_max_waiters)
            } else {
                (with_latency(env, read_latency), usize::MAX)
            };
            for &waiters in plan.waiters.iter().filter(|n| **n <= max) {
                for &strategy in &fair {
                    progress(&format!(
                        "{name}: read load, {waiters} waiters, +{} ms, {}",
                        delayed.backend.added_latency.as_millis(),
                        strategy.name()
                    ));
                    let spec = plan.read_load(waiters);
                    read_load.push(fairness::read_load(&delayed, strategy, spec).await?);
                }
            }
        }
        if args.runs(Section::Wake) {
            for &strategy in &wake_strategies {
                for trigger in [Trigger::Return, Trigger::Expiry, Trigger::Raise] {
                    progress(&format!(
                        "{name}: wake delay after {}, {}",
                        trigger.name(),
                        strategy.name()
                    ));
                    wake.push(
                        scenarios::wake(env, strategy, trigger, plan.wake_samples, plan.wake_lanes)
                            .await?,
                    );
                }
            }
        }
        if args.runs(Section::Polling) {
            for &strategy in &wake_strategies {
                progress(&format!("{name}: polling rate, {}", strategy.name()));
                polling.push(scenarios::polling(env, strategy, plan.poll_seconds).await?);
            }
        }
    }
    let item_size = if args.runs(Section::Items) {
        progress("item sizes");
        let measured = Some(&dynamodb.backend).filter(|_| args.dynamodb_store());
        scenarios::item_sizes(measured, &ITEM_SHAPES).await?
    } else {
        Vec::new()
    };

    let mut report = Report {
        meta: Meta {
            profile: args.profile.name().into(),
            dynamodb_endpoint: endpoint.into(),
            dynamodb_started_by_bench: started,
            started_unix_ms,
            elapsed_s: 0.0,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            poll_ms: timing.poll.as_millis() as u64,
            poll_cap_ms: timing.poll_cap.as_millis() as u64,
            strategies: strategies.iter().map(|s| s.name().to_string()).collect(),
            contention_count: scenarios::CONTENTION_COUNT,
            contention_seconds: plan.seconds,
            contention_hold_ms: args.hold.as_millis() as u64,
            contention_latencies_ms: latencies.iter().map(|l| l.as_millis() as u64).collect(),
            saturation_seconds: plan.saturation_seconds,
            read_load_memory_latency_ms: read_latency.as_millis() as u64,
            notes: notes(),
        },
        operations,
        contention,
        room,
        cost: Vec::new(),
        saturation,
        read_load,
        wake,
        polling,
        item_size,
        targets: Vec::new(),
        plots: Vec::new(),
    };
    report.derive_cost();
    report.evaluate_targets();
    report.meta.elapsed_s = stats::round3(t0.elapsed().as_secs_f64());
    write_outputs(args, &mut report)?;
    print!("{}", report.markdown());
    Ok(report)
}

fn notes() -> Vec<String> {
    [
        "calls = HTTP requests the SDK sent (an interceptor counts every attempt, so SDK retries are included); \
         on the in-memory store, store calls.",
        "WCU/RCU (model) = DynamoDB's billing rules applied to our item sizes: 1 WCU per started KB of the larger \
         of old and new item, failed conditional writes included; 1 RCU per started 4 KB of a strongly \
         consistent read. \"units reported\" = ConsumedCapacity returned by DynamoDB Local (read + write), \
         which a failed conditional write does not carry.",
        "Strategies: new = the service as shipped (hand-off: the write that frees a slot gives it to the \
         head of the queue; fair FIFO waiting); naive = the aws-samples Step Functions semaphore's way \
         (whole-pool conditions, re-read after every conflict, fixed 3 s sleep when the pool is full). The \
         design before hand-off is no longer in the code: its figures, measured on the same machine before \
         the change, are in docs/BENCHMARK.md.",
        "successes / attempt = conditional writes that landed ÷ PutItem and UpdateItem requests sent (every \
         attempt, failed conditions included: DynamoDB bills each one, a failed one at the item's size).",
        "+ms = simulated network delay added to every store call (half before, half after it).",
        "Latencies are against DynamoDB Local or the in-memory store on this machine, sharing its CPUs with \
         the clients: they show the service's policies, not DynamoDB's own latency.",
        "Wake delay runs from the moment the return (or count raise) call completed, or from the lease's \
         expiry instant, to the waiter's borrow call returning with a grant.",
        "fairness / Jain = Jain's index over the clients' completed cycles (contention) or grants (saturation): \
         1 when all got equal shares, 1/C when one client got everything.",
        "Contention rows are steady state: counters are read as the run ends and only cycles finished by \
         then count (the borrows still waiting all give up at that instant; their cancels are left out). \
         In memory without a simulated delay the store never yields, so clients barely overlap: those rows \
         measure CPU cost, not contention.",
        "Saturation: a grant is in order unless some borrower whose borrow call started before this grant's \
         borrow call got its own grant later (a higher fence; fences rise in grant order). 409s are neither \
         grants nor overtaken. Excused variants: the overtaken borrower started within 10 ms before, or was \
         granted within one head poll (Timing::poll) after. Ideal FIFO wait = (clients − count) ÷ grants per \
         second: by Little's law the mean wait of this closed loop at the measured throughput, which a FIFO \
         queue gives every borrower.",
        "Read load: reads counted over a window once every waiter waits; then one slot is returned repeatedly \
         (each return lets the head of the queue in) and the others expire one by one; wake = return call \
         answered (or expiry instant) → next grant.",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

fn write_outputs(args: &Args, report: &mut Report) -> Result<(), String> {
    let create_dir = |dir: &Path| {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
    };
    create_dir(&args.svg_dir)?;
    for (name, chart) in report.plots() {
        let svg = plot::render(&chart)?;
        let path = args.svg_dir.join(name);
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        report.plots.push(path.display().to_string());
    }
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(parent)?;
    }
    let json = serde_json::to_string_pretty(&*report).map_err(|e| format!("report: {e}"))?;
    std::fs::write(&args.out, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    progress(&format!(
        "wrote {} and {} plots in {}",
        args.out.display(),
        report.plots.len(),
        args.svg_dir.display()
    ));
    Ok(())
}
