//! Configuration from the environment, and building the app state once per
//! process (Lambda init or local server start).

use std::sync::Arc;
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;

use crate::service::{Limits, Service};
use crate::store::{DynamoDbStore, PoolStore};

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub table_name: String,
    pub limits: Limits,
}

impl Config {
    /// `TABLE_NAME` (required), `MAX_TTL_SECONDS` (default 3600),
    /// `MAX_WAIT_SECONDS` (default 25).
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let table_name = var("TABLE_NAME")
            .filter(|t| !t.is_empty())
            .ok_or("TABLE_NAME must be set")?;
        Ok(Config {
            table_name,
            limits: limits_from_lookup(var)?,
        })
    }
}

/// `MAX_TTL_SECONDS` (default 3600) and `MAX_WAIT_SECONDS` (default 25).
pub fn limits_from_env() -> Result<Limits, String> {
    limits_from_lookup(|name| std::env::var(name).ok())
}

fn limits_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Limits, String> {
    {
        let defaults = Limits::default();
        let seconds = |name: &str, default_ms: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default_ms),
                Some(raw) => raw
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .map(|s| (s * 1000.0).round() as u64)
                    .ok_or(format!(
                        "{name} must be a positive number of seconds, got {raw:?}"
                    )),
            }
        };
        Ok(Limits {
            max_ttl_ms: seconds("MAX_TTL_SECONDS", defaults.max_ttl_ms)?,
            max_wait_ms: seconds("MAX_WAIT_SECONDS", defaults.max_wait_ms)?,
        })
    }
}

/// A DynamoDB client. With `endpoint` (DynamoDB Local) it needs no AWS account:
/// region and credentials fall back to dummies unless the environment sets them.
/// Without it, the standard chain applies (`AWS_ENDPOINT_URL_DYNAMODB` included).
pub async fn dynamodb_client(endpoint: Option<&str>) -> aws_sdk_dynamodb::Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        // One slow attempt must not eat a borrower's whole wait.
        .operation_attempt_timeout(Duration::from_secs(3))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(timeouts);
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            loader = loader.region(Region::new("us-east-1"));
        }
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            loader = loader.credentials_provider(Credentials::new("x", "x", None, None, "local"));
        }
    }
    aws_sdk_dynamodb::Client::new(&loader.load().await)
}

/// The app state a Lambda builds once at init: config from the environment and
/// one DynamoDB client.
pub async fn service_from_env() -> Result<Service, String> {
    service_from_lookup(|name| std::env::var(name).ok()).await
}

/// The same from a lookup instead of the process environment (tests), with
/// the endpoint from its `AWS_ENDPOINT_URL_DYNAMODB`.
pub async fn service_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Service, String> {
    let endpoint = var("AWS_ENDPOINT_URL_DYNAMODB");
    let config = Config::from_lookup(var)?;
    let client = dynamodb_client(endpoint.as_deref()).await;
    let store: Arc<dyn PoolStore> = Arc::new(DynamoDbStore::new(client, config.table_name));
    Ok(Service::new(store, config.limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let config = Config::from_lookup(lookup(&[("TABLE_NAME", "t")])).unwrap();
        assert_eq!(config.limits, Limits::default());
        let config = Config::from_lookup(lookup(&[
            ("TABLE_NAME", "t"),
            ("MAX_TTL_SECONDS", "60"),
            ("MAX_WAIT_SECONDS", "2.5"),
        ]))
        .unwrap();
        assert_eq!(config.limits.max_ttl_ms, 60_000);
        assert_eq!(config.limits.max_wait_ms, 2_500);
    }

    #[test]
    fn bad_values_fail_at_init() {
        assert!(Config::from_lookup(lookup(&[])).is_err());
        assert!(
            Config::from_lookup(lookup(&[("TABLE_NAME", "t"), ("MAX_TTL_SECONDS", "x")])).is_err()
        );
        assert!(
            Config::from_lookup(lookup(&[("TABLE_NAME", "t"), ("MAX_WAIT_SECONDS", "0")])).is_err()
        );
    }
}
