//! The HTTP API's `$default` route: JSON 404 for unknown routes, 405 (with
//! `Allow`) for a known path with the wrong method. Needs no database.

use lambda_http::{service_fn, Error};
use semaphore::lambda;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    lambda_http::run(service_fn(lambda::fallback)).await
}
