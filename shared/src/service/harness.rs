//! One request's store calls: bounded by its answer-by time, failed calls
//! retried, lost writes retried and napped after.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::{join, join_all};

use crate::clock::now_ms;
use crate::domain::{Change, Holder, Layout, LeaseDigest, TicketGrant, Update};
use crate::error::Error;
use crate::keys::PoolKey;
use crate::store::{PoolStore, Record, StoreError, StoreErrorKind, TicketStore, Updated};
use semaphore_wire::Backoff;

use super::{OnAsyncGrant, Service, Timing, Watch, ASYNC_WINDOW};

/// What one request cost, for its log line and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub store_calls: u32,
    /// Store calls that failed (errors and timeouts).
    pub store_errors: u32,
    /// Conditional writes lost to another writer.
    pub conflicts: u32,
    /// Time spent waiting for a slot (sleeping between polls).
    pub waited: Duration,
}

/// What the entrypoint gives one request and gets back: its Lambda
/// deadline, if any, and what the request cost (the [`Harness`] spends it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    pub deadline: Option<Instant>,
    pub stats: Stats,
}

impl Budget {
    pub fn new(deadline: Option<Instant>) -> Self {
        Budget {
            deadline,
            stats: Stats::default(),
        }
    }
}

/// The retry harness of one request inside the service: the stores, when it
/// must answer by (from its [`Budget`]'s deadline), and its store calls,
/// bounded, retried and counted.
pub(super) struct Harness<'a> {
    pub(super) store: &'a dyn PoolStore,
    pub(super) tickets: Option<&'a dyn TicketStore>,
    pub(super) watch: Option<&'a Watch>,
    pub(super) on_async_grant: Option<&'a dyn OnAsyncGrant>,
    pub(super) timing: Timing,
    pub(super) answer_by: Instant,
    pub(super) stats: &'a mut Stats,
    /// The queue's bound (limits): when a write makes admission due.
    pub(super) max_waiters: usize,
    /// The item as this request's last landed write left it, at the instant
    /// it landed: the record a write hands back may be later than that (a
    /// compaction after it lands on what others wrote since). An answer
    /// about that write is computed from this one.
    pub(super) landed: Option<Record>,
}

/// What a request keeps, past its hook's work on its grants, for the calls
/// it makes after the granting write (a cancel's unlisting, say) and its
/// answer.
const HOOK_RESERVE: Duration = Duration::from_millis(1_000);

impl Service {
    pub(super) fn ctx<'a>(&'a self, call: &'a mut Budget, wait: Duration) -> Harness<'a> {
        let now = Instant::now();
        let answer_by = match call.deadline {
            Some(deadline) => deadline
                .checked_sub(self.timing.deadline_margin)
                .unwrap_or(now)
                .max(now),
            None => now + wait + self.timing.local_budget,
        };
        Harness {
            store: self.store.as_ref(),
            tickets: self.tickets.as_deref(),
            watch: self.watch.as_ref(),
            on_async_grant: self.on_async_grant.as_deref(),
            timing: self.timing,
            answer_by,
            stats: &mut call.stats,
            landed: None,
            max_waiters: self.limits.max_waiters,
        }
    }
}

/// Writes `update`, planned from `read`; the record to decide from next: the
/// new one, the one a lost write handed back, or (outcome unknown) a fresh
/// read.
pub(super) async fn write(
    ctx: &mut Harness<'_>,
    key: &PoolKey,
    read: &Record,
    update: &Update,
    lost: &mut u32,
) -> Result<Record, Error> {
    Ok(write_landed(ctx, key, read, update, lost).await?.0)
}

/// [`write`], and whether the write surely landed (`false`: lost, or its
/// outcome unknown). The record after a landed write may already show
/// later writes of others (a compaction after it hands back the item as
/// the compaction left it).
pub(super) async fn write_landed(
    ctx: &mut Harness<'_>,
    key: &PoolKey,
    read: &Record,
    update: &Update,
    lost: &mut u32,
) -> Result<(Record, bool), Error> {
    match ctx.write(key, read, update).await {
        Ok(Updated::Written(record)) => {
            *lost = 0;
            Ok((record, true))
        }
        Ok(Updated::Lost(record)) => {
            if ctx.lost(lost).await? {
                return Ok((ctx.load_existing(key).await?, false));
            }
            Ok((record, false))
        }
        Ok(Updated::Gone) => Err(Error::PoolNotFound),
        Err(err) => Ok((
            ctx.reload(key, err).await?.ok_or(Error::PoolNotFound)?,
            false,
        )),
    }
}

