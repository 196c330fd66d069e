//! An [`Update`] as one conditional `UpdateItem` on a pool item: its
//! condition, update expression, names and values.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;

use super::codec::{
    digest_key, ended_value, give_up_value, holder_value, number, sizing_value, slot_attributes,
    stamp_value, HANDED, STAMP_SCALE,
};
use super::schema::pool_item::{
    ACTIVE, ADMITTED, COMPACTION_CLAIM, COUNT, ENDED, FENCE, FREED, GIVEN_UP, GIVE_UP, HOT,
    HOT_STAMPS, INCARNATION, LEGACY_ENDED, LISTED, NEXT_TICKET, QUEUE, SEGMENTS, SLOTS, STAMPS,
};
use crate::domain::{
    segment_of, Change, Expect, Holder, LeaseDigest, Pool, Update, TICKET_GRACE_MS,
};
use crate::store::Record;

/// One update as DynamoDB expressions (for a pool item, made by [`Expression::of`]). Top-level attribute names are single
/// letters, none of them reserved words; tombstone keys come from data and
/// go through placeholders; list indices are numbers the planner chose.
pub(super) struct Expression {
    pub(super) condition: String,
    pub(super) update: String,
    pub(super) names: HashMap<String, String>,
    pub(super) values: HashMap<String, AttributeValue>,
    /// Send it once, without the SDK's retries: a resize, whose lost
    /// condition must say that it did not land (a retry of a write that
    /// landed would fail its condition on that write, and the PUT would
    /// set its count a second time). A timeout is still an unknown outcome.
    pub(super) once: bool,
}

impl Expression {
    /// `update` on a pool item of `incarnation`; `split`: one that holds
    /// only its hot slots, as maps by position (`h`, `t`), where a flat one
    /// holds every slot in lists (`s`, `g`).
    pub(super) fn of(incarnation: u64, update: &Update, split: bool) -> Self {
        let mut e = ExpressionBuilder {
            split,
            ..ExpressionBuilder::default()
        };
        let inc = e.value(number(incarnation));
        let mut conditions = vec![format!("{INCARNATION} = {inc}")];
        for expect in &update.expect {
            conditions.push(condition(&mut e, expect));
        }
        let mut clauses = Clauses::default();
        for change in &update.changes {
            clauses.add(&mut e, change);
        }
        let mut expression = clauses.finish(e, inc, conditions, update.fences());
        expression.once = update.sets_count();
        expression
    }
}

