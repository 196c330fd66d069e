//! The report: JSON rows, the targets of issue #5, Markdown and plots.

use std::fmt::Write;

use serde::Serialize;

use crate::plot::{cdf, Chart, Scale, Series, COLORS};
use crate::stats::Summary;

pub const DYNAMODB: &str = "dynamodb-local";

#[derive(Serialize)]
pub struct Report {
    pub meta: Meta,
    pub operations: Vec<OpRow>,
    pub contention: Vec<ContentionRow>,
    pub wake: Vec<WakeRow>,
    pub polling: Vec<PollRow>,
    pub item_size: Vec<ItemRow>,
    pub targets: Vec<Target>,
    pub plots: Vec<String>,
}

#[derive(Serialize)]
pub struct Meta {
    pub profile: String,
    pub dynamodb_endpoint: String,
    pub dynamodb_started_by_bench: bool,
    pub started_unix_ms: u64,
    pub elapsed_s: f64,
    pub cpus: usize,
    pub backoff_first_ms: u64,
    pub backoff_cap_ms: u64,
    pub contention_count: u16,
    pub contention_seconds: f64,
    pub contention_hold_ms: u64,
    /// Simulated network latency added to every store call (0: none).
    pub added_latency_ms: u64,
    pub notes: Vec<String>,
}

/// Per-operation means over `samples` uncontended runs.
#[derive(Serialize)]
pub struct OpRow {
    pub backend: String,
    pub operation: String,
    pub samples: usize,
    /// HTTP requests (SDK retries included) on DynamoDB; store calls in memory.
    pub calls: f64,
    pub get_item: f64,
    pub put_item: f64,
    pub delete_item: f64,
    pub conditional_failures: f64,
    pub model_wcu: f64,
    pub model_rcu: f64,
    /// Read + write units DynamoDB reported (successful calls only).
    pub reported_capacity: Option<f64>,
    pub latency: Summary,
}

#[derive(Serialize)]
pub struct ContentionRow {
    pub backend: String,
    pub strategy: String,
    pub clients: usize,
    pub count: u16,
    /// How long each client held its lease before returning it.
    pub hold_ms: u64,
    pub seconds: f64,
    pub cycles: u64,
    pub cycles_per_s: f64,
    pub write_attempts: u64,
    pub write_successes: u64,
    pub conditional_failures: u64,
    pub successes_per_attempt: f64,
    pub attempts_per_success: f64,
    /// Lost conditional writes per completed cycle, inside borrows and returns.
    pub borrow_conflicts_per_cycle: f64,
    pub return_conflicts_per_cycle: f64,
    pub calls_per_cycle: f64,
    pub reads_per_cycle: f64,
    pub model_wcu_per_cycle: f64,
    pub sdk_retries: u64,
    /// Jain's index over per-client cycles (1 = every client got an equal share).
    pub fairness: f64,
    pub starved_clients: usize,
    /// Borrows still waiting when the run ended.
    pub timeouts: u64,
    /// Failed database calls (SDK errors after its retries).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Borrow latency of granted borrows, waiting included.
    pub borrow: Summary,
}

#[derive(Serialize)]
pub struct WakeRow {
    pub backend: String,
    pub trigger: String,
    pub delay: Summary,
    pub delays_ms: Vec<f64>,
}

#[derive(Serialize)]
pub struct PollRow {
    pub backend: String,
    pub seconds: f64,
    pub reads: u64,
    pub reads_per_s: f64,
}

#[derive(Serialize)]
pub struct ItemRow {
    pub count: u16,
    pub bytes: usize,
    pub wcu_per_write: u64,
    pub rcu_per_read: u64,
    /// 1,000 WCU/s per item (partition) divided by the units of one write.
    pub max_writes_per_s: f64,
    /// Two writes (borrow, return) per cycle.
    pub max_cycles_per_s: f64,
    pub reported_wcu: Option<f64>,
    pub reported_rcu: Option<f64>,
}

#[derive(Serialize)]
pub struct Target {
    pub name: String,
    pub limit: String,
    pub value: Option<f64>,
    /// "met", "not met" or "not measured".
    pub status: String,
}

impl Report {
    fn op(&self, name: &str) -> Option<&OpRow> {
        self.operations
            .iter()
            .find(|r| r.backend == DYNAMODB && r.operation == name)
    }

    fn wake_p99(&self, trigger: &str) -> Option<f64> {
        self.wake
            .iter()
            .find(|r| r.backend == DYNAMODB && r.trigger == trigger)
            .map(|r| r.delay.p99_ms)
    }

