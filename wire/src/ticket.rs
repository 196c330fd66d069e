//! Async mode's bodies (being built; see `docs/DESIGN.md`): an enqueue, its
//! ticket's status, and what a callback receives. `POST /l/{id}/ticket` and
//! `/cancel` take a [`ReturnBody`](crate::ReturnBody)'s `{"lease"}`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{chosen_lease, invalid, short, ttl, wait, Invalid, Seconds};

/// Longest callback URL (the server then checks where it leads).
pub const MAX_CALLBACK_URL: usize = 2048;
/// Longest callback token.
pub const MAX_CALLBACK_TOKEN: usize = 1024;

/// Where a grant is POSTed, with `Authorization: Bearer <token>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackBody {
    pub url: String,
    pub token: String,
}

impl fmt::Debug for CallbackBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Both may be secrets of the receiver.
        f.write_str("CallbackBody { .. }")
    }
}

/// `POST /l/{id}/enqueue`: `ttl` as a borrow's; `wait` (optional: the
/// server's maximum, hours) for the grant; `lease` (required, the idempotency
/// key); `callback`: an `https` URL (at most 2048 characters) and a token of
/// 1 to 1024 visible ASCII characters.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct EnqueueBody {
    pub ttl: Seconds,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait: Option<Seconds>,
    pub lease: Uuid,
    pub callback: CallbackBody,
}

impl fmt::Debug for EnqueueBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnqueueBody")
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("lease", &short(&self.lease))
            .finish_non_exhaustive()
    }
}

impl TryFrom<Map<String, Value>> for EnqueueBody {
    type Error = Invalid;

    fn try_from(body: Map<String, Value>) -> Result<Self, Invalid> {
        let ttl = ttl(&body)?;
        let wait = wait(&body)?;
        let lease = match body.get("lease") {
            None => return Err(invalid("lease is required")),
            Some(value) => chosen_lease(value)?,
        };
        let callback = match body.get("callback") {
            None => return Err(invalid("callback is required")),
            Some(Value::Object(callback)) => callback,
            Some(_) => return Err(invalid("callback must be an object with url and token")),
        };
        let url = match callback.get("url") {
            None => return Err(invalid("callback url is required")),
            Some(Value::String(url)) if !url.is_empty() && url.len() <= MAX_CALLBACK_URL => url,
            Some(_) => {
                return Err(invalid(format!(
                    "callback url must be a string of 1 to {MAX_CALLBACK_URL} characters"
                )))
            }
        };
        let token = match callback.get("token") {
            None => return Err(invalid("callback token is required")),
            Some(Value::String(token))
                if (1..=MAX_CALLBACK_TOKEN).contains(&token.len())
                    && token.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                token
            }
            Some(_) => {
                return Err(invalid(format!(
                    "callback token must be 1 to {MAX_CALLBACK_TOKEN} visible ASCII characters"
                )))
            }
        };
        Ok(EnqueueBody {
            ttl,
            wait,
            lease,
            callback: CallbackBody {
                url: url.clone(),
                token: token.clone(),
            },
        })
    }
}

/// What an enqueue answers (`202`): the ticket's number in the pool's line,
/// and how many tickets wait before it (at most: some may have ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    pub ticket: u64,
    pub ahead: u64,
}

