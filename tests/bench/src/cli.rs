//! Command-line options (clap). Bad input is a usage error (exit 2), never a panic.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use semaphore::service::Timing;

use crate::scenarios::Strategy;

/// Measures the semaphore service on DynamoDB (Local) and on the in-memory
/// store: DynamoDB calls and capacity per operation, contention goodput of
/// the service against a naive baseline, fairness
/// under saturation, read load of many waiters, wake delay, polling rate and
/// item sizes.
///
/// Prints Markdown tables; writes a JSON report and SVG plots.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(name = "bench")]
pub struct Args {
    /// smoke: CI, well under a minute; full: about 12 minutes.
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

    /// Contention client counts, 1…512 [default: 1,4,16,64; smoke: 1,16].
    #[arg(long, value_name = "N,N,…", value_delimiter = ',', value_parser = clients)]
    pub clients: Option<Vec<usize>>,

    /// Length of each contention run, 0.1…3600 s [default: 6; smoke: 1].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = seconds)]
    pub seconds: Option<f64>,

    /// Length of each saturation run, 0.1…3600 s [default: 60; smoke: 1.5].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = seconds)]
    pub saturation_seconds: Option<f64>,

    /// Waiter counts of the read-load runs, 1…5000 [default: 10,100,1000;
    /// smoke: 10]. DynamoDB runs only those ≤ 100; memory runs all.
    #[arg(long, value_name = "N,N,…", value_delimiter = ',', value_parser = waiters)]
    pub waiters: Option<Vec<usize>>,

    /// How long a contention client holds each lease, 0…10000 ms (0: the worst case).
    #[arg(long = "hold-ms", value_name = "N", default_value = "0", allow_negative_numbers = true,
          value_parser = millis(10_000))]
    pub hold: Duration,

    /// Simulated network delay per store call, 0…1000 ms each: every
    /// contention row is run at each. The largest is also the delay of the
    /// in-memory read-load runs.
    #[arg(long = "latency-ms", value_name = "N,N,…", value_delimiter = ',',
          default_values = ["0", "8"], allow_negative_numbers = true, value_parser = millis(1_000))]
    pub latencies: Vec<Duration>,

    /// The service's poll interval for the head of the queue and its cap, in
    /// ms (1 ≤ POLL ≤ CAP ≤ 10000).
    #[arg(long = "poll", value_name = "POLL_MS,CAP_MS", value_parser = poll, help = poll_help())]
    poll_ms: Option<(Duration, Duration)>,

    /// Strategies: new (the product), naive (whole-pool conditions, re-read
    /// on conflict, 3 s sleep when full). Saturation, read load, wake and
    /// polling run new only.
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          default_values = ["new", "naive"], value_parser = strategy())]
    pub strategies: Vec<Strategy>,

    /// Pools with room to spare: COUNT:HELD:CLIENTS each, clients cycling on
    /// a pool of COUNT with HELD slots held throughout; COUNT:churn:CLIENTS,
    /// every slot churning (the pool filled with leases ending throughout
    /// the run, clients borrowing leases of 1–3 s, half returned, half left
    /// to expire), billed per grant (the `room` section,
    /// strategy new, at the largest --latency-ms) [default:
    /// 32:0:1,32:0:4,32:0:8,32:0:16,32:0:32,64:0:32,32:22:16; smoke: 8:2:4].
    #[arg(long, value_name = "C:H:N,…", value_delimiter = ',', value_parser = room_shape)]
    pub room: Option<Vec<RoomShape>>,

    /// Run only these sections [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    pub only: Vec<Section>,

    /// The stores to measure.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum,
          default_values = ["dynamodb", "memory"])]
    pub stores: Vec<StoreKind>,

    /// Exit 1 if any measured target is not met.
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
    /// Pools with room to spare (`--room`).
    Room,
    Saturation,
    Waiters,
    Wake,
    Polling,
    Items,
}

