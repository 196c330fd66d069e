//! The real `local-api` binary over real HTTP, as a new user runs it: on the
//! embedded store and with `--dynamodb` on DynamoDB Local.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

struct Server {
    child: Child,
    port: u16,
    /// The line it printed first: where it listens.
    first: String,
    /// Every line the server printed after its first.
    lines: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_local-api"))
            .args(["--port", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start local-api");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        // "local-api listening on http://ADDR:PORT (…)"
        let port = line
            .split(" (")
            .next()
            .and_then(|url| url.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        let first = line;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        Server {
            child,
            port,
            first,
            lines,
        }
    }

    /// The lines printed so far (after the first), waiting briefly for `n`.
    fn lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let lines = self.lines.lock().unwrap().clone();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One HTTP/1.1 request; returns status, headers (lowercased) and JSON body.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String, Value) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        (status, head.to_lowercase(), json)
    }

    /// Ctrl-C: the server must exit cleanly.
    fn interrupt(mut self) {
        let killed = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "local-api exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn full_session(server: &Server) {
    let id = uuid::Uuid::new_v4().to_string();
    let pool = format!("/l/{id}");
    let (status, head, body) = server.request("PUT", &pool, r#"{"count": 2}"#);
    assert_eq!(status, 200);
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(
        body,
        json!({"id": id, "count": 2, "in_use": 0, "available": 2, "waiting": 0})
    );

    let (status, _, lease) = server.request(
        "POST",
        &format!("{pool}/borrow"),
        r#"{"ttl": 30, "wait": 1}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(lease["position"], 0);
    assert_eq!(lease["expires_in"], 30);
    let (_, _, body) = server.request("GET", &pool, "");
    assert_eq!(body["in_use"], 1);

    let ret = format!(r#"{{"lease": "{}"}}"#, lease["lease"].as_str().unwrap());
    assert_eq!(
        server.request("POST", &format!("{pool}/return"), &ret).2,
        json!({"returned": true})
    );
    assert_eq!(
        server.request("POST", &format!("{pool}/return"), &ret).2,
        json!({"returned": false})
    );

    let (status, head, body) = server.request("POST", &pool, "{}");
    assert_eq!(status, 405);
    assert!(head.contains("allow: put, get, delete"), "{head}");
    assert!(body["error"].is_string());
    let (status, head, body) = server.request("GET", "/nowhere", "");
    assert_eq!(status, 404);
    assert!(head.contains("content-type: application/json"));
    assert!(body["error"].is_string());
    let (status, _, body) = server.request("PUT", "/l/not-a-uuid", r#"{"count":1}"#);
    assert_eq!((status, body["error"].is_string()), (400, true));
    let (status, _, _) = server.request("PUT", &pool, &"x".repeat(70_000));
    assert_eq!(status, 413);

    assert_eq!(
        server.request("DELETE", &pool, "").2,
        json!({"deleted": true})
    );
    assert_eq!(server.request("GET", &pool, "").0, 404);
}

#[test]
fn serves_every_route_on_the_embedded_store() {
    let server = Server::start(&[]);
    full_session(&server);
    server.interrupt();
}

#[test]
fn binds_the_address_it_is_given() {
    let server = Server::start(&[]);
    assert!(
        server.first.contains("http://127.0.0.1:"),
        "{}",
        server.first
    );
    server.interrupt();
    // All interfaces: reachable over loopback too.
    let server = Server::start(&["--bind", "0.0.0.0"]);
    assert!(server.first.contains("http://0.0.0.0:"), "{}", server.first);
    full_session(&server);
    server.interrupt();
}

#[test]
fn serves_every_route_on_dynamodb_local() {
    let endpoint = dynamodb_endpoint();
    // A table of its own proves the server creates a missing table.
    let table = format!("local-api-{}", uuid::Uuid::new_v4().simple());
    let server = Server::start(&["--dynamodb", &endpoint, "--table", &table]);
    full_session(&server);
    server.interrupt();
}

/// local-api run with `arg` alone: its exit status, stdout and stderr.
fn run_with(arg: &str) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_local-api"))
        .arg(arg)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_print_usage() {
    let (status, _, stderr) = run_with("--nonsense");
    assert_eq!(status, Some(2));
    assert!(
        stderr.contains("Usage: local-api [OPTIONS] --port <PORT>"),
        "{stderr}"
    );
}

#[test]
fn help_documents_every_option_and_exits_0() {
    let (status, stdout, _) = run_with("--help");
    assert_eq!(status, Some(0));
    for option in ["--port", "--bind", "--dynamodb", "--table", "--log-format"] {
        assert!(stdout.contains(option), "--help lacks {option}: {stdout}");
    }
    // And every setting it reads from the environment, as the functions do.
    for variable in [
        "MAX_TTL_SECONDS",
        "MAX_WAIT_SECONDS",
        "MAX_WAITERS",
        "MAX_ASYNC_WAIT_SECONDS",
    ] {
        assert!(
            stdout.contains(variable),
            "--help lacks {variable}: {stdout}"
        );
    }
}

fn dynamodb_endpoint() -> String {
    std::env::var("DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("DYNAMODB_ENDPOINT is not set: run the suite with tests/run, which starts DynamoDB Local")
    })
}

/// The settings the functions read, out of their ranges: the server refuses
/// to start, exit status 2, one line naming the variable — never a panic.
#[test]
fn config_out_of_range_is_refused_at_start() {
    for (name, value) in [
        ("MAX_WAIT_SECONDS", "26"),
        ("MAX_WAIT_SECONDS", "-1"),
        ("MAX_TTL_SECONDS", "0.0004"),
        ("MAX_TTL_SECONDS", "1e300"),
        ("MAX_WAITERS", "0"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_local-api"))
            .args(["--port", "0"])
            .env(name, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(name) && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
    // 0 is a valid wait ("never block").
    let server = Server::start_with_env(&[], &[("MAX_WAIT_SECONDS", "0")]);
    server.interrupt();
}

/// A TCP proxy to DynamoDB Local that can be switched to accept connections
/// and read requests but never answer, on new and open connections alike.
struct Blackhole {
    port: u16,
    hang: Arc<AtomicBool>,
}

impl Blackhole {
    fn start(upstream: &str) -> Blackhole {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hang = Arc::new(AtomicBool::new(false));
        let flag = hang.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let hang = flag.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            // Hanging: read and drop, keep the socket open.
                            if n == 0
                                || (!hang.load(Ordering::SeqCst)
                                    && to.write_all(&buf[..n]).is_err())
                            {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Blackhole { port, hang }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// DynamoDB stops answering (it accepts connections and reads requests, but
/// never responds): every route still answers our JSON 502 — never a hang,
/// never another body — within `wait` + 5 s, the local server's bound.
#[test]
fn a_database_that_never_answers_gets_json_502_in_time() {
    let proxy = Blackhole::start(&dynamodb_endpoint());
    let table = format!("local-api-{}", uuid::Uuid::new_v4().simple());
    let server = Server::start_with_env(
        &[
            "--dynamodb",
            &proxy.endpoint(),
            "--table",
            &table,
            "--log-format",
            "json",
        ],
        &[("MAX_WAIT_SECONDS", "2")],
    );
    let id = uuid::Uuid::new_v4().to_string();
    let pool = format!("/l/{id}");
    assert_eq!(server.request("PUT", &pool, r#"{"count": 1}"#).0, 200);
    proxy.hang.store(true, Ordering::SeqCst);
    let lease = uuid::Uuid::new_v4();
    let requests = [
        ("PUT", pool.clone(), r#"{"count": 2}"#.to_string(), 0.0),
        ("GET", pool.clone(), String::new(), 0.0),
        ("DELETE", pool.clone(), String::new(), 0.0),
        (
            "POST",
            format!("{pool}/borrow"),
            r#"{"ttl": 5}"#.to_string(),
            0.0,
        ),
        (
            "POST",
            format!("{pool}/borrow"),
            r#"{"ttl": 5, "wait": 2}"#.to_string(),
            2.0,
        ),
        (
            "POST",
            format!("{pool}/return"),
            format!(r#"{{"lease": "{lease}"}}"#),
            0.0,
        ),
    ];
    for (method, path, body, wait) in requests {
        let started = Instant::now();
        let (status, head, json) = server.request(method, &path, &body);
        let took = started.elapsed();
        println!("{method} {path}: {status} after {took:?}");
        assert_eq!(status, 502, "{method} {path}: {json}");
        assert!(head.contains("content-type: application/json"));
        assert!(json["error"].as_str().unwrap().contains("retry"), "{json}");
        assert!(
            took < Duration::from_secs_f64(wait + 5.0),
            "{method} {path} answered after {took:?}"
        );
    }
    // One EMF line per request, the 502s among them; never a whole UUID.
    // (Warnings come between them: the dispatcher's stream reads fail too.)
    let statuses_of = |lines: &[String]| -> Vec<u64> {
        lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["_aws"]["CloudWatchMetrics"].is_array())
            .filter_map(|l| l["status"].as_u64())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut lines = server.lines(7);
    while statuses_of(&lines).len() < 7 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        lines = server.lines(lines.len() + 1);
    }
    let statuses = statuses_of(&lines);
    assert_eq!(statuses, [200, 502, 502, 502, 502, 502, 502], "{lines:#?}");
    assert!(lines
        .iter()
        .all(|l| !l.contains(&id) && !l.contains(&lease.to_string())));
}

/// `--log-format json`: every request's line is JSON and EMF, for a success,
/// a 409 and an error; the pool shows as its first 8 hex digits only.
#[test]
fn json_log_lines_are_embedded_metric_format() {
    let server = Server::start(&["--log-format", "json"]);
    let id = uuid::Uuid::new_v4().to_string();
    let pool = format!("/l/{id}");
    server.request("PUT", &pool, r#"{"count": 1}"#);
    server.request("POST", &format!("{pool}/borrow"), r#"{"ttl": 30}"#);
    server.request("POST", &format!("{pool}/borrow"), r#"{"ttl": 30}"#);
    server.request("GET", "/nowhere", "");
    let lines = server.lines(4);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let mut statuses = Vec::new();
    for line in &lines {
        let line: Value = serde_json::from_str(line).expect("a JSON line");
        let directive = &line["_aws"]["CloudWatchMetrics"][0];
        assert!(line["_aws"]["Timestamp"].is_u64());
        assert_eq!(directive["Dimensions"], json!([["Route"]]));
        for metric in directive["Metrics"].as_array().unwrap() {
            assert!(line[metric["Name"].as_str().unwrap()].is_number());
        }
        assert!(line["Route"].is_string());
        statuses.push(line["status"].as_u64().unwrap());
    }
    assert_eq!(statuses, [200, 200, 409, 404]);
    assert!(lines.iter().all(|l| !l.contains(&id)));
    // The pool as every line names it: its key's first 8 hex digits, not the UUID's.
    let uuid = uuid::Uuid::parse_str(&id).expect("a UUID");
    let key: String = Sha256::digest(uuid.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        lines[0].contains(&format!("\"pool\":\"{key}\"")),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains(&id[..8]), "{}", lines[0]);
    server.interrupt();
}

/// A client that hangs up while its borrow waits gives its place up: once
/// the holder returns, the next borrower gets the slot at once, instead of
/// after the abandoned wait would have ended (or a slot handed to nobody).
fn a_disconnected_waiter_frees_its_place(server: &Server) {
    let id = uuid::Uuid::new_v4().to_string();
    let pool = format!("/l/{id}");
    server.request("PUT", &pool, r#"{"count": 1}"#);
    let (_, _, held) = server.request("POST", &format!("{pool}/borrow"), r#"{"ttl": 60}"#);
    // A waiter that will hang up: its request is sent, never read.
    let mut abandoned = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let body = r#"{"ttl": 60, "wait": 20}"#;
    write!(
        abandoned,
        "POST {pool}/borrow HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.request("GET", &pool, "").2["waiting"] != 1 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(abandoned);
    let hung_up = Instant::now();
    while server.request("GET", &pool, "").2["waiting"] != 0 {
        assert!(
            hung_up.elapsed() < Duration::from_secs(1),
            "the abandoned ticket still waits"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ret = format!(r#"{{"lease": "{}"}}"#, held["lease"].as_str().unwrap());
    server.request("POST", &format!("{pool}/return"), &ret);
    let (status, _, next) = server.request("POST", &format!("{pool}/borrow"), r#"{"ttl": 5}"#);
    assert_eq!(status, 200, "{next}");
    let usable_after = hung_up.elapsed();
    println!(
        "pool usable {} ms after the waiter hung up",
        usable_after.as_millis()
    );
    assert!(usable_after < Duration::from_secs(1));
}

#[test]
fn a_disconnected_waiter_frees_its_place_on_the_embedded_store() {
    let server = Server::start(&[]);
    a_disconnected_waiter_frees_its_place(&server);
}

#[test]
fn a_disconnected_waiter_frees_its_place_on_dynamodb_local() {
    let table = format!("local-api-{}", uuid::Uuid::new_v4().simple());
    let server = Server::start(&["--dynamodb", &dynamodb_endpoint(), "--table", &table]);
    a_disconnected_waiter_frees_its_place(&server);
}

/// What a raw request over one connection got back: status, head, JSON body,
/// and how long the answer took.
fn raw_exchange(port: u16, send: &[u8]) -> (u16, String, Value, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(send).unwrap();
    let mut answer = Vec::new();
    // The server closes the connection after each of these answers.
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| {
        panic!(
            "no HTTP answer to {:?}: {answer:?}",
            String::from_utf8_lossy(send)
        )
    });
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: body {body:?}"));
    (status, head.to_lowercase(), json, started.elapsed())
}

/// API.md: every answer is JSON, even to what is not HTTP; a stalled client
/// is answered 408 and let go after the read timeout.
#[test]
fn malformed_and_stalled_requests_get_json_errors() {
    let server = Server::start(&["--read-timeout", "1"]);
    let cases: [(&[u8], u16); 5] = [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /l/x HTTP/9.9\r\n\r\n", 400),
        // Announced 100 bytes, sent 8.
        (
            b"POST /l/6f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01/borrow HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n{\"ttl\":1",
            408,
        ),
        // Headers never finished.
        (b"GET /l/6f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01 HTTP/1.1\r\nHost: a\r\n", 408),
        (b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 200),
    ];
    for (send, expected) in cases {
        let (status, head, body, took) = raw_exchange(server.port, send);
        let what = String::from_utf8_lossy(send);
        assert_eq!(status, expected, "{what:?}: {head} {body}");
        assert!(
            head.contains("content-type: application/json"),
            "{what:?}: {head}"
        );
        if expected != 200 {
            assert!(body["error"].is_string(), "{what:?}: {body}");
        }
        if expected == 408 {
            assert!(
                took < Duration::from_secs(5),
                "{what:?}: answered after {took:?}"
            );
            assert!(body["error"].as_str().unwrap().contains("1 s"), "{body}");
        }
    }
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(100_000));
    let (status, head, body, _) = raw_exchange(server.port, long.as_bytes());
    assert_eq!(status, 414, "{head} {body}");
    assert!(
        body["error"].as_str().unwrap().contains("too long"),
        "{body}"
    );
}

/// Past --max-connections, a new connection gets a JSON 503 at once.
#[test]
fn connections_past_the_cap_get_a_json_503() {
    let server = Server::start(&["--max-connections", "2", "--read-timeout", "10"]);
    // Two connections held open, sending nothing yet.
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, body, took) = raw_exchange(
        server.port,
        b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("too many"),
        "{body}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(held);
    // Once they close, connections are served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, _, _) = raw_exchange(
            server.port,
            b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status} after the held connections closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /health` for load balancers; `HEAD` where `GET` works on the API's
/// own paths: the same status, no body.
#[test]
fn health_and_the_document_answer_get_and_head() {
    let server = Server::start(&[]);
    let (status, _, body, _) = raw_exchange(
        server.port,
        b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert_eq!(body, json!({"status": "ok"}));
    for path in ["/health", "/openapi.json"] {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        write!(
            stream,
            "HEAD {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        assert!(body.is_empty(), "HEAD {path} has a body: {body:?}");
    }
    let (status, head, _, _) = raw_exchange(
        server.port,
        b"POST /health HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(head.contains("allow: get, head"), "{head}");
}

/// `--cors-origin`: a browser page on that origin may call the API (its
/// preflight answered, every answer allowing the origin); without it, no
/// CORS header and OPTIONS is a 405 like any method no route has.
#[test]
fn cors_is_off_unless_an_origin_is_given() {
    let preflight =
        b"OPTIONS /l/6f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01/borrow HTTP/1.1\r\nHost: a\r\n\
Origin: https://app.example.com\r\nAccess-Control-Request-Method: POST\r\n\
Access-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n";
    let get = b"GET /health HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\nConnection: close\r\n\r\n";

    let off = Server::start(&[]);
    let (status, head, _, _) = raw_exchange(off.port, get);
    assert_eq!(status, 200);
    assert!(!head.contains("access-control-"), "{head}");
    let (status, _, _, _) = raw_exchange(off.port, preflight);
    assert_eq!(status, 405);

    let on = Server::start(&["--cors-origin", "https://app.example.com"]);
    let (status, head, _, _) = raw_exchange(on.port, get);
    assert_eq!(status, 200);
    assert!(
        head.contains("access-control-allow-origin: https://app.example.com"),
        "{head}"
    );
    let mut stream = TcpStream::connect(("127.0.0.1", on.port)).unwrap();
    stream.write_all(preflight).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let answer = answer.to_lowercase();
    assert!(answer.starts_with("http/1.1 204"), "{answer}");
    assert!(
        answer.contains("access-control-allow-methods: get, head, put, post, delete"),
        "{answer}"
    );
    assert!(
        answer.contains("access-control-allow-headers: content-type"),
        "{answer}"
    );

    let refused = Command::new(env!("CARGO_BIN_EXE_local-api"))
        .args(["--port", "0", "--cors-origin", "app.example.com"])
        .output()
        .unwrap();
    assert_eq!(
        refused.status.code(),
        Some(2),
        "a bad origin is refused at start"
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not an origin"));
}