/// One condition of an update, as DynamoDB reads it.
fn condition(e: &mut ExpressionBuilder, expect: &Expect) -> String {
    match *expect {
        Expect::Count(sizing) => format!("{COUNT} = {}", e.value(sizing_value(sizing))),
        // A split item has no list of slots (`Pool::lower` drops this).
        Expect::SlotsLen(len) if !e.split => {
            format!("size({SLOTS}) = {}", e.value(number(len)))
        }
        // Never true, rather than silently so.
        Expect::SlotsLen(_) => format!("attribute_not_exists({INCARNATION})"),
        Expect::SlotFree(position) => {
            let slot = e.slot(position);
            format!("{slot} = {}", e.zero())
        }
        // A split item's flat conditions never name a slot held below a
        // grant (`FreedIn` stands for them there); never true rather than
        // silently so, should one.
        Expect::SlotHeld(_) if e.split => format!("attribute_not_exists({INCARNATION})"),
        Expect::SlotHeld(position) => {
            let slot = e.slot(position);
            format!("{slot} <> {}", e.zero())
        }
        // Absent until a slot of the segment is first freed.
        Expect::FreedIn { segment, frees: 0 } => {
            format!("attribute_not_exists({FREED}{segment})")
        }
        Expect::FreedIn { segment, frees } => {
            format!("{FREED}{segment} = {}", e.value(number(frees)))
        }
        Expect::SlotStamp { position, stamp } if e.split => {
            let path = e.key(HOT_STAMPS, "p", position);
            format!("{path} = {}", e.value(stamp_value(stamp)))
        }
        Expect::SlotStamp { position, stamp } => {
            format!("{STAMPS}[{position}] = {}", e.value(stamp_value(stamp)))
        }
        Expect::QueueLen(len) => format!("size({QUEUE}) = {}", e.value(number(len))),
        Expect::QueueBelow(len) => format!("size({QUEUE}) < {}", e.value(number(len))),
        Expect::TicketAt { index, holder } => {
            format!("{QUEUE}[{index}] = {}", e.holder(holder))
        }
        Expect::TicketLiveAt { index, now_ms } => {
            // `w` holds a sync borrower's give-up in Unix seconds (dead a
            // grace later) and an async ticket's in ms, negated (dead then).
            let seconds = now_ms.saturating_sub(TICKET_GRACE_MS) / 1000 + 1;
            let seconds = e.value(number(seconds));
            let exact = e.value(AttributeValue::N(format!("-{now_ms}")));
            format!(
                "(attribute_not_exists({GIVE_UP}[{index}]) OR {GIVE_UP}[{index}] >= {seconds} OR {GIVE_UP}[{index}] < {exact})"
            )
        }
        Expect::NotQueued(holder) => format!("NOT contains({QUEUE}, {})", e.holder(holder)),
        // A split item's hot slots are a map, which no condition searches
        // (`Pool::lower` leaves this to a check after the write): never
        // true there, rather than silently so.
        Expect::NotHeld(_) if e.split => format!("attribute_not_exists({INCARNATION})"),
        Expect::NotHeld(holder) => format!("NOT contains({SLOTS}, {})", e.holder(holder)),
        Expect::NotGivenUp(digest) => format!("attribute_not_exists({})", e.given_up(digest)),
        Expect::GivenUpIs(given_up) => {
            format!(
                "{} = {}",
                e.given_up(given_up.digest),
                e.value(number(given_up.until_s))
            )
        }
        Expect::EndedIs(ended) => {
            format!("{ENDED}{} = {}", ended.place(), e.value(ended_value(ended)))
        }
        Expect::GivenUpAtMost(n) => format!("size({GIVEN_UP}) <= {}", e.value(number(n))),
        // Items from before async mode have no counters.
        Expect::NoBacklog => {
            format!("(attribute_not_exists({NEXT_TICKET}) OR {ADMITTED} = {NEXT_TICKET})")
        }
        Expect::Admitted(admitted) => {
            format!("{ADMITTED} = {}", e.value(number(admitted)))
        }
        // `y` exists once a ticket was numbered, and is never removed: the
        // removal of a key it no longer has changes nothing.
        Expect::ListedIsOrNot(digest, n) => {
            let listed = e.listed(digest);
            format!(
                "(attribute_not_exists({listed}) OR {listed} = {})",
                e.value(number(n))
            )
        }
        Expect::Cold { position, version } => {
            let hot = e.key(HOT, "p", position);
            let segment = crate::domain::segment_of(position);
            format!(
                "attribute_not_exists({hot}) AND {}",
                segment_version(e, segment, version)
            )
        }
        Expect::SegmentVersion { segment, version } => segment_version(e, segment, version),
        // Only [`Expression::splitting`] can say it (it needs the slots as
        // read): never true here, rather than silently so.
        Expect::FlatAsRead { .. } => format!("attribute_not_exists({INCARNATION})"),
        Expect::Settled => format!(
            "{ADMITTED} = {NEXT_TICKET} AND size({LISTED}) = {}",
            e.zero()
        ),
    }
}

/// A split pool item records this version of the segment (a segment never
/// compacted has no entry).
fn segment_version(e: &mut ExpressionBuilder, segment: u16, version: u32) -> String {
    let path = e.key(SEGMENTS, "s", segment);
    if version == 0 {
        format!("attribute_not_exists({path})")
    } else {
        format!("{path} = {}", e.value(number(version)))
    }
}

/// The clauses of an update expression, gathered change by change.
#[derive(Default)]
struct Clauses {
    sets: Vec<String>,
    removes: BTreeSet<String>,
    /// A split item's slots freed, by segment: each segment's count
    /// advances once by their number (one path is set once a write).
    freed: BTreeMap<u16, u32>,
    // Appended tickets, in order: one list_append per list.
    appended: Vec<AttributeValue>,
    give_ups: Vec<AttributeValue>,
}

