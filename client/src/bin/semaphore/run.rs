//! `semaphore run`: COMMAND under a lease, like `flock`, `consul lock` and
//! `etcdctl lock`, and stopped before the lease ends, like `timeout`.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use semaphore_client::{format_seconds, Borrow, Error, Lease, Pool};
use tokio::process::{Child, Command};

use crate::signals::{Received, Signals};
use crate::wait::{self, Stopped};
use crate::{exit, report, RunArgs};

pub const LONG_ABOUT: &str = "\
Borrow a slot of the pool, run COMMAND while holding it, and return the slot when \
COMMAND exits. Exits with COMMAND's status (128+N if it died of signal N).

COMMAND gets SEMAPHORE_LEASE, SEMAPHORE_POSITION, SEMAPHORE_EXPIRES_AT (Unix seconds), \
SEMAPHORE_FENCE (the fencing token), SEMAPHORE_POOL and SEMAPHORE_URL in its environment.

If no slot frees up within --wait, COMMAND does not run and semaphore exits 1 (or -E's \
CODE). While it waits on a terminal, a status line on stderr shows the seconds waited. \
A signal while it waits gives its place in the queue up.

COMMAND is stopped before the lease ends, so that the next holder never runs alongside it. \
The lease ends when the service's answer says: semaphore counts the time it granted \
from when the answer arrived (the service may shorten --ttl to its maximum; semaphore \
then warns). Just before that end (by 1 % of the lease's time, 0.1 s to 1 s, for the \
answer's time in transit), COMMAND gets SIGKILL; --kill-after seconds earlier, SIGTERM. \
semaphore then exits 124. --kill-after is by default a tenth of the lease's time, at \
most 10 s, so a short ttl leaves COMMAND most of it. A lease cannot be extended: choose \
a ttl longer than COMMAND can take.

COMMAND runs in a process group of its own, and signals go to that whole group, so the \
processes it started stop with it. It cannot read from the terminal then: for a \
COMMAND that does, pass --foreground, which keeps it in semaphore's process group (and \
so in the terminal's foreground); signals then go to COMMAND alone.

COMMAND dies with semaphore: if semaphore is killed, even by SIGKILL, COMMAND gets \
SIGKILL (Linux), since it would otherwise run on without anyone stopping it in time.

On SIGINT, SIGTERM, SIGHUP or SIGQUIT, semaphore passes the signal on to COMMAND, waits \
for it to exit (SIGKILL after --kill-after, at a second signal, and in any case before \
the lease ends), returns the slot and exits 128+N. COMMAND gets each signal once: one \
that a terminal sent to COMMAND's process group itself (Ctrl-C, Ctrl-\\ with \
--foreground) is not passed on again.

Example, a lock with a 10-minute timeout, waiting up to 5 minutes for it:

    semaphore run --pool $P --ttl 600 --wait 300 -- ./deploy.sh";

/// SIGKILL comes this share of the lease's time before its end (within
/// the bounds below): the end is counted from when the answer arrived, so it
/// is late by the answer's time in transit, and the kill itself takes a
/// moment (a timer fires late on a busy machine, the signal is delivered).
const KILL_MARGIN_SHARE: f64 = 0.01;
const KILL_MARGIN_MIN: Duration = Duration::from_millis(100);
const KILL_MARGIN_MAX: Duration = Duration::from_secs(1);
/// The default --kill-after: this share of the time until SIGKILL, at most
/// the cap, so that a 2 s lease still leaves COMMAND 1.7 s.
const KILL_AFTER_SHARE: u32 = 10;
const KILL_AFTER_CAP: Duration = Duration::from_secs(10);

fn kill_margin(lease_time: Duration) -> Duration {
    lease_time
        .mul_f64(KILL_MARGIN_SHARE)
        .clamp(KILL_MARGIN_MIN, KILL_MARGIN_MAX)
}

