//! The README's "Try it" shell examples, run as a new user pastes them into
//! bash against a real `local-api`: every output the README shows in a
//! comment (`# {...}`, `…` standing for what varies) must be printed, in
//! that order.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const README: &str = include_str!("../../../README.md");

/// The `sh` blocks of the README's section `heading`, in order.
fn shell_blocks(heading: &str) -> Vec<String> {
    let section = README
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("README has no section {heading:?}"));
    section
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .map(str::to_owned)
        .collect()
}

/// What the README says is printed: its comment lines that stand alone.
fn expected_outputs(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|line| line.strip_prefix("# "))
        .map(|said| said.strip_prefix("the receiver prints: ").unwrap_or(said))
        .map(str::to_owned)
        .collect()
}

/// Whether `line` is `pattern`, where each `…` stands for any text.
fn matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == pattern;
    }
    if !line.starts_with(first) || !line.ends_with(last) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[test]
fn the_readme_examples_print_what_the_readme_says() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_local-api"))
        .args(["--port", "0", "--allow-local-callbacks"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start local-api");
    let mut first = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read local-api's first line");
    // "local-api listening on http://ADDR:PORT (…)"
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_owned();

    let blocks = shell_blocks("Try it");
    assert_eq!(blocks.len(), 2, "the sync and the async example");
    let readme_script = blocks.join("\n");
    let receiver = free_port();
    let script = readme_script
        .replace("http://127.0.0.1:3000/", &format!("{url}/"))
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{receiver}"))
        .replace(
            r#"("127.0.0.1", 9000)"#,
            &format!(r#"("127.0.0.1", {receiver})"#),
        );
    assert_ne!(
        script, readme_script,
        "the examples name the URL to replace"
    );

    let started = Instant::now();
    // Bounded: a wait that never ends fails the test instead of hanging it.
    let out = Command::new("timeout")
        .args(["60", "bash", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    let printed: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for expected in expected_outputs(&readme_script) {
        match printed[at..].iter().position(|line| matches(&expected, line)) {
            Some(found) => at += found + 1,
            None => panic!(
                "the README says {expected:?} is printed next, but the rest was:\n{}\n(stderr: {stderr})",
                printed[at..].join("\n")
            ),
        }
    }
}

#[test]
fn the_wildcard_matches_only_what_it_stands_for() {
    assert!(matches(
        r#"{"id":"…","count":2}"#,
        r#"{"id":"abc","count":2}"#
    ));
    assert!(!matches(
        r#"{"id":"…","count":2}"#,
        r#"{"id":"abc","count":3}"#
    ));
    assert!(matches("a…b…c", "a1b2c"));
    assert!(!matches("a…b…c", "a1c2b"));
    assert!(matches("exact", "exact"));
    assert!(!matches("exact", "exact!"));
}
