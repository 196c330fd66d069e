"""Giving the place in line up: Ctrl-C on the sync twin, a cancelled task or a timeout on
the asyncio twin. Through a proxy that, like API Gateway, never tells local-api that its
client hung up, so only the client's own return can take the waiter out of the queue: the
pool's `waiting` falls back before the exception reaches the caller."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest
from support import Proxy, new_pool, wait_until

from http_semaphore import AsyncClient, Client


def test_ctrl_c_while_waiting_gives_the_place_up(url: str, proxies: list[Proxy]) -> None:
    pool = new_pool(url, 1)
    gateway = Proxy(url, "gateway")
    proxies.append(gateway)
    held = pool.borrow(ttl=60)
    main = threading.get_ident()

    def interrupt() -> None:
        wait_until("the borrower queues", lambda: pool.inspect().waiting == 1)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        Client(gateway.url).pool(pool.id).borrow(ttl=60, wait=60)
    assert pool.inspect().waiting == 0, "gave the place up before the interrupt propagated"
    assert held.release()
    assert pool.inspect().in_use == 0, "the interrupted borrower holds nothing"


async def cancelled_and_timed_out(url: str, gateway: str) -> None:
    pool = new_pool(url, 1)
    held = pool.borrow(ttl=60)
    async with AsyncClient(gateway) as client:
        mine = client.pool(pool.id)
        # A timeout.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(mine.borrow(ttl=60, wait=60), timeout=0.5)
        assert (await mine.inspect()).waiting == 0, "gave the place up before the timeout"

        # A task cancelled while it waits.
        async def work() -> None:
            async with mine.borrow(ttl=60, wait=60):
                raise AssertionError("no slot should come")

        task = asyncio.ensure_future(work())
        while (await mine.inspect()).waiting == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await mine.inspect()).waiting == 0, "gave the place up before the cancel"
    assert held.release()
    assert pool.inspect().in_use == 0, "the cancelled borrowers hold nothing"


def test_a_cancelled_task_or_a_timeout_gives_the_place_up(url: str, proxies: list[Proxy]) -> None:
    gateway = Proxy(url, "gateway")
    proxies.append(gateway)
    asyncio.run(cancelled_and_timed_out(url, gateway.url))
