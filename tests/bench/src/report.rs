//! The report: JSON rows, the targets of issues #5, #10 and #13, the cost
//! table, Markdown and plots.

use std::fmt::Write;

use serde::Serialize;

use crate::plot::{cdf, Chart, Scale, Series, COLORS};
use crate::scenarios::Strategy;
use crate::stats::{round3, Summary};

pub const DYNAMODB: &str = "dynamodb-local";
pub const MEMORY: &str = "memory";

/// On-demand prices (us-east-1): per million write and read request units.
pub const USD_PER_MILLION_WCU: f64 = 0.625;
pub const USD_PER_MILLION_RCU: f64 = 0.125;

/// Dollars per million cycles costing `wcu` write and `rcu` read units each.
pub fn usd_per_million(wcu: f64, rcu: f64) -> f64 {
    round3(wcu * USD_PER_MILLION_WCU + rcu * USD_PER_MILLION_RCU)
}

#[derive(Serialize)]
pub struct Report {
    pub meta: Meta,
    pub operations: Vec<OpRow>,
    pub contention: Vec<ContentionRow>,
    /// Pools with room to spare (count above the clients, some slots held).
    pub room: Vec<ContentionRow>,
    pub cost: Vec<CostRow>,
    pub saturation: Vec<SaturationRow>,
    pub read_load: Vec<ReadLoadRow>,
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
    /// The service's poll interval for the head of the queue, and its cap.
    pub poll_ms: u64,
    pub poll_cap_ms: u64,
    pub strategies: Vec<String>,
    pub contention_count: u16,
    pub contention_seconds: f64,
    pub contention_hold_ms: u64,
    /// Simulated network delay per store call of the contention runs.
    pub contention_latencies_ms: Vec<u64>,
    pub saturation_seconds: f64,
    /// Simulated network delay per store call of the in-memory read-load runs.
    pub read_load_memory_latency_ms: u64,
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
    /// PutItem (creates) and UpdateItem: the conditional writes.
    pub update_item: f64,
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
    pub strategy: Strategy,
    /// Simulated network delay per store call.
    pub latency_ms: u64,
    pub clients: usize,
    pub count: u16,
    /// Slots held throughout the run by nobody cycling.
    pub held: u16,
    /// Every slot churning instead (see `Shape`).
    pub churn: bool,
    /// How long each client held its lease before returning it.
    pub hold_ms: u64,
    pub seconds: f64,
    pub cycles: u64,
    pub cycles_per_s: f64,
    pub write_attempts: u64,
    pub write_successes: u64,
    pub conditional_failures: u64,
    pub successes_per_attempt: f64,
    /// Lost conditional writes per completed cycle, inside borrows and returns.
    pub borrow_conflicts_per_cycle: f64,
    pub return_conflicts_per_cycle: f64,
    pub attempts_per_cycle: f64,
    pub calls_per_cycle: f64,
    pub reads_per_cycle: f64,
    pub model_wcu_per_cycle: f64,
    pub model_rcu_per_cycle: f64,
    /// The pool item's mean size (modelled bytes) after the writes that
    /// landed: what each write of it bills, at a unit per KB.
    pub pool_item_bytes: f64,
    pub usd_per_million_cycles: f64,
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
    pub writes_by_kind: Vec<WriteTally>,
    /// Capacity billed on the wire per cycle (DynamoDB only).
    pub billed: Option<BilledRow>,
}

/// Capacity units DynamoDB billed per cycle (per grant), read off the
/// wire: borrows (their waiting included) and returns apart.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BilledRow {
    pub borrow_wcu: f64,
    pub return_wcu: f64,
    pub wcu: f64,
    pub borrow_rcu: f64,
    pub return_rcu: f64,
    pub rcu: f64,
}

/// What a million borrow+return cycles cost at on-demand prices.
#[derive(Serialize)]
pub struct CostRow {
    pub backend: String,
    pub strategy: Strategy,
    pub latency_ms: u64,
    /// "uncontended (1 client)", "16 clients", "saturated (32 clients, hold 200 ms)".
    pub load: String,
    pub wcu_per_cycle: f64,
    pub rcu_per_cycle: f64,
    pub usd_per_million_cycles: f64,
}

