//! The service's waiting budget (`WAITING_BUDGET`): how many borrows may
//! wait at once, across every pool. A borrow that waits holds a Lambda
//! execution for its whole wait, so a flood of waits would take the borrow
//! function's reserved concurrency, and past it Lambda throttles with API
//! Gateway's own error; the budget answers a JSON `429` first.
//!
//! The budget is a semaphore of our own: a few small pools, stored under
//! keys that no pool UUID hashes to (so no request can reach them), of at
//! most [`SHARD_COUNT`] slots each. A borrow about to wait takes a slot of
//! one (a "pass", with no wait of its own) and returns it when it answers;
//! its lease outlives the wait by a little, so that a crashed borrow's pass
//! frees itself.

use sha2::{Digest, Sha256};

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::keys::{LeaseId, PoolKey};

use super::borrow::{BorrowRequest, Who};
use super::{Budget, Service, Stats};

/// Slots of one shard: its pool item stays small (one write unit).
const SHARD_COUNT: u32 = 32;

/// Shards a borrow tries before it is told the budget is in use.
const TRIES: u32 = 3;

/// A pass's lease outlives the wait it covers by this much (the store calls
/// around the wait, and the return of the pass).
const PASS_MARGIN_MS: u64 = 5_000;

/// A borrow's place in the waiting budget, returned when it answers.
pub(super) struct Pass {
    key: PoolKey,
    lease: LeaseId,
}

/// The shards of a budget: how many, and the count of each.
fn shards(budget: u32) -> Vec<u16> {
    let n = budget.div_ceil(SHARD_COUNT).max(1);
    (0..n)
        .map(|i| (budget / n + u32::from(i < budget % n)) as u16)
        .collect()
}

/// The key of one shard. A pool's key is the SHA-256 of its UUID's 16 bytes;
/// this input is longer, so no UUID maps to it. The budget is part of it: a
/// new budget starts new shards (the old ones' passes run out on their own).
fn shard_key(budget: u32, shard: usize) -> PoolKey {
    let mut input = b"http-semaphore waiting budget ".to_vec();
    input.extend_from_slice(&budget.to_be_bytes());
    input.extend_from_slice(&(shard as u32).to_be_bytes());
    let full = Sha256::digest(&input);
    let mut key = [0u8; 16];
    key.copy_from_slice(&full[..16]);
    PoolKey(key)
}

/// How long one call on a shard may take: a budget that cannot be reached in
/// time lets the borrow wait without a pass (it fails open, see below).
const SHARD_CALL: Duration = Duration::from_millis(1_000);

impl Service {
    /// A pass for a borrow about to wait up to `wait_ms`: `None` without a
    /// budget, or when no shard could be reached ([`Error::Busy`] only when
    /// the shards it tried were all in use). Fails open: the budget guards
    /// against floods, and a store that cannot answer it is no reason to
    /// refuse a borrow the pool itself would take.
    pub(super) async fn enter_waiting_room(
        &self,
        wait_ms: u64,
        answer_by: Instant,
        stats: &mut Stats,
    ) -> Result<Option<Pass>, Error> {
        let budget = self.limits.waiting_budget;
        if budget == 0 {
            return Ok(None);
        }
        let counts = shards(budget);
        let first = fastrand::usize(..counts.len());
        let mut full = 0;
        let tries = counts.len().min(TRIES as usize);
        for shard in (0..tries).map(|i| (first + i) % counts.len()) {
            let key = shard_key(budget, shard);
            let request = BorrowRequest {
                ttl_ms: wait_ms + PASS_MARGIN_MS,
                wait_ms: 0,
                lease: LeaseId::new_random(),
            };
            let mut attempt = self.pass_call(key, request, answer_by, stats).await;
            if attempt == Err(Error::PoolNotFound) {
                let mut created = self.shard_budget(answer_by);
                let made = self.register_key(key, counts[shard], &mut created).await;
                add(stats, &created.stats);
                if made.is_ok() {
                    attempt = self.pass_call(key, request, answer_by, stats).await;
                }
            }
            match attempt {
                Ok(_) => {
                    return Ok(Some(Pass {
                        key,
                        lease: request.lease,
                    }))
                }
                Err(Error::Exhausted) => full += 1,
                Err(err) => {
                    tracing::warn!(error = %err, "a waiting budget shard did not answer");
                }
            }
        }
        if full == tries {
            return Err(Error::Busy { budget });
        }
        Ok(None)
    }

    /// A pass's borrow on one shard (wait 0: it never asks for a pass
    /// itself; boxed, since a borrow calls a borrow).
    async fn pass_call(
        &self,
        key: PoolKey,
        request: BorrowRequest,
        answer_by: Instant,
        stats: &mut Stats,
    ) -> Result<super::Grant, Error> {
        let mut spent = self.shard_budget(answer_by);
        let result = Box::pin(self.borrow_key(key, request, &mut spent, Who::Pass)).await;
        add(stats, &spent.stats);
        result
    }

    /// A shard call's budget: [`SHARD_CALL`], and never past the request's
    /// answer (the harness keeps its margin before a deadline: given back).
    fn shard_budget(&self, answer_by: Instant) -> Budget {
        let until = answer_by.min(Instant::now() + SHARD_CALL) + self.timing.deadline_margin;
        Budget::new(Some(until))
    }

    /// Gives the pass back (a failure only leaves it to run out).
    pub(super) async fn leave_waiting_room(&self, pass: Pass, stats: &mut Stats) {
        let mut spent = Budget::new(None);
        if let Err(err) = self.return_key(pass.key, pass.lease, &mut spent).await {
            tracing::warn!(error = %err, "a waiting budget pass was not returned: it runs out");
        }
        add(stats, &spent.stats);
    }
}

/// The shard calls count as the request's own.
fn add(stats: &mut Stats, spent: &Stats) {
    stats.store_calls += spent.store_calls;
    stats.store_errors += spent.store_errors;
    stats.conflicts += spent.conflicts;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_share_the_budget_and_stay_small() {
        for budget in [1, 31, 32, 33, 150, 1000, 10_000] {
            let counts = shards(budget);
            assert_eq!(counts.iter().map(|&c| u32::from(c)).sum::<u32>(), budget);
            assert!(counts
                .iter()
                .all(|&c| (1..=SHARD_COUNT as u16).contains(&c)));
        }
    }

    #[test]
    fn shard_keys_differ_by_shard_and_budget() {
        assert_ne!(shard_key(150, 0), shard_key(150, 1));
        assert_ne!(shard_key(150, 0), shard_key(151, 0));
        assert_eq!(shard_key(150, 2), shard_key(150, 2));
    }
}