impl Clauses {
    fn add(&mut self, e: &mut ExpressionBuilder, change: &Change) {
        match *change {
            Change::Take { .. }
            | Change::HandOff { .. }
            | Change::Free(_)
            | Change::Extend(_)
            | Change::Truncate { .. } => self.add_slot(e, change),
            Change::NumberTicket
            | Change::SetAdmitted(_)
            | Change::SetListed(..)
            | Change::RemoveListed(_)
            | Change::Settle => self.add_line(e, change),
            Change::Append(ticket) => {
                self.appended.push(holder_value(ticket.holder));
                self.give_ups.push(give_up_value(ticket.give_up));
            }
            Change::RemoveTicket(index) => {
                self.removes.insert(format!("{QUEUE}[{index}]"));
                self.removes.insert(format!("{GIVE_UP}[{index}]"));
            }
            Change::SetGivenUp(given_up) => {
                self.sets.push(format!(
                    "{} = {}",
                    e.given_up(given_up.digest),
                    e.value(number(given_up.until_s))
                ));
            }
            Change::ForgetGivenUp(digest) => {
                self.removes.insert(e.given_up(digest));
            }
            Change::SetEnded(ended) => {
                self.sets.push(format!(
                    "{ENDED}{} = {}",
                    ended.place(),
                    e.value(ended_value(ended))
                ));
            }
            Change::RemoveEnded(place) => {
                self.removes.insert(format!("{ENDED}{place}"));
            }
            Change::DropLegacyEnded => {
                self.removes.insert(LEGACY_ENDED.to_string());
            }
            Change::Cool(position) => {
                self.removes.insert(e.key(HOT, "p", position));
                self.removes.insert(e.key(HOT_STAMPS, "p", position));
            }
            Change::SetSegmentVersion { segment, version } => {
                let path = e.key(SEGMENTS, "s", segment);
                self.sets
                    .push(format!("{path} = {}", e.value(number(version))));
            }
            Change::SetCount(sizing) => {
                self.sets
                    .push(format!("{COUNT} = {}", e.value(sizing_value(sizing))));
            }
            // Written by [`Expression::splitting`] alone.
            Change::Split => {}
            // No condition: a claim collides with no write. When none was
            // read the first claim to land stands.
            Change::ClaimCompaction { token, over: 0 } => {
                let token = e.value(number(token));
                self.sets.push(format!(
                    "{COMPACTION_CLAIM} = if_not_exists({COMPACTION_CLAIM}, {token})"
                ));
            }
            Change::ClaimCompaction { token, .. } => {
                let token = e.value(number(token));
                self.sets.push(format!("{COMPACTION_CLAIM} = {token}"));
            }
            Change::EndCompactionClaim => {
                self.removes.insert(COMPACTION_CLAIM.to_string());
            }
        }
    }

