//! A pool item to and from its attributes ([`super::schema`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::schema::pool_item::{
    ACTIVE, ADMITTED, BASE, COMPACTION_CLAIM, COUNT, ENDED, FENCE, FREED, GIVEN_UP, GIVE_UP, HOT,
    HOT_STAMPS, INCARNATION, LEGACY_ENDED, LISTED, NEXT_TICKET, QUEUE, SEGMENTS, SLOTS, STAMPS,
};
use super::schema::{PK, POOL_ITEM, SK};
use crate::domain::{
    AsyncLine, Ended, GiveUp, GivenUp, Holder, Layout, LeaseDigest, Pool, Sizing, Slot, Split,
    Stamp, Ticket, ENDED_RING, MAX_COUNT,
};
use crate::keys::PoolKey;
use crate::store::{Record, StoreError, StoreErrorKind};

/// Milliseconds fit in 13 decimal digits until the year 2286: a stamp is
/// the relative fence in the digits above them.
pub(super) const STAMP_SCALE: u128 = 10_000_000_000_000;
/// Added to the grant ms of a slot handed to a waiter (year 2128 in ms:
/// below it, every grant ms is a real time).
pub(super) const HANDED: u64 = 5_000_000_000_000;

pub(super) type Item = HashMap<String, AttributeValue>;

/// The primary key of a pool's item.
pub fn pool_key(key: &PoolKey) -> Item {
    HashMap::from([
        (PK.to_string(), AttributeValue::B(Blob::new(key.0.to_vec()))),
        (
            SK.to_string(),
            AttributeValue::B(Blob::new(POOL_ITEM.to_vec())),
        ),
    ])
}

/// A queued ticket's give-up time as stored in `w`: whole seconds for a sync
/// waiter (as every version stored them), an async ticket's exact ms negated,
/// so that the two never read as each other.
pub(super) fn give_up_value(give_up: GiveUp) -> AttributeValue {
    match give_up {
        GiveUp::Seconds(s) => number(s),
        GiveUp::Exact(ms) => AttributeValue::N(format!("-{ms}")),
    }
}

pub(super) fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn digest_key(digest: &LeaseDigest) -> String {
    URL_SAFE_NO_PAD.encode(digest.0)
}

pub(super) fn holder_value(holder: Holder) -> AttributeValue {
    AttributeValue::B(Blob::new(holder.to_bytes()))
}

/// Counts fit in four digits (≤ 1000).
const COUNT_SCALE: u128 = 10_000;

pub(super) fn sizing_value(sizing: Sizing) -> AttributeValue {
    AttributeValue::N(
        (u128::from(sizing.resizes) * COUNT_SCALE + u128::from(sizing.count)).to_string(),
    )
}

fn stamp_number(stamp: Stamp) -> u128 {
    let ms = stamp.granted_ms + if stamp.handed { HANDED } else { 0 };
    u128::from(stamp.fence) * STAMP_SCALE + u128::from(ms)
}

pub(super) fn stamp_value(stamp: Stamp) -> AttributeValue {
    AttributeValue::N(stamp_number(stamp).to_string())
}

/// The stamp of a number that [`stamp_number`] made, or `None`.
fn stamp_of(n: u128) -> Option<Stamp> {
    let ms = (n % STAMP_SCALE) as u64;
    Some(Stamp {
        fence: u64::try_from(n / STAMP_SCALE).ok()?,
        granted_ms: ms % HANDED,
        handed: ms >= HANDED,
    })
}

/// An ended grant (always handed): lease digest (8 bytes) ‖ position (2) ‖
/// grant ms (6) ‖ relative fence (big-endian, as few bytes as it needs).
pub(super) fn ended_value(ended: Ended) -> AttributeValue {
    let fence = ended.stamp.fence.to_be_bytes();
    let skip = fence.iter().take_while(|b| **b == 0).count().min(7);
    let mut bytes = Vec::with_capacity(24);
    bytes.extend_from_slice(&ended.digest.0);
    bytes.extend_from_slice(&ended.position.to_be_bytes());
    bytes.extend_from_slice(&ended.stamp.granted_ms.to_be_bytes()[2..]);
    bytes.extend_from_slice(&fence[skip..]);
    AttributeValue::B(Blob::new(bytes))
}

