//! A split pool's segment items: its cold slots, 64 positions an item,
//! written only by compaction (see `domain/layout.rs`). Read after the pool
//! item: those this process does not have at the versions the pool item
//! records (`segment_cache`), by `GetItem` when few, else in one `Query` of
//! the pool's incarnation (its sort keys carry it: an earlier pool of the
//! same id never shares one).

use std::collections::BTreeMap;

use futures_util::future::try_join_all;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::codec::{
    decode_slot, decode_split, is_split, number, segment_versions, slot_values, Cold, Item,
};
use super::schema::segment_item::{SLOTS, STAMPS, VERSION};
use super::schema::{segment_sort_key, PK, POOL_ITEM, SK};
use super::{pool_key, store_error, DynamoDbStore};
use crate::domain::{Change, CompactionPlan, Layout, SegmentWrite, Slot, Update, SEGMENT_SLOTS};
use crate::keys::PoolKey;
use crate::store::{Record, StoreError, StoreErrorKind};

/// A segment item's primary key: the pool item's, another sort key.
fn segment_key(key: &PoolKey, incarnation: u64, segment: u16) -> Item {
    let mut item = pool_key(key);
    item.insert(
        SK.to_string(),
        AttributeValue::B(Blob::new(segment_sort_key(incarnation, segment).to_vec())),
    );
    item
}

/// The segment item a compaction writes.
fn encode_segment(key: &PoolKey, incarnation: u64, plan: &SegmentWrite) -> Item {
    let (slots, stamps): (Vec<AttributeValue>, Vec<AttributeValue>) =
        plan.slots.iter().map(slot_values).unzip();
    let mut item = segment_key(key, incarnation, plan.segment);
    item.extend([
        (VERSION.to_string(), number(plan.version)),
        (SLOTS.to_string(), AttributeValue::L(slots)),
        (STAMPS.to_string(), AttributeValue::L(stamps)),
    ]);
    item
}

fn corrupt(what: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, format!("segment item: {what}"))
}

/// A segment item: its segment, its version and its held positions.
type Segment = (u16, u32, Vec<(u16, Slot)>);

fn decode_segment(item: &Item) -> Result<Segment, StoreError> {
    let small = |name: &str| match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse::<u64>().map_err(|_| corrupt(name)),
        _ => Err(corrupt(name)),
    };
    let segment = match item.get(SK) {
        Some(AttributeValue::B(sk)) => match sk.as_ref() {
            [first, .., hi, lo] if *first == POOL_ITEM[0] && sk.as_ref().len() == 11 => {
                u16::from_be_bytes([*hi, *lo])
            }
            _ => return Err(corrupt(SK)),
        },
        _ => return Err(corrupt(SK)),
    };
    let version = u32::try_from(small(VERSION)?).map_err(|_| corrupt(VERSION))?;
    let (Some(AttributeValue::L(slots)), Some(AttributeValue::L(stamps))) =
        (item.get(SLOTS), item.get(STAMPS))
    else {
        return Err(corrupt(SLOTS));
    };
    if slots.len() != usize::from(SEGMENT_SLOTS) || stamps.len() != slots.len() {
        return Err(corrupt("slots and stamps"));
    }
    let base = segment
        .checked_mul(SEGMENT_SLOTS)
        .ok_or_else(|| corrupt(SK))?;
    let mut held = Vec::new();
    for (i, (slot, stamp)) in slots.iter().zip(stamps).enumerate() {
        if let Some(slot) = decode_slot(slot, stamp)? {
            held.push((base + i as u16, slot));
        }
    }
    Ok((segment, version, held))
}

/// Segments missing from the cache are read one `GetItem` each (in
/// parallel) while they are fewer than a third of those the pool item
/// records: each costs a read unit, where the `Query` of them all costs
/// about one per three segments of a full pool.
fn few(missing: usize, recorded: usize) -> bool {
    missing * 3 < recorded
}

