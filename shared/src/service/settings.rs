//! Limits (the clamps of a request) and timing (polls, retries, deadlines),
//! with their defaults.

use std::time::Duration;

use semaphore_wire::{Backoff, Jitter};

use crate::domain::Compaction;

/// Bounds applied to requests (API.md: `ttl` and `wait` are clamped, never
/// rejected), and the most borrowers that may wait on one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_ttl_ms: u64,
    pub max_wait_ms: u64,
    pub max_waiters: usize,
    /// Longest `wait` of an async ticket (enqueue).
    pub max_async_wait_ms: u64,
    /// Most tickets waiting in a pool's backlog (numbered, not yet admitted
    /// to its line): an enqueue or a borrower's join past it is refused.
    pub max_tickets: u64,
    /// Borrows that may wait at once across the service (0: no limit): a
    /// borrow that would wait past it gets 429 at once.
    pub waiting_budget: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_async_wait_ms: 24 * 3_600_000,
            max_ttl_ms: 3_600_000,
            // API Gateway's HTTP API cuts every request at 30 s.
            max_wait_ms: 25_000,
            // 100 tickets of about 20 bytes keep a pool item within a few write units.
            max_waiters: 100,
            max_tickets: 10_000,
            waiting_budget: 0,
        }
    }
}

/// How waiters poll, how lost races and failed calls are retried, and how
/// much time every request keeps in hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Waiters read in rounds: those the next `count` freed slots would
    /// serve (at most 4 wide) every `poll`, the next round every `2 · poll`,
    /// then `4 · poll`, … up to `poll_cap`: the head sees a hand-off within
    /// about `poll`, and a long queue's reads grow with the log of its
    /// length. Sooner (never below `poll_min`) when grants come fast enough
    /// that a waiter's turn may come before then. Jittered to ¾–1×.
    /// Expiries are slept to exactly.
    pub poll: Duration,
    pub poll_min: Duration,
    pub poll_cap: Duration,
    /// After a failed store call (full jitter: these requests contend with
    /// each other, and none needs a least pause).
    pub retry: Backoff,
    /// After the third lost write in a row, the same kind of nap (a lost
    /// write is otherwise retried at once with the record it handed back).
    pub conflict: Backoff,
    /// Longest one store call may take (the SDK also has its own timeouts).
    pub call_timeout: Duration,
    /// Time kept back from the Lambda deadline to send the response.
    pub deadline_margin: Duration,
    /// Without a Lambda deadline (local server): how long past its `wait` a
    /// request may take to answer.
    pub local_budget: Duration,
    /// Kept back from the answer-by time when a waiter stops waiting, to
    /// cancel its ticket (or find it granted) before answering.
    pub cancel_reserve: Duration,
    /// Which new pools are split, and when a split pool's hot entries move
    /// to their segments.
    pub compaction: Compaction,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            poll: Duration::from_millis(70),
            poll_min: Duration::from_millis(10),
            poll_cap: Duration::from_secs(2),
            retry: Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(400),
                Jitter::Full,
            ),
            conflict: Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(100),
                Jitter::Full,
            ),
            call_timeout: Duration::from_millis(2_500),
            deadline_margin: Duration::from_millis(300),
            local_budget: Duration::from_millis(4_500),
            cancel_reserve: Duration::from_millis(1_500),
            compaction: Compaction::DEFAULT,
        }
    }
}
