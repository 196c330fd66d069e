//! Configuration from the environment, and building the app state once per
//! process (Lambda init or local server start).
//!
//! Each setting has one valid range, decided here; the SAM template's
//! `MinValue`/`MaxValue` are the same numbers, and anything outside them is
//! refused at start with a one-line message naming the variable.

use std::sync::Arc;
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;

use crate::callback::CallbackPolicy;
use crate::service::{Limits, Service};
use crate::store::{dynamodb, DynamoDbStore};

/// `MAX_TTL_SECONDS`: 1 s to a year.
pub const TTL_SECONDS: (f64, f64) = (1.0, 31_536_000.0);
/// `MAX_WAIT_SECONDS`: 0 (never block) to 25 s. A borrow's Lambda has 29 s:
/// 25 s of waiting, one full store call (2.5 s) and the 0.3 s margin fit.
pub const WAIT_SECONDS: (f64, f64) = (0.0, 25.0);
/// `MAX_ASYNC_WAIT_SECONDS`: up to a week.
pub const ASYNC_WAIT_SECONDS: (f64, f64) = (1.0, 604_800.0);
/// `MAX_WAITERS`: 1 to 1000 tickets per pool (23 bytes each in the item).
pub const WAITERS: (u64, u64) = (1, 1000);
/// `MAX_TICKETS`: 1 to a million tickets waiting in a pool's backlog (each
/// an item of up to about 3 KB, kept for its wait and 7 days more).
pub const TICKETS: (u64, u64) = (1, 1_000_000);
/// `WAITING_BUDGET`: borrows waiting at once across the service, 0 (none) to
/// 10,000.
pub const WAITING_BUDGET: (u64, u64) = (0, 10_000);
/// `IDLE_POOL_DAYS`: 0 (never) to ten years.
pub const IDLE_POOL_DAYS: (u64, u64) = (0, 3650);

/// `IDLE_POOL_DAYS` from `var`.
pub fn idle_pool_days_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<u64, String> {
    whole_number(&var, "IDLE_POOL_DAYS", IDLE_POOL_DAYS, 0)
}

/// The variable `name` as a whole number within `(min, max)`, or `default`
/// when it is not set; anything else is refused, naming the variable.
fn whole_number(
    var: impl Fn(&str) -> Option<String>,
    name: &str,
    (min, max): (u64, u64),
    default: u64,
) -> Result<u64, String> {
    match var(name) {
        None => Ok(default),
        Some(raw) => raw
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or(format!(
                "{name} must be a whole number from {min} to {max}, got {raw:?}"
            )),
    }
}

/// How long after its last write an idle pool may be deleted: the days, and
/// the longest a lease or a ticket that write left could still live.
pub fn idle_expiry(days: u64, limits: &Limits) -> Option<Duration> {
    (days > 0).then(|| {
        Duration::from_secs(days * 86_400)
            + Duration::from_millis(limits.max_ttl_ms.max(limits.max_async_wait_ms))
    })
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub table_name: String,
    pub limits: Limits,
    /// `AWS_ENDPOINT_URL_DYNAMODB`: another DynamoDB (DynamoDB Local).
    pub dynamodb_endpoint: Option<String>,
    /// `ALLOW_LOCAL_CALLBACKS=true`: also `http` and loopback callbacks, for a
    /// receiver on the same machine. Local runs only: template.yaml leaves it unset.
    pub callbacks: CallbackPolicy,
    /// `IDLE_POOL_DAYS` (0: never): a pool nobody writes for that long (and
    /// the longest lease or ticket wait more) is deleted by DynamoDB's TTL.
    pub idle_pool_days: u64,
}

impl Config {
    /// `TABLE_NAME` (required), the limits of [`limits_from_lookup`],
    /// `AWS_ENDPOINT_URL_DYNAMODB` and `ALLOW_LOCAL_CALLBACKS` (optional).
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let table_name = var("TABLE_NAME")
            .filter(|t| !t.is_empty())
            .ok_or("TABLE_NAME must be set")?;
        let allow_local = match var("ALLOW_LOCAL_CALLBACKS").as_deref().map(str::trim) {
            None | Some("" | "false") => false,
            Some("true") => true,
            Some(raw) => {
                return Err(format!(
                    "ALLOW_LOCAL_CALLBACKS must be true or false, got {raw:?}"
                ))
            }
        };
        Ok(Config {
            table_name,
            limits: limits_from_lookup(&var)?,
            dynamodb_endpoint: var("AWS_ENDPOINT_URL_DYNAMODB").filter(|e| !e.is_empty()),
            callbacks: CallbackPolicy { allow_local },
            idle_pool_days: idle_pool_days_from_lookup(&var)?,
        })
    }
}

