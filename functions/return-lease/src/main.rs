//! `POST /l/{id}/return`: build the service once at init, then hand each request to the shared crate.

use lambda_http::{service_fn, Error};
use semaphore::{config, lambda, Route};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let service = config::granting_service_from_env().await?;
    lambda_http::run(service_fn(|request| {
        lambda::handle(&service, Route::Return, request)
    }))
    .await
}
