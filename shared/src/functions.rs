//! The ten functions of template.yaml, declared once: each one's logical id
//! and binary, the routes it serves, the environment variables it reads at
//! start, and the AWS operations its code can call. `tests/aws_local/
//! functions.json` is this list as JSON (a test keeps them equal), from
//! which tests/aws-local checks the SAM-transformed template (routes,
//! variables set, IAM statements) and the calls each function really makes.
//!
//! Not listed: what the AWS SDK and the Lambda runtime read themselves
//! (`AWS_REGION`, credentials, `AWS_LAMBDA_*`), which Lambda sets.

use crate::api::Route;

/// One function of template.yaml.
#[derive(Clone, Copy, Debug)]
pub struct Function {
    /// Its logical id in template.yaml.
    pub logical_id: &'static str,
    /// Its binary (`BuildProperties: Binary`), the crate under functions/.
    pub binary: &'static str,
    pub routes: &'static [Serves],
    /// How its `main` builds its state, which decides what it reads.
    pub init: Init,
    pub env: &'static [EnvVar],
    pub calls: &'static [Call],
}

/// A route of the HTTP API a function serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serves {
    Route(Route),
    /// `ANY $default`: whatever no route matched.
    Default,
}

impl Serves {
    pub fn method(self) -> &'static str {
        match self {
            Serves::Route(route) => route.method(),
            Serves::Default => "ANY",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Serves::Route(route) => route.template_path(),
            Serves::Default => "$default",
        }
    }
}

/// How a function's `main` builds its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// `config::service_from_env`: the service's settings.
    Service,
    /// `config::granting_service_from_env`: the service's settings and the
    /// wake queue its grants to async tickets wake the dispatcher through
    /// (`config::granting_settings_from_lookup`).
    Granting,
    /// `delivery::Handler::from_env`: the service's settings and the wake
    /// queue (`config::dispatcher_settings_from_lookup`).
    Dispatcher,
    /// Nothing (`lambda::fallback`).
    Nothing,
}

/// An environment variable a function reads at start (or, for the metric
/// namespace, at its first log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvVar {
    pub name: &'static str,
    /// It fails at start without it.
    pub required: bool,
}

/// An AWS operation a function's code can call, on what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// As IAM names it: `dynamodb:GetItem`, `sqs:SendMessage`.
    pub action: &'static str,
    pub on: Resource,
}

/// What a call acts on, by template.yaml's logical ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// Any item of the table.
    Table,
    /// Only the items of these partition keys (base64): the init's warm-up read.
    TableKeys(&'static [&'static str]),
    /// The table's index.
    Index(&'static str),
    /// The wake queue.
    WakeQueue,
}

/// The table, the index and the queue as template.yaml names them.
pub const TABLE: &str = "PoolTable";
pub const WAKE_QUEUE: &str = "WakeQueue";
/// `shared/src/store/dynamodb/schema.rs`'s `WARM_UP_KEY`, base64.
pub const WARM_UP_KEY: &str = "d2FybS11cA==";

const fn required(name: &'static str) -> EnvVar {
    EnvVar {
        name,
        required: true,
    }
}

const fn optional(name: &'static str) -> EnvVar {
    EnvVar {
        name,
        required: false,
    }
}

const fn on_table(action: &'static str) -> Call {
    Call {
        action,
        on: Resource::Table,
    }
}

/// Read by `metrics.rs` (the EMF namespace) and by the runtime's log
/// subscriber (`lambda_http::tracing`), outside `config.rs`.
pub const READ_OUTSIDE_CONFIG: [&str; 2] = ["METRICS_NAMESPACE", "RUST_LOG"];

/// What `config::Config` reads: every function that builds the service.
const SERVICE_ENV: [EnvVar; 12] = [
    required("TABLE_NAME"),
    optional("MAX_TTL_SECONDS"),
    optional("MAX_WAIT_SECONDS"),
    optional("MAX_WAITERS"),
    optional("MAX_ASYNC_WAIT_SECONDS"),
    optional("MAX_TICKETS"),
    optional("WAITING_BUDGET"),
    optional("IDLE_POOL_DAYS"),
    optional("AWS_ENDPOINT_URL_DYNAMODB"),
    optional("ALLOW_LOCAL_CALLBACKS"),
    optional("METRICS_NAMESPACE"),
    optional("RUST_LOG"),
];