#[derive(Serialize)]
pub struct SaturationRow {
    pub backend: String,
    pub strategy: Strategy,
    pub latency_ms: u64,
    pub clients: usize,
    pub count: u16,
    pub hold_ms: u64,
    pub wait_limit_ms: u64,
    pub seconds: f64,
    pub borrows: usize,
    pub grants: usize,
    /// Borrows answered 409 (no slot within the wait).
    pub refused: usize,
    pub refused_rate: f64,
    pub grants_per_s: f64,
    /// Wait of granted borrows: the borrow call's duration.
    pub wait: Summary,
    /// Grant (hand-off or take) → the borrow's answer.
    pub answered_after_grant: Summary,
    /// A return call, start to answer.
    pub return_duration: Summary,
    /// (clients − count) / grants per second: every borrower's wait in a
    /// FIFO queue at the throughput measured.
    pub ideal_fifo_wait_ms: f64,
    /// (clients − count) × hold / count: the same with zero overhead.
    pub zero_overhead_wait_ms: f64,
    pub max_over_ideal: f64,
    /// Jain's index over the clients' grants.
    pub fairness: f64,
    /// Fraction of grants no earlier-started borrower was overtaken by.
    pub in_order: f64,
    /// The same, not counting a borrower that started within 10 ms before,
    /// or was granted within one head poll after.
    pub in_order_lenient: f64,
    /// Only the start slack (10 ms).
    pub in_order_start_10ms: f64,
    /// Only the grant slack (one head poll).
    pub in_order_grant_within_poll: f64,
    pub borrow_calls_per_grant: f64,
    pub borrow_reads_per_grant: f64,
    pub borrow_writes_per_grant: f64,
    pub borrow_conflicts_per_grant: f64,
    pub borrow_wcu_per_grant: f64,
    pub borrow_rcu_per_grant: f64,
    pub return_calls_per_return: f64,
    pub return_wcu_per_return: f64,
    pub return_rcu_per_return: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Every granted borrow's wait, ms.
    pub waits_ms: Vec<f64>,
    pub writes_by_kind: Vec<WriteTally>,
}

/// Conditional writes of one kind with one outcome ("won", or "lost:" and
/// the first expectation that failed).
#[derive(Clone, Serialize)]
pub struct WriteTally {
    pub kind: String,
    pub outcome: String,
    pub n: u64,
}

#[derive(Serialize)]
pub struct ReadLoadRow {
    pub backend: String,
    pub strategy: Strategy,
    pub latency_ms: u64,
    pub waiters: usize,
    /// Waiter tasks still waiting when the window opened.
    pub waiting_at_window: usize,
    /// Live tickets in the pool when the window opened (fair waiting only).
    pub queued_at_window: usize,
    pub window_s: f64,
    pub reads: u64,
    pub reads_per_s: f64,
    pub reads_per_s_per_waiter: f64,
    pub writes_per_s: f64,
    pub rcu_per_s: f64,
    /// From a return call's answer to the next waiter's grant.
    pub wake_after_return: Summary,
    /// From a lease's expiry instant to the next waiter's grant.
    pub wake_after_expiry: Summary,
    /// Returns or expiries no waiter took within 2 s.
    pub missed_wakes: usize,
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Serialize)]
pub struct WakeRow {
    pub backend: String,
    pub strategy: Strategy,
    pub trigger: String,
    /// The waiter's store calls per sample, from its first read to its grant.
    pub waiter_reads_per_sample: f64,
    pub waiter_writes_per_sample: f64,
    pub writes_by_kind: Vec<WriteTally>,
    pub delay: Summary,
    pub delays_ms: Vec<f64>,
    /// The waiter's store calls in each sample, in the order of `delays_ms`.
    pub waiter_calls: Vec<u32>,
}

#[derive(Serialize)]
pub struct PollRow {
    pub backend: String,
    pub strategy: Strategy,
    pub seconds: f64,
    pub reads: u64,
    pub writes: u64,
    pub reads_per_s: f64,
}

#[derive(Serialize)]
pub struct ItemRow {
    pub count: u16,
    /// Tickets of waiting borrowers in the item.
    pub waiting: usize,
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
    pub issue: u32,
    pub name: String,
    pub limit: String,
    pub value: Option<f64>,
    /// Which row the value comes from.
    pub measured_on: String,
    /// "met", "not met" or "not measured".
    pub status: String,
}

/// Prefers a row on DynamoDB Local, else one in memory.
fn prefer<'a, T>(
    rows: impl Iterator<Item = &'a T> + Clone,
    backend: impl Fn(&T) -> &str,
) -> Option<&'a T> {
    rows.clone()
        .find(|r| backend(r) == DYNAMODB)
        .or_else(|| rows.clone().next())
}

impl Report {
    fn op(&self, name: &str) -> Option<&OpRow> {
        prefer(
            self.operations.iter().filter(|r| r.operation == name),
            |r| &r.backend,
        )
    }

    fn contention_row(
        &self,
        backend: &str,
        strategy: Strategy,
        latency: u64,
        clients: usize,
    ) -> Option<&ContentionRow> {
        self.contention.iter().find(|r| {
            r.backend == backend
                && r.strategy == strategy
                && r.latency_ms == latency
                && r.clients == clients
        })
    }

    /// The cost table, from the contention and saturation rows.
    pub fn derive_cost(&mut self) {
        let mut cost = Vec::new();
        for r in &self.contention {
            let load = match r.clients {
                1 => "uncontended (1 client)".to_string(),
                16 => "16 clients".to_string(),
                _ => continue,
            };
            cost.push(CostRow {
                backend: r.backend.clone(),
                strategy: r.strategy,
                latency_ms: r.latency_ms,
                load,
                wcu_per_cycle: r.model_wcu_per_cycle,
                rcu_per_cycle: r.model_rcu_per_cycle,
                usd_per_million_cycles: r.usd_per_million_cycles,
            });
        }
        for r in &self.saturation {
            let wcu = round3(r.borrow_wcu_per_grant + r.return_wcu_per_return);
            let rcu = round3(r.borrow_rcu_per_grant + r.return_rcu_per_return);
            cost.push(CostRow {
                backend: r.backend.clone(),
                strategy: r.strategy,
                latency_ms: r.latency_ms,
                load: format!("saturated ({} clients, hold {} ms)", r.clients, r.hold_ms),
                wcu_per_cycle: wcu,
                rcu_per_cycle: rcu,
                usd_per_million_cycles: usd_per_million(wcu, rcu),
            });
        }
        self.cost = cost;
    }

