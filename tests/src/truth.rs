//! Ground truth for the checker: every lease the store ever held, seen from
//! just above the real store (below any fault injection), so that a lease
//! written by a call whose answer was lost is seen too.
//!
//! With it the checker measures **orphaned slot-seconds**: time a position
//! was held by a lease no client was ever told about (no borrow answered
//! 200 with it). Such a lease holds its slot until its ttl, and with
//! `count: 1` that is a lock nobody can release.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use semaphore::clock::now_ms;
use semaphore::domain::{Change, CompactionPlan, LeaseDigest, Ticket, Update};
use semaphore::keys::{LeaseId, PoolKey};
use semaphore::store::{Created, PoolStore, Record, StoreError, Updated};
use std::sync::Arc;

use crate::history::{Call, Op, Rule, Violation};

tokio::task_local! {
    /// The id of the API call the current task is making (set by
    /// `workload::call`), so the recorder knows which call wrote a lease.
    pub static CALLER: u64;
}

/// A fresh caller id.
pub fn next_caller() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A lease as the store held it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredLease {
    pub key: PoolKey,
    pub digest: LeaseDigest,
    pub position: u16,
    pub fence: u64,
    pub expires_at_ms: u64,
    /// The grant's time as its write stamped it.
    pub granted_ms: u64,
    /// When the store call that first returned it started: no later than
    /// its write (every write returns the item through the recorder).
    pub first_seen_ms: u64,
    /// The earliest its pool's delete can have removed it, if one did after
    /// it was written: the delete's start, or the write's if that was later
    /// (a write lands only on a pool that exists).
    pub deleted_ms: Option<u64>,
    /// When a record of its pool was first seen without it (returned, or its
    /// slot reused): it had ended by then.
    pub gone_ms: Option<u64>,
    /// The API call that wrote it, if known (see [`CALLER`]).
    pub caller: Option<u64>,
    /// The borrow that asked for it (wrote a take or a ticket with its id):
    /// the lease is in flight until that borrow answers, also when another
    /// call's hand-off granted it.
    pub borrower: Option<u64>,
}

impl StoredLease {
    /// How long it held its position after `from`: until its expiry or its
    /// pool's delete.
    pub fn held_after(&self, from: u64) -> u64 {
        self.expires_at_ms
            .min(self.deleted_ms.unwrap_or(u64::MAX))
            .min(self.gone_ms.unwrap_or(u64::MAX))
            .saturating_sub(from)
    }
}

/// Every lease seen by any recorder of a run, and the deletes.
#[derive(Default)]
pub struct Truth {
    seen: Mutex<HashMap<(PoolKey, u64), StoredLease>>,
    /// The call that asked for each lease id of a pool (its borrow).
    asked: Mutex<HashMap<(PoolKey, LeaseDigest), u64>>,
    /// Per pool, the fences of the leases seen and not yet seen gone.
    open: Mutex<HashMap<PoolKey, HashSet<u64>>>,
    /// When each delete that removed a pool started and returned, by pool.
    deletes: Mutex<HashMap<PoolKey, Vec<(u64, u64)>>>,
    /// Compactions of split pools whose pool item write landed.
    pub compactions: std::sync::atomic::AtomicU64,
    /// Flat pools split (their pool item write landed).
    pub splits: std::sync::atomic::AtomicU64,
}

impl Truth {
    /// Every lease seen so far, each with the first delete of its pool after
    /// its write.
    pub fn leases(&self) -> Vec<StoredLease> {
        let deletes = lock(&self.deletes);
        let asked = lock(&self.asked);
        lock(&self.seen)
            .values()
            .map(|lease| StoredLease {
                borrower: asked.get(&(lease.key, lease.digest)).copied(),
                // The first delete that returned after the write removed
                // it, at some instant in that delete's call: judged at the
                // earliest, as the checker judges every call.
                deleted_ms: deletes.get(&lease.key).and_then(|times| {
                    times
                        .iter()
                        .copied()
                        .filter(|&(_, returned)| returned >= lease.first_seen_ms)
                        .min_by_key(|&(_, returned)| returned)
                        .map(|(started, _)| started.max(lease.first_seen_ms))
                }),
                ..*lease
            })
            .collect()
    }

