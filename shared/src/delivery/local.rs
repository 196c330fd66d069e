//! The dispatcher in-process (local-api): woken by the service's watch and
//! by timers at each pool's next wake.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Dispatcher;
use crate::clock::now_ms;
use crate::keys::PoolKey;

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
                    // Each delivery starts as soon as the step claims it.
                    let mut deliveries = JoinSet::new();
                    let stepped = dispatcher.step_and_deliver(key, &mut deliveries).await;
                    let tell_after = tell.clone();
                    tokio::spawn(async move {
                        // Each end may free a slot: step again.
                        while deliveries.join_next().await.is_some() {
                            let _ = tell_after.send(key);
                        }
                    });
                    match stepped {
                        Ok(stepped) => {
                            for delivery in stepped.deliver {
                                let (dispatcher, tell) = (dispatcher.clone(), tell.clone());
                                tokio::spawn(async move {
                                    dispatcher.deliver(key, delivery).await;
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