    /// The targets of issue #16 (hand-off), with the uncontended budgets and
    /// wake targets of the issues before it.
    pub fn evaluate_targets(&mut self) {
        let mut targets = Vec::new();
        let on = |r: &str| {
            if r == DYNAMODB {
                "DynamoDB Local".to_string()
            } else {
                r.to_string()
            }
        };
        let op = |name: &str| {
            self.op(name)
                .map(|r| (r.calls, format!("{}, new", on(&r.backend))))
        };
        targets.push(at_most(
            16,
            "uncontended borrow: DynamoDB calls",
            2.0,
            "",
            op("borrow (free slot)"),
        ));
        targets.push(at_most(
            16,
            "uncontended return: DynamoDB calls",
            2.0,
            "",
            op("return"),
        ));
        targets.push(at_most(
            5,
            "inspect: DynamoDB calls",
            1.0,
            "",
            op("inspect"),
        ));
        let wcu32 = self
            .item_size
            .iter()
            .find(|r| r.count == 32 && r.waiting == 0)
            .map(|r| {
                (
                    r.wcu_per_write as f64,
                    "model, count 32 fully held".to_string(),
                )
            });
        targets.push(at_most(
            16,
            "write units per write at count ≤ 32",
            1.0,
            "",
            wcu32,
        ));
        let wake = |trigger: &str| {
            prefer(
                self.wake
                    .iter()
                    .filter(|r| r.strategy == Strategy::New && r.trigger == trigger),
                |r| &r.backend,
            )
            .map(|r| {
                (
                    r.delay.p99_ms,
                    format!("{}, new, one waiter", on(&r.backend)),
                )
            })
        };
        targets.push(at_most(
            5,
            "wake p99 after a return (one waiter)",
            100.0,
            " ms",
            wake("return"),
        ));
        targets.push(at_most(
            5,
            "wake p99 after an expiry (one waiter)",
            10.0,
            " ms",
            wake("expiry"),
        ));

        // Contention at +8 ms, count 4 (DynamoDB Local, else memory).
        let row = |clients: usize| {
            [DYNAMODB, MEMORY].into_iter().find_map(|b| {
                self.contention_row(b, Strategy::New, 8, clients)
                    .map(|r| (b, r))
            })
        };
        let src = |b: &str, clients: usize| format!("{}, new, {clients} clients, +8 ms", on(b));
        for (clients, wcu_limit) in [(16, 2.3), (64, 4.5)] {
            let r = row(clients);
            targets.push(target(
                16,
                &format!("{clients} clients: successful writes per billed write attempt"),
                "≥ 0.95".into(),
                r.map(|(b, r)| (r.successes_per_attempt, src(b, clients))),
                |v| v >= 0.95,
            ));
            targets.push(at_most(
                16,
                &format!("{clients} clients: write units per cycle"),
                wcu_limit,
                "",
                r.map(|(b, r)| (r.model_wcu_per_cycle, src(b, clients))),
            ));
        }
        let c16 = row(16);
        targets.push(at_most(
            16,
            "16 clients: borrow p99",
            300.0,
            " ms",
            c16.map(|(b, r)| (r.borrow.p99_ms, src(b, 16))),
        ));
        let ratio = c16.and_then(|(b, r)| {
            let naive = self.contention_row(b, Strategy::Naive, 8, 16)?;
            (naive.cycles_per_s > 0.0).then(|| {
                (
                    round3(r.cycles_per_s / naive.cycles_per_s),
                    src(b, 16) + " vs naive",
                )
            })
        });
        targets.push(target(
            16,
            "16 clients: cycles/s, new ÷ naive",
            "≥ 2.5".into(),
            ratio,
            |v| v >= 2.5,
        ));

        // Saturation.
        let sat = prefer(
            self.saturation
                .iter()
                .filter(|r| r.strategy == Strategy::New),
            |r| &r.backend,
        );
        let sat_src = |r: &SaturationRow| {
            format!(
                "{}, new, {} clients, {} s",
                on(&r.backend),
                r.clients,
                r.seconds
            )
        };
        targets.push(target(
            16,
            "saturation: grants in strict arrival order",
            "≥ 0.995".into(),
            sat.map(|r| (r.in_order, sat_src(r))),
            |v| v >= 0.995,
        ));
        targets.push(target(
            16,
            "saturation: grants per second",
            "≥ 18".into(),
            sat.map(|r| (r.grants_per_s, sat_src(r))),
            |v| v >= 18.0,
        ));
        targets.push(at_most(
            16,
            "saturation: read units per cycle",
            12.0,
            "",
            sat.map(|r| {
                (
                    round3(r.borrow_rcu_per_grant + r.return_rcu_per_return),
                    sat_src(r),
                )
            }),
        ));
        targets.push(at_most(
            16,
            "saturation: max wait ÷ ideal FIFO wait",
            1.2,
            "",
            sat.map(|r| (r.max_over_ideal, sat_src(r))),
        ));

        // Item.
        let item = |count: u16, waiting: usize| {
            self.item_size
                .iter()
                .find(|r| r.count == count && r.waiting == waiting)
                .map(|r| r.bytes as f64)
        };
        let model = |what: &str| format!("model, {what}");
        targets.push(at_most(
            16,
            "item, count 32 fully held",
            1024.0,
            " B",
            item(32, 0).map(|b| (b, model("a million grants old"))),
        ));
        targets.push(at_most(
            16,
            "item, count 1,000 fully held",
            25.0 * 1024.0,
            " B",
            item(1000, 0).map(|b| (b, model("a million grants old"))),
        ));
        let per_ticket = item(4, 100).zip(item(4, 0)).map(|(with, without)| {
            (
                round3((with - without) / 100.0),
                model("100 tickets on count 4"),
            )
        });
        targets.push(at_most(
            16,
            "item, bytes per waiting ticket",
            24.0,
            " B",
            per_ticket,
        ));

        // Read load.
        let reads = |n: usize| {
            prefer(
                self.read_load
                    .iter()
                    .filter(|r| r.strategy == Strategy::New && r.waiters == n),
                |r| &r.backend,
            )
            .map(|r| {
                (
                    r.reads_per_s,
                    format!("{}, new, +{} ms", on(&r.backend), r.latency_ms),
                )
            })
        };
        targets.push(at_most(
            16,
            "100 waiters: pool reads per second",
            200.0,
            " /s",
            reads(100),
        ));
        // The head's wake with a queue behind it: the worst row of the
        // preferred store.
        let head = |f: fn(&ReadLoadRow) -> &Summary| {
            let rows = || {
                self.read_load
                    .iter()
                    .filter(|r| r.strategy == Strategy::New && f(r).samples > 0)
            };
            let backend = if rows().any(|r| r.backend == DYNAMODB) {
                DYNAMODB
            } else {
                MEMORY
            };
            rows()
                .filter(|r| r.backend == backend)
                .max_by(|a, b| f(a).p99_ms.total_cmp(&f(b).p99_ms))
                .map(|r| {
                    (
                        f(r).p99_ms,
                        format!("{}, new, {} waiters (worst row)", on(&r.backend), r.waiters),
                    )
                })
        };
        targets.push(at_most(
            16,
            "head waiter's wake p99 after a return",
            100.0,
            " ms",
            head(|r| &r.wake_after_return),
        ));
        targets.push(at_most(
            10,
            "head waiter's wake p99 after an expiry",
            10.0,
            " ms",
            head(|r| &r.wake_after_expiry),
        ));
        self.targets = targets;
    }