impl DynamoDbStore {
    /// The segments the pool item records at `recorded` (segment →
    /// version), as cold slots of `incarnation`: those this process has
    /// at those versions from its cache, the others read strongly
    /// consistent (after the pool item: a segment is never older than the
    /// version its pool item records). A doubted pool, or one missing many,
    /// has all its segment items read in one `Query`, which also finds a
    /// segment its pool item does not record yet.
    pub(super) async fn cold(
        &self,
        key: &PoolKey,
        incarnation: u64,
        recorded: &BTreeMap<u16, u32>,
    ) -> Result<Cold, StoreError> {
        let found = self.segments.lookup(key, incarnation, recorded);
        if found.missing.is_empty() && found.doubted.is_none() {
            return Ok(found.cold);
        }
        if found.doubted.is_none() && few(found.missing.len(), recorded.len()) {
            let mut cold = found.cold;
            let reads = found
                .missing
                .iter()
                .map(|segment| self.get(segment_key(key, incarnation, *segment)));
            for item in try_join_all(reads).await?.into_iter().flatten() {
                self.add_segment(key, incarnation, &item, &mut cold)?;
            }
            return Ok(cold);
        }
        let mut cold = Cold::default();
        for item in self.segment_items(key, incarnation, false).await? {
            self.add_segment(key, incarnation, &item, &mut cold)?;
        }
        self.segments.trust(key, incarnation, found.doubted);
        Ok(cold)
    }

    /// Adds a segment item read to `cold`, and keeps it in the cache.
    fn add_segment(
        &self,
        key: &PoolKey,
        incarnation: u64,
        item: &Item,
        cold: &mut Cold,
    ) -> Result<(), StoreError> {
        let (segment, version, held) = decode_segment(item)?;
        cold.held.extend(held.iter().copied());
        cold.stored.insert(segment, version);
        self.segments.keep(key, incarnation, segment, version, held);
        Ok(())
    }

    /// Every segment item of the pool's `incarnation` (keys only, with
    /// `keys_only`).
    async fn segment_items(
        &self,
        key: &PoolKey,
        incarnation: u64,
        keys_only: bool,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("#pk = :pk AND #sk BETWEEN :first AND :last")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#sk", SK)
                .expression_attribute_values(":pk", AttributeValue::B(Blob::new(key.0.to_vec())))
                .expression_attribute_values(
                    ":first",
                    AttributeValue::B(Blob::new(segment_sort_key(incarnation, 0).to_vec())),
                )
                .expression_attribute_values(
                    ":last",
                    AttributeValue::B(Blob::new(segment_sort_key(incarnation, u16::MAX).to_vec())),
                )
                .set_exclusive_start_key(start.take())
                .set_return_consumed_capacity(self.capacity_mode());
            if keys_only {
                query = query.projection_expression("#pk, #sk");
            }
            let out = query.send().await.map_err(store_error)?;
            self.record(out.consumed_capacity());
            items.extend(out.items().iter().cloned());
            match out.last_evaluated_key() {
                Some(last) if !last.is_empty() => start = Some(last.clone()),
                _ => return Ok(items),
            }
        }
    }

    /// A pool item's record: a split one's cold slots from `read` when the
    /// item records the segment versions `read` did (no compaction since:
    /// every position cold now was cold then, as it was), else read.
    pub(super) async fn record_of(
        &self,
        key: &PoolKey,
        item: &Item,
        read: Option<&Record>,
    ) -> Result<Record, StoreError> {
        if !is_split(item) {
            return decode_split(item, &Cold::default());
        }
        if let Some(read) = read.filter(|r| Some(r.incarnation) == incarnation_of(item)) {
            if let Layout::Split(split) = read.pool.layout() {
                if *split.versions() == segment_versions(item)? {
                    return decode_split(item, &cold_of(read));
                }
            }
        }
        self.with_segments(key, item.clone()).await
    }

    /// A split pool item's record with its segments, read as of one
    /// instant. Segments read after the pool item (or kept in the cache at
    /// the versions it records: the same slots) are its own when each
    /// has the version the item records (none was written between the
    /// reads: a segment is written only while its version is the one its
    /// pool item records). Otherwise the pool item is read again after them: then no
    /// segment may be older than it records (a compaction writes its
    /// segment before its pool item), and each position it does not hold
    /// is as its segment has it.
    async fn with_segments(&self, key: &PoolKey, mut item: Item) -> Result<Record, StoreError> {
        for _ in 0..8 {
            if !is_split(&item) {
                // Registered again, flat.
                return decode_split(&item, &Cold::default());
            }
            let incarnation = incarnation_of(&item).unwrap_or_default();
            let recorded = segment_versions(&item)?;
            let cold = self.cold(key, incarnation, &recorded).await?;
            let version = |k: &u16, of: &BTreeMap<u16, u32>| of.get(k).copied().unwrap_or(0);
            let same = recorded
                .keys()
                .chain(cold.stored.keys())
                .all(|k| version(k, &recorded) == version(k, &cold.stored));
            if same {
                return decode_split(&item, &cold);
            }
            let Some(after) = self.get(pool_key(key)).await? else {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the pool went while its segments were read",
                ));
            };
            if !is_split(&after) || incarnation_of(&after) != Some(incarnation) {
                item = after;
                continue;
            }
            let recorded = segment_versions(&after)?;
            if recorded.iter().all(|(k, v)| version(k, &cold.stored) >= *v) {
                return decode_split(&after, &cold);
            }
            item = after;
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "a pool's segments kept moving while read",
        ))
    }

    /// Writes a compaction's segment, conditioned on the segment item's
    /// version as read (or its absence): whether it landed. Kept in the
    /// cache when it did.
    pub(super) async fn put_segment(
        &self,
        key: &PoolKey,
        incarnation: u64,
        plan: &SegmentWrite,
    ) -> Result<bool, StoreError> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode_segment(key, incarnation, plan)))
            .set_return_consumed_capacity(self.capacity_mode());
        put = if plan.stored == 0 {
            put.condition_expression(format!("attribute_not_exists({PK})"))
        } else {
            put.condition_expression(format!("{VERSION} = :v"))
                .expression_attribute_values(":v", number(plan.stored))
        };
        match put.send().await {
            Ok(out) => {
                self.record(out.consumed_capacity());
                self.segments
                    .keep(key, incarnation, plan.segment, plan.version, held_of(plan));
                Ok(true)
            }
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(_)) => {
                    // Another compaction wrote it, maybe one that stopped
                    // before its pool item: find it on the next read.
                    self.segments.doubt(key, incarnation);
                    Ok(false)
                }
                // It may have landed.
                _ => {
                    self.segments.doubt(key, incarnation);
                    Err(store_error(err))
                }
            },
        }
    }

    /// Removes the segment items of the pool's `incarnation` (after its
    /// pool item): a pool registered again since has its own.
    pub(super) async fn delete_segments(
        &self,
        key: &PoolKey,
        incarnation: u64,
    ) -> Result<(), StoreError> {
        let keys = self.segment_items(key, incarnation, true).await?;
        self.delete_keys(&keys, "segment").await?;
        Ok(())
    }
}

