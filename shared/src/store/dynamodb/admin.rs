//! The table: created and checked (local runs and tests), its stream, and
//! the read that opens the connection during init.

use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, LocalSecondaryIndex, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;

use super::schema::ticket_item::EXPIRES_AT;
use super::schema::{BY_TICKET, NUMBER, PK, SK, WARM_UP_KEY};
use super::store_error;
use crate::store::{StoreError, StoreErrorKind};

/// Creates the table if it does not exist and checks its key schema, failing
/// early and clearly when it is keyed differently. For local runs and tests;
/// deployed functions rely on the SAM template.
pub async fn ensure_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let created = create_table(client, table).await?;
    until_active(client, table).await?;
    if created {
        enable_ttl(client, table).await?;
    }
    Ok(())
}

/// Creates the table with its index and stream (true); one that exists
/// already is left as it is (false; for [`until_active`] to check).
async fn create_table(client: &Client, table: &str) -> Result<bool, StoreError> {
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        StoreError::new(StoreErrorKind::Unavailable, e.to_string())
    };
    let attribute = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(invalid)
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(invalid)
    };
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(PK, ScalarAttributeType::B)?)
        .attribute_definitions(attribute(SK, ScalarAttributeType::B)?)
        .attribute_definitions(attribute(NUMBER, ScalarAttributeType::N)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        // Async mode's dispatcher follows it (template.yaml: the same view).
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .map_err(invalid)?,
        )
        // Ticket items in ticket order (async mode); a local index, so that
        // its reads can be strongly consistent. Pool items have no `tn`.
        .local_secondary_indexes(
            LocalSecondaryIndex::builder()
                .index_name(BY_TICKET)
                .key_schema(key(PK, KeyType::Hash)?)
                .key_schema(key(NUMBER, KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
                .build()
                .map_err(invalid)?,
        )
        .send()
        .await;
    if let Err(err) = created {
        if !matches!(
            err.as_service_error(),
            Some(CreateTableError::ResourceInUseException(_))
        ) {
            return Err(store_error(err));
        }
        return Ok(false);
    }
    Ok(true)
}

/// Turns on the TTL that template.yaml declares (ticket items' `xp`: garbage
/// collection of ended tickets), so that a table made here has the
/// template's schema (tests/aws_local/test_schema.py compares the two).
async fn enable_ttl(client: &Client, table: &str) -> Result<(), StoreError> {
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        StoreError::new(StoreErrorKind::Unavailable, e.to_string())
    };
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(EXPIRES_AT)
                .enabled(true)
                .build()
                .map_err(invalid)?,
        )
        .send()
        .await
        .map_err(store_error)?;
    Ok(())
}

/// Waits until the table is active, failing when it is keyed differently.
async fn until_active(client: &Client, table: &str) -> Result<(), StoreError> {
    for _ in 0..100 {
        let described = describe(client, table).await?;
        let Some(desc) = described.table() else {
            break;
        };
        let keyed_right = matches!(
            desc.key_schema(),
            [h, r] if h.attribute_name() == PK && h.key_type() == &KeyType::Hash
                && r.attribute_name() == SK && r.key_type() == &KeyType::Range
        ) && [PK, SK].iter().all(|name| {
            desc.attribute_definitions().iter().any(|a| {
                a.attribute_name() == *name && a.attribute_type() == &ScalarAttributeType::B
            })
        });
        if !keyed_right {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "table {table} must have the binary partition key `{PK}` and binary sort key `{SK}`"
                ),
            ));
        }
        if desc.table_status() == Some(&TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(StoreError::new(
        StoreErrorKind::Unavailable,
        format!("table {table} did not become active"),
    ))
}

/// The table as DynamoDB describes it.
async fn describe(client: &Client, table: &str) -> Result<DescribeTableOutput, StoreError> {
    client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(store_error)
}

/// The table's stream (async mode's dispatcher follows it in local runs).
pub async fn stream_arn(client: &Client, table: &str) -> Result<String, StoreError> {
    let described = describe(client, table).await?;
    described
        .table()
        .and_then(|t| t.latest_stream_arn())
        .map(str::to_string)
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("table {table} has no stream (async mode's dispatcher follows it)"),
            )
        })
}

/// Opens the connection to DynamoDB during init (DNS, TCP, TLS and the SDK's
/// first-call set-up), so the first request does not pay for it; the client
/// keeps the connection for later invocations. A failure only costs the first
/// request that time again.
pub(crate) async fn warm_up(client: &aws_sdk_dynamodb::Client, table: &str) {
    let started = std::time::Instant::now();
    let blob = |bytes: &[u8]| {
        aws_sdk_dynamodb::types::AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bytes))
    };
    let read = client
        .get_item()
        .table_name(table)
        .key(crate::store::dynamodb::PK, blob(WARM_UP_KEY))
        .key(
            crate::store::dynamodb::SK,
            blob(&crate::store::dynamodb::POOL_ITEM),
        )
        .send();
    match tokio::time::timeout(Duration::from_secs(3), read).await {
        Ok(Ok(_)) => tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "DynamoDB connection opened during init"
        ),
        Ok(Err(err)) => tracing::warn!(
            error = %aws_sdk_dynamodb::error::DisplayErrorContext(&err),
            "DynamoDB warm-up read failed"
        ),
        Err(_) => tracing::warn!("DynamoDB warm-up read timed out"),
    }
}
