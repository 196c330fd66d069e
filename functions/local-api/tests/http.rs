//! The real `local-api` binary over real HTTP, as a new user runs it: on the
//! embedded store and with `--dynamodb` on DynamoDB Local.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_local-api"))
            .args(["--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start local-api");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
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
        json!({"id": id, "count": 2, "in_use": 0, "available": 2})
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
fn serves_every_route_on_dynamodb_local() {
    let endpoint = std::env::var("DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("DYNAMODB_ENDPOINT is not set: run the suite with tests/run, which starts DynamoDB Local")
    });
    // A table of its own proves the server creates a missing table.
    let table = format!("local-api-{}", uuid::Uuid::new_v4().simple());
    let server = Server::start(&["--dynamodb", &endpoint, "--table", &table]);
    full_session(&server);
    server.interrupt();
}

#[test]
fn bad_arguments_print_usage() {
    let output = Command::new(env!("CARGO_BIN_EXE_local-api"))
        .arg("--nonsense")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage: local-api --port P"));
}
