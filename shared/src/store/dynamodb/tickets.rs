//! Ticket items (async mode): one item per ticket under its pool's
//! partition key, `sk = 01 ‖ lease digest`, its number in `tn`, which the
//! local secondary index [`BY_TICKET`] orders (strongly consistent reads).
//! Their attributes are listed in [`super::schema`].

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::codec::{number, Item};
use super::expression::Expression;
use super::schema::ticket_item::{
    ATTEMPTS, CALLBACK_TOKEN, CALLBACK_URL, CLAIMED_BY, CLAIMED_UNTIL, DELIVERED, EXPIRES,
    EXPIRES_AT, FENCE, GRANTED, HOLDER, INCARNATION, JOINED, POSITION, REASON, STATE, WAIT_UNTIL,
};
use super::schema::{BY_TICKET, NUMBER, PK, SK, TICKET_ITEM};
use super::{store_error, DynamoDbStore, Written};
use crate::domain::{
    Callback, DeliveryClaim, Holder, LeaseDigest, TicketGrant, TicketItem, TicketState,
};
use crate::keys::PoolKey;
use crate::store::{may_move, PutTicket, StoreError, StoreErrorKind, TicketStore, TicketUpdated};

/// A ticket item outlives its wait by this long, for its status to be read.
const KEPT_S: u64 = 7 * 24 * 3600;

fn ticket_key(key: &PoolKey, digest: LeaseDigest) -> Item {
    let mut sk = vec![TICKET_ITEM];
    sk.extend_from_slice(&digest.0);
    HashMap::from([
        (PK.to_string(), AttributeValue::B(Blob::new(key.0.to_vec()))),
        (SK.to_string(), AttributeValue::B(Blob::new(sk))),
    ])
}

fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_string())
}

/// The attributes a state sets (besides `st`).
fn state_attributes(state: &TicketState) -> Vec<(&'static str, AttributeValue)> {
    let grant = |g: &TicketGrant| {
        vec![
            (POSITION, number(g.position)),
            (FENCE, number(g.fence)),
            (GRANTED, number(g.granted_ms)),
            (EXPIRES, number(g.expires_at_ms)),
        ]
    };
    match state {
        TicketState::Granted(g) => grant(g),
        TicketState::Delivered {
            grant: g,
            delivered_ms,
        } => {
            let mut attributes = grant(g);
            attributes.push((DELIVERED, number(delivered_ms)));
            attributes
        }
        TicketState::Failed { reason } => vec![(REASON, string(reason))],
        TicketState::Waiting | TicketState::Cancelled | TicketState::Expired => Vec::new(),
    }
}

fn encode(key: &PoolKey, ticket: &TicketItem) -> Item {
    let mut item = ticket_key(key, ticket.digest());
    item.extend([
        (NUMBER.to_string(), number(ticket.number)),
        (
            HOLDER.to_string(),
            AttributeValue::B(Blob::new(ticket.holder.to_bytes())),
        ),
        (INCARNATION.to_string(), number(ticket.incarnation)),
        (JOINED.to_string(), number(ticket.joined_ms)),
        (WAIT_UNTIL.to_string(), number(ticket.wait_until_ms)),
        (STATE.to_string(), string(ticket.state.name())),
        (ATTEMPTS.to_string(), number(ticket.attempts)),
        (
            EXPIRES_AT.to_string(),
            number(ticket.wait_until_ms / 1000 + KEPT_S),
        ),
    ]);
    if let Some(callback) = &ticket.callback {
        item.insert(CALLBACK_URL.to_string(), string(&callback.url));
        item.insert(CALLBACK_TOKEN.to_string(), string(&callback.token));
    }
    for (name, value) in state_attributes(&ticket.state) {
        item.insert(name.to_string(), value);
    }
    if let Some(claim) = ticket.claim {
        item.insert(CLAIMED_BY.to_string(), number(claim.by));
        item.insert(CLAIMED_UNTIL.to_string(), number(claim.until_ms));
    }
    item
}