    /// Records the leases of `record`, returned by a call started at
    /// `since`; `granting`: the positions the call's update granted — that
    /// call wrote the leases there (a take, or hand-offs by a return or a
    /// waiter to the queue).
    fn saw(&self, key: &PoolKey, record: &Record, since: u64, granting: &[u16]) {
        let caller = CALLER.try_with(|c| *c).ok();
        let mut seen = lock(&self.seen);
        // Leases of this incarnation granted before this record's state
        // (below its fence counter) and not in it have ended by now; one
        // granted after it says nothing (a read can answer after a grant it
        // did not see).
        let held: HashSet<u64> = record.pool.leases().iter().map(|l| l.fence).collect();
        let (base, next) = (record.pool.base_us(), record.pool.next_fence());
        let mut open = lock(&self.open);
        let open = open.entry(*key).or_default();
        let now = now_ms();
        open.retain(|fence| {
            if *fence <= base {
                // Of an earlier incarnation: its pool's delete ended it.
                return false;
            }
            if held.contains(fence) || *fence >= base.saturating_add(next) {
                return true;
            }
            if let Some(lease) = seen.get_mut(&(*key, *fence)) {
                lease.gone_ms = Some(lease.gone_ms.map_or(now, |g| g.min(now)));
            }
            false
        });
        open.extend(held);
        for lease in record.pool.leases() {
            // Fences are unique per pool id, even across incarnations.
            let entry = seen.entry((*key, lease.fence)).or_insert(StoredLease {
                key: *key,
                digest: lease.digest,
                position: lease.position,
                fence: lease.fence,
                expires_at_ms: lease.expires_at_ms,
                granted_ms: lease.granted_ms,
                first_seen_ms: since,
                deleted_ms: None,
                gone_ms: None,
                caller: None,
                borrower: None,
            });
            let new = entry.first_seen_ms >= since;
            entry.first_seen_ms = entry.first_seen_ms.min(since);
            if new && granting.contains(&lease.position) {
                entry.caller = caller;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `PoolStore` wrapper that records every lease in every record the inner
/// store returns, into a [`Truth`] shared by a run's recorders.
pub struct Recorder {
    inner: Arc<dyn PoolStore>,
    truth: Arc<Truth>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn PoolStore>, truth: Arc<Truth>) -> Self {
        Recorder { inner, truth }
    }
}

#[async_trait]
impl PoolStore for Recorder {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        let since = now_ms();
        let loaded = self.inner.load(key).await?;
        if let Some(record) = &loaded {
            self.truth.saw(key, record, since, &[]);
        }
        Ok(loaded)
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let since = now_ms();
        let created = self.inner.create(key, record).await?;
        match &created {
            Created::Created(now) | Created::Exists(now) => self.truth.saw(key, now, since, &[]),
        }
        Ok(created)
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let since = now_ms();
        let granting: Vec<u16> = update
            .changes
            .iter()
            .filter_map(|c| match *c {
                Change::Take { position, .. } | Change::HandOff { position, .. } => Some(position),
                _ => None,
            })
            .collect();
        if let Ok(caller) = CALLER.try_with(|c| *c) {
            for change in &update.changes {
                if let Change::Append(Ticket { holder, .. }) | Change::Take { holder, .. } = change
                {
                    lock(&self.truth.asked).insert((*key, holder.digest), caller);
                }
            }
        }
        let updated = self.inner.update(key, read, update).await?;
        if let Updated::Written(now) | Updated::Lost(now) = &updated {
            self.truth.saw(key, now, since, &granting);
        }
        if matches!(updated, Updated::Written(_)) && update.changes == [Change::Split] {
            self.truth
                .splits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(updated)
    }

    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        let since = now_ms();
        let compacted = self.inner.compact(key, read, plan).await?;
        if let Updated::Written(now) | Updated::Lost(now) = &compacted {
            self.truth.saw(key, now, since, &[]);
        }
        if matches!(compacted, Updated::Written(_)) {
            self.truth
                .compactions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(compacted)
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        let started = now_ms();
        let deleted = self.inner.delete(key).await?;
        if deleted {
            lock(&self.truth.deletes)
                .entry(*key)
                .or_default()
                .push((started, now_ms()));
        }
        Ok(deleted)
    }
}

/// Leases stored that held their positions while no client was told about
/// them, and for how long in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    pub leases: Vec<StoredLease>,
    pub slot_ms: u64,
}

impl Orphans {
    pub fn slot_seconds(&self) -> f64 {
        self.slot_ms as f64 / 1000.0
    }

    /// One [`Rule::OrphanedSlot`] per orphaned lease.
    pub fn violations(&self) -> Vec<Violation> {
        self.leases
            .iter()
            .map(|l| Violation {
                rule: Rule::OrphanedSlot,
                message: format!(
                    "position {} of pool {:?} held by a lease nobody was told about (fence {}, written by call {:?})",
                    l.position,
                    l.key,
                    l.fence,
                    l.caller
                ),
            })
            .collect()
    }
}

/// The stored leases of `truth` that no borrow in `ops` answered 200 with,
/// and how long each held its position after the call that wrote it had
/// answered, and the borrow it was handed to, if any (`callers`: caller id →
/// op index; before those answers, a lease is a grant in flight like any
/// other) — or, when the writer is unknown, from its write — until its
/// expiry (nobody could return it) or its pool's delete.
pub fn orphans(truth: &[StoredLease], ops: &[Op], callers: &HashMap<u64, usize>) -> Orphans {
    let told: HashSet<(PoolKey, LeaseDigest)> = ops
        .iter()
        .filter(|op| matches!(op.call, Call::Borrow { .. }) && op.status == 200)
        .filter_map(|op| {
            let pool = semaphore::api::parse_pool_id(&op.pool).ok()?;
            let lease = uuid::Uuid::parse_str(op.body["lease"].as_str()?).ok()?;
            Some((pool.key(), LeaseId(lease).digest()))
        })
        .collect();
    let mut found = Orphans::default();
    for lease in truth {
        if !told.contains(&(lease.key, lease.digest)) {
            let answer = |caller: Option<u64>| {
                caller
                    .and_then(|c| callers.get(&c))
                    .and_then(|&i| ops.get(i))
                    .map(|op| op.response_ms)
            };
            let answered = answer(lease.caller)
                .unwrap_or(lease.first_seen_ms)
                .max(answer(lease.borrower).unwrap_or(0));
            // Not before its grant: a waiter may die before a slot is
            // handed to its ticket.
            let held = lease.held_after(answered.max(lease.granted_ms));
            if held > 0 {
                found.slot_ms += held;
                found.leases.push(*lease);
            }
        }
    }
    found
}

/// For a failure message: the call that wrote the orphan, and the other
/// calls of its pool around its write.
pub fn describe(lease: &StoredLease, ops: &[Op], callers: &HashMap<u64, usize>) -> String {
    let writer = lease.caller.and_then(|c| callers.get(&c)).copied();
    let around: Vec<String> = ops
        .iter()
        .enumerate()
        .filter(|(i, op)| {
            Some(*i) == writer
                || (semaphore::api::parse_pool_id(&op.pool).is_ok_and(|p| p.key() == lease.key)
                    && op.response_ms + 300 >= lease.first_seen_ms
                    && op.invoke_ms <= lease.first_seen_ms + 300)
        })
        .map(|(i, op)| {
            format!(
                "{}#{i} client {} {:?} [{:+}, {:+}] → {} {}",
                if Some(i) == writer { "WRITER " } else { "" },
                op.client,
                op.call,
                op.invoke_ms as i64 - lease.first_seen_ms as i64,
                op.response_ms as i64 - lease.first_seen_ms as i64,
                op.status,
                op.body
            )
        })
        .collect();
    format!("{lease:?}\n  {}", around.join("\n  "))
}
