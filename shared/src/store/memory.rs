//! The embedded store: [`Pool::apply`](crate::domain::Pool::apply) over a map, with the same semantics as
//! the DynamoDB store's conditional writes. For the local default and tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use super::{
    may_move, Created, PoolStore, PutTicket, Record, StoreError, TicketStore, TicketUpdated,
    Updated, WakeStore,
};
use crate::domain::{
    CompactionPlan, DeliveryClaim, Expect, Layout, LeaseDigest, Pool, TicketGrant, TicketItem,
    TicketState, Update,
};
use crate::keys::PoolKey;

#[derive(Default)]
pub struct MemoryStore {
    pools: Mutex<HashMap<PoolKey, Record>>,
    /// Each pool's ticket items, by lease digest.
    tickets: Mutex<HashMap<PoolKey, BTreeMap<LeaseDigest, TicketItem>>>,
    /// Each pool's pending wake (Unix ms), as `wk` on a DynamoDB pool item.
    wakes: Mutex<HashMap<PoolKey, u64>>,
}

/// A lock whose holder panicked is still consistent: each write is a single
/// insert or field change.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn pools(&self) -> MutexGuard<'_, HashMap<PoolKey, Record>> {
        lock(&self.pools)
    }

    fn tickets(&self) -> MutexGuard<'_, HashMap<PoolKey, BTreeMap<LeaseDigest, TicketItem>>> {
        lock(&self.tickets)
    }
}

#[async_trait]
impl PoolStore for MemoryStore {
    async fn load(&self, key: &PoolKey) -> Result<Option<Record>, StoreError> {
        Ok(self.pools().get(key).cloned())
    }

    async fn create(&self, key: &PoolKey, record: &Record) -> Result<Created, StoreError> {
        let mut pools = self.pools();
        if let Some(existing) = pools.get(key) {
            return Ok(Created::Exists(existing.clone()));
        }
        pools.insert(*key, record.clone());
        Ok(Created::Created(record.clone()))
    }

    async fn update(
        &self,
        key: &PoolKey,
        read: &Record,
        update: &Update,
    ) -> Result<Updated, StoreError> {
        let mut pools = self.pools();
        let Some(current) = pools.get_mut(key) else {
            return Ok(Updated::Gone);
        };
        if current.incarnation != read.incarnation {
            return Ok(Updated::Lost(current.clone()));
        }
        let as_stored = as_stored(read, &current.pool, update);
        let Some(update) = as_stored.as_ref() else {
            return Ok(Updated::Lost(current.clone()));
        };
        match current.pool.apply(update) {
            Ok(next) => {
                current.pool = next;
                Ok(Updated::Written(current.clone()))
            }
            Err(_) => Ok(Updated::Lost(current.clone())),
        }
    }

    /// The pool here holds its segments itself: the pool item's write is
    /// all there is.
    async fn compact(
        &self,
        key: &PoolKey,
        read: &Record,
        plan: &CompactionPlan,
    ) -> Result<Updated, StoreError> {
        // The segment items first, each written only at the version the
        // plan read (as DynamoDB's conditional `PutItem`s): one written
        // ahead of the pool item shows, as it does there.
        let lost: Vec<u16> = {
            let mut pools = self.pools();
            let Some(current) = pools.get_mut(key) else {
                return Ok(Updated::Gone);
            };
            let mut lost = Vec::new();
            for segment in plan.segments.iter().filter(|s| !s.slots.is_empty()) {
                let stored = match current.pool.layout() {
                    Layout::Split(split) => split.stored(segment.segment),
                    Layout::Flat => segment.stored,
                };
                if stored == segment.stored && current.incarnation == read.incarnation {
                    current
                        .pool
                        .segment_written(segment.segment, segment.version);
                } else {
                    lost.push(segment.segment);
                }
            }
            lost
        };
        match plan.without(&lost) {
            Some(update) => self.update(key, read, &update).await,
            None => Ok(Updated::Lost(read.clone())),
        }
    }

    async fn delete(&self, key: &PoolKey) -> Result<bool, StoreError> {
        // The wake goes with the pool, as `wk` with its DynamoDB item.
        lock(&self.wakes).remove(key);
        Ok(self.pools().remove(key).is_some())
    }
}

/// `update` as DynamoDB checks it on the pool item as it is now: a write
/// planned on a flat pool that has been split since fails every condition
/// on the lists it names (`s[N]`, `g[N]`, `size(s)`: `None`), and finds no
/// holder in a list that is gone (`NOT contains(s, …)` holds).
fn as_stored(read: &Record, current: &Pool, update: &Update) -> Option<Update> {
    let split_since =
        matches!(read.pool.layout(), Layout::Flat) && matches!(current.layout(), Layout::Split(_));
    if !split_since {
        return Some(update.clone());
    }
    let mut update = update.clone();
    for expect in &update.expect {
        if matches!(
            expect,
            Expect::SlotFree(_)
                | Expect::SlotHeld(_)
                | Expect::SlotStamp { .. }
                | Expect::SlotsLen(_)
        ) {
            return None;
        }
    }
    update.expect.retain(|e| !matches!(e, Expect::NotHeld(_)));
    Some(update)
}