fn decode(item: &Item) -> Result<TicketItem, StoreError> {
    let corrupt =
        |what: &str| StoreError::new(StoreErrorKind::Corrupt, format!("ticket item: {what}"));
    let int = |name: &str| -> Result<u64, StoreError> {
        match item.get(name) {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| corrupt(name)),
            _ => Err(corrupt(name)),
        }
    };
    let text = |name: &str| -> Result<String, StoreError> {
        match item.get(name) {
            Some(AttributeValue::S(s)) => Ok(s.clone()),
            _ => Err(corrupt(name)),
        }
    };
    let holder = match item.get(HOLDER) {
        Some(AttributeValue::B(blob)) => {
            Holder::from_bytes(blob.as_ref()).ok_or_else(|| corrupt(HOLDER))?
        }
        _ => return Err(corrupt(HOLDER)),
    };
    let grant = || -> Result<TicketGrant, StoreError> {
        Ok(TicketGrant {
            position: u16::try_from(int(POSITION)?).map_err(|_| corrupt(POSITION))?,
            fence: int(FENCE)?,
            granted_ms: int(GRANTED)?,
            expires_at_ms: int(EXPIRES)?,
        })
    };
    let state = match text(STATE)?.as_str() {
        "waiting" => TicketState::Waiting,
        "granted" => TicketState::Granted(grant()?),
        "delivered" => TicketState::Delivered {
            grant: grant()?,
            delivered_ms: int(DELIVERED)?,
        },
        "failed" => TicketState::Failed {
            reason: text(REASON)?,
        },
        "cancelled" => TicketState::Cancelled,
        "expired" => TicketState::Expired,
        _ => return Err(corrupt(STATE)),
    };
    let callback = match (item.get(CALLBACK_URL), item.get(CALLBACK_TOKEN)) {
        (None, None) => None,
        _ => Some(Callback {
            url: text(CALLBACK_URL)?,
            token: text(CALLBACK_TOKEN)?,
        }),
    };
    Ok(TicketItem {
        number: int(NUMBER)?,
        holder,
        incarnation: int(INCARNATION)?,
        joined_ms: int(JOINED)?,
        wait_until_ms: int(WAIT_UNTIL)?,
        callback,
        state,
        attempts: u32::try_from(int(ATTEMPTS)?).map_err(|_| corrupt(ATTEMPTS))?,
        claim: match item.get(CLAIMED_BY) {
            None => None,
            Some(_) => Some(DeliveryClaim {
                by: int(CLAIMED_BY)?,
                until_ms: int(CLAIMED_UNTIL)?,
            }),
        },
    })
}

/// Which of a pool's ticket items a query reads.
enum Tickets {
    /// Those numbered this or above, in order (the index), whole.
    From(u64),
    /// All of them, keys only.
    All,
}

impl DynamoDbStore {
    /// One page of a strongly consistent query of a pool's ticket items,
    /// from `start`: the items, and where the next page starts.
    async fn page(
        &self,
        key: &PoolKey,
        which: Tickets,
        limit: Option<usize>,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .expression_attribute_values(":pk", AttributeValue::B(Blob::new(key.0.to_vec())))
            .consistent_read(true);
        let query = match which {
            Tickets::From(from) => query
                .index_name(BY_TICKET)
                .key_condition_expression(format!("{PK} = :pk AND {NUMBER} >= :from"))
                .expression_attribute_values(":from", number(from)),
            Tickets::All => query
                .key_condition_expression(format!("{PK} = :pk AND begins_with({SK}, :tickets)"))
                .expression_attribute_values(
                    ":tickets",
                    AttributeValue::B(Blob::new(vec![TICKET_ITEM])),
                )
                .projection_expression(format!("{PK}, {SK}")),
        };
        let out = query
            .set_limit(limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)))
            .set_exclusive_start_key(start)
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await
            .map_err(store_error)?;
        self.record(out.consumed_capacity());
        Ok((out.items().to_vec(), out.last_evaluated_key().cloned()))
    }

    /// A ticket's conditional write: the item after it, or as it is.
    async fn moved(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        call: Expression,
    ) -> Result<TicketUpdated, StoreError> {
        Ok(
            match self.update_item(ticket_key(key, digest), call).await? {
                Written::Now(item) => TicketUpdated::Written(decode(&item)?),
                Written::Lost(Some(item)) => TicketUpdated::Lost(decode(&item)?),
                Written::Lost(None) => TicketUpdated::Gone,
            },
        )
    }
}

