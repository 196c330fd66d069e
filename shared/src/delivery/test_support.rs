//! What the delivery module's tests share: the wake queue recorded, and a
//! receiver on a loopback port.
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

use super::wake::{Wake, WakeSender};
use crate::domain::Callback;
use crate::keys::{LeaseId, PoolKey};
use crate::service::EnqueueRequest;

/// The wake queue, recorded; `fail_for` refuses that pool's wakes.
#[derive(Default)]
pub(super) struct Sent {
    pub(super) wakes: Mutex<Vec<(Wake, Duration)>>,
    pub(super) fail_for: Mutex<Option<PoolKey>>,
}

#[async_trait]
impl WakeSender for Sent {
    async fn send(&self, wake: &Wake, delay: Duration) -> Result<(), String> {
        if Some(wake.key) == *self.fail_for.lock().unwrap() {
            return Err("the queue is down".into());
        }
        self.wakes.lock().unwrap().push((wake.clone(), delay));
        Ok(())
    }
}

impl Sent {
    pub(super) fn taken(&self) -> Vec<(Wake, Duration)> {
        std::mem::take(&mut self.wakes.lock().unwrap())
    }
}

/// A receiver on a loopback port that tells each request's path as it
/// arrives: `/ok…` answers 200 at once, `/hang…` only once `release`
/// says so (each attempt until then times out, and is retried).
pub(super) async fn receiver(
    release: watch::Receiver<bool>,
) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    use http_body_util::Full;
    use hyper::body::{Bytes, Incoming};
    use hyper::{Request, Response};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tell, told) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (tell, release) = (tell.clone(), release.clone());
            tokio::spawn(async move {
                let serve = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (tell, mut release) = (tell.clone(), release.clone());
                    async move {
                        let path = request.uri().path().to_string();
                        let _ = tell.send(path.clone());
                        if path.starts_with("/hang") {
                            let _ = release.wait_for(|released| *released).await;
                        }
                        let mut response = Response::new(Full::new(Bytes::new()));
                        if path.starts_with("/refuse") {
                            *response.status_mut() = hyper::StatusCode::GONE;
                        }
                        Ok::<_, hyper::Error>(response)
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, serve)
                    .await;
            });
        }
    });
    (addr, told)
}

/// An enqueue of `lease` calling back `url` (token `t`): its lease held
/// 30 s once granted, its wait a minute.
pub(super) fn enqueue_request(lease: LeaseId, url: String) -> EnqueueRequest {
    EnqueueRequest {
        ttl_ms: 30_000,
        wait_ms: Some(60_000),
        lease,
        callback: Callback {
            url,
            token: "t".into(),
        },
    }
}