    /// Every measured target met (unmeasured ones do not count).
    pub fn all_met(&self) -> bool {
        self.targets.iter().all(|t| t.status != "not met")
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.meta;
        let _ = writeln!(
            md,
            "## Benchmark ({} profile, {} CPUs, head poll {} ms, cap {} ms)\n",
            m.profile, m.cpus, m.poll_ms, m.poll_cap_ms
        );
        self.md_operations(&mut md);
        self.md_contention(&mut md);
        self.md_room(&mut md);
        self.md_writes(&mut md);
        self.md_cost(&mut md);
        self.md_saturation(&mut md);
        self.md_read_load(&mut md);
        self.md_wake(&mut md);
        self.md_items(&mut md);
        let _ = writeln!(
            md,
            "\n### Targets\n\n| issue | target | limit | measured | on | status |\n|---|---|---|---|---|---|"
        );
        for t in &self.targets {
            let _ = writeln!(
                md,
                "| #{} | {} | {} | {} | {} | {} |",
                t.issue,
                t.name,
                t.limit,
                opt(t.value),
                t.measured_on,
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

    fn md_operations(&self, md: &mut String) {
        if self.operations.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "### DynamoDB cost per operation (uncontended, new policy, mean per call)\n\n\
             | store | operation | calls | GetItem | Put/UpdateItem | DeleteItem | cond. failed | WCU (model) | RCU (model) | units reported | p50 ms | p99 ms |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.operations {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
                r.backend,
                r.operation,
                r.calls,
                r.get_item,
                r.update_item,
                r.delete_item,
                r.conditional_failures,
                r.model_wcu,
                r.model_rcu,
                opt(r.reported_capacity),
                r.latency.p50_ms,
                r.latency.p99_ms
            );
        }
    }

    fn md_contention(&self, md: &mut String) {
        if self.contention.is_empty() {
            return;
        }
        let m = &self.meta;
        let _ = writeln!(
            md,
            "\n### Contention: C clients cycling borrow(wait = rest of the run) → hold {} ms → return on one pool of count {} for {} s\n\n\
             | store | +ms | clients | strategy | cycles/s | successes / attempt | writes / cycle | WCU / cycle | reads / cycle | RCU / cycle | borrow p50 ms | borrow p99 ms | fairness | timeouts | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            m.contention_hold_ms, m.contention_count, m.contention_seconds
        );
        for r in &self.contention {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {} | {} |",
                r.backend,
                r.latency_ms,
                r.clients,
                r.strategy,
                r.cycles_per_s,
                r.successes_per_attempt,
                r.attempts_per_cycle,
                r.model_wcu_per_cycle,
                r.reads_per_cycle,
                r.model_rcu_per_cycle,
                r.borrow.p50_ms,
                r.borrow.p99_ms,
                r.fairness,
                r.timeouts,
                r.errors
            );
        }
        for backend in [DYNAMODB, MEMORY] {
            for other in Strategy::ALL.into_iter().filter(|s| !s.is_service()) {
                let ratios: Vec<String> = self
                    .contention
                    .iter()
                    .filter(|r| r.backend == backend && r.strategy == Strategy::New)
                    .filter_map(|new| {
                        let o = self.contention_row(backend, other, new.latency_ms, new.clients)?;
                        (o.cycles_per_s > 0.0).then(|| {
                            format!(
                                "+{} ms C={} {:.2}×",
                                new.latency_ms,
                                new.clients,
                                new.cycles_per_s / o.cycles_per_s
                            )
                        })
                    })
                    .collect();
                if !ratios.is_empty() {
                    let _ = writeln!(
                        md,
                        "\nGoodput new ÷ {other} on {backend}: {}.",
                        ratios.join(", ")
                    );
                }
            }
        }
    }

