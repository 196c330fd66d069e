//! The whole API on one local HTTP server, routed as API Gateway routes it,
//! over the same shared code as the Lambda functions. Not deployed.
//!
//! ```text
//! local-api --port P                                  # embedded in-memory store
//! local-api --port P --dynamodb URL --table NAME      # DynamoDB (Local) at URL
//!           [--log-format text|json]                  # json: the Lambda's EMF lines
//! ```
//!
//! It reads `MAX_TTL_SECONDS`, `MAX_WAIT_SECONDS` and `MAX_WAITERS` as the
//! functions do, and refuses a bad value the same way (exit status 2).

use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use semaphore::api::{self, ApiResponse};
use semaphore::metrics::LogFormat;
use semaphore::service::Call;
use semaphore::store::{dynamodb, DynamoDbStore, MemoryStore, PoolStore};
use semaphore::{config, openapi, Limits, Route, Service};
use tokio::net::TcpListener;

const USAGE: &str =
    "usage: local-api --port P [--dynamodb URL --table NAME] [--log-format text|json]";

/// Requests are a few dozen bytes; anything this large is not ours.
const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(Debug, PartialEq)]
struct Args {
    port: u16,
    dynamodb: Option<(String, String)>,
    log_format: LogFormat,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut port, mut url, mut table) = (None, None, None);
    let mut log_format = LogFormat::Text;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => {
                port = Some(
                    value()?
                        .parse::<u16>()
                        .map_err(|e| format!("--port: {e}"))?,
                )
            }
            "--dynamodb" => url = Some(value()?),
            "--table" => table = Some(value()?),
            "--log-format" => {
                log_format = match value()?.as_str() {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    other => return Err(format!("--log-format: text or json, not {other:?}")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let port = port.ok_or("--port is required")?;
    let dynamodb = match (url, table) {
        (None, None) => None,
        (Some(url), Some(table)) => Some((url, table)),
        _ => return Err("--dynamodb and --table go together".into()),
    };
    Ok(Args {
        port,
        dynamodb,
        log_format,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    lambda_http::tracing::init_default_subscriber();
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(err) => {
            if !err.is_empty() {
                eprintln!("local-api: {err}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The same variables, ranges and refusal as the Lambda functions.
    let limits = match config::limits_from_env() {
        Ok(limits) => limits,
        Err(err) => {
            eprintln!("local-api: {err}");
            return ExitCode::from(2);
        }
    };
    match run(args, limits).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("local-api: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, limits: Limits) -> Result<(), String> {
    let (store, described): (Arc<dyn PoolStore>, String) = match &args.dynamodb {
        None => (
            Arc::new(MemoryStore::new()),
            "embedded in-memory store".into(),
        ),
        Some((url, table)) => {
            let client = config::dynamodb_client(Some(url)).await;
            dynamodb::ensure_table(&client, table)
                .await
                .map_err(|e| format!("DynamoDB at {url}: {e}"))?;
            (
                Arc::new(DynamoDbStore::new(client, table.clone())),
                format!("DynamoDB at {url}, table {table}"),
            )
        }
    };
    let service = Arc::new(Service::new(store, limits));
    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", args.port))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    println!("local-api listening on http://127.0.0.1:{port} ({described})");

    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let service = service.clone();
                let log_format = args.log_format;
                tokio::spawn(async move {
                    let handler = hyper::service::service_fn(move |req| {
                        serve(service.clone(), log_format, req)
                    });
                    // A client hanging up mid-request is not our error.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), handler)
                        .await;
                });
            }
            _ = &mut shutdown => {
                println!("local-api: shutting down");
                return Ok(());
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn serve(
    service: Arc<Service>,
    log_format: LogFormat,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // The API's own description is served before routing (no pool, no store).
    if let Some(response) = openapi::respond(request.method().as_str(), request.uri().path()) {
        return Ok(response
            .into_http()
            .map(|body| Full::new(Bytes::from(body))));
    }
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let mut call = Call::new(None);
    let (route_key, raw_id, response) = match api::resolve(&method, &path) {
        Ok((route, id)) => {
            let response = match Limited::new(request.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
            {
                Ok(body) => {
                    let parsed = api::Request::parse(route, id, &body.to_bytes());
                    // A client that hangs up while its borrow waits gives the
                    // wait up: hyper drops this future, and the guard sends
                    // the return of its lease id.
                    let guard = GiveUp {
                        service: service.clone(),
                        request: parsed.as_ref().ok().and_then(api::Request::give_up),
                    };
                    let response = api::respond(&service, route, parsed, &mut call).await;
                    guard.disarm();
                    response
                }
                Err(_) => ApiResponse {
                    status: 413,
                    body: serde_json::json!({ "error": "request body too large" }),
                    allow: None,
                },
            };
            (route.key(), Some(id), response)
        }
        Err(err) => ("$default", None, api::error_response(&err)),
    };
    api::request_log(route_key, raw_id, &response, started, &call).emit(log_format);
    Ok(response
        .into_http()
        .map(|body| Full::new(Bytes::from(body))))
}

/// Gives a waiting borrow up if it is dropped before it answers (its client
/// disconnected): the return of its lease id takes its ticket out of the
/// queue, or returns the slot handed to it meanwhile, in the background.
struct GiveUp {
    service: Arc<Service>,
    request: Option<api::Request>,
}

impl GiveUp {
    fn disarm(mut self) {
        self.request = None;
    }
}

impl Drop for GiveUp {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let service = self.service.clone();
        // Dropped inside the runtime (hyper drops the request future there).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut call = Call::new(None);
                let response = api::respond(&service, Route::Return, Ok(request), &mut call).await;
                lambda_http::tracing::info!(
                    status = response.status,
                    "client hung up while its borrow waited: the wait was given up"
                );
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_the_fixed_interface() {
        assert_eq!(
            args("--port 3000"),
            Ok(Args {
                port: 3000,
                dynamodb: None,
                log_format: LogFormat::Text,
            })
        );
        assert_eq!(
            args("--port 1 --dynamodb http://x:8000 --table t"),
            Ok(Args {
                port: 1,
                dynamodb: Some(("http://x:8000".into(), "t".into())),
                log_format: LogFormat::Text,
            })
        );
        assert_eq!(
            args("--port 1 --log-format json").map(|a| a.log_format),
            Ok(LogFormat::Json)
        );
        assert!(args("--port 1 --log-format yaml").is_err());
        assert!(args("").is_err());
        assert!(args("--port x").is_err());
        assert!(args("--port 1 --dynamodb http://x").is_err());
        assert!(args("--port 1 --bogus").is_err());
    }
}
