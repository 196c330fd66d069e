//! Ticket items (async mode's backlog), on both stores: one per lease id,
//! read in ticket order, and every state change conditioned on the state it
//! leaves, so that each ticket ends exactly once.

use semaphore::clock::now_ms;
use semaphore::domain::{
    Callback, DeliveryClaim, Holder, LeaseDigest, Pool, TicketGrant, TicketItem, TicketState,
};
use semaphore::keys::PoolKey;
use semaphore::store::{PutTicket, Record, StoreErrorKind, TicketUpdated};
use semaphore_tests::harness::Backend;

on_both_stores!(
    a_lease_id_has_one_ticket,
    the_backlog_reads_in_ticket_order,
    a_ticket_ends_exactly_once,
    one_delivery_claim_at_a_time,
    a_grant_is_recorded_with_its_first_claim_once,
    deleting_tickets_leaves_the_pool_item,
);

fn key() -> PoolKey {
    PoolKey(*uuid::Uuid::new_v4().as_bytes())
}

fn digest() -> LeaseDigest {
    LeaseDigest(uuid::Uuid::new_v4().as_u64_pair().0.to_be_bytes())
}

fn ticket(number: u64) -> TicketItem {
    let now = now_ms();
    TicketItem {
        number,
        holder: Holder {
            digest: digest(),
            ttl_ms: 30_000,
        },
        incarnation: 42,
        joined_ms: now,
        wait_until_ms: now + 3_600_000,
        callback: Some(Callback {
            url: "https://example.com/hook".into(),
            token: "t0ken".into(),
        }),
        state: TicketState::Waiting,
        attempts: 0,
        claim: None,
    }
}

fn grant() -> TicketGrant {
    let now = now_ms();
    TicketGrant {
        position: 2,
        fence: 1_795_241_433_052_117,
        granted_ms: now,
        expires_at_ms: now + 30_000,
    }
}

async fn a_lease_id_has_one_ticket(backend: Backend) {
    let (_, tickets) = backend.stores().await;
    let pool = key();
    let first = ticket(7);
    assert_eq!(
        tickets.put_ticket(&pool, &first).await,
        Ok(PutTicket::Created)
    );
    assert_eq!(
        tickets.ticket(&pool, first.digest()).await,
        Ok(Some(first.clone()))
    );
    // An enqueue repeated with the same lease id took another number: the
    // first ticket stands.
    let repeat = TicketItem {
        number: 8,
        ..first.clone()
    };
    assert_eq!(
        tickets.put_ticket(&pool, &repeat).await,
        Ok(PutTicket::Exists(first.clone()))
    );
    assert_eq!(tickets.ticket(&pool, digest()).await, Ok(None));
    assert_eq!(tickets.ticket(&key(), first.digest()).await, Ok(None));
    // A sync borrower's ticket has no callback.
    let sync = TicketItem {
        callback: None,
        ..ticket(9)
    };
    assert_eq!(
        tickets.put_ticket(&pool, &sync).await,
        Ok(PutTicket::Created)
    );
    assert_eq!(tickets.ticket(&pool, sync.digest()).await, Ok(Some(sync)));
}

async fn the_backlog_reads_in_ticket_order(backend: Backend) {
    let (_, tickets) = backend.stores().await;
    let pool = key();
    // Numbers with gaps (repeats burn numbers), written out of order.
    let numbers: Vec<u64> = (0..30).map(|i| 100 + 3 * i).collect();
    let mut written = Vec::new();
    for &number in numbers.iter().rev() {
        let t = ticket(number);
        tickets.put_ticket(&pool, &t).await.expect("put");
        written.push(t);
    }
    written.sort_by_key(|t| t.number);
    let ended = &written[12];
    tickets
        .set_ticket_state(
            &pool,
            ended.digest(),
            &TicketState::Waiting,
            &TicketState::Cancelled,
        )
        .await
        .expect("cancel");

    let all = tickets.backlog(&pool, 0, 100).await.expect("backlog");
    let order: Vec<u64> = all.iter().map(|t| t.number).collect();
    assert_eq!(order, numbers);
    assert_eq!(
        all[12].state,
        TicketState::Cancelled,
        "whatever their state"
    );

    let page = tickets.backlog(&pool, 115, 10).await.expect("backlog");
    let order: Vec<u64> = page.iter().map(|t| t.number).collect();
    assert_eq!(order, (0..10).map(|i| 115 + 3 * i).collect::<Vec<_>>());
    // From between two numbers, and past the end.
    let next = tickets.backlog(&pool, 116, 1).await.expect("backlog");
    assert_eq!(next.iter().map(|t| t.number).collect::<Vec<_>>(), [118]);
    assert_eq!(tickets.backlog(&pool, 188, 5).await, Ok(Vec::new()));
    assert_eq!(tickets.backlog(&key(), 0, 5).await, Ok(Vec::new()));
}

