//! Every key and attribute name of the table, for both item kinds, in one
//! place; `template.yaml` mirrors the keys, the index, the TTL attribute, the
//! stream's filter ([`dispatches`]) and the warm-up key (a test below checks).
//!
//! The pool item, one per pool:
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | B | first 16 bytes of SHA-256 of the pool UUID (partition key) |
//! | `sk` | B | `00`: the pool item (sort key) |
//! | `i`  | N | incarnation: random per creation; every update is conditioned on it |
//! | `c`  | N | resize × 10⁴ + count: a count condition names one resize (its low 20 bits the request's) |
//! | `b`  | N | creation time in µs: fences are `b` + a grant's relative fence |
//! | `f`  | N | the next grant's relative fence × 10¹³ |
//! | `s`  | L | slots by position: `0` (free) or the holder (B: digest 8 ‖ ttl ms) |
//! | `g`  | L | per position: relative fence × 10¹³ + grant ms (+ 5·10¹² when handed to a waiter; `0` when freed) |
//! | `q`  | L | waiting tickets in arrival order: the holder (B), as in `s` |
//! | `w`  | L | per ticket: its give-up time in Unix seconds |
//! | `x`  | M | lease ids given up before their borrow was seen: digest → until (s) |
//! | `r0`…`r15` | B | short grants handed to a waiter, expired and reused: a ring, grant in `r{fence % 16}`: digest ‖ position ‖ grant ms ‖ fence |
//! | `n`  | N | async mode: the next ticket number (absent until a first ticket) |
//! | `a`  | N | async mode: the first ticket number not yet admitted to `q` (`a = n`: no backlog) |
//! | `y`  | M | async mode: async tickets in `q`, or granted and not yet delivered: digest → ticket number |
//! | `z`  | N | async mode: `1` while the pool has async work (the stream's filter); removed once settled |
//! | `wk` | N | async mode, AWS only: the dispatcher's pending wake of the pool (Unix ms): invocations that want it or a later one send none (`delivery/handler.rs`) |
//! | `xp` | N | only with `IDLE_POOL_DAYS`: when DynamoDB may delete the pool (Unix s), set by every write to now + the days + the longest lease or ticket wait. No decision reads it |
//!
//! A split pool's item (count above 48) holds, instead of `s` and `g`, only
//! its hot slots, and its segments' versions:
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `h`  | M | hot slots: position → the holder (B), or `0` when free |
//! | `t`  | M | their stamps: position → stamp, as in `g` |
//! | `k`  | M | segment → the version its cold slots are read from (absent: never compacted, all free) |
//! | `o`  | N | the compaction claim, while one is under way: its end (Unix ms) × 2¹⁰ + its writer's nonce. Set by the write that found compaction due (no condition), removed by the compaction's own write |
//!
//! Segment items (split pools), one per 64 positions, written only by
//! compaction: sort key `00` ‖ incarnation (8 bytes) ‖ segment (2 bytes);
//! `v` the version, `s` and `g` the 64 slots as in the pool item.
//!
//! Ticket items (async mode), one per ticket (see `tickets.rs`):
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `tn` | N | the ticket number (the index's sort key) |
//! | `h`  | B | the holder it waits to become: digest ‖ ttl ms, as in the pool item |
//! | `i`  | N | the pool's incarnation when it joined |
//! | `j`, `u` | N | joined at, waits until (Unix ms) |
//! | `cu`, `ct` | S | callback URL and token (absent for a sync borrower) |
//! | `st` | S | the state's name; every change is conditioned on it |
//! | `gp`, `gf`, `gt`, `ge` | N | once granted: position, fence, granted and expiry ms |
//! | `dv` | N | delivered at (ms) |
//! | `r`  | S | why it failed |
//! | `at` | N | delivery attempts |
//! | `xp` | N | when DynamoDB may delete the item (Unix s): a week after its wait ends. Garbage collection only (TTL deletes days late): no state is read from it |

/// The partition key: the pool's key, 16 bytes.
pub const PK: &str = "pk";
/// The sort key: [`POOL_ITEM`] for the pool item.
pub const SK: &str = "sk";
/// The pool item's sort key.
pub const POOL_ITEM: [u8; 1] = [0];

/// The local secondary index that orders a pool's tickets by number.
pub const BY_TICKET: &str = "by_ticket";
/// Its sort key: the ticket number.
pub const NUMBER: &str = "tn";
/// The first byte of every ticket item's sort key (the pool item's is `00`).
pub const TICKET_ITEM: u8 = 1;

/// A split pool's segment item's sort key: `00` (the pool item's), the
/// pool's incarnation (8 bytes) and the segment's number (2 bytes), all
/// big-endian. They sort right after the pool item and before the tickets,
/// so one `Query` reads one incarnation's segments in order; a segment of an
/// earlier pool of the same id never shares a key with this one's.
pub fn segment_sort_key(incarnation: u64, segment: u16) -> [u8; 11] {
    let mut key = [POOL_ITEM[0]; 11];
    key[1..9].copy_from_slice(&incarnation.to_be_bytes());
    key[9..].copy_from_slice(&segment.to_be_bytes());
    key
}

/// A segment item's attributes (besides the keys): the cold slots of
/// [`crate::domain::SEGMENT_SLOTS`] positions, written only by compaction.
pub mod segment_item {
    /// The segment's version: the pool item's `k` records the one its cold
    /// slots are read from.
    pub const VERSION: &str = "v";
    /// The holders, as the pool item's `s` (`0` when free).
    pub const SLOTS: &str = "s";
    /// Their grant stamps, as the pool item's `g`.
    pub const STAMPS: &str = "g";
}

/// The pool item's attributes (besides the keys).
pub mod pool_item {
    pub const INCARNATION: &str = "i";
    pub const COUNT: &str = "c";
    pub const BASE: &str = "b";
    pub const FENCE: &str = "f";
    pub const SLOTS: &str = "s";
    pub const STAMPS: &str = "g";
    /// A split pool's hot slots: position → holder (`0` when free).
    pub const HOT: &str = "h";
    /// A split pool's hot slots' stamps: position → stamp.
    pub const HOT_STAMPS: &str = "t";
    /// A split pool's segment versions: segment → version.
    pub const SEGMENTS: &str = "k";
    /// A split pool's compaction claim (see `Pool::compaction_claim`).
    pub const COMPACTION_CLAIM: &str = "o";
    /// A split pool's count of freed slots per segment: one attribute per
    /// segment that ever had one freed, `d0`, `d1`, … (absent: none). A
    /// grant conditions on those below its position (`domain/lowest.rs`).
    pub const FREED: &str = "d";
    pub const QUEUE: &str = "q";
    pub const GIVE_UP: &str = "w";
    pub const GIVEN_UP: &str = "x";
    /// The ring of reused short grants: one attribute per place, `r0`, `r1`, …
    pub const ENDED: &str = "r";
    /// The map of ended grants by lease id that an older version kept (without
    /// bound): dropped by the next write that reuses a slot, returns or resizes.
    pub const LEGACY_ENDED: &str = "e";
    pub const NEXT_TICKET: &str = "n";
    pub const ADMITTED: &str = "a";
    pub const LISTED: &str = "y";
    /// The async-work flag (see [`dispatches`](super::dispatches)).
    pub const ACTIVE: &str = "z";
    /// The pool item's attribute holding the wake armed for it (Unix ms): the
    /// one recorded pending wake per pool, whichever invocations want one.
    pub const PENDING_WAKE: &str = "wk";
}

/// A ticket item's attributes (besides the keys and [`NUMBER`]).
pub mod ticket_item {
    pub const HOLDER: &str = "h";
    pub const INCARNATION: &str = "i";
    pub const JOINED: &str = "j";
    pub const WAIT_UNTIL: &str = "u";
    pub const CALLBACK_URL: &str = "cu";
    pub const CALLBACK_TOKEN: &str = "ct";
    pub const STATE: &str = "st";
    pub const POSITION: &str = "gp";
    pub const FENCE: &str = "gf";
    pub const GRANTED: &str = "gt";
    pub const EXPIRES: &str = "ge";
    pub const DELIVERED: &str = "dv";
    pub const REASON: &str = "r";
    // Not `n`: the stream's filter tells pool items with tickets by their `n`.
    pub const ATTEMPTS: &str = "at";
    /// The delivery claim: whose, and until when (Unix ms).
    pub const CLAIMED_BY: &str = "cb";
    pub const CLAIMED_UNTIL: &str = "cl";
    /// The table's TTL attribute.
    pub const EXPIRES_AT: &str = "xp";
}

pub use pool_item::ACTIVE;

/// The partition key of the one read a function makes during init; no pool
/// has it (pool keys are 16 bytes), and IAM lets functions that may not
/// otherwise read the table read only this key.
pub const WARM_UP_KEY: &[u8] = b"warm-up";

/// Whether a change of the table invokes async mode's dispatcher: a write
/// that leaves a pool item (sort key `00`) with the async-work flag, or a new
/// ticket item (its number). `template.yaml`'s event source filter says the
/// same; sync-only pools never pass it.
pub fn dispatches(sort_key: &[u8], new_image_has: impl Fn(&str) -> bool, inserted: bool) -> bool {
    (sort_key == POOL_ITEM && new_image_has(ACTIVE)) || (inserted && new_image_has(NUMBER))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde_json::{json, Value};

    use super::pool_item::*;
    use super::ticket_item::*;
    use super::*;

    /// A segment write (compaction) never invokes the dispatcher: its sort
    /// key is not the pool item's, and it carries no ticket number; nor do
    /// the filter's patterns match it (their sort key is exactly `00`).
    #[test]
    fn segment_items_never_dispatch() {
        for (incarnation, segment) in [(0, 0), (1, 1), (u64::MAX, 15), (7, u16::MAX)] {
            let sk = segment_sort_key(incarnation, segment);
            assert_ne!(&sk[..], &POOL_ITEM[..]);
            assert!(
                sk[..] > POOL_ITEM[..] && sk[0] < TICKET_ITEM,
                "between the pool item and tickets"
            );
            let has = |name: &str| {
                [
                    segment_item::VERSION,
                    segment_item::SLOTS,
                    segment_item::STAMPS,
                ]
                .contains(&name)
            };
            assert!(!dispatches(&sk, has, true) && !dispatches(&sk, has, false));
        }
    }

    /// template.yaml declares the table by these names: its keys, index and
    /// TTL attribute, the stream filter [`dispatches`] mirrors, and the
    /// warm-up key, the one key IAM lets the functions without reads read.
    #[test]
    fn the_template_agrees() {
        let template = include_str!("../../../../template.yaml");
        for declared in [
            format!("AttributeName: {PK}"),
            format!("AttributeName: {SK}"),
            format!("AttributeName: {NUMBER}"),
            format!("IndexName: {BY_TICKET}"),
        ] {
            assert!(template.contains(&declared), "{declared}");
        }
        let lines: Vec<&str> = template.lines().map(str::trim).collect();
        let after = |line: &str| -> Vec<&str> {
            lines
                .windows(2)
                .filter(|pair| pair[0] == line)
                .map(|pair| pair[1])
                .collect()
        };
        assert_eq!(
            after("TimeToLiveSpecification:"),
            [format!("AttributeName: {EXPIRES_AT}")]
        );
        let patterns: Vec<Value> = lines
            .iter()
            .filter_map(|line| line.strip_prefix("- Pattern: '")?.strip_suffix('\''))
            .map(|pattern| serde_json::from_str(pattern).expect(pattern))
            .collect();
        let pool_sk = STANDARD.encode(POOL_ITEM);
        assert_eq!(
            patterns,
            [
                json!({"dynamodb": {"Keys": {SK: {"B": [pool_sk]}}, "NewImage": {ACTIVE: {"N": [{"exists": true}]}}}}),
                json!({"eventName": ["INSERT"], "dynamodb": {"NewImage": {NUMBER: {"N": [{"exists": true}]}}}}),
            ]
        );
        let warm_up = STANDARD.encode(WARM_UP_KEY);
        assert_eq!(warm_up, "d2FybS11cA==");
        let leading = after("dynamodb:LeadingKeys:");
        assert!(!leading.is_empty());
        for key in leading {
            assert_eq!(key, format!("- {warm_up}"));
        }
    }

    #[test]
    fn the_names_of_each_item_kind_are_distinct() {
        let ring: Vec<String> = (0..crate::domain::ENDED_RING)
            .map(|place| format!("{ENDED}{place}"))
            .collect();
        let mut pool = vec![
            PK,
            SK,
            super::pool_item::INCARNATION,
            COUNT,
            BASE,
            super::pool_item::FENCE,
            SLOTS,
            STAMPS,
            QUEUE,
            GIVE_UP,
            GIVEN_UP,
            LEGACY_ENDED,
            NEXT_TICKET,
            ADMITTED,
            LISTED,
            ACTIVE,
            PENDING_WAKE,
        ];
        pool.extend(ring.iter().map(String::as_str));
        assert_eq!(pool.iter().collect::<BTreeSet<_>>().len(), pool.len());
        // A pool item's insert (a create) must not pass the stream's filter
        // of new tickets.
        assert!(!pool.contains(&NUMBER));
        let ticket = [
            PK,
            SK,
            NUMBER,
            HOLDER,
            super::ticket_item::INCARNATION,
            JOINED,
            WAIT_UNTIL,
            CALLBACK_URL,
            CALLBACK_TOKEN,
            STATE,
            POSITION,
            super::ticket_item::FENCE,
            GRANTED,
            EXPIRES,
            DELIVERED,
            REASON,
            ATTEMPTS,
            CLAIMED_BY,
            CLAIMED_UNTIL,
            EXPIRES_AT,
        ];
        assert_eq!(ticket.iter().collect::<BTreeSet<_>>().len(), ticket.len());
    }
}
