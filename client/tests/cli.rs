//! The real `semaphore` binary against a real `local-api`, on the in-memory
//! store and on DynamoDB Local.

#[macro_use]
extern crate semaphore_tests;

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use semaphore_client::{Borrow, Uuid};
use semaphore_tests::Backend;
use serde_json::Value;
use support::{block, in_use, new_pool, wait_until, Fault, Proxy, Receiver, Server};

const SEMAPHORE: &str = env!("CARGO_BIN_EXE_semaphore");

/// `semaphore` with the service and pool set in its environment, as a user
/// would set them, and nothing inherited that could change what it does.
fn semaphore(url: &str, pool: Uuid) -> Command {
    let mut command = Command::new(SEMAPHORE);
    command
        .env_remove("SEMAPHORE_LEASE")
        .env_remove("SEMAPHORE_FENCE")
        .env_remove("SEMAPHORE_RETRIES")
        .env("SEMAPHORE_URL", url)
        .env("SEMAPHORE_POOL", pool.hyphenated().to_string())
        .stdin(Stdio::null());
    command
}

fn output(command: &mut Command) -> Output {
    command.output().expect("run semaphore")
}

fn json_of(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {text:?}; stderr: {}",
            stderr(output)
        )
    })
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("semaphore died of a signal: {:?}", output.status))
}

/// A scratch directory for files COMMAND writes, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("semaphore-cli-{}", Uuid::new_v4().simple()));
        fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether a process with this pid still runs: it exists and is not a
/// zombie (an orphan's parent may be slow to reap it, or never do).
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// When a process (not necessarily ours) ends, by the wall clock, as soon as
/// it does: a pidfd becomes readable when its process exits.
fn watch_death(pid: i32) -> std::sync::mpsc::Receiver<SystemTime> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (or -1), which only this OwnedFd owns.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    assert!(
        fd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let (tell, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        loop {
            let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
            if let Ok(1..) = poll(&mut fds, PollTimeout::NONE) {
                break;
            }
        }
        let _ = tell.send(SystemTime::now());
    });
    told
}

/// Wall-clock seconds, as `date +%s.%N` prints them.
fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn read_seconds(path: &Path) -> f64 {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: not seconds: {text:?}", path.display()))
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("signal");
}

on_both_stores!(
    sync;
    subcommands_print_the_services_json,
    run_passes_the_commands_status_through,
    run_exits_1_when_no_slot_frees_up_and_e_changes_it,
    run_gives_command_its_lease_in_the_environment,
    run_exports_a_fence_that_grows,
    run_returns_the_lease_when_semaphore_is_signalled,
    run_stops_the_command_when_the_ttl_runs_out,
    run_waits_longer_than_the_servers_maximum,
    a_borrow_retried_after_a_502_holds_one_slot,
    a_signal_while_waiting_gives_the_place_up,
    run_is_a_lock_the_commands_never_overlap,
    run_stops_the_command_before_the_ttl_the_server_granted,
    async_mode_subcommands,
);

