//! `semaphore`: the http-semaphore service from the command line, and
//! `semaphore run`, which runs a command while holding a slot.

mod run;
mod signals;
mod wait;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use semaphore_client::{
    Borrow, Client, Enqueue, Error, Pool, PoolState, RetryPolicy, TicketStatus, Uuid,
};
use semaphore_wire::{to_json, Deleted, Returned};

/// Exit statuses (flock(1), timeout(1) and sysexits.h conventions).
mod exit {
    /// No slot freed up within `--wait` (`run -E` changes it).
    pub const NO_SLOT: u8 = 1;
    /// Bad usage, a refused request, or a URL that leads to no service.
    pub const USAGE: u8 = 64;
    /// The pool does not exist.
    pub const NO_POOL: u8 = 66;
    /// The service is unreachable, or answered 5xx after retries.
    pub const UNAVAILABLE: u8 = 69;
    /// The lease was about to run out while COMMAND still ran.
    pub const TIMED_OUT: u8 = 124;
    pub const CANNOT_EXECUTE: u8 = 126;
    pub const NOT_FOUND: u8 = 127;
}

const ABOUT: &str = "Borrow slots of an http-semaphore pool, or run a command while holding one";

const LONG_ABOUT: &str = "\
semaphore talks to an http-semaphore service: a distributed counting semaphore over \
HTTP. A pool is COUNT numbered slots kept under a UUID you choose; that UUID is the \
pool's only credential, so keep it secret. A lease holds one slot until it is returned \
or its ttl runs out.

The subcommands register, inspect, delete, borrow and return each make one call and \
print the service's JSON answer on stdout (a one-line summary instead when stdout is a \
terminal). `semaphore run` borrows a slot, runs a command while holding it, and returns \
it when the command ends; with a pool of count 1 that is a lock with a timeout:

    semaphore run --pool $P --ttl 600 --wait 300 -- ./deploy.sh

Failed calls (connection errors, timeouts, 502/503/504/429) are retried with capped, \
jittered backoff (--retries). A borrow is retried with the same lease UUID, so a retry \
never holds a second slot. Waits longer than the service's own maximum (25 s by \
default) are made of several borrows, until the whole --wait is spent. A borrow or run \
stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT while it waits gives its place in the \
queue up (it returns its lease UUID) before it exits.";

const AFTER_LONG_HELP: &str = "\
ENVIRONMENT:
    SEMAPHORE_URL      the service's base URL, as --url
    SEMAPHORE_POOL     the pool's UUID, as --pool
    SEMAPHORE_RETRIES  retries of a failed call, as --retries
    SEMAPHORE_LEASE    the lease UUID for `semaphore return`, `ticket` and `cancel`
    SEMAPHORE_CALLBACK_TOKEN  the callback's token for `semaphore enqueue`

    `semaphore run` sets these for COMMAND: SEMAPHORE_LEASE (the lease UUID), \
SEMAPHORE_POSITION (the slot number), SEMAPHORE_EXPIRES_AT (when the lease ends, Unix \
seconds), SEMAPHORE_FENCE (the fencing token: pass it to the resource you protect, which \
should refuse a token lower than the highest it has seen), SEMAPHORE_POOL and \
SEMAPHORE_URL.

EXIT STATUS:
    0      success (`run`: COMMAND's own status; 128+N if it died of signal N)
    1      no slot freed up within --wait (`run -E CODE` changes it)
    64     bad usage: a missing or malformed option; a --url that leads to no
           semaphore service (it answers 404 \"not found\", or is another server);
           a request the service refused (400)
    66     the pool does not exist (the service answered 404 \"pool not found\");
           `ticket`, `cancel`: the pool has no ticket of that lease; `run`:
           COMMAND exited 0, but the pool was deleted while it ran
    69     the service is unreachable, or answered 5xx after the retries
    124    `run`: the lease was about to end while COMMAND still ran: COMMAND was
           stopped (SIGTERM, then SIGKILL before the lease ended); or the lease
           granted had too little time left to start COMMAND
    126    `run`: COMMAND could not be executed
    127    `run`: COMMAND was not found
    128+N  semaphore got signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT): while waiting
           (`borrow`, `run`) it gave its place in the queue up; while COMMAND ran,
           COMMAND got the signal too (once), and semaphore returned the slot
           after COMMAND exited

EXAMPLES:
    export SEMAPHORE_URL=http://127.0.0.1:3000 SEMAPHORE_POOL=$(semaphore uuid)
    semaphore register --count 2
    semaphore run --ttl 60 --wait 120 -- make test
    LEASE=$(semaphore borrow --ttl 30 | jq -r .lease)
    semaphore return $LEASE
    semaphore enqueue --ttl 60 --wait 7200 --callback https://example.com/granted --token T
    semaphore ticket $LEASE";

#[derive(Debug, Parser)]
#[command(
    name = "semaphore",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    after_help = "See `semaphore --help` for the environment, exit statuses and examples.",
)]
struct Cli {
    /// The service's base URL: http://127.0.0.1:3000 for local-api, the stack's
    /// ApiUrl when deployed.
    #[arg(long, env = "SEMAPHORE_URL", value_name = "URL", global = true)]
    url: Option<String>,

