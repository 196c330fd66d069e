//! Response decoding: each answer validated against API.md and reduced to
//! what it tells about the pool.

use serde_json::{Map, Value};

use super::record::{Call, Op};
use super::CheckConfig;

/// An answer, decoded and validated against API.md.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Outcome {
    /// `PUT`/`GET` 200.
    State {
        count: u64,
        in_use: u64,
        available: u64,
    },
    Deleted(bool),
    Granted {
        lease: String,
        position: u64,
        expires_at_unix: u64,
        /// `expires_in`: what the lease had left when answered.
        left_ms: u64,
        /// The clamped ttl: the lease ran this long from its grant.
        ttl_ms: u64,
        fence: u64,
    },
    Returned(bool),
    NotFound,
    Exhausted,
    /// 5xx, or an answer already reported as bad: it may or may not have landed.
    Unknown,
}

/// Decodes an answer; `Err` says how it breaks API.md.
pub(super) fn decode(op: &Op, config: &CheckConfig) -> Result<Outcome, String> {
    if op.status == super::NO_ANSWER {
        // Its client died: it may have landed, or may yet.
        return Ok(Outcome::Unknown);
    }
    let body = op.body.as_object().ok_or("body is not a JSON object")?;
    if op.status >= 500 {
        error_body(body)?;
        return match (op.status, config.faults) {
            (502, true) => Ok(Outcome::Unknown),
            (502, false) => Err("502 with no faults injected".into()),
            _ => Err("a failed call must be 502".into()),
        };
    }
    match (&op.call, op.status) {
        (Call::Register { .. } | Call::Inspect, 200) => {
            if body.get("id").and_then(Value::as_str) != Some(op.pool.to_lowercase().as_str()) {
                return Err("id is not the pool's hyphenated lowercase UUID".into());
            }
            let (count, in_use, available) = (
                uint(body, "count")?,
                uint(body, "in_use")?,
                uint(body, "available")?,
            );
            uint(body, "waiting")?;
            if available != count.saturating_sub(in_use) {
                return Err("available ≠ max(0, count − in_use)".into());
            }
            if let Call::Register { count: asked } = op.call {
                if count != u64::from(asked) {
                    return Err("count is not the one registered".into());
                }
            }
            Ok(Outcome::State {
                count,
                in_use,
                available,
            })
        }
        (Call::Delete, 200) => match body.get("deleted") {
            Some(Value::Bool(deleted)) => Ok(Outcome::Deleted(*deleted)),
            _ => Err("deleted is not a boolean".into()),
        },
        (
            Call::Borrow {
                ttl_ms: asked,
                wait_ms,
                ..
            },
            200,
        ) => {
            let lease = body
                .get("lease")
                .and_then(Value::as_str)
                .filter(|l| uuid::Uuid::parse_str(l).is_ok())
                .ok_or("lease is not a UUID string")?;
            let left_ms = body
                .get("expires_in")
                .and_then(Value::as_f64)
                .map(|s| (s * 1000.0).round() as u64)
                .ok_or("expires_in is not a number")?;
            let ttl_ms = (*asked).clamp(1, config.max_ttl_ms);
            // A slot taken at once carries the clamped ttl; one handed to a
            // waiter, what its lease had left when it answered.
            let valid = if *wait_ms == 0 {
                left_ms == ttl_ms
            } else {
                (1..=ttl_ms).contains(&left_ms)
            };
            if !valid {
                return Err(format!(
                    "expires_in is not the ttl clamped to {} ms (or, after a wait, what is left of it)",
                    config.max_ttl_ms
                ));
            }
            Ok(Outcome::Granted {
                lease: lease.to_lowercase(),
                position: uint(body, "position")?,
                expires_at_unix: uint(body, "expires_at_unix")?,
                left_ms,
                ttl_ms,
                fence: uint(body, "fence")?,
            })
        }
        (Call::Borrow { .. }, 409) => match error_body(body)? {
            "no resource available" => Ok(Outcome::Exhausted),
            _ => Err("409 must say \"no resource available\"".into()),
        },
        (Call::Return { .. }, 200) => match body.get("returned") {
            Some(Value::Bool(returned)) => Ok(Outcome::Returned(*returned)),
            _ => Err("returned is not a boolean".into()),
        },
        (Call::Inspect | Call::Borrow { .. } | Call::Return { .. }, 404) => {
            error_body(body)?;
            Ok(Outcome::NotFound)
        }
        (_, status) => Err(format!("status {status} is not an answer to this call")),
    }
}

fn uint(body: &Map<String, Value>, key: &str) -> Result<u64, String> {
    body.get(key)
        .and_then(Value::as_u64)
        .ok_or(format!("{key} is not a non-negative integer"))
}

fn error_body(body: &Map<String, Value>) -> Result<&str, String> {
    match body.get("error") {
        Some(Value::String(reason)) if body.len() == 1 => Ok(reason),
        _ => Err("an error body must be {\"error\": \"…\"}".into()),
    }
}
