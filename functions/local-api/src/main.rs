//! The whole API on one local HTTP server, routed as API Gateway routes it,
//! over the same shared code as the Lambda functions. Not deployed.
//!
//! ```text
//! local-api --port P                                  # embedded in-memory store
//! local-api --port P --dynamodb URL --table NAME      # DynamoDB (Local) at URL
//!           [--bind ADDR]                             # default 127.0.0.1
//!           [--log-format text|json]                  # json: the Lambda's EMF lines
//!           [--allow-local-callbacks]                 # async mode: http and loopback receivers
//! ```
//!
//! Async mode's dispatcher runs in-process: told of each change to a pool
//! with async work (on DynamoDB by the table's stream, as in AWS; in memory
//! by the service), it admits, hands on, records and delivers grants to
//! their callbacks.
//!
//! It reads `MAX_TTL_SECONDS`, `MAX_WAIT_SECONDS`, `MAX_WAITERS`,
//! `MAX_ASYNC_WAIT_SECONDS`, `MAX_TICKETS` and `WAITING_BUDGET` as the
//! functions do, and refuses a bad value the
//! same way (exit status 2).

mod connection;
mod cors;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use semaphore::api::{self, ApiResponse, MAX_BODY_BYTES};
use semaphore::callback::CallbackPolicy;
use semaphore::delivery::{self, Caller};
use semaphore::metrics::LogFormat;
use semaphore::store::{dynamodb, DynamoDbStore, MemoryStore};
use semaphore::{config, Limits, Service};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use connection::{Head, Rewind};
use cors::Cors;

