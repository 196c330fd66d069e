//! Callback receivers for async mode's tests and the burst benchmark: the
//! one HTTP/1.1 request a delivery makes, read off a loopback connection,
//! and the status line that answers it.

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One delivery as a receiver sees it.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub path: String,
    /// The `Authorization` header.
    pub authorization: String,
    /// The JSON body (`Null` if it is not JSON).
    pub body: Value,
}

/// Reads one request (headers, then `Content-Length` bytes of body); `None`
/// when the connection ends first.
pub async fn read_request(stream: &mut TcpStream) -> Option<Delivered> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let header = |wanted: &str| {
            text[..end].lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case(wanted)
                    .then(|| value.trim().to_string())
            })
        };
        let length = header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return Some(Delivered {
                path: text.split_whitespace().nth(1)?.to_string(),
                authorization: header("authorization").unwrap_or_default(),
                body: serde_json::from_slice(&buf[end + 4..end + 4 + length])
                    .unwrap_or(Value::Null),
            });
        }
    }
}

/// Answers `status` with an empty body and closes; whether it was sent.
pub async fn answer(stream: &mut TcpStream, status: u16) -> bool {
    let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(answer.as_bytes()).await.is_ok()
}
