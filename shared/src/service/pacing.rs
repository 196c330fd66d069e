//! How long a waiter sleeps: by its place, by the pool's pace as it has
//! seen it, by the hand-offs it forecasts.

use std::time::{Duration, Instant};

use crate::domain::Pool;
use semaphore_wire as wire;

use super::Timing;

impl Timing {
    /// A waiter's read interval by its place alone: `ahead` live tickets
    /// before it on a pool of `count`. Rounds of up to `count` places (at
    /// most 4), each twice as far apart as the one before.
    fn by_place(&self, ahead: usize, count: u16) -> Duration {
        let round = ahead / usize::from(count.clamp(1, 4));
        self.poll
            .saturating_mul(1u32 << round.min(16))
            .min(self.poll_cap)
    }

    /// The nap before reading when a hand-off is due at `due_ms`: until just
    /// before it, then every `poll_min` for a while after it (a forecast that
    /// came true late), then no shorter than any other nap.
    pub(super) fn near(&self, due_ms: u64, now_ms: u64) -> Duration {
        let margin = self.poll_min / 2;
        let before = Duration::from_millis(due_ms.saturating_sub(now_ms));
        if before > margin {
            before - margin
        } else if now_ms.saturating_sub(due_ms) <= 4 * self.poll_min.as_millis() as u64 {
            self.poll_min
        } else {
            Duration::MAX
        }
    }

    /// A waiter's nap (before jitter) by its place and the pool's pace as it
    /// has seen it. The pace may only shorten the nap by place, never
    /// lengthen it: a pace measured while everyone read slowly would keep
    /// them slow.
    fn by_pace(&self, ahead: usize, needed: usize, count: u16, seen: Seen) -> Duration {
        let by_place = self.by_place(ahead, count);
        // Half the time its turn is expected to take (a grant is then seen
        // about a quarter of that after it lands, on average); a quarter when
        // the pace is glimpsed from one read's slots. Half was not enough
        // there: a pool whose waiters noticed their grants late looked slow,
        // its waiters far back read later still, and 64 clients settled at a
        // third of the cycles 16 made (measured in docs/BENCHMARK.md).
        // Saturating: no pace estimate may panic a request.
        let by_pace = |per_second: f64, share: f64| {
            Duration::try_from_secs_f64(needed.max(1) as f64 / per_second * share)
                .unwrap_or(by_place)
                .clamp(self.poll_min.min(by_place), by_place)
        };
        match seen {
            Seen::Granting(per_second) => by_pace(per_second, 0.5),
            Seen::Glimpsed(per_second) => by_pace(per_second, 0.25),
            // Early on, read again soon: a second read tells how fast the
            // pool grants.
            Seen::Unknown => by_place.min(self.poll),
            // Nothing granted since its first read: a return or a raise may
            // come at any time, and its place alone says how soon it matters.
            Seen::Idle => by_place,
        }
    }

    /// How long a waiter sleeps: `ahead` live tickets are before it and its
    /// turn comes after `needed` more slots free up; `pace` is how fast the
    /// pool has granted as this waiter has seen it.
    pub(super) fn poll_interval(
        &self,
        ahead: usize,
        needed: usize,
        pool: &Pool,
        now_ms: u64,
        pace: &mut Pace,
    ) -> Duration {
        let full = self.by_pace(ahead, needed, pool.count(), pace.observe(pool, now_ms));
        full.mul_f64(0.75 + 0.25 * wire::unit())
    }

    /// The nap of a borrower waiting in the backlog before its next read,
    /// in its `round`th round (from 1): `poll` longer each round up to eight
    /// (at most `poll_cap`), jittered to ¾–1×, and never past `give_up`.
    pub(super) fn backlog_nap(&self, round: u32, give_up: Instant) -> Duration {
        self.poll
            .saturating_mul(round.min(8))
            .min(self.poll_cap)
            .mul_f64(0.75 + 0.25 * wire::unit())
            .min(give_up.saturating_duration_since(Instant::now()))
    }
}

/// When the slots a waiter waits for are likely to be handed on: how long
/// holders hold, learned from the slots it saw handed on between its reads.
#[derive(Default)]
pub(super) struct Forecast {
    /// The held slots at the last read: position, fence, grant ms.
    seen: Vec<(u16, u64, u64)>,
    /// Smoothed hold, ms.
    hold_ms: Option<f64>,
}

