"""Typed errors, all under SemaphoreError; a wrong URL reads as one, not as a missing pool."""

from __future__ import annotations

import uuid

import pytest
from support import TWINS, Proxy, new_pool, on

from http_semaphore import (
    Client,
    InvalidRequest,
    NoSlot,
    PoolNotFound,
    SemaphoreError,
    ServiceNotFound,
    TicketNotFound,
    UnexpectedResponse,
)


@TWINS
def test_errors_are_typed(url: str, twin: str, proxies: list[Proxy]) -> None:
    missing = uuid.uuid4()
    for action in (lambda p: p.inspect(), lambda p: p.borrow(ttl=1), lambda p: p.release(missing)):
        with pytest.raises(PoolNotFound):
            on(twin, url, missing, action)

    pool = new_pool(url, 1)
    with pytest.raises(InvalidRequest) as invalid:
        on(twin, url, pool.id, lambda p: p.register(1001))
    assert "count" in invalid.value.message
    assert invalid.value.status == 400

    held = pool.borrow(ttl=60)
    with pytest.raises(NoSlot) as no_slot:
        on(twin, url, pool.id, lambda p: p.borrow(ttl=1, wait=0.3))
    assert no_slot.value.waited == 0.3
    with pytest.raises(NoSlot, match="no slot free"):
        on(twin, url, pool.id, lambda p: p.borrow(ttl=1))
    assert pool.register(0).in_use == 1, "lowering the count keeps the live lease"
    held.release()

    with pytest.raises(TicketNotFound):
        on(twin, url, pool.id, lambda p: p.ticket(uuid.uuid4()))

    # A wrong stage, and a server that is not the service: not a missing pool.
    with pytest.raises(ServiceNotFound, match="/prod/ leads to no semaphore service"):
        on(twin, url + "/prod", pool.id, lambda p: p.inspect())
    foreign = Proxy(url, "html-404")
    proxies.append(foreign)
    with pytest.raises(ServiceNotFound, match="<h1>Not Found</h1>") as not_found:
        on(twin, foreign.url, pool.id, lambda p: p.borrow(ttl=1))
    assert str(pool.id) not in str(not_found.value), "the pool id is a secret"

    for error in (PoolNotFound, InvalidRequest, NoSlot, TicketNotFound, ServiceNotFound):
        assert issubclass(error, SemaphoreError)


def test_a_base_url_that_is_no_url_is_refused() -> None:
    with pytest.raises(ValueError, match=r"did you mean http://127\.0\.0\.1:3000"):
        Client("127.0.0.1:3000")
    with pytest.raises(ValueError, match="not an http"):
        Client("ftp://example.com")
    assert Client("https://example.com/prod?x=1").url == "https://example.com/prod/"


@TWINS
def test_an_unreadable_answer_is_an_unexpected_response(
    url: str, twin: str, proxies: list[Proxy]
) -> None:
    pool = new_pool(url, 1)
    garbled = Proxy(url, "garbled")
    proxies.append(garbled)
    with pytest.raises(UnexpectedResponse, match="DecodingError") as unreadable:
        on(twin, garbled.url, pool.id, lambda p: p.borrow(ttl=60))
    assert isinstance(unreadable.value, SemaphoreError)
    assert str(pool.id) not in str(unreadable.value), "the pool id is a secret"
    assert garbled.requests == 2, "not retried: the borrow, then its give-up"
    assert pool.inspect().in_use == 0, "the slot the borrow may hold was given up"
