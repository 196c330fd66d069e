//! The Rust client against a real `local-api`, on both stores.

#[macro_use]
extern crate semaphore_tests;

mod support;

use std::time::{Duration, Instant};

use semaphore_client::{Borrow, Client, Enqueue, Error, Pool, Uuid};
use semaphore_tests::Backend;
use support::{
    block, in_use, new_pool, spawn, wait_until, waiting, Fault, Proxy, Receiver, Server,
};

on_both_stores!(
    sync;
    a_lease_is_returned_by_release_or_by_drop,
    errors_are_typed,
    a_borrow_with_the_same_lease_id_gets_the_same_grant,
    a_dropped_borrow_gives_its_place_up,
    a_clamped_ttl_is_told_and_the_deadline_is_the_granted_one,
    with_lease_returns_the_lease_however_the_body_ends,
    enqueue_ticket_and_cancel,
);

fn a_lease_is_returned_by_release_or_by_drop(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 2);
    let lease = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("borrow");
    assert_eq!(lease.position(), 0);
    assert!(lease.deadline() > std::time::Instant::now() + Duration::from_secs(55));
    assert_eq!(in_use(&pool), 1);
    assert!(block(lease.release()).expect("release"), "a live lease");
    assert_eq!(in_use(&pool), 0);

    // Dropped inside the runtime: returned in the background.
    block(async {
        let lease = pool
            .borrow(Borrow::ttl(Duration::from_secs(60)))
            .await
            .expect("borrow");
        assert_eq!(pool.inspect().await.expect("inspect").in_use, 1);
        drop(lease);
    });
    wait_until(
        "the dropped lease is returned",
        Duration::from_secs(10),
        || in_use(&pool) == 0,
    );

    // Detached: kept.
    let lease = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("borrow");
    let grant = lease.detach();
    block(async { tokio::task::yield_now().await });
    assert_eq!(in_use(&pool), 1);
    assert!(block(pool.return_lease(grant.lease)).expect("return"));
}

fn errors_are_typed(store: Backend) {
    let server = Server::start(store, &[]);
    let client = Client::new(&server.url).expect("client");
    let missing = client.pool(Uuid::new_v4());
    assert_eq!(block(missing.inspect()), Err(Error::PoolNotFound));
    assert_eq!(
        block(missing.borrow(Borrow::ttl(Duration::from_secs(1)))).err(),
        Some(Error::PoolNotFound)
    );

    let pool = new_pool(&server.url, 1);
    assert!(matches!(block(pool.register(1001)), Err(Error::BadRequest(m)) if m.contains("count")));
    let _held = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("borrow");
    let wait = Duration::from_millis(300);
    assert_eq!(
        block(pool.borrow(Borrow::ttl(Duration::from_secs(1)).wait(wait))).err(),
        Some(Error::NoSlot { waited: wait })
    );
    // Lowering the count keeps the live lease.
    assert_eq!(block(pool.register(0)).expect("register").in_use, 1);
}

fn a_borrow_with_the_same_lease_id_gets_the_same_grant(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 3);
    let id = Uuid::new_v4();
    let first =
        block(pool.borrow(Borrow::ttl(Duration::from_secs(60)).lease_id(id))).expect("borrow");
    let again =
        block(pool.borrow(Borrow::ttl(Duration::from_secs(60)).lease_id(id))).expect("again");
    assert_eq!(first.id(), id, "the lease has the client's id");
    assert_eq!(again.id(), id);
    assert_eq!(again.position(), first.position());
    assert_eq!(again.grant().expires_at_unix, first.grant().expires_at_unix);
    assert!(first.fence().is_some(), "every grant carries a fence");
    assert_eq!(again.fence(), first.fence());
    assert!(again.grant().expires_in <= first.grant().expires_in);
    assert_eq!(in_use(&pool), 1, "no second slot");
    let other = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("borrow");
    assert!(
        other.fence() > first.fence(),
        "fences grow with every grant"
    );
    first.detach();
    again.detach();
    other.detach();
}

