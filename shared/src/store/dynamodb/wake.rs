//! The dispatcher's pending wake of a pool (`wk` on the pool item): the one
//! an invocation armed last and that is not yet due, whichever invocations
//! want one (the dispatcher sends it as an SQS message).

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;

use super::schema::pool_item::PENDING_WAKE;
use super::schema::PK;
use super::{pool_key, store_error, DynamoDbStore};
use crate::keys::PoolKey;
use crate::store::{StoreError, WakeStore};

/// DynamoDB's `IN` takes at most 100 operands; a batch of wakes is at most 10.
const MAX_HANDLED: usize = 100;

impl DynamoDbStore {
    /// One `UpdateItem` of `wk`: `true` when its condition held.
    async fn write_wake(
        &self,
        key: &PoolKey,
        update: String,
        condition: String,
        values: Vec<(String, u64)>,
    ) -> Result<bool, StoreError> {
        let mut call = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(pool_key(key)))
            .update_expression(update)
            .condition_expression(condition)
            .set_return_consumed_capacity(self.capacity_mode());
        for (name, value) in values {
            call = call.expression_attribute_values(name, AttributeValue::N(value.to_string()));
        }
        match call.send().await {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(true)
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(store_error(err)),
            },
        }
    }
}

/// ` OR wk IN (:h0, …)` for the wakes being handled, with their values.
fn handled_clause(handled: &[u64]) -> (String, Vec<(String, u64)>) {
    let handled = &handled[..handled.len().min(MAX_HANDLED)];
    if handled.is_empty() {
        return (String::new(), Vec::new());
    }
    let names: Vec<String> = (0..handled.len()).map(|i| format!(":h{i}")).collect();
    let clause = format!(" OR {PENDING_WAKE} IN ({})", names.join(", "));
    (
        clause,
        names.into_iter().zip(handled.iter().copied()).collect(),
    )
}

#[async_trait]
impl WakeStore for DynamoDbStore {
    async fn arm_wake(
        &self,
        key: &PoolKey,
        at_ms: u64,
        now_ms: u64,
        handled: &[u64],
    ) -> Result<bool, StoreError> {
        let (handled_clause, mut values) = handled_clause(handled);
        values.push((":at".to_string(), at_ms));
        values.push((":now".to_string(), now_ms));
        // A pending wake is one not yet due; a due or past one was handled
        // (or lost), and one being handled (early: SQS delays at most 15
        // minutes) is no longer pending: then a new one may be armed.
        let condition = format!(
            "attribute_exists({PK}) AND (attribute_not_exists({PENDING_WAKE}) OR {PENDING_WAKE} > :at OR {PENDING_WAKE} < :now{handled_clause})"
        );
        self.write_wake(key, format!("SET {PENDING_WAKE} = :at"), condition, values)
            .await
    }

    async fn disarm_wake(&self, key: &PoolKey, handled: &[u64]) -> Result<bool, StoreError> {
        let (handled_clause, values) = handled_clause(handled);
        let Some(any_of) = handled_clause.strip_prefix(" OR ") else {
            return Ok(false);
        };
        self.write_wake(
            key,
            format!("REMOVE {PENDING_WAKE}"),
            any_of.to_string(),
            values,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_being_handled_are_named_in_one_in_list() {
        assert_eq!(handled_clause(&[]), (String::new(), Vec::new()));
        let (clause, values) = handled_clause(&[5, 7]);
        assert_eq!(clause, " OR wk IN (:h0, :h1)");
        assert_eq!(values, [(":h0".to_string(), 5), (":h1".to_string(), 7)]);
        let many: Vec<u64> = (0..150).collect();
        assert_eq!(handled_clause(&many).1.len(), MAX_HANDLED);
    }
}