async fn a_ticket_ends_exactly_once(backend: Backend) {
    let (_, tickets) = backend.stores().await;
    let pool = key();
    let t = ticket(1);
    tickets.put_ticket(&pool, &t).await.expect("put");
    let grant = grant();
    let granted = TicketState::Granted(grant);
    let Ok(TicketUpdated::Written(now)) = tickets
        .set_ticket_state(&pool, t.digest(), &TicketState::Waiting, &granted)
        .await
    else {
        panic!("waiting → granted")
    };
    assert_eq!(now.state, granted);
    assert_eq!(now.callback, t.callback, "the rest of the ticket is kept");
    // A cancel planned on the ticket as waiting loses, and sees the grant.
    assert_eq!(
        tickets
            .set_ticket_state(
                &pool,
                t.digest(),
                &TicketState::Waiting,
                &TicketState::Cancelled
            )
            .await,
        Ok(TicketUpdated::Lost(now.clone()))
    );
    let delivered = TicketState::Delivered {
        grant,
        delivered_ms: now_ms(),
    };
    let Ok(TicketUpdated::Written(done)) = tickets
        .set_ticket_state(&pool, t.digest(), &granted, &delivered)
        .await
    else {
        panic!("granted → delivered")
    };
    assert_eq!(done.state, delivered);
    // No change leaves a final state; asking for one is a bug.
    let failed = TicketState::Failed {
        reason: "late".into(),
    };
    let refused = tickets
        .set_ticket_state(&pool, t.digest(), &delivered, &failed)
        .await;
    assert!(matches!(refused, Err(e) if e.kind == StoreErrorKind::Corrupt));
    assert_eq!(
        tickets
            .set_ticket_state(
                &pool,
                digest(),
                &TicketState::Waiting,
                &TicketState::Expired
            )
            .await,
        Ok(TicketUpdated::Gone)
    );

    // Racing ends of one waiting ticket: exactly one lands, every time.
    for round in 0..10 {
        let t = ticket(100 + round);
        tickets.put_ticket(&pool, &t).await.expect("put");
        let racing = t.digest();
        let ends = [
            TicketState::Cancelled,
            TicketState::Expired,
            TicketState::Granted(grant),
            TicketState::Failed {
                reason: "pool deleted".into(),
            },
        ];
        let tasks: Vec<_> = ends
            .into_iter()
            .map(|end| {
                let tickets = tickets.clone();
                tokio::spawn(async move {
                    tickets
                        .set_ticket_state(&pool, racing, &TicketState::Waiting, &end)
                        .await
                })
            })
            .collect();
        let mut landed = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(TicketUpdated::Written(_)) => landed += 1,
                Ok(TicketUpdated::Lost(seen)) => assert_ne!(seen.state, TicketState::Waiting),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(landed, 1, "round {round}");
    }
}

/// A grant recorded with its first attempt's claim is one write: the
/// ticket granted, claimed and its attempt counted; a second dispatcher's
/// record of the same grant finds it granted already and leaves its claim
/// alone; a ticket that ended is not granted.
async fn a_grant_is_recorded_with_its_first_claim_once(backend: Backend) {
    let (_, tickets) = backend.stores().await;
    let pool = key();
    let t = ticket(1);
    tickets.put_ticket(&pool, &t).await.expect("put");
    let g = grant();
    let now = now_ms();
    let first = DeliveryClaim {
        by: 1,
        until_ms: now + 7_000,
    };
    let recorded = tickets
        .record_grant(&pool, t.digest(), &TicketState::Waiting, g, Some(first))
        .await
        .expect("record");
    let TicketUpdated::Written(item) = recorded else {
        panic!("not recorded: {recorded:?}");
    };
    assert_eq!(
        (item.state.clone(), item.claim, item.attempts),
        (TicketState::Granted(g), Some(first), 1)
    );
    let second = DeliveryClaim {
        by: 2,
        until_ms: now + 9_000,
    };
    let again = tickets
        .record_grant(&pool, t.digest(), &TicketState::Waiting, g, Some(second))
        .await
        .expect("record");
    assert!(
        matches!(again, TicketUpdated::Lost(ref item) if item.claim == Some(first)),
        "{again:?}"
    );
    let read = tickets.ticket(&pool, t.digest()).await.expect("read");
    assert_eq!(read.map(|t| (t.claim, t.attempts)), Some((Some(first), 1)));
    // Without a claim (a step that hands its deliveries on): granted only.
    let other = ticket(2);
    tickets.put_ticket(&pool, &other).await.expect("put");
    let recorded = tickets
        .record_grant(&pool, other.digest(), &TicketState::Waiting, g, None)
        .await
        .expect("record");
    assert!(
        matches!(recorded, TicketUpdated::Written(ref item) if item.claim.is_none() && item.attempts == 0),
        "{recorded:?}"
    );
    // A ticket that ended cannot be granted: a bug, said as such.
    let err = tickets
        .record_grant(&pool, other.digest(), &TicketState::Expired, g, None)
        .await
        .expect_err("refused");
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
}

