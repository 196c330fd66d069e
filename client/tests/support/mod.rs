//! A real `local-api` to test against (in-memory or on DynamoDB Local), a
//! fault-injecting HTTP proxy, and small helpers.

#![allow(dead_code)] // each test crate uses its own part of this module

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use semaphore_client::{Client, Pool, RetryPolicy};
use semaphore_tests::{harness, Backend};
use uuid::Uuid;

/// The `local-api` binary, as the workspace's test build makes it (`cargo test
/// --no-run --workspace`, which is what nextest runs before any test, so here
/// it is a no-op that only reports the path), for this profile and into the
/// target directory this test runs from (so `CARGO_TARGET_DIR` and
/// `--target-dir` are honored). Building `-p local-api` alone instead would
/// unify dependency features differently and compile a second copy of them.
pub fn local_api_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target-dir>/<profile>/deps/<this test>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary under <target>/<profile>/deps");
        let target_dir = profile_dir.parent().expect("a target directory");
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("client/ is in the workspace");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(workspace)
            .args(["test", "--no-run", "--workspace", "--message-format=json"])
            .arg("--target-dir")
            .arg(target_dir);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(other) => {
                build.args(["--profile", other]);
            }
        }
        // Cargo gives this test its package's CARGO_MANIFEST_DIR, CARGO_PKG_* and
        // so on; build scripts that watch them (ring's does) would see a change
        // and rebuild half the dependency tree. Build as from a plain shell.
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .iter()
            .any(|prefix| text.starts_with(prefix))
            {
                build.env_remove(&name);
            }
        }
        let output = build
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo test --no-run");
        assert!(
            output.status.success(),
            "cargo test --no-run --workspace failed"
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|message| {
                // The binary itself, not the test harness of its unit tests.
                let is_local_api = message["reason"] == "compiler-artifact"
                    && message["target"]["name"] == "local-api"
                    && message["target"]["kind"][0] == "bin"
                    && message["profile"]["test"] == false;
                let executable = message["executable"].as_str()?;
                is_local_api.then(|| PathBuf::from(executable))
            })
            .expect("cargo built no local-api binary")
    })
}

/// A running `local-api`, stopped when dropped.
pub struct Server {
    child: Child,
    pub url: String,
}

impl Server {
    /// Starts `local-api` on a free port with `env` (e.g. `MAX_WAIT_SECONDS`).
    /// DynamoDB needs `DYNAMODB_ENDPOINT` (tests/run sets it): these tests
    /// never skip a store.
    pub fn start(store: Backend, env: &[(&str, &str)]) -> Server {
        Self::start_with(store, env, &[])
    }