    /// The targets of issue #5, all on DynamoDB (Local).
    pub fn evaluate_targets(&mut self) {
        let at_most = |name: &str, limit: f64, unit: &str, value: Option<f64>| Target {
            name: name.into(),
            limit: format!("≤ {limit}{unit}"),
            value,
            status: status(value.map(|v| v <= limit)),
        };
        let contended = self
            .contention
            .iter()
            .find(|r| r.backend == DYNAMODB && r.strategy == "ours" && r.clients == 16)
            .map(|r| r.successes_per_attempt);
        let poll = self
            .polling
            .iter()
            .find(|r| r.backend == DYNAMODB)
            .map(|r| r.reads_per_s);
        let item16 = self
            .item_size
            .iter()
            .find(|r| r.count == 16)
            .map(|r| r.bytes as f64);
        self.targets = vec![
            at_most(
                "uncontended borrow: DynamoDB calls",
                2.0,
                "",
                self.op("borrow (free slot)").map(|r| r.calls),
            ),
            at_most(
                "uncontended return: DynamoDB calls",
                2.0,
                "",
                self.op("return").map(|r| r.calls),
            ),
            at_most(
                "inspect: DynamoDB calls",
                1.0,
                "",
                self.op("inspect").map(|r| r.calls),
            ),
            Target {
                name: "16 clients on count 4: successful writes per conditional-write attempt"
                    .into(),
                limit: "≥ 0.5".into(),
                value: contended,
                status: status(contended.map(|v| v >= 0.5)),
            },
            at_most(
                "wake p99 after a return",
                100.0,
                " ms",
                self.wake_p99("return"),
            ),
            at_most(
                "wake p99 after an expiry",
                10.0,
                " ms",
                self.wake_p99("expiry"),
            ),
            at_most("polling reads per waiter", 20.0, " /s", poll),
            at_most("item size at count 16 fully held", 1024.0, " B", item16),
        ];
    }