/// A borrow future dropped while it waits (a timeout, `select!`) takes its
/// place out of the queue: the borrower after it gets the slot that frees
/// up, at once. Through a proxy that, like API Gateway, never tells the
/// server that its client went away, so only the client's own return can
/// do it.
fn a_dropped_borrow_gives_its_place_up(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let gateway = Proxy::start(&server.url, Fault::LikeApiGateway);
    let via_gateway = Client::new(&gateway.url).expect("client").pool(pool.id());
    let held = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("hold");
    let waiter = spawn(async move {
        via_gateway
            .borrow(Borrow::ttl(Duration::from_secs(60)).wait(Duration::from_secs(60)))
            .await
    });
    wait_until("the waiter queues", Duration::from_secs(10), || {
        waiting(&pool) == 1
    });
    let next = spawn_borrow(&pool);
    wait_until("the next borrower queues", Duration::from_secs(10), || {
        waiting(&pool) == 2
    });

    let cancelled = Instant::now();
    waiter.abort();
    assert!(block(held.release()).expect("release"));
    let (granted, lease) = block(next).expect("the next borrower");
    let lease = lease.expect("the next borrower gets the slot");
    let took = granted - cancelled;
    println!("{store:?}: dropped borrow future: pool usable by the next borrower {took:?} after the cancel");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        block(waiter).is_err_and(|e| e.is_cancelled()),
        "the waiter was dropped before its answer"
    );
    assert_eq!(in_use(&pool), 1, "the dropped waiter holds nothing");
    block(lease.release()).expect("release");
}

/// A borrow of a minute that waits up to 30 s, spawned: when it was answered,
/// and its outcome.
fn spawn_borrow(
    pool: &Pool,
) -> tokio::task::JoinHandle<(Instant, Result<semaphore_client::Lease, Error>)> {
    let pool = pool.clone();
    spawn(async move {
        let lease = pool
            .borrow(Borrow::ttl(Duration::from_secs(60)).wait(Duration::from_secs(30)))
            .await;
        (Instant::now(), lease)
    })
}

fn a_clamped_ttl_is_told_and_the_deadline_is_the_granted_one(store: Backend) {
    let server = Server::start(store, &[("MAX_TTL_SECONDS", "2")]);
    let pool = new_pool(&server.url, 2);
    let asked = Instant::now();
    let lease = block(pool.borrow(Borrow::ttl(Duration::from_secs(10)))).expect("borrow");
    let answered = Instant::now();
    assert!(
        lease.ttl_clamped(),
        "the server granted 2 s of the 10 asked"
    );
    assert_eq!(lease.grant().expires_in.as_millis(), 2000);
    assert!(
        lease.deadline() >= asked + Duration::from_secs(2)
            && lease.deadline() <= answered + Duration::from_secs(2),
        "the deadline counts the 2 s granted from the answer"
    );

    let lease2 = block(pool.borrow(Borrow::ttl(Duration::from_millis(1500)))).expect("borrow");
    assert!(!lease2.ttl_clamped(), "1.5 s is below the server's maximum");
    assert_eq!(lease2.grant().expires_in.as_millis(), 1500);

    // A slot handed over after a wait has less left than asked, without a clamp.
    let waited = block(async {
        pool.borrow(Borrow::ttl(Duration::from_secs(2)).wait(Duration::from_secs(10)))
            .await
    })
    .expect("borrow after the first lease ends");
    assert!(!waited.ttl_clamped(), "{:?}", waited.grant());
    assert!(waited.deadline() > Instant::now());
    for lease in [lease, lease2, waited] {
        lease.detach();
    }
}

fn with_lease_returns_the_lease_however_the_body_ends(store: Backend) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 1);
    let ask = Borrow::ttl(Duration::from_secs(60));

    let inside = block(pool.with_lease(ask, async |lease| {
        (
            lease.position(),
            pool.inspect().await.expect("inspect").in_use,
        )
    }))
    .expect("with_lease");
    assert_eq!(inside, (0, 1), "the body held the slot");
    assert_eq!(in_use(&pool), 0, "returned before with_lease resolved");

    // A panic in the body: returned, then the panic goes on.
    let pool2 = pool.clone();
    let panicked = block(spawn(async move {
        pool2
            .with_lease(ask, async |_lease| {
                if pool2.inspect().await.expect("inspect").in_use == 1 {
                    panic!("the body fails");
                }
            })
            .await
    }));
    assert!(panicked.is_err_and(|e| e.is_panic()), "the panic went on");
    assert_eq!(in_use(&pool), 0, "returned despite the panic");

    // Its error is the borrow's.
    let _held = block(pool.borrow(ask)).expect("hold");
    let no_slot = block(pool.with_lease(ask, async |_lease| ()));
    assert_eq!(
        no_slot,
        Err(Error::NoSlot {
            waited: Duration::ZERO
        })
    );
}