/// The delivery claim: one attempt in flight per ticket across dispatchers.
/// Taken only while the ticket holds that grant, refused while another's
/// claim is live, renewed by its holder, taken over once it lapsed; every
/// claim counts an attempt.
async fn one_delivery_claim_at_a_time(backend: Backend) {
    let (_, tickets) = backend.stores().await;
    let pool = key();
    let t = ticket(1);
    let now = now_ms();
    let (a, b) = (
        |until_ms| DeliveryClaim { by: 1, until_ms },
        |until_ms| DeliveryClaim { by: 2, until_ms },
    );
    let digest = t.digest();
    let claim = |claim: DeliveryClaim, fence: u64, at: u64| {
        let tickets = tickets.clone();
        async move {
            match tickets
                .claim_attempt(&pool, digest, fence, claim, at)
                .await
                .expect("claim")
            {
                TicketUpdated::Written(item) => {
                    assert_eq!(item.claim, Some(claim));
                    Some(item.attempts)
                }
                TicketUpdated::Lost(_) | TicketUpdated::Gone => None,
            }
        }
    };
    let g = grant();
    assert_eq!(claim(a(now + 7_000), g.fence, now).await, None, "no item");
    tickets.put_ticket(&pool, &t).await.expect("put");
    assert_eq!(
        claim(a(now + 7_000), g.fence, now).await,
        None,
        "not granted"
    );
    let granted = TicketState::Granted(g);
    tickets
        .set_ticket_state(&pool, t.digest(), &TicketState::Waiting, &granted)
        .await
        .expect("grant");
    assert_eq!(
        claim(a(now + 7_000), g.fence + 1, now).await,
        None,
        "another grant"
    );
    assert_eq!(claim(a(now + 7_000), g.fence, now).await, Some(1));
    // Concurrent claimers: only the holder's renewal lands while it is live.
    assert_eq!(claim(b(now + 9_000), g.fence, now + 6_999).await, None);
    assert_eq!(claim(a(now + 14_000), g.fence, now + 6_999).await, Some(2));
    // Lapsed: another dispatcher takes it over, and the first is out.
    assert_eq!(claim(b(now + 21_000), g.fence, now + 14_000).await, Some(3));
    assert_eq!(claim(a(now + 21_000), g.fence, now + 14_001).await, None);
    let failed = TicketState::Failed {
        reason: "the receiver answered HTTP 410".into(),
    };
    tickets
        .set_ticket_state(&pool, t.digest(), &granted, &failed)
        .await
        .expect("fail");
    assert_eq!(
        claim(b(now + 28_000), g.fence, now + 21_000).await,
        None,
        "ended"
    );
    let read = tickets.ticket(&pool, t.digest()).await.expect("read");
    assert_eq!(read.map(|t| (t.attempts, t.state)), Some((3, failed)));
}

async fn deleting_tickets_leaves_the_pool_item(backend: Backend) {
    let (pools, tickets) = backend.stores().await;
    let (pool, other) = (key(), key());
    let record = Record::new(Pool::new(2, 1));
    pools.create(&pool, &record).await.expect("create");
    // More than one batch of deletes.
    for number in 0..60 {
        tickets
            .put_ticket(&pool, &ticket(number))
            .await
            .expect("put");
    }
    tickets.put_ticket(&other, &ticket(0)).await.expect("put");
    assert_eq!(tickets.delete_tickets(&pool).await, Ok(60));
    assert_eq!(tickets.backlog(&pool, 0, 100).await, Ok(Vec::new()));
    assert_eq!(
        tickets.backlog(&other, 0, 100).await.map(|b| b.len()),
        Ok(1)
    );
    assert_eq!(pools.load(&pool).await, Ok(Some(record)));
    assert_eq!(tickets.delete_tickets(&pool).await, Ok(0));
}