fn default_kill_after(until_kill: Duration) -> Duration {
    (until_kill / KILL_AFTER_SHARE).min(KILL_AFTER_CAP)
}

pub async fn run(pool: &Pool, url: &str, args: RunArgs) -> u8 {
    if let Some(kill_after) = args.kill_after {
        let room = args.ttl.saturating_sub(kill_margin(args.ttl));
        if kill_after >= room {
            eprintln!(
                "semaphore: --kill-after {} leaves COMMAND no time under --ttl {}: SIGKILL \
                 comes {} before the lease ends, and SIGTERM --kill-after before that",
                format_seconds(kill_after),
                format_seconds(args.ttl),
                format_seconds(kill_margin(args.ttl)),
            );
            return exit::USAGE;
        }
    }
    // Before borrowing: a signal while waiting must not kill semaphore
    // between the grant and the child's start.
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("semaphore: cannot handle signals: {err}");
            return exit::UNAVAILABLE;
        }
    };
    let ask = Borrow::ttl(args.ttl).wait(args.wait);
    let lease = match wait::borrow_with(pool, ask, &mut signals).await {
        Ok(lease) => lease,
        Err(Stopped::Failed(err)) => return report(pool, &err, args.conflict_exit_code),
        Err(Stopped::Exit(code)) => return code,
    };
    let Some(schedule) = Schedule::new(pool, &lease, &args) else {
        let _ = give_back(lease).await;
        return exit::TIMED_OUT;
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
    if !args.foreground {
        // Its own process group (its pgid is its pid), so that stopping it
        // reaches the processes it started: a shell script's children would
        // otherwise run on after the script is killed, past the lease.
        command.process_group(0);
    }
    die_with_semaphore(&mut command);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("semaphore: cannot run {}: {err}", program.to_string_lossy());
            let _ = give_back(lease).await;
            return if err.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
        }
    };
    // Its process group's id is its pid, kept to reach what it leaves
    // behind once it is reaped.
    let group = match args.foreground {
        true => None,
        false => child.id().and_then(|pid| i32::try_from(pid).ok()),
    };
    let mut running = Running {
        child,
        group: group.map(Pid::from_raw),
    };
    let code = running.supervise(&schedule, &mut signals).await;
    let pool_gone = give_back(lease).await;
    if code == 0 && pool_gone {
        // COMMAND succeeded, but not under the pool's protection all along:
        // whoever deleted the pool freed every slot while it ran.
        eprintln!("semaphore: the pool was deleted while COMMAND ran: exiting 66");
        return exit::NO_POOL;
    }
    code
}

/// When COMMAND is stopped, by this process's clock.
struct Schedule {
    /// SIGTERM, by the lease's end.
    term_at: Instant,
    /// SIGKILL, so that COMMAND is dead when the lease ends.
    kill_at: Instant,
    /// Between SIGTERM and SIGKILL when a signal stops COMMAND.
    kill_after: Duration,
    /// The lease's end.
    ends_at: Instant,
    short_id: String,
    granted: Duration,
}

