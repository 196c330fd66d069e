//! Command-line options. Bad input is a usage error (exit 2), never a panic.

use std::path::PathBuf;
use std::time::Duration;

use semaphore::service::Backoff;

use crate::scenarios::Strategy;

pub const USAGE: &str = "\
usage: bench [--profile smoke|full] [--out FILE] [--svg-dir DIR] [--dynamodb URL]
             [--clients N,N,...] [--seconds S] [--hold-ms N]
             [--latency-ms N] [--backoff FIRST_MS,CAP_MS]
             [--strategies LIST] [--only LIST] [--stores LIST] [--check]

Measures the semaphore service on DynamoDB (Local) and on the in-memory store:
DynamoDB calls and capacity per operation, contention goodput against a naive
baseline, wake delay, polling rate and item sizes.

  --profile P      smoke (CI, well under a minute) or full (the default; a few minutes)
  --out FILE       JSON report (default target/bench/report.json)
  --svg-dir DIR    where the SVG plots go (default target/bench)
  --dynamodb URL   use this DynamoDB endpoint; without it DynamoDB Local is started
                   with tests/dynamodb-local and stopped at the end
  --clients LIST   contention client counts (default 1,4,16,64; smoke 1,4,16)
  --seconds S      length of each contention run (default 10; smoke 1)
  --hold-ms N      how long a contention client holds each lease (default 0: worst case)
  --latency-ms N   add N ms to every store call, as a network would (default 0)
  --backoff F,C    the service's waiting backoff, first and cap in ms (default 15,90)
  --strategies L   contention strategies: ours, naive (default both)
  --only L         run only these sections: operations, contention, wake, polling, items
  --stores L       dynamodb, memory or both (the default)
  --check          exit 1 if any target is not met
  -h, --help       this text";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Smoke,
    Full,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Smoke => "smoke",
            Profile::Full => "full",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    pub profile: Profile,
    pub out: PathBuf,
    pub svg_dir: PathBuf,
    pub dynamodb: Option<String>,
    pub clients: Option<Vec<usize>>,
    pub seconds: Option<f64>,
    pub hold: Duration,
    pub added_latency: Duration,
    pub backoff: Backoff,
    pub strategies: Vec<Strategy>,
    /// Sections to run; empty means all.
    pub only: Vec<Section>,
    pub dynamodb_store: bool,
    pub memory_store: bool,
    pub check: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Operations,
    Contention,
    Wake,
    Polling,
    Items,
}

impl Section {
    const ALL: [(&'static str, Section); 5] = [
        ("operations", Section::Operations),
        ("contention", Section::Contention),
        ("wake", Section::Wake),
        ("polling", Section::Polling),
        ("items", Section::Items),
    ];
}

impl Args {
    pub fn runs(&self, section: Section) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Box<Args>),
    Help,
}

/// The workspace root: the bench is built from this tree.
pub fn workspace_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn default_dir() -> PathBuf {
    // The workspace's target/, wherever the bench is run from.
    workspace_root().join("target/bench")
}

pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = Args {
        profile: Profile::Full,
        out: default_dir().join("report.json"),
        svg_dir: default_dir(),
        dynamodb: None,
        clients: None,
        seconds: None,
        hold: Duration::ZERO,
        added_latency: Duration::ZERO,
        backoff: Backoff::default(),
        strategies: vec![Strategy::Ours, Strategy::Naive],
        only: Vec::new(),
        dynamodb_store: true,
        memory_store: true,
        check: false,
    };
    let mut argv = argv.into_iter();
    while let Some(arg) = argv.next() {
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--check" => args.check = true,
            "--profile" => {
                args.profile = match value()?.as_str() {
                    "smoke" => Profile::Smoke,
                    "full" => Profile::Full,
                    other => return Err(format!("--profile must be smoke or full, got {other:?}")),
                }
            }
            "--out" => args.out = non_empty(&flag, value()?)?.into(),
            "--svg-dir" => args.svg_dir = non_empty(&flag, value()?)?.into(),
            "--dynamodb" => {
                let url = value()?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("--dynamodb must be an http(s) URL, got {url:?}"));
                }
                args.dynamodb = Some(url);
            }
            "--clients" => {
                let raw = value()?;
                let clients = raw
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|n| (1..=512).contains(n))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!("--clients must list numbers 1…512, got {raw:?}"))?;
                args.clients = Some(clients);
            }
            "--seconds" => {
                let raw = value()?;
                let seconds = raw
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && (0.1..=3600.0).contains(s))
                    .ok_or(format!("--seconds must be 0.1…3600, got {raw:?}"))?;
                args.seconds = Some(seconds);
            }
            "--hold-ms" => {
                let raw = value()?;
                let ms = raw
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= 10_000)
                    .ok_or(format!("--hold-ms must be 0…10000, got {raw:?}"))?;
                args.hold = Duration::from_millis(ms);
            }
            "--latency-ms" => {
                let raw = value()?;
                let ms = raw
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= 1_000)
                    .ok_or(format!("--latency-ms must be 0…1000, got {raw:?}"))?;
                args.added_latency = Duration::from_millis(ms);
            }
            "--backoff" => {
                let raw = value()?;
                let parsed = raw
                    .split_once(',')
                    .and_then(|(f, c)| {
                        Some((f.trim().parse::<u64>().ok()?, c.trim().parse::<u64>().ok()?))
                    })
                    .filter(|(f, c)| (1..=10_000).contains(f) && f <= c && *c <= 10_000);
                let (first, cap) = parsed.ok_or(format!(
                    "--backoff must be FIRST_MS,CAP_MS with 1 ≤ FIRST ≤ CAP ≤ 10000, got {raw:?}"
                ))?;
                args.backoff.first = Duration::from_millis(first);
                args.backoff.cap = Duration::from_millis(cap);
            }
            "--strategies" => {
                let raw = value()?;
                args.strategies = raw
                    .split(',')
                    .map(|name| Strategy::ALL.into_iter().find(|s| s.name() == name.trim()))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!("--strategies must list ours or naive; got {raw:?}"))?;
            }
            "--only" => {
                let raw = value()?;
                args.only = raw
                    .split(',')
                    .map(|name| {
                        Section::ALL
                            .iter()
                            .find(|(n, _)| *n == name.trim())
                            .map(|(_, s)| *s)
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!(
                        "--only must list operations, contention, wake, polling, items; got {raw:?}"
                    ))?;
            }
            "--stores" => {
                let raw = value()?;
                let stores: Vec<&str> = raw.split(',').map(str::trim).collect();
                if stores.iter().any(|s| !["dynamodb", "memory"].contains(s)) {
                    return Err(format!(
                        "--stores must list dynamodb and/or memory, got {raw:?}"
                    ));
                }
                args.dynamodb_store = stores.contains(&"dynamodb");
                args.memory_store = stores.contains(&"memory");
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Command::Run(Box::new(args)))
}

fn non_empty(flag: &str, value: String) -> Result<String, String> {
    if value.is_empty() {
        Err(format!("{flag} must not be empty"))
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Command, String> {
        parse(line.split_whitespace().map(String::from))
    }

    fn run(line: &str) -> Args {
        match parse_str(line) {
            Ok(Command::Run(args)) => *args,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn defaults_and_flags() {
        let args = run("");
        assert_eq!(args.profile, Profile::Full);
        assert!(args.dynamodb.is_none());
        let args = run("--profile smoke --out r.json --svg-dir=plots --dynamodb http://127.0.0.1:8000 --clients 2,8 --seconds 0.5 --backoff 5,40 --check");
        assert_eq!(args.profile, Profile::Smoke);
        assert_eq!(args.out, PathBuf::from("r.json"));
        assert_eq!(args.svg_dir, PathBuf::from("plots"));
        assert_eq!(args.clients, Some(vec![2, 8]));
        assert_eq!(args.seconds, Some(0.5));
        assert_eq!(args.backoff.cap, Duration::from_millis(40));
        assert!(args.check);
        assert_eq!(parse_str("--help"), Ok(Command::Help));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for line in [
            "--profile",
            "--profile huge",
            "--bogus",
            "--clients 0",
            "--clients a,b",
            "--seconds -1",
            "--seconds NaN",
            "--backoff 90,15",
            "--backoff 5",
            "--only everything",
            "--stores redis",
            "--hold-ms -5",
            "--strategies ours,best",
            "--dynamodb localhost:8000",
            "--out=",
        ] {
            assert!(parse_str(line).is_err(), "{line}");
        }
    }
}
