//! The dispatcher function's handler over DynamoDB Local, with its wake
//! queue recorded instead of sent to SQS.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use semaphore::callback::CallbackPolicy;
use semaphore::delivery::wake::{Wake, WakeSender};
use semaphore::delivery::{Caller, Dispatcher, Handler};
use semaphore::keys::PoolKey;
use semaphore::store::{dynamodb, DynamoDbStore};
use semaphore::{Limits, Service};

use crate::harness::{dynamodb_client, TABLE};

/// The wakes a handler sent, with their delays.
#[derive(Default)]
pub struct RecordedWakes(Mutex<Vec<(Wake, Duration)>>);

#[async_trait]
impl WakeSender for RecordedWakes {
    async fn send(&self, wake: &Wake, delay: Duration) -> Result<(), String> {
        self.0
            .lock()
            .map_err(|_| "poisoned")?
            .push((wake.clone(), delay));
        Ok(())
    }
}

impl RecordedWakes {
    /// The wakes sent since the last call.
    pub fn taken(&self) -> Vec<(Wake, Duration)> {
        self.0
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
    }
}

/// What a dispatcher test drives: the service (the routes' side), the
/// handler (the dispatcher function's), their store and the wakes sent.
pub struct DispatcherOnDynamoDb {
    pub service: Arc<Service>,
    pub handler: Handler,
    pub client: aws_sdk_dynamodb::Client,
    pub wakes: Arc<RecordedWakes>,
}

/// [`DispatcherOnDynamoDb`] on the test table, loopback callbacks allowed.
pub async fn dispatcher_on_dynamodb() -> DispatcherOnDynamoDb {
    let client = dynamodb_client().await;
    let store = Arc::new(DynamoDbStore::new(client.clone(), TABLE));
    let policy = CallbackPolicy { allow_local: true };
    let service = Arc::new(
        Service::new(store.clone(), Limits::default())
            .with_tickets(store.clone())
            .with_callback_policy(policy),
    );
    let caller = Caller::new(policy, Duration::from_secs(2)).expect("caller");
    let dispatcher = Dispatcher::new(service.clone(), caller).with_bound(Duration::from_secs(3));
    let wakes = Arc::new(RecordedWakes::default());
    let handler = Handler::new(Arc::new(dispatcher), store, wakes.clone());
    DispatcherOnDynamoDb {
        service,
        handler,
        client,
        wakes,
    }
}

/// The pool's pending wake as stored (`wk`), read strongly consistent.
pub async fn pending_wake(client: &aws_sdk_dynamodb::Client, key: &PoolKey) -> Option<u64> {
    let item = client
        .get_item()
        .table_name(TABLE)
        .set_key(Some(dynamodb::pool_key(key)))
        .consistent_read(true)
        .send()
        .await
        .ok()?;
    match item.item()?.get("wk")? {
        aws_sdk_dynamodb::types::AttributeValue::N(n) => n.parse().ok(),
        _ => None,
    }
}
