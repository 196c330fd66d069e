"""The asyncio twin: :class:`AsyncClient`, :class:`AsyncPool` and :class:`AsyncLease`.
Everything as in the synchronous twin; only the I/O differs."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Coroutine, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import httpx

from ._core import (
    GIVE_UP_DEADLINE,
    GIVE_UP_RETRY,
    SETTLED,
    Answer,
    Attempts,
    BorrowPlan,
    Duration,
    Id,
    LeaseBase,
    PoolState,
    RetryPolicy,
    Ticket,
    TicketStatus,
    Timeouts,
    base_url,
    enqueue_body,
    field,
    json_body,
    naming_lease,
    seconds,
    short,
    to_uuid,
)

if TYPE_CHECKING:
    from ._sync import Client

log = logging.getLogger("http_semaphore")
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# Returns still under way whose awaiting task was cancelled again: kept referenced until
# they end (the event loop holds only weak references to tasks).
_finishing: set[asyncio.Task[Any]] = set()


async def _finish(work: Coroutine[Any, Any, T]) -> T | None:
    """Runs ``work`` to its end even if the task awaiting it is cancelled (again) meanwhile:
    it then goes on by itself, and this returns ``None`` at once (a failure it meets then
    is logged: nobody awaits it any more)."""
    task = asyncio.ensure_future(work)
    _finishing.add(task)
    task.add_done_callback(_finishing.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_report_detached)
        return None


def _report_detached(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a return left to finish by itself failed: %r", task.exception())


class AsyncClient:
    """The asyncio twin of :class:`Client`: a connection to one service. Close it with
    :meth:`aclose` or use it as an async context manager."""

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 (frozen)
        timeouts: Timeouts = Timeouts(),  # noqa: B008 (frozen)
    ) -> None:
        self.url = base_url(url)
        self.retry = retry
        self.timeouts = timeouts
        self._http = httpx.AsyncClient(headers={"content-type": "application/json"})
        self._sync_twin: Client | None = None

    def pool(self, pool_id: Id) -> AsyncPool:
        """The pool with this id (a :class:`uuid.UUID` or its text). The id is the pool's
        credential: keep it secret."""
        return AsyncPool(self, to_uuid(pool_id, "pool_id"))

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._sync_twin is not None:
            self._sync_twin.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r}, retry={self.retry!r})"

    def sync_twin(self) -> Client:
        """A :class:`Client` with the same settings, closed with this one (for
        :meth:`AsyncPool.limit` on a plain function)."""
        if self._sync_twin is None:
            from ._sync import Client

            self._sync_twin = Client(self.url, retry=self.retry, timeouts=self.timeouts)
        return self._sync_twin

    async def _call(
        self,
        method: str,
        path: str,
        attempt: Callable[[], tuple[bytes | None, float]],
        *,
        retry: RetryPolicy | None = None,
        deadline: float | None = None,
    ) -> Answer:
        attempts = Attempts(retry or self.retry, self.url, self.timeouts.connect, deadline)
        url = self.url + path
        while True:
            body, wanted = attempt()
            outcome: httpx.Response | httpx.HTTPError
            try:
                outcome = await self._http.request(
                    method, url, content=body, timeout=attempts.timeout(wanted)
                )
            except httpx.HTTPError as error:
                outcome = error
            settled = attempts.settle(outcome)
            if isinstance(settled, Answer):
                return settled
            await asyncio.sleep(settled)


class AsyncPool:
    """The asyncio twin of :class:`Pool`."""

    def __init__(self, client: AsyncClient, pool_id: uuid.UUID) -> None:
        self.client = client
        self.id = pool_id

    def __repr__(self) -> str:
        return f"AsyncPool(id={short(self.id)}…)"

    async def _request(self, method: str, action: str = "", body: bytes | None = None) -> Answer:
        slack = self.client.timeouts.slack
        return await self.client._call(method, f"l/{self.id}{action}", lambda: (body, slack))

    async def register(self, count: int) -> PoolState:
        """``PUT /l/{id}``: creates the pool with ``count`` slots (0 to 1000), or changes
        its count, keeping live leases."""
        return PoolState.parse(await self._request("PUT", "", json_body({"count": count})))

    async def inspect(self) -> PoolState:
        """``GET /l/{id}``."""
        return PoolState.parse(await self._request("GET"))

    async def delete(self) -> bool:
        """``DELETE /l/{id}``: whether a pool was removed."""
        answer = await self._request("DELETE")
        return bool(field(answer, answer.success(), "deleted", bool))

    async def release(self, lease: Id) -> bool:
        """``POST /l/{id}/return``: whether a live lease was ended. The UUID of a borrow
        that still waits (or of an async ticket) gives that wait up."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        answer = await self._request("POST", "/return", body)
        return bool(field(answer, answer.success(), "returned", bool))

    def borrow(self, *, ttl: Duration, wait: Duration = 0, lease: Id | None = None) -> AsyncBorrow:
        """Borrows a slot, as :meth:`Pool.borrow` does: ``async with pool.borrow(ttl=60,
        wait=300) as lease:``, or ``lease = await pool.borrow(...)``. A cancelled task
        (``asyncio.timeout``, Ctrl-C under ``asyncio.run``) gives the place in line up
        before the cancellation propagates. Bound the wait with ``wait``, or with
        ``asyncio.timeout`` around ``async with``; not with ``asyncio.wait_for`` before
        Python 3.12, which can drop a lease granted as it times out (CPython gh-86296)."""
        plan = BorrowPlan(
            seconds(ttl, "ttl", positive=True),
            seconds(wait, "wait"),
            None if lease is None else to_uuid(lease, "lease"),
            self.client.timeouts.slack,
        )
        return AsyncBorrow(self, plan)

    async def _borrow(self, plan: BorrowPlan) -> AsyncLease:
        try:
            while True:
                answer = await self.client._call("POST", f"l/{self.id}/borrow", plan.attempt)
                received = time.monotonic()
                if answer.status != 409:
                    return AsyncLease(self, answer, plan, received)
                pause = plan.after_409(received)
                if pause:
                    await asyncio.sleep(pause)
        except SETTLED:
            raise
        except BaseException:
            await _finish(self._give_up(plan.lease))
            raise

    async def _give_up(self, lease: uuid.UUID) -> None:
        body = json_body({"lease": str(lease)})
        try:
            await self.client._call(
                "POST",
                f"l/{self.id}/return",
                lambda: (body, GIVE_UP_DEADLINE),
                retry=GIVE_UP_RETRY,
                deadline=time.monotonic() + GIVE_UP_DEADLINE,
            )
        except Exception as error:  # best effort: the exception on its way goes on
            log.warning("pool %s…: could not give a borrow up: %r", short(self.id), error)

    async def enqueue(
        self,
        *,
        ttl: Duration,
        callback_url: str,
        token: str,
        wait: Duration | None = None,
        lease: Id | None = None,
    ) -> Ticket:
        """``POST /l/{id}/enqueue`` (async mode), as :meth:`Pool.enqueue` (an error of
        unknown outcome, a cancelled task included, carries the lease UUID as ``lease``)."""
        lease_id, body = enqueue_body(ttl, callback_url, token, wait, lease)
        with naming_lease(lease_id):
            return Ticket.parse(await self._request("POST", "/enqueue", body), lease_id)

    async def ticket(self, lease: Id) -> TicketStatus:
        """``POST /l/{id}/ticket``: the state of the ticket of ``lease``."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        return TicketStatus.parse(await self._request("POST", "/ticket", body))

    async def cancel(self, lease: Id) -> TicketStatus:
        """``POST /l/{id}/cancel``: ends the ticket of ``lease`` if it still waits."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        return TicketStatus.parse(await self._request("POST", "/cancel", body))

    def limit(self, *, ttl: Duration, wait: Duration = 0) -> Callable[[F], F]:
        """A decorator: each call of the coroutine function runs holding a slot of this
        pool, as :meth:`Pool.limit`. On a plain function, each call borrows through a
        :class:`Client` with this client's settings (blocking, as the function does)."""
        seconds(ttl, "ttl", positive=True)
        seconds(wait, "wait")

        def decorate(function: F) -> F:
            if not inspect.iscoroutinefunction(function):
                pool = self.client.sync_twin().pool(self.id)
                return pool.limit(ttl=ttl, wait=wait)(function)

            @functools.wraps(function)
            async def limited(*args: Any, **kwargs: Any) -> Any:
                async with self.borrow(ttl=ttl, wait=wait):
                    return await cast(Callable[..., Awaitable[Any]], function)(*args, **kwargs)

            return cast(F, limited)

        return decorate


