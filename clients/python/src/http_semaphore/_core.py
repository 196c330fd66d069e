"""What the sync and asyncio twins share: durations and ids, the retry policy, building
requests and reading answers, the borrow's plan, and the typed bodies. No I/O here."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Union

import httpx

from ._errors import (
    InvalidRequest,
    NoSlot,
    PoolNotFound,
    SemaphoreError,
    ServerError,
    ServiceNotFound,
    ServiceUnavailable,
    TicketNotFound,
    UnexpectedResponse,
)

#: A duration: seconds (``int`` or ``float``) or a :class:`datetime.timedelta`.
Duration = Union[float, int, timedelta]
#: A UUID, as :class:`uuid.UUID` or as its text in any case.
Id = Union[uuid.UUID, str]

#: Longest ``wait`` asked of the server in one request. API Gateway ends every request at
#: 30 s, so a deployed server never blocks longer than this anyway.
LONGEST_ASK = 28.0
#: The statuses worth retrying: the service's ``502``, and what API Gateway answers by
#: itself under load or on a timed-out integration. Not ``500``.
RETRYABLE = frozenset({429, 502, 503, 504})
POOL_NOT_FOUND = "pool not found"
TICKET_NOT_FOUND = "ticket not found"
#: A return sent to give a borrow up (an interrupt, a cancelled task, an unknown
#: outcome) is retried this way, and given up after GIVE_UP_DEADLINE seconds in all: the
#: slot frees itself at its ttl anyway.
GIVE_UP_DEADLINE = 5.0


def seconds(value: Duration, name: str, *, positive: bool = False) -> float:
    """``value`` in seconds, checked: finite, ``> 0`` if ``positive``, else ``>= 0``."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise TypeError(f"{name} must be seconds (a number) or a timedelta, not {value!r}")
    if not math.isfinite(result) or result < 0 or (positive and result == 0):
        rule = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {rule}, not {value!r}")
    return result