    /// The changes of slots: take, hand off, free, extend, truncate.
    fn add_slot(&mut self, e: &mut ExpressionBuilder, change: &Change) {
        match *change {
            Change::Take {
                position,
                holder,
                now_ms,
            } => {
                let (slot, stamp) = (e.slot(position), e.stamp(position));
                self.sets.push(format!("{slot} = {}", e.holder(holder)));
                self.sets
                    .push(format!("{stamp} = {FENCE} + {}", e.value(number(now_ms))));
            }
            Change::HandOff {
                position,
                from,
                nth,
                now_ms,
            } => {
                let zero = e.zero();
                let slot = e.slot(position);
                self.sets
                    .push(format!("{slot} = if_not_exists({QUEUE}[{from}], {zero})"));
                // The write's `nth` fence: the counter plus `nth`.
                let stamp =
                    u128::from(now_ms.saturating_add(HANDED)) + u128::from(nth) * STAMP_SCALE;
                let handed = e.value(AttributeValue::N(stamp.to_string()));
                let stamp = e.stamp(position);
                self.sets.push(format!("{stamp} = {FENCE} + {handed}"));
                for index in 0..=from {
                    self.removes.insert(format!("{QUEUE}[{index}]"));
                    self.removes.insert(format!("{GIVE_UP}[{index}]"));
                }
            }
            Change::Free(position) => {
                let zero = e.zero();
                let (slot, stamp) = (e.slot(position), e.stamp(position));
                self.sets.push(format!("{slot} = {zero}"));
                self.sets.push(format!("{stamp} = {zero}"));
                if e.split {
                    *self.freed.entry(segment_of(position)).or_insert(0) += 1;
                }
            }
            // A split item stores no free slot past the hot ones: nothing to
            // add or remove (`Pool::lower` frees a truncated held one).
            Change::Extend(_) | Change::Truncate { .. } if e.split => {}
            Change::Extend(n) => {
                let zeros = e.value(AttributeValue::L(vec![number(0); n]));
                self.sets
                    .push(format!("{SLOTS} = list_append({SLOTS}, {zeros})"));
                self.sets
                    .push(format!("{STAMPS} = list_append({STAMPS}, {zeros})"));
            }
            Change::Truncate { from, len } => {
                for position in from..len {
                    self.removes.insert(format!("{SLOTS}[{position}]"));
                    self.removes.insert(format!("{STAMPS}[{position}]"));
                }
            }
            _ => unreachable!("not a change of slots"),
        }
    }

    /// The changes of async mode's line: numbers, admission, listing, settling.
    fn add_line(&mut self, e: &mut ExpressionBuilder, change: &Change) {
        match *change {
            Change::NumberTicket => {
                let (zero, one) = (e.zero(), e.value(number(1)));
                let empty = e.value(AttributeValue::M(HashMap::new()));
                self.sets.push(format!(
                    "{NEXT_TICKET} = if_not_exists({NEXT_TICKET}, {zero}) + {one}"
                ));
                self.sets
                    .push(format!("{ADMITTED} = if_not_exists({ADMITTED}, {zero})"));
                // Admission lists async tickets in it.
                self.sets
                    .push(format!("{LISTED} = if_not_exists({LISTED}, {empty})"));
                self.sets.push(format!("{ACTIVE} = {one}"));
            }
            Change::SetAdmitted(admitted) => {
                self.sets
                    .push(format!("{ADMITTED} = {}", e.value(number(admitted))));
            }
            Change::SetListed(digest, n) => {
                self.sets
                    .push(format!("{} = {}", e.listed(digest), e.value(number(n))));
            }
            Change::RemoveListed(digest) => {
                self.removes.insert(e.listed(digest));
            }
            Change::Settle => {
                self.removes.insert(ACTIVE.to_string());
            }
            _ => unreachable!("not a change of the line"),
        }
    }

    /// The expression, `fences` taken from the counter in the same write
    /// ([`Update::fences`]).
    fn finish(
        self,
        mut e: ExpressionBuilder,
        inc: String,
        conditions: Vec<String>,
        fences: u64,
    ) -> Expression {
        let Clauses {
            mut sets,
            removes,
            freed,
            appended,
            give_ups,
        } = self;
        for (segment, frees) in freed {
            let (zero, frees) = (e.zero(), e.value(number(frees)));
            sets.push(format!(
                "{FREED}{segment} = if_not_exists({FREED}{segment}, {zero}) + {frees}"
            ));
        }
        if !appended.is_empty() {
            let q = e.value(AttributeValue::L(appended));
            let w = e.value(AttributeValue::L(give_ups));
            sets.push(format!("{QUEUE} = list_append({QUEUE}, {q})"));
            sets.push(format!("{GIVE_UP} = list_append({GIVE_UP}, {w})"));
        }
        if fences > 0 {
            sets.push(format!(
                "{FENCE} = {FENCE} + {}",
                e.value(AttributeValue::N(
                    (u128::from(fences) * STAMP_SCALE).to_string()
                ))
            ));
        }
        let mut clauses = Vec::new();
        if !sets.is_empty() {
            clauses.push(format!("SET {}", sets.join(", ")));
        }
        if !removes.is_empty() {
            let removes: Vec<String> = removes.into_iter().collect();
            clauses.push(format!("REMOVE {}", removes.join(", ")));
        }
        if clauses.is_empty() {
            // Nothing to change: still a conditional write, so that it checks.
            clauses.push(format!("SET {INCARNATION} = {inc}"));
        }
        Expression {
            condition: conditions.join(" AND "),
            update: clauses.join(" "),
            names: e.names,
            values: e.values,
            once: false,
        }
    }
}

