//! The http-semaphore API as it travels: every request and response body of
//! `docs/API.md`, derived with serde, with the contract's input rules; and
//! the one retry backoff. The server, the client and the `semaphore` CLI all
//! use these, and none of it links the AWS SDK.
//!
//! Requests deserialize through their input rules ([`TryFrom`] a JSON
//! object), so a bad body gets the contract's message, and serialize as the
//! client sends them. Responses derive both ways; unknown fields are ignored,
//! so an older client reads a newer server's answers.

mod backoff;
mod seconds;
mod ticket;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
pub use uuid::Uuid;

pub use backoff::{unit, Backoff, Jitter};
pub use seconds::Seconds;
pub use ticket::{CallbackBody, Delivery, EnqueueBody, Enqueued, TicketStatus};

/// Most slots a pool may have.
pub const MAX_COUNT: u16 = 1000;

/// A request body that breaks the contract's input rules: the message a
/// `400` carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Invalid {}

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid(message.into())
}

/// Parses a request body of type `T`: a JSON object (unknown fields are
/// ignored), then `T`'s rules.
pub fn parse<T: TryFrom<Map<String, Value>, Error = Invalid>>(body: &[u8]) -> Result<T, Invalid> {
    T::try_from(object(body)?)
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, Invalid> {
    const NOT_AN_OBJECT: &str = "request body must be a JSON object";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(invalid(NOT_AN_OBJECT));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid(NOT_AN_OBJECT)),
        Err(err) => Err(invalid(format!("malformed JSON: {err}"))),
    }
}

/// `PUT /l/{id}`: `count`, a JSON integer in `0 … 1000`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct RegisterBody {
    pub count: u16,
}

impl TryFrom<Map<String, Value>> for RegisterBody {
    type Error = Invalid;

    fn try_from(body: Map<String, Value>) -> Result<Self, Invalid> {
        let range = || invalid(format!("count must be an integer from 0 to {MAX_COUNT}"));
        let count = match body.get("count") {
            None => return Err(invalid("count is required")),
            // Integers only: 2.0 and 1e3 are floats in JSON's grammar.
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .filter(|c| *c <= MAX_COUNT)
                .ok_or_else(range)?,
            Some(_) => return Err(range()),
        };
        Ok(RegisterBody { count })
    }
}

/// `POST /l/{id}/borrow`: `ttl` (required, > 0), `wait` (default 0, ≥ 0),
/// `lease` (optional: a client-chosen UUID, not the nil one, that makes the
/// borrow idempotent and its wait cancellable).
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct BorrowBody {
    pub ttl: Seconds,
    pub wait: Seconds,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<Uuid>,
}

impl fmt::Debug for BorrowBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowBody")
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("lease", &self.lease.as_ref().map(short))
            .finish()
    }
}

impl TryFrom<Map<String, Value>> for BorrowBody {
    type Error = Invalid;

    fn try_from(body: Map<String, Value>) -> Result<Self, Invalid> {
        Ok(BorrowBody {
            ttl: ttl(&body)?,
            wait: wait(&body)?.unwrap_or(Seconds::ZERO),
            lease: match body.get("lease") {
                None => None,
                Some(value) => Some(chosen_lease(value)?),
            },
        })
    }
}

/// `ttl`: required, a number of seconds greater than 0, kept to the
/// millisecond; a positive ttl never rounds to an already-expired lease.
fn ttl(body: &Map<String, Value>) -> Result<Seconds, Invalid> {
    let ttl = match body.get("ttl") {
        None => return Err(invalid("ttl is required")),
        Some(value) => value.as_f64().filter(|t| t.is_finite() && *t > 0.0),
    }
    .ok_or_else(|| invalid("ttl must be a number of seconds greater than 0"))?;
    Ok(Seconds::from_secs_f64(ttl)
        .unwrap_or(Seconds::MAX)
        .max(Seconds::from_millis(1)))
}

