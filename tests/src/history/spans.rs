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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn span(start: u64, end: u64, id: usize) -> Span {
        Span { start, end, id }
    }

    fn ids<'s>(spans: impl Iterator<Item = &'s Span>) -> Vec<usize> {
        let mut ids: Vec<usize> = spans.map(|s| s.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn no_spans_touch_nothing() {
        let spans = Spans::new(Vec::new());
        assert!(ids(spans.touching(0, u64::MAX)).is_empty());
        assert!(ids(spans.at(7, None)).is_empty());
        assert_eq!(breakpoints(3, 9, spans.touching(3, 9)), [3]);
    }

    #[test]
    fn windows_at_span_ends() {
        // [10, 20) covers ms 10 to 19.
        let spans = Spans::new(vec![span(10, 20, 0)]);
        assert_eq!(ids(spans.touching(0, 9)), [] as [usize; 0]);
        assert_eq!(ids(spans.touching(0, 10)), [0]);
        assert_eq!(ids(spans.touching(19, 19)), [0]);
        assert_eq!(ids(spans.touching(19, 40)), [0]);
        assert_eq!(ids(spans.touching(20, 40)), [] as [usize; 0]);
        assert_eq!(ids(spans.at(10, None)), [0]);
        assert_eq!(ids(spans.at(20, None)), [] as [usize; 0]);
        assert_eq!(ids(spans.at(15, Some(0))), [] as [usize; 0]);
    }

    #[test]
    fn zero_length_and_inverted_spans_cover_no_ms() {
        let spans = Spans::new(vec![span(5, 5, 0), span(9, 3, 1), span(4, 6, 2)]);
        assert_eq!(ids(spans.touching(0, 100)), [2]);
        assert_eq!(ids(spans.at(5, None)), [2]);
    }

    #[test]
    fn unbounded_spans_cover_every_ms_from_their_start() {
        let spans = Spans::new(vec![span(10, u64::MAX, 0), span(0, 5, 1)]);
        assert_eq!(ids(spans.touching(0, 9)), [1]);
        assert_eq!(ids(spans.touching(6, 10)), [0]);
        assert_eq!(ids(spans.at(u64::MAX - 1, None)), [0]);
        // Its end is beyond every window: only its start is a breakpoint.
        assert_eq!(breakpoints(0, 100, spans.touching(0, 100)), [0, 5, 10]);
    }

    #[test]
    fn a_long_span_is_found_behind_later_short_ones() {
        let spans = Spans::new(vec![
            span(0, 1000, 0),
            span(10, 11, 1),
            span(500, 501, 2),
            span(998, 999, 3),
        ]);
        assert_eq!(ids(spans.at(999, None)), [0]);
        assert_eq!(ids(spans.touching(500, 998)), [0, 2, 3]);
    }

    #[test]
    fn breakpoints_start_at_the_window_and_stay_inside_it() {
        let spans = [span(5, 15, 0), span(10, 20, 1), span(15, 25, 2)];
        assert_eq!(breakpoints(10, 20, spans.iter()), [10, 15, 20]);
        assert_eq!(breakpoints(0, 4, spans.iter()), [0]);
        assert_eq!(breakpoints(12, 12, spans.iter()), [12]);
    }

    /// Against brute force over every ms, on random small spans (some
    /// unbounded, zero-length or inverted): `touching` finds exactly the
    /// spans covering an ms of the window, and between neighbouring
    /// breakpoints the spans covering each ms stay the same.
    #[test]
    fn queries_agree_with_brute_force() {
        let mut rng = Rng::new(12);
        for _ in 0..300 {
            let all: Vec<Span> = (0..rng.range(0, 12) as usize)
                .map(|id| {
                    let start = rng.range(0, 60);
                    let end = match rng.range(0, 9) {
                        0 => u64::MAX,
                        1 => start,
                        2 => start.saturating_sub(rng.range(1, 5)),
                        _ => start + rng.range(1, 30),
                    };
                    span(start, end, id)
                })
                .collect();
            let spans = Spans::new(all.clone());
            let covering =
                |t: u64| -> Vec<usize> { ids(all.iter().filter(|s| s.start <= t && t < s.end)) };
            let a = rng.range(0, 80);
            let b = a + rng.range(0, 30);
            let mut expected: Vec<usize> = (a..=b).flat_map(covering).collect();
            expected.sort_unstable();
            expected.dedup();
            assert_eq!(ids(spans.touching(a, b)), expected, "[{a}, {b}]");
            for t in a..=b {
                assert_eq!(ids(spans.at(t, None)), covering(t), "ms {t}");
            }
            let points = breakpoints(a, b, spans.touching(a, b));
            assert_eq!(points[0], a);
            assert!(points.windows(2).all(|w| w[0] < w[1]) && points[points.len() - 1] <= b);
            for (k, &p) in points.iter().enumerate() {
                let next = points.get(k + 1).copied().unwrap_or(b + 1);
                assert!((p..next).all(|t| covering(t) == covering(p)), "{points:?}");
            }
        }
    }
}
