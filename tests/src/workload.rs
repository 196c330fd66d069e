//! A seeded random workload: concurrent clients send a random mix of every
//! call, through the HTTP layer, to service instances picked at random (as API
//! Gateway spreads requests over Lambda containers), on a few pools. Every
//! call is recorded for the history checker.
//!
//! The seed fixes each client's sequence of choices; timing (and so the
//! interleaving) still varies between runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::clock::now_ms;

use crate::harness::ApiClient;
use crate::history::{Call, History, Op};
use crate::rng::Rng;
use crate::truth;

/// The shape of a run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub seed: u64,
    pub clients: usize,
    pub pools: usize,
    /// Calls to send in all (setup included).
    pub operations: usize,
    /// Borrow ttl range, ms (inclusive).
    pub ttl_ms: (u64, u64),
    /// Waiting borrows' wait range, ms (inclusive).
    pub wait_ms: (u64, u64),
    /// Registers and resizes pick a count in `min_count ..= max_count`
    /// (a pool's first count and a re-register's at least 1).
    pub min_count: u32,
    pub max_count: u32,
    /// Pause between a client's calls: `0 ..= think_ms`.
    pub think_ms: u64,
    /// Relative weights of the call kinds, in [`Kind`] order.
    pub weights: [u32; KINDS],
}

pub const KINDS: usize = 11;

/// What a client does next (index into `Workload::weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    BorrowNow = 0,
    BorrowWaiting,
    ReturnOwn,
    ReturnStale,
    ReturnForeign,
    ReturnRandom,
    Resize,
    Inspect,
    DeleteAndRegister,
    /// A borrow that waits with a lease UUID of the client's, given up part
    /// way: the client sends the return of that UUID while it waits.
    BorrowGivingUp,
    /// A borrow whose client dies while it waits: no cancel, no answer.
    BorrowDying,
}

const ALL_KINDS: [Kind; KINDS] = [
    Kind::BorrowNow,
    Kind::BorrowWaiting,
    Kind::ReturnOwn,
    Kind::ReturnStale,
    Kind::ReturnForeign,
    Kind::ReturnRandom,
    Kind::Resize,
    Kind::Inspect,
    Kind::DeleteAndRegister,
    Kind::BorrowGivingUp,
    Kind::BorrowDying,
];

impl Workload {
    /// Short leases (so expiries happen mid-run) on small pools (so borrowers
    /// contend and wait).
    pub fn new(seed: u64, operations: usize) -> Self {
        Workload {
            seed,
            clients: 16,
            pools: 3,
            operations,
            ttl_ms: (50, 400),
            wait_ms: (50, 600),
            min_count: 0,
            max_count: 5,
            think_ms: 10,
            weights: [24, 18, 24, 4, 4, 3, 7, 8, 1, 6, 0],
        }
    }

    /// With clients that die while their borrow waits (`weight` of them in
    /// the mix).
    pub fn with_dying_waiters(mut self, weight: u32) -> Self {
        self.weights[Kind::BorrowDying as usize] = weight;
        self
    }

    /// Pools with room to spare: counts of 12 to 24 for 8 clients, so that
    /// borrowers find free slots (resizes still shrink pools below leases
    /// they hold, and raise them).
    pub fn with_room(mut self) -> Self {
        self.clients = 8;
        self.pools = 2;
        self.min_count = 12;
        self.max_count = 24;
        self
    }
}

/// A finished run.
pub struct Run {
    pub ops: Vec<Op>,
    /// Caller id → index in `ops` (see `crate::truth::CALLER`).
    pub callers: std::collections::HashMap<u64, usize>,
    /// The pools' UUIDs as registered.
    pub pools: Vec<String>,
    pub elapsed: Duration,
}

