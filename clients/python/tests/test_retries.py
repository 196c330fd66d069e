"""Retries: a borrow whose answer is lost is retried with the same lease UUID and holds
one slot; the policy is the client's to change."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
from support import TWINS, Proxy, borrow_leases, new_pool, on

from http_semaphore import AsyncClient, Client, RetryPolicy, ServiceUnavailable

FAST = RetryPolicy(retries=2, base=0.01, cap=0.02)


@TWINS
@pytest.mark.parametrize("fault", ["drop-first-borrow", "502-first-borrow"])
def test_a_retried_borrow_holds_one_slot(
    url: str, twin: str, fault: str, proxies: list[Proxy]
) -> None:
    pool = new_pool(url, 2)
    proxy = Proxy(url, fault)
    proxies.append(proxy)
    if twin == "sync":
        lease_id = Client(proxy.url).pool(pool.id).borrow(ttl=60).id
    else:

        async def borrow() -> uuid.UUID:
            async with AsyncClient(proxy.url) as client:
                return (await client.pool(pool.id).borrow(ttl=60)).id

        lease_id = asyncio.run(borrow())
    assert len(proxy.borrows) == 2, "one borrow, one retry"
    assert set(borrow_leases(proxy)) == {str(lease_id)}, "the retry asked for the same lease"
    state = pool.inspect()
    assert state.in_use == 1, "a retried borrow holds one slot, not two"


@TWINS
def test_the_retry_policy_is_the_clients(url: str, twin: str, proxies: list[Proxy]) -> None:
    pool = new_pool(url, 1)
    failing = Proxy(url, "always-502")
    proxies.append(failing)
    # Nothing listens on a port we bound and closed.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    # A borrow whose outcome is unknown is given up: its return is sent too, retried 3
    # times (its own policy, whatever the client's).
    with pytest.raises(ServiceUnavailable) as unavailable:
        on(twin, failing.url, pool.id, lambda p: p.borrow(ttl=1, wait=1), FAST)
    assert unavailable.value.attempts == 3
    assert failing.requests == 3 + 4
    assert "HTTP 502" in unavailable.value.last
    assert unavailable.value.status == 502
    assert str(pool.id) not in str(unavailable.value), "the pool id is a secret"

    with pytest.raises(ServiceUnavailable) as unavailable:
        on(twin, failing.url, pool.id, lambda p: p.inspect(), RetryPolicy(retries=0))
    assert unavailable.value.attempts == 1
    assert failing.requests == 3 + 4 + 1

    with pytest.raises(ServiceUnavailable) as unavailable:
        on(twin, nowhere, pool.id, lambda p: p.inspect(), FAST)
    assert unavailable.value.attempts == 3
    assert "Connect" in unavailable.value.last