class AsyncBorrow:
    """A borrow not made yet: ``await`` it for the lease, or use it as an async context
    manager that returns the lease on exit. Once only."""

    def __init__(self, pool: AsyncPool, plan: BorrowPlan) -> None:
        self._pool = pool
        self._plan = plan
        self._started = False
        self._lease: AsyncLease | None = None

    def _borrow(self) -> Coroutine[Any, Any, AsyncLease]:
        if self._started:
            raise RuntimeError("this borrow was made already: call pool.borrow() again")
        self._started = True
        return self._pool._borrow(self._plan)

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._borrow().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._borrow()
        return self._lease

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(kind, error, traceback)


class AsyncLease(LeaseBase):
    """The asyncio twin of :class:`Lease`."""

    def __init__(self, pool: AsyncPool, answer: Answer, plan: BorrowPlan, received: float) -> None:
        super().__init__(answer, plan, received)
        self.pool = pool

    async def release(self) -> bool:
        """Returns the slot now: ``True`` if the lease was still live, ``False`` if it had
        already ended (its ttl ran out) or was released before. A release that raised can
        be tried again."""
        if self.released:
            return False
        live = await self.pool.release(self.id)
        # Only once answered: a release that failed can be tried again.
        self.released = True
        return live

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.released:
            return
        try:
            # A cancelled block still returns the lease, and waits for it unless
            # cancelled again.
            live = await _finish(self.release())
        except Exception as failure:  # best effort: the block's exception goes on
            log.warning(
                "lease %s…: the return failed (it ends at its ttl): %r", short(self.id), failure
            )
            return
        if live is False:
            log.warning(
                "lease %s…: it had ended before the block did (its ttl ran out)", short(self.id)
            )
