//! Issue #10: fair waiting under saturation, and the read load of many
//! waiters on one full pool (with the head waiter's wake delay).

use std::sync::Arc;
use std::time::{Duration, Instant};

use semaphore::clock::now_ms;
use semaphore::keys::LeaseId;
use semaphore::{Error, Limits};
use semaphore_tests::counting::{Counters, IN_RETURN};
use semaphore_tests::rng::Rng;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, timeout_at};

use crate::backend::{service_over, Breakdown};
use crate::report::{ReadLoadRow, SaturationRow};
use crate::scenarios::{call, fail, new_pool, per, request, seed, units, wall_us, Env, Strategy};
use crate::stats::{jain, round3, summarize};

/// The saturation scenario of issue #10.
#[derive(Clone, Copy, Debug)]
pub struct SaturationSpec {
    pub clients: usize,
    pub count: u16,
    pub hold: Duration,
    pub wait_ms: u64,
    /// How long clients start new borrows; those in flight then finish.
    pub seconds: f64,
}

impl SaturationSpec {
    pub fn issue_10(seconds: f64) -> Self {
        SaturationSpec {
            clients: 32,
            count: 4,
            hold: Duration::from_millis(200),
            wait_ms: 10_000,
            seconds,
        }
    }
}

/// Longer than the hold and a return: no lease of the run expires.
const SATURATION_TTL_MS: u64 = 10_000;

/// One borrow of a saturation run, in seconds since the run's start.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    client: usize,
    start: f64,
    done: f64,
    /// The fence of the grant (grant order); `None` for a 409.
    fence: Option<u64>,
    /// For a grant: ms from its hand-off (or take) to its answer.
    answered_after_ms: Option<f64>,
    /// For a grant: how long its return took, ms.
    return_ms: Option<f64>,
}

/// Grants in arrival order. A grant `g` is out of order when a borrower
/// that started waiting more than `start_slack` s before `g`'s borrower was
/// granted after `g` (a higher fence: fences rise in grant order) and more
/// than `grant_slack` s after it. With both slacks 0 this is the plain
/// definition; 409s are neither grants nor overtaken. Returns (in order,
/// grants).
fn in_order(attempts: &[Attempt], start_slack: f64, grant_slack: f64) -> (usize, usize) {
    let granted: Vec<(&Attempt, u64)> = attempts
        .iter()
        .filter_map(|a| a.fence.map(|f| (a, f)))
        .collect();
    let ok = granted
        .iter()
        .filter(|(g, fence)| {
            !granted.iter().any(|(h, later)| {
                h.start < g.start - start_slack && later > fence && h.done > g.done + grant_slack
            })
        })
        .count();
    (ok, granted.len())
}

