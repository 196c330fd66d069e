"""The synchronous twin: :class:`Client`, :class:`Pool` and :class:`Lease`."""

from __future__ import annotations

import functools
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, Callable, TypeVar, cast

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
    refuse_awaitable,
    seconds,
    short,
    to_uuid,
)

log = logging.getLogger("http_semaphore")
F = TypeVar("F", bound=Callable[..., Any])


class Client:
    """A connection to one service: ``http://127.0.0.1:3000`` for local-api, the stack's
    ``ApiUrl`` when deployed (a path in it, a stage, is kept). Thread-safe; close it with
    :meth:`close` or use it as a context manager.

    ``retry`` says how connection errors, timeouts, ``429`` and ``502``-``504`` are
    retried; ``timeouts`` how long to wait for a connection and for an answer."""

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
        self._http = httpx.Client(headers={"content-type": "application/json"})

    def pool(self, pool_id: Id) -> Pool:
        """The pool with this id (a :class:`uuid.UUID` or its text). The id is the pool's
        credential: keep it secret."""
        return Pool(self, to_uuid(pool_id, "pool_id"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r}, retry={self.retry!r})"

    def _call(
        self,
        method: str,
        path: str,
        attempt: Callable[[], tuple[bytes | None, float]],
        *,
        retry: RetryPolicy | None = None,
        deadline: float | None = None,
    ) -> Answer:
        """Sends one request, retried per the policy. ``attempt`` builds each attempt's
        body and timeout afresh (a borrow's remaining wait shrinks between them)."""
        attempts = Attempts(retry or self.retry, self.url, self.timeouts.connect, deadline)
        url = self.url + path
        while True:
            body, wanted = attempt()
            outcome: httpx.Response | httpx.HTTPError
            try:
                outcome = self._http.request(
                    method, url, content=body, timeout=attempts.timeout(wanted)
                )
            except httpx.HTTPError as error:
                outcome = error
            settled = attempts.settle(outcome)
            if isinstance(settled, Answer):
                return settled
            time.sleep(settled)


