"""For receivers of async mode's callbacks: :func:`verify` checks a delivery's token and
parses its body into a :class:`Grant`.

A grant is POSTed with ``Authorization: Bearer <token>`` (the token given to
``pool.enqueue``). Delivery is at least once: at most one attempt per ticket is under way
at a time, but an attempt whose answer was lost or late is made again. So a receiver
answers a duplicate (a ``ticket`` and ``fence`` it has already taken) with ``2xx`` again
and does not take the slot twice; answering it ``4xx`` would end the ticket ``failed``
and return the lease. :func:`verify` only verifies and parses: it drops nothing, and
telling duplicates apart is the receiver's job.

The grant does not carry the lease UUID (a secret the enqueuer chose): keep the
:class:`~http_semaphore.Ticket`'s ``lease`` by its ``ticket`` number (or name the job in
the callback URL), and return the slot with ``pool.release(lease)`` when done.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ._core import utc
from ._errors import SemaphoreError

__all__ = ["Grant", "InvalidGrant", "ReceiverError", "Unauthorized", "verify"]


class ReceiverError(SemaphoreError):
    """A delivery :func:`verify` refuses. ``status`` is what to answer it: the service
    then ends the ticket ``failed`` and returns its lease."""

    status: int

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, status=status)


class Unauthorized(ReceiverError):
    """No ``Authorization: Bearer`` header, or another token: answer ``401``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 401)


class InvalidGrant(ReceiverError):
    """A body that is not a grant: answer ``400``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


@dataclass(frozen=True)
class Grant:
    """A slot granted to an async ticket: ``ticket`` (its number in the pool),
    ``position`` (the slot number), ``fence`` (the grant's fencing token, unique per
    grant: ``(ticket, fence)`` names a delivery, so a duplicate has the same pair),
    ``expires_at_unix`` and ``expires_in`` (as of the delivery attempt). ``extra`` holds the
    body's other fields, as sent (none today)."""

    ticket: int
    position: int
    fence: int
    expires_at_unix: int
    expires_in: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def expires_at(self) -> datetime:
        """When the lease ends, in UTC (whole seconds, rounded down)."""
        return utc(self.expires_at_unix)


@runtime_checkable
class Headers(Protocol):
    """Request headers as web frameworks give them (Flask, Django, Starlette, aiohttp,
    ``http.server``), or a plain ``dict``: anything with ``items()``. An iterable of
    ``(name, value)`` pairs does too."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def verify(headers: Headers | Iterable[tuple[str, str]], body: bytes | str, token: str) -> Grant:
    """Checks that the delivery carries ``Authorization: Bearer <token>`` (compared in
    constant time) and parses its body. Raises :class:`Unauthorized` (answer ``401``) or
    :class:`InvalidGrant` (answer ``400``)."""
    if not token:
        raise ValueError("verify needs the token given to enqueue, not an empty one")
    pairs = headers.items() if isinstance(headers, Headers) else headers
    values = [value for name, value in pairs if name.lower() == "authorization"]
    if len(values) != 1:
        raise Unauthorized("expected one Authorization header")
    scheme, _, presented = str(values[0]).strip().partition(" ")
    expected = token.encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
        raise Unauthorized("wrong token")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidGrant("the body is not JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidGrant("the body is not a JSON object")
    known = {}
    for name in ("ticket", "position", "fence", "expires_at_unix"):
        value = parsed.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidGrant(f"{name} is not a whole number")
        known[name] = value
    expires_in = parsed.get("expires_in")
    if (
        not isinstance(expires_in, (int, float))
        or isinstance(expires_in, bool)
        or not math.isfinite(expires_in)
    ):
        raise InvalidGrant("expires_in is not a number")
    extra = {name: value for name, value in parsed.items() if name not in known}
    del extra["expires_in"]
    return Grant(expires_in=float(expires_in), extra=extra, **known)