#[async_trait]
impl TicketStore for DynamoDbStore {
    async fn put_ticket(
        &self,
        key: &PoolKey,
        ticket: &TicketItem,
    ) -> Result<PutTicket, StoreError> {
        let Some(item) = self.put_new(encode(key, ticket)).await? else {
            return Ok(PutTicket::Created);
        };
        let existing = decode(&item)?;
        // Our own put, landed on an earlier SDK attempt.
        Ok(if existing == *ticket {
            PutTicket::Created
        } else {
            PutTicket::Exists(existing)
        })
    }

    async fn ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<Option<TicketItem>, StoreError> {
        let item = self.get(ticket_key(key, digest)).await?;
        item.as_ref().map(decode).transpose()
    }

    async fn backlog(
        &self,
        key: &PoolKey,
        from: u64,
        limit: usize,
    ) -> Result<Vec<TicketItem>, StoreError> {
        let mut found = Vec::new();
        let mut start = None;
        // A page ends at 1 MB or at `limit` items; read on until `limit`.
        while found.len() < limit {
            let (items, next) = self
                .page(key, Tickets::From(from), Some(limit - found.len()), start)
                .await?;
            for item in &items {
                found.push(decode(item)?);
            }
            start = next;
            if start.is_none() {
                break;
            }
        }
        Ok(found)
    }

    async fn move_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        to: &TicketState,
    ) -> Result<TicketUpdated, StoreError> {
        self.moved(key, digest, moving(from, to, None)).await
    }

    async fn record_grant(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        grant: TicketGrant,
        claim: Option<DeliveryClaim>,
    ) -> Result<TicketUpdated, StoreError> {
        let granted = TicketState::Granted(grant);
        may_move(from, &granted)?;
        self.moved(key, digest, moving(from, &granted, claim)).await
    }

    async fn claim_attempt(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        fence: u64,
        claim: DeliveryClaim,
        now_ms: u64,
    ) -> Result<TicketUpdated, StoreError> {
        // `TicketItem::may_claim`: that grant, and no live claim of another's.
        let call = Expression {
            update: "SET #cb = :by, #cl = :until ADD #n :one".to_string(),
            condition: "#st = :granted AND #gf = :fence \
                AND (attribute_not_exists(#cl) OR #cl <= :now OR #cb = :by)"
                .to_string(),
            names: HashMap::from([
                ("#n".to_string(), ATTEMPTS.to_string()),
                ("#st".to_string(), STATE.to_string()),
                ("#gf".to_string(), FENCE.to_string()),
                ("#cb".to_string(), CLAIMED_BY.to_string()),
                ("#cl".to_string(), CLAIMED_UNTIL.to_string()),
            ]),
            values: HashMap::from([
                (":one".to_string(), number(1)),
                (":granted".to_string(), string("granted")),
                (":fence".to_string(), number(fence)),
                (":by".to_string(), number(claim.by)),
                (":until".to_string(), number(claim.until_ms)),
                (":now".to_string(), number(now_ms)),
            ]),
            once: false,
        };
        Ok(
            match self.update_item(ticket_key(key, digest), call).await? {
                Written::Now(item) => TicketUpdated::Written(decode(&item)?),
                Written::Lost(Some(item)) => TicketUpdated::Lost(decode(&item)?),
                Written::Lost(None) => TicketUpdated::Gone,
            },
        )
    }

    async fn delete_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        number: u64,
        incarnation: u64,
    ) -> Result<bool, StoreError> {
        let sent = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(ticket_key(key, digest)))
            .condition_expression("#tn = :number AND #i = :incarnation")
            .expression_attribute_names("#tn", NUMBER)
            .expression_attribute_names("#i", INCARNATION)
            .expression_attribute_values(":number", super::codec::number(number))
            .expression_attribute_values(":incarnation", super::codec::number(incarnation))
            .set_return_consumed_capacity(self.capacity_mode())
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record(out.consumed_capacity());
                Ok(true)
            }
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(store_error(err)),
            },
        }
    }

    async fn delete_tickets(&self, key: &PoolKey) -> Result<usize, StoreError> {
        let mut removed = 0;
        loop {
            // Keys only, a page at a time; each page deleted in batches of 25.
            let (keys, _) = self.page(key, Tickets::All, None, None).await?;
            if keys.is_empty() {
                return Ok(removed);
            }
            self.delete_keys(&keys, "ticket").await?;
            removed += keys.len();
        }
    }
}