impl Schedule {
    /// The schedule for `lease`, with warnings on stderr when the service
    /// shortened the ttl or --kill-after does not fit; `None` (and why, on
    /// stderr) when the lease has too little time left to start COMMAND.
    fn new(pool: &Pool, lease: &Lease, args: &RunArgs) -> Option<Schedule> {
        let short_id = pool.short_id();
        let now = Instant::now();
        let granted = lease.grant().expires_in.as_duration();
        if lease.ttl_clamped() {
            eprintln!(
                "semaphore: pool {short_id}: warning: the service shortened the ttl: the \
                 lease ends in {}, not the {} asked (its MAX_TTL_SECONDS); COMMAND is \
                 stopped before then",
                format_seconds(granted),
                format_seconds(args.ttl),
            );
        }
        let left = lease.deadline().saturating_duration_since(now);
        let kill_at = lease
            .deadline()
            .checked_sub(kill_margin(left))
            .unwrap_or(now);
        let until_kill = kill_at.saturating_duration_since(now);
        if until_kill.is_zero() {
            eprintln!(
                "semaphore: pool {short_id}: the lease granted ends in {}: too soon to \
                 start COMMAND",
                format_seconds(left),
            );
            return None;
        }
        let kill_after = match args.kill_after {
            None => default_kill_after(until_kill),
            Some(kill_after) if kill_after < until_kill => kill_after,
            Some(kill_after) => {
                let fits = default_kill_after(until_kill);
                eprintln!(
                    "semaphore: pool {short_id}: warning: --kill-after {} does not fit in \
                     the {} the lease has left: SIGTERM {} before SIGKILL instead",
                    format_seconds(kill_after),
                    format_seconds(left),
                    format_seconds(fits),
                );
                fits
            }
        };
        Some(Schedule {
            term_at: kill_at - kill_after,
            kill_at,
            kill_after,
            ends_at: lease.deadline(),
            short_id,
            granted,
        })
    }
}

/// Why semaphore is stopping COMMAND.
#[derive(Clone, Copy)]
enum Stopping {
    /// The lease is about to end: exit 124.
    Expiry,
    /// semaphore got this signal: exit 128+N.
    Signal(Received),
}

impl Stopping {
    fn exit_code(self) -> u8 {
        match self {
            Stopping::Expiry => exit::TIMED_OUT,
            Stopping::Signal(received) => received.exit_code(),
        }
    }
}

struct Running {
    child: Child,
    /// The process group COMMAND leads (not with --foreground): signals go
    /// to the whole group.
    group: Option<Pid>,
}

impl Running {
    /// Waits for COMMAND, stopping it on schedule or on a signal; semaphore's
    /// exit status.
    async fn supervise(&mut self, schedule: &Schedule, signals: &mut Signals) -> u8 {
        let mut stopping: Option<Stopping> = None;
        // SIGKILL at the latest then; sooner after a signal.
        let mut kill_at = schedule.kill_at;
        loop {
            tokio::select! {
                status = self.child.wait() => {
                    let code = match status {
                        Ok(status) => exit_code(status),
                        Err(err) => {
                            eprintln!("semaphore: cannot wait for COMMAND: {err}");
                            exit::UNAVAILABLE
                        }
                    };
                    return match stopping {
                        Some(stopping) => {
                            // What COMMAND started and left behind is stopped too.
                            self.send_to_group(Signal::SIGKILL);
                            stopping.exit_code()
                        }
                        None => code,
                    };
                }
                _ = tokio::time::sleep_until(schedule.term_at.into()), if stopping.is_none() => {
                    eprintln!(
                        "semaphore: pool {}: the lease runs out in {} (the service granted \
                         {}): stopping COMMAND: SIGTERM now, SIGKILL in {}",
                        schedule.short_id,
                        format_seconds(schedule.ends_at.saturating_duration_since(schedule.term_at)),
                        format_seconds(schedule.granted),
                        format_seconds(schedule.kill_after),
                    );
                    stopping = Some(Stopping::Expiry);
                    self.send(Signal::SIGTERM);
                }
                _ = tokio::time::sleep_until(kill_at.into()) => {
                    if stopping.is_none() {
                        stopping = Some(Stopping::Expiry);
                    }
                    return self.kill(stopping).await;
                }
                received = signals.recv() => {
                    if stopping.is_some() {
                        // A second signal: no more waiting.
                        return self.kill(stopping).await;
                    }
                    stopping = Some(Stopping::Signal(received));
                    if !self.got_it_from_the_terminal(received) {
                        self.send(received.signal);
                    }
                    kill_at = kill_at.min(Instant::now() + schedule.kill_after);
                }
            }
        }
    }

