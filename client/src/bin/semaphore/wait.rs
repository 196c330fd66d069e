//! Waiting for a slot (`borrow`, `run`): a status line on a terminal, and a
//! signal gives the wait up cleanly.

use std::convert::Infallible;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use semaphore_client::{Borrow, Error, Lease, Pool};

use crate::exit;
use crate::signals::{Received, Signals};

/// Why no lease came.
pub enum Stopped {
    /// The borrow failed: the error to report.
    Failed(Error),
    /// semaphore must exit with this status: it got a signal while waiting
    /// (128+N), or cannot handle signals.
    Exit(u8),
}

/// Borrows as `ask` says. A signal while waiting gives the borrow up: the
/// return of its lease UUID takes it out of the pool's queue, or returns the
/// slot if one was granted meanwhile, within a few seconds; then the exit
/// status for the signal.
pub async fn borrow(pool: &Pool, ask: Borrow) -> Result<Lease, Stopped> {
    let mut signals = Signals::new().map_err(|err| {
        eprintln!("semaphore: cannot handle signals: {err}");
        Stopped::Exit(exit::UNAVAILABLE)
    })?;
    borrow_with(pool, ask, &mut signals).await
}

/// [`borrow`] reading `signals`, which the caller goes on reading after.
pub async fn borrow_with(
    pool: &Pool,
    ask: Borrow,
    signals: &mut Signals,
) -> Result<Lease, Stopped> {
    let received: Received = tokio::select! {
        lease = pool.borrow(ask) => {
            clear_status_line();
            return lease.map_err(Stopped::Failed);
        }
        never = status_line(pool) => match never {},
        received = signals.recv() => received,
    };
    clear_status_line();
    // Dropping the borrow above sent the return of its lease UUID in the
    // background: that takes it out of the queue wherever its request waits
    // (API Gateway does not tell the function that its client hung up).
    // semaphore awaits it (`Client::settle`) before it exits.
    Err(Stopped::Exit(received.exit_code()))
}

/// While waiting on a terminal: one line on stderr, rewritten each second.
/// Never completes.
async fn status_line(pool: &Pool) -> Infallible {
    if !std::io::stderr().is_terminal() {
        return std::future::pending().await;
    }
    let started = Instant::now();
    let mut ticks = tokio::time::interval_at(
        (started + Duration::from_secs(1)).into(),
        Duration::from_secs(1),
    );
    loop {
        ticks.tick().await;
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2Ksemaphore: waiting for a slot in pool {}… {} s",
            pool.short_id(),
            started.elapsed().as_secs()
        );
        let _ = err.flush();
    }
}

fn clear_status_line() {
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}