    pub fn all_met(&self) -> bool {
        self.targets.iter().all(|t| t.status == "met")
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.meta;
        let added = match m.added_latency_ms {
            0 => String::new(),
            ms => format!(", +{ms} ms simulated network per store call"),
        };
        let _ = writeln!(
            md,
            "## Benchmark ({} profile, {} CPUs, service backoff {}–{} ms{added})\n",
            m.profile, m.cpus, m.backoff_first_ms, m.backoff_cap_ms
        );
        let _ = writeln!(
            md,
            "### DynamoDB cost per operation (uncontended, mean per call)\n\n\
             | operation | calls | GetItem | PutItem | DeleteItem | cond. failed | WCU (model) | RCU (model) | units reported | p50 ms | p99 ms |\n\
             |---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in self.operations.iter().filter(|r| r.backend == DYNAMODB) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
                r.operation,
                r.calls,
                r.get_item,
                r.put_item,
                r.delete_item,
                r.conditional_failures,
                r.model_wcu,
                r.model_rcu,
                opt(r.reported_capacity),
                r.latency.p50_ms,
                r.latency.p99_ms
            );
        }
        let _ = writeln!(
            md,
            "\n### Contention: C clients cycling borrow(wait) → hold {} ms → return on one pool of count {} for {} s\n\n\
             | store | strategy | clients | cycles/s | successes / write attempt | attempts / success | reads / cycle | WCU / cycle | borrow p50 ms | borrow p99 ms | fairness | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|",
            m.contention_hold_ms, m.contention_count, m.contention_seconds
        );
        for r in &self.contention {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {} |",
                r.backend,
                r.strategy,
                r.clients,
                r.cycles_per_s,
                r.successes_per_attempt,
                r.attempts_per_success,
                r.reads_per_cycle,
                r.model_wcu_per_cycle,
                r.borrow.p50_ms,
                r.borrow.p99_ms,
                r.fairness,
                r.errors
            );
        }
        let ratios = self.goodput_ratios();
        if !ratios.is_empty() {
            let text: Vec<String> = ratios
                .iter()
                .map(|(c, x)| format!("C={c} {x:.2}×"))
                .collect();
            let _ = writeln!(
                md,
                "\nGoodput ours / naive on {DYNAMODB}: {}.",
                text.join(", ")
            );
        }
        let _ = writeln!(
            md,
            "\n### Wake delay: slot freed → waiting borrower granted\n\n\
             | store | freed by | samples | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|"
        );
        for r in &self.wake {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
                r.backend,
                r.trigger,
                r.delay.samples,
                r.delay.p50_ms,
                r.delay.p99_ms,
                r.delay.max_ms
            );
        }
        for r in &self.polling {
            let _ = writeln!(
                md,
                "\nPolling on {}: {:.1} reads/s per waiter ({} reads in {:.1} s).",
                r.backend, r.reads_per_s, r.reads, r.seconds
            );
        }
        let _ = writeln!(
            md,
            "\n### Item size, pool fully held\n\n\
             | count | bytes | WCU / write | RCU / read | writes/s ceiling per pool | cycles/s ceiling | WCU reported |\n\
             |---|---|---|---|---|---|---|"
        );
        for r in &self.item_size {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.count,
                r.bytes,
                r.wcu_per_write,
                r.rcu_per_read,
                r.max_writes_per_s,
                r.max_cycles_per_s,
                opt(r.reported_wcu)
            );
        }
        let _ = writeln!(
            md,
            "\n### Targets\n\n| target | limit | measured | status |\n|---|---|---|---|"
        );
        for t in &self.targets {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                t.name,
                t.limit,
                opt(t.value),
                t.status
            );
        }
        if !m.notes.is_empty() {
            md.push('\n');
            for note in &m.notes {
                let _ = writeln!(md, "- {note}");
            }
        }
        md
    }

    fn goodput_ratios(&self) -> Vec<(usize, f64)> {
        let find = |strategy: &str, clients: usize| {
            self.contention
                .iter()
                .find(|r| r.backend == DYNAMODB && r.strategy == strategy && r.clients == clients)
        };
        self.contention
            .iter()
            .filter(|r| r.backend == DYNAMODB && r.strategy == "ours")
            .filter_map(|ours| {
                let naive = find("naive", ours.clients)?;
                (naive.cycles_per_s > 0.0)
                    .then(|| (ours.clients, ours.cycles_per_s / naive.cycles_per_s))
            })
            .collect()
    }

    /// (file name, chart) of every plot.
    pub fn plots(&self) -> Vec<(&'static str, Chart)> {
        let mut wake = Vec::new();
        for (i, r) in self.wake.iter().enumerate() {
            wake.push(Series {
                name: format!("{} ({})", r.trigger, short(&r.backend)),
                color: COLORS[["return", "expiry", "count raise"]
                    .iter()
                    .position(|t| *t == r.trigger)
                    .unwrap_or(i)
                    % COLORS.len()],
                dashed: r.backend != DYNAMODB,
                markers: false,
                points: cdf(&r.delays_ms),
            });
        }
        let by_clients = |f: fn(&ContentionRow) -> f64| {
            let mut series = Vec::new();
            let strategies = ["ours", "naive"];
            for (backend, (i, strategy)) in [DYNAMODB, "memory"]
                .into_iter()
                .flat_map(|b| strategies.into_iter().enumerate().map(move |s| (b, s)))
            {
                let points: Vec<(f64, f64)> = self
                    .contention
                    .iter()
                    .filter(|r| r.backend == backend && r.strategy == strategy)
                    .map(|r| (r.clients as f64, f(r)))
                    .collect();
                if !points.is_empty() {
                    series.push(Series {
                        name: format!("{strategy} ({})", short(backend)),
                        color: COLORS[i],
                        dashed: backend != DYNAMODB,
                        markers: true,
                        points,
                    });
                }
            }
            series
        };
        // In-memory goodput is orders of magnitude higher: it gets its own plot.
        let goodput = |backend: &str| {
            let mut series = by_clients(|r| r.cycles_per_s);
            series.retain(|s| s.name.ends_with(&format!("({})", short(backend))));
            series
        };
        let count = self.meta.contention_count;
        vec![
            (
                "wake-delay.svg",
                Chart {
                    title: "Wake delay: slot freed → waiting borrower granted (CDF)".into(),
                    x_label: "delay, ms (log scale)".into(),
                    y_label: "fraction of samples".into(),
                    x_scale: Scale::Log10,
                    series: wake,
                },
            ),
            (
                "goodput.svg",
                Chart {
                    title: format!("Goodput on DynamoDB Local, one pool of count {count}"),
                    x_label: "concurrent clients".into(),
                    y_label: "borrow→return cycles/s".into(),
                    x_scale: Scale::Log2,
                    series: goodput(DYNAMODB),
                },
            ),
            (
                "goodput-memory.svg",
                Chart {
                    title: format!("Goodput on the in-memory store, one pool of count {count}"),
                    x_label: "concurrent clients".into(),
                    y_label: "borrow→return cycles/s".into(),
                    x_scale: Scale::Log2,
                    series: goodput("memory"),
                },
            ),
            (
                "write-efficiency.svg",
                Chart {
                    title: "Successful writes per conditional-write attempt".into(),
                    x_label: "concurrent clients".into(),
                    y_label: "successes / attempts".into(),
                    x_scale: Scale::Log2,
                    series: by_clients(|r| r.successes_per_attempt),
                },
            ),
        ]
    }
}

fn short(backend: &str) -> &str {
    if backend == DYNAMODB {
        "DynamoDB Local"
    } else {
        backend
    }
}

fn status(met: Option<bool>) -> String {
    match met {
        Some(true) => "met",
        Some(false) => "not met",
        None => "not measured",
    }
    .into()
}

fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v}"))
}
