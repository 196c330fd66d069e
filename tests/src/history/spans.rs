//! Half-open millisecond spans and the queries the rules make of them.

/// Half-open ms spans `[start, end)` tagged with an id, queried by window.
pub(super) struct Spans {
    bounded: Vec<Span>,
    longest: u64,
    unbounded: Vec<Span>,
}

#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) id: usize,
}

impl Spans {
    pub(super) fn new(spans: Vec<Span>) -> Self {
        let (mut bounded, unbounded): (Vec<Span>, Vec<Span>) =
            spans.into_iter().partition(|s| s.end != u64::MAX);
        bounded.sort_by_key(|s| s.start);
        let longest = bounded
            .iter()
            .map(|s| s.end.saturating_sub(s.start))
            .max()
            .unwrap_or(0);
        Spans {
            bounded,
            longest,
            unbounded,
        }
    }

    /// Spans covering at least one ms of the closed window `[a, b]`.
    pub(super) fn touching(&self, a: u64, b: u64) -> impl Iterator<Item = &Span> + '_ {
        let first = self
            .bounded
            .partition_point(|s| s.start < a.saturating_sub(self.longest));
        self.bounded[first..]
            .iter()
            .take_while(move |s| s.start <= b)
            .chain(self.unbounded.iter().filter(move |s| s.start <= b))
            .filter(move |s| s.end > a && s.end > s.start)
    }

    /// Spans covering ms `t`, other than `except`.
    pub(super) fn at(&self, t: u64, except: Option<usize>) -> impl Iterator<Item = &Span> + '_ {
        self.touching(t, t).filter(move |s| Some(s.id) != except)
    }
}

/// The ms of `[a, b]` where any of these spans starts or ends, with `a`,
/// sorted: between neighbours, every span count is constant.
pub(super) fn breakpoints<'s>(a: u64, b: u64, spans: impl Iterator<Item = &'s Span>) -> Vec<u64> {
    let mut points = vec![a];
    for s in spans {
        points.extend([s.start, s.end].into_iter().filter(|t| *t > a && *t <= b));
    }
    points.sort_unstable();
    points.dedup();
    points
}
