//! Test support shared by the behavioural, concurrency and fault-injection
//! suites and the benchmark: DynamoDB Local connection, an in-process API
//! client, and the stores under test.

pub use harness::Backend;

/// Declares each test function twice, `memory::$name` and
/// `dynamodb::$name`, calling it with [`Backend::Memory`] and
/// [`Backend::DynamoDb`]: every behavioural test runs on both stores. Async
/// functions run on a multi-threaded tokio runtime, 2 worker threads unless
/// `workers = N;` comes first; `sync;` first declares plain tests (those
/// that drive a `local-api` process).
#[macro_export]
macro_rules! on_both_stores {
    (sync; $($name:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $name() { super::$name($crate::Backend::Memory) }) *
        }
        mod dynamodb {
            $(#[test]
            fn $name() { super::$name($crate::Backend::DynamoDb) }) *
        }
    };
    (workers = $workers:literal; $($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn $name() { super::$name($crate::Backend::Memory).await }) *
        }
        mod dynamodb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn $name() { super::$name($crate::Backend::DynamoDb).await }) *
        }
    };
    ($($name:ident),* $(,)?) => {
        $crate::on_both_stores!(workers = 2; $($name),*);
    };
}

pub mod counting;
pub mod faults;
pub use semaphore::store::forward;
pub mod harness;
pub mod history;
pub mod receiver;
pub mod rng;
pub mod truth;
pub mod wakes;
pub mod workload;