/// `wait`, if given: a number of seconds, 0 or more.
fn wait(body: &Map<String, Value>) -> Result<Option<Seconds>, Invalid> {
    body.get("wait")
        .map(|value| {
            value
                .as_f64()
                .and_then(Seconds::from_secs_f64)
                .ok_or_else(|| invalid("wait must be a number of seconds, 0 or more"))
        })
        .transpose()
}

/// A lease UUID the client chose: not the nil one.
fn chosen_lease(value: &Value) -> Result<Uuid, Invalid> {
    match lease(value)? {
        lease if lease.is_nil() => Err(invalid("lease must not be the nil UUID")),
        lease => Ok(lease),
    }
}

/// `POST /l/{id}/return`: `lease`, a UUID string.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct ReturnBody {
    pub lease: Uuid,
}

impl fmt::Debug for ReturnBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnBody")
            .field("lease", &short(&self.lease))
            .finish()
    }
}

impl TryFrom<Map<String, Value>> for ReturnBody {
    type Error = Invalid;

    fn try_from(body: Map<String, Value>) -> Result<Self, Invalid> {
        match body.get("lease") {
            None => Err(invalid("lease is required")),
            Some(value) => Ok(ReturnBody {
                lease: lease(value)?,
            }),
        }
    }
}

fn lease(value: &Value) -> Result<Uuid, Invalid> {
    match value {
        Value::String(s) => Uuid::parse_str(s).map_err(|_| invalid("lease must be a UUID")),
        _ => Err(invalid("lease must be a UUID string")),
    }
}

/// A pool's state: what `PUT` and `GET /l/{id}` answer.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    pub id: Uuid,
    pub count: u32,
    pub in_use: u32,
    pub available: u32,
    /// Borrowers waiting in the pool's queue; `None` only from a server
    /// older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<u32>,
}

impl fmt::Debug for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolState")
            .field("id", &short(&self.id))
            .field("count", &self.count)
            .field("in_use", &self.in_use)
            .field("available", &self.available)
            .field("waiting", &self.waiting)
            .finish()
    }
}

/// What a borrow answers: the lease granted.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lease UUID: a secret of its holder.
    pub lease: Uuid,
    /// The slot number, `0 … count-1`.
    pub position: u32,
    /// When the lease ends, in whole Unix seconds, rounded down.
    pub expires_at_unix: u64,
    /// Time the lease had left when the server answered: the ttl granted
    /// (clamped to the server's maximum) when a slot was free, less when the
    /// slot was handed over during a wait or the answer repeats a grant.
    pub expires_in: Seconds,
    /// The fencing token; `None` only from a server older than fencing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("lease", &short(&self.lease))
            .field("position", &self.position)
            .field("expires_at_unix", &self.expires_at_unix)
            .field("expires_in", &self.expires_in)
            .field("fence", &self.fence)
            .finish()
    }
}

/// What `DELETE /l/{id}` answers: whether a pool was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: bool,
}

/// What `POST /l/{id}/return` answers: whether a live lease was ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Returned {
    pub returned: bool,
}

/// Every error answer's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A body of the wire model as JSON text (what the client sends and the CLI
/// prints). The wire types have string keys only, so this cannot fail.
pub fn to_json(body: &impl Serialize) -> String {
    serde_json::to_string(body).unwrap_or_default()
}

/// A body of the wire model as a JSON value (what the server answers).
pub fn to_value(body: &impl Serialize) -> Value {
    serde_json::to_value(body).unwrap_or(Value::Null)
}

/// The error message of a `404` for a pool that does not exist (a route the
/// service does not know says something else).
pub const POOL_NOT_FOUND: &str = "pool not found";
/// The error of a `ticket` or `cancel` of a lease id with no ticket (async mode).
pub const TICKET_NOT_FOUND: &str = "ticket not found";

