//! The dispatcher (async mode): after each change to a pool with async
//! tickets, [`Service::dispatch_step`] admits, hands on and records grants;
//! this delivers them to their callbacks with capped, jittered retries while
//! the lease is live and within a bound, then records `delivered`, or
//! `failed` with the reason and the lease returned. Every delivery is at
//! least once: a receiver drops a duplicate by its ticket and fence.
//!
//! [`Local`] runs it in-process (local-api), woken by the service's watch and
//! by timers at each pool's next expiry; in AWS the table's stream and a
//! wake queue do the same.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use semaphore_wire::{Backoff, Delivery, Jitter, Seconds};
use tokio::sync::mpsc;

use crate::callback::{Attempt, Caller};
use crate::clock::now_ms;
use crate::domain::{LeaseDigest, TicketGrant, TicketItem};
use crate::keys::PoolKey;
use crate::metrics::{AsyncLog, LogFormat, PoolKeyPrefix};
use crate::service::{Call, Service, ToDeliver};
use crate::Error;

/// Longest a grant may go undelivered: then its lease is returned and the
/// ticket fails (a receiver that stays down must not hold a slot longer).
pub const DELIVERY_BOUND: Duration = Duration::from_secs(60);

pub struct Dispatcher {
    service: Arc<Service>,
    caller: Caller,
    retry: Backoff,
    bound: Duration,
    /// Deliveries under way here: a step that sees one again (its ticket
    /// is listed until it ends) leaves it be.
    in_flight: Mutex<HashSet<(PoolKey, LeaseDigest)>>,
    log: LogFormat,
}

/// What a step leaves to do: deliveries to make now, and when to step the
/// pool again (Unix ms), while it has async tickets.
pub struct Stepped {
    pub deliver: Vec<ToDeliver>,
    pub wake_ms: Option<u64>,
}

impl Dispatcher {
    pub fn new(service: Arc<Service>, caller: Caller) -> Self {
        Dispatcher {
            service,
            caller,
            retry: Backoff {
                first: Duration::from_millis(100),
                cap: Duration::from_secs(5),
                jitter: Jitter::Equal,
            },
            bound: DELIVERY_BOUND,
            in_flight: Mutex::new(HashSet::new()),
            log: LogFormat::Text,
        }
    }

    /// How it writes its metric lines (Json: CloudWatch EMF, as in Lambda).
    pub fn with_log(mut self, log: LogFormat) -> Self {
        self.log = log;
        self
    }

    pub fn with_bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<(PoolKey, LeaseDigest)>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One step on the pool: the grants to deliver (none already under way
    /// here; each is marked under way until [`Dispatcher::deliver`] ends),
    /// and the pool's next wake.
    pub async fn step(&self, key: PoolKey) -> Result<Stepped, Error> {
        let delivering: Vec<LeaseDigest> = self
            .in_flight()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, digest)| *digest)
            .collect();
        let step = self
            .service
            .dispatch_step(&key, &delivering, &mut Call::new(None))
            .await?;
        if step.active {
            AsyncLog::Queue {
                pool: prefix(&key),
                depth: step.depth,
            }
            .emit(self.log);
        }
        let deliver = step
            .deliver
            .into_iter()
            .filter(|d| self.in_flight().insert((key, d.item.digest())))
            .collect();
        let wake_ms = match (step.active, step.wake_ms) {
            (false, _) => None,
            (true, Some(at)) => Some(at),
            // Active without a timer: look again in a while all the same.
            (true, None) => Some(now_ms() + 1_000),
        };
        Ok(Stepped { deliver, wake_ms })
    }

    /// Gives back deliveries a step handed out that the caller will not make
    /// (out of time): a later step hands them out again.
    pub fn abandon(&self, key: PoolKey, deliveries: &[ToDeliver]) {
        let mut in_flight = self.in_flight();
        for delivery in deliveries {
            in_flight.remove(&(key, delivery.item.digest()));
        }
    }

    /// Delivers one grant until the receiver takes it, refuses it, or the
    /// lease or the bound ends; records the outcome.
    pub async fn deliver(&self, key: PoolKey, delivery: ToDeliver) {
        let ToDeliver { item, grant } = delivery;
        self.deliver_once(key, &item, grant).await;
        self.in_flight().remove(&(key, item.digest()));
    }

    async fn deliver_once(&self, key: PoolKey, item: &TicketItem, grant: TicketGrant) {
        let Some(callback) = item.callback.clone() else {
            return;
        };
        let until = grant.expires_at_ms.min(
            grant
                .granted_ms
                .saturating_add(self.bound.as_millis() as u64),
        );
        let mut last = String::from("no attempt");
        let mut attempt = 0u32;
        let mut made = 0u32;
        let outcome = loop {
            let now = now_ms();
            if now >= until {
                break Err(format!(
                    "not delivered while its lease was live (within {} s): {last}",
                    until.saturating_sub(grant.granted_ms).div_ceil(1000)
                ));
            }
            let body = Delivery {
                ticket: item.number,
                position: grant.position.into(),
                fence: grant.fence,
                expires_at_unix: grant.expires_at_ms / 1000,
                expires_in: Seconds::from_millis(grant.expires_at_ms.saturating_sub(now).max(1)),
            };
            // The first attempt is implied by `granted`: only retries are
            // counted on the ticket (one write fewer per delivery).
            if made > 0 {
                let _ = self.service.count_attempt(&key, item).await;
            }
            made += 1;
            let sent = tokio::time::timeout(
                Duration::from_millis(until.saturating_sub(now)),
                self.caller.call(
                    &callback.url,
                    &callback.token,
                    semaphore_wire::to_json(&body),
                ),
            )
            .await
            .unwrap_or_else(|_| Attempt::Retry("the receiver did not answer in time".into()));
            match sent {
                Attempt::Delivered => break Ok(now_ms()),
                Attempt::Failed(reason) => break Err(reason),
                Attempt::Retry(reason) => last = reason,
            }
            let nap = self
                .retry
                .pause(attempt)
                .min(Duration::from_millis(until.saturating_sub(now_ms())));
            attempt += 1;
            tokio::time::sleep(nap).await;
        };
        AsyncLog::Delivery {
            pool: prefix(&key),
            delivered: outcome.is_ok(),
            attempts: made,
            since_enqueue: Duration::from_millis(now_ms().saturating_sub(item.joined_ms)),
        }
        .emit(self.log);
        let ended = self
            .service
            .delivery_ended(&key, item, grant, outcome, &mut Call::new(None))
            .await;
        if let Err(err) = ended {
            tracing::warn!(error = %err, "a delivery's outcome was not recorded");
        }
    }
}

