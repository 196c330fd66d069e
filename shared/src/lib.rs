//! A distributed counting semaphore over HTTP.
//!
//! Dependencies point inward: entrypoints ([`api::lambda`], local-api) →
//! [`api`] → [`service`] → [`domain`] and the [`store`] traits; `delivery`
//! (async mode's, feature `dispatch`; its wake queue alone, feature `wake`)
//! sits above the service, the callback URL policy ([`callback`]) below it.

pub mod api;
pub mod callback;
pub mod clock;
pub mod config;
#[cfg(feature = "wake")]
pub mod delivery;
pub mod domain;
pub mod error;
pub mod functions;
pub mod keys;
pub mod metrics;
pub mod service;
pub mod store;

pub use api::{lambda, openapi, Route};
pub use error::Error;
pub use service::{Limits, Service};

#[cfg(test)]
mod layout_tests;