    fn md_room(&self, md: &mut String) {
        if self.room.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### Pools with room to spare: C clients cycling borrow → hold {} ms → return on a pool of count N with H slots held throughout, {} s each\n\n\
             Billed: capacity units as DynamoDB bills them, read off the wire (each answer's consumed capacity, \
             a lost conditional write at the size of the item it handed back), per cycle and apart for the borrow \
             (its waiting included) and the return; on the in-memory store, the size model. \
             \"churn\": every slot held before the run by a lease ending at a random time during it, and \
             the clients' leases last 1–3 s, half returned and half left to expire; a cycle is then a grant. \
             Pool item B: the pool item's mean size after the writes that landed (modelled by DynamoDB's size rules; \
             a split pool's segments apart), each write billing a unit per started KB of it. At 1,000 WCU/s: the cycles a second one partition's write capacity allows. \
             The lone borrower's p50 is the same store's 1-client row on a pool of the same count.\n\n\
             | store | +ms | count | held | clients | cycles/s | billed WCU / cycle | borrow / return WCU | RCU / cycle | borrow / return RCU | successful writes / write | pool item B | cycles/s at 1,000 WCU/s | borrow p50 ms | borrow p99 ms | p50 ÷ lone p50 | timeouts | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            self.meta.contention_hold_ms, self.meta.contention_seconds
        );
        for r in &self.room {
            let lone = self
                .room
                .iter()
                .find(|o| {
                    o.backend == r.backend
                        && o.count == r.count
                        && o.held == 0
                        && !o.churn
                        && o.clients == 1
                })
                .map(|o| o.borrow.p50_ms)
                .filter(|p| *p > 0.0);
            let ratio = lone.map_or("–".to_string(), |lone| {
                format!("{:.2}", r.borrow.p50_ms / lone)
            });
            let held = if r.churn {
                "churn".to_string()
            } else {
                r.held.to_string()
            };
            let (wcu, rcu, split_w, split_r) = match r.billed {
                Some(b) => (
                    b.wcu,
                    b.rcu,
                    format!("{:.2} / {:.2}", b.borrow_wcu, b.return_wcu),
                    format!("{:.2} / {:.2}", b.borrow_rcu, b.return_rcu),
                ),
                None => (
                    r.model_wcu_per_cycle,
                    r.model_rcu_per_cycle,
                    "–".into(),
                    "–".into(),
                ),
            };
            let ceiling = if wcu > 0.0 {
                format!("{:.0}", 1000.0 / wcu)
            } else {
                "–".into()
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {} | {:.2} | {} | {:.2} | {:.0} | {} | {:.1} | {:.1} | {} | {} | {} |",
                r.backend,
                r.latency_ms,
                r.count,
                held,
                r.clients,
                r.cycles_per_s,
                wcu,
                split_w,
                rcu,
                split_r,
                r.successes_per_attempt,
                r.pool_item_bytes,
                ceiling,
                r.borrow.p50_ms,
                r.borrow.p99_ms,
                ratio,
                r.timeouts,
                r.errors
            );
        }
    }