def to_uuid(value: Id, name: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            raise ValueError(f"{name} is not a UUID") from None
    raise TypeError(f"{name} must be a uuid.UUID or a str, not {type(value).__name__}")


def short(value: uuid.UUID) -> str:
    """A UUID's first 8 hex digits: enough to tell ids apart in a log, useless to borrow
    with (the whole id is a credential)."""
    return value.hex[:8]


def wire_seconds(value: float) -> float:
    """Seconds as the server keeps them: to the millisecond."""
    return round(value, 3)


@dataclass(frozen=True)
class RetryPolicy:
    """How failed requests are retried: up to ``retries`` more attempts, sleeping ``base``
    seconds doubling per attempt up to ``cap``, each sleep jittered between half and all
    of it. Connection errors, timeouts, ``429`` and ``502``-``504`` are retried; nothing
    else. The default: 5 retries, 0.2 s doubling to 5 s (about 6 s of retrying in all)."""

    retries: int = 5
    base: float = 0.2
    cap: float = 5.0

    def __post_init__(self) -> None:
        if self.retries < 0 or not (0 <= self.base <= self.cap) or not math.isfinite(self.cap):
            raise ValueError(f"invalid {self!r}")

    def pause(self, step: int) -> float:
        """The pause after the ``step``-th failure (from 0), in seconds."""
        window = min(self.base * 2.0 ** min(step, 32), self.cap)
        return window / 2 + random.uniform(0, window / 2)


#: How a return that gives a borrow up is retried.
GIVE_UP_RETRY = RetryPolicy(retries=3, base=0.1, cap=1.0)
#: Pauses before borrowing again after a ``409`` that came much sooner than asked.
QUICK_409 = RetryPolicy(retries=0, base=0.1, cap=2.0)


@dataclass(frozen=True)
class Timeouts:
    """``connect``: seconds to open a connection. ``slack``: seconds allowed for an answer
    beyond the wait a request asks the server for (a borrow that waits 20 s has 20 s plus
    ``slack``)."""

    connect: float = 5.0
    slack: float = 10.0


def base_url(url: str) -> str:
    """The service's base URL, ending in ``/``: routes resolve under its path (a stage)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        hint = "" if "://" in str(url) else f" (did you mean http://{url}?)"
        raise ValueError(f"{url!r} is not an http:// or https:// URL{hint}")
    path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
    return str(parsed.copy_with(path=path, query=None, fragment=None))


def unlocated(error: httpx.HTTPError) -> str:
    """An httpx error in words, without its URL (the URL holds the pool's UUID)."""
    text = str(error) or type(error).__name__
    with contextlib.suppress(RuntimeError):  # an error made without its request
        text = text.replace(str(error.request.url), "<url>")
    return f"{type(error).__name__}: {text}"


def describe(error: httpx.TransportError) -> str:
    """A transport error in words, without its URL."""
    if isinstance(error, httpx.TimeoutException):
        return "timed out"
    text = unlocated(error)
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        text += " (the server does not speak TLS: if it is local-api, use http://)"
    return text


class Attempts:
    """The attempts of one call: each attempt's timeout, and what its response (or error)
    means: the answer to return, or the pause before the next attempt, or
    :class:`ServiceUnavailable` once the policy's retries (or the deadline) are spent."""

    def __init__(
        self, policy: RetryPolicy, base: str, connect: float, deadline: float | None = None
    ) -> None:
        self.policy = policy
        self.base = base
        self.connect = connect
        self.deadline = deadline
        self.made = 0

    def timeout(self, wanted: float) -> httpx.Timeout:
        """The next attempt's timeout, within the deadline if there is one."""
        self.made += 1
        if self.deadline is not None:
            wanted = max(0.001, min(wanted, self.deadline - time.monotonic()))
        return httpx.Timeout(wanted, connect=min(self.connect, wanted))

    def settle(self, outcome: httpx.Response | httpx.HTTPError) -> Answer | float:
        """The answer to return, or seconds to pause before the next attempt. An answer
        that cannot be read (a body not in its ``Content-Encoding``) is
        :class:`UnexpectedResponse`, not retried: the request may have taken effect."""
        if isinstance(outcome, httpx.TransportError):
            return self.failed(describe(outcome))
        if isinstance(outcome, httpx.HTTPError):
            raise UnexpectedResponse(f"an answer that cannot be read: {unlocated(outcome)}")
        answer = Answer(outcome.status_code, outcome.content, self.base)
        if answer.status not in RETRYABLE:
            return answer
        return self.failed(f"HTTP {answer.status}: {answer.message()}", answer.status)

    def failed(self, what: str, status: int | None = None) -> float:
        if self.made > self.policy.retries:
            raise ServiceUnavailable(self.made, what, status=status)
        pause = self.policy.pause(self.made - 1)
        if self.deadline is not None and time.monotonic() + pause >= self.deadline:
            raise ServiceUnavailable(self.made, what, status=status)
        return pause


class Answer:
    """A response: its status and body, and the service's ``error`` if the body is one."""

    def __init__(self, status: int, body: bytes, base: str) -> None:
        self.status = status
        self.body = body
        self.base = base
        self.error: str | None = None
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            self.error = parsed["error"]

    def start(self) -> str:
        """The start of the body, on one line (an HTML page stays readable)."""
        text = self.body[:200].decode("utf-8", "replace")
        return " ".join(text.split())

    def message(self) -> str:
        return self.error if self.error is not None else self.start()

    def to_error(self) -> SemaphoreError:
        """The error for a status that is not the route's success."""
        status, message, body = self.status, self.message(), self.start()
        if status in (400, 413):
            return InvalidRequest(message, status=status, body=body)
        if status == 404 and self.error == POOL_NOT_FOUND:
            return PoolNotFound()
        if status == 404 and self.error == TICKET_NOT_FOUND:
            return TicketNotFound()
        if status == 404:
            # Only the service's own answer means a missing pool: a route it does not know
            # answers "not found", and another server (a wrong URL) anything at all.
            return ServiceNotFound(
                f"{self.base} leads to no semaphore service (HTTP 404: {message})",
                status=status,
                body=body,
            )
        if status == 500:
            return ServerError(
                f"server error (a bug, not retried): {message}", status=status, body=body
            )
        return UnexpectedResponse(f"HTTP {status}: {message}", status=status, body=body)

    def success(self) -> dict[str, Any]:
        """A ``200`` (an enqueue's ``202``) body, or the error the answer stands for."""
        if self.status not in (200, 202):
            raise self.to_error()
        try:
            parsed = json.loads(self.body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise self.unexpected()
        return parsed

    def unexpected(self) -> UnexpectedResponse:
        return UnexpectedResponse(
            f"HTTP {self.status}: {self.start()}", status=self.status, body=self.start()
        )


def field(answer: Answer, body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    """``body[name]`` if it is a ``kind`` (an int is a float too; a bool is neither)."""
    value = body.get(name)
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise answer.unexpected()
    return value


def optional(answer: Answer, body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    return None if body.get(name) is None else field(answer, body, name, kind)


def utc(unix: int) -> datetime:
    return datetime.fromtimestamp(unix, tz=timezone.utc)


@dataclass(frozen=True)
class PoolState:
    """A pool as the service answers it: ``available`` is ``max(0, count - in_use)``;
    ``waiting`` counts the borrowers and async tickets in its queue."""

    id: uuid.UUID
    count: int
    in_use: int
    available: int
    waiting: int

    @staticmethod
    def parse(answer: Answer) -> PoolState:
        body = answer.success()
        try:
            pool_id = uuid.UUID(field(answer, body, "id", str))
        except ValueError:
            raise answer.unexpected() from None
        return PoolState(
            id=pool_id,
            count=field(answer, body, "count", int),
            in_use=field(answer, body, "in_use", int),
            available=field(answer, body, "available", int),
            waiting=body.get("waiting", 0) if isinstance(body.get("waiting"), int) else 0,
        )


@dataclass(frozen=True)
class Ticket:
    """A queued ticket (async mode): ``lease`` is the UUID its grant will carry (return it
    with ``pool.release(lease)`` when done), ``ticket`` its number in the pool (the grant
    POSTed to the callback names it), ``ahead`` how many tickets wait before it, at most."""

    lease: uuid.UUID
    ticket: int
    ahead: int

    def __repr__(self) -> str:
        return f"Ticket(lease={short(self.lease)}…, ticket={self.ticket}, ahead={self.ahead})"

    @staticmethod
    def parse(answer: Answer, lease: uuid.UUID) -> Ticket:
        queued = answer.success()
        return Ticket(
            lease=lease,
            ticket=field(answer, queued, "ticket", int),
            ahead=field(answer, queued, "ahead", int),
        )


@dataclass(frozen=True)
class TicketStatus:
    """A ticket's state: ``waiting``, ``granted`` (being delivered), then one end:
    ``delivered``, ``failed`` (``reason`` says why; its lease was returned), ``cancelled``
    or ``expired``. A granted or delivered ticket has ``position``, ``fence``,
    ``expires_at_unix`` and ``expires_in``; a waiting one ``ahead``."""

    state: str
    ticket: int
    ahead: int | None = None
    position: int | None = None
    fence: int | None = None
    expires_at_unix: int | None = None
    expires_in: float | None = None
    reason: str | None = None

    @property
    def expires_at(self) -> datetime | None:
        return None if self.expires_at_unix is None else utc(self.expires_at_unix)

    @staticmethod
    def parse(answer: Answer) -> TicketStatus:
        body = answer.success()
        return TicketStatus(
            state=field(answer, body, "state", str),
            ticket=field(answer, body, "ticket", int),
            ahead=optional(answer, body, "ahead", int),
            position=optional(answer, body, "position", int),
            fence=optional(answer, body, "fence", int),
            expires_at_unix=optional(answer, body, "expires_at_unix", int),
            expires_in=optional(answer, body, "expires_in", float),
            reason=optional(answer, body, "reason", str),
        )


def json_body(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def enqueue_body(
    ttl: Duration, callback_url: str, token: str, wait: Duration | None, lease: Id | None
) -> tuple[uuid.UUID, bytes]:
    """An enqueue's lease UUID (``lease``, or a random one) and its request body."""
    lease_id = uuid.uuid4() if lease is None else to_uuid(lease, "lease")
    body: dict[str, Any] = {
        "ttl": max(wire_seconds(seconds(ttl, "ttl", positive=True)), 0.001),
        "lease": str(lease_id),
        "callback": {"url": callback_url, "token": token},
    }
    if wait is not None:
        body["wait"] = wire_seconds(seconds(wait, "wait"))
    return lease_id, json_body(body)


#: The enqueue errors after which surely no ticket was queued.
ENQUEUE_SETTLED = (PoolNotFound, InvalidRequest, ServiceNotFound, ServerError)


@contextlib.contextmanager
def naming_lease(lease: uuid.UUID) -> Iterator[None]:
    """Puts ``lease`` on an enqueue's exception of unknown outcome (a lost answer, an
    interrupt, a cancelled task) as its ``lease`` attribute: the ticket it may have queued
    can then be asked for, cancelled, or enqueued again with it."""
    try:
        yield
    except ENQUEUE_SETTLED:
        raise
    except BaseException as error:
        # Every exception takes attributes; SemaphoreError declares this one.
        setattr(error, "lease", lease)  # noqa: B010
        raise


def refuse_awaitable(function: object, result: object) -> None:
    """The sync path of ``limit`` got an awaitable back (an object with an ``async
    __call__``, a plain function that returns a coroutine): the work would run after the
    slot was returned. It is closed (a coroutine), and the call refused."""
    if not inspect.isawaitable(result):
        return
    if inspect.iscoroutine(result):
        result.close()
    name = getattr(function, "__qualname__", None) or type(function).__name__
    raise TypeError(
        f"limit: {name} returned an awaitable, which would run after the slot was returned;"
        " decorate an `async def` instead (wrap the callable in one if need be)"
    )


class BorrowPlan:
    """One borrow call: its lease UUID (chosen once, sent with every attempt and
    re-borrow), its deadline, and what to do after each ``409``. The server blocks a
    borrow for at most its own maximum wait; the plan borrows again until the caller's
    whole wait is spent."""

    def __init__(self, ttl: float, wait: float, lease: uuid.UUID | None, slack: float):
        self.ttl = max(wire_seconds(ttl), 0.001)
        self.wait = wait
        self.lease = lease if lease is not None else uuid.uuid4()
        self.slack = slack
        self.started = time.monotonic()
        self.deadline = self.started + wait
        self.sent_at = self.started
        self.asked = 0.0
        self.quick_409s = 0

    def attempt(self) -> tuple[bytes, float]:
        """The next request's body and timeout: a retry asks only for what is left."""
        self.sent_at = time.monotonic()
        self.asked = wire_seconds(min(max(self.deadline - self.sent_at, 0.0), LONGEST_ASK))
        body = {"ttl": self.ttl, "wait": self.asked, "lease": str(self.lease)}
        return json_body(body), self.asked + self.slack

    def after_409(self, received: float) -> float:
        """Seconds to pause before borrowing again; :class:`NoSlot` once the wait is spent."""
        if received >= self.deadline:
            raise NoSlot(self.wait)
        # The server gave up well before the wait asked of it: it never blocks, or the
        # pool has as many waiters as it allows. Borrowing again at once would hammer it.
        if received - self.sent_at < min(self.asked, 1.0) / 2:
            pause = QUICK_409.pause(self.quick_409s)
            self.quick_409s += 1
            return max(0.0, min(pause, self.deadline - received))
        self.quick_409s = 0
        return 0.0


#: The errors after which a borrow surely holds nothing: no give-up is sent for them.
SETTLED = (NoSlot, PoolNotFound, InvalidRequest, ServiceNotFound, ServerError)


class LeaseBase:
    """A held slot, as the service granted it. The twins add ``release`` and the context
    manager."""

    def __init__(self, answer: Answer, plan: BorrowPlan, received: float) -> None:
        body = answer.success()
        try:
            self.id: uuid.UUID = uuid.UUID(field(answer, body, "lease", str))
        except ValueError:
            raise answer.unexpected() from None
        self.position: int = field(answer, body, "position", int)
        self.fence: int = field(answer, body, "fence", int)
        self.expires_at_unix: int = field(answer, body, "expires_at_unix", int)
        self.expires_in: float = field(answer, body, "expires_in", float)
        # When the lease ends by this process's monotonic clock: the answer's arrival plus
        # the time the server said was left.
        self.deadline: float = received + self.expires_in
        # The slot was granted after the borrow started, so the ttl granted is at most
        # what is left plus the time since: less than asked means the server clamped it.
        self.ttl_clamped: bool = self.expires_in + (received - plan.started) + 0.001 < plan.ttl
        self.released = False

    @property
    def expires_at(self) -> datetime:
        """When the lease ends (the server's ``expires_at_unix``, whole seconds rounded
        down), in UTC."""
        return utc(self.expires_at_unix)

    @property
    def time_left(self) -> float:
        """Seconds until the lease ends by this process's clock (``deadline`` minus now; a
        little late by the answer's time in transit). Never below 0."""
        return max(0.0, self.deadline - time.monotonic())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={short(self.id)}…, position={self.position}, "
            f"fence={self.fence}, expires_at={self.expires_at.isoformat()})"
        )