/// `WAKE_QUEUE_URL` (required by the dispatcher): the SQS queue of its wakes.
pub fn wake_queue_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    var("WAKE_QUEUE_URL")
        .filter(|url| !url.is_empty())
        .ok_or_else(|| "WAKE_QUEUE_URL must be set".to_string())
}

/// What the dispatcher reads at start: the wake queue, then the service's
/// settings.
pub fn dispatcher_settings_from_lookup(
    var: impl Fn(&str) -> Option<String>,
) -> Result<(Config, String), String> {
    let queue_url = wake_queue_from_lookup(&var)?;
    Ok((Config::from_lookup(var)?, queue_url))
}

/// What the route functions whose writes can hand a slot to an async ticket
/// (return, register, borrow, cancel, enqueue) read at start: the service's
/// settings, then `WAKE_QUEUE_URL` (optional: without it, only the table's
/// stream wakes the dispatcher, about 200 ms later).
pub fn granting_settings_from_lookup(
    var: impl Fn(&str) -> Option<String>,
) -> Result<(Config, Option<String>), String> {
    let config = Config::from_lookup(&var)?;
    Ok((config, var("WAKE_QUEUE_URL").filter(|url| !url.is_empty())))
}

/// The service of a route function whose writes can hand a slot to an async
/// ticket ([`granting_settings_from_lookup`]): told of each such grant, it
/// delivers it before the request answers (feature `dispatch`), and wakes
/// the dispatcher through the wake queue for what it leaves.
#[cfg(feature = "wake")]
pub async fn granting_service_from_env() -> Result<Service, String> {
    use crate::delivery::wake::{SqsWakes, WakeOnGrant};
    let (config, queue_url) = granting_settings_from_lookup(|name| std::env::var(name).ok())?;
    let (service, _) = service_and_store(config).await;
    let wake = match queue_url {
        Some(url) => Some(WakeOnGrant::new(Arc::new(SqsWakes::new(
            sqs_client().await,
            url,
        )))),
        None => None,
    };
    #[cfg(feature = "dispatch")]
    {
        use crate::delivery::{Caller, DeliverOnGrant, Dispatcher, INLINE_ATTEMPT};
        let caller = Caller::new(service.callback_policy(), INLINE_ATTEMPT)
            .map_err(|e| format!("the callbacks' HTTP client: {e}"))?;
        // On the service without the hook: a failed delivery's returned
        // lease reaches the dispatcher through the wake (or the stream).
        let dispatcher = Dispatcher::new(Arc::new(service.clone()), caller)
            .with_log(crate::metrics::LogFormat::Json);
        let hook = DeliverOnGrant::new(Arc::new(dispatcher), wake);
        Ok(service.with_on_async_grant(Arc::new(hook)))
    }
    #[cfg(not(feature = "dispatch"))]
    Ok(match wake {
        Some(wake) => service.with_on_async_grant(Arc::new(wake)),
        None => service,
    })
}

/// An SQS client for the route functions' wakes: its calls end within a
/// second, since the request's answer waits for them (SQS answers in
/// milliseconds; a slow one only loses the head start, the stream remains).
#[cfg(feature = "wake")]
async fn sqs_client() -> aws_sdk_sqs::Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_millis(500))
        .operation_attempt_timeout(Duration::from_millis(500))
        .operation_timeout(Duration::from_secs(1))
        .build();
    let loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(timeouts);
    aws_sdk_sqs::Client::new(&loader.load().await)
}

/// `MAX_TTL_SECONDS` (default 3600), `MAX_WAIT_SECONDS` (default 25),
/// `MAX_WAITERS` (default 100), `MAX_ASYNC_WAIT_SECONDS` (an async
/// ticket's longest wait; default 86400, a day) and `MAX_TICKETS` (tickets
/// waiting in a pool's backlog; default 10,000).
pub fn limits_from_env() -> Result<Limits, String> {
    limits_from_lookup(|name| std::env::var(name).ok())
}

