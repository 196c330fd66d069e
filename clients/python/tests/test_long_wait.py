"""A wait longer than the server's maximum: the client borrows again, with the same lease
UUID, until its own wait ends. The server here blocks a borrow 0.4 s at most."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from support import TWINS, Proxy, borrow_leases, new_pool

from http_semaphore import AsyncClient, AsyncLease, Client, Lease, NoSlot


def borrow(twin: str, url: str, pool_id: uuid.UUID, wait: float) -> Lease | AsyncLease:
    if twin == "sync":
        return Client(url).pool(pool_id).borrow(ttl=60, wait=wait)

    async def borrow() -> AsyncLease:
        async with AsyncClient(url) as client:
            return await client.pool(pool_id).borrow(ttl=60, wait=wait)

    return asyncio.run(borrow())


@TWINS
def test_a_wait_outlasts_the_servers_maximum(
    short_wait_url: str, twin: str, proxies: list[Proxy]
) -> None:
    pool = new_pool(short_wait_url, 1)
    proxy = Proxy(short_wait_url, "gateway")
    proxies.append(proxy)
    # The slot frees itself 1 s from now: after two or more of the server's 0.4 s waits.
    pool.borrow(ttl=1)
    started = time.monotonic()
    lease = borrow(twin, proxy.url, pool.id, wait=10)
    took = time.monotonic() - started
    assert 0.8 <= took < 5, f"got the slot after {took:.2f} s"
    leases = set(borrow_leases(proxy))
    assert len(proxy.borrows) >= 2, "borrowed again after the server's 409"
    assert leases == {str(lease.id)}, "every borrow asked for the same lease"

    # And gives up only when the caller's wait is spent, not the server's.
    started = time.monotonic()
    with pytest.raises(NoSlot) as no_slot:
        borrow(twin, short_wait_url, pool.id, wait=1.0)
    assert time.monotonic() - started >= 1.0
    assert no_slot.value.waited == 1.0
    assert str(no_slot.value) == "no slot freed up within 1 s"
    assert pool.inspect().waiting == 0
