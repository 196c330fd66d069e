//! The bench's smoke profile end to end against DynamoDB Local (`tests/run`
//! exports `DYNAMODB_ENDPOINT`): it must finish and emit a complete report.
//! Timings are not asserted — this machine's load is not the code's fault.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn endpoint() -> String {
    match std::env::var("DYNAMODB_ENDPOINT") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DYNAMODB_ENDPOINT is not set: run the suite with tests/run, which starts \
             DynamoDB Local (or export DYNAMODB_ENDPOINT=http://127.0.0.1:PORT)"
        ),
    }
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bench-smoke-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

fn rows<'a>(report: &'a Value, key: &str) -> &'a Vec<Value> {
    let rows = report[key]
        .as_array()
        .unwrap_or_else(|| panic!("report.{key} is not an array: {report:#}"));
    assert!(!rows.is_empty(), "report.{key} is empty");
    rows
}

fn has_keys(row: &Value, keys: &[&str]) {
    for key in keys {
        assert!(row.get(key).is_some(), "missing {key} in {row:#}");
    }
}

#[test]
fn smoke_profile_emits_a_complete_report() {
    let dir = scratch_dir();
    let out = dir.join("report.json");
    let run = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--profile", "smoke", "--dynamodb", &endpoint(), "--out"])
        .arg(&out)
        .arg("--svg-dir")
        .arg(&dir)
        .output()
        .expect("run the bench binary");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench failed ({}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    for heading in [
        "| operation |",
        "### Contention",
        "### Conditional writes by kind",
        "### DynamoDB cost per million",
        "### Saturation",
        "### Read load",
        "### Wake delay",
        "### Targets",
    ] {
        assert!(stdout.contains(heading), "no {heading:?} in:\n{stdout}");
    }

    let text = std::fs::read_to_string(&out).expect("the JSON report was written");
    let report: Value = serde_json::from_str(&text).expect("the report is valid JSON");
    has_keys(
        &report["meta"],
        &[
            "profile",
            "dynamodb_endpoint",
            "poll_ms",
            "poll_cap_ms",
            "strategies",
            "contention_latencies_ms",
            "saturation_seconds",
            "notes",
        ],
    );
    assert_eq!(report["meta"]["profile"], "smoke");

    let operations = rows(&report, "operations");
    for row in operations {
        has_keys(
            row,
            &[
                "backend",
                "operation",
                "calls",
                "model_wcu",
                "model_rcu",
                "latency",
            ],
        );
    }
    for name in [
        "borrow (free slot)",
        "return",
        "inspect",
        "register (new pool)",
        "delete",
    ] {
        assert!(
            operations
                .iter()
                .any(|r| r["backend"] == "dynamodb-local" && r["operation"] == name),
            "no DynamoDB row for {name}"
        );
    }

    // Every contention row exists for every strategy at 0 and 8 ms.
    let contention = rows(&report, "contention");
    for row in contention {
        has_keys(
            row,
            &[
                "strategy",
                "latency_ms",
                "clients",
                "cycles_per_s",
                "successes_per_attempt",
                "model_wcu_per_cycle",
                "model_rcu_per_cycle",
                "reads_per_cycle",
                "usd_per_million_cycles",
                "fairness",
                "borrow",
                "writes_by_kind",
            ],
        );
    }
    for backend in ["dynamodb-local", "memory"] {
        for strategy in ["new", "naive"] {
            for latency in [0, 8] {
                assert!(
                    contention.iter().any(|r| r["backend"] == backend
                        && r["strategy"] == strategy
                        && r["latency_ms"] == latency),
                    "no contention row for {backend}, {strategy}, +{latency} ms"
                );
            }
        }
    }
    // A pool with room to spare, on each store: cycles made, every write
    // billed (at least the two of a borrow and a return per cycle).
    for backend in ["dynamodb-local", "memory"] {
        let row = rows(&report, "room")
            .iter()
            .find(|r| r["backend"] == backend)
            .unwrap_or_else(|| panic!("no room row for {backend}"));
        assert_eq!(
            (&row["count"], &row["held"], &row["clients"]),
            (&8.into(), &2.into(), &4.into())
        );
        assert!(row["cycles"].as_u64() > Some(0), "{row:#}");
        assert!(row["model_wcu_per_cycle"].as_f64() >= Some(2.0), "{row:#}");
        // On DynamoDB, billed off the wire: a borrow writes once at least
        // and reads once, a return (of a count-8 pool, never lost) once.
        let billed = &row["billed"];
        if backend == "memory" {
            assert!(billed.is_null(), "{row:#}");
        } else {
            assert!(billed["borrow_wcu"].as_f64() >= Some(1.0), "{row:#}");
            assert!(billed["return_wcu"].as_f64() >= Some(1.0), "{row:#}");
            assert!(billed["borrow_rcu"].as_f64() >= Some(1.0), "{row:#}");
            assert!(billed["wcu"].as_f64() >= Some(2.0), "{row:#}");
        }
    }
    for row in rows(&report, "cost") {
        has_keys(
            row,
            &[
                "strategy",
                "load",
                "wcu_per_cycle",
                "rcu_per_cycle",
                "usd_per_million_cycles",
            ],
        );
    }

    let saturation = rows(&report, "saturation");
    for row in saturation {
        has_keys(
            row,
            &[
                "strategy",
                "grants",
                "refused_rate",
                "wait",
                "ideal_fifo_wait_ms",
                "max_over_ideal",
                "fairness",
                "in_order",
                "in_order_lenient",
                "borrow_calls_per_grant",
                "borrow_wcu_per_grant",
                "waits_ms",
            ],
        );
    }
    let strategies: Vec<&str> = saturation
        .iter()
        .filter_map(|r| r["strategy"].as_str())
        .collect();
    assert_eq!(strategies, ["new"]);

    for row in rows(&report, "read_load") {
        has_keys(
            row,
            &[
                "strategy",
                "waiters",
                "reads_per_s",
                "writes_per_s",
                "wake_after_return",
                "wake_after_expiry",
            ],
        );
    }
    for row in rows(&report, "wake") {
        has_keys(row, &["strategy", "trigger", "delay", "delays_ms"]);
        has_keys(&row["delay"], &["samples", "p50_ms", "p99_ms"]);
    }
    for row in rows(&report, "polling") {
        has_keys(row, &["backend", "strategy", "reads_per_s"]);
    }
    let shapes: Vec<(u64, u64)> = rows(&report, "item_size")
        .iter()
        .filter_map(|r| Some((r["count"].as_u64()?, r["waiting"].as_u64()?)))
        .collect();
    assert_eq!(
        shapes,
        [
            (1, 0),
            (4, 0),
            (16, 0),
            (32, 0),
            (100, 0),
            (1000, 0),
            (4, 100),
            (4, 1000)
        ]
    );

    // The smoke profile measures every target but those of 100 waiters and
    // 64 clients. A ratio to naive has no value when naive completed no cycle
    // in its short run (a loaded machine): the report must then say so.
    let naive_idle = rows(&report, "contention").iter().any(|r| {
        r["backend"] == "dynamodb-local"
            && r["strategy"] == "naive"
            && r["latency_ms"] == 8
            && r["clients"] == 16
            && r["cycles"] == 0
    });
    let targets = rows(&report, "targets");
    assert_eq!(targets.len(), 22);
    for target in targets {
        let status = target["status"].as_str().unwrap_or("");
        let name = target["name"].as_str().unwrap_or("");
        if name.starts_with("100 waiters")
            || name.starts_with("64 clients")
            || (naive_idle && name.ends_with("new ÷ naive"))
        {
            assert_eq!(status, "not measured", "{target:#}");
        } else {
            assert!(
                ["met", "not met"].contains(&status),
                "measured by the smoke profile: {target:#}"
            );
        }
    }
    let plots = rows(&report, "plots");
    assert_eq!(plots.len(), 7);
    for plot in plots {
        let svg = std::fs::read_to_string(plot.as_str().expect("a path")).expect("plot written");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_a_usage_error_not_a_panic() {
    for args in [
        &["--profile", "huge"][..],
        &["--clients", "0"],
        &["--nonsense"],
    ] {
        let run = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .output()
            .expect("run the bench binary");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        // An error that names what is wrong and points to --help (clap's).
        assert!(
            stderr.starts_with("error:")
                && stderr.contains("--help")
                && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}