pub fn limits_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Limits, String> {
    let defaults = Limits::default();
    let seconds = |name: &str, (min, max): (f64, f64), default_ms: u64| match var(name) {
        None => Ok(default_ms),
        Some(raw) => raw
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| (min..=max).contains(s))
            .map(|s| (s * 1000.0).round() as u64)
            .ok_or(format!(
                "{name} must be a number of seconds from {min} to {max}, got {raw:?}"
            )),
    };
    let whole =
        |name: &str, range: (u64, u64), default: u64| whole_number(&var, name, range, default);
    let max_waiters = whole("MAX_WAITERS", WAITERS, defaults.max_waiters as u64)? as usize;
    Ok(Limits {
        max_ttl_ms: seconds("MAX_TTL_SECONDS", TTL_SECONDS, defaults.max_ttl_ms)?,
        max_wait_ms: seconds("MAX_WAIT_SECONDS", WAIT_SECONDS, defaults.max_wait_ms)?,
        max_waiters,
        max_async_wait_ms: seconds(
            "MAX_ASYNC_WAIT_SECONDS",
            ASYNC_WAIT_SECONDS,
            defaults.max_async_wait_ms,
        )?,
        max_tickets: whole("MAX_TICKETS", TICKETS, defaults.max_tickets)?,
        waiting_budget: whole(
            "WAITING_BUDGET",
            WAITING_BUDGET,
            u64::from(defaults.waiting_budget),
        )? as u32,
    })
}

/// How long one DynamoDB call may take, its retries included: in time for
/// the service to answer in JSON. A call sent once (a resize) has it all
/// for its one attempt.
pub const DYNAMODB_OPERATION_TIMEOUT: Duration = Duration::from_millis(2_500);

/// A DynamoDB client. With `endpoint` (DynamoDB Local) it needs no AWS account:
/// region and credentials fall back to dummies unless the environment sets them.
/// Without it, the standard chain applies (`AWS_ENDPOINT_URL_DYNAMODB` included).
pub async fn dynamodb_client(endpoint: Option<&str>) -> aws_sdk_dynamodb::Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        // A hung attempt is retried by the SDK; the whole call (retries
        // included) ends in time for the service to answer in JSON.
        .operation_attempt_timeout(Duration::from_millis(1_200))
        .operation_timeout(DYNAMODB_OPERATION_TIMEOUT)
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

/// [`service_from_env`] with the variables from `var`; the DynamoDB endpoint
/// from `AWS_ENDPOINT_URL_DYNAMODB` when it sets one.
pub async fn service_from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Service, String> {
    Ok(service_and_store_from_lookup(var).await?.0)
}

/// [`service_from_env`], and the store it is built on (the dispatcher writes
/// its wakes there too, with the same client).
pub async fn service_and_store_from_env() -> Result<(Service, Arc<DynamoDbStore>), String> {
    service_and_store_from_lookup(|name| std::env::var(name).ok()).await
}

/// [`service_from_lookup`], and the store it is built on.
pub async fn service_and_store_from_lookup(
    var: impl Fn(&str) -> Option<String>,
) -> Result<(Service, Arc<DynamoDbStore>), String> {
    Ok(service_and_store(Config::from_lookup(&var)?).await)
}