    /// SIGKILL, then the exit status once COMMAND is reaped.
    async fn kill(&mut self, stopping: Option<Stopping>) -> u8 {
        self.send(Signal::SIGKILL);
        let status = self.child.wait().await;
        match (stopping, status) {
            (Some(stopping), _) => stopping.exit_code(),
            (None, Ok(status)) => exit_code(status),
            (None, Err(_)) => exit::UNAVAILABLE,
        }
    }

    /// Whether a terminal already sent `received` to COMMAND: it came from
    /// the kernel, which sends a terminal's Ctrl-C, Ctrl-\ and hangup to the
    /// terminal's foreground process group, and COMMAND's group is that one
    /// (with --foreground, or a COMMAND that took the terminal).
    ///
    /// Both tests are needed: tcgetpgrp alone cannot tell a Ctrl-C from a
    /// `kill -INT` sent to semaphore alone while it runs in the foreground
    /// (COMMAND would then never hear of it); the signal's origin alone
    /// cannot tell whether COMMAND is in the group the terminal signalled (by
    /// default it is not: it has a group of its own, so semaphore passes the
    /// Ctrl-C on, once).
    fn got_it_from_the_terminal(&self, received: Received) -> bool {
        if !received.from_kernel {
            return false;
        }
        let Some(pid) = self.pid() else {
            return false;
        };
        let Ok(tty) = std::fs::File::open("/dev/tty") else {
            // No controlling terminal: no terminal sent it.
            return false;
        };
        match (
            nix::unistd::tcgetpgrp(&tty),
            nix::unistd::getpgid(Some(pid)),
        ) {
            (Ok(foreground), Ok(group)) => foreground == group,
            _ => false,
        }
    }

    fn pid(&self) -> Option<Pid> {
        // `id()` is None once the child was reaped: then there is nothing to
        // signal, and no risk of signalling a recycled pid.
        self.child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
    }

    /// Sends `signal` to COMMAND: its process group, or itself alone with
    /// --foreground.
    fn send(&self, signal: Signal) {
        let Some(pid) = self.pid() else {
            return;
        };
        if self.group.is_some() {
            self.send_to_group(signal);
        } else {
            let _ = kill(pid, signal);
        }
    }

    /// Sends `signal` to COMMAND's process group, also once COMMAND (its
    /// leader) is reaped: to what it left behind. Its id stays taken while
    /// anyone is in the group, so this reaches no one else; nothing with
    /// --foreground.
    fn send_to_group(&self, signal: Signal) {
        if let Some(group) = self.group {
            let _ = nix::sys::signal::killpg(group, signal);
        }
    }
}

/// On Linux, COMMAND gets SIGKILL when semaphore dies, whatever kills it: a
/// COMMAND left running would hold on without a lease, or past its end.
#[cfg(target_os = "linux")]
fn die_with_semaphore(command: &mut Command) {
    let semaphore = nix::unistd::getpid();
    // SAFETY: between fork and exec the closure only makes system calls
    // (prctl, getppid) and builds an io::Error from an errno, which does not
    // allocate: all async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            // The parent death signal fires when the *thread* that forked
            // exits: here the main thread (a current-thread runtime), which
            // lives as long as semaphore.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // semaphore may have died before the call above.
            if nix::unistd::getppid() != semaphore {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_semaphore(_command: &mut Command) {}

/// COMMAND's status as semaphore's: its code, or 128+N for signal N.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => exit::UNAVAILABLE,
    }
}

/// Returns the lease; a failure only costs the slot until its ttl ends.
/// Whether the pool was gone (deleted while the lease was held).
async fn give_back(lease: Lease) -> bool {
    let short = lease.pool().short_id();
    let mut gone = false;
    if let Err(err) = lease.release().await {
        let when = match err {
            Error::PoolNotFound => {
                gone = true;
                "the pool is gone".to_string()
            }
            err => format!("{err}; the slot frees itself when the ttl ends"),
        };
        eprintln!("semaphore: pool {short}: could not return the lease: {when}");
    }
    gone
}