fn prefix(key: &PoolKey) -> PoolKeyPrefix {
    PoolKeyPrefix([key.0[0], key.0[1], key.0[2], key.0[3]])
}

/// The dispatcher in-process: a task that steps each pool it is told of
/// (the service's watch) and again at each pool's wake time.
pub struct Local {
    tell: mpsc::UnboundedSender<PoolKey>,
    told: mpsc::UnboundedReceiver<PoolKey>,
}

impl Default for Local {
    fn default() -> Self {
        let (tell, told) = mpsc::unbounded_channel::<PoolKey>();
        Local { tell, told }
    }
}

impl Local {
    /// Its watch first (the service is built with it), then [`Local::start`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the task.
    pub fn start(self, dispatcher: Arc<Dispatcher>) {
        let Local { tell, mut told } = self;
        tokio::spawn(async move {
            let mut wakes: HashMap<PoolKey, u64> = HashMap::new();
            loop {
                let next = wakes.values().min().copied();
                let sleep = next.map_or(Duration::from_secs(3600), |at| {
                    Duration::from_millis(at.saturating_sub(now_ms()))
                });
                let mut due: Vec<PoolKey> = Vec::new();
                tokio::select! {
                    key = told.recv() => match key {
                        Some(key) => due.push(key),
                        None => return,
                    },
                    _ = tokio::time::sleep(sleep) => {}
                }
                // Every pool told of meanwhile, once.
                while let Ok(key) = told.try_recv() {
                    due.push(key);
                }
                let now = now_ms();
                due.extend(wakes.iter().filter(|(_, at)| **at <= now).map(|(k, _)| *k));
                due.sort_unstable_by_key(|k| k.0);
                due.dedup();
                for key in due {
                    match dispatcher.step(key).await {
                        Ok(stepped) => {
                            for delivery in stepped.deliver {
                                let (dispatcher, tell) = (dispatcher.clone(), tell.clone());
                                tokio::spawn(async move {
                                    dispatcher.deliver(key, delivery).await;
                                    // Its end may free a slot: step again.
                                    let _ = tell.send(key);
                                });
                            }
                            match stepped.wake_ms {
                                Some(at) => wakes.insert(key, at),
                                None => wakes.remove(&key),
                            };
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "dispatcher step failed; retrying");
                            wakes.insert(key, now_ms() + 500);
                        }
                    }
                }
            }
        });
    }

    /// The service's watch: tells the task which pool changed.
    pub fn watch(&self) -> crate::service::Watch {
        let tell = self.tell.clone();
        Arc::new(move |key| {
            let _ = tell.send(key);
        })
    }
}