/// The service of `config`, and the store it is built on.
pub async fn service_and_store(config: Config) -> (Service, Arc<DynamoDbStore>) {
    let client = dynamodb_client(config.dynamodb_endpoint.as_deref()).await;
    dynamodb::warm_up(&client, &config.table_name).await;
    let mut store = DynamoDbStore::new(client, config.table_name);
    if let Some(after) = idle_expiry(config.idle_pool_days, &config.limits) {
        store = store.with_idle_expiry(after);
    }
    let store = Arc::new(store);
    (
        Service::new(store.clone(), config.limits)
            .with_tickets(store.clone())
            .with_callback_policy(config.callbacks),
        store,
    )
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

    fn limits(pairs: &[(&str, &str)]) -> Result<Limits, String> {
        limits_from_lookup(lookup(pairs))
    }

    #[test]
    fn defaults_and_overrides() {
        let config = Config::from_lookup(lookup(&[("TABLE_NAME", "t")])).unwrap();
        assert_eq!(config.limits, Limits::default());
        let l = limits(&[
            ("MAX_TTL_SECONDS", "60"),
            ("MAX_WAIT_SECONDS", "2.5"),
            ("MAX_WAITERS", "7"),
            ("MAX_TICKETS", "500"),
        ])
        .unwrap();
        assert_eq!(
            (l.max_ttl_ms, l.max_wait_ms, l.max_waiters, l.max_tickets),
            (60_000, 2_500, 7, 500)
        );
    }

    #[test]
    fn idle_pool_days_default_off_and_refused_out_of_range() {
        let config = Config::from_lookup(lookup(&[("TABLE_NAME", "t")])).unwrap();
        assert_eq!(config.idle_pool_days, 0);
        assert_eq!(idle_expiry(0, &config.limits), None);
        let config =
            Config::from_lookup(lookup(&[("TABLE_NAME", "t"), ("IDLE_POOL_DAYS", "30")])).unwrap();
        // 30 days and a day more: the longest ticket wait it could leave live.
        assert_eq!(
            idle_expiry(config.idle_pool_days, &config.limits),
            Some(Duration::from_secs(31 * 86_400))
        );
        for bad in ["-1", "3651", "1.5", "x"] {
            let err = Config::from_lookup(lookup(&[("TABLE_NAME", "t"), ("IDLE_POOL_DAYS", bad)]))
                .unwrap_err();
            assert!(err.starts_with("IDLE_POOL_DAYS"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_ends_of_every_range_are_valid() {
        let l = limits(&[
            ("MAX_TTL_SECONDS", "1"),
            ("MAX_WAIT_SECONDS", "0"),
            ("MAX_WAITERS", "1"),
        ])
        .unwrap();
        assert_eq!((l.max_ttl_ms, l.max_wait_ms, l.max_waiters), (1_000, 0, 1));
        let l = limits(&[
            ("MAX_TTL_SECONDS", "31536000"),
            ("MAX_WAIT_SECONDS", "25"),
            ("MAX_WAITERS", "1000"),
        ])
        .unwrap();
        assert_eq!(
            (l.max_ttl_ms, l.max_wait_ms, l.max_waiters),
            (31_536_000_000, 25_000, 1000)
        );
    }

    #[test]
    fn local_callbacks_are_off_unless_set_to_true() {
        let policy = |pairs: &[(&str, &str)]| {
            let mut all = vec![("TABLE_NAME", "t")];
            all.extend_from_slice(pairs);
            Config::from_lookup(lookup(&all)).map(|c| c.callbacks.allow_local)
        };
        assert_eq!(policy(&[]), Ok(false));
        assert_eq!(policy(&[("ALLOW_LOCAL_CALLBACKS", "")]), Ok(false));
        assert_eq!(policy(&[("ALLOW_LOCAL_CALLBACKS", "false")]), Ok(false));
        assert_eq!(policy(&[("ALLOW_LOCAL_CALLBACKS", "true")]), Ok(true));
        let err = policy(&[("ALLOW_LOCAL_CALLBACKS", "yes")]).unwrap_err();
        assert!(err.starts_with("ALLOW_LOCAL_CALLBACKS"), "{err}");
    }

    #[test]
    fn the_wake_queue_must_be_set() {
        assert!(wake_queue_from_lookup(lookup(&[])).is_err());
        assert!(wake_queue_from_lookup(lookup(&[("WAKE_QUEUE_URL", "")])).is_err());
        assert_eq!(
            wake_queue_from_lookup(lookup(&[("WAKE_QUEUE_URL", "http://q/1")])),
            Ok("http://q/1".to_string())
        );
    }

    #[test]
    fn the_routes_wake_queue_is_optional() {
        let table = ("TABLE_NAME", "t");
        let queue =
            |pairs: &[(&str, &str)]| granting_settings_from_lookup(lookup(pairs)).map(|s| s.1);
        assert_eq!(queue(&[table]), Ok(None));
        assert_eq!(queue(&[table, ("WAKE_QUEUE_URL", "")]), Ok(None));
        assert_eq!(
            queue(&[table, ("WAKE_QUEUE_URL", "http://q/1")]),
            Ok(Some("http://q/1".to_string()))
        );
        assert!(queue(&[("WAKE_QUEUE_URL", "http://q/1")]).is_err());
    }

    #[test]
    fn values_outside_their_range_fail_at_start_naming_the_variable() {
        assert!(Config::from_lookup(lookup(&[])).is_err());
        for (name, value) in [
            ("MAX_TTL_SECONDS", "x"),
            ("MAX_TTL_SECONDS", "0.0004"),
            ("MAX_TTL_SECONDS", "0.9"),
            ("MAX_TTL_SECONDS", "1e300"),
            ("MAX_TTL_SECONDS", "NaN"),
            ("MAX_WAIT_SECONDS", "-1"),
            ("MAX_WAIT_SECONDS", "25.5"),
            ("MAX_WAIT_SECONDS", "inf"),
            ("MAX_WAITERS", "0"),
            ("MAX_WAITERS", "1001"),
            ("MAX_WAITERS", "2.5"),
            ("MAX_TICKETS", "0"),
            ("MAX_TICKETS", "1000001"),
            ("MAX_TICKETS", "-3"),
            ("WAITING_BUDGET", "10001"),
            ("WAITING_BUDGET", "-1"),
        ] {
            let err = limits(&[(name, value)]).unwrap_err();
            assert!(err.starts_with(name), "{name}={value}: {err}");
            assert!(!err.contains('\n'));
        }
    }
}
