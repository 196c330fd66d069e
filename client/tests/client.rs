//! The Rust client against a real `local-api`, on both stores.

mod support;

use std::time::Duration;

use semaphore_client::{Client, Error};
use support::{block, in_use, new_pool, wait_until, Server, Store};
use uuid::Uuid;

on_both_stores!(
    a_lease_is_returned_by_release_or_by_drop,
    errors_are_typed,
    a_borrow_with_the_same_lease_id_gets_the_same_grant,
);

fn a_lease_is_returned_by_release_or_by_drop(store: Store) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 2);
    let lease = block(pool.borrow(Duration::from_secs(60), Duration::ZERO)).expect("borrow");
    assert_eq!(lease.position(), 0);
    assert!(lease.deadline() > std::time::Instant::now() + Duration::from_secs(55));
    assert_eq!(in_use(&pool), 1);
    assert!(block(lease.release()).expect("release"), "a live lease");
    assert_eq!(in_use(&pool), 0);

    // Dropped inside the runtime: returned in the background.
    block(async {
        let lease = pool
            .borrow(Duration::from_secs(60), Duration::ZERO)
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
    let lease = block(pool.borrow(Duration::from_secs(60), Duration::ZERO)).expect("borrow");
    let grant = lease.detach();
    block(async { tokio::task::yield_now().await });
    assert_eq!(in_use(&pool), 1);
    assert!(block(pool.return_lease(grant.lease)).expect("return"));
}

fn errors_are_typed(store: Store) {
    let server = Server::start(store, &[]);
    let client = Client::new(&server.url).expect("client");
    let missing = client.pool(Uuid::new_v4());
    assert_eq!(block(missing.inspect()), Err(Error::PoolNotFound));
    assert_eq!(
        block(missing.borrow(Duration::from_secs(1), Duration::ZERO)).err(),
        Some(Error::PoolNotFound)
    );

    let pool = new_pool(&server.url, 1);
    assert!(matches!(block(pool.register(1001)), Err(Error::BadRequest(m)) if m.contains("count")));
    let _held = block(pool.borrow(Duration::from_secs(60), Duration::ZERO)).expect("borrow");
    let wait = Duration::from_millis(300);
    assert_eq!(
        block(pool.borrow(Duration::from_secs(1), wait)).err(),
        Some(Error::NoSlot { waited: wait })
    );
    // Lowering the count keeps the live lease.
    assert_eq!(block(pool.register(0)).expect("register").in_use, 1);
}

fn a_borrow_with_the_same_lease_id_gets_the_same_grant(store: Store) {
    let server = Server::start(store, &[]);
    let pool = new_pool(&server.url, 3);
    let id = Uuid::new_v4();
    let first = block(pool.borrow_as(id, Duration::from_secs(60), Duration::ZERO)).expect("borrow");
    let again = block(pool.borrow_as(id, Duration::from_secs(60), Duration::ZERO)).expect("again");
    assert_eq!(first.id(), id, "the lease has the client's id");
    assert_eq!(again.id(), id);
    assert_eq!(again.position(), first.position());
    assert_eq!(again.grant().expires_at_unix, first.grant().expires_at_unix);
    assert!(first.fence().is_some(), "every grant carries a fence");
    assert_eq!(again.fence(), first.fence());
    assert!(again.grant().expires_in <= first.grant().expires_in);
    assert_eq!(in_use(&pool), 1, "no second slot");
    let other = block(pool.borrow(Duration::from_secs(60), Duration::ZERO)).expect("borrow");
    assert!(
        other.fence() > first.fence(),
        "fences grow with every grant"
    );
    first.detach();
    again.detach();
    other.detach();
}