/// A pool of `count` slots, `held` of them held throughout, and `clients`
/// cycling on it; or, with `churn`, nothing held before the run and every
/// slot churning (short leases, half of them abandoned to expire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoomShape {
    pub count: u16,
    pub held: u16,
    pub clients: usize,
    pub churn: bool,
}

/// The default rows of the `room` section.
pub const ROOM_DEFAULT: [RoomShape; 7] = [
    RoomShape {
        count: 32,
        held: 0,
        clients: 1,
        churn: false,
    },
    RoomShape {
        count: 32,
        held: 0,
        clients: 4,
        churn: false,
    },
    RoomShape {
        count: 32,
        held: 0,
        clients: 8,
        churn: false,
    },
    RoomShape {
        count: 32,
        held: 0,
        clients: 16,
        churn: false,
    },
    RoomShape {
        count: 32,
        held: 0,
        clients: 32,
        churn: false,
    },
    RoomShape {
        count: 64,
        held: 0,
        clients: 32,
        churn: false,
    },
    RoomShape {
        count: 32,
        held: 22,
        clients: 16,
        churn: false,
    },
];

fn room_shape(text: &str) -> Result<RoomShape, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let [count, held, clients] = parts[..] else {
        return Err(format!(
            "{text:?}: COUNT:HELD:CLIENTS or COUNT:churn:CLIENTS, e.g. 32:22:16"
        ));
    };
    let churn = held.trim() == "churn";
    let number = |what: &str, s: &str| {
        s.trim()
            .parse::<u16>()
            .map_err(|_| format!("{what} {s:?} is not a whole number"))
    };
    let shape = RoomShape {
        count: number("count", count)?,
        held: if churn { 0 } else { number("held", held)? },
        clients: usize::from(number("clients", clients)?),
        churn,
    };
    if shape.count == 0 || shape.count > 1000 {
        return Err(format!("count {}: 1…1000", shape.count));
    }
    if shape.held >= shape.count {
        return Err(format!(
            "held {}: below the count {}",
            shape.held, shape.count
        ));
    }
    if shape.clients == 0 || shape.clients > 512 {
        return Err(format!("clients {}: 1…512", shape.clients));
    }
    Ok(shape)
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

    /// The service's default timing, with `--poll`'s interval and cap.
    pub fn timing(&self) -> Timing {
        let mut timing = Timing::default();
        if let Some((poll, cap)) = self.poll_ms {
            timing.poll = poll;
            timing.poll_cap = cap;
        }
        timing
    }

    /// The strategies run, in the order given, without repeats.
    pub fn strategies(&self) -> Vec<Strategy> {
        let mut out: Vec<Strategy> = Vec::new();
        for s in &self.strategies {
            if !out.contains(s) {
                out.push(*s);
            }
        }
        out
    }

    /// The contention latencies, without repeats, in the order given.
    pub fn latencies(&self) -> Vec<Duration> {
        let mut out: Vec<Duration> = Vec::new();
        for l in &self.latencies {
            if !out.contains(l) {
                out.push(*l);
            }
        }
        out
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

fn poll_help() -> String {
    let default = Timing::default();
    format!(
        "The service's poll interval for the head of the queue and its cap, in ms, \
         1 ≤ POLL ≤ CAP ≤ 10000 [default: {},{}]",
        default.poll.as_millis(),
        default.poll_cap.as_millis()
    )
}

/// One of [`Strategy::ALL`] by name (listed in --help and in errors).
fn strategy() -> impl TypedValueParser<Value = Strategy> {
    PossibleValuesParser::new(Strategy::ALL.map(Strategy::name)).map(|name| {
        // PossibleValuesParser has checked the name.
        let known = Strategy::ALL.into_iter().find(|s| s.name() == name);
        known.unwrap_or(Strategy::New)
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

fn waiters(raw: &str) -> Result<usize, String> {
    raw.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=5000).contains(n))
        .ok_or("waiter counts must be 1…5000".into())
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
        raw.trim()
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= max)
            .map(Duration::from_millis)
            .ok_or(format!("must be 0…{max}"))
    }
}

