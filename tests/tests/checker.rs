//! The history checker catches each kind of violation in hand-made histories,
//! and passes a correct history full of overlapping in-flight calls.

use semaphore_tests::history::{check, Call, CheckConfig, Op, Rule, Violation};
use serde_json::{json, Value};

const P: &str = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";
const Q: &str = "0b7e4d2c-1a3f-4e5d-9c8b-7a6f5e4d3c21";
/// A whole second, so `expires_at_unix` is easy to follow.
const T: u64 = 1_700_000_000_000;

fn lease(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

fn op(client: usize, pool: &str, call: Call, status: u16, body: Value, from: u64, to: u64) -> Op {
    Op {
        client,
        pool: pool.to_string(),
        call,
        status,
        body,
        invoke_ms: T + from,
        response_ms: T + to,
    }
}

fn register(pool: &str, count: u32, in_use: u32, from: u64, to: u64) -> Op {
    let body = json!({"id": pool, "count": count, "in_use": in_use, "available": count.saturating_sub(in_use), "waiting": 0});
    op(0, pool, Call::Register { count }, 200, body, from, to)
}

fn inspect(pool: &str, count: u32, in_use: u32, from: u64, to: u64) -> Op {
    let body = json!({"id": pool, "count": count, "in_use": in_use, "available": count.saturating_sub(in_use), "waiting": 0});
    op(9, pool, Call::Inspect, 200, body, from, to)
}

/// A granted borrow; the server read its clock at `from` (expiry = from + ttl).
fn granted(
    client: usize,
    pool: &str,
    n: u32,
    position: u32,
    ttl_ms: u64,
    from: u64,
    to: u64,
) -> Op {
    let body = json!({
        "lease": lease(n),
        "position": position,
        "expires_at_unix": (T + from + ttl_ms) / 1000,
        "expires_in": ttl_ms as f64 / 1000.0,
        // As the server's: rising with the grant's time.
        "fence": (T + from) * 1000 + u64::from(n),
    });
    let call = Call::Borrow {
        ttl_ms,
        wait_ms: 0,
        lease: None,
    };
    op(client, pool, call, 200, body, from, to)
}

fn with_fence(mut op: Op, fence: u64) -> Op {
    op.body["fence"] = json!(fence);
    op
}

/// A borrow that waited and was granted at `granted_at`.
fn granted_after_wait(
    client: usize,
    pool: &str,
    n: u32,
    position: u32,
    from: u64,
    granted_at: u64,
    to: u64,
) -> Op {
    let mut op = granted(client, pool, n, position, 1000, granted_at, to);
    op.invoke_ms = T + from;
    op.call = Call::Borrow {
        ttl_ms: 1000,
        wait_ms: 500,
        lease: None,
    };
    op
}

fn refused(client: usize, pool: &str, wait_ms: u64, from: u64, to: u64) -> Op {
    let body = json!({"error": "no resource available"});
    op(
        client,
        pool,
        Call::Borrow {
            ttl_ms: 1000,
            wait_ms,
            lease: None,
        },
        409,
        body,
        from,
        to,
    )
}

fn returned(client: usize, pool: &str, n: u32, answer: bool, from: u64, to: u64) -> Op {
    op(
        client,
        pool,
        Call::Return { lease: lease(n) },
        200,
        json!({"returned": answer}),
        from,
        to,
    )
}

fn not_found(client: usize, pool: &str, call: Call, from: u64, to: u64) -> Op {
    op(
        client,
        pool,
        call,
        404,
        json!({"error": "pool not found"}),
        from,
        to,
    )
}

fn deleted(pool: &str, answer: bool, from: u64, to: u64) -> Op {
    op(
        0,
        pool,
        Call::Delete,
        200,
        json!({"deleted": answer}),
        from,
        to,
    )
}

fn strict() -> CheckConfig {
    CheckConfig::default()
}

fn rules(violations: &[Violation]) -> Vec<Rule> {
    violations.iter().map(|v| v.rule).collect()
}

/// Asserts `rule` is among the violations found (and prints them all).
fn assert_flags(ops: &[Op], config: &CheckConfig, rule: Rule) -> Vec<Violation> {
    let found = check(ops, config);
    for v in &found {
        eprintln!("{v}");
    }
    assert!(
        rules(&found).contains(&rule),
        "expected {rule:?}, got {found:#?}"
    );
    found
}

fn assert_clean(ops: &[Op], config: &CheckConfig) {
    let found = check(ops, config);
    assert!(found.is_empty(), "expected no violations, got:\n{found:#?}");
}

/// Concurrent borrows, a waiter woken by a return, a resize in flight while a
/// borrow lands, stale/foreign/random returns, expiry, delete + re-register,
/// and a short free gap a poller may miss.
#[test]
fn correct_history_with_overlapping_calls_passes() {
    let ops = vec![
        register(P, 2, 0, 0, 1),
        register(Q, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        // In flight together with lease 1: either order of grants is possible.
        granted(2, P, 2, 1, 1000, 12, 30),
        // Waits from 15 and gets position 0 once lease 1 is returned.
        granted_after_wait(3, P, 3, 0, 15, 105, 120),
        refused(4, P, 0, 50, 52),
        inspect(P, 2, 2, 60, 61),
        returned(1, P, 1, true, 100, 110),
        // The resize to 3 is in flight while lease 4 lands on position 2.
        register(P, 3, 2, 130, 140),
        granted(4, P, 4, 2, 300, 135, 150),
        returned(2, P, 2, true, 200, 205),
        returned(2, P, 2, false, 210, 211),
        returned(1, P, 1, false, 220, 221),
        returned(6, P, 99, false, 222, 223),
        granted(6, Q, 5, 0, 5000, 224, 226),
        // Lease 5 is Q's: returning it to P is a no.
        returned(6, P, 5, false, 227, 228),
        // Lease 4 expired at +435: position 1 is the lowest free at +500.
        granted(7, P, 7, 1, 1000, 500, 505),
        inspect(P, 3, 2, 506, 507),
        deleted(P, true, 600, 610),
        not_found(3, P, Call::Return { lease: lease(3) }, 620, 621),
        deleted(P, false, 622, 623),
        register(P, 1, 0, 630, 640),
        granted(8, P, 8, 0, 100, 650, 655),
        returned(3, P, 3, false, 660, 661),
        // Full from +650 to lease 8's expiry at +750..755; lease 9 lands at
        // +820, so the slot was free only ~70 ms of this wait: a poller may
        // miss that, and the tolerance allows it.
        refused(9, P, 300, 700, 1001),
        granted(10, P, 9, 0, 2000, 820, 822),
        inspect(P, 1, 1, 1100, 1101),
    ];
    assert_clean(&ops, &strict());
}

#[test]
fn a_position_held_twice_is_flagged() {
    let ops = vec![
        register(P, 2, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        granted(2, P, 2, 0, 1000, 30, 40),
    ];
    assert_flags(&ops, &strict(), Rule::SharedPosition);
}

#[test]
fn over_issue_is_flagged() {
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        granted(2, P, 2, 1, 1000, 30, 40),
    ];
    let found = assert_flags(&ops, &strict(), Rule::OverIssue);
    assert!(rules(&found).contains(&Rule::PositionOutOfRange));
}

/// After a shrink, the live leases above the new count withhold borrows.
#[test]
fn a_grant_after_a_shrink_while_still_over_count_is_flagged() {
    let ops = vec![
        register(P, 2, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        granted(2, P, 2, 1, 1000, 10, 20),
        register(P, 1, 2, 50, 60),
        returned(1, P, 1, true, 70, 80),
        // Lease 2 (position 1) alone fills count 1.
        granted(3, P, 3, 0, 1000, 90, 100),
    ];
    assert_flags(&ops, &strict(), Rule::OverIssue);
}

#[test]
fn a_refusal_while_a_slot_was_free_for_long_is_a_lost_wakeup() {
    let ops = vec![
        register(P, 1, 0, 0, 1),
        // Expires by +120; the waiter keeps waiting until +1031.
        granted(1, P, 1, 0, 100, 10, 20),
        refused(2, P, 1000, 30, 1031),
    ];
    assert_flags(&ops, &strict(), Rule::LostWakeup);
}

/// A waiter that answered late had slow store calls then: a free run shorter
/// than its lateness (plus the tolerance) may have fallen between two of its
/// reads. The same run with an answer on time is flagged.
#[test]
fn a_late_answer_widens_the_wakeup_tolerance_by_its_lateness() {
    let history = |answered| {
        vec![
            register(P, 1, 0, 0, 1),
            // Expires by +120; free from then until the wait ends at +430.
            granted(1, P, 1, 0, 100, 10, 20),
            refused(2, P, 400, 30, answered),
        ]
    };
    assert_flags(&history(431), &strict(), Rule::LostWakeup);
    let late = check(&history(830), &strict());
    assert!(late.is_empty(), "{late:?}");
}

#[test]
fn a_refusal_while_a_slot_was_free_for_the_whole_call_is_flagged() {
    let ops = vec![
        register(P, 2, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        refused(2, P, 0, 50, 52),
    ];
    assert_flags(&ops, &strict(), Rule::LostWakeup);
}

#[test]
fn returned_true_for_a_dead_lease_is_flagged() {
    let expired = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 100, 10, 20),
        returned(1, P, 1, true, 500, 501),
    ];
    assert_flags(&expired, &strict(), Rule::ReturnedDeadLease);

    let twice = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        returned(1, P, 1, true, 30, 40),
        returned(1, P, 1, true, 50, 60),
    ];
    assert_flags(&twice, &strict(), Rule::ReturnedDeadLease);

    let never_granted = vec![register(P, 1, 0, 0, 1), returned(1, P, 7, true, 30, 40)];
    assert_flags(&never_granted, &strict(), Rule::ReturnedDeadLease);

    let other_pool = vec![
        register(P, 1, 0, 0, 1),
        register(Q, 1, 0, 0, 1),
        granted(1, Q, 1, 0, 1000, 10, 20),
        returned(1, P, 1, true, 30, 40),
    ];
    assert_flags(&other_pool, &strict(), Rule::ReturnedDeadLease);

    let deleted_pool = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        deleted(P, true, 30, 40),
        register(P, 1, 0, 50, 60),
        returned(1, P, 1, true, 70, 80),
    ];
    assert_flags(&deleted_pool, &strict(), Rule::ReturnedDeadLease);
}