    /// [`Server::start`] with more arguments (`--allow-local-callbacks`).
    pub fn start_with(store: Backend, env: &[(&str, &str)], args: &[&str]) -> Server {
        let mut command = Command::new(local_api_bin());
        command.args(["--port", "0"]).args(args);
        if let Backend::DynamoDb = store {
            let endpoint = harness::endpoint();
            // Every local-api on a table runs a dispatcher on its stream: a server
            // whose test uses async mode gets a table of its own (another server's
            // dispatcher would deliver its grants too, or, strict, refuse them).
            let table = if args.contains(&"--allow-local-callbacks") {
                format!("semaphore-client-tests-{}", Uuid::new_v4().simple())
            } else {
                "semaphore-client-tests".to_string()
            };
            command.args(["--dynamodb", &endpoint, "--table", &table]);
        }
        let mut child = command
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start local-api");
        // It prints its address once it serves (after creating the table).
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stdout = BufReader::new(stdout);
        stdout
            .read_line(&mut line)
            .expect("read local-api's first line");
        // Its later lines (warnings) go to the test's output, and its writes
        // never meet a closed pipe.
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                eprintln!("local-api: {line}");
            }
        });
        let port: u16 = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in local-api's first line {line:?}"));
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a future to completion (tests are synchronous, like the processes
/// they drive). One runtime for the whole test process: a client's pooled
/// connections belong to the runtime that opened them.
pub fn block<F: std::future::Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// Runs a future as a task of that runtime.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(future)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// A new random pool registered with `count` slots on `url`.
pub fn new_pool(url: &str, count: u16) -> Pool {
    let pool = Client::new(url)
        .expect("client")
        .with_retry(RetryPolicy::default().with_retries(0))
        .pool(Uuid::new_v4());
    block(pool.register(count)).expect("register");
    pool
}

pub fn in_use(pool: &Pool) -> u32 {
    block(pool.inspect()).expect("inspect").in_use
}

/// Borrowers waiting in the pool's queue.
pub fn waiting(pool: &Pool) -> u32 {
    block(pool.inspect())
        .expect("inspect")
        .waiting
        .expect("the server answers waiting")
}

/// Waits until `condition` holds, checking every 10 ms; panics after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the proxy does to requests.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Passes everything through, and, like API Gateway, finishes every call
    /// upstream even when its client hangs up: the server never learns that
    /// a waiting borrow's client went away (local-api would otherwise give
    /// the wait up by itself when the connection closes).
    LikeApiGateway,
    /// Answers every request `404` with this body, as a server that is not
    /// the service would (a wrong URL).
    NotFound(&'static str),
    /// Answers every return `502` without forwarding it; passes everything
    /// else through: a lease then ends only when its ttl runs out.
    ReturnsFail,
    /// Forwards the first borrow to the server but answers the client `502`
    /// (so the server did take a slot); passes everything else through.
    FirstBorrowAnswered502,
    /// Answers every request `502` without forwarding it.
    Always502,
}

/// An HTTP proxy in front of `upstream` that injects `fault`, on its own
/// thread for the rest of the test process.
pub struct Proxy {
    pub url: String,
    /// Borrow requests that reached the proxy.
    pub borrows: Arc<AtomicUsize>,
}

impl Proxy {
    pub fn start(upstream: &str, fault: Fault) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let borrows = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(ProxyState {
            upstream: upstream.to_string(),
            fault,
            borrows: borrows.clone(),
            http: reqwest::Client::new(),
        });
        std::thread::spawn(move || {
            block(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let state = state.clone();
                            async move { Ok::<_, Infallible>(state.handle(request).await) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        });
        Proxy {
            url: format!("http://127.0.0.1:{port}"),
            borrows,
        }
    }
}

struct ProxyState {
    upstream: String,
    fault: Fault,
    borrows: Arc<AtomicUsize>,
    http: reqwest::Client,
}

impl ProxyState {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let body = match request.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => return respond(400, r#"{"error":"proxy: bad request body"}"#.into()),
        };
        let borrow_number = if path.ends_with("/borrow") {
            self.borrows.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        match self.fault {
            Fault::Always502 => {
                return respond(502, r#"{"error":"injected by the test proxy"}"#.into())
            }
            Fault::NotFound(body) => {
                let mut response = respond(404, Bytes::from_static(body.as_bytes()));
                if !body.starts_with('{') {
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("text/html"),
                    );
                }
                return response;
            }
            Fault::ReturnsFail if path.ends_with("/return") => {
                return respond(502, r#"{"error":"injected by the test proxy"}"#.into())
            }
            Fault::LikeApiGateway | Fault::FirstBorrowAnswered502 | Fault::ReturnsFail => {}
        }
        let forward = {
            let request = self
                .http
                .request(method, format!("{}{path}", self.upstream))
                .header("content-type", "application/json")
                .body(body);
            async move {
                let upstream_failed = || Bytes::from_static(b"{\"error\":\"proxy: upstream\"}");
                match request.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        match response.bytes().await {
                            Ok(bytes) => (status, bytes),
                            Err(_) => (502, upstream_failed()),
                        }
                    }
                    Err(_) => (502, upstream_failed()),
                }
            }
        };
        let (status, body) = match self.fault {
            // A task of its own runs on when this handler is dropped (its
            // client hung up), and holds the upstream connection open.
            Fault::LikeApiGateway => match tokio::spawn(forward).await {
                Ok(answer) => answer,
                Err(_) => (502, Bytes::from_static(b"{\"error\":\"proxy: task\"}")),
            },
            _ => forward.await,
        };
        if borrow_number == 1 && matches!(self.fault, Fault::FirstBorrowAnswered502) {
            // The server granted (or refused) this borrow; the client never learns which.
            return respond(502, r#"{"error":"injected by the test proxy"}"#.into());
        }
        respond(status, body)
    }
}

fn respond(status: u16, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// A callback receiver on loopback (async mode), on the tests' runtime:
/// answers every POST `200` and keeps each request's `Authorization` header
/// and JSON body.
pub struct Receiver {
    pub url: String,
    got: Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        use semaphore_tests::receiver::{answer, read_request};
        let listener = block(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let url = format!("http://{}/granted", listener.local_addr().expect("addr"));
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = got.clone();
        spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                if let Some(delivered) = read_request(&mut stream).await {
                    record
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((delivered.authorization, delivered.body));
                    answer(&mut stream, 200).await;
                }
            }
        });
        Receiver { url, got }
    }

    /// What it has received so far.
    pub fn got(&self) -> Vec<(String, serde_json::Value)> {
        self.got.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
