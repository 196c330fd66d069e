"""Best-effort returns never hide the exception on its way: a give-up that fails (here on
an httpx client closed meanwhile, a RuntimeError) is logged, and the interrupt or the
cancellation goes on; a return left to finish by itself logs its failure. Through httpx's
MockTransport: no server can make these failures."""

from __future__ import annotations

import asyncio
import logging
import uuid

import httpx
import pytest

from http_semaphore import AsyncClient, Client, RetryPolicy

LEASE = {"position": 0, "fence": 1, "expires_at_unix": 2000000000, "expires_in": 60}


def test_a_failing_give_up_does_not_replace_the_interrupt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client("http://semaphore.test")

    def borrow_interrupted(request: httpx.Request) -> httpx.Response:
        client._http.close()  # closed meanwhile: the give-up meets a RuntimeError
        raise KeyboardInterrupt

    client._http = httpx.Client(transport=httpx.MockTransport(borrow_interrupted))
    with caplog.at_level(logging.WARNING, "http_semaphore"), pytest.raises(KeyboardInterrupt):
        client.pool(uuid.uuid4()).borrow(ttl=60, wait=60)
    assert "could not give a borrow up: RuntimeError" in caplog.text


class Boom(Exception):
    pass


def test_a_failing_return_on_exit_does_not_replace_the_blocks_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client("http://semaphore.test")

    def lease(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"lease": str(uuid.uuid4()), **LEASE})

    client._http = httpx.Client(transport=httpx.MockTransport(lease))

    def fail() -> None:
        with client.pool(uuid.uuid4()).borrow(ttl=60):
            client.close()  # the return on exit meets a RuntimeError
            raise Boom

    with caplog.at_level(logging.WARNING, "http_semaphore"), pytest.raises(Boom):
        fail()
    assert "the return failed (it ends at its ttl): RuntimeError" in caplog.text


async def cancel_a_borrow_whose_client_closes() -> None:
    client = AsyncClient("http://semaphore.test")
    waiting = asyncio.Event()

    async def borrow_cancelled(request: httpx.Request) -> httpx.Response:
        await client._http.aclose()  # closed meanwhile: the give-up meets a RuntimeError
        waiting.set()
        await asyncio.sleep(60)
        raise AssertionError("cancelled before")

    client._http = httpx.AsyncClient(transport=httpx.MockTransport(borrow_cancelled))
    task = asyncio.ensure_future(client.pool(uuid.uuid4()).borrow(ttl=60, wait=60))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_failing_give_up_does_not_replace_the_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "http_semaphore"):
        asyncio.run(cancel_a_borrow_whose_client_closes())
    assert "could not give a borrow up: RuntimeError" in caplog.text


async def cancel_a_block_twice_while_its_return_fails(caplog: pytest.LogCaptureFixture) -> None:
    client = AsyncClient("http://semaphore.test", retry=RetryPolicy(retries=0))
    returning = asyncio.Event()

    async def slow_failing_return(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/borrow"):
            return httpx.Response(200, json={"lease": str(uuid.uuid4()), **LEASE})
        returning.set()
        await asyncio.sleep(0.1)
        return httpx.Response(500, json={"error": "injected"})

    client._http = httpx.AsyncClient(transport=httpx.MockTransport(slow_failing_return))
    holding = asyncio.Event()

    async def hold() -> None:
        async with client.pool(uuid.uuid4()).borrow(ttl=60):
            holding.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(hold())
    await holding.wait()
    task.cancel()
    await returning.wait()
    task.cancel()  # again: the return goes on by itself
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # the return fails 0.1 s after it was sent
        if "a return left to finish by itself failed" in caplog.text:
            break
        await asyncio.sleep(0.05)


def test_a_return_left_to_finish_by_itself_logs_its_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "http_semaphore"):
        asyncio.run(cancel_a_block_twice_while_its_return_fails(caplog))
    assert "a return left to finish by itself failed: ServerError" in caplog.text