/// What `config::granting_settings_from_lookup` reads: the service's
/// settings and, optional, the wake queue.
const GRANTING_ENV: [EnvVar; 13] = with(SERVICE_ENV, optional("WAKE_QUEUE_URL"));

/// `vars` and one more.
const fn with(vars: [EnvVar; 12], more: EnvVar) -> [EnvVar; 13] {
    let mut all = [more; 13];
    let mut i = 0;
    while i < vars.len() {
        all[i] = vars[i];
        i += 1;
    }
    all
}

/// The wake without delay a write that hands a slot to an async ticket sends.
const WAKE_NOW: Call = Call {
    action: "sqs:SendMessage",
    on: Resource::WakeQueue,
};

/// The service's settings and the wake queue it sends to.
const DISPATCHER_ENV: [EnvVar; 13] = with(SERVICE_ENV, required("WAKE_QUEUE_URL"));

const FALLBACK_ENV: [EnvVar; 2] = [optional("METRICS_NAMESPACE"), optional("RUST_LOG")];

/// Every function of template.yaml. The init's warm-up read is a `GetItem`
/// of [`WARM_UP_KEY`]: covered by a `GetItem` on any key where the code
/// reads the table anyway.
pub const FUNCTIONS: [Function; 10] = [
    Function {
        logical_id: "RegisterFunction",
        binary: "register",
        routes: &[Serves::Route(Route::Register)],
        init: Init::Granting,
        env: &GRANTING_ENV,
        // GetItem: the pool item read again after a write whose outcome is
        // unknown, or after lost writes.
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:Query"),
            WAKE_NOW,
        ],
    },
    Function {
        logical_id: "InspectFunction",
        binary: "inspect",
        routes: &[Serves::Route(Route::Inspect)],
        init: Init::Service,
        env: &SERVICE_ENV,
        // Query: a split pool's segment items, read after its pool item.
        calls: &[on_table("dynamodb:GetItem"), on_table("dynamodb:Query")],
    },
    Function {
        logical_id: "DeleteFunction",
        binary: "delete",
        routes: &[Serves::Route(Route::Delete)],
        init: Init::Service,
        env: &SERVICE_ENV,
        // One DeleteItem, never read again: its answer says whether a pool
        // was there. A split pool's segment items go after it (Query,
        // BatchWriteItem).
        calls: &[
            Call {
                action: "dynamodb:GetItem",
                on: Resource::TableKeys(&[WARM_UP_KEY]),
            },
            on_table("dynamodb:DeleteItem"),
            on_table("dynamodb:Query"),
            on_table("dynamodb:BatchWriteItem"),
        ],
    },
    Function {
        logical_id: "BorrowFunction",
        binary: "borrow",
        routes: &[Serves::Route(Route::Borrow)],
        init: Init::Granting,
        env: &GRANTING_ENV,
        // PutItem and the index: a borrower behind async tickets waits in
        // the backlog (its ticket item) and admits its head.
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:Query"),
            Call {
                action: "dynamodb:Query",
                on: Resource::Index("by_ticket"),
            },
            WAKE_NOW,
        ],
    },
    Function {
        logical_id: "ReturnFunction",
        binary: "return-lease",
        routes: &[Serves::Route(Route::Return)],
        init: Init::Granting,
        env: &GRANTING_ENV,
        // PutItem and Query: a split pool's segment items (compaction
        // writes one, every read reads them).
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:Query"),
            WAKE_NOW,
        ],
    },
    Function {
        logical_id: "EnqueueFunction",
        binary: "enqueue",
        routes: &[Serves::Route(Route::Enqueue)],
        init: Init::Granting,
        env: &GRANTING_ENV,
        // DeleteItem: a stale ticket of a pool deleted since.
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:DeleteItem"),
            on_table("dynamodb:Query"),
            WAKE_NOW,
        ],
    },
    Function {
        logical_id: "TicketFunction",
        binary: "ticket",
        routes: &[Serves::Route(Route::Ticket)],
        init: Init::Service,
        env: &SERVICE_ENV,
        // UpdateItem: a backlog ticket read past its wait ends `expired`.
        // Query: a split pool's segment items.
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:Query"),
        ],
    },
    Function {
        logical_id: "CancelFunction",
        binary: "cancel",
        routes: &[Serves::Route(Route::Cancel)],
        init: Init::Granting,
        env: &GRANTING_ENV,
        // PutItem and Query: a split pool's segment items (compaction
        // writes one, every read reads them).
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:Query"),
            WAKE_NOW,
        ],
    },
    Function {
        logical_id: "DispatcherFunction",
        binary: "dispatcher",
        routes: &[],
        init: Init::Dispatcher,
        env: &DISPATCHER_ENV,
        // UpdateItem: grants, ticket states, admission, the pending wake.
        calls: &[
            on_table("dynamodb:GetItem"),
            on_table("dynamodb:UpdateItem"),
            on_table("dynamodb:PutItem"),
            on_table("dynamodb:Query"),
            Call {
                action: "dynamodb:Query",
                on: Resource::Index("by_ticket"),
            },
            Call {
                action: "sqs:SendMessage",
                on: Resource::WakeQueue,
            },
        ],
    },
    Function {
        logical_id: "FallbackFunction",
        binary: "fallback",
        routes: &[Serves::Default],
        init: Init::Nothing,
        env: &FALLBACK_ENV,
        calls: &[],
    },
];