/// Runs `workload` over `instances` and returns everything recorded.
/// Client ids are `0 .. clients`; the setup registers are client `clients`.
pub async fn run(workload: &Workload, instances: &[Arc<ApiClient>]) -> Run {
    let started = Instant::now();
    let history = Arc::new(History::new());
    let mut rng = Rng::fork(workload.seed, u64::MAX);
    // Random (not seeded) ids: a rerun with the same seed against the same
    // DynamoDB Local must not find the previous run's pools.
    let pools: Arc<Vec<String>> = Arc::new(
        (0..workload.pools)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect(),
    );
    for pool in pools.iter() {
        let count = rng.range(
            u64::from(workload.min_count.max(1)),
            u64::from(workload.max_count),
        ) as u32;
        call(
            &instances[0],
            &history,
            workload.clients,
            pool,
            Call::Register { count },
        )
        .await;
    }
    let sent = Arc::new(AtomicUsize::new(history.len()));
    let tasks: Vec<_> = (0..workload.clients)
        .map(|client| {
            let mut state = Client {
                id: client,
                rng: Rng::fork(workload.seed, client as u64),
                workload: workload.clone(),
                instances: instances.to_vec(),
                history: history.clone(),
                pools: pools.clone(),
                held: Vec::new(),
                stale: Vec::new(),
            };
            let sent = sent.clone();
            tokio::spawn(async move {
                while sent.fetch_add(1, Ordering::Relaxed) < state.workload.operations {
                    state.step().await;
                    let pause = state.rng.range(0, state.workload.think_ms);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        if let Err(err) = task.await {
            std::panic::resume_unwind(err.into_panic());
        }
    }
    Run {
        ops: history.snapshot(),
        callers: history.callers(),
        pools: pools.to_vec(),
        elapsed: started.elapsed(),
    }
}

/// Sends one call through routing and the handler, as the local server does,
/// and records it. Returns the status and body.
pub async fn call(
    api: &ApiClient,
    history: &History,
    client: usize,
    pool: &str,
    what: Call,
) -> (u16, serde_json::Value) {
    call_or_die(api, history, client, pool, what, None).await
}

/// [`call`], but the client dies after `die_after` if the call has not
/// answered by then: its future is dropped (no cancel, no answer), and the
/// call is recorded with status [`NO_ANSWER`](crate::history::NO_ANSWER).
pub async fn call_or_die(
    api: &ApiClient,
    history: &History,
    client: usize,
    pool: &str,
    what: Call,
    die_after: Option<Duration>,
) -> (u16, serde_json::Value) {
    let (method, path, body) = match &what {
        Call::Register { count } => (
            "PUT",
            format!("/l/{pool}"),
            format!(r#"{{"count":{count}}}"#),
        ),
        Call::Inspect => ("GET", format!("/l/{pool}"), String::new()),
        Call::Delete => ("DELETE", format!("/l/{pool}"), String::new()),
        Call::Borrow {
            ttl_ms,
            wait_ms,
            lease,
        } => (
            "POST",
            format!("/l/{pool}/borrow"),
            match lease {
                Some(lease) => format!(
                    r#"{{"ttl":{},"wait":{},"lease":"{lease}"}}"#,
                    seconds(*ttl_ms),
                    seconds(*wait_ms)
                ),
                None => format!(
                    r#"{{"ttl":{},"wait":{}}}"#,
                    seconds(*ttl_ms),
                    seconds(*wait_ms)
                ),
            },
        ),
        Call::Return { lease } => (
            "POST",
            format!("/l/{pool}/return"),
            format!(r#"{{"lease":"{lease}"}}"#),
        ),
    };
    let caller = truth::next_caller();
    let invoke_ms = now_ms();
    let request = truth::CALLER.scope(caller, api.raw(method, &path, body.as_bytes(), None));
    let (status, body) = match die_after {
        None => {
            let response = request.await;
            (response.status, response.body)
        }
        Some(after) => {
            tokio::select! {
                response = request => (response.status, response.body),
                _ = tokio::time::sleep(after) => (crate::history::NO_ANSWER, serde_json::Value::Null),
            }
        }
    };
    let response_ms = now_ms();
    let index = history.record(Op {
        client,
        pool: pool.to_string(),
        call: what,
        status,
        body: body.clone(),
        invoke_ms,
        response_ms,
    });
    history.note_caller(caller, index);
    (status, body)
}

/// Milliseconds as the JSON seconds the API takes (fractions allowed).
fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// A lease a client got: its pool (index), UUID, and when it surely expired.
#[derive(Clone, Debug)]
struct Held {
    pool: usize,
    lease: String,
    expired_by_ms: u64,
}

struct Client {
    id: usize,
    rng: Rng,
    workload: Workload,
    instances: Vec<Arc<ApiClient>>,
    history: Arc<History>,
    pools: Arc<Vec<String>>,
    held: Vec<Held>,
    /// Returned or expired leases, for stale and foreign returns.
    stale: Vec<Held>,
}

impl Client {
    async fn step(&mut self) {
        let now = now_ms();
        let (expired, live): (Vec<Held>, Vec<Held>) =
            self.held.drain(..).partition(|h| h.expired_by_ms <= now);
        self.held = live;
        for lease in expired {
            self.retire(lease);
        }
        let kind = ALL_KINDS[self.rng.weighted(&self.workload.weights)];
        let pool = self.rng.range(0, self.pools.len() as u64 - 1) as usize;
        match kind {
            Kind::BorrowNow | Kind::BorrowWaiting => {
                let wait_ms = match kind {
                    Kind::BorrowWaiting => self
                        .rng
                        .range(self.workload.wait_ms.0, self.workload.wait_ms.1),
                    _ => 0,
                };
                self.borrow(pool, wait_ms).await;
            }
            Kind::ReturnOwn if !self.held.is_empty() => {
                let k = self.rng.range(0, self.held.len() as u64 - 1) as usize;
                let lease = self.held.swap_remove(k);
                self.send(
                    lease.pool,
                    Call::Return {
                        lease: lease.lease.clone(),
                    },
                )
                .await;
                self.retire(lease);
            }
            Kind::ReturnOwn => self.borrow(pool, 0).await,
            Kind::ReturnStale => match self.rng.pick(&self.stale).cloned() {
                Some(lease) => {
                    self.send(lease.pool, Call::Return { lease: lease.lease })
                        .await;
                }
                None => self.inspect(pool).await,
            },
            Kind::ReturnForeign => {
                let foreign: Vec<Held> = self
                    .held
                    .iter()
                    .chain(&self.stale)
                    .filter(|h| h.pool != pool)
                    .cloned()
                    .collect();
                let lease = match self.rng.pick(&foreign) {
                    Some(h) => h.lease.clone(),
                    None => self.random_uuid(),
                };
                self.send(pool, Call::Return { lease }).await;
            }
            Kind::ReturnRandom => {
                let lease = self.random_uuid();
                self.send(pool, Call::Return { lease }).await;
            }
            Kind::Resize => {
                let count = self.rng.range(
                    u64::from(self.workload.min_count),
                    u64::from(self.workload.max_count),
                ) as u32;
                self.send(pool, Call::Register { count }).await;
            }
            Kind::Inspect => self.inspect(pool).await,
            Kind::DeleteAndRegister => {
                self.send(pool, Call::Delete).await;
                let count = self.rng.range(
                    u64::from(self.workload.min_count.max(1)),
                    u64::from(self.workload.max_count),
                ) as u32;
                self.send(pool, Call::Register { count }).await;
            }
            Kind::BorrowGivingUp => self.borrow_giving_up(pool).await,
            Kind::BorrowDying => {
                let ttl_ms = self.ttl();
                let wait_ms = self.wait();
                let die_after = Duration::from_millis(self.rng.range(1, wait_ms));
                let instance = self.instance();
                let borrow = Call::Borrow {
                    ttl_ms,
                    wait_ms,
                    lease: None,
                };
                let id = self.pools[pool].clone();
                call_or_die(
                    &self.instances[instance],
                    &self.history,
                    self.id,
                    &id,
                    borrow,
                    Some(die_after),
                )
                .await;
                // Whatever it got, it is gone: nothing is held by it.
            }
        }
    }

    fn ttl(&mut self) -> u64 {
        self.rng
            .range(self.workload.ttl_ms.0, self.workload.ttl_ms.1)
    }

    fn wait(&mut self) -> u64 {
        self.rng
            .range(self.workload.wait_ms.0, self.workload.wait_ms.1)
    }

    fn instance(&mut self) -> usize {
        self.rng.range(0, self.instances.len() as u64 - 1) as usize
    }

    /// A waiting borrow with its own lease UUID, and, part way through its
    /// wait, the return of that UUID (sent on another instance, as a client
    /// giving up would); a lease it was granted and the return did not end
    /// is held.
    async fn borrow_giving_up(&mut self, pool: usize) {
        let ttl_ms = self.ttl();
        let wait_ms = self.wait();
        let lease = self.random_uuid();
        // After its borrow has surely reached the pool (a return that
        // overtakes it is remembered, within limits, and tested apart).
        let give_up_after = Duration::from_millis(self.rng.range(20.min(wait_ms), wait_ms));
        let (borrow_at, return_at) = (self.instance(), self.instance());
        let id = self.pools[pool].clone();
        let borrow = call(
            &self.instances[borrow_at],
            &self.history,
            self.id,
            &id,
            Call::Borrow {
                ttl_ms,
                wait_ms,
                lease: Some(lease.clone()),
            },
        );
        let give_up = async {
            tokio::time::sleep(give_up_after).await;
            call(
                &self.instances[return_at],
                &self.history,
                self.id,
                &id,
                Call::Return {
                    lease: lease.clone(),
                },
            )
            .await
        };
        let ((status, body), (_, returned)) = tokio::join!(borrow, give_up);
        let ttl = body["expires_in"].as_f64();
        if let (200, Some(false), Some(ttl)) = (status, returned["returned"].as_bool(), ttl) {
            // Granted after the return was answered: held (the checker flags
            // this if the return came before the grant).
            self.held.push(Held {
                pool,
                lease,
                expired_by_ms: now_ms() + (ttl * 1000.0).round() as u64,
            });
        }
    }

    async fn borrow(&mut self, pool: usize, wait_ms: u64) {
        let ttl_ms = self.ttl();
        let (status, body) = self
            .send(
                pool,
                Call::Borrow {
                    ttl_ms,
                    wait_ms,
                    lease: None,
                },
            )
            .await;
        let lease = body["lease"].as_str().map(str::to_owned);
        let ttl = body["expires_in"].as_f64();
        if let (200, Some(lease), Some(ttl)) = (status, lease, ttl) {
            self.held.push(Held {
                pool,
                lease,
                expired_by_ms: now_ms() + (ttl * 1000.0).round() as u64,
            });
        }
    }

    async fn inspect(&mut self, pool: usize) {
        self.send(pool, Call::Inspect).await;
    }

    fn retire(&mut self, lease: Held) {
        if self.stale.len() >= 32 {
            let k = self.rng.range(0, 31) as usize;
            self.stale.swap_remove(k);
        }
        self.stale.push(lease);
    }

    fn random_uuid(&mut self) -> String {
        let bytes =
            (u128::from(self.rng.next_u64()) << 64 | u128::from(self.rng.next_u64())).to_le_bytes();
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }

    /// One call on a random instance; the pool id is sometimes sent in upper
    /// case (ids are case-insensitive).
    async fn send(&mut self, pool: usize, what: Call) -> (u16, serde_json::Value) {
        let instance = self.instance();
        let id = if self.rng.chance(0.05) {
            self.pools[pool].to_uppercase()
        } else {
            self.pools[pool].clone()
        };
        call(&self.instances[instance], &self.history, self.id, &id, what).await
    }
}
