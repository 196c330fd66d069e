//! Every integration test of the crate, in one binary: the AWS SDK and the
//! service are linked once instead of once per file. Each file is a module,
//! so test names read `behaviour::memory::return_is_idempotent`,
//! `randomized::dynamodb_random_history_is_correct`.

/// Runs each scenario once per store, as `memory::NAME` and `dynamodb::NAME`
/// (each on a multi-threaded runtime of `workers` threads, 2 unless given).
/// Defined before the modules, so that each of them sees it.
macro_rules! on_both_stores {
    (workers = $workers:literal; $($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn $name() { super::$name(super::Backend::Memory).await }) *
        }
        mod dynamodb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn $name() { super::$name(super::Backend::DynamoDb).await }) *
        }
    };
    ($($name:ident),* $(,)?) => {
        on_both_stores!(workers = 2; $($name),*);
    };
}

mod behaviour;
mod calls_per_operation;
mod checker;
mod clock_edges;
mod concurrency;
mod events;
mod fair_and_fenced;
mod randomized;
mod reliability;

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