/// A ticket as `POST /l/{id}/ticket` and `/cancel` answer it: its state
/// (`waiting`, `granted`, `delivered`, `failed`, `cancelled`, `expired`),
/// `ahead` while it waits, the grant once granted, and why it failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketStatus {
    pub state: String,
    pub ticket: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_unix: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<Seconds>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a callback receives when its ticket is granted: the ticket (and the
/// fence, unique per grant) let a receiver drop a duplicate delivery. The
/// lease UUID is not sent: the enqueuer chose it and knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub ticket: u64,
    pub position: u32,
    pub fence: u64,
    pub expires_at_unix: u64,
    pub expires_in: Seconds,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;
    use serde_json::json;

    const LEASE: &str = "3a7d0b14-9e2c-4f6a-8b1d-0c5e2f9a7b34";

    fn enqueue(body: Value) -> Result<EnqueueBody, Invalid> {
        parse(body.to_string().as_bytes())
    }

    #[test]
    fn enqueue_rules() {
        let ok = enqueue(json!({"ttl": 30, "wait": 7200, "lease": LEASE,
            "callback": {"url": "https://example.com/hook", "token": "s3cr3t"}}))
        .unwrap();
        assert_eq!(ok.ttl.as_millis(), 30_000);
        assert_eq!(ok.wait.map(Seconds::as_millis), Some(7_200_000));
        assert_eq!(ok.lease.hyphenated().to_string(), LEASE);
        assert_eq!(ok.callback.token, "s3cr3t");
        let no_wait = enqueue(json!({"ttl": 1, "lease": LEASE,
            "callback": {"url": "https://x.example", "token": "t"}}))
        .unwrap();
        assert_eq!(no_wait.wait, None, "the server's maximum");
        // Through serde as the client sends it, and back.
        let sent = serde_json::to_value(&ok).unwrap();
        assert_eq!(serde_json::from_value::<EnqueueBody>(sent).unwrap(), ok);

        let callback = json!({"url": "https://example.com/hook", "token": "t"});
        let cases = [
            (
                json!({"lease": LEASE, "callback": callback}),
                "ttl is required",
            ),
            (
                json!({"ttl": 0, "lease": LEASE, "callback": callback}),
                "ttl must be a number of seconds greater than 0",
            ),
            (
                json!({"ttl": 1, "wait": -1, "lease": LEASE, "callback": callback}),
                "wait must be a number of seconds, 0 or more",
            ),
            (json!({"ttl": 1, "callback": callback}), "lease is required"),
            (
                json!({"ttl": 1, "lease": "00000000-0000-0000-0000-000000000000", "callback": callback}),
                "lease must not be the nil UUID",
            ),
            (json!({"ttl": 1, "lease": LEASE}), "callback is required"),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": "https://x"}),
                "callback must be an object with url and token",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"token": "t"}}),
                "callback url is required",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "", "token": "t"}}),
                "callback url must be a string of 1 to 2048 characters",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "https://x".repeat(300), "token": "t"}}),
                "callback url must be a string of 1 to 2048 characters",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "https://x"}}),
                "callback token is required",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "https://x", "token": "a b"}}),
                "callback token must be 1 to 1024 visible ASCII characters",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "https://x", "token": ""}}),
                "callback token must be 1 to 1024 visible ASCII characters",
            ),
            (
                json!({"ttl": 1, "lease": LEASE, "callback": {"url": "https://x", "token": "ä"}}),
                "callback token must be 1 to 1024 visible ASCII characters",
            ),
        ];
        for (body, message) in cases {
            assert_eq!(
                enqueue(body.clone()),
                Err(Invalid(message.into())),
                "{body}"
            );
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let ok = enqueue(json!({"ttl": 1, "lease": LEASE,
            "callback": {"url": "https://example.com/hook?key=abc", "token": "s3cr3t"}}))
        .unwrap();
        let debug = format!("{ok:?}");
        assert!(debug.contains("3a7d0b14"), "{debug}");
        for secret in ["9e2c", "key=abc", "s3cr3t"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }

    #[test]
    fn answers_carry_only_what_their_state_has() {
        let waiting = TicketStatus {
            state: "waiting".into(),
            ticket: 12,
            ahead: Some(3),
            position: None,
            fence: None,
            expires_at_unix: None,
            expires_in: None,
            reason: None,
        };
        assert_eq!(
            serde_json::to_value(&waiting).unwrap(),
            json!({"state": "waiting", "ticket": 12, "ahead": 3})
        );
        let delivery = Delivery {
            ticket: 12,
            position: 0,
            fence: 99,
            expires_at_unix: 1_700_000_000,
            expires_in: Seconds::from_millis(29_500),
        };
        assert_eq!(
            serde_json::to_value(delivery).unwrap(),
            json!({"ticket": 12, "position": 0, "fence": 99,
                   "expires_at_unix": 1_700_000_000u64, "expires_in": 29.5})
        );
        assert_eq!(
            serde_json::to_value(Enqueued {
                ticket: 12,
                ahead: 0
            })
            .unwrap(),
            json!({"ticket": 12, "ahead": 0})
        );
    }
}
