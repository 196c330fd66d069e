//! Every integration test of the crate, in one binary: the AWS SDK and the
//! service are linked once instead of once per file. Each file is a module,
//! so test names read `behaviour::memory::return_is_idempotent`,
//! `randomized::dynamodb_random_history_is_correct`.

// `on_both_stores!`, for every module.
#[macro_use]
extern crate semaphore_tests;

mod async_mode;
mod async_random;
mod behaviour;
mod calls_per_operation;
mod checker;
mod clock_edges;
mod concurrency;
mod dispatcher;
mod events;
mod fair_and_fenced;
mod giving_up;
mod idle_pools;
mod instants;
mod item_growth;
mod randomized;
mod reliability;
mod tickets;
mod upgrade;
mod waiting_budget;

/// With `autotests = false`, a file in tests/tests/ that is not declared
/// above is never compiled nor run: fail instead.
#[test]
fn every_test_file_is_a_module() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let declared = include_str!("main.rs");
    for entry in std::fs::read_dir(&dir).expect("tests/tests") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && name != "main" {
            assert!(
                declared.contains(&format!("\nmod {name};")),
                "tests/tests/{name}.rs is not a module of tests/tests/main.rs"
            );
        }
    }
}