fn subcommands_print_the_services_json(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = Uuid::new_v4();
    let id = pool.hyphenated().to_string();
    let run = |args: &[&str]| output(semaphore(&server.url, pool).args(args));

    let out = run(&["inspect"]);
    assert_eq!(code(&out), 66, "{}", stderr(&out));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains(&id),
        "a whole pool UUID in {:?}",
        stderr(&out)
    );

    let out = run(&["register", "--count", "2"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        json_of(&out),
        serde_json::json!({"id": id, "count": 2, "in_use": 0, "available": 2, "waiting": 0})
    );

    let out = run(&["borrow", "--ttl", "30"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let grant = json_of(&out);
    let lease = grant["lease"].as_str().expect("lease").to_string();
    assert!(Uuid::parse_str(&lease).is_ok());
    assert_eq!(grant["position"], 0);
    assert_eq!(grant["expires_in"], 30);
    assert!(grant["expires_at_unix"].as_u64().is_some());

    // `borrow` keeps the lease after it exits: it is the caller's to return.
    let out = run(&["inspect"]);
    assert_eq!(json_of(&out)["in_use"], 1);
    let out = run(&["return", &lease]);
    assert_eq!(json_of(&out), serde_json::json!({"returned": true}));
    let out = output(
        semaphore(&server.url, pool)
            .arg("return")
            .env("SEMAPHORE_LEASE", &lease),
    );
    assert_eq!(json_of(&out), serde_json::json!({"returned": false}));

    // A lease UUID of the caller's: the same UUID again is the same lease.
    let mine = Uuid::new_v4().hyphenated().to_string();
    let first = json_of(&run(&["borrow", "--ttl", "30", "--lease", &mine]));
    let again = run(&["borrow", "--ttl", "30", "--lease", &mine]);
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    let again = json_of(&again);
    assert_eq!(first["lease"], mine.as_str());
    assert_eq!(
        (&again["lease"], &again["position"], &again["fence"]),
        (&first["lease"], &first["position"], &first["fence"])
    );
    assert_eq!(json_of(&run(&["inspect"]))["in_use"], 1, "one slot held");
    assert_eq!(code(&run(&["borrow", "--ttl", "1", "--lease", "nope"])), 64);
    let out = run(&["return", &mine]);
    assert_eq!(json_of(&out), serde_json::json!({"returned": true}));

    let out = run(&["delete"]);
    assert_eq!(json_of(&out), serde_json::json!({"deleted": true}));
    let out = run(&["delete"]);
    assert_eq!(json_of(&out), serde_json::json!({"deleted": false}));
    let out = run(&["borrow", "--ttl", "1"]);
    assert_eq!(code(&out), 66);
}

fn run_passes_the_commands_status_through(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let out = output(semaphore(&server.url, pool.id()).args(["run", "--", "sh", "-c", "exit 7"]));
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(
        in_use(&pool),
        0,
        "the lease is returned after COMMAND exits"
    );

    let out = output(semaphore(&server.url, pool.id()).args(["run", "--", "true"]));
    assert_eq!(code(&out), 0);
    // Died of SIGTERM: 128 + 15, as a shell reports it.
    let out =
        output(semaphore(&server.url, pool.id()).args(["run", "--", "sh", "-c", "kill -TERM $$"]));
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert_eq!(in_use(&pool), 0);

    let out = output(semaphore(&server.url, pool.id()).args(["run", "--", "/nonexistent/command"]));
    assert_eq!(code(&out), 127);
    assert_eq!(in_use(&pool), 0);

    // COMMAND succeeded, but the pool was deleted under it: not a success.
    let deleting = format!("{SEMAPHORE} delete >/dev/null && echo deleted",);
    let out = output(semaphore(&server.url, pool.id()).args(["run", "--", "sh", "-c", &deleting]));
    assert_eq!(code(&out), 66, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("deleted while COMMAND ran"),
        "{}",
        stderr(&out)
    );
}

fn run_exits_1_when_no_slot_frees_up_and_e_changes_it(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let held = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("hold the slot");
    let scratch = Scratch::new();
    let marker = scratch.path("ran");
    let touch = format!("touch {}", marker.display());

    let out = output(semaphore(&server.url, pool.id()).args(["run", "--", "sh", "-c", &touch]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("no slot"), "{}", stderr(&out));

    let started = Instant::now();
    let out = output(
        semaphore(&server.url, pool.id())
            .args(["run", "--wait", "0.5", "-E", "75", "--", "sh", "-c", &touch]),
    );
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "gave up before --wait"
    );
    let out = output(semaphore(&server.url, pool.id()).args([
        "run",
        "--conflict-exit-code",
        "0",
        "--",
        "sh",
        "-c",
        &touch,
    ]));
    assert_eq!(code(&out), 0);
    assert!(!marker.exists(), "COMMAND ran without a slot");
    assert_eq!(in_use(&pool), 1);
    block(held.release()).expect("release");
}

fn run_gives_command_its_lease_in_the_environment(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 3);
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    // COMMAND looks at the pool itself while it holds its slot.
    let script = format!("env; echo IN_USE=$({SEMAPHORE} inspect)");
    let out = output(
        semaphore(&server.url, pool.id()).args(["run", "--ttl", "120", "--", "sh", "-c", &script]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let var = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in COMMAND's environment: {stdout}"))
            .to_string()
    };
    assert!(Uuid::parse_str(&var("SEMAPHORE_LEASE")).is_ok());
    assert_eq!(var("SEMAPHORE_POSITION"), "0");
    assert_eq!(var("SEMAPHORE_POOL"), pool.id().hyphenated().to_string());
    assert_eq!(var("SEMAPHORE_URL"), server.url);
    let expires_at: u64 = var("SEMAPHORE_EXPIRES_AT").parse().expect("Unix seconds");
    assert!(
        (before + 119..=before + 122).contains(&expires_at),
        "{expires_at} vs {before}"
    );
    let inside: Value = serde_json::from_str(&var("IN_USE")).expect("inspect's JSON");
    assert_eq!(inside["in_use"], 1);
    assert_eq!(in_use(&pool), 0);
}

fn run_exports_a_fence_that_grows(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let fence = || {
        let out = output(semaphore(&server.url, pool.id()).args([
            "run",
            "--",
            "sh",
            "-c",
            "echo ${SEMAPHORE_FENCE:-unset}",
        ]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        text.parse::<u64>()
            .unwrap_or_else(|_| panic!("SEMAPHORE_FENCE is {text:?}, not an integer"))
    };
    let first = fence();
    let second = fence();
    assert!(second > first, "fence {second} after {first}");
}

fn run_returns_the_lease_when_semaphore_is_signalled(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let scratch = Scratch::new();
    for (signal, name) in [(15, "TERM"), (2, "INT")] {
        let pid_file = scratch.path(&format!("pid-{name}"));
        let got_file = scratch.path(&format!("got-{name}"));
        // COMMAND records its pid, and which signal reached it.
        let script = format!(
            "trap 'echo {name} > {got}; exit 0' {name}; echo $$ > {pid}; while :; do sleep 0.05; done",
            got = got_file.display(),
            pid = pid_file.display(),
        );
        let mut child = semaphore(&server.url, pool.id())
            .args(["run", "--ttl", "60", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn semaphore");
        wait_until("COMMAND runs", Duration::from_secs(10), || {
            read_pid(&pid_file).is_some()
        });
        let command_pid = read_pid(&pid_file).expect("pid");
        assert_eq!(in_use(&pool), 1);

        let semaphore_pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let sig = nix::sys::signal::Signal::try_from(signal).expect("signal");
        nix::sys::signal::kill(semaphore_pid, sig).expect("signal semaphore");
        let status = child.wait().expect("semaphore exits");
        assert_eq!(status.code(), Some(128 + signal), "{status:?}");
        assert_eq!(
            fs::read_to_string(&got_file).ok().as_deref(),
            Some(format!("{name}\n").as_str()),
            "COMMAND got SIG{name}"
        );
        assert!(!alive(command_pid), "COMMAND outlived semaphore");
        assert_eq!(in_use(&pool), 0, "lease returned after SIG{name}");
    }
}

fn run_stops_the_command_when_the_ttl_runs_out(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let scratch = Scratch::new();
    let pid_file = scratch.path("pid");
    let child_file = scratch.path("child");
    let term_file = scratch.path("term");
    // COMMAND and a process it started both ignore SIGTERM (COMMAND notes
    // it), so only the SIGKILL after --kill-after stops them.
    let script = format!(
        "trap 'echo TERM > {term}' TERM; (trap \"\" TERM; exec sleep 60) & echo $! > {child}; \
         echo $$ > {pid}; while :; do sleep 0.05; done",
        term = term_file.display(),
        child = child_file.display(),
        pid = pid_file.display(),
    );
    let started = Instant::now();
    let out = output(semaphore(&server.url, pool.id()).args([
        "run",
        "--ttl",
        "1.5",
        "--kill-after",
        "0.5",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let took = started.elapsed();
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the lease runs out in") && stderr(&out).contains("SIGKILL in 0.5 s"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains(&pool.id().hyphenated().to_string()));
    assert_eq!(
        fs::read_to_string(&term_file).ok().as_deref(),
        Some("TERM\n"),
        "COMMAND got SIGTERM first"
    );
    // SIGTERM at 1.5 - 0.1 - 0.5 = 0.9 s, SIGKILL at 1.4 s: before the lease ends.
    assert!(
        took >= Duration::from_millis(1300),
        "stopped after {took:?}"
    );
    let pid = read_pid(&pid_file).expect("COMMAND ran");
    assert!(!alive(pid), "COMMAND still runs after exit 124");
    // Killed with COMMAND's process group (its death may lag a little).
    let child = read_pid(&child_file).expect("COMMAND started a process");
    wait_until(
        "the process COMMAND started dies",
        Duration::from_secs(2),
        || !alive(child),
    );
    wait_until("the expired lease is gone", Duration::from_secs(5), || {
        in_use(&pool) == 0
    });
}

fn run_waits_longer_than_the_servers_maximum(store: Backend) {
    let server = Server::start(store, &[("MAX_WAIT_SECONDS", "1")]);
    let pool = new_pool(&server.url, 1);
    // The slot frees itself 2.5 s from now: after two of the server's 1 s waits.
    let held = block(pool.borrow(Borrow::ttl(Duration::from_millis(2500)))).expect("hold");
    let started = Instant::now();
    let out = output(semaphore(&server.url, pool.id()).args(["run", "--wait", "10", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2000),
        "got the slot after {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "got the slot only after {took:?}"
    );
    held.detach();

    // And gives up only when the caller's wait is spent, not the server's.
    let _held = block(pool.borrow(Borrow::ttl(Duration::from_secs(30)))).expect("hold");
    let started = Instant::now();
    let out =
        output(semaphore(&server.url, pool.id()).args(["run", "--wait", "2.2", "--", "true"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(2200));
}

fn a_borrow_retried_after_a_502_holds_one_slot(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 2);
    let proxy = Proxy::start(&server.url, Fault::FirstBorrowAnswered502);
    let out = output(semaphore(&proxy.url, pool.id()).args(["borrow", "--ttl", "60"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        proxy.borrows.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one borrow, one retry"
    );
    let grant = json_of(&out);
    assert_eq!(
        grant["position"], 0,
        "the retry got the first attempt's slot"
    );
    assert_eq!(in_use(&pool), 1, "a retried borrow holds one slot, not two");
}

#[test]
fn an_unreachable_or_failing_service_exits_69() {
    let pool = Uuid::new_v4();
    // Nothing listens on a port we bound and closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = output(semaphore(&url, pool).args(["--retries", "1", "inspect"]));
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(stderr(&out).contains("2 attempts"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains(&pool.hyphenated().to_string()),
        "{}",
        stderr(&out)
    );

    let proxy = Proxy::start(&url, Fault::Always502);
    let out = output(semaphore(&proxy.url, pool).args(["--retries", "2", "run", "--", "true"]));
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert_eq!(proxy.borrows.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[test]
fn bad_usage_exits_64() {
    let url = "http://127.0.0.1:9";
    let pool = Uuid::new_v4();
    for args in [
        &["run"][..],
        &["run", "--ttl", "0", "--", "true"],
        &["run", "--wait", "-1", "--", "true"],
        // SIGTERM would come before COMMAND starts.
        &["run", "--ttl", "1", "--kill-after", "1", "--", "true"],
        &["run", "--ttl", "1", "--kill-after", "0.9", "--", "true"],
        &["register", "--count", "1001"],
        &["borrow"],
        &["frobnicate"],
        &["--pool", "not-a-uuid", "inspect"],
    ] {
        let out = output(semaphore(url, pool).args(args));
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    let out = output(
        semaphore(url, pool)
            .env_remove("SEMAPHORE_POOL")
            .arg("inspect"),
    );
    assert_eq!(code(&out), 64);
    assert!(stderr(&out).contains("SEMAPHORE_POOL"), "{}", stderr(&out));
    let out = output(
        semaphore(url, pool)
            .env_remove("SEMAPHORE_URL")
            .arg("inspect"),
    );
    assert_eq!(code(&out), 64);
    assert!(stderr(&out).contains("SEMAPHORE_URL"), "{}", stderr(&out));
    let out = output(semaphore("ftp://x", pool).arg("inspect"));
    assert_eq!(code(&out), 64);

    // Each message says what was wrong and what to type instead.
    for (args, says) in [
        (
            &["--url", "127.0.0.1:39800", "inspect"][..],
            "did you mean http://127.0.0.1:39800?",
        ),
        (
            &["--url", "localhost:3000", "inspect"],
            "did you mean http://localhost:3000?",
        ),
        (&["--pool", "not-a-uuid", "inspect"], "is not a UUID"),
        (&["return", "nope"], "`semaphore uuid` prints a new one"),
        (
            &["borrow", "--ttl", "-5"],
            "\"-5\" is not a number of seconds greater than 0",
        ),
        (
            &["borrow", "--ttl", "1", "--wait", "-1"],
            "\"-1\" is not a number of seconds, 0 or more",
        ),
        (
            &["run", "--ttl", "-5", "--", "true"],
            "\"-5\" is not a number of seconds greater than 0",
        ),
    ] {
        let out = output(semaphore(url, pool).args(args));
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }

    // A new UUID, with no URL or pool needed.
    let out = output(
        Command::new(SEMAPHORE)
            .env_remove("SEMAPHORE_URL")
            .env_remove("SEMAPHORE_POOL")
            .arg("uuid"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(Uuid::parse_str(printed.trim()).is_ok(), "{printed:?}");
    let out = output(semaphore(url, pool).args(["enqueue", "--help"]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("--allow-local-callbacks"),
        "enqueue --help says how to allow a local receiver"
    );

    let out = output(semaphore(url, pool).arg("--help"));
    assert_eq!(code(&out), 0);
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "SEMAPHORE_URL",
        "SEMAPHORE_POOL",
        "EXIT STATUS",
        "124",
        "semaphore run",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    assert!(
        !help.contains(&pool.hyphenated().to_string()),
        "--help shows the pool UUID"
    );
}

/// On a terminal (script(1) gives it one): a status line while waiting, with
/// the pool's first 8 hex digits and the seconds waited, and a one-line
/// summary instead of JSON. The terminal is store-independent: memory only.
#[test]
fn on_a_terminal_a_status_line_and_human_output() {
    let server = Server::start(Backend::Memory, &[]);
    let pool = new_pool(&server.url, 1);
    let id = pool.id().hyphenated().to_string();
    let short = semaphore_client::short(&pool.id());
    let on_tty = |args: &str| {
        let out = output(
            Command::new("script")
                .args(["-qec", &format!("'{SEMAPHORE}' {args}"), "/dev/null"])
                .env("SEMAPHORE_URL", &server.url)
                .env("SEMAPHORE_POOL", &id)
                .stdin(Stdio::null()),
        );
        (
            code(&out),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    let (status, text) = on_tty("inspect");
    assert_eq!(status, 0, "{text}");
    assert!(
        text.contains(&format!("pool {short}: 0 of 1 slots in use, 1 available")),
        "{text:?}"
    );

    // The slot frees itself after about 2 s: long enough for a status line or two.
    let _held = block(pool.borrow(Borrow::ttl(Duration::from_millis(2200)))).expect("hold");
    let (status, text) = on_tty("run --wait 10 -- true");
    assert_eq!(status, 0, "{text}");
    assert!(
        text.contains(&format!("waiting for a slot in pool {short}… 1 s")),
        "{text:?}"
    );
    assert!(
        !text.contains(&id),
        "a whole pool UUID on the terminal: {text:?}"
    );
}

/// A `semaphore` waiting for a slot that gets SIGINT, SIGTERM or SIGHUP
/// gives its place up: the borrower after it gets the slot that frees up, at
/// once. Through a proxy that, like API Gateway, never tells the server that
/// its client hung up, so only semaphore's own return can do it.
fn a_signal_while_waiting_gives_the_place_up(store: Backend) {
    use nix::sys::signal::Signal;
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let gateway = Proxy::start(&server.url, Fault::LikeApiGateway);
    let scratch = Scratch::new();
    for (subcommand, signal) in [
        ("run", Signal::SIGINT),
        ("run", Signal::SIGTERM),
        ("run", Signal::SIGHUP),
        ("borrow", Signal::SIGTERM),
    ] {
        let held = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("hold");
        let marker = scratch.path(&format!("ran-{subcommand}-{signal}"));
        let mut waiter = semaphore(&gateway.url, pool.id());
        waiter.args([subcommand, "--ttl", "60", "--wait", "60"]);
        if subcommand == "run" {
            waiter.args(["--", "touch"]).arg(&marker);
        }
        let mut waiter = waiter
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn semaphore");
        wait_until("semaphore queues", Duration::from_secs(10), || {
            support::waiting(&pool) == 1
        });
        let next = spawn_borrow(&pool);
        wait_until("the next borrower queues", Duration::from_secs(10), || {
            support::waiting(&pool) == 2
        });

        let cancelled = Instant::now();
        self::signal(waiter.id(), signal);
        assert!(block(held.release()).expect("release"));
        let (granted, lease) = block(next).expect("the next borrower");
        let lease = lease.expect("the next borrower gets the slot");
        let took = granted - cancelled;
        println!(
            "{store:?}: `semaphore {subcommand}` waiting, {signal}: pool usable by the next \
             borrower {took:?} after the signal"
        );
        let status = waiter.wait().expect("semaphore exits");
        assert_eq!(status.code(), Some(128 + signal as i32), "{status:?}");
        assert!(took < Duration::from_secs(1), "{signal}: {took:?}");
        assert!(!marker.exists(), "COMMAND ran without a slot");
        assert_eq!(in_use(&pool), 1, "semaphore holds nothing after {signal}");
        block(lease.release()).expect("release");
    }
}

/// A borrow of a minute that waits up to 30 s, spawned: when it was answered,
/// and its outcome.
fn spawn_borrow(
    pool: &semaphore_client::Pool,
) -> tokio::task::JoinHandle<(
    Instant,
    Result<semaphore_client::Lease, semaphore_client::Error>,
)> {
    let pool = pool.clone();
    support::spawn(async move {
        let lease = pool
            .borrow(Borrow::ttl(Duration::from_secs(60)).wait(Duration::from_secs(30)))
            .await;
        (Instant::now(), lease)
    })
}

/// `semaphore run` is a lock: on a pool of one, the first COMMAND runs far
/// longer than its ttl and ignores SIGTERM, and a second `run` waits for the
/// slot. The first is dead before the second starts. The first semaphore
/// cannot return its lease (a proxy fails its returns), so the slot frees
/// only when the lease ends: the kill schedule alone keeps them apart.
fn run_is_a_lock_the_commands_never_overlap(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let no_returns = Proxy::start(&server.url, Fault::ReturnsFail);
    let scratch = Scratch::new();
    let (a_pid, a_start) = (scratch.path("a.pid"), scratch.path("a.start"));
    let (b_start, b_end) = (scratch.path("b.start"), scratch.path("b.end"));
    // It records its start, then becomes a sleep of 30 s that ignores
    // SIGTERM (an ignored signal stays ignored across exec).
    let first = format!(
        "date +%s.%N > {start}; trap '' TERM; echo $$ > {pid}; exec sleep 30",
        start = a_start.display(),
        pid = a_pid.display(),
    );
    let second = format!(
        "date +%s.%N > {start}; sleep 0.2; date +%s.%N > {end}",
        start = b_start.display(),
        end = b_end.display(),
    );
    let started = Instant::now();
    let a = semaphore(&no_returns.url, pool.id())
        .args([
            "--retries",
            "0",
            "run",
            "--ttl",
            "2",
            "--",
            "sh",
            "-c",
            &first,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the first run");
    wait_until("the first COMMAND runs", Duration::from_secs(10), || {
        read_pid(&a_pid).is_some()
    });
    let a_died = watch_death(read_pid(&a_pid).expect("pid"));
    let b = semaphore(&server.url, pool.id())
        .args([
            "run", "--ttl", "10", "--wait", "20", "--", "sh", "-c", &second,
        ])
        .output()
        .expect("the second run");
    assert_eq!(code(&b), 0, "{}", stderr(&b));
    let a = a.wait_with_output().expect("the first run exits");
    assert_eq!(
        code(&a),
        124,
        "the first COMMAND was stopped: {}",
        stderr(&a)
    );
    assert!(
        stderr(&a).contains("could not return the lease"),
        "{}",
        stderr(&a)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the first COMMAND ran on"
    );
    let a_end = unix_seconds(
        a_died
            .recv_timeout(Duration::from_secs(10))
            .expect("the first COMMAND died"),
    );
    let (a_start, b_start, b_end) = (
        read_seconds(&a_start),
        read_seconds(&b_start),
        read_seconds(&b_end),
    );
    let gap = b_start - a_end;
    println!(
        "{store:?}: lock: first COMMAND ran {:.3} s (ttl 2 s), died {:.1} ms before the \
         second started",
        a_end - a_start,
        gap * 1000.0
    );
    assert!(a_start < a_end && b_start < b_end);
    assert!(
        a_end < b_start,
        "the commands overlapped by {:.1} ms",
        -gap * 1000.0
    );
}

/// The server clamps the ttl to its MAX_TTL_SECONDS: `run` says so on
/// stderr and stops COMMAND before the lease it granted ends, not the one
/// asked for.
fn run_stops_the_command_before_the_ttl_the_server_granted(store: Backend) {
    let server = Server::start(store, &[("MAX_TTL_SECONDS", "2")]);
    let pool = new_pool(&server.url, 1);
    let scratch = Scratch::new();
    let pid_file = scratch.path("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; exec sleep 30",
        pid_file.display()
    );
    let started = SystemTime::now();
    let run = semaphore(&server.url, pool.id())
        .args(["run", "--ttl", "10", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn semaphore");
    wait_until("COMMAND runs", Duration::from_secs(10), || {
        read_pid(&pid_file).is_some()
    });
    let died = watch_death(read_pid(&pid_file).expect("pid"));
    let out = run.wait_with_output().expect("semaphore exits");
    let ran = died
        .recv_timeout(Duration::from_secs(10))
        .expect("COMMAND died");
    let ran = ran.duration_since(started).unwrap_or_default();
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("shortened the ttl") && err.contains("ends in 2 s, not the 10 s asked"),
        "{err}"
    );
    assert!(err.contains("the service granted 2 s"), "{err}");
    assert!(!err.contains("10 s)"), "{err}");
    // SIGTERM at 2 - 0.1 - 0.19 s, SIGKILL at 1.9 s of the 2 s granted.
    assert!(
        ran >= Duration::from_millis(1500) && ran < Duration::from_secs(4),
        "COMMAND ran {ran:?}"
    );
    println!("{store:?}: clamped to 2 s: COMMAND ran {ran:?} (from semaphore's start)");
}

/// Killing semaphore, even with SIGKILL, kills COMMAND (PR_SET_PDEATHSIG):
/// it must not run on without a lease.
#[test]
fn the_command_dies_with_semaphore() {
    let server = Server::start(Backend::Memory, &[]);
    let pool = new_pool(&server.url, 1);
    let scratch = Scratch::new();
    let pid_file = scratch.path("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut run = semaphore(&server.url, pool.id())
        .args(["run", "--ttl", "60", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn semaphore");
    wait_until("COMMAND runs", Duration::from_secs(10), || {
        read_pid(&pid_file).is_some()
    });
    let pid = read_pid(&pid_file).expect("pid");
    let died = watch_death(pid);
    run.kill().expect("SIGKILL semaphore");
    run.wait().expect("semaphore dies");
    died.recv_timeout(Duration::from_secs(5))
        .expect("COMMAND died with semaphore");
    assert!(!alive(pid));
}

/// On a terminal (script(1) gives it one), Ctrl-C reaches COMMAND once: by
/// default COMMAND has a process group of its own and semaphore passes the
/// terminal's SIGINT on; with --foreground the terminal signals COMMAND
/// itself and semaphore does not pass it on again, yet still passes on a
/// SIGINT sent to semaphore alone.
#[test]
fn on_a_terminal_ctrl_c_reaches_the_command_once() {
    use std::io::Write;
    let server = Server::start(Backend::Memory, &[]);
    let pool = new_pool(&server.url, 1);
    let scratch = Scratch::new();
    for (case, foreground, ctrl_c) in [
        ("ctrl-c", false, true),
        ("ctrl-c-foreground", true, true),
        ("kill-foreground", true, false),
    ] {
        let got = scratch.path(&format!("{case}.got"));
        let semaphore_pid = scratch.path(&format!("{case}.ppid"));
        // COMMAND notes each SIGINT, and stays a second after the first, for
        // a second one to arrive if it were sent.
        let command = format!(
            "trap \"echo INT >> {got}\" INT; echo $PPID > {ppid}; \
             while [ ! -s {got} ]; do sleep 0.05; done; sleep 1",
            got = got.display(),
            ppid = semaphore_pid.display(),
        );
        let flag = if foreground { "--foreground " } else { "" };
        let mut on_tty = Command::new("script")
            .args([
                "-qec",
                &format!("'{SEMAPHORE}' run --ttl 60 {flag}-- sh -c '{command}'"),
                "/dev/null",
            ])
            .env("SEMAPHORE_URL", &server.url)
            .env("SEMAPHORE_POOL", pool.id().hyphenated().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("script(1)");
        wait_until("COMMAND runs", Duration::from_secs(10), || {
            read_pid(&semaphore_pid).is_some()
        });
        let mut keys = on_tty.stdin.take().expect("script's stdin");
        if ctrl_c {
            keys.write_all(b"\x03").expect("type Ctrl-C");
            keys.flush().expect("flush");
        } else {
            let pid = read_pid(&semaphore_pid).expect("semaphore's pid");
            signal(pid as u32, nix::sys::signal::Signal::SIGINT);
        }
        let out = on_tty.wait_with_output().expect("script exits");
        drop(keys);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(130), "{case}: {text}");
        assert_eq!(
            fs::read_to_string(&got).ok().as_deref(),
            Some("INT\n"),
            "{case}: COMMAND got SIGINT once: {text}"
        );
        assert_eq!(in_use(&pool), 0, "{case}: the lease is returned");
    }
}

/// Only the service's own "pool not found" is a missing pool (66, with a hint
/// to register it); a route the service does not know (a wrong stage) or a
/// server that is not the service is a wrong URL (64).
#[test]
fn a_wrong_url_is_not_a_missing_pool() {
    let server = Server::start(Backend::Memory, &[]);
    let pool = Uuid::new_v4();
    let out = output(semaphore(&server.url, pool).arg("inspect"));
    assert_eq!(code(&out), 66, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pool not found") && stderr(&out).contains("semaphore register"),
        "{}",
        stderr(&out)
    );
    // https:// to local-api's plain http: the message says which to use.
    let https = server.url.replace("http://", "https://");
    let out = output(semaphore(&https, pool).args(["--retries", "0", "inspect"]));
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("use http:// instead of https://"),
        "{}",
        stderr(&out)
    );
    let html = Proxy::start(
        &server.url,
        Fault::NotFound("<html><body>Not Found</body></html>"),
    );
    let json = Proxy::start(&server.url, Fault::NotFound(r#"{"error":"not found"}"#));
    for url in [format!("{}/prod", server.url), html.url, json.url] {
        for args in [&["inspect"][..], &["run", "--", "true"]] {
            let out = output(semaphore(&url, pool).args(args));
            assert_eq!(code(&out), 64, "{url} {args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains("leads to no semaphore service") && err.contains("SEMAPHORE_URL"),
                "{err}"
            );
            assert!(!err.contains("register"), "{err}");
            assert!(!err.contains(&pool.hyphenated().to_string()), "{err}");
        }
    }
}

fn async_mode_subcommands(store: Backend) {
    let server = Server::start_with(store, &[], &["--allow-local-callbacks"]);
    let receiver = Receiver::start();
    let pool = new_pool(&server.url, 1);
    let queued = output(semaphore(&server.url, pool.id()).args([
        "enqueue",
        "--ttl",
        "30",
        "--wait",
        "600",
        "--callback",
        &receiver.url,
        "--token",
        "t0ken",
    ]));
    assert_eq!(code(&queued), 0, "{}", stderr(&queued));
    let queued = json_of(&queued);
    let lease = queued["lease"].as_str().expect("a lease").to_string();
    assert_eq!(queued["ahead"], 0);
    wait_until("the grant is delivered", Duration::from_secs(10), || {
        let status = output(semaphore(&server.url, pool.id()).args(["ticket", &lease]));
        code(&status) == 0 && json_of(&status)["state"] == "delivered"
    });
    assert_eq!(receiver.got().len(), 1);
    let cancel = output(semaphore(&server.url, pool.id()).args(["cancel", &lease]));
    assert_eq!(
        (code(&cancel), json_of(&cancel)["state"].as_str()),
        (0, Some("delivered")),
        "a delivered ticket keeps its grant"
    );
    let unknown = Uuid::new_v4().to_string();
    let missing = output(semaphore(&server.url, pool.id()).args(["ticket", &unknown]));
    assert_eq!(code(&missing), 66, "{}", stderr(&missing));
    assert!(stderr(&missing).contains("ticket not found"));
    let refused = output(semaphore(&server.url, pool.id()).args([
        "enqueue",
        "--ttl",
        "30",
        "--callback",
        "https://10.0.0.1/hook",
        "--token",
        "t",
    ]));
    assert_eq!(code(&refused), 64, "a refused callback is a 400");
}