/// The incarnation a pool item records.
pub(super) fn incarnation_of(item: &Item) -> Option<u64> {
    match item.get(super::schema::pool_item::INCARNATION) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    }
}

/// The cold slots `read` holds: every position it does not hold hot.
pub(super) fn cold_of(read: &Record) -> Cold {
    let Layout::Split(split) = read.pool.layout() else {
        return Cold::default();
    };
    let held: BTreeMap<u16, Slot> = read
        .pool
        .slots()
        .iter()
        .enumerate()
        .map(|(p, slot)| (p as u16, *slot))
        .filter(|(p, slot)| *slot != Slot::Free && !split.hot().contains(p))
        .collect();
    Cold {
        stored: split.stored_versions().clone(),
        held,
    }
}

/// `read`'s cold slots after `plan` wrote the segments `written` (a
/// catch-up writes none: the segment's cold slots are as read) and the pool
/// item write `update` (of `plan`) landed: each entry it cooled is cold as
/// read (its write was conditioned on that).
pub(super) fn cold_after(
    read: &Record,
    plan: &CompactionPlan,
    written: &[u16],
    update: &Update,
) -> Cold {
    let mut cold = cold_of(read);
    for segment in plan
        .segments
        .iter()
        .filter(|s| written.contains(&s.segment))
    {
        if !segment.slots.is_empty() {
            cold.held
                .retain(|p, _| crate::domain::segment_of(*p) != segment.segment);
            cold.held.extend(held_of(segment));
        }
        cold.stored.insert(segment.segment, segment.version);
    }
    for change in &update.changes {
        if let Change::Cool(position) = *change {
            match read.pool.slots().get(usize::from(position)) {
                Some(slot @ Slot::Held { .. }) => cold.held.insert(position, *slot),
                _ => cold.held.remove(&position),
            };
        }
    }
    cold
}

/// The held slots of the segment `plan` writes, by position.
fn held_of(plan: &SegmentWrite) -> impl Iterator<Item = (u16, Slot)> + '_ {
    let base = plan.segment * SEGMENT_SLOTS;
    plan.slots
        .iter()
        .enumerate()
        .filter(|(_, slot)| **slot != Slot::Free)
        .map(move |(i, slot)| (base + i as u16, *slot))
}