impl Forecast {
    /// Takes in a read at `now_ms`; when the `needed`-th of the slots held
    /// now is expected to be handed on (a slot whose holder has held it
    /// well past the usual hold is not expected before its expiry).
    pub(super) fn observe(&mut self, pool: &Pool, needed: usize, now_ms: u64) -> Option<u64> {
        let held: Vec<_> = pool
            .leases()
            .into_iter()
            .filter(|l| l.is_live(now_ms))
            .collect();
        for lease in &held {
            let before = self
                .seen
                .iter()
                .find(|(position, fence, _)| *position == lease.position && *fence < lease.fence);
            if let Some(&(_, _, granted)) = before {
                let hold = lease.granted_ms.saturating_sub(granted) as f64;
                self.hold_ms = Some(match self.hold_ms {
                    Some(old) => 0.7 * old + 0.3 * hold,
                    None => hold,
                });
            }
        }
        self.seen = held
            .iter()
            .map(|l| (l.position, l.fence, l.granted_ms))
            .collect();
        let hold = self.hold_ms? as u64;
        let slack = (hold / 4).max(20);
        let mut due: Vec<u64> = held
            .iter()
            .map(|l| {
                let usual = l.granted_ms.saturating_add(hold);
                if usual.saturating_add(slack) < now_ms {
                    l.expires_at_ms
                } else {
                    usual.min(l.expires_at_ms)
                }
            })
            .collect();
        due.sort_unstable();
        needed.checked_sub(1).and_then(|i| due.get(i).copied())
    }
}

/// How fast a pool grants, as one waiter sees it: fences issued per second
/// since its first read (a window of a few polls may hold no grant at all,
/// and a waiter far back must not take a busy pool for an idle one), and
/// until that window is long enough, from when its current holders were
/// granted.
#[derive(Default)]
pub(super) struct Pace {
    first: Option<(u64, u64)>,
}

impl Pace {
    /// Grants shorter apart than this say nothing of a pool's pace.
    const WINDOW_MS: u64 = 200;

    /// Takes in a read of `pool` at `now_ms`: the grants per second seen so
    /// far, or that it has seen none.
    fn observe(&mut self, pool: &Pool, now_ms: u64) -> Seen {
        let fence = pool.next_fence();
        let recent = Self::recent(pool, fence, now_ms);
        let (since, first) = *self.first.get_or_insert((now_ms, fence));
        if now_ms < since + Self::WINDOW_MS {
            return recent.map_or(Seen::Unknown, Seen::Glimpsed);
        }
        let rate = fence.saturating_sub(first) as f64 * 1000.0 / (now_ms - since) as f64;
        if rate > 0.0 {
            // The faster of the two: a pool speeds up as its waiters notice
            // their grants sooner, and one that read slowly while it was
            // slow would otherwise keep it slow.
            Seen::Granting(rate.max(recent.unwrap_or(0.0)))
        } else {
            Seen::Idle
        }
    }

    /// The grants per second since the oldest recent grant still held: every
    /// fence issued since was a grant, whether or not its slot is held still.
    /// (Counting only the slots held now took a pool whose waiters were slow
    /// to notice their grants for a slow pool: those read later still, and
    /// were later still to notice theirs.)
    fn recent(pool: &Pool, fence: u64, now_ms: u64) -> Option<f64> {
        let oldest = pool
            .leases()
            .into_iter()
            .filter(|l| {
                l.is_live(now_ms) && now_ms.saturating_sub(l.granted_ms) <= 10 * Self::WINDOW_MS
            })
            .min_by_key(|l| l.granted_ms)?;
        // A lease's fence is offset by the pool's base; `fence` is not.
        let grants = fence.saturating_sub(oldest.fence.saturating_sub(pool.base_us()));
        let since = now_ms.saturating_sub(oldest.granted_ms).max(1);
        (grants >= 2).then(|| (grants - 1) as f64 * 1000.0 / since as f64)
    }
}

