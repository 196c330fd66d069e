//! The dispatcher (async mode): after each change to a pool with async
//! tickets, [`Service::dispatch_step`] admits, hands on and records grants;
//! this delivers them to their callbacks with capped, jittered retries while
//! the lease is live and within a bound, then records `delivered`, or
//! `failed` with the reason and the lease returned. A claim on the ticket
//! item keeps one attempt in flight per ticket across dispatchers; delivery
//! is at least once: a receiver answers a duplicate (its ticket and fence)
//! `2xx` again and takes it once.
//!
//! [`Local`] runs it in-process (local-api), woken by the service's watch and
//! by timers at each pool's next expiry; in AWS the table's stream and a
//! wake queue do the same, their batches handled by [`Handler`]. The route
//! functions whose writes hand slots to async tickets deliver those grants
//! themselves before they answer ([`DeliverOnGrant`]), and wake the
//! dispatcher through [`wake`] for what they leave.
//!
//! [`Service::dispatch_step`]: crate::service::Service::dispatch_step

#[cfg(feature = "dispatch")]
mod caller;
#[cfg(feature = "dispatch")]
mod dispatcher;
#[cfg(feature = "dispatch")]
pub mod events;
#[cfg(feature = "dispatch")]
mod handler;
#[cfg(feature = "dispatch")]
mod inline;
#[cfg(feature = "dispatch")]
mod local;
#[cfg(feature = "stream")]
pub mod stream;
#[cfg(all(test, feature = "dispatch"))]
mod test_support;
pub mod wake;

#[cfg(feature = "dispatch")]
pub use caller::{Attempt, Caller, CheckedResolver};
#[cfg(feature = "dispatch")]
pub use dispatcher::{Dispatcher, Outcome, DELIVERY_BOUND};
#[cfg(feature = "dispatch")]
pub use events::{Batch, BatchResponse};
#[cfg(feature = "dispatch")]
pub use handler::Handler;
#[cfg(feature = "dispatch")]
pub use inline::{DeliverOnGrant, INLINE_ATTEMPT, INLINE_BOUND};
#[cfg(feature = "dispatch")]
pub use local::Local;