/// The ended grant [`ended_value`] stored.
fn ended_of(bytes: &[u8]) -> Option<Ended> {
    if !(17..=24).contains(&bytes.len()) {
        return None;
    }
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&bytes[10..16]);
    let mut fence = [0u8; 8];
    fence[24 - bytes.len()..].copy_from_slice(&bytes[16..]);
    Some(Ended {
        digest: LeaseDigest(bytes[..8].try_into().ok()?),
        position: u16::from_be_bytes([bytes[8], bytes[9]]),
        stamp: Stamp {
            fence: u64::from_be_bytes(fence),
            granted_ms: u64::from_be_bytes(ms),
            handed: true,
        },
    })
}

/// A slot as stored: the holder (or `0`) and its stamp (or `0`).
pub(super) fn slot_values(slot: &Slot) -> (AttributeValue, AttributeValue) {
    match slot {
        Slot::Free => (number(0), number(0)),
        Slot::Held { holder, stamp } => (holder_value(*holder), stamp_value(*stamp)),
    }
}

/// A pool's slots as its item stores them: every one in `s` and `g` (flat),
/// or the hot ones in `h` and `t` and the segments' versions in `k` (split).
pub(super) fn slot_attributes(pool: &Pool) -> Vec<(String, AttributeValue)> {
    match pool.layout() {
        Layout::Flat => {
            let (slots, stamps): (Vec<AttributeValue>, Vec<AttributeValue>) =
                pool.slots().iter().map(slot_values).unzip();
            vec![
                (SLOTS.to_string(), AttributeValue::L(slots)),
                (STAMPS.to_string(), AttributeValue::L(stamps)),
            ]
        }
        Layout::Split(split) => {
            let (hot, stamps): (
                HashMap<String, AttributeValue>,
                HashMap<String, AttributeValue>,
            ) = split
                .hot()
                .iter()
                .map(|&p| {
                    let slot = pool.slots().get(usize::from(p)).unwrap_or(&Slot::Free);
                    let (holder, stamp) = slot_values(slot);
                    ((p.to_string(), holder), (p.to_string(), stamp))
                })
                .unzip();
            let versions = split
                .versions()
                .iter()
                .map(|(k, v)| (k.to_string(), number(*v)))
                .collect();
            let mut attributes = vec![
                (HOT.to_string(), AttributeValue::M(hot)),
                (HOT_STAMPS.to_string(), AttributeValue::M(stamps)),
                (SEGMENTS.to_string(), AttributeValue::M(versions)),
            ];
            if split.claim() != 0 {
                attributes.push((COMPACTION_CLAIM.to_string(), number(split.claim())));
            }
            attributes.extend(
                split
                    .freed_counts()
                    .iter()
                    .map(|(segment, frees)| (format!("{FREED}{segment}"), number(*frees))),
            );
            attributes
        }
    }
}

/// The pool item of `record` (a split pool's cold slots are its segments').
pub(super) fn encode(key: &PoolKey, record: &Record) -> Item {
    let pool = &record.pool;
    let mut item = pool_key(key);
    item.extend([
        (INCARNATION.to_string(), number(record.incarnation)),
        (COUNT.to_string(), sizing_value(pool.sizing())),
        (BASE.to_string(), number(pool.base_us())),
        (
            FENCE.to_string(),
            AttributeValue::N((u128::from(pool.next_fence()) * STAMP_SCALE).to_string()),
        ),
        (
            QUEUE.to_string(),
            AttributeValue::L(
                pool.queue()
                    .iter()
                    .map(|t| holder_value(t.holder))
                    .collect(),
            ),
        ),
        (
            GIVE_UP.to_string(),
            AttributeValue::L(
                pool.queue()
                    .iter()
                    .map(|t| give_up_value(t.give_up))
                    .collect(),
            ),
        ),
        (
            GIVEN_UP.to_string(),
            AttributeValue::M(
                pool.given_up()
                    .iter()
                    .map(|t| (digest_key(&t.digest), number(t.until_s)))
                    .collect(),
            ),
        ),
    ]);
    item.extend(slot_attributes(pool));
    item.extend(
        pool.ended()
            .iter()
            .map(|e| (format!("{ENDED}{}", e.place()), ended_value(*e))),
    );
    let line = pool.line();
    if *line != AsyncLine::default() {
        if line.active {
            item.insert(ACTIVE.to_string(), number(1));
        }
        item.extend([
            (NEXT_TICKET.to_string(), number(line.next)),
            (ADMITTED.to_string(), number(line.admitted)),
            (
                LISTED.to_string(),
                AttributeValue::M(
                    line.listed
                        .iter()
                        .map(|(digest, n)| (digest_key(digest), number(*n)))
                        .collect(),
                ),
            ),
        ]);
    }
    item
}

