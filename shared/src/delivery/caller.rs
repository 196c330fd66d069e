//! One delivery attempt (async mode): one POST to a callback, through the
//! checked resolver only (see [`crate::callback`] for which URLs are called).

use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::redirect;

use crate::callback::{CallbackPolicy, Refusal};

/// The HTTP client's only resolver: a name resolves to its addresses only if
/// every one is allowed, and the connection is made to those.
#[derive(Clone, Debug)]
pub struct CheckedResolver(pub CallbackPolicy);

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0;
        let name = name.as_str().to_string();
        Box::pin(async move {
            let addrs = policy.resolve(&name).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// One delivery attempt's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// A 2xx answer.
    Delivered,
    /// Worth trying again: no answer in time, no connection, `408`, `429` or
    /// a `5xx`.
    Retry(String),
    /// Never worth trying again: a refused address, a redirect (not
    /// followed), another `4xx`.
    Failed(String),
}

/// Calls receivers back, per a [`CallbackPolicy`].
#[derive(Clone, Debug)]
pub struct Caller {
    http: reqwest::Client,
    policy: CallbackPolicy,
    timeout: Duration,
}

impl Caller {
    /// A caller whose every attempt ends within `timeout` (a receiver is to
    /// answer within a few seconds; it may do its work after answering).
    pub fn new(policy: CallbackPolicy, timeout: Duration) -> Result<Caller, reqwest::Error> {
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckedResolver(policy)))
            .redirect(redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(3)))
            .build()?;
        Ok(Caller {
            http,
            policy,
            timeout,
        })
    }

    pub fn policy(&self) -> CallbackPolicy {
        self.policy
    }

    /// The longest one attempt takes.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` (JSON) to `url` with `Authorization: Bearer <token>`.
    pub async fn call(&self, url: &str, token: &str, body: String) -> Attempt {
        let url = match self.policy.check_url(url) {
            Ok(url) => url,
            Err(refusal) => return Attempt::Failed(refusal.to_string()),
        };
        let sent = self
            .http
            .post(url)
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        match sent {
            Ok(answer) => {
                let status = answer.status().as_u16();
                match status {
                    200..=299 => Attempt::Delivered,
                    300..=399 => Attempt::Failed(format!(
                        "the receiver answered HTTP {status} (redirects are not followed)"
                    )),
                    408 | 429 | 500..=599 => {
                        Attempt::Retry(format!("the receiver answered HTTP {status}"))
                    }
                    _ => Attempt::Failed(format!("the receiver answered HTTP {status}")),
                }
            }
            Err(err) => match refusal_in(&err) {
                Some(refusal) => Attempt::Failed(refusal.to_string()),
                None if err.is_timeout() => {
                    Attempt::Retry("the receiver did not answer in time".into())
                }
                // Without the URL: it may carry the receiver's own secrets.
                None => Attempt::Retry(format!("no answer: {}", err.without_url())),
            },
        }
    }
}

/// The resolver's refusal among an error's causes.
fn refusal_in(err: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(refusal) = err.downcast_ref::<Refusal>() {
            return Some(refusal.clone());
        }
        cause = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    const STRICT: CallbackPolicy = CallbackPolicy { allow_local: false };
    const LOCAL: CallbackPolicy = CallbackPolicy { allow_local: true };

    #[tokio::test]
    async fn the_resolver_refuses_the_same_names() {
        // What the client resolves through refuses the same names.
        let refused = CheckedResolver(STRICT)
            .resolve("localhost".parse().unwrap())
            .await;
        assert!(refused.is_err());
        let allowed = CheckedResolver(LOCAL)
            .resolve("localhost".parse().unwrap())
            .await
            .map(|addrs| addrs.collect::<Vec<_>>())
            .unwrap_or_default();
        assert!(!allowed.is_empty() && allowed.iter().all(|a| a.ip().is_loopback()));
    }

    /// A receiver on a loopback port: `/ok` answers 204 and keeps what it
    /// got; `/busy` 503, `/moved` 302, `/gone` 410, `/hang` never answers.
    async fn receiver() -> (
        SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    ) {
        use http_body_util::{BodyExt, Full};
        use hyper::body::{Bytes, Incoming};
        use hyper::{Request, Response};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (got, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let got = got.clone();
                tokio::spawn(async move {
                    let serve = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let got = got.clone();
                        async move {
                            let path = request.uri().path().to_string();
                            let auth = request
                                .headers()
                                .get(AUTHORIZATION)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let body = request.into_body().collect().await?.to_bytes();
                            let status = match path.as_str() {
                                "/ok" => {
                                    let body = String::from_utf8_lossy(&body).to_string();
                                    let _ = got.send((auth, body));
                                    204
                                }
                                "/busy" => 503,
                                "/moved" => 302,
                                "/gone" => 410,
                                _ => {
                                    tokio::time::sleep(Duration::from_secs(30)).await;
                                    200
                                }
                            };
                            let mut answer = Response::new(Full::new(Bytes::new()));
                            *answer.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            if status == 302 {
                                answer.headers_mut().insert(
                                    "location",
                                    hyper::header::HeaderValue::from_static("/ok"),
                                );
                            }
                            Ok::<_, hyper::Error>(answer)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, serve)
                        .await;
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_delivery_is_one_post_with_the_token_and_no_redirect() {
        let (addr, mut seen) = receiver().await;
        let caller = Caller::new(LOCAL, Duration::from_millis(500)).unwrap();
        let url = |path: &str| format!("http://{addr}{path}");
        let body = r#"{"ticket":1}"#.to_string();

        assert_eq!(
            caller.call(&url("/ok"), "s3cret", body.clone()).await,
            Attempt::Delivered
        );
        assert_eq!(
            seen.recv().await,
            Some(("Bearer s3cret".to_string(), body.clone()))
        );
        // Through a name, resolved by the checked resolver.
        let by_name = format!("http://localhost:{}/ok", addr.port());
        assert_eq!(
            caller.call(&by_name, "t", body.clone()).await,
            Attempt::Delivered
        );
        assert!(seen.recv().await.is_some());

        assert!(matches!(
            caller.call(&url("/busy"), "t", body.clone()).await,
            Attempt::Retry(why) if why.contains("503")
        ));
        assert!(matches!(
            caller.call(&url("/hang"), "t", body.clone()).await,
            Attempt::Retry(why) if why.contains("in time")
        ));
        assert!(matches!(
            caller.call(&url("/gone"), "t", body.clone()).await,
            Attempt::Failed(why) if why.contains("410")
        ));
        assert!(matches!(
            caller.call(&url("/moved"), "t", body.clone()).await,
            Attempt::Failed(why) if why.contains("302") && why.contains("redirect")
        ));
        assert!(seen.try_recv().is_err(), "the redirect was not followed");
        assert!(matches!(
            caller.call("http://127.0.0.1:9/ok", "t", body.clone()).await,
            Attempt::Retry(why) if !why.contains("127.0.0.1:9/ok")
        ));

        // The same receiver, refused by the strict policy: by literal and by name.
        let strict = Caller::new(STRICT, Duration::from_millis(500)).unwrap();
        let https = format!("https://localhost:{}/ok", addr.port());
        assert!(matches!(
            strict.call(&https, "t", body.clone()).await,
            Attempt::Failed(why) if why.contains("non-public address") && !why.contains("127.0.0.1")
        ));
        assert!(matches!(
            strict.call(&url("/ok"), "t", body).await,
            Attempt::Failed(why) if why.contains("https")
        ));
        assert!(seen.try_recv().is_err());
    }
}
