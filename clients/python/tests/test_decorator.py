"""@pool.limit on a function and on a coroutine function, on both twins."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from support import new_pool

from http_semaphore import AsyncClient, NoSlot


class Boom(Exception):
    pass


def test_limit_on_functions_and_coroutine_functions(url: str) -> None:
    pool = new_pool(url, 1)

    @pool.limit(ttl=60, wait=5)
    def work(x: int) -> int:
        """Some work."""
        assert pool.inspect().in_use == 1, "runs holding a slot"
        if x < 0:
            raise Boom
        return x * 2

    @pool.limit(ttl=60)
    async def work_async(x: int) -> int:
        assert pool.inspect().in_use == 1
        await asyncio.sleep(0)
        return x + 1

    assert work(21) == 42
    assert (work.__name__, work.__doc__) == ("work", "Some work.")
    assert pool.inspect().in_use == 0, "returned after the call"
    with pytest.raises(Boom):
        work(-1)
    assert pool.inspect().in_use == 0, "returned when the call raised"
    assert asyncio.run(work_async(1)) == 2
    assert pool.inspect().in_use == 0

    @pool.limit(ttl=60, wait=0.2)
    def impatient() -> None:
        raise AssertionError("runs only with a slot")

    with pool.borrow(ttl=60), pytest.raises(NoSlot):
        impatient()


def test_the_async_twins_limit(url: str) -> None:
    pool = new_pool(url, 1)

    async def main() -> None:
        async with AsyncClient(url) as client:
            mine = client.pool(pool.id)

            @mine.limit(ttl=60, wait=5)
            async def work(x: int) -> int:
                assert (await mine.inspect()).in_use == 1, "runs holding a slot"
                if x < 0:
                    raise Boom
                return x * 2

            @mine.limit(ttl=60)
            def blocking(x: int) -> int:
                assert pool.inspect().in_use == 1
                return x + 1

            assert await work(21) == 42
            assert (await mine.inspect()).in_use == 0
            with pytest.raises(Boom):
                await work(-1)
            assert (await mine.inspect()).in_use == 0
            assert await asyncio.to_thread(blocking, 1) == 2
            assert (await mine.inspect()).in_use == 0
            # Two at once on a pool of one: one after the other.
            assert list(await asyncio.gather(work(1), work(2))) == [2, 4]

    asyncio.run(main())


class AsyncCallable:
    """An object with an ``async __call__``: not a coroutine function to ``inspect``."""

    def __init__(self) -> None:
        self.ran = False
        self.made: list[Coroutine[Any, Any, None]] = []

    async def work(self) -> None:
        self.ran = True

    async def __call__(self) -> None:
        await self.work()


def test_limit_refuses_an_awaitable_it_would_not_hold_the_slot_for(url: str) -> None:
    pool = new_pool(url, 1)
    callable_object = AsyncCallable()

    def wrapper() -> Coroutine[Any, Any, None]:
        """A plain function around an async def."""
        coroutine = callable_object.work()
        callable_object.made.append(coroutine)
        return coroutine

    async def on_the_async_twin() -> None:
        async with AsyncClient(url) as client:
            limited: Callable[[], object] = client.pool(pool.id).limit(ttl=60)(AsyncCallable())
            with pytest.raises(TypeError, match="async def"):
                await asyncio.to_thread(limited)

    for function in (callable_object, wrapper):
        limited: Callable[[], object] = pool.limit(ttl=60)(function)
        with pytest.raises(TypeError, match="returned an awaitable"):
            limited()
        assert pool.inspect().in_use == 0
    asyncio.run(on_the_async_twin())
    assert pool.inspect().in_use == 0
    assert not callable_object.ran, "the work never ran without its slot"
    assert inspect.getcoroutinestate(callable_object.made[0]) == inspect.CORO_CLOSED