#[test]
fn returned_false_for_a_surely_live_lease_is_a_lost_lease() {
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        returned(1, P, 1, false, 30, 31),
    ];
    assert_flags(&ops, &strict(), Rule::LostLease);
}

#[test]
fn a_borrow_told_not_found_may_have_held_a_position_until_its_answer() {
    // Client 1's write took position 0, then a delete took the pool (and
    // the lease) and client 1 was told 404; meanwhile client 2 got 1.
    let borrow = Call::Borrow {
        ttl_ms: 1000,
        wait_ms: 0,
        lease: None,
    };
    let ops = vec![
        register(P, 3, 0, 0, 1),
        not_found(1, P, borrow, 10, 60),
        granted(2, P, 2, 1, 1000, 20, 30),
        deleted(P, true, 40, 50),
    ];
    assert_clean(&ops, &strict());
}

#[test]
fn a_position_above_a_surely_free_one_is_flagged() {
    let ops = vec![
        register(P, 3, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        granted(2, P, 2, 2, 1000, 30, 40),
    ];
    assert_flags(&ops, &strict(), Rule::NotLowestPosition);
}

#[test]
fn wrong_existence_and_impossible_states_are_flagged() {
    let vanished = vec![
        register(P, 1, 0, 0, 1),
        not_found(1, P, Call::Inspect, 10, 11),
    ];
    assert_flags(&vanished, &strict(), Rule::WrongExistence);

    let ghost = vec![
        register(P, 1, 0, 0, 1),
        deleted(P, true, 10, 11),
        inspect(P, 1, 0, 20, 21),
    ];
    assert_flags(&ghost, &strict(), Rule::WrongExistence);

    let miscounted = vec![
        register(P, 2, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 10, 20),
        inspect(P, 2, 0, 30, 31),
    ];
    assert_flags(&miscounted, &strict(), Rule::ImpossibleState);
}

#[test]
fn bad_statuses_and_bodies_are_flagged() {
    let server_error = vec![
        register(P, 1, 0, 0, 1),
        op(1, P, Call::Inspect, 500, json!({"error": "boom"}), 10, 11),
    ];
    assert_flags(&server_error, &strict(), Rule::BadResponse);
    let faults = CheckConfig {
        faults: true,
        ..strict()
    };
    // A 502 is expected with faults, but only with an {"error": …} body.
    assert_clean(&server_error[..1], &faults);
    let bad_body = vec![
        register(P, 1, 0, 0, 1),
        op(1, P, Call::Inspect, 502, json!({"message": "x"}), 10, 11),
    ];
    assert_flags(&bad_body, &faults, Rule::BadResponse);
    let unclamped = vec![register(P, 1, 0, 0, 1), granted(1, P, 1, 0, 5000, 10, 20)];
    let limits = CheckConfig {
        max_ttl_ms: 1000,
        ..strict()
    };
    assert_flags(&unclamped, &limits, Rule::BadResponse);
}

/// A borrow answered 502 may have stored a lease nobody knows of: a 409 while
/// it may be live is no lost wake-up, and a 502'd return may have landed.
#[test]
fn unknown_outcomes_are_not_violations() {
    let faults = CheckConfig {
        faults: true,
        ..strict()
    };
    let error = json!({"error": "database call failed; retry with backoff"});
    let ops = vec![
        register(P, 1, 0, 0, 1),
        op(
            1,
            P,
            Call::Borrow {
                ttl_ms: 200,
                wait_ms: 0,
                lease: None,
            },
            502,
            error.clone(),
            10,
            20,
        ),
        refused(2, P, 0, 30, 31),
        granted(3, P, 3, 0, 1000, 300, 310),
        op(
            3,
            P,
            Call::Return { lease: lease(3) },
            502,
            error.clone(),
            320,
            330,
        ),
        returned(3, P, 3, false, 340, 350),
    ];
    assert_clean(&ops, &faults);
    // Without the unknown borrow, the same 409 is a lost wake-up.
    let mut without = ops.clone();
    without.remove(1);
    assert_flags(&without, &faults, Rule::LostWakeup);
}

#[test]
fn fences_out_of_grant_order_are_flagged() {
    let base = vec![register(P, 2, 0, 0, 1)];
    let first = granted(1, P, 1, 0, 1000, 10, 20);
    let second = granted(2, P, 2, 1, 1000, 30, 40);
    let fence = first.body["fence"].as_u64().unwrap();
    assert_clean(
        &[base.clone(), vec![first.clone(), second.clone()]].concat(),
        &strict(),
    );
    // Granted after the first was answered, with a lower fence.
    let lower = with_fence(second.clone(), fence - 1);
    assert_flags(
        &[base.clone(), vec![first.clone(), lower]].concat(),
        &strict(),
        Rule::FenceOrder,
    );
    // Two grants, one fence.
    let same = with_fence(second, fence);
    assert_flags(
        &[base.clone(), vec![first.clone(), same]].concat(),
        &strict(),
        Rule::FenceOrder,
    );
    // After a delete and a re-register of the same id, fences still rise.
    let again = vec![
        first,
        deleted(P, true, 100, 110),
        register(P, 1, 0, 120, 130),
        with_fence(granted(3, P, 3, 0, 1000, 140, 150), fence - 5),
    ];
    assert_flags(&[base, again].concat(), &strict(), Rule::FenceOrder);
}

/// A newcomer refused while a slot is free, because an earlier waiter has
/// the first claim on it, is fair waiting, not a lost wake-up.
#[test]
fn a_refusal_owed_to_an_earlier_waiter_is_no_lost_wakeup() {
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 10_000, 10, 20),
        // Waiting from +50, granted at +150 after the return at +100..110.
        granted_after_wait(2, P, 2, 0, 50, 150, 160),
        returned(1, P, 1, true, 100, 110),
        refused(3, P, 0, 120, 121),
    ];
    assert_clean(&ops, &strict());
    let mut without_the_waiter = ops.clone();
    without_the_waiter.remove(2);
    assert_flags(&without_the_waiter, &strict(), Rule::LostWakeup);
}