    /// Conditional writes by kind at 16 clients and more (4 and more on pools
    /// with room to spare; and under saturation): which writes collide, and
    /// on which condition.
    fn md_writes(&self, md: &mut String) {
        let rows: Vec<(String, &[WriteTally], usize)> = self
            .contention
            .iter()
            .filter(|r| r.clients >= 16)
            .map(|r| {
                (
                    format!(
                        "{} | +{} | C={} {}",
                        r.backend, r.latency_ms, r.clients, r.strategy
                    ),
                    &r.writes_by_kind[..],
                    r.cycles as usize,
                )
            })
            .chain(self.room.iter().filter(|r| r.clients >= 4).map(|r| {
                (
                    format!(
                        "{} | +{} | count {} {} C={}",
                        r.backend,
                        r.latency_ms,
                        r.count,
                        if r.churn {
                            "churning".to_string()
                        } else {
                            format!("held {}", r.held)
                        },
                        r.clients
                    ),
                    &r.writes_by_kind[..],
                    r.cycles as usize,
                )
            }))
            .chain(self.saturation.iter().map(|r| {
                (
                    format!(
                        "{} | +{} | saturation {}",
                        r.backend, r.latency_ms, r.strategy
                    ),
                    &r.writes_by_kind[..],
                    r.grants,
                )
            }))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### Conditional writes by kind, per cycle (lost writes by the first expectation that failed)\n\n\
             | store | +ms | run | kind | attempts / cycle | won / cycle | lost / cycle, by failed condition |\n|---|---|---|---|---|---|---|"
        );
        for (run, tallies, cycles) in rows {
            let mut kinds: Vec<&str> = tallies.iter().map(|t| t.kind.as_str()).collect();
            kinds.dedup();
            for kind in kinds {
                let of_kind = || tallies.iter().filter(move |t| t.kind == kind);
                let attempts: u64 = of_kind().map(|t| t.n).sum();
                let won: u64 = of_kind().filter(|t| t.outcome == "won").map(|t| t.n).sum();
                let mut lost: Vec<(&str, u64)> = of_kind()
                    .filter(|t| t.outcome != "won")
                    .map(|t| (t.outcome.trim_start_matches("lost: "), t.n))
                    .collect();
                lost.sort_by_key(|l| std::cmp::Reverse(l.1));
                let lost: Vec<String> = lost
                    .iter()
                    .map(|(why, n)| format!("{why} {:.2}", *n as f64 / cycles.max(1) as f64))
                    .collect();
                let per = |n: u64| n as f64 / cycles.max(1) as f64;
                let _ = writeln!(
                    md,
                    "| {run} | {kind} | {:.2} | {:.2} | {} |",
                    per(attempts),
                    per(won),
                    if lost.is_empty() {
                        "–".to_string()
                    } else {
                        lost.join(", ")
                    }
                );
            }
        }
    }

    fn md_cost(&self, md: &mut String) {
        if self.cost.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### DynamoDB cost per million borrow+return cycles (on-demand: ${USD_PER_MILLION_WCU} per million WCU, ${USD_PER_MILLION_RCU} per million RCU; failed conditional writes billed)\n\n\
             | store | +ms | load | strategy | WCU / cycle | RCU / cycle | $ per million cycles |\n|---|---|---|---|---|---|---|"
        );
        for r in &self.cost {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                r.backend,
                r.latency_ms,
                r.load,
                r.strategy,
                r.wcu_per_cycle,
                r.rcu_per_cycle,
                r.usd_per_million_cycles
            );
        }
    }

    fn md_saturation(&self, md: &mut String) {
        let Some(first) = self.saturation.first() else {
            return;
        };
        let _ = writeln!(
            md,
            "\n### Saturation: {} clients, each borrowing (wait ≤ {} s) → holding {} ms → returning, on one pool of count {}, for {} s\n\n\
             | store | strategy | grants | grants/s | wait p50 ms | wait p99 ms | wait max ms | ideal FIFO wait ms | max ÷ ideal | 409 rate | Jain (grants) | in order | in order, starts within 10 ms excused | in order, grants within one poll excused | in order, both excused | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            first.clients,
            first.wait_limit_ms / 1000,
            first.hold_ms,
            first.count,
            self.meta.saturation_seconds
        );
        for r in &self.saturation {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                r.backend,
                r.strategy,
                r.grants,
                r.grants_per_s,
                r.wait.p50_ms,
                r.wait.p99_ms,
                r.wait.max_ms,
                r.ideal_fifo_wait_ms,
                r.max_over_ideal,
                r.refused_rate,
                r.fairness,
                r.in_order,
                r.in_order_start_10ms,
                r.in_order_grant_within_poll,
                r.in_order_lenient,
                r.errors
            );
        }
        let _ = writeln!(
            md,
            "\nWhere a slot's cycle goes beyond its hold (ms): grant → the borrow's answer (the waiter's detection of its hand-off), and the return call:\n\n\
             | store | strategy | answered after grant p50 / p99 | return p50 / p99 |\n|---|---|---|---|"
        );
        for r in &self.saturation {
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} / {:.1} | {:.1} / {:.1} |",
                r.backend,
                r.strategy,
                r.answered_after_grant.p50_ms,
                r.answered_after_grant.p99_ms,
                r.return_duration.p50_ms,
                r.return_duration.p99_ms
            );
        }
        let _ = writeln!(
            md,
            "\nZero-overhead FIFO wait: {:.0} ms. Cost per granted borrow under saturation (the borrow's calls, 409s included, ÷ grants) and per return:\n\n\
             | store | strategy | borrow calls | reads | writes | lost writes | WCU | RCU | return calls | return WCU |\n|---|---|---|---|---|---|---|---|---|---|",
            first.zero_overhead_wait_ms
        );
        for r in &self.saturation {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.backend,
                r.strategy,
                r.borrow_calls_per_grant,
                r.borrow_reads_per_grant,
                r.borrow_writes_per_grant,
                r.borrow_conflicts_per_grant,
                r.borrow_wcu_per_grant,
                r.borrow_rcu_per_grant,
                r.return_calls_per_return,
                r.return_wcu_per_return
            );
        }
    }

    fn md_read_load(&self, md: &mut String) {
        if self.read_load.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### Read load: N borrowers waiting on one pool held full; then returns and expiries one at a time\n\n\
             | store | +ms | strategy | waiters | waiting (queued) | reads/s | reads/s per waiter | writes/s | RCU/s | wake after return p50 / p99 ms | wake after expiry p50 / p99 ms | missed | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.read_load {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} ({}) | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} |",
                r.backend,
                r.latency_ms,
                r.strategy,
                r.waiters,
                r.waiting_at_window,
                r.queued_at_window,
                r.reads_per_s,
                r.reads_per_s_per_waiter,
                r.writes_per_s,
                r.rcu_per_s,
                r.wake_after_return.p50_ms,
                r.wake_after_return.p99_ms,
                r.wake_after_expiry.p50_ms,
                r.wake_after_expiry.p99_ms,
                r.missed_wakes,
                r.errors
            );
        }
    }

    fn md_wake(&self, md: &mut String) {
        if !self.wake.is_empty() {
            let _ = writeln!(
                md,
                "\n### Wake delay, one waiter on a pool of count 1: slot freed → waiter granted\n\n\
                 | store | strategy | freed by | samples | p50 ms | p99 ms | max ms | waiter reads / sample | waiter writes / sample | waiter's lost writes / sample |\n|---|---|---|---|---|---|---|---|---|---|"
            );
            for r in &self.wake {
                let lost: u64 = r
                    .writes_by_kind
                    .iter()
                    .filter(|t| t.outcome != "won")
                    .map(|t| t.n)
                    .sum();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} |",
                    r.backend,
                    r.strategy,
                    r.trigger,
                    r.delay.samples,
                    r.delay.p50_ms,
                    r.delay.p99_ms,
                    r.delay.max_ms,
                    r.waiter_reads_per_sample,
                    r.waiter_writes_per_sample,
                    lost as f64 / r.delay.samples.max(1) as f64
                );
            }
        }
        if !self.polling.is_empty() {
            let _ = writeln!(
                md,
                "\n### Polling: one waiter on a full pool\n\n| store | strategy | reads/s | reads | writes | seconds |\n|---|---|---|---|---|---|"
            );
            for r in &self.polling {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.1} | {} | {} | {:.1} |",
                    r.backend, r.strategy, r.reads_per_s, r.reads, r.writes, r.seconds
                );
            }
        }
    }

    fn md_items(&self, md: &mut String) {
        if self.item_size.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n### Item size, pool fully held\n\n\
             | count | waiting | bytes | WCU / write | RCU / read | writes/s ceiling per pool | cycles/s ceiling | WCU reported |\n\
             |---|---|---|---|---|---|---|---|"
        );
        for r in &self.item_size {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.count,
                r.waiting,
                r.bytes,
                r.wcu_per_write,
                r.rcu_per_read,
                r.max_writes_per_s,
                r.max_cycles_per_s,
                opt(r.reported_wcu)
            );
        }
    }

    /// Contention series per strategy and latency on `backend`: colour by
    /// strategy, dashed with a simulated delay.
    fn by_clients(&self, backend: &str, f: fn(&ContentionRow) -> f64) -> Vec<Series> {
        let mut series = Vec::new();
        for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
            for &latency in &self.meta.contention_latencies_ms {
                let points: Vec<(f64, f64)> = self
                    .contention
                    .iter()
                    .filter(|r| {
                        r.backend == backend && r.strategy == strategy && r.latency_ms == latency
                    })
                    .map(|r| (r.clients as f64, f(r)))
                    .collect();
                if !points.is_empty() {
                    series.push(Series {
                        name: format!("{strategy}, +{latency} ms"),
                        color: COLORS[i],
                        dashed: latency > 0,
                        markers: true,
                        points,
                    });
                }
            }
        }
        series
    }

    /// (file name, chart) of every plot.
    pub fn plots(&self) -> Vec<(&'static str, Chart)> {
        // Wake CDFs of one store (DynamoDB Local when measured): colour by
        // trigger, dashed for the old policy.
        let wake_backend = if self.wake.iter().any(|r| r.backend == DYNAMODB) {
            DYNAMODB
        } else {
            MEMORY
        };
        let wake: Vec<Series> = self
            .wake
            .iter()
            .filter(|r| r.backend == wake_backend)
            .enumerate()
            .map(|(i, r)| Series {
                name: format!("{} ({})", r.trigger, r.strategy),
                color: COLORS[["return", "expiry", "count raise"]
                    .iter()
                    .position(|t| *t == r.trigger)
                    .unwrap_or(i)
                    % COLORS.len()],
                dashed: r.strategy != Strategy::New,
                markers: false,
                points: cdf(&r.delays_ms),
            })
            .collect();
        let mut read_load = Vec::new();
        // Read load is measured on the service alone (the naive design never waits in line).
        let strategy = Strategy::New;
        for backend in [DYNAMODB, MEMORY] {
            let points: Vec<(f64, f64)> = self
                .read_load
                .iter()
                .filter(|r| r.backend == backend && r.strategy == strategy)
                .map(|r| (r.waiters as f64, r.reads_per_s))
                .collect();
            if let Some(latency) = self
                .read_load
                .iter()
                .find(|r| r.backend == backend && r.strategy == strategy)
                .map(|r| r.latency_ms)
            {
                read_load.push(Series {
                    name: format!("{strategy} ({}, +{latency} ms)", short(backend)),
                    color: COLORS[0],
                    dashed: backend != DYNAMODB,
                    markers: true,
                    points,
                });
            }
        }
        let saturation: Vec<Series> = self
            .saturation
            .iter()
            .enumerate()
            .map(|(i, r)| Series {
                name: format!("{} ({})", r.strategy, short(&r.backend)),
                color: COLORS[i % COLORS.len()],
                dashed: false,
                markers: false,
                points: cdf(&r.waits_ms),
            })
            .collect();
        let count = self.meta.contention_count;
        vec![
            (
                "wake-delay.svg",
                Chart {
                    title: format!(
                        "Wake delay on {}: slot freed → waiter granted (CDF)",
                        short(wake_backend)
                    ),
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
                    series: self.by_clients(DYNAMODB, |r| r.cycles_per_s),
                },
            ),
            (
                "goodput-memory.svg",
                Chart {
                    title: format!("Goodput on the in-memory store, one pool of count {count}"),
                    x_label: "concurrent clients".into(),
                    y_label: "borrow→return cycles/s".into(),
                    x_scale: Scale::Log2,
                    series: self.by_clients(MEMORY, |r| r.cycles_per_s),
                },
            ),
            (
                "write-efficiency.svg",
                Chart {
                    title: "Successful writes per conditional-write attempt (DynamoDB Local)"
                        .into(),
                    x_label: "concurrent clients".into(),
                    y_label: "successes / attempts".into(),
                    x_scale: Scale::Log2,
                    series: self.by_clients(DYNAMODB, |r| r.successes_per_attempt),
                },
            ),
            (
                "wcu-per-cycle.svg",
                Chart {
                    title: "Write units per borrow→return cycle (DynamoDB Local)".into(),
                    x_label: "concurrent clients".into(),
                    y_label: "WCU / cycle".into(),
                    x_scale: Scale::Log2,
                    series: self.by_clients(DYNAMODB, |r| r.model_wcu_per_cycle),
                },
            ),
            (
                "read-load.svg",
                Chart {
                    title: "Pool reads per second, N waiters on one full pool".into(),
                    x_label: "waiters (log scale)".into(),
                    y_label: "reads/s".into(),
                    x_scale: Scale::Log10,
                    series: read_load,
                },
            ),
            (
                "saturation-wait.svg",
                Chart {
                    title: "Saturation: wait of granted borrows (CDF)".into(),
                    x_label: "wait, ms (log scale)".into(),
                    y_label: "fraction of grants".into(),
                    x_scale: Scale::Log10,
                    series: saturation,
                },
            ),
        ]
    }
}

fn at_most(issue: u32, name: &str, limit: f64, unit: &str, value: Option<(f64, String)>) -> Target {
    target(issue, name, format!("≤ {limit}{unit}"), value, |v| {
        v <= limit
    })
}

fn target(
    issue: u32,
    name: &str,
    limit: String,
    value: Option<(f64, String)>,
    ok: impl Fn(f64) -> bool,
) -> Target {
    Target {
        issue,
        name: name.into(),
        limit,
        value: value.as_ref().map(|v| v.0),
        measured_on: value.as_ref().map_or("–".into(), |v| v.1.clone()),
        status: match value {
            Some((v, _)) if ok(v) => "met",
            Some(_) => "not met",
            None => "not measured",
        }
        .into(),
    }
}

fn short(backend: &str) -> &str {
    if backend == DYNAMODB {
        "DynamoDB Local"
    } else {
        backend
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_demand_prices() {
        // Two write units and two read units per cycle: $1.50 per million.
        assert_eq!(usd_per_million(2.0, 2.0), 1.5);
        assert_eq!(usd_per_million(0.0, 0.0), 0.0);
    }
}
