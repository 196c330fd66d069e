"""Borrow, return and expiry, on both twins."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from support import TWINS, Proxy, new_pool, wait_until

from http_semaphore import AsyncClient, Client, Lease, RetryPolicy, ServiceUnavailable


class Boom(Exception):
    pass


def test_a_lease_is_returned_on_exit_by_release_and_ends_at_its_ttl(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = new_pool(url, 2)
    mine = Client(url).pool(str(pool.id).upper())
    with mine.borrow(ttl=60, wait=5) as lease:
        assert isinstance(lease.id, uuid.UUID)
        assert lease.position == 0
        assert isinstance(lease.fence, int)
        assert abs(lease.expires_at - datetime.now(timezone.utc)) < timedelta(seconds=62)
        assert 55 < lease.time_left <= 60
        assert not lease.ttl_clamped
        assert pool.inspect().in_use == 1
    assert pool.inspect().in_use == 0, "returned on exit"

    # Returned on exit when the block raises, and the exception goes on.
    def fail() -> None:
        with mine.borrow(ttl=60):
            assert pool.inspect().in_use == 1
            raise Boom

    with pytest.raises(Boom):
        fail()
    assert pool.inspect().in_use == 0

    # Returned early; the exit then sends nothing.
    with mine.borrow(ttl=timedelta(minutes=1)) as lease:
        assert lease.release() is True
        assert pool.inspect().in_use == 0
        assert lease.release() is False, "released before"

    # Not returned: it ends at its ttl, and the exit says it had ended.
    with caplog.at_level(logging.WARNING, "http_semaphore"), mine.borrow(ttl=0.6) as lease:
        assert pool.inspect().in_use == 1
        wait_until("the lease expires", lambda: pool.inspect().in_use == 0, limit=5)
    assert "ended before the block did" in caplog.text


async def async_borrow_return_and_expiry(url: str) -> None:
    pool = new_pool(url, 2)
    async with AsyncClient(url) as client:
        mine = client.pool(pool.id)
        async with mine.borrow(ttl=60, wait=5) as lease:
            assert lease.position == 0
            assert (await mine.inspect()).in_use == 1
        assert (await mine.inspect()).in_use == 0

        with pytest.raises(Boom):
            async with mine.borrow(ttl=60):
                raise Boom
        assert (await mine.inspect()).in_use == 0

        # Awaited instead: a lease to release by hand.
        held = await mine.borrow(ttl=0.6)
        assert (await mine.inspect()).in_use == 1
        while (await mine.inspect()).in_use:  # ends at its ttl
            await asyncio.sleep(0.01)
        assert held.time_left < 0.1
        assert await held.release() is False

        # A block cancelled from outside still returns its lease.
        async def hold() -> None:
            async with mine.borrow(ttl=60):
                await asyncio.sleep(60)

        task = asyncio.ensure_future(hold())
        while (await mine.inspect()).in_use == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await mine.inspect()).in_use == 0, "returned before the cancel propagated"


def test_async_borrow_return_and_expiry(url: str) -> None:
    asyncio.run(async_borrow_return_and_expiry(url))


@TWINS
def test_a_borrow_with_the_same_lease_id_gets_the_same_grant(url: str, twin: str) -> None:
    pool = new_pool(url, 3)
    lease_id = uuid.uuid4()
    if twin == "sync":
        first = pool.borrow(ttl=60, lease=lease_id)
        again = pool.borrow(ttl=60, lease=str(lease_id))
        other = pool.borrow(ttl=60)
    else:

        async def borrows() -> tuple[object, ...]:
            async with AsyncClient(url) as client:
                mine = client.pool(pool.id)
                return (
                    await mine.borrow(ttl=60, lease=lease_id),
                    await mine.borrow(ttl=60, lease=str(lease_id)),
                    await mine.borrow(ttl=60),
                )

        first, again, other = asyncio.run(borrows())  # type: ignore[assignment]
    assert first.id == again.id == lease_id, "the lease has the client's id"
    assert (again.position, again.fence) == (first.position, first.fence)
    assert again.expires_at == first.expires_at
    assert other.fence > first.fence, "fences grow with every grant"
    assert pool.inspect().in_use == 2, "no second slot for the same lease id"


def test_durations_are_keywords_and_checked(url: str) -> None:
    pool = new_pool(url, 1)
    with pytest.raises(TypeError):
        pool.borrow(60, 5)  # type: ignore[misc]
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttl"):
            pool.borrow(ttl=bad)
    with pytest.raises(ValueError, match="wait"):
        pool.borrow(ttl=1, wait=-0.5)
    with pytest.raises(TypeError, match="ttl"):
        pool.borrow(ttl="60")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease"):
        pool.borrow(ttl=1, lease="not-a-uuid")
    assert pool.inspect().in_use == 0
    start = time.monotonic()
    with pool.borrow(ttl=timedelta(milliseconds=1500)) as lease:
        assert lease.expires_in == 1.5
    assert time.monotonic() - start < 1.5


@TWINS
def test_a_release_that_failed_can_be_tried_again(
    url: str, twin: str, proxies: list[Proxy]
) -> None:
    pool = new_pool(url, 1)
    proxy = Proxy(url, "gateway")
    proxies.append(proxy)
    once = RetryPolicy(retries=0)

    def release_twice(lease: Lease) -> bool:
        proxy.fault = "always-502"
        with pytest.raises(ServiceUnavailable):
            lease.release()
        assert pool.inspect().in_use == 1, "the failed release did not reach the server"
        proxy.fault = "gateway"
        return lease.release()

    async def release_twice_async() -> bool:
        async with AsyncClient(proxy.url, retry=once) as client:
            lease = await client.pool(pool.id).borrow(ttl=60)
            proxy.fault = "always-502"
            with pytest.raises(ServiceUnavailable):
                await lease.release()
            assert pool.inspect().in_use == 1
            proxy.fault = "gateway"
            return await lease.release()

    if twin == "sync":
        with Client(proxy.url, retry=once) as client:
            live = release_twice(client.pool(pool.id).borrow(ttl=60))
    else:
        live = asyncio.run(release_twice_async())
    assert live is True, "the second try returned the live lease"
    assert pool.inspect().in_use == 0
