//! A distributed counting semaphore over HTTP.
//!
//! Dependencies point inward: entrypoints ([`lambda`], the local server) →
//! [`api`] (HTTP mapping) → [`service`] → [`domain`] and the [`store`] trait.

pub mod api;
pub mod callback;
pub mod clock;
pub mod config;
#[cfg(feature = "dispatch")]
pub mod dispatch;
pub mod domain;
pub mod error;
pub mod keys;
pub mod lambda;
pub mod metrics;
pub mod openapi;
pub mod service;
pub mod store;
#[cfg(feature = "stream")]
pub mod stream;

pub use api::Route;
pub use error::Error;
pub use service::{Limits, Service};