fn poll(raw: &str) -> Result<(Duration, Duration), String> {
    let (first, cap) = raw
        .split_once(',')
        .and_then(|(f, c)| Some((f.trim().parse::<u64>().ok()?, c.trim().parse::<u64>().ok()?)))
        .filter(|(f, c)| (1..=10_000).contains(f) && f <= c && *c <= 10_000)
        .ok_or("must be POLL_MS,CAP_MS with 1 ≤ POLL ≤ CAP ≤ 10000")?;
    Ok((Duration::from_millis(first), Duration::from_millis(cap)))
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
    fn room_rows_are_count_held_clients() {
        assert_eq!(run("").room, None, "the profile's rows");
        let args = run("--room 32:22:16,1000:990:64,1000:churn:64 --only room");
        assert!(args.runs(Section::Room) && !args.runs(Section::Contention));
        assert_eq!(
            args.room,
            Some(vec![
                RoomShape {
                    count: 32,
                    held: 22,
                    clients: 16,
                    churn: false,
                },
                RoomShape {
                    count: 1000,
                    held: 990,
                    clients: 64,
                    churn: false,
                },
                RoomShape {
                    count: 1000,
                    held: 0,
                    clients: 64,
                    churn: true,
                },
            ])
        );
        for bad in ["32:32:16", "0:0:1", "1001:0:1", "32:0:0", "32:0", "32:x:4"] {
            assert!(parse_str(&format!("--room {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_and_flags() {
        let args = run("");
        assert_eq!(args.profile, Profile::Full);
        assert!(args.dynamodb.is_none());
        assert_eq!(args.out, default_dir().join("report.json"));
        assert_eq!(args.timing(), Timing::default());
        assert_eq!(args.strategies(), [Strategy::New, Strategy::Naive]);
        assert_eq!(args.latencies(), [Duration::ZERO, Duration::from_millis(8)]);
        assert!(args.dynamodb_store() && args.memory_store());
        assert!(args.only.is_empty() && args.runs(Section::Wake));
        assert_eq!(args.hold, Duration::ZERO);
        let args = run("--profile smoke --out r.json --svg-dir=plots --dynamodb http://127.0.0.1:8000 --clients 2,8 --seconds 0.5 --poll 5,40 --check --latency-ms 3 --waiters 7,70 --saturation-seconds 2");
        assert_eq!(args.profile, Profile::Smoke);
        assert_eq!(args.out, PathBuf::from("r.json"));
        assert_eq!(args.svg_dir, PathBuf::from("plots"));
        assert_eq!(args.clients, Some(vec![2, 8]));
        assert_eq!(args.seconds, Some(0.5));
        assert_eq!(args.saturation_seconds, Some(2.0));
        assert_eq!(args.waiters, Some(vec![7, 70]));
        assert_eq!(args.timing().poll_cap, Duration::from_millis(40));
        assert_eq!(args.latencies(), [Duration::from_millis(3)]);
        assert!(args.check);
        let args =
            run("--stores memory --only wake,items --strategies naive,new,naive --hold-ms 5");
        assert!(!args.dynamodb_store() && args.memory_store());
        assert!(args.runs(Section::Items) && !args.runs(Section::Contention));
        assert_eq!(args.strategies(), [Strategy::Naive, Strategy::New]);
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
            "--saturation-seconds 0",
            "--waiters 0",
            "--waiters 9999",
            "--poll 90,15",
            "--poll 5",
            "--only everything",
            "--stores redis",
            "--hold-ms -5",
            "--latency-ms 0,x",
            "--latency-ms 2000",
            "--strategies new,best",
            "--strategies ours",
            "--dynamodb localhost:8000",
            "--out=",
        ] {
            assert!(parse_str(line).is_err(), "{line}");
        }
    }
}
