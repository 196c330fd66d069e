//! One accepted connection before hyper takes it: the first request's head is
//! read here, within the read timeout, so that a stalled or malformed request
//! gets the API's JSON error (hyper answers those with an empty body, or
//! never), then hyper serves the connection with those bytes replayed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Bytes;
use semaphore::api::ApiResponse;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// The longest request target served (a pool path is under 100 bytes).
pub const MAX_TARGET_BYTES: usize = 8 * 1024;
/// The largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers parsed at most in one request head.
const MAX_HEADERS: usize = 100;

/// What reading the first request's head came to.
pub enum Head {
    /// A whole, well-formed head (and whatever followed it): serve it.
    Ready(Bytes),
    /// The client closed without sending a byte (a probe, a pre-opened
    /// connection): nothing to answer.
    Closed,
    /// Answer this and close.
    Refuse(ApiResponse),
}

/// Reads until the first request's head is complete, refusing one that
/// stalls (408), is not HTTP/1.x (400), has a target over
/// [`MAX_TARGET_BYTES`] (414) or a head over [`MAX_HEAD_BYTES`] (431).
pub async fn read_head(stream: &mut TcpStream, timeout: Duration) -> Head {
    let mut buffer = Vec::with_capacity(1024);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match judge(&buffer) {
            Judged::Complete => return Head::Ready(Bytes::from(buffer)),
            Judged::Refused(response) => return Head::Refuse(response),
            Judged::Partial => {}
        }
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await;
        match read {
            // Hung up (before a byte, or mid-head): nobody to answer.
            Ok(Ok(0)) | Ok(Err(_)) => return Head::Closed,
            Ok(Ok(n)) => buffer.extend_from_slice(&chunk[..n]),
            // An idle connection that never sent a byte is closed quietly.
            Err(_) if buffer.is_empty() => return Head::Closed,
            Err(_) => return Head::Refuse(ApiResponse::request_timeout(timeout)),
        }
    }
}

enum Judged {
    Complete,
    Partial,
    Refused(ApiResponse),
}

fn judge(buffer: &[u8]) -> Judged {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let parsed = request.parse(buffer);
    // The target is judged as soon as the request line is whole, not only
    // once the head is: a 100 KB path is refused before it is all read.
    if request.path.is_some_and(|p| p.len() > MAX_TARGET_BYTES)
        || (request.path.is_none() && target_so_far(buffer) > MAX_TARGET_BYTES)
    {
        return Judged::Refused(ApiResponse::unparsable(
            414,
            "request target too long (a pool's path is under 100 bytes)",
        ));
    }
    match parsed {
        Ok(httparse::Status::Complete(_)) => Judged::Complete,
        Ok(httparse::Status::Partial) if buffer.len() > MAX_HEAD_BYTES => {
            Judged::Refused(ApiResponse::unparsable(431, "request headers too large"))
        }
        Ok(httparse::Status::Partial) => Judged::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            Judged::Refused(ApiResponse::unparsable(431, "request has too many headers"))
        }
        Err(err) => Judged::Refused(ApiResponse::unparsable(
            400,
            &format!("not an HTTP/1.1 request ({err}); send METHOD /path HTTP/1.1"),
        )),
    }
}

/// The length of a request target still being received: the bytes after
/// the method's space, up to the next space or line end.
fn target_so_far(buffer: &[u8]) -> usize {
    let Some(start) = buffer.iter().position(|&b| b == b' ') else {
        return 0;
    };
    buffer[start + 1..]
        .iter()
        .take_while(|&&b| b != b' ' && b != b'\r' && b != b'\n')
        .count()
}

/// Writes `response` as a whole HTTP/1.1 answer and closes the connection.
pub async fn refuse(mut stream: TcpStream, response: ApiResponse) {
    let http = response.into_http();
    let body = http.body();
    let reason = http.status().canonical_reason().unwrap_or("");
    let head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        http.status().as_u16(),
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A stream that first replays the bytes already read from it.
pub struct Rewind {
    prefix: Bytes,
    inner: TcpStream,
}

impl Rewind {
    pub fn new(prefix: Bytes, inner: TcpStream) -> Self {
        Rewind { prefix, inner }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(buffer: &[u8]) -> Option<u16> {
        match judge(buffer) {
            Judged::Complete => Some(200),
            Judged::Partial => None,
            Judged::Refused(response) => Some(response.into_http().status().as_u16()),
        }
    }

    #[test]
    fn heads_are_judged_as_hyper_would_but_answered_in_json() {
        assert_eq!(status(b"GET /l/x HTTP/1.1\r\nHost: a\r\n\r\n"), Some(200));
        assert_eq!(status(b"GET /l/x HTTP/1.1\r\nHost: a\r\n"), None);
        assert_eq!(status(b"GARBAGE\r\n\r\n"), Some(400));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(100_000));
        assert_eq!(status(long.as_bytes()), Some(414));
        // Refused while the target is still arriving.
        let arriving = format!("GET /{}", "a".repeat(MAX_TARGET_BYTES + 1));
        assert_eq!(status(arriving.as_bytes()), Some(414));
        let fat = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD_BYTES + 1));
        assert_eq!(status(fat.as_bytes()), Some(431));
    }
}