/// A waiter that had joined by +250 and waited until +1000 is refused, while
/// a borrower that started at +400 was granted at +500: overtaken.
#[test]
fn a_waiter_overtaken_by_a_later_borrower_is_flagged() {
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 300, 1, 5),
        refused(2, P, 1000, 0, 1001),
        granted(3, P, 3, 0, 1000, 450, 500),
    ];
    assert_flags(&ops, &strict(), Rule::Overtaken);
    // Started before the waiter had surely joined: no overtaking.
    let mut early = ops.clone();
    early[3].invoke_ms = T + 100;
    let found = check(&early, &strict());
    assert!(!rules(&found).contains(&Rule::Overtaken), "{found:#?}");
}

/// Ground truth: a borrow whose write landed but whose answer was a 502 (as
/// before the service recognised its own writes) leaves a lease nobody was
/// told about, holding its slot until its ttl.
#[test]
fn a_lease_nobody_was_told_about_is_an_orphaned_slot() {
    use semaphore::domain::LeaseDigest;
    use semaphore::keys::LeaseId;
    use semaphore_tests::truth::{orphans, StoredLease};

    let key = semaphore::api::parse_pool_id(P).unwrap().key();
    let digest =
        |n: u32| -> LeaseDigest { LeaseId(uuid::Uuid::parse_str(&lease(n)).unwrap()).digest() };
    let stored = |n: u32| StoredLease {
        key,
        digest: digest(n),
        position: 0,
        fence: 1,
        expires_at_ms: T + 3_600_000,
        granted_ms: T + 12,
        first_seen_ms: T + 15,
        deleted_ms: None,
        gone_ms: None,
        caller: None,
        borrower: None,
    };
    let error = json!({"error": "database call failed; retry with backoff"});
    let lost_answer = op(
        1,
        P,
        Call::Borrow {
            ttl_ms: 3_600_000,
            wait_ms: 0,
            lease: None,
        },
        502,
        error,
        10,
        20,
    );
    let history = [register(P, 1, 0, 0, 1), lost_answer];
    let found = orphans(&[stored(1)], &history, &Default::default());
    assert_eq!(found.leases.len(), 1);
    assert_eq!(found.slot_ms, 3_600_000 - 15);
    // Known to be written by the call answered at +20: held from then on.
    let written_by = std::collections::HashMap::from([(7, 1)]);
    let lease = StoredLease {
        caller: Some(7),
        ..stored(1)
    };
    assert_eq!(
        orphans(&[lease], &history, &written_by).slot_ms,
        3_600_000 - 20
    );
    // Gone (deleted with its pool) before its writer answered: held by
    // nobody untold, so no orphan at all.
    let deleted = StoredLease {
        deleted_ms: Some(T + 18),
        ..lease
    };
    assert_eq!(
        orphans(&[deleted], &history, &written_by),
        Default::default()
    );
    assert_eq!(found.violations()[0].rule, Rule::OrphanedSlot);
    // Told about in a 200: no orphan.
    let told = granted(1, P, 1, 0, 3_600_000, 10, 20);
    assert_eq!(
        orphans(&[stored(1)], &[told], &Default::default()).slot_ms,
        0
    );
}