    /// The pool's UUID (its credential: prefer the environment variable to
    /// keep it out of process listings).
    #[arg(
        long,
        env = "SEMAPHORE_POOL",
        value_name = "UUID",
        global = true,
        hide_env_values = true,
        value_parser = uuid_arg
    )]
    pool: Option<Uuid>,

    /// How many times to retry a call that failed with a connection error, a
    /// timeout or a 502/503/504/429, with backoff (0.2 s doubling to 5 s).
    #[arg(
        long,
        env = "SEMAPHORE_RETRIES",
        value_name = "N",
        default_value_t = 5,
        global = true
    )]
    retries: u32,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the pool with COUNT slots, or change its count (live leases stay).
    Register {
        /// Number of slots, 0 to 1000.
        #[arg(long, value_name = "COUNT", value_parser = clap::value_parser!(u16).range(0..=1000))]
        count: u16,
    },
    /// Show the pool's count and how many slots are in use.
    Inspect,
    /// Delete the pool and all its leases.
    Delete,
    /// Borrow a slot and print the lease; it is NOT returned when semaphore exits
    /// (return it with `semaphore return LEASE`, or let its ttl end it). A signal
    /// while it waits gives the wait up.
    Borrow(BorrowArgs),
    /// Return a lease early (prints {"returned": false} for an unknown, expired
    /// or already returned lease).
    #[command(name = "return")]
    Return {
        /// The lease UUID.
        #[arg(env = "SEMAPHORE_LEASE", value_name = "LEASE", hide_env_values = true, value_parser = uuid_arg)]
        lease: Uuid,
    },
    /// Borrow a slot, run COMMAND while holding it, then return it.
    #[command(long_about = run::LONG_ABOUT)]
    Run(RunArgs),
    /// Async mode: queue a borrow for up to --wait (hours); when a slot is
    /// granted, the service POSTs the grant to --callback. Prints the ticket and
    /// the lease UUID (return it with `semaphore return` when done).
    Enqueue(EnqueueArgs),
    /// Async mode: show the state of the ticket of LEASE.
    Ticket {
        /// The lease UUID the ticket was queued with.
        #[arg(env = "SEMAPHORE_LEASE", value_name = "LEASE", hide_env_values = true, value_parser = uuid_arg)]
        lease: Uuid,
    },
    /// Async mode: give the ticket of LEASE up, if it still waits.
    Cancel {
        /// The lease UUID the ticket was queued with.
        #[arg(env = "SEMAPHORE_LEASE", value_name = "LEASE", hide_env_values = true, value_parser = uuid_arg)]
        lease: Uuid,
    },
    /// Print a new random UUID: a pool id (keep it secret: it is the pool's
    /// only credential) or a lease id. Needs no --url or --pool.
    Uuid,
}

#[derive(Debug, Args)]
struct EnqueueArgs {
    /// Seconds the lease lives from its grant.
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds, allow_negative_numbers = true)]
    ttl: Duration,

    /// Seconds the ticket may wait for a grant (default: the service's
    /// maximum, a day unless configured).
    #[arg(long, value_name = "SECONDS", value_parser = seconds, allow_negative_numbers = true)]
    wait: Option<Duration>,

    /// The receiver's https URL. The service calls public addresses only;
    /// http and loopback receivers are allowed only by a service started for
    /// local use (`local-api --allow-local-callbacks`, or ALLOW_LOCAL_CALLBACKS=true).
    #[arg(long, value_name = "URL")]
    callback: String,

    /// Sent as `Authorization: Bearer TOKEN` to the callback.
    #[arg(
        long,
        env = "SEMAPHORE_CALLBACK_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: String,

    /// The lease UUID (default: a new one); the same UUID again is the same
    /// ticket.
    #[arg(long, value_name = "UUID", value_parser = uuid_arg)]
    lease: Option<Uuid>,
}