/// [`FUNCTIONS`] as `tests/aws_local/functions.json` holds it.
pub fn manifest_json() -> serde_json::Value {
    use serde_json::json;
    let functions: Vec<serde_json::Value> = FUNCTIONS
        .iter()
        .map(|f| {
            let names = |required: bool| -> Vec<&str> {
                f.env
                    .iter()
                    .filter(|v| v.required == required)
                    .map(|v| v.name)
                    .collect()
            };
            let calls: Vec<serde_json::Value> = f
                .calls
                .iter()
                .map(|call| {
                    let on = match call.on {
                        Resource::Table => json!({"table": TABLE}),
                        Resource::TableKeys(keys) => json!({"table": TABLE, "leading_keys": keys}),
                        Resource::Index(index) => json!({"table": TABLE, "index": index}),
                        Resource::WakeQueue => json!({"queue": WAKE_QUEUE}),
                    };
                    json!({"action": call.action, "on": on})
                })
                .collect();
            json!({
                "logical_id": f.logical_id,
                "binary": f.binary,
                "routes": f.routes.iter()
                    .map(|r| json!({"method": r.method(), "path": r.path()}))
                    .collect::<Vec<_>>(),
                "env": {"required": names(true), "optional": names(false)},
                "calls": calls,
            })
        })
        .collect();
    json!({
        "about": "Generated from shared/src/functions.rs (a test keeps them equal): each function of \
                  template.yaml, the routes it serves, the variables it reads at start and the AWS \
                  operations its code can call.",
        "functions": functions,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::config::Config;

    #[test]
    fn the_json_file_is_the_manifest() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/aws_local/functions.json"
        );
        let expected = manifest_json();
        let pretty = serde_json::to_string_pretty(&expected).unwrap_or_default();
        let found = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
        assert!(
            found.as_ref() == Some(&expected),
            "tests/aws_local/functions.json differs from shared/src/functions.rs; write this:\n{pretty}\n"
        );
    }

    type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

    /// Runs `read` with a lookup that answers `given` and records every name asked.
    fn reads(
        given: &BTreeMap<&str, &str>,
        read: impl Fn(Lookup) -> bool,
    ) -> (bool, BTreeSet<String>) {
        let asked = RefCell::new(BTreeSet::new());
        let lookup = |name: &str| {
            asked.borrow_mut().insert(name.to_string());
            given.get(name).map(|v| v.to_string())
        };
        let ok = read(&lookup);
        (ok, asked.into_inner())
    }

    fn init_reads(init: Init) -> impl Fn(Lookup) -> bool {
        move |var| match init {
            Init::Service => Config::from_lookup(var).is_ok(),
            Init::Granting => crate::config::granting_settings_from_lookup(var).is_ok(),
            Init::Dispatcher => crate::config::dispatcher_settings_from_lookup(var).is_ok(),
            Init::Nothing => true,
        }
    }

    /// The variables each function's init reads are those listed, and the
    /// required ones are the ones it fails without (run with a recording
    /// lookup).
    #[test]
    fn each_function_reads_the_variables_listed() {
        for f in FUNCTIONS {
            let read = init_reads(f.init);
            let required: BTreeMap<&str, &str> = f
                .env
                .iter()
                .filter(|v| v.required)
                .map(|v| (v.name, "x"))
                .collect();
            let (ok, asked) = reads(&required, &read);
            assert!(ok, "{}: starts with its required variables", f.logical_id);
            let listed: BTreeSet<String> = f
                .env
                .iter()
                .map(|v| v.name)
                .filter(|name| !READ_OUTSIDE_CONFIG.contains(name))
                .map(str::to_string)
                .collect();
            assert_eq!(asked, listed, "{}", f.logical_id);
            for name in required.keys() {
                let mut without = required.clone();
                without.remove(name);
                assert!(
                    !reads(&without, &read).0,
                    "{}: {name} is required",
                    f.logical_id
                );
            }
        }
        // Those read outside config.rs are read where this says.
        assert!(include_str!("metrics.rs").contains("\"METRICS_NAMESPACE\""));
    }

    /// Each route of the API is served by exactly one function, and each
    /// function's `main` builds what its init says and serves its route.
    #[test]
    fn each_route_has_one_function_and_each_main_its_init() {
        let served: Vec<Route> = FUNCTIONS
            .iter()
            .flat_map(|f| f.routes)
            .filter_map(|s| match s {
                Serves::Route(route) => Some(*route),
                Serves::Default => None,
            })
            .collect();
        let every = crate::api::every_route();
        assert_eq!(served.len(), every.len());
        for route in every {
            assert!(served.contains(&route), "{route:?} has no function");
        }
        let defaults = FUNCTIONS.iter().flat_map(|f| f.routes);
        assert_eq!(defaults.filter(|s| **s == Serves::Default).count(), 1);
        for f in FUNCTIONS {
            let path = format!(
                "{}/../functions/{}/src/main.rs",
                env!("CARGO_MANIFEST_DIR"),
                f.binary
            );
            let main = std::fs::read_to_string(&path).unwrap_or_default();
            let builds = match f.init {
                Init::Service => "config::service_from_env()",
                Init::Granting => "config::granting_service_from_env()",
                Init::Dispatcher => "Handler::from_env()",
                Init::Nothing => "lambda::fallback",
            };
            assert!(main.contains(builds), "{path}: {builds}");
            for serves in f.routes {
                if let Serves::Route(route) = serves {
                    assert!(
                        main.contains(&format!("Route::{route:?}")),
                        "{path}: {route:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn functions_and_binaries_are_named_once() {
        let ids: BTreeSet<&str> = FUNCTIONS.iter().map(|f| f.logical_id).collect();
        let binaries: BTreeSet<&str> = FUNCTIONS.iter().map(|f| f.binary).collect();
        assert_eq!(
            (ids.len(), binaries.len()),
            (FUNCTIONS.len(), FUNCTIONS.len())
        );
        let template = include_str!("../../template.yaml");
        for f in FUNCTIONS {
            assert!(
                template.contains(&format!("\n  {}:\n", f.logical_id)),
                "{}",
                f.logical_id
            );
            assert!(
                template.contains(&format!("Binary: {}\n", f.binary)),
                "{}",
                f.binary
            );
        }
        assert_eq!(
            WARM_UP_KEY,
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                crate::store::dynamodb::schema::WARM_UP_KEY
            )
        );
    }
}