/// A pool item's attributes, read as parts: every malformed one is a
/// corrupt item, never a panic.
struct Attrs<'a> {
    item: &'a Item,
}

impl<'a> Attrs<'a> {
    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::new(StoreErrorKind::Corrupt, format!("pool item: {what}"))
    }

    fn big(&self, value: Option<&AttributeValue>, what: &str) -> Result<u128, StoreError> {
        match value {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| self.corrupt(what)),
            _ => Err(self.corrupt(what)),
        }
    }

    /// A give-up time: whole seconds, or (negative) an exact ms.
    fn give_up(&self, value: &AttributeValue) -> Result<GiveUp, StoreError> {
        let what = "give-up time";
        match value {
            AttributeValue::N(n) => match n.strip_prefix('-') {
                Some(ms) => ms.parse().map(GiveUp::Exact),
                None => n.parse().map(GiveUp::Seconds),
            }
            .map_err(|_| self.corrupt(what)),
            _ => Err(self.corrupt(what)),
        }
    }

    fn small(&self, value: Option<&AttributeValue>, what: &str) -> Result<u64, StoreError> {
        u64::try_from(self.big(value, what)?).map_err(|_| self.corrupt(what))
    }

    fn list(&self, name: &str) -> Result<&'a Vec<AttributeValue>, StoreError> {
        match self.item.get(name) {
            Some(AttributeValue::L(list)) => Ok(list),
            _ => Err(self.corrupt(name)),
        }
    }

    fn map(&self, name: &str) -> Result<&'a HashMap<String, AttributeValue>, StoreError> {
        match self.item.get(name) {
            Some(AttributeValue::M(map)) => Ok(map),
            _ => Err(self.corrupt(name)),
        }
    }

    fn holder(&self, value: &AttributeValue, what: &str) -> Result<Holder, StoreError> {
        match value {
            AttributeValue::B(blob) => {
                Holder::from_bytes(blob.as_ref()).ok_or_else(|| self.corrupt(what))
            }
            _ => Err(self.corrupt(what)),
        }
    }

    fn stamp(&self, value: &AttributeValue) -> Result<Stamp, StoreError> {
        stamp_of(self.big(Some(value), "stamp")?).ok_or_else(|| self.corrupt("stamp"))
    }

    fn digest(&self, key: &str, what: &str) -> Result<LeaseDigest, StoreError> {
        URL_SAFE_NO_PAD
            .decode(key)
            .ok()
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .map(LeaseDigest)
            .ok_or_else(|| self.corrupt(what))
    }
}

/// One stored slot (as in `s` and `g`): `None` when free.
pub(super) fn decode_slot(
    slot: &AttributeValue,
    stamp: &AttributeValue,
) -> Result<Option<Slot>, StoreError> {
    let corrupt = || StoreError::new(StoreErrorKind::Corrupt, "segment item: slot");
    match slot {
        AttributeValue::N(n) if n == "0" => Ok(None),
        AttributeValue::B(blob) => {
            let holder = Holder::from_bytes(blob.as_ref()).ok_or_else(corrupt)?;
            let stamp = match stamp {
                AttributeValue::N(n) => n.parse::<u128>().ok().and_then(stamp_of),
                _ => None,
            }
            .ok_or_else(corrupt)?;
            Ok(Some(Slot::Held { holder, stamp }))
        }
        _ => Err(corrupt()),
    }
}

/// A flat pool item's record. (A split one's needs its cold slots:
/// [`decode_split`].)
#[cfg(test)]
pub(super) fn decode(item: &Item) -> Result<Record, StoreError> {
    decode_split(item, &Cold::default())
}

/// Whether a pool item keeps only its hot slots (its others in segments).
pub(super) fn is_split(item: &Item) -> bool {
    item.contains_key(HOT)
}