/// A lease dropped inside a runtime is returned in the background, and
/// `Client::settle` waits for that.
#[test]
fn settle_waits_for_the_returns_sent_in_the_background() {
    let server = Server::start(Backend::Memory, &[]);
    let pool = new_pool(&server.url, 3);
    let client = Client::new(&server.url).expect("client");
    let mine = client.pool(pool.id());
    block(async {
        let a = mine
            .borrow(Borrow::ttl(Duration::from_secs(60)))
            .await
            .expect("borrow");
        let b = mine
            .borrow(Borrow::ttl(Duration::from_secs(60)))
            .await
            .expect("borrow");
        drop(a);
        drop(b);
        client.settle().await;
        assert_eq!(mine.inspect().await.expect("inspect").in_use, 0);
        // Nothing pending: at once.
        tokio::time::timeout(Duration::from_millis(100), client.settle())
            .await
            .expect("nothing to wait for");
    });
}

/// A 404 from the service's own "pool not found" is a missing pool; any
/// other (a route it does not know, another server) is a wrong URL.
#[test]
fn a_wrong_url_is_not_a_missing_pool() {
    let server = Server::start(Backend::Memory, &[]);
    let id = Uuid::new_v4();
    let missing = Client::new(&server.url).expect("client").pool(id);
    assert_eq!(block(missing.inspect()), Err(Error::PoolNotFound));
    let wrong_stage = Client::new(&format!("{}/prod", server.url))
        .expect("client")
        .pool(id);
    assert!(
        matches!(block(wrong_stage.inspect()), Err(Error::RouteNotFound(m)) if m == "not found")
    );
    let foreign = Proxy::start(
        &server.url,
        Fault::NotFound("<html><h1>Not Found</h1></html>"),
    );
    let foreign = Client::new(&foreign.url).expect("client").pool(id);
    assert!(matches!(
        block(foreign.borrow(Borrow::ttl(Duration::from_secs(1)))),
        Err(Error::RouteNotFound(m)) if m.contains("<h1>Not Found</h1>")
    ));
}

fn enqueue_ticket_and_cancel(store: Backend) {
    let server = Server::start_with(store, &[], &["--allow-local-callbacks"]);
    let receiver = Receiver::start();
    let pool = new_pool(&server.url, 1);
    let held = block(pool.borrow(Borrow::ttl(Duration::from_secs(60)))).expect("borrow");
    let ask = Enqueue::new(Duration::from_secs(30), receiver.url.clone(), "t0ken")
        .wait(Duration::from_secs(600));
    let queued = block(pool.enqueue(ask.clone())).expect("enqueue");
    assert_eq!(queued.ahead, 0);
    let status = block(pool.ticket(queued.lease)).expect("ticket");
    assert_eq!((status.state.as_str(), status.ahead), ("waiting", Some(0)));
    // Another waits behind it, and gives up.
    let second = block(pool.enqueue(ask.lease_id(Uuid::new_v4()))).expect("enqueue");
    assert_eq!(second.ticket, queued.ticket + 1);
    let cancelled = block(pool.cancel(second.lease)).expect("cancel");
    assert_eq!(cancelled.state, "cancelled");

    assert!(block(held.release()).expect("release"));
    wait_until("the grant is delivered", Duration::from_secs(10), || {
        block(pool.ticket(queued.lease)).expect("ticket").state == "delivered"
    });
    let got = receiver.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "Bearer t0ken");
    assert_eq!(got[0].1["ticket"], queued.ticket);
    assert!(block(pool.return_lease(queued.lease)).expect("return"));
    assert_eq!(
        block(pool.ticket(Uuid::new_v4())),
        Err(Error::TicketNotFound)
    );
}