/// The DynamoDB store's conditions on `wk`, over a map.
#[async_trait]
impl WakeStore for MemoryStore {
    async fn arm_wake(
        &self,
        key: &PoolKey,
        at_ms: u64,
        now_ms: u64,
        handled: &[u64],
    ) -> Result<bool, StoreError> {
        if !self.pools().contains_key(key) {
            return Ok(false);
        }
        let mut wakes = lock(&self.wakes);
        let free = wakes
            .get(key)
            .is_none_or(|&wk| wk > at_ms || wk < now_ms || handled.contains(&wk));
        if free {
            wakes.insert(*key, at_ms);
        }
        Ok(free)
    }

    async fn disarm_wake(&self, key: &PoolKey, handled: &[u64]) -> Result<bool, StoreError> {
        let mut wakes = lock(&self.wakes);
        let pending = wakes.get(key).is_some_and(|wk| handled.contains(wk));
        if pending {
            wakes.remove(key);
        }
        Ok(pending)
    }
}

impl MemoryStore {
    /// The pool's pending wake, if any (tests).
    pub fn pending_wake(&self, key: &PoolKey) -> Option<u64> {
        lock(&self.wakes).get(key).copied()
    }
}

#[async_trait]
impl TicketStore for MemoryStore {
    async fn put_ticket(
        &self,
        key: &PoolKey,
        ticket: &TicketItem,
    ) -> Result<PutTicket, StoreError> {
        let mut tickets = self.tickets();
        let pool = tickets.entry(*key).or_default();
        if let Some(existing) = pool.get(&ticket.digest()) {
            return Ok(PutTicket::Exists(existing.clone()));
        }
        pool.insert(ticket.digest(), ticket.clone());
        Ok(PutTicket::Created)
    }

    async fn ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
    ) -> Result<Option<TicketItem>, StoreError> {
        Ok(self
            .tickets()
            .get(key)
            .and_then(|pool| pool.get(&digest))
            .cloned())
    }

    async fn backlog(
        &self,
        key: &PoolKey,
        from: u64,
        limit: usize,
    ) -> Result<Vec<TicketItem>, StoreError> {
        let mut found: Vec<TicketItem> = self
            .tickets()
            .get(key)
            .map(|pool| {
                pool.values()
                    .filter(|t| t.number >= from)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        found.sort_by_key(|t| t.number);
        found.truncate(limit);
        Ok(found)
    }

    async fn move_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        from: &TicketState,
        to: &TicketState,
    ) -> Result<TicketUpdated, StoreError> {
        let mut tickets = self.tickets();
        let Some(ticket) = tickets.get_mut(key).and_then(|pool| pool.get_mut(&digest)) else {
            return Ok(TicketUpdated::Gone);
        };
        // As DynamoDB's condition: the state's name, entered once per ticket.
        if ticket.state.name() != from.name() {
            return Ok(TicketUpdated::Lost(ticket.clone()));
        }
        ticket.state = to.clone();
        Ok(TicketUpdated::Written(ticket.clone()))
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
        let mut tickets = self.tickets();
        let Some(ticket) = tickets.get_mut(key).and_then(|pool| pool.get_mut(&digest)) else {
            return Ok(TicketUpdated::Gone);
        };
        if ticket.state.name() != from.name() {
            return Ok(TicketUpdated::Lost(ticket.clone()));
        }
        // One write, as DynamoDB's: the grant, and its first attempt claimed.
        ticket.state = granted;
        if let Some(claim) = claim {
            ticket.claim = Some(claim);
            ticket.attempts += 1;
        }
        Ok(TicketUpdated::Written(ticket.clone()))
    }

    async fn claim_attempt(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        fence: u64,
        claim: DeliveryClaim,
        now_ms: u64,
    ) -> Result<TicketUpdated, StoreError> {
        let mut tickets = self.tickets();
        let Some(ticket) = tickets.get_mut(key).and_then(|pool| pool.get_mut(&digest)) else {
            return Ok(TicketUpdated::Gone);
        };
        if !ticket.may_claim(fence, claim, now_ms) {
            return Ok(TicketUpdated::Lost(ticket.clone()));
        }
        ticket.claim = Some(claim);
        ticket.attempts += 1;
        Ok(TicketUpdated::Written(ticket.clone()))
    }

    async fn delete_ticket(
        &self,
        key: &PoolKey,
        digest: LeaseDigest,
        number: u64,
        incarnation: u64,
    ) -> Result<bool, StoreError> {
        let mut tickets = self.tickets();
        let Some(pool) = tickets.get_mut(key) else {
            return Ok(false);
        };
        let same = pool
            .get(&digest)
            .is_some_and(|t| t.number == number && t.incarnation == incarnation);
        if same {
            pool.remove(&digest);
        }
        Ok(same)
    }

    async fn delete_tickets(&self, key: &PoolKey) -> Result<usize, StoreError> {
        Ok(self.tickets().remove(key).map_or(0, |pool| pool.len()))
    }
}