/// A borrow with lease UUID `n` that waited and was granted at `granted_at`.
fn granted_as(n: u32, from: u64, granted_at: u64, to: u64) -> Op {
    let mut op = granted_after_wait(3, P, n, 0, from, granted_at, to);
    op.call = Call::Borrow {
        ttl_ms: 1000,
        wait_ms: 500,
        lease: Some(lease(n)),
    };
    op
}

#[test]
fn a_borrow_granted_after_its_wait_was_given_up_is_flagged() {
    // Its client gave up (the return found it waiting: `false`), then it was
    // granted all the same: a slot handed to a client that left.
    // Granted at +300 for 850 ms: it expires in the second after T+1000,
    // so it was granted after +150, after the return answered.
    let mut late = granted_as(7, 10, 300, 302);
    late.call = Call::Borrow {
        ttl_ms: 850,
        wait_ms: 500,
        lease: Some(lease(7)),
    };
    late.body["expires_in"] = json!(0.848);
    late.body["expires_at_unix"] = json!((T + 1150) / 1000);
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 5, 6),
        returned(1, P, 1, true, 300, 301),
        returned(3, P, 7, false, 100, 110),
        late,
    ];
    assert_flags(&ops, &strict(), Rule::GrantedAfterGivingUp);
    // Given up after the grant: the return ends the lease (`true`).
    let ops = vec![
        register(P, 1, 0, 0, 1),
        granted(1, P, 1, 0, 1000, 5, 6),
        returned(1, P, 1, true, 300, 301),
        granted_as(7, 10, 300, 302),
        returned(3, P, 7, true, 310, 311),
    ];
    assert_clean(&ops, &strict());
    // A short grant (50 ms) that ended before the return (`false`: nothing
    // held) and was answered after it, its time left the least there is.
    let mut short = granted_as(7, 10, 60, 302);
    short.call = Call::Borrow {
        ttl_ms: 50,
        wait_ms: 500,
        lease: Some(lease(7)),
    };
    short.body["expires_in"] = json!(0.001);
    short.body["expires_at_unix"] = json!((T + 302) / 1000);
    let ops = vec![
        register(P, 1, 0, 0, 1),
        returned(3, P, 7, false, 200, 210),
        short,
    ];
    assert_clean(&ops, &strict());
}

