//! `semaphore run`: COMMAND under a lease, like `flock`, `consul lock` and
//! `etcdctl lock`.

use std::convert::Infallible;
use std::io::{IsTerminal, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use semaphore_client::{format_seconds, Borrow, Error, Lease, Pool, Uuid};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::{exit, report, RunArgs};

pub const LONG_ABOUT: &str = "\
Borrow a slot of the pool, run COMMAND while holding it, and return the slot when \
COMMAND exits. Exits with COMMAND's status (128+N if it died of signal N).

COMMAND gets SEMAPHORE_LEASE, SEMAPHORE_POSITION, SEMAPHORE_EXPIRES_AT (Unix seconds), \
SEMAPHORE_FENCE (the fencing token), SEMAPHORE_POOL and SEMAPHORE_URL in its environment.

If no slot frees up within --wait, COMMAND does not run and semaphore exits 1 (or -E's \
CODE). While it waits on a terminal, a status line on stderr shows the seconds waited.

If the lease's ttl runs out while COMMAND still runs, COMMAND gets SIGTERM, then SIGKILL \
after --kill-after seconds, and semaphore exits 124. Choose a ttl longer than COMMAND can \
take: a lease cannot be extended.

On SIGINT, SIGTERM or SIGHUP, semaphore passes the signal on to COMMAND, waits for it to \
exit (SIGKILL after --kill-after, or at a second signal), returns the slot and exits \
128+N.

Example, a lock with a 10-minute timeout, waiting up to 5 minutes for it:

    semaphore run --pool $P --ttl 600 --wait 300 -- ./deploy.sh";

/// SIGINT, SIGTERM and SIGHUP, as one stream.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

pub async fn run(pool: &Pool, url: &str, args: RunArgs) -> u8 {
    // Before borrowing: a signal while waiting must not kill semaphore
    // between the grant and the child's start.
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("semaphore: cannot handle signals: {err}");
            return exit::UNAVAILABLE;
        }
    };
    let lease_id = Uuid::new_v4();
    let lease = tokio::select! {
        lease = pool.borrow(Borrow::ttl(args.ttl).wait(args.wait).lease_id(lease_id)) => lease,
        never = status_line(pool) => match never {},
        signal = signals.recv() => {
            clear_status_line();
            // The borrow may have been granted without the answer reaching us:
            // its lease UUID is ours, so give back whatever it got.
            let _ = tokio::time::timeout(Duration::from_secs(3), pool.return_lease(lease_id)).await;
            return 128 + signal as u8;
        }
    };
    clear_status_line();
    let lease = match lease {
        Ok(lease) => lease,
        Err(err) => return report(pool, &err, args.conflict_exit_code),
    };

    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return exit::USAGE,
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("SEMAPHORE_URL", url)
        .env("SEMAPHORE_POOL", pool.id().hyphenated().to_string())
        .env("SEMAPHORE_LEASE", lease.id().hyphenated().to_string())
        .env("SEMAPHORE_POSITION", lease.position().to_string())
        .env(
            "SEMAPHORE_EXPIRES_AT",
            lease.grant().expires_at_unix.to_string(),
        );
    match lease.fence() {
        Some(fence) => command.env("SEMAPHORE_FENCE", fence.to_string()),
        // Never a fence inherited from an outer `semaphore run`.
        None => command.env_remove("SEMAPHORE_FENCE"),
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("semaphore: cannot run {}: {err}", program.to_string_lossy());
            give_back(lease).await;
            return if err.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
        }
    };

    let code = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => exit_code(status),
            Err(err) => {
                eprintln!("semaphore: cannot wait for COMMAND: {err}");
                exit::UNAVAILABLE
            }
        },
        signal = signals.recv() => {
            stop(&mut child, signal, args.kill_after, &mut signals).await;
            128 + signal as u8
        }
        _ = tokio::time::sleep_until(lease.deadline().into()) => {
            eprintln!(
                "semaphore: the lease on pool {} ran out (ttl {}) while COMMAND still ran; \
                 stopping it: SIGTERM, SIGKILL after {}",
                pool.short_id(),
                format_seconds(args.ttl),
                format_seconds(args.kill_after),
            );
            stop(&mut child, Signal::SIGTERM, args.kill_after, &mut signals).await;
            exit::TIMED_OUT
        }
    };
    give_back(lease).await;
    code
}

/// Sends `first` to the child, then SIGKILL after `grace` or at the next
/// signal semaphore gets, and waits for it to exit.
async fn stop(child: &mut Child, first: Signal, grace: Duration, signals: &mut Signals) {
    send(child, first);
    let deadline = Instant::now() + grace;
    tokio::select! {
        _ = child.wait() => return,
        _ = tokio::time::sleep_until(deadline.into()) => {}
        _ = signals.recv() => {}
    }
    send(child, Signal::SIGKILL);
    let _ = child.wait().await;
}

fn send(child: &Child, signal: Signal) {
    // `id()` is None once the child was reaped: then there is nothing to
    // signal, and no risk of signalling a recycled pid.
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// COMMAND's status as semaphore's: its code, or 128+N for signal N.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => exit::UNAVAILABLE,
    }
}

/// Returns the lease; a failure only costs the slot until its ttl ends.
async fn give_back(lease: Lease) {
    let short = lease.pool().short_id();
    if let Err(err) = lease.release().await {
        let when = match err {
            Error::PoolNotFound => "the pool is gone".to_string(),
            err => format!("{err}; the slot frees itself when the ttl ends"),
        };
        eprintln!("semaphore: pool {short}: could not return the lease: {when}");
    }
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