#[derive(Debug, Args)]
struct BorrowArgs {
    /// Seconds the lease lives (fractions allowed; the service clamps it to its
    /// maximum, 3600 by default: the answer's expires_in is what it granted).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds, allow_negative_numbers = true)]
    ttl: Duration,

    /// Seconds to wait for a free slot; any length (the client borrows again
    /// past the service's own maximum).
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "0", allow_negative_numbers = true)]
    wait: Duration,

    /// The lease UUID (default: a new one); the same UUID again, while its
    /// lease lives, is the same lease: a borrow retried after an error holds
    /// one slot.
    #[arg(long, value_name = "UUID", value_parser = uuid_arg)]
    lease: Option<Uuid>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Seconds the lease lives (the service may grant less: its maximum, 3600
    /// by default). COMMAND must be done before it ends: it is stopped
    /// (SIGTERM, then SIGKILL) just before, and semaphore exits 124.
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds, default_value = "300", allow_negative_numbers = true)]
    ttl: Duration,

    /// Seconds to wait for a free slot before giving up (exit 1, or -E's CODE).
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "0", allow_negative_numbers = true)]
    wait: Duration,

    /// Exit status when no slot freed up within --wait (as flock -E).
    #[arg(
        short = 'E',
        long = "conflict-exit-code",
        value_name = "CODE",
        default_value_t = exit::NO_SLOT
    )]
    conflict_exit_code: u8,

    /// Seconds between SIGTERM and SIGKILL when COMMAND must stop: SIGTERM
    /// goes this long before the SIGKILL that comes just before the lease ends.
    /// Default: a tenth of the lease's time, at most 10 s. Must be shorter
    /// than --ttl.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, allow_negative_numbers = true)]
    kill_after: Option<Duration>,

    /// Keep COMMAND in semaphore's process group, for a COMMAND that reads
    /// from the terminal: it then gets the terminal's Ctrl-C itself, and
    /// signals go to COMMAND alone, not to the processes it started.
    #[arg(long)]
    foreground: bool,

    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// A UUID, with a message that says what one looks like.
fn uuid_arg(text: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text.trim()).map_err(|_| {
        format!(
            "{text:?} is not a UUID (like 8d5f0c3e-2b1a-4c7e-9f30-6a1d2e4b5c70; \
             `semaphore uuid` prints a new one)"
        )
    })
}

fn seconds(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{text:?} is not a number of seconds, 0 or more"))
}

fn positive_seconds(text: &str) -> Result<Duration, String> {
    seconds(text)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?} is not a number of seconds greater than 0"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("semaphore: cannot start: {err}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    ExitCode::from(runtime.block_on(dispatch(cli)))
}

async fn dispatch(cli: Cli) -> u8 {
    if let Command::Uuid = cli.command {
        println!("{}", Uuid::new_v4().hyphenated());
        return 0;
    }
    let Some(url) = cli.url else {
        eprintln!("semaphore: no service URL: pass --url URL or set SEMAPHORE_URL");
        return exit::USAGE;
    };
    let Some(pool_id) = cli.pool else {
        eprintln!("semaphore: no pool: pass --pool UUID or set SEMAPHORE_POOL");
        return exit::USAGE;
    };
    let client = match Client::new(&url) {
        Ok(client) => client.with_retry(RetryPolicy::default().with_retries(cli.retries)),
        Err(err) => {
            eprintln!("semaphore: {err}");
            return exit::USAGE;
        }
    };
    let pool = client.pool(pool_id);
    let code = command(&pool, &url, cli.command).await;
    // Returns sent in the background (by a borrow given up at a signal, or
    // one that failed not knowing whether it was granted) finish before the
    // runtime ends, or are cut off.
    client.settle().await;
    code
}