#[test]
fn a_return_that_takes_back_the_grant_of_a_given_up_borrow_is_no_dead_return() {
    // Handed a slot just as it was given up: the return frees that slot
    // (`true`), and the borrow answers 409.
    let mut borrow = refused(3, P, 500, 10, 120);
    borrow.call = Call::Borrow {
        ttl_ms: 1000,
        wait_ms: 500,
        lease: Some(lease(7)),
    };
    let ops = vec![
        register(P, 1, 0, 0, 1),
        borrow.clone(),
        returned(4, P, 7, true, 100, 105),
    ];
    assert_clean(&ops, &strict());
    // A return sent after the borrow answered has nothing to take back.
    let ops = vec![
        register(P, 1, 0, 0, 1),
        borrow,
        returned(4, P, 7, true, 130, 135),
    ];
    assert_flags(&ops, &strict(), Rule::ReturnedDeadLease);
}

#[test]
fn a_given_up_borrow_refused_early_lost_no_wake_up() {
    // A slot is free all through the borrow's call, yet it is refused: its
    // own return gave it up (it arrived after the return, or the return took
    // its ticket out of the queue).
    let mut borrow = refused(3, P, 500, 10, 40);
    borrow.call = Call::Borrow {
        ttl_ms: 1000,
        wait_ms: 500,
        lease: Some(lease(7)),
    };
    let ops = vec![
        register(P, 1, 0, 0, 1),
        returned(3, P, 7, false, 5, 8),
        borrow.clone(),
    ];
    assert_clean(&ops, &strict());
    // Without the return, that refusal is a lost wake-up.
    let ops = vec![register(P, 1, 0, 0, 1), borrow];
    assert_flags(&ops, &strict(), Rule::LostWakeup);
}