/// A split pool's cold slots as its segments hold them: each segment item's
/// own version, and the held positions (free ones are not listed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Cold {
    pub(super) stored: BTreeMap<u16, u32>,
    pub(super) held: BTreeMap<u16, Slot>,
}

/// The segments' versions a split pool item records (`k`).
pub(super) fn segment_versions(item: &Item) -> Result<BTreeMap<u16, u32>, StoreError> {
    let a = Attrs { item };
    a.map(SEGMENTS)?
        .iter()
        .map(|(k, v)| {
            let segment = k.parse::<u16>().map_err(|_| a.corrupt(SEGMENTS))?;
            let version =
                u32::try_from(a.small(Some(v), SEGMENTS)?).map_err(|_| a.corrupt(SEGMENTS))?;
            Ok((segment, version))
        })
        .collect()
}

/// A pool item's record; a split one's cold slots from `cold`.
pub(super) fn decode_split(item: &Item, cold: &Cold) -> Result<Record, StoreError> {
    let a = Attrs { item };
    let incarnation = a.small(item.get(INCARNATION), INCARNATION)?;
    let sizing = sizing(&a)?;
    let base_us = a.small(item.get(BASE), BASE)?;
    let next_fence = next_fence(&a)?;
    let (slots, layout) = if is_split(item) {
        split_slots(&a, sizing.count, cold)?
    } else {
        (slots(&a)?, Layout::Flat)
    };
    let queue = queue(&a)?;
    let given_up = given_up(&a)?;
    let ended = ended(&a)?;
    let line = line(&a)?;
    let pool = Pool::from_parts(sizing, base_us, next_fence, slots, queue, given_up, ended)
        .map(|pool| pool.with_legacy_ended(item.contains_key(LEGACY_ENDED)))
        .and_then(|pool| pool.with_line(line))
        .map(|pool| pool.with_layout(layout))
        .map_err(|e| a.corrupt(e.0))?;
    Ok(Record { incarnation, pool })
}

/// A split pool's slots: each hot one as the item holds it, each other as
/// `cold` does (free when no segment holds it).
fn split_slots(a: &Attrs, count: u16, cold: &Cold) -> Result<(Vec<Slot>, Layout), StoreError> {
    let (hot, stamps) = (a.map(HOT)?, a.map(HOT_STAMPS)?);
    let mut slots: BTreeMap<u16, Slot> = cold.held.clone();
    let mut positions = BTreeSet::new();
    for (key, holder) in hot {
        let position = key
            .parse::<u16>()
            .ok()
            .filter(|p| *p < MAX_COUNT)
            .ok_or_else(|| a.corrupt(HOT))?;
        positions.insert(position);
        match holder {
            AttributeValue::N(n) if n == "0" => {
                slots.remove(&position);
            }
            held => {
                let stamp = stamps.get(key).ok_or_else(|| a.corrupt(HOT_STAMPS))?;
                slots.insert(
                    position,
                    Slot::Held {
                        holder: a.holder(held, "hot slot")?,
                        stamp: a.stamp(stamp)?,
                    },
                );
            }
        }
    }
    let len = slots
        .keys()
        .next_back()
        .map_or(0, |p| usize::from(*p) + 1)
        .max(usize::from(count));
    let mut list = vec![Slot::Free; len];
    for (p, slot) in slots {
        list[usize::from(p)] = slot;
    }
    let versions = segment_versions(a.item)?;
    let claim = match a.item.get(COMPACTION_CLAIM) {
        Some(claim) => a.small(Some(claim), COMPACTION_CLAIM)?,
        None => 0,
    };
    let split = Split::new(positions, versions, cold.stored.clone())
        .with_claim(claim)
        .with_freed(freed_counts(a)?);
    Ok((list, Layout::Split(Box::new(split))))
}

/// A split pool item's counts of freed slots, by segment (`d0`, `d1`, …).
fn freed_counts(a: &Attrs) -> Result<BTreeMap<u16, u32>, StoreError> {
    let mut freed = BTreeMap::new();
    for (name, value) in a.item {
        let Some(segment) = name.strip_prefix(FREED).and_then(|n| n.parse::<u16>().ok()) else {
            continue;
        };
        let frees = u32::try_from(a.small(Some(value), FREED)?).map_err(|_| a.corrupt(FREED))?;
        freed.insert(segment, frees);
    }
    Ok(freed)
}