/// The whole semaphore API on one local HTTP server, over the same code as
/// the Lambda functions: an in-memory store, or DynamoDB (Local).
///
/// It reads MAX_TTL_SECONDS, MAX_WAIT_SECONDS, MAX_WAITERS,
/// MAX_ASYNC_WAIT_SECONDS, MAX_TICKETS and WAITING_BUDGET as the functions do, and refuses a value out of
/// range (exit status 2).
#[derive(Debug, PartialEq, Parser)]
#[command(name = "local-api", version)]
struct Args {
    /// Port to listen on; 0 picks a free one (printed at start).
    #[arg(long)]
    port: u16,
    /// Address to listen on: 0.0.0.0 (or ::) serves other machines too. The
    /// pool UUID is the only credential, and this server speaks plain HTTP.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// A DynamoDB endpoint (DynamoDB Local, for example http://127.0.0.1:8000)
    /// instead of the in-memory store; the table is created if missing.
    #[arg(long, value_name = "URL", requires = "table")]
    dynamodb: Option<String>,
    /// The DynamoDB table.
    #[arg(long, value_name = "NAME", requires = "dynamodb")]
    table: Option<String>,
    /// Each request's log line: text, or json as the Lambda functions write it
    /// (CloudWatch Embedded Metric Format).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    log_format: Format,
    /// Async mode: also call back `http` URLs and loopback addresses (a
    /// receiver on this machine). Private, link-local and metadata addresses
    /// stay refused.
    #[arg(long)]
    allow_local_callbacks: bool,
    /// Seconds a client has to send a whole request (head and body); a
    /// stalled one gets a 408 and its connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    read_timeout: u64,
    /// Open connections served at once (a waiting borrow holds one); past
    /// it a new connection gets a 503 and is closed.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Let a browser page on this origin call the API (CORS): `*`, or
    /// scheme://host[:port] like http://localhost:5173. Off by default; the
    /// template's CorsAllowOrigin parameter does the same deployed.
    #[arg(long, value_name = "ORIGIN", value_parser = Cors::parse)]
    cors_origin: Option<Cors>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

impl From<Format> for LogFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Text => LogFormat::Text,
            Format::Json => LogFormat::Json,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    lambda_http::tracing::init_default_subscriber();
    // --help and --version exit 0; a bad argument prints usage, exit 2.
    let args = Args::parse();
    // The same variables, ranges and refusal as the Lambda functions.
    let idle_pool_days = match config::idle_pool_days_from_lookup(|name| std::env::var(name).ok()) {
        Ok(days) => days,
        Err(err) => {
            eprintln!("local-api: {err}");
            return ExitCode::from(2);
        }
    };
    let limits = match config::limits_from_env() {
        Ok(limits) => limits,
        Err(err) => {
            eprintln!("local-api: {err}");
            return ExitCode::from(2);
        }
    };
    match run(args, limits, idle_pool_days).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("local-api: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, limits: Limits, idle_pool_days: u64) -> Result<(), String> {
    let dynamodb = args.dynamodb.as_ref().zip(args.table.as_ref());
    let policy = CallbackPolicy {
        allow_local: args.allow_local_callbacks,
    };
    let local = delivery::Local::new();
    let service = match dynamodb {
        None => {
            let store = Arc::new(MemoryStore::new());
            // The service tells the dispatcher of each change, as the stream
            // filter would.
            Service::new(store.clone(), limits)
                .with_tickets(store)
                .with_watch(local.watch())
        }
        Some((url, table)) => {
            let client = config::dynamodb_client(Some(url)).await;
            dynamodb::ensure_table(&client, table)
                .await
                .map_err(|e| format!("DynamoDB at {url}: {e}"))?;
            // The dispatcher follows the table's stream, as in AWS.
            let arn = dynamodb::stream_arn(&client, table)
                .await
                .map_err(|e| format!("DynamoDB at {url}: {e}"))?;
            delivery::stream::follow(url, arn, local.watch()).await?;
            let mut store = DynamoDbStore::new(client, table.clone());
            if let Some(after) = config::idle_expiry(idle_pool_days, &limits) {
                store = store.with_idle_expiry(after);
            }
            let store = Arc::new(store);
            Service::new(store.clone(), limits).with_tickets(store)
        }
    };
    let described = match dynamodb {
        None => "embedded in-memory store".to_string(),
        Some((url, table)) => format!("DynamoDB at {url}, table {table}"),
    };
    let service = Arc::new(service.with_callback_policy(policy));
    let caller = Caller::new(policy, Duration::from_secs(5))
        .map_err(|e| format!("cannot build the callback client: {e}"))?;
    local.start(Arc::new(
        delivery::Dispatcher::new(service.clone(), caller).with_log(args.log_format.into()),
    ));
    let wanted = SocketAddr::new(args.bind, args.port);
    let listener = TcpListener::bind(wanted)
        .await
        .map_err(|e| format!("cannot listen on {wanted}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Ctrl-C and SIGTERM are caught from before the line that says the
    // server is up: one sent as soon as it is read must stop it cleanly.
    let shutdown = shutdown_signal()?;
    println!("local-api listening on http://{addr} ({described})");
    tokio::pin!(shutdown);
    let settings = Arc::new(Settings {
        log_format: args.log_format.into(),
        read_timeout: Duration::from_secs(args.read_timeout),
        cors: args.cors_origin.clone(),
    });
    let connections = Arc::new(Semaphore::new(args.max_connections as usize));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let service = service.clone();
                let settings = settings.clone();
                let permit = connections.clone().try_acquire_owned().ok();
                tokio::spawn(async move {
                    let Some(_permit) = permit else {
                        connection::refuse(stream, ApiResponse::too_many_connections()).await;
                        return;
                    };
                    serve_connection(stream, service, settings).await;
                });
            }
            _ = &mut shutdown => {
                println!("local-api: shutting down");
                return Ok(());
            }
        }
    }
}