/// A ticket's move from `from` to `to` (conditioned on `from`'s name: a
/// state is entered once per ticket), with `claim` taken and counted in the
/// same write.
fn moving(from: &TicketState, to: &TicketState, claim: Option<DeliveryClaim>) -> Expression {
    let mut sets = vec!["#st = :to".to_string()];
    let mut names = HashMap::from([("#st".to_string(), STATE.to_string())]);
    let mut values = HashMap::from([
        (":from".to_string(), string(from.name())),
        (":to".to_string(), string(to.name())),
    ]);
    for (i, (name, value)) in state_attributes(to).into_iter().enumerate() {
        sets.push(format!("#a{i} = :a{i}"));
        names.insert(format!("#a{i}"), name.to_string());
        values.insert(format!(":a{i}"), value);
    }
    let mut update = format!("SET {}", sets.join(", "));
    if let Some(claim) = claim {
        update = format!("{update}, #cb = :by, #cl = :until ADD #n :one");
        names.extend([
            ("#cb".to_string(), CLAIMED_BY.to_string()),
            ("#cl".to_string(), CLAIMED_UNTIL.to_string()),
            ("#n".to_string(), ATTEMPTS.to_string()),
        ]);
        values.extend([
            (":by".to_string(), number(claim.by)),
            (":until".to_string(), number(claim.until_ms)),
            (":one".to_string(), number(1)),
        ]);
    }
    Expression {
        update,
        condition: "#st = :from".to_string(),
        names,
        values,
        once: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_in_every_state() {
        let key = PoolKey([7; 16]);
        let grant = TicketGrant {
            position: 3,
            fence: 1_795_241_433_052_117,
            granted_ms: 1_795_241_433_052,
            expires_at_ms: 1_795_241_463_052,
        };
        let states = [
            TicketState::Waiting,
            TicketState::Granted(grant),
            TicketState::Delivered {
                grant,
                delivered_ms: 1_795_241_433_100,
            },
            TicketState::Failed {
                reason: "the receiver answered HTTP 410".into(),
            },
            TicketState::Cancelled,
            TicketState::Expired,
        ];
        for (i, state) in states.into_iter().enumerate() {
            let ticket = TicketItem {
                number: 40 + i as u64,
                holder: Holder {
                    digest: LeaseDigest([i as u8; 8]),
                    ttl_ms: 30_000,
                },
                incarnation: u64::MAX - 1,
                joined_ms: 1_795_241_400_000,
                wait_until_ms: 1_795_327_800_000,
                callback: (i % 2 == 0).then(|| Callback {
                    url: "https://example.com/hook".into(),
                    token: "t".into(),
                }),
                state,
                attempts: i as u32,
                claim: (i % 3 == 1).then_some(DeliveryClaim {
                    by: u64::MAX - i as u64,
                    until_ms: 1_795_241_440_000,
                }),
            };
            let item = encode(&key, &ticket);
            assert_eq!(decode(&item), Ok(ticket.clone()), "{}", ticket.state.name());
            let AttributeValue::B(sk) = &item[SK] else {
                panic!("binary sort key")
            };
            assert_eq!(sk.as_ref()[0], TICKET_ITEM);
            assert_eq!(&sk.as_ref()[1..], &ticket.digest().0);
        }
    }
}
