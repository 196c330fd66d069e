//! Async mode's dispatcher: invoked by the table's stream (filtered to pool
//! items with async work and new tickets) and by its wake queue. Builds its
//! state once at init, then hands each batch to the shared crate, which
//! steps each pool named, arms its next wake, delivers its grants, and
//! answers with the records that failed (a partial batch response).

use std::sync::Arc;

use lambda_http::lambda_runtime::{self, service_fn, LambdaEvent};
use lambda_http::Error;
use semaphore::delivery::Handler;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let handler = Arc::new(Handler::from_env().await?);
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let handler = handler.clone();
        async move { handler.handle(event).await }
    }))
    .await
}
