//! Command-line options (clap). Bad input is a usage error (exit 2), never a panic.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use semaphore::service::Backoff;

use crate::scenarios::Strategy;

/// Measures the semaphore service on DynamoDB (Local) and on the in-memory
/// store: DynamoDB calls and capacity per operation, contention goodput
/// against a naive baseline, wake delay, polling rate and item sizes.
///
/// Prints Markdown tables; writes a JSON report and SVG plots.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(name = "bench")]
pub struct Args {
    /// smoke: CI, well under a minute; full: a few minutes.
    #[arg(long, value_enum, default_value_t = Profile::Full)]
    pub profile: Profile,

    /// The JSON report.
    #[arg(long, value_name = "FILE", default_value_os_t = default_dir().join("report.json"),
          value_parser = non_empty)]
    pub out: PathBuf,

    /// Where the SVG plots go.
    #[arg(long, value_name = "DIR", default_value_os_t = default_dir(), value_parser = non_empty)]
    pub svg_dir: PathBuf,

    /// Use this DynamoDB endpoint. Without it DynamoDB Local is started with
    /// tests/dynamodb-local and stopped at the end.
    #[arg(long, value_name = "URL", value_parser = http_url)]
    pub dynamodb: Option<String>,

    /// Contention client counts, 1…512 [default: 1,4,16,64; smoke: 1,4,16].
    #[arg(long, value_name = "N,N,…", value_delimiter = ',', value_parser = clients)]
    pub clients: Option<Vec<usize>>,

    /// Length of each contention run, 0.1…3600 s [default: 10; smoke: 1].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = seconds)]
    pub seconds: Option<f64>,

    /// How long a contention client holds each lease, 0…10000 ms (0: the worst case).
    #[arg(long = "hold-ms", value_name = "N", default_value = "0", allow_negative_numbers = true,
          value_parser = millis(10_000))]
    pub hold: Duration,

    /// Add N ms, 0…1000, to every store call, as a network would.
    #[arg(long = "latency-ms", value_name = "N", default_value = "0",
          allow_negative_numbers = true, value_parser = millis(1_000))]
    pub added_latency: Duration,

    /// The service's waiting backoff, first and cap in ms (1 ≤ FIRST ≤ CAP ≤ 10000).
    #[arg(long = "backoff", value_name = "FIRST_MS,CAP_MS", value_parser = backoff,
          help = backoff_help())]
    backoff_ms: Option<Backoff>,

    /// Contention strategies.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values = ["ours", "naive"],
          value_parser = strategy())]
    pub strategies: Vec<Strategy>,

    /// Run only these sections [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    pub only: Vec<Section>,

    /// The stores to measure.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum,
          default_values = ["dynamodb", "memory"])]
    pub stores: Vec<StoreKind>,

    /// Exit 1 if any target is not met.
    #[arg(long)]
    pub check: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Section {
    Operations,
    Contention,
    Wake,
    Polling,
    Items,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Dynamodb,
    Memory,
}

impl Args {
    pub fn runs(&self, section: Section) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }

    pub fn dynamodb_store(&self) -> bool {
        self.stores.contains(&StoreKind::Dynamodb)
    }

    pub fn memory_store(&self) -> bool {
        self.stores.contains(&StoreKind::Memory)
    }

    /// The service's default backoff, with `--backoff`'s first and cap.
    pub fn backoff(&self) -> Backoff {
        self.backoff_ms.unwrap_or_default()
    }
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

fn backoff_help() -> String {
    let default = Backoff::default();
    format!(
        "The service's waiting backoff, first and cap in ms, 1 ≤ FIRST ≤ CAP ≤ 10000 \
         [default: {},{}]",
        default.first.as_millis(),
        default.cap.as_millis()
    )
}

/// One of [`Strategy::ALL`] by name (listed in --help and in errors).
fn strategy() -> impl TypedValueParser<Value = Strategy> {
    PossibleValuesParser::new(Strategy::ALL.map(Strategy::name)).map(|name| {
        // PossibleValuesParser has checked the name.
        let known = Strategy::ALL.into_iter().find(|s| s.name() == name);
        known.unwrap_or(Strategy::Ours)
    })
}

fn non_empty(raw: &str) -> Result<PathBuf, String> {
    if raw.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(raw.into())
    }
}

fn http_url(raw: &str) -> Result<String, String> {
    if raw.starts_with("http://") || raw.starts_with("https://") {
        Ok(raw.to_string())
    } else {
        Err("must be an http(s) URL".into())
    }
}

fn clients(raw: &str) -> Result<usize, String> {
    raw.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=512).contains(n))
        .ok_or("client counts must be 1…512".into())
}

fn seconds(raw: &str) -> Result<f64, String> {
    raw.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.1..=3600.0).contains(s))
        .ok_or("must be 0.1…3600".into())
}

/// Whole milliseconds, 0 to `max`.
fn millis(max: u64) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |raw| {
        raw.parse::<u64>()
            .ok()
            .filter(|ms| *ms <= max)
            .map(Duration::from_millis)
            .ok_or(format!("must be 0…{max}"))
    }
}

fn backoff(raw: &str) -> Result<Backoff, String> {
    let (first, cap) = raw
        .split_once(',')
        .and_then(|(f, c)| Some((f.trim().parse::<u64>().ok()?, c.trim().parse::<u64>().ok()?)))
        .filter(|(f, c)| (1..=10_000).contains(f) && f <= c && *c <= 10_000)
        .ok_or("must be FIRST_MS,CAP_MS with 1 ≤ FIRST ≤ CAP ≤ 10000")?;
    Ok(Backoff {
        first: Duration::from_millis(first),
        cap: Duration::from_millis(cap),
        ..Backoff::default()
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse_str(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
    }

    fn run(line: &str) -> Args {
        parse_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn the_command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_and_flags() {
        let args = run("");
        assert_eq!(args.profile, Profile::Full);
        assert!(args.dynamodb.is_none());
        assert_eq!(args.out, default_dir().join("report.json"));
        assert_eq!(args.backoff(), Backoff::default());
        assert_eq!(args.strategies, [Strategy::Ours, Strategy::Naive]);
        assert!(args.dynamodb_store() && args.memory_store());
        assert!(args.only.is_empty() && args.runs(Section::Wake));
        assert_eq!(
            (args.hold, args.added_latency),
            (Duration::ZERO, Duration::ZERO)
        );
        let args = run("--profile smoke --out r.json --svg-dir=plots --dynamodb http://127.0.0.1:8000 --clients 2,8 --seconds 0.5 --backoff 5,40 --check");
        assert_eq!(args.profile, Profile::Smoke);
        assert_eq!(args.out, PathBuf::from("r.json"));
        assert_eq!(args.svg_dir, PathBuf::from("plots"));
        assert_eq!(args.clients, Some(vec![2, 8]));
        assert_eq!(args.seconds, Some(0.5));
        assert_eq!(args.backoff().cap, Duration::from_millis(40));
        assert!(args.check);
        let args = run("--stores memory --only wake,items --strategies naive --hold-ms 5");
        assert!(!args.dynamodb_store() && args.memory_store());
        assert!(args.runs(Section::Items) && !args.runs(Section::Contention));
        assert_eq!(args.strategies, [Strategy::Naive]);
        assert_eq!(args.hold, Duration::from_millis(5));
        let help = parse_str("--help").unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
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
