//! Test support shared by the behavioural, concurrency and fault-injection
//! suites and the benchmark: DynamoDB Local connection, an in-process API
//! client, and the stores under test.

pub mod counting;
pub mod faults;
pub mod harness;
pub mod history;
pub mod rng;
pub mod truth;
pub mod workload;