impl Expression {
    /// The write that splits a flat pool item ([`crate::domain::Pool::plan_split`]),
    /// `read` as read and `split` after: conditioned on its slots as read
    /// (its fence counter, and its list of holders whole: DynamoDB compares
    /// lists by value), it writes the hot maps and removes the lists.
    pub(super) fn splitting(read: &Record, split: &Pool) -> Self {
        let mut e = ExpressionBuilder::default();
        let inc = e.value(number(read.incarnation));
        let fence = e.value(AttributeValue::N(
            (u128::from(read.pool.next_fence()) * STAMP_SCALE).to_string(),
        ));
        let mut conditions = vec![
            format!("{INCARNATION} = {inc}"),
            format!("{FENCE} = {fence}"),
        ];
        for (name, value) in slot_attributes(&read.pool) {
            if name == SLOTS {
                conditions.push(format!("{SLOTS} = {}", e.value(value)));
            }
        }
        let sets: Vec<String> = slot_attributes(split)
            .into_iter()
            .map(|(name, value)| format!("{name} = {}", e.value(value)))
            .collect();
        Expression {
            condition: conditions.join(" AND "),
            update: format!("SET {} REMOVE {SLOTS}, {STAMPS}", sets.join(", ")),
            names: e.names,
            values: e.values,
            once: false,
        }
    }
}

#[derive(Default)]
struct ExpressionBuilder {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
    zero: Option<String>,
    /// A split pool item: slots are `h.#pN`, `t.#pN`, not `s[N]`, `g[N]`.
    split: bool,
}

impl ExpressionBuilder {
    /// The path of a slot's holder.
    fn slot(&mut self, position: u16) -> String {
        if self.split {
            self.key(HOT, "p", position)
        } else {
            format!("{SLOTS}[{position}]")
        }
    }

    /// The path of a slot's stamp.
    fn stamp(&mut self, position: u16) -> String {
        if self.split {
            self.key(HOT_STAMPS, "p", position)
        } else {
            format!("{STAMPS}[{position}]")
        }
    }

    fn value(&mut self, value: AttributeValue) -> String {
        if let Some((existing, _)) = self.values.iter().find(|(_, v)| **v == value) {
            return existing.clone();
        }
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    fn zero(&mut self) -> String {
        match &self.zero {
            Some(zero) => zero.clone(),
            None => {
                let zero = self.value(number(0));
                self.zero = Some(zero.clone());
                zero
            }
        }
    }

    fn holder(&mut self, holder: Holder) -> String {
        self.value(holder_value(holder))
    }

    /// `x.#tN` for a tombstone key (digest keys may hold '-', which
    /// placeholders must not).
    fn given_up(&mut self, digest: LeaseDigest) -> String {
        format!("{GIVEN_UP}.{}", self.digest(digest))
    }

    /// `y.#tN` for an async ticket's key.
    fn listed(&mut self, digest: LeaseDigest) -> String {
        format!("{LISTED}.{}", self.digest(digest))
    }

    /// `map.#pN` for a map entry keyed by a number (a position, a segment):
    /// a path name must not start with a digit.
    fn key(&mut self, map: &str, tag: &str, key: u16) -> String {
        let placeholder = format!("#{tag}{key}");
        self.names.insert(placeholder.clone(), key.to_string());
        format!("{map}.{placeholder}")
    }

    fn digest(&mut self, digest: LeaseDigest) -> String {
        let raw = digest_key(&digest);
        if let Some((existing, _)) = self.names.iter().find(|(_, v)| **v == raw) {
            return existing.clone();
        }
        let placeholder = format!("#t{}", self.names.len());
        self.names.insert(placeholder.clone(), raw);
        placeholder
    }
}

#[cfg(test)]
#[path = "expression_tests.rs"]
mod tests;