/// 32 clients, each holding 200 ms, on a pool of count 4; every client
/// borrows again as soon as it has returned.
pub async fn saturation(
    env: &Env,
    strategy: Strategy,
    spec: SaturationSpec,
) -> Result<SaturationRow, String> {
    let setup = env.setup().await;
    let id = new_pool();
    setup
        .register(id, spec.count, &mut call())
        .await
        .map_err(fail("register"))?;
    let borrow_counters = Arc::new(Counters::default());
    let return_counters = Arc::new(Counters::default());
    let breakdown = Arc::new(Breakdown::default());
    let mut clients = Vec::with_capacity(spec.clients);
    for _ in 0..spec.clients {
        clients.push((
            env.worker(&borrow_counters, &breakdown, strategy).await,
            env.worker(&return_counters, &breakdown, strategy).await,
        ));
    }
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(spec.seconds);
    // Staggered starts: a first wave of simultaneous arrivals has no order.
    let stagger = spec.hold / (spec.clients as u32).max(1);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(client, (borrower, returner))| {
            tokio::spawn(async move {
                tokio::time::sleep(stagger * client as u32).await;
                let mut attempts = Vec::new();
                let mut errors = Vec::new();
                let mut returns = 0u64;
                while Instant::now() < end {
                    let start = t0.elapsed().as_secs_f64();
                    let outcome = borrower.borrow(id, SATURATION_TTL_MS, spec.wait_ms).await;
                    let done = t0.elapsed().as_secs_f64();
                    match outcome {
                        Ok(granted) => {
                            let fence = granted.as_ref().map(|g| g.fence);
                            // The lease ran from its grant: the ttl less what
                            // it had left is how long its answer took.
                            let answered_after_ms = granted
                                .as_ref()
                                .map(|g| SATURATION_TTL_MS.saturating_sub(g.left_ms) as f64);
                            attempts.push(Attempt {
                                client,
                                start,
                                done,
                                fence,
                                answered_after_ms,
                                return_ms: None,
                            });
                            if let Some(granted) = granted {
                                tokio::time::sleep(spec.hold).await;
                                let back = returner.give_back(id, granted.held);
                                let returning = Instant::now();
                                let outcome = IN_RETURN.scope(true, back).await;
                                if let Some(last) = attempts.last_mut() {
                                    last.return_ms =
                                        Some(returning.elapsed().as_secs_f64() * 1000.0);
                                }
                                match outcome {
                                    Ok(true) => returns += 1,
                                    Ok(false) => {
                                        return Err("a live lease did not return".to_string())
                                    }
                                    Err(e) => errors.push(format!("return: {e}")),
                                }
                            }
                        }
                        Err(e) => {
                            errors.push(format!("borrow: {e}"));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                Ok((attempts, errors, returns))
            })
        })
        .collect();
    let mut attempts = Vec::new();
    let mut errors = Vec::new();
    let mut returns = 0u64;
    for task in tasks {
        let (a, e, r) = task.await.map_err(|e| format!("client task: {e}"))??;
        attempts.extend(a);
        errors.extend(e);
        returns += r;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = setup.delete(id, &mut call()).await;

    let grants: Vec<&Attempt> = attempts.iter().filter(|a| a.fence.is_some()).collect();
    let refused = attempts.len() - grants.len();
    let waits: Vec<f64> = grants.iter().map(|a| (a.done - a.start) * 1000.0).collect();
    let mut per_client = vec![0.0; spec.clients];
    for a in &grants {
        per_client[a.client] += 1.0;
    }
    // Throughput between the first and the last grant; in a closed loop
    // with the slots always busy, Little's law gives every borrower of a
    // FIFO queue the same wait, (clients − count) / throughput.
    let first = grants.iter().map(|a| a.done).fold(f64::INFINITY, f64::min);
    let last = grants.iter().map(|a| a.done).fold(0.0, f64::max);
    let throughput = if grants.len() > 1 && last > first {
        (grants.len() - 1) as f64 / (last - first)
    } else {
        0.0
    };
    let waiting = spec.clients.saturating_sub(usize::from(spec.count)) as f64;
    let ideal_ms = if throughput > 0.0 {
        waiting / throughput * 1000.0
    } else {
        0.0
    };
    let zero_overhead_ms =
        waiting * spec.hold.as_secs_f64() * 1000.0 / f64::from(spec.count.max(1));
    let (strict, n) = in_order(&attempts, 0.0, 0.0);
    // Borrowers that joined within a store round trip of each other, or
    // were served by slots freed within one head poll of each other.
    let poll = env.timing.poll.as_secs_f64();
    let lenient = in_order(&attempts, 0.010, poll).0;
    let start_slack = in_order(&attempts, 0.010, 0.0).0;
    let grant_slack = in_order(&attempts, 0.0, poll).0;
    let wait = summarize(&waits);
    let answered_after: Vec<f64> = grants.iter().filter_map(|a| a.answered_after_ms).collect();
    let return_ms: Vec<f64> = grants.iter().filter_map(|a| a.return_ms).collect();
    let b = borrow_counters.snapshot();
    let r = return_counters.snapshot();
    let g = grants.len();
    let returned = returns as usize;
    Ok(SaturationRow {
        backend: env.backend.name().into(),
        strategy,
        latency_ms: env.backend.added_latency.as_millis() as u64,
        clients: spec.clients,
        count: spec.count,
        hold_ms: spec.hold.as_millis() as u64,
        wait_limit_ms: spec.wait_ms,
        seconds: round3(elapsed),
        borrows: attempts.len(),
        grants: g,
        refused,
        refused_rate: round3(refused as f64 / attempts.len().max(1) as f64),
        grants_per_s: round3(throughput),
        wait,
        ideal_fifo_wait_ms: round3(ideal_ms),
        zero_overhead_wait_ms: round3(zero_overhead_ms),
        max_over_ideal: round3(if ideal_ms > 0.0 {
            wait.max_ms / ideal_ms
        } else {
            0.0
        }),
        fairness: round3(jain(&per_client)),
        in_order: round3(strict as f64 / n.max(1) as f64),
        in_order_lenient: round3(lenient as f64 / n.max(1) as f64),
        in_order_start_10ms: round3(start_slack as f64 / n.max(1) as f64),
        in_order_grant_within_poll: round3(grant_slack as f64 / n.max(1) as f64),
        borrow_calls_per_grant: per(b.calls(), g),
        borrow_reads_per_grant: per(b.reads(), g),
        borrow_writes_per_grant: per(b.write_attempts(), g),
        borrow_conflicts_per_grant: per(b.conflicts, g),
        borrow_wcu_per_grant: units(b.model_wcu_milli, g),
        borrow_rcu_per_grant: units(b.model_rcu_milli, g),
        return_calls_per_return: per(r.calls(), returned),
        return_wcu_per_return: units(r.model_wcu_milli, returned),
        return_rcu_per_return: units(r.model_rcu_milli, returned),
        errors: errors.len() as u64,
        first_error: errors.first().cloned(),
        waits_ms: waits.iter().map(|w| round3(*w)).collect(),
        answered_after_grant: summarize(&answered_after),
        return_duration: summarize(&return_ms),
        writes_by_kind: breakdown.tallies(),
    })
}

/// The read-load scenario: `waiters` borrowers wait on one pool held full.
#[derive(Clone, Copy, Debug)]
pub struct ReadLoadSpec {
    pub waiters: usize,
    /// Reads are counted over this window, once every waiter has had time
    /// to start waiting.
    pub window: Duration,
    /// Then this many returns, one every `gap`: each lets the head in.
    pub returns: usize,
    /// Then this many expiries, one every `gap`.
    pub expiries: usize,
    pub gap: Duration,
}

/// How long a waiter's grant may take before the event counts as missed.
const MISSED_AFTER: Duration = Duration::from_secs(2);

/// A waiter's grant, as its task saw it.
struct Woken {
    at: Instant,
    wall_us: u128,
    lease: LeaseId,
}

pub async fn read_load(
    env: &Env,
    strategy: Strategy,
    spec: ReadLoadSpec,
) -> Result<ReadLoadRow, String> {
    if !strategy.is_service() {
        return Err("read load is measured for the service only".into());
    }
    let n = spec.waiters;
    let limits = Limits {
        max_wait_ms: 600_000,
        max_waiters: n.max(100) + 8,
        ..env.limits
    };
    let local = Env {
        limits,
        ..env.clone()
    };
    let mut rng = Rng::new(seed());
    let setup = local.setup().await;
    let id = new_pool();
    // One slot is returned over and over; the others expire one by one.
    let count = 1 + spec.expiries as u16;
    setup
        .register(id, count, &mut call())
        .await
        .map_err(fail("register"))?;

    let t0 = Instant::now();
    let ramp = Duration::from_millis(1500 + 3 * n as u64);
    let window_start = t0 + ramp;
    let window_end = window_start + spec.window;
    let returns_end = window_end + spec.gap * spec.returns as u32;
    let expiry_at: Vec<Instant> = (0..spec.expiries)
        .map(|j| {
            returns_end
                + spec.gap * (j as u32 + 1)
                + Duration::from_millis(rng.range(0, spec.gap.as_millis() as u64 / 4))
        })
        .collect();
    let finish = returns_end + spec.gap * (spec.expiries as u32 + 1) + MISSED_AFTER;

    let returnable = setup
        .borrow(id, request(600_000, 0), &mut call())
        .await
        .map_err(fail("holder borrow"))?;
    let mut expiring = Vec::with_capacity(spec.expiries);
    for at in &expiry_at {
        let ttl = at.saturating_duration_since(Instant::now()).as_millis() as u64;
        let grant = setup
            .borrow(id, request(ttl.max(1), 0), &mut call())
            .await
            .map_err(fail("holder borrow"))?;
        expiring.push(grant);
    }

    let counters = Arc::new(Counters::default());
    // One store client for all waiters (one connection pool): the reads
    // counted are the pool's, whoever makes them.
    let store = local.backend.store(&counters).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<Woken>();
    let wait_ms = (finish - Instant::now()).as_millis() as u64 + 5_000;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let service = service_over(store.clone(), local.timing, limits);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            match service
                .borrow(id, request(600_000, wait_ms), &mut call())
                .await
            {
                Ok(grant) => {
                    let _ = tx.send(Woken {
                        at: Instant::now(),
                        wall_us: wall_us(),
                        lease: grant.lease,
                    });
                    Ok(())
                }
                // The pool is deleted at the end of the run.
                Err(Error::PoolNotFound) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }));
    }
    drop(tx);

    sleep_until(window_start.into()).await;
    let inspect = local.backend.store(&Arc::new(Counters::default())).await;
    let queued = match inspect.load(&id.key()).await {
        Ok(Some(record)) => record.pool.waiting(now_ms()),
        _ => 0,
    };
    let active = tasks.iter().filter(|t| !t.is_finished()).count();
    let s0 = counters.snapshot();
    sleep_until(window_end.into()).await;
    let window = counters.snapshot().since(&s0);
    let window_s = spec.window.as_secs_f64();

    let mut missed = 0usize;
    let mut after_return = Vec::new();
    let mut current = Some(returnable.lease);
    for i in 0..spec.returns {
        let Some(lease) = current.take() else { break };
        let jitter = Duration::from_millis(rng.range(0, spec.gap.as_millis() as u64 / 2));
        sleep_until((window_end + spec.gap * i as u32 + jitter).into()).await;
        let returned = setup
            .return_lease(id, lease, &mut call())
            .await
            .map_err(fail("return"))?;
        if !returned {
            return Err("a live lease did not return".into());
        }
        let freed = Instant::now();
        match timeout(MISSED_AFTER, rx.recv()).await {
            Ok(Some(woken)) => {
                after_return.push(woken.at.saturating_duration_since(freed).as_secs_f64() * 1000.0);
                current = Some(woken.lease);
            }
            _ => missed += 1,
        }
    }
    let mut after_expiry = Vec::new();
    for (grant, at) in expiring.iter().zip(&expiry_at) {
        match timeout_at((*at + MISSED_AFTER).into(), rx.recv()).await {
            Ok(Some(woken)) => {
                let expired_us = u128::from(grant.expires_at_ms) * 1000;
                after_expiry.push(woken.wall_us.saturating_sub(expired_us) as f64 / 1000.0);
            }
            _ => missed += 1,
        }
    }
    let _ = setup.delete(id, &mut call()).await;
    // Waiters notice the delete at their next read (at most a poll cap away).
    let drain = Instant::now() + local.timing.poll_cap + Duration::from_secs(3);
    let mut errors = Vec::new();
    for task in tasks {
        let abort = task.abort_handle();
        match timeout_at(drain.into(), task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => errors.push(e),
            Ok(Err(e)) => errors.push(format!("waiter task: {e}")),
            Err(_) => {
                abort.abort();
                errors.push("a waiter did not notice the delete".into());
            }
        }
    }
    let reads = window.reads();
    Ok(ReadLoadRow {
        backend: env.backend.name().into(),
        strategy,
        latency_ms: env.backend.added_latency.as_millis() as u64,
        waiters: n,
        waiting_at_window: active,
        queued_at_window: queued,
        window_s: round3(window_s),
        reads,
        reads_per_s: round3(reads as f64 / window_s),
        reads_per_s_per_waiter: round3(reads as f64 / window_s / n.max(1) as f64),
        writes_per_s: round3(window.write_attempts() as f64 / window_s),
        rcu_per_s: round3(window.model_rcu_milli as f64 / 1000.0 / window_s),
        wake_after_return: summarize(&after_return),
        wake_after_expiry: summarize(&after_expiry),
        missed_wakes: missed,
        errors: errors.len() as u64,
        first_error: errors.first().cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(client: usize, start: f64, fence: u64) -> Attempt {
        Attempt {
            client,
            start,
            // Granted in fence order, one second per fence.
            done: fence as f64,
            fence: Some(fence),
            answered_after_ms: Some(0.0),
            return_ms: None,
        }
    }

    #[test]
    fn arrival_order_counts_grants_overtaking_earlier_waiters() {
        // Started 0, 1, 2; granted in the order 0, 2, 1: the grant of the
        // third overtook the second, which was still waiting.
        let attempts = [
            granted(0, 0.0, 10),
            granted(1, 1.0, 12),
            granted(2, 2.0, 11),
        ];
        assert_eq!(in_order(&attempts, 0.0, 0.0), (2, 3));
        // Within the start slack, the two arrivals count as simultaneous;
        // within the grant slack, the two grants do.
        assert_eq!(in_order(&attempts, 1.5, 0.0), (3, 3));
        assert_eq!(in_order(&attempts, 0.0, 1.5), (3, 3));
        // Refusals are neither grants nor overtaken.
        let refused = Attempt {
            fence: None,
            ..granted(3, 0.5, 0)
        };
        assert_eq!(in_order(&[attempts[0], refused], 0.0, 0.0), (1, 1));
        assert_eq!(in_order(&[], 0.0, 0.0), (0, 0));
    }
}