class Pool:
    """One pool of the service, by its UUID."""

    def __init__(self, client: Client, pool_id: uuid.UUID) -> None:
        self.client = client
        self.id = pool_id

    def __repr__(self) -> str:
        return f"Pool(id={short(self.id)}…)"

    def _request(self, method: str, action: str = "", body: bytes | None = None) -> Answer:
        slack = self.client.timeouts.slack
        return self.client._call(method, f"l/{self.id}{action}", lambda: (body, slack))

    def register(self, count: int) -> PoolState:
        """``PUT /l/{id}``: creates the pool with ``count`` slots (0 to 1000), or changes
        its count, keeping live leases."""
        return PoolState.parse(self._request("PUT", "", json_body({"count": count})))

    def inspect(self) -> PoolState:
        """``GET /l/{id}``."""
        return PoolState.parse(self._request("GET"))

    def delete(self) -> bool:
        """``DELETE /l/{id}``: whether a pool was removed (after a retried request,
        ``False`` can also mean an earlier attempt removed it)."""
        answer = self._request("DELETE")
        return bool(field(answer, answer.success(), "deleted", bool))

    def release(self, lease: Id) -> bool:
        """``POST /l/{id}/return``: whether a live lease was ended. The UUID of a borrow
        that still waits (or of an async ticket) gives that wait up."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        answer = self._request("POST", "/return", body)
        return bool(field(answer, answer.success(), "returned", bool))

    def borrow(self, *, ttl: Duration, wait: Duration = 0, lease: Id | None = None) -> Lease:
        """Borrows a slot for ``ttl`` seconds, waiting up to ``wait`` seconds for one,
        however long the server's own maximum wait: it borrows again until the whole wait
        is spent, always with the same lease UUID (``lease``, or a random one), so that no
        retry or re-borrow ever holds two slots.

        The lease is a context manager that returns the slot on exit, exceptions
        included::

            with pool.borrow(ttl=60, wait=300) as lease:
                ...

        Raises :class:`NoSlot` when no slot freed up in time. An interrupt (Ctrl-C) or any
        other exception while waiting, and an outcome it cannot know
        (:class:`ServiceUnavailable`), gives the place in line up (or returns the slot
        granted meanwhile) before it propagates."""
        plan = BorrowPlan(
            seconds(ttl, "ttl", positive=True),
            seconds(wait, "wait"),
            None if lease is None else to_uuid(lease, "lease"),
            self.client.timeouts.slack,
        )
        try:
            while True:
                answer = self.client._call("POST", f"l/{self.id}/borrow", plan.attempt)
                received = time.monotonic()
                if answer.status != 409:
                    return Lease(self, answer, plan, received)
                pause = plan.after_409(received)
                if pause:
                    time.sleep(pause)
        except SETTLED:
            raise
        except BaseException:
            self._give_up(plan.lease)
            raise

    def _give_up(self, lease: uuid.UUID) -> None:
        """Returns ``lease`` (bounded in time): takes a waiting borrow out of the queue,
        or returns the slot granted to it. A failure is logged: the slot then frees
        itself at its ttl."""
        body = json_body({"lease": str(lease)})
        try:
            self.client._call(
                "POST",
                f"l/{self.id}/return",
                lambda: (body, GIVE_UP_DEADLINE),
                retry=GIVE_UP_RETRY,
                deadline=time.monotonic() + GIVE_UP_DEADLINE,
            )
        except Exception as error:  # best effort: the exception on its way goes on
            log.warning("pool %s…: could not give a borrow up: %r", short(self.id), error)

    def enqueue(
        self,
        *,
        ttl: Duration,
        callback_url: str,
        token: str,
        wait: Duration | None = None,
        lease: Id | None = None,
    ) -> Ticket:
        """``POST /l/{id}/enqueue`` (async mode): a place in the pool's line for up to
        ``wait`` seconds (the server's maximum, a day by default, if not given). When a
        slot is granted, the service POSTs the grant to ``callback_url`` with
        ``Authorization: Bearer <token>``; the lease then lives ``ttl`` from its grant.
        Retried with the same lease UUID, so a retry never queues a second ticket.

        An error whose outcome is unknown (:class:`ServiceUnavailable`, an interrupt...)
        carries that UUID as its ``lease`` attribute: the ticket may be queued. Pass
        ``lease=`` to know it beforehand."""
        lease_id, body = enqueue_body(ttl, callback_url, token, wait, lease)
        with naming_lease(lease_id):
            return Ticket.parse(self._request("POST", "/enqueue", body), lease_id)

    def ticket(self, lease: Id) -> TicketStatus:
        """``POST /l/{id}/ticket``: the state of the ticket of ``lease``."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        return TicketStatus.parse(self._request("POST", "/ticket", body))

    def cancel(self, lease: Id) -> TicketStatus:
        """``POST /l/{id}/cancel``: ends the ticket of ``lease`` if it still waits
        (idempotent); its state after. A ticket granted already keeps its grant."""
        body = json_body({"lease": str(to_uuid(lease, "lease"))})
        return TicketStatus.parse(self._request("POST", "/cancel", body))

    def limit(self, *, ttl: Duration, wait: Duration = 0) -> Callable[[F], F]:
        """A decorator: each call of the function runs holding a slot of this pool
        (borrowed with ``ttl`` and ``wait``, returned when the call ends, exceptions
        included). On a coroutine function, each call borrows through an
        :class:`AsyncClient` of its own with this client's settings."""
        seconds(ttl, "ttl", positive=True)
        seconds(wait, "wait")

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function):
                from ._async import AsyncClient

                @functools.wraps(function)
                async def limited_async(*args: Any, **kwargs: Any) -> Any:
                    client = self.client
                    twin = AsyncClient(client.url, retry=client.retry, timeouts=client.timeouts)
                    async with twin, twin.pool(self.id).borrow(ttl=ttl, wait=wait):
                        return await cast(Callable[..., Awaitable[Any]], function)(*args, **kwargs)

                return cast(F, limited_async)

            @functools.wraps(function)
            def limited(*args: Any, **kwargs: Any) -> Any:
                with self.borrow(ttl=ttl, wait=wait):
                    result = function(*args, **kwargs)
                    refuse_awaitable(function, result)
                    return result

            return cast(F, limited)

        return decorate


class Lease(LeaseBase):
    """A held slot: ``id`` (the lease UUID), ``position`` (the slot number), ``fence``
    (pass it to the protected resource), ``expires_at`` (UTC), and ``deadline`` (the end
    by :func:`time.monotonic`). A context manager that returns the slot on exit,
    exceptions included; or return it with :meth:`release`. A lease neither released nor
    used in a ``with`` block ends at its ttl."""

    def __init__(self, pool: Pool, answer: Answer, plan: BorrowPlan, received: float) -> None:
        super().__init__(answer, plan, received)
        self.pool = pool

    def release(self) -> bool:
        """Returns the slot now: ``True`` if the lease was still live, ``False`` if it had
        already ended (its ttl ran out) or was released before. A release that raised can
        be tried again."""
        if self.released:
            return False
        live = self.pool.release(self.id)
        # Only once answered: a release that failed can be tried again.
        self.released = True
        return live

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.released:
            return
        try:
            live = self.release()
        except Exception as failure:  # best effort: the block's exception goes on
            log.warning(
                "lease %s…: the return failed (it ends at its ttl): %r", short(self.id), failure
            )
            return
        if not live:
            log.warning(
                "lease %s…: it had ended before the block did (its ttl ran out)", short(self.id)
            )