fn sizing(a: &Attrs) -> Result<Sizing, StoreError> {
    let sized = a.big(a.item.get(COUNT), COUNT)?;
    let sizing = Sizing {
        count: u16::try_from(sized % COUNT_SCALE)
            .ok()
            .filter(|c| *c <= MAX_COUNT)
            .ok_or_else(|| a.corrupt(COUNT))?,
        resizes: u64::try_from(sized / COUNT_SCALE).map_err(|_| a.corrupt(COUNT))?,
    };
    Ok(sizing)
}

fn next_fence(a: &Attrs) -> Result<u64, StoreError> {
    let fence = a.big(a.item.get(FENCE), FENCE)?;
    if fence % STAMP_SCALE != 0 {
        return Err(a.corrupt(FENCE));
    }
    let next_fence = u64::try_from(fence / STAMP_SCALE).map_err(|_| a.corrupt(FENCE))?;
    Ok(next_fence)
}

fn slots(a: &Attrs) -> Result<Vec<Slot>, StoreError> {
    let (slots, stamps) = (a.list(SLOTS)?, a.list(STAMPS)?);
    if slots.len() != stamps.len() {
        return Err(a.corrupt("slots and stamps disagree"));
    }
    let slots = slots
        .iter()
        .zip(stamps)
        .map(|(slot, stamp_value)| match slot {
            AttributeValue::N(n) if n == "0" => Ok(Slot::Free),
            held => Ok(Slot::Held {
                holder: a.holder(held, "slot")?,
                stamp: a.stamp(stamp_value)?,
            }),
        })
        .collect::<Result<Vec<Slot>, StoreError>>()?;
    Ok(slots)
}

fn queue(a: &Attrs) -> Result<Vec<Ticket>, StoreError> {
    let (queue, give_ups) = (a.list(QUEUE)?, a.list(GIVE_UP)?);
    if queue.len() != give_ups.len() {
        return Err(a.corrupt("tickets and give-up times disagree"));
    }
    let queue = queue
        .iter()
        .zip(give_ups)
        .map(|(ticket, give_up)| {
            Ok(Ticket {
                holder: a.holder(ticket, "ticket")?,
                give_up: a.give_up(give_up)?,
            })
        })
        .collect::<Result<Vec<Ticket>, StoreError>>()?;
    Ok(queue)
}

fn given_up(a: &Attrs) -> Result<Vec<GivenUp>, StoreError> {
    let given_up = a
        .map(GIVEN_UP)?
        .iter()
        .map(|(key, until)| {
            Ok(GivenUp {
                digest: a.digest(key, "tombstone key")?,
                until_s: a.small(Some(until), "tombstone")?,
            })
        })
        .collect::<Result<Vec<GivenUp>, StoreError>>()?;
    Ok(given_up)
}

fn ended(a: &Attrs) -> Result<Vec<Ended>, StoreError> {
    let ended = (0..ENDED_RING)
        .filter_map(|place| {
            let name = format!("{ENDED}{place}");
            a.item.get(&name).map(|value| match value {
                AttributeValue::B(blob) => ended_of(blob.as_ref())
                    .filter(|e| usize::from(e.place()) == place)
                    .ok_or_else(|| a.corrupt(&name)),
                _ => Err(a.corrupt(&name)),
            })
        })
        .collect::<Result<Vec<Ended>, StoreError>>()?;
    Ok(ended)
}

fn line(a: &Attrs) -> Result<AsyncLine, StoreError> {
    // Absent until the pool's first ticket number.
    let line = AsyncLine {
        next: a
            .item
            .get(NEXT_TICKET)
            .map_or(Ok(0), |v| a.small(Some(v), NEXT_TICKET))?,
        admitted: a
            .item
            .get(ADMITTED)
            .map_or(Ok(0), |v| a.small(Some(v), ADMITTED))?,
        listed: match a.item.get(LISTED) {
            None => Vec::new(),
            Some(_) => a
                .map(LISTED)?
                .iter()
                .map(|(key, n)| {
                    Ok((
                        a.digest(key, "async ticket key")?,
                        a.small(Some(n), LISTED)?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()?,
        },
        active: a.item.contains_key(ACTIVE),
    };
    Ok(line)
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