impl Harness<'_> {
    /// Runs one store call, bounded by the time left.
    pub(super) async fn call<T>(
        &mut self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.stats.store_calls += 1;
        let until = self
            .answer_by
            .min(Instant::now() + self.timing.call_timeout);
        let result = match tokio::time::timeout_at(until.into(), call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::TimedOut,
                "no answer from the database in the time left",
            )),
        };
        if result.is_err() {
            self.stats.store_errors += 1;
        }
        result
    }

    /// Runs independent store calls side by side (calls on items of their
    /// own, such as tickets), each counted and bounded as [`Harness::call`]:
    /// their results in order.
    pub(super) async fn side_by_side<T, F>(
        &mut self,
        calls: impl IntoIterator<Item = F>,
    ) -> Vec<Result<T, StoreError>>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let until = self
            .answer_by
            .min(Instant::now() + self.timing.call_timeout);
        let results = join_all(calls.into_iter().map(|call| async move {
            match tokio::time::timeout_at(until.into(), call).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::TimedOut,
                    "no answer from the database in the time left",
                )),
            }
        }))
        .await;
        for result in &results {
            self.stats.store_calls += 1;
            if result.is_err() {
                self.stats.store_errors += 1;
            }
        }
        results
    }

    /// Writes `update`, planned from `read`, conditioned on `read`'s
    /// incarnation, as the pool item can check it ([`Pool::lower`]); undoes
    /// a write that left its holder with a slot twice, and runs the
    /// compaction a split pool has due.
    ///
    /// [`Pool::lower`]: crate::domain::Pool::lower
    pub(super) async fn write(
        &mut self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let (mut lowered, unchecked) = read.pool.lower(update);
        // Compaction due once this write lands, and unclaimed as read:
        // this write claims it.
        let claim = read.pool.compaction_claim_after(
            &lowered,
            self.timing.compaction,
            now_ms(),
            (semaphore_wire::unit() * f64::from(u32::MAX)) as u64,
        );
        lowered.changes.extend(claim);
        let result = self.call(self.store.update(key, read, &lowered)).await;
        let result = match (result, unchecked) {
            (Ok(Updated::Written(record)), Some(holder)) => {
                self.undo_duplicate(key, record, holder, update).await
            }
            (result, _) => result,
        };
        // What the write did, decided from the record as it landed (a
        // compaction after it lands on whatever others wrote since).
        let told = match &result {
            Ok(Updated::Written(landed)) if landed.pool.line().active => {
                // Its own grants: others that landed since `read` are theirs.
                let grants = landed.pool.async_grants_of_write(update.fences());
                // Work it left the dispatcher that no grant names (the line
                // run short, a slot idle while tickets wait unadmitted, free
                // slots owed to async tickets): woken at once, not when the
                // table's stream gets to it. Only a service with the hook
                // tells anyone (a route function's).
                let due = self.on_async_grant.is_some()
                    && landed.pool.dispatch_due_since(
                        &read.pool,
                        self.max_waiters,
                        ASYNC_WINDOW,
                        now_ms(),
                    );
                Some((grants, due))
            }
            _ => None,
        };
        let result = match result {
            Ok(Updated::Written(record)) => {
                self.landed = Some(record.clone());
                let token = match claim {
                    Some(Change::ClaimCompaction { token, .. }) => token,
                    _ => 0,
                };
                Ok(Updated::Written(self.compact(key, record, token).await))
            }
            result => result,
        };
        if let Ok(Updated::Lost(_)) = &result {
            self.stats.conflicts += 1;
        }
        if let Some((grants, due)) = told {
            // As the stream's filter passes writes to the dispatcher.
            self.changed(key);
            // The wake beside the deliveries: neither waits for the other.
            let wake = async {
                if due {
                    self.granted_async(key, &[]).await;
                }
            };
            let deliver = async {
                if !grants.is_empty() {
                    self.granted_async(key, &grants).await;
                }
            };
            join(wake, deliver).await;
        }
        result
    }

    /// After `landed` (whose `NotHeld(holder)` the pool item could not
    /// check) left `record`: when another request of the same lease id was
    /// granted meanwhile, gives back what this one took (or takes its
    /// ticket out) and answers as a failed `NotHeld` would, with the record
    /// to decide from again. A few tries: the undo races other writes.
    async fn undo_duplicate(
        &mut self,
        key: &PoolKey,
        mut record: Record,
        holder: Holder,
        landed: &Update,
    ) -> Result<Updated, StoreError> {
        let mut undone = false;
        for _ in 0..8 {
            let Some(undo) = record.pool.duplicate_of(holder, landed, now_ms()) else {
                break;
            };
            let (lowered, _) = record.pool.lower(&undo);
            match self.call(self.store.update(key, &record, &lowered)).await? {
                Updated::Written(after) => {
                    // The undo may hand its slot to an async ticket.
                    if after.pool.line().active {
                        self.changed(key);
                        let grants = after.pool.async_grants_of_write(undo.fences());
                        if !grants.is_empty() {
                            self.granted_async(key, &grants).await;
                        }
                    }
                    record = after;
                    undone = true;
                    break;
                }
                Updated::Lost(after) => record = after,
                Updated::Gone => return Ok(Updated::Gone),
            }
        }
        Ok(if undone {
            Updated::Lost(record)
        } else {
            Updated::Written(record)
        })
    }

    /// Runs the compaction (or the split) `record`'s pool has due, if any,
    /// when the write that left it holds the pool's compaction claim
    /// (`token`, 0: it carried none; [`Pool::compaction_claim`]): the record
    /// after it, or as it was when it did not land (its claim then lapses,
    /// and a later write claims again).
    ///
    /// [`Pool::compaction_claim`]: crate::domain::Pool::compaction_claim
    async fn compact(&mut self, key: &PoolKey, record: Record, token: u64) -> Record {
        // A flat pool of a large count (stored before the split layout, or
        // resized past it) is split first: one write of the pool item.
        if let Some(split) = record.pool.plan_split(self.timing.compaction) {
            return match self.call(self.store.update(key, &record, &split)).await {
                Ok(Updated::Written(after)) => after,
                _ => record,
            };
        }
        if !record.pool.holds_compaction_claim(token) {
            return record;
        }
        let config = self.timing.compaction;
        let Some(mut plan) = record.pool.plan_compaction(config, now_ms()) else {
            return record;
        };
        let mut record = record;
        // A pool item write that lost (an entry it moves was written
        // meanwhile) is made again over the segments that landed, on the
        // item as the loss showed it: they are not written again. A few
        // times: each try conditions on fewer entries.
        let mut first = plan.clone();
        let mut landed: Option<Vec<u16>> = None;
        for _ in 0..3 {
            let lost = match self.call(self.store.compact(key, &record, &plan)).await {
                Ok(Updated::Written(after)) => return after,
                Ok(Updated::Lost(lost)) => lost,
                _ => return record,
            };
            if lost.incarnation != record.incarnation {
                return lost;
            }
            if lost == record {
                // The read as it was (a segment written by another
                // compaction, or a version moved): planned again on a
                // fresh read, while the claim is still ours.
                let fresh = match self.call(self.store.load(key)).await {
                    Ok(Some(fresh)) if fresh.incarnation == record.incarnation => fresh,
                    _ => return record,
                };
                let replanned = Some(&fresh)
                    .filter(|r| r.pool.holds_compaction_claim(token))
                    .and_then(|r| r.pool.plan_compaction(config, now_ms()));
                let Some(replanned) = replanned else {
                    return fresh;
                };
                (first, plan, landed, record) = (replanned.clone(), replanned, None, fresh);
                continue;
            }
            let Layout::Split(split) = lost.pool.layout() else {
                return lost;
            };
            let landed = landed.get_or_insert_with(|| {
                first
                    .segments
                    .iter()
                    .filter(|s| !s.slots.is_empty() && split.stored(s.segment) >= s.version)
                    .map(|s| s.segment)
                    .collect()
            });
            let Some(again) = first.again_on(&lost.pool, landed) else {
                return lost;
            };
            (plan, record) = (again, lost);
        }
        record
    }

    /// Tells the service's hook that the pool has grants for async tickets
    /// to deliver (`grants`, handed by a write; none when a slot is owed to
    /// an enqueue that found it free), by the time the request has left less
    /// [`HOOK_RESERVE`] for its own later calls: the table's stream stays the
    /// backstop of a hook cut short.
    pub(super) async fn granted_async(&self, key: &PoolKey, grants: &[(LeaseDigest, TicketGrant)]) {
        if let Some(hook) = self.on_async_grant {
            let now = Instant::now();
            let by = self
                .answer_by
                .checked_sub(HOOK_RESERVE)
                .unwrap_or(now)
                .max(now);
            let _ = tokio::time::timeout_at(by.into(), hook.granted(key, grants, by)).await;
        }
    }

    pub(super) fn changed(&self, key: &PoolKey) {
        if let Some(watch) = self.watch {
            watch(*key);
        }
    }

    /// Reads the pool, retrying failed reads while there is time.
    pub(super) async fn load(&mut self, key: &PoolKey) -> Result<Option<Record>, Error> {
        let mut failures = 0u32;
        loop {
            match self.call(self.store.load(key)).await {
                Ok(record) => return Ok(record),
                Err(err) => self.retry_after(err, &mut failures).await?,
            }
        }
    }

    pub(super) async fn load_existing(&mut self, key: &PoolKey) -> Result<Record, Error> {
        self.load(key).await?.ok_or(Error::PoolNotFound)
    }

    /// A waiter's nap (counted as waited), then the pool as it is after it.
    pub(super) async fn wait_then_load(
        &mut self,
        nap: Duration,
        key: &PoolKey,
    ) -> Result<Record, Error> {
        tokio::time::sleep(nap).await;
        self.stats.waited += nap;
        self.load_existing(key).await
    }

    /// After a write whose outcome is unknown: the pool as it is now, to see
    /// whether the write landed. The write's own error if no read succeeds.
    pub(super) async fn reload(
        &mut self,
        key: &PoolKey,
        err: StoreError,
    ) -> Result<Option<Record>, Error> {
        if !err.is_transient() {
            return Err(err.into());
        }
        // At once: the sooner we look, the less can have changed since.
        self.load(key).await
    }

    /// Naps before retrying a failed call; the error when there is no time.
    pub(super) async fn retry_after(
        &mut self,
        err: StoreError,
        failures: &mut u32,
    ) -> Result<(), Error> {
        if !err.is_transient() {
            return Err(err.into());
        }
        *failures += 1;
        self.nap(*failures, self.timing.retry)
            .await
            .map_err(|()| Error::from(err))
    }

    /// After a lost conditional write: retry at once (with the record it
    /// handed back) twice, then nap; past the answer-by time, too much
    /// contention. `Ok(true)` after a nap: the handed-back record is stale
    /// by then, so decide from a fresh read.
    pub(super) async fn lost(&mut self, lost: &mut u32) -> Result<bool, Error> {
        *lost += 1;
        if Instant::now() >= self.answer_by {
            return Err(Error::Contention);
        }
        const IMMEDIATE: u32 = 2;
        if *lost <= IMMEDIATE {
            return Ok(false);
        }
        self.nap(*lost - IMMEDIATE, self.timing.conflict)
            .await
            .map_err(|()| Error::Contention)?;
        Ok(true)
    }

    /// Sleeps the `n`th pause (from 1) of `backoff`, unless it would end
    /// past the answer-by time (then `Err`).
    async fn nap(&self, n: u32, backoff: Backoff) -> Result<(), ()> {
        let nap = backoff.pause(n - 1);
        if Instant::now() + nap + self.timing.call_timeout.min(Duration::from_millis(50))
            >= self.answer_by
        {
            return Err(());
        }
        tokio::time::sleep(nap).await;
        Ok(())
    }
}