/// A UUID as logs and status lines show it: the first 8 hex digits, enough
/// to tell ids apart and useless to borrow with (the whole id is a
/// credential).
pub fn short(uuid: &Uuid) -> String {
    let mut simple = uuid.simple().to_string();
    simple.truncate(8);
    simple
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bad<T: TryFrom<Map<String, Value>, Error = Invalid> + fmt::Debug>(body: &str) -> bool {
        parse::<T>(body.as_bytes()).is_err()
    }

    #[test]
    fn bodies_must_be_json_objects() {
        for body in ["", "  ", "{", "[]", "1", "\"x\"", "null", "{\"count\":1}x"] {
            assert!(object(body.as_bytes()).is_err(), "{body:?}");
        }
        assert!(object(&[0xff, 0xfe]).is_err());
        assert_eq!(
            object(b"[]"),
            Err(Invalid("request body must be a JSON object".into()))
        );
    }

    #[test]
    fn count_rules() {
        let count = |body: &str| parse::<RegisterBody>(body.as_bytes()).map(|b| b.count);
        assert_eq!(count(r#"{"count":0}"#), Ok(0));
        assert_eq!(count(r#"{"count":1000,"x":1}"#), Ok(1000));
        assert_eq!(count("{}"), Err(Invalid("count is required".into())));
        for body in [
            r#"{"count":-1}"#,
            r#"{"count":1001}"#,
            r#"{"count":1.5}"#,
            r#"{"count":2.0}"#,
            r#"{"count":"4"}"#,
            r#"{"count":null}"#,
            r#"{"count":true}"#,
            r#"{"count":1e3}"#,
            r#"{"count":18446744073709551616}"#,
        ] {
            assert_eq!(
                count(body),
                Err(Invalid("count must be an integer from 0 to 1000".into())),
                "{body}"
            );
        }
    }

    #[test]
    fn borrow_rules() {
        let borrow = |body: &str| parse::<BorrowBody>(body.as_bytes()).unwrap();
        let ms = |b: BorrowBody| (b.ttl.as_millis(), b.wait.as_millis());
        assert_eq!(ms(borrow(r#"{"ttl":1.5}"#)), (1500, 0));
        assert_eq!(borrow(r#"{"ttl":1.5}"#).lease, None);
        assert_eq!(ms(borrow(r#"{"ttl":30,"wait":0.25}"#)), (30_000, 250));
        assert_eq!(
            ms(borrow(r#"{"ttl":0.0001,"wait":0}"#)),
            (1, 0),
            "positive ttl keeps at least 1 ms"
        );
        assert_eq!(
            ms(borrow(r#"{"ttl":1e300,"wait":1e300}"#)),
            (u64::MAX, u64::MAX)
        );
        let lease = borrow(r#"{"ttl":1,"lease":"3A7D0B14-9E2C-4F6A-8B1D-0C5E2F9A7B34"}"#).lease;
        assert_eq!(
            lease.map(|l| l.hyphenated().to_string()).as_deref(),
            Some("3a7d0b14-9e2c-4f6a-8b1d-0c5e2f9a7b34")
        );
        for body in [
            r#"{}"#,
            r#"{"wait":1}"#,
            r#"{"ttl":0}"#,
            r#"{"ttl":-1}"#,
            r#"{"ttl":"30"}"#,
            r#"{"ttl":null}"#,
            r#"{"ttl":30,"wait":-0.5}"#,
            r#"{"ttl":30,"wait":"1"}"#,
            r#"{"ttl":30,"wait":null}"#,
            r#"{"ttl":30,"wait":false}"#,
            r#"{"ttl":30,"lease":"x"}"#,
            r#"{"ttl":30,"lease":null}"#,
            r#"{"ttl":30,"lease":7}"#,
            r#"{"ttl":30,"lease":"00000000-0000-0000-0000-000000000000"}"#,
        ] {
            assert!(bad::<BorrowBody>(body), "{body}");
        }
    }

    #[test]
    fn lease_rules() {
        let lease = parse::<ReturnBody>(br#"{"lease":"3A7D0B14-9E2C-4F6A-8B1D-0C5E2F9A7B34"}"#)
            .unwrap()
            .lease;
        assert_eq!(
            lease.hyphenated().to_string(),
            "3a7d0b14-9e2c-4f6a-8b1d-0c5e2f9a7b34"
        );
        for body in [
            r#"{}"#,
            r#"{"lease":"x"}"#,
            r#"{"lease":1}"#,
            r#"{"lease":null}"#,
        ] {
            assert!(bad::<ReturnBody>(body), "{body}");
        }
    }

    #[test]
    fn requests_round_trip_through_their_rules() {
        let lease = Uuid::new_v4();
        let borrow = BorrowBody {
            ttl: Seconds::from_millis(1500),
            wait: Seconds::from_millis(30_000),
            lease: Some(lease),
        };
        let sent = serde_json::to_value(borrow).unwrap();
        assert_eq!(
            sent,
            json!({"ttl": 1.5, "wait": 30, "lease": lease.hyphenated().to_string()})
        );
        assert_eq!(serde_json::from_value::<BorrowBody>(sent).unwrap(), borrow);
        let register = RegisterBody { count: 7 };
        let sent = serde_json::to_value(register).unwrap();
        assert_eq!(sent, json!({"count": 7}));
        assert_eq!(
            serde_json::from_value::<RegisterBody>(sent).unwrap(),
            register
        );
        // Through serde, a broken rule is the same message.
        let err = serde_json::from_value::<RegisterBody>(json!({"count": 2.0})).unwrap_err();
        assert_eq!(err.to_string(), "count must be an integer from 0 to 1000");
    }

    #[test]
    fn responses_have_the_contract_fields() {
        let id = Uuid::new_v4();
        let state = PoolState {
            id,
            count: 2,
            in_use: 1,
            available: 1,
            waiting: Some(3),
        };
        let body = serde_json::to_value(state).unwrap();
        assert_eq!(
            body,
            json!({"id": id.hyphenated().to_string(), "count": 2, "in_use": 1, "available": 1, "waiting": 3})
        );
        assert_eq!(serde_json::from_value::<PoolState>(body).unwrap(), state);
        let old = json!({"id": id, "count": 2, "in_use": 1, "available": 1});
        assert_eq!(
            serde_json::from_value::<PoolState>(old).unwrap().waiting,
            None
        );
        let broken = json!({"id": id, "count": 2, "in_use": 1, "available": 1, "waiting": "x"});
        assert!(serde_json::from_value::<PoolState>(broken).is_err());

        let grant = Grant {
            lease: id,
            position: 3,
            expires_at_unix: 1_700_000_000,
            expires_in: Seconds::from_millis(1500),
            fence: Some(9),
        };
        let body = serde_json::to_value(grant).unwrap();
        assert_eq!(
            body,
            json!({"lease": id.hyphenated().to_string(), "position": 3,
                   "expires_at_unix": 1_700_000_000u64, "expires_in": 1.5, "fence": 9})
        );
        assert_eq!(serde_json::from_value::<Grant>(body).unwrap(), grant);
        let negative = json!({"lease": id, "position": 0, "expires_at_unix": 1, "expires_in": -1});
        assert!(serde_json::from_value::<Grant>(negative).is_err());

        assert_eq!(
            serde_json::to_value(Returned { returned: true }).unwrap(),
            json!({"returned": true})
        );
        assert_eq!(
            serde_json::to_value(Deleted { deleted: false }).unwrap(),
            json!({"deleted": false})
        );
        assert_eq!(
            serde_json::to_value(ErrorBody {
                error: POOL_NOT_FOUND.into()
            })
            .unwrap(),
            json!({"error": "pool not found"})
        );
    }

    #[test]
    fn debug_output_keeps_ids_secret() {
        let id: Uuid = "9F1C2E7A-5B3D-4C8E-A1F0-6D2B9C4E7A01".parse().unwrap();
        assert_eq!(short(&id), "9f1c2e7a");
        let grant = Grant {
            lease: id,
            position: 0,
            expires_at_unix: 0,
            expires_in: Seconds::ZERO,
            fence: None,
        };
        for debug in [
            format!("{grant:?}"),
            format!("{:?}", ReturnBody { lease: id }),
            format!(
                "{:?}",
                BorrowBody {
                    ttl: Seconds::ZERO,
                    wait: Seconds::ZERO,
                    lease: Some(id)
                }
            ),
        ] {
            assert!(
                debug.contains("9f1c2e7a") && !debug.contains("5b3d"),
                "{debug}"
            );
        }
    }
}
