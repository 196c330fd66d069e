//! Benchmark of the semaphore service (issue #5): DynamoDB cost and latency per
//! operation, contention goodput against a naive baseline, wake delay, polling
//! rate and item size. Markdown to stdout, JSON and SVG plots to files.
//! Run `bench --help` for the options.

mod backend;
mod cli;
mod naive;
mod plot;
mod report;
mod scenarios;
mod stats;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use semaphore::service::now_ms;
use semaphore::store::MemoryStore;

use crate::backend::{Backend, LocalDynamoDb, Store};
use crate::cli::{Args, Profile, Section};
use crate::report::{Meta, Report};
use crate::scenarios::{Strategy, Trigger};

/// How much of everything a profile measures.
struct Plan {
    op_samples: usize,
    warmup_samples: usize,
    warmup_seconds: f64,
    clients: Vec<usize>,
    seconds: f64,
    wake_samples: usize,
    wake_lanes: usize,
    poll_seconds: f64,
}

impl Plan {
    fn new(args: &Args) -> Self {
        let mut plan = match args.profile {
            Profile::Smoke => Plan {
                op_samples: 5,
                warmup_samples: 5,
                warmup_seconds: 0.5,
                clients: vec![1, 4, 16],
                seconds: 1.0,
                wake_samples: 12,
                wake_lanes: 4,
                poll_seconds: 1.0,
            },
            Profile::Full => Plan {
                op_samples: 50,
                warmup_samples: 50,
                warmup_seconds: 5.0,
                clients: vec![1, 4, 16, 64],
                seconds: 10.0,
                wake_samples: 200,
                wake_lanes: 8,
                poll_seconds: 5.0,
            },
        };
        if let Some(clients) = &args.clients {
            plan.clients.clone_from(clients);
        }
        if let Some(seconds) = args.seconds {
            plan.seconds = seconds;
        }
        plan
    }
}

const ITEM_COUNTS: [u16; 4] = [1, 16, 100, 1000];

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
    let dynamodb = Backend {
        store: Store::DynamoDb {
            endpoint: endpoint.to_string(),
        },
        added_latency: args.added_latency,
    };
    let memory = Backend {
        store: Store::Memory(Arc::new(MemoryStore::new())),
        added_latency: args.added_latency,
    };
    let backoff = args.backoff();
    if args.dynamodb_store() {
        dynamodb.prepare().await?;
        // DynamoDB Local is a JVM: its first requests are slow until the JIT warms up.
        progress("warming up DynamoDB");
        scenarios::operations(&dynamodb, backoff, plan.warmup_samples).await?;
        let warmup = plan.warmup_seconds;
        scenarios::contention(&dynamodb, Strategy::Ours, 4, warmup, args.hold, backoff).await?;
    }

    let mut operations = Vec::new();
    let mut contention = Vec::new();
    let mut wake = Vec::new();
    let mut polling = Vec::new();
    let backends = [
        Some(&dynamodb).filter(|_| args.dynamodb_store()),
        Some(&memory).filter(|_| args.memory_store()),
    ];
    for backend in backends.into_iter().flatten() {
        if args.runs(Section::Operations) {
            progress(&format!("{}: cost per operation", backend.name()));
            operations.extend(scenarios::operations(backend, backoff, plan.op_samples).await?);
        }
        let clients = if args.runs(Section::Contention) {
            &plan.clients[..]
        } else {
            &[]
        };
        for &clients in clients {
            for &strategy in &args.strategies {
                progress(&format!(
                    "{}: contention, C={clients}, {}",
                    backend.name(),
                    strategy.name()
                ));
                contention.push(
                    scenarios::contention(
                        backend,
                        strategy,
                        clients,
                        plan.seconds,
                        args.hold,
                        backoff,
                    )
                    .await?,
                );
            }
        }
        let triggers = if args.runs(Section::Wake) {
            &[Trigger::Return, Trigger::Expiry, Trigger::Raise][..]
        } else {
            &[]
        };
        for &trigger in triggers {
            progress(&format!(
                "{}: wake delay after {}",
                backend.name(),
                trigger.name()
            ));
            wake.push(
                scenarios::wake(
                    backend,
                    trigger,
                    plan.wake_samples,
                    plan.wake_lanes,
                    backoff,
                )
                .await?,
            );
        }
        if args.runs(Section::Polling) {
            progress(&format!("{}: polling rate", backend.name()));
            polling.push(scenarios::polling(backend, plan.poll_seconds, backoff).await?);
        }
    }
    let item_size = if args.runs(Section::Items) {
        progress("item sizes");
        let measured = Some(&dynamodb).filter(|_| args.dynamodb_store());
        scenarios::item_sizes(measured, &ITEM_COUNTS).await?
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
            backoff_first_ms: backoff.first.as_millis() as u64,
            backoff_cap_ms: backoff.cap.as_millis() as u64,
            contention_count: scenarios::CONTENTION_COUNT,
            contention_seconds: plan.seconds,
            contention_hold_ms: args.hold.as_millis() as u64,
            added_latency_ms: args.added_latency.as_millis() as u64,
            notes: notes(),
        },
        operations,
        contention,
        wake,
        polling,
        item_size,
        targets: Vec::new(),
        plots: Vec::new(),
    };
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
        "Latencies are against DynamoDB Local on this machine, sharing its CPUs with the clients: \
         they show the service's waiting policy, not DynamoDB's network latency.",
        "Wake delay runs from the moment the return (or count raise) call completed, or from the lease's \
         expiry instant, to the waiter's borrow call returning with a grant.",
        "fairness = Jain's index over the clients' completed cycles: 1 when all got equal shares, \
         1/C when one client got everything.",
        "Naive = re-read after every conflict, fixed 3 s sleep when the pool is full (aws-samples Step \
         Functions semaphore).",
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
