//! Recording: what each client asked, what it was answered, and when.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::Value;

/// What a client asked.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Register {
        count: u32,
    },
    Inspect,
    Delete,
    /// `ttl_ms`/`wait_ms` as sent (before the server's clamping), and the
    /// lease UUID the client chose, if it chose one.
    Borrow {
        ttl_ms: u64,
        wait_ms: u64,
        lease: Option<String>,
    },
    Return {
        lease: String,
    },
}

impl Call {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Call::Register { .. } => "PUT",
            Call::Inspect => "GET",
            Call::Delete => "DELETE",
            Call::Borrow { .. } => "borrow",
            Call::Return { .. } => "return",
        }
    }
}

/// One completed call: who, what, the answer, and when.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    /// The pool UUID as sent.
    pub pool: String,
    pub call: Call,
    /// The HTTP status; [`NO_ANSWER`] when the client died before the answer
    /// (its request may have taken effect, or may still).
    pub status: u16,
    pub body: Value,
    pub invoke_ms: u64,
    pub response_ms: u64,
}

/// The status of a call whose client died waiting for it.
pub const NO_ANSWER: u16 = 0;

/// Collects ops from many concurrent clients.
#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
    /// Which op each caller id (`crate::truth::CALLER`) became.
    callers: Mutex<HashMap<u64, usize>>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `op`; its index in the history.
    pub fn record(&self, op: Op) -> usize {
        let mut ops = self.lock();
        ops.push(op);
        ops.len() - 1
    }

    /// Notes that the call made under caller id `caller` is op `index`.
    pub fn note_caller(&self, caller: u64, index: usize) {
        self.callers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(caller, index);
    }

    /// Caller id → op index, for every call noted.
    pub fn callers(&self) -> HashMap<u64, usize> {
        self.callers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn snapshot(&self) -> Vec<Op> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        // A panicking client leaves at most a missing op, never a torn one.
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Per op: counts by call and status, for a run's log line.
pub fn summary(ops: &[Op]) -> String {
    let mut counts: BTreeMap<(&str, u16), usize> = BTreeMap::new();
    for op in ops {
        *counts.entry((op.call.name(), op.status)).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|((name, status), n)| format!("{name} {status}: {n}"))
        .collect();
    format!("{} ops ({})", ops.len(), parts.join(", "))
}