/// What a waiter has seen of its pool's pace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Seen {
    /// Not yet enough to tell.
    Unknown,
    /// No grant since its first read, a window ago or more.
    Idle,
    /// Grants per second, from the slots held at one read.
    Glimpsed(f64),
    /// Grants per second.
    Granting(f64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BorrowPlan, Holder, ReturnPlan};

    #[test]
    fn waiters_read_in_rounds_that_double() {
        let timing = Timing::default();
        let ms = |n| Duration::from_millis(n);
        // Count 1: one round per place.
        assert_eq!(timing.by_place(0, 1), ms(70));
        assert_eq!(timing.by_place(1, 1), ms(140));
        assert_eq!(timing.by_place(2, 1), ms(280));
        // Count 4: the next four freed slots serve the first round.
        assert_eq!(timing.by_place(3, 4), ms(70));
        assert_eq!(timing.by_place(4, 4), ms(140));
        // A big pool's rounds are 4 wide; far back, every 2 s.
        assert_eq!(timing.by_place(8, 1000), ms(280));
        assert_eq!(timing.by_place(900, 4), ms(2000));
        // Count 0 (a pool shrunk to nothing) is sane.
        assert_eq!(timing.by_place(0, 0), ms(70));
    }

    fn holder(n: u8) -> Holder {
        Holder {
            digest: crate::domain::LeaseDigest([n; 8]),
            ttl_ms: 60_000,
        }
    }

    /// `pool` after holder `n` took its lowest free slot at `at`.
    fn take(pool: Pool, n: u8, at: u64) -> Pool {
        let BorrowPlan::Take { update, .. } = pool.plan_borrow(holder(n), at, at, 100) else {
            panic!("holder {n} found no free slot")
        };
        pool.apply(&update).unwrap()
    }

    /// `pool` after the lease `from` was returned and holder `n` took a slot.
    fn hand_on(pool: Pool, from: crate::domain::LeaseDigest, n: u8, at: u64) -> Pool {
        let ReturnPlan::Return(_, update) = pool.plan_return(from, at) else {
            panic!("no such lease")
        };
        take(pool.apply(&update).unwrap(), n, at)
    }

    #[test]
    fn the_pace_is_grants_per_second_since_the_first_read() {
        let mut pool = Pool::new(2, 0);
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Unknown, "a first read");
        // Two holders granted 100 ms apart, 100 ms ago at the latest: the
        // pool grants about 10 per second.
        pool = take(pool, 1, 800);
        pool = take(pool, 2, 900);
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Glimpsed(5.0));
        // Five grants in the 250 ms since the first read: 20 per second.
        for k in 0..5u8 {
            let which = pool.leases()[0].digest;
            pool = hand_on(pool, which, 20 + k, 1_050 + u64::from(k) * 40);
        }
        assert_eq!(pace.observe(&pool, 1_250), Seen::Granting(20.0));
    }

    #[test]
    fn waiters_on_a_pool_that_grants_nothing_read_by_place_alone() {
        let timing = Timing::default();
        let ms = Duration::from_millis;
        let mut pool = Pool::new(4, 0);
        let mut pace = Pace::default();
        // A first read says nothing of the pace: read again within `poll`.
        let seen = pace.observe(&pool, 1_000);
        assert_eq!(seen, Seen::Unknown);
        assert_eq!(timing.by_pace(40, 37, 4, seen), ms(70));
        // Nothing granted a window later: the place alone sets the nap (a
        // waiter far back once read every 70 ms while nothing moved).
        let seen = pace.observe(&pool, 1_300);
        assert_eq!(seen, Seen::Idle);
        assert_eq!(timing.by_pace(40, 37, 4, seen), ms(2_000));
        assert_eq!(timing.by_pace(5, 2, 4, seen), ms(140));
        assert_eq!(timing.by_pace(0, 1, 4, seen), ms(70));
        // Four grants seen after that: the pace shortens the nap again.
        for n in 0..4 {
            pool = take(pool, n, 1_400);
        }
        // Since its first read 8 per second, over the last 100 ms 30: the
        // faster counts.
        let seen = pace.observe(&pool, 1_500);
        assert_eq!(seen, Seen::Granting(30.0));
        // By place 560 ms; by pace half the time of one grant.
        assert_eq!(
            timing.by_pace(12, 1, 4, seen),
            Duration::from_secs_f64(1.0 / 30.0 / 2.0)
        );
        // A rate glimpsed at a first read is trusted half as much.
        assert_eq!(
            timing.by_pace(12, 4, 4, Seen::Glimpsed(30.0)),
            Duration::from_secs_f64(4.0 / 30.0 / 4.0)
        );
    }

    #[test]
    fn a_first_read_counts_every_grant_since_the_oldest_slot_held() {
        // A real pool's fences start at its creation time in µs.
        let mut pool = Pool::new(2, 1_700_000_000_000_000);
        // One holder slow to move on since 800; the other slot handed on
        // ten times since: 11 grants after the one at 800, in 200 ms.
        pool = take(pool, 1, 800);
        pool = take(pool, 2, 850);
        for k in 0..10u8 {
            pool = hand_on(pool, holder(2 + k).digest, 3 + k, 860 + u64::from(k) * 14);
        }
        let mut pace = Pace::default();
        assert_eq!(pace.observe(&pool, 1_000), Seen::Glimpsed(55.0));
    }

    #[test]
    fn a_forecast_learns_the_hold_and_expects_the_next_hand_off() {
        let mut pool = Pool::new(2, 0);
        pool = take(pool, 0, 1_000);
        pool = take(pool, 1, 1_100);
        let mut forecast = Forecast::default();
        assert_eq!(forecast.observe(&pool, 1, 1_150), None, "no hold seen yet");
        // Slot 0 is handed on after 200 ms.
        pool = hand_on(pool, holder(0).digest, 9, 1_200);
        // Slot 1 (granted at 1100) is next, at 1300; slot 0 at 1400.
        assert_eq!(forecast.observe(&pool, 1, 1_210), Some(1_300));
        assert_eq!(forecast.observe(&pool, 2, 1_210), Some(1_400));
        // Long overdue (slot 1 past 1300 + 50): not expected before its expiry.
        assert_eq!(forecast.observe(&pool, 1, 1_420), Some(1_400));
        assert_eq!(forecast.observe(&pool, 1, 1_700), Some(61_100));
    }

    #[test]
    fn naps_close_in_on_a_due_hand_off() {
        let timing = Timing::default();
        let ms = Duration::from_millis;
        assert_eq!(timing.near(1_100, 1_000), ms(95));
        assert_eq!(timing.near(1_003, 1_000), ms(10));
        assert_eq!(timing.near(1_000, 1_030), ms(10));
        assert_eq!(timing.near(1_000, 1_041), Duration::MAX);
    }
}
