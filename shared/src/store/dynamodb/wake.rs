//! The dispatcher's pending wake of a pool (`wk` on the pool item): one at a
//! time, whichever invocations want one (functions/dispatcher sends it).

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;

use super::schema::pool_item::PENDING_WAKE;
use super::schema::PK;
use super::{pool_key, store_error, DynamoDbStore};
use crate::keys::PoolKey;
use crate::store::StoreError;

impl DynamoDbStore {
    /// Records a wake of the pool at `at_ms` unless one at or before it is
    /// pending (so that invocations never start a second chain of wakes):
    /// `true` when it did (the caller then sends the wake), `false` when an
    /// earlier wake is pending or the pool is gone.
    pub async fn arm_wake(
        &self,
        key: &PoolKey,
        at_ms: u64,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let armed = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(pool_key(key)))
            .update_expression(format!("SET {PENDING_WAKE} = :at"))
            // A pending wake is one not yet due; a due or past one was handled
            // (or lost) and a new one may be armed.
            .condition_expression(format!(
                "attribute_exists({PK}) AND (attribute_not_exists({PENDING_WAKE}) OR {PENDING_WAKE} > :at OR {PENDING_WAKE} < :now)"
            ))
            .expression_attribute_values(":at", AttributeValue::N(at_ms.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match armed {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(true)
            }
            Err(err) => match err.as_service_error() {
                // An earlier wake is pending, or the pool is gone.
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(store_error(err)),
            },
        }
    }
}