/// One connection: its first request's head read here (JSON errors for a
/// stalled or malformed one), then hyper, which closes a later request whose
/// head stalls.
async fn serve_connection(mut stream: TcpStream, service: Arc<Service>, settings: Arc<Settings>) {
    let read_timeout = settings.read_timeout;
    let head = match connection::read_head(&mut stream, read_timeout).await {
        Head::Ready(head) => head,
        Head::Closed => return,
        Head::Refuse(response) => return connection::refuse(stream, response).await,
    };
    let handler =
        hyper::service::service_fn(move |req| serve(service.clone(), settings.clone(), req));
    // A client hanging up mid-request is not our error.
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .serve_connection(TokioIo::new(Rewind::new(head, stream)), handler)
        .await;
}

/// Ctrl-C or SIGTERM, whichever comes first. The handlers are installed
/// here, at once, not when the future is first polled.
#[cfg(unix)]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let install = |kind| signal(kind).map_err(|e| format!("cannot catch signals: {e}"));
    let mut interrupt = install(SignalKind::interrupt())?;
    let mut terminate = install(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// What every request of the server is served with.
struct Settings {
    log_format: LogFormat,
    read_timeout: Duration,
    cors: Option<Cors>,
}

async fn serve(
    service: Arc<Service>,
    settings: Arc<Settings>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(cors) = &settings.cors {
        if let Some((status, headers)) = cors.preflight(request.method(), request.headers()) {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            return Ok(response);
        }
    }
    let (log_format, read_timeout) = (settings.log_format, settings.read_timeout);
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let incoming = api::Incoming {
        method: &method,
        path: &path,
        entry: api::Entry::Table,
        deadline: None,
        log: log_format,
        give_up_with: Some(service.clone()),
    };
    // Read once the request is routed; over the limit, a 413; stalled, a 408.
    let body = async move {
        let collect = Limited::new(request.into_body(), MAX_BODY_BYTES).collect();
        match tokio::time::timeout(read_timeout, collect).await {
            Ok(Ok(body)) => Ok(body.to_bytes()),
            Ok(Err(_)) => Err(ApiResponse::from(api::TooLarge)),
            Err(_) => Err(ApiResponse::from(api::BodyTimedOut(read_timeout))),
        }
    };
    let response = api::serve(Some(&service), incoming, body).await;
    let mut response = response
        .into_http()
        .map(|body| Full::new(Bytes::from(body)));
    if let Some(cors) = &settings.cors {
        cors.allow(response.headers_mut());
    }
    if response.status() == hyper::StatusCode::REQUEST_TIMEOUT {
        // The rest of a stalled body may never come: the connection ends.
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("local-api").chain(s.split_whitespace()))
    }

    #[test]
    fn parses_the_fixed_interface() {
        let localhost = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(
            args("--port 3000").unwrap(),
            Args {
                port: 3000,
                bind: localhost,
                dynamodb: None,
                table: None,
                log_format: Format::Text,
                allow_local_callbacks: false,
                read_timeout: 10,
                max_connections: 1024,
                cors_origin: None,
            }
        );
        assert_eq!(
            args("--port 1 --dynamodb http://x:8000 --table t").unwrap(),
            Args {
                port: 1,
                bind: localhost,
                dynamodb: Some("http://x:8000".into()),
                table: Some("t".into()),
                log_format: Format::Text,
                allow_local_callbacks: false,
                read_timeout: 10,
                max_connections: 1024,
                cors_origin: None,
            }
        );
        assert_eq!(
            args("--port 1 --log-format json").unwrap().log_format,
            Format::Json
        );
        assert_eq!(
            args("--port 1 --bind 0.0.0.0").unwrap().bind,
            IpAddr::from([0, 0, 0, 0])
        );
        assert_eq!(args("--port 1 --bind ::").unwrap().bind.to_string(), "::");
        assert!(
            args("--port 1 --allow-local-callbacks")
                .unwrap()
                .allow_local_callbacks
        );
        for bad in [
            "--port 1 --log-format yaml",
            "",
            "--port x",
            "--port 1 --dynamodb http://x",
            "--port 1 --table t",
            "--port 1 --bind localhost:80",
            "--port 1 --bogus",
        ] {
            assert!(args(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