/// Runs one subcommand; its exit status.
async fn command(pool: &Pool, url: &str, command: Command) -> u8 {
    let human = std::io::stdout().is_terminal();
    let outcome = match command {
        Command::Register { count } => pool
            .register(count)
            .await
            .map(|state| print_state(pool, state, human)),
        Command::Inspect => pool
            .inspect()
            .await
            .map(|state| print_state(pool, state, human)),
        Command::Delete => pool.delete().await.map(|deleted| {
            if human {
                let what = if deleted { "deleted" } else { "did not exist" };
                println!("pool {}: {what}", pool.short_id());
            } else {
                println!("{}", to_json(&Deleted { deleted }));
            }
        }),
        Command::Borrow(args) => {
            let mut ask = Borrow::ttl(args.ttl).wait(args.wait);
            if let Some(lease) = args.lease {
                ask = ask.lease_id(lease);
            }
            let lease = match wait::borrow(pool, ask).await {
                Ok(lease) => Ok(lease),
                Err(wait::Stopped::Failed(err)) => Err(err),
                Err(wait::Stopped::Exit(code)) => return code,
            };
            lease.map(|lease| {
                // Printed, so kept: the caller returns it by its UUID.
                let grant = lease.detach();
                if human {
                    let fence = grant
                        .fence
                        .map_or(String::new(), |f| format!(", fence {f}"));
                    println!(
                        "lease {}: position {}{fence}, expires in {} (at Unix time {})",
                        grant.lease.hyphenated(),
                        grant.position,
                        grant.expires_in,
                        grant.expires_at_unix
                    );
                } else {
                    println!("{}", to_json(&grant));
                }
            })
        }
        Command::Return { lease } => pool.return_lease(lease).await.map(|returned| {
            if human {
                println!(
                    "{}",
                    if returned {
                        "returned"
                    } else {
                        "not returned: the lease was unknown, expired or already returned"
                    }
                );
            } else {
                println!("{}", to_json(&Returned { returned }));
            }
        }),
        Command::Run(args) => return run::run(pool, url, args).await,
        Command::Enqueue(args) => {
            let mut ask = Enqueue::new(args.ttl, args.callback, args.token);
            if let Some(wait) = args.wait {
                ask = ask.wait(wait);
            }
            if let Some(lease) = args.lease {
                ask = ask.lease_id(lease);
            }
            pool.enqueue(ask).await.map(|queued| {
                if human {
                    println!(
                        "ticket {} for lease {}: {} ahead",
                        queued.ticket,
                        queued.lease.hyphenated(),
                        queued.ahead
                    );
                } else {
                    println!(
                        "{}",
                        serde_json::json!({
                            "lease": queued.lease,
                            "ticket": queued.ticket,
                            "ahead": queued.ahead,
                        })
                    );
                }
            })
        }
        Command::Ticket { lease } => pool.ticket(lease).await.map(|t| print_ticket(&t, human)),
        Command::Cancel { lease } => pool.cancel(lease).await.map(|t| print_ticket(&t, human)),
        // Answered before any URL or pool is needed (`dispatch`).
        Command::Uuid => Ok(()),
    };
    match outcome {
        Ok(()) => 0,
        Err(err) => report(pool, &err, exit::NO_SLOT),
    }
}

fn print_ticket(ticket: &TicketStatus, human: bool) {
    if !human {
        println!("{}", to_json(ticket));
        return;
    }
    let mut line = format!("ticket {}: {}", ticket.ticket, ticket.state);
    if let Some(ahead) = ticket.ahead {
        line.push_str(&format!(", {ahead} ahead"));
    }
    if let (Some(position), Some(fence)) = (ticket.position, ticket.fence) {
        line.push_str(&format!(", position {position}, fence {fence}"));
    }
    if let Some(reason) = &ticket.reason {
        line.push_str(&format!(": {reason}"));
    }
    println!("{line}");
}

fn print_state(pool: &Pool, state: PoolState, human: bool) {
    if human {
        let waiting = match state.waiting {
            Some(n) if n > 0 => format!(", {n} waiting"),
            _ => String::new(),
        };
        println!(
            "pool {}: {} of {} slots in use, {} available{waiting}",
            pool.short_id(),
            state.in_use,
            state.count,
            state.available
        );
    } else {
        println!("{}", to_json(&state));
    }
}

/// Says on stderr what went wrong (never with a whole pool UUID) and gives
/// the exit status for it; `no_slot` is the status for `NoSlot`.
fn report(pool: &Pool, err: &Error, no_slot: u8) -> u8 {
    let short = pool.short_id();
    let (status, hint) = match err {
        Error::NoSlot { .. } => (no_slot, ""),
        Error::PoolNotFound => (
            exit::NO_POOL,
            " (create it with: semaphore register --count N)",
        ),
        Error::TicketNotFound => (exit::NO_POOL, ""),
        Error::RouteNotFound(_) => (
            exit::USAGE,
            "; check --url or SEMAPHORE_URL: the service's base URL, with its stage if it has one",
        ),
        Error::BadRequest(_) | Error::InvalidUrl(_) => (exit::USAGE, ""),
        _ => (exit::UNAVAILABLE, ""),
    };
    eprintln!("semaphore: pool {short}: {err}{hint}");
    status
}
