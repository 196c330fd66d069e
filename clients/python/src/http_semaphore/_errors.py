"""What can go wrong, typed by what the caller should do about it."""

from __future__ import annotations

import uuid


class SemaphoreError(Exception):
    """The base of every error this package raises.

    ``status`` is the HTTP status of the answer it stands for (``None`` when
    there was no answer), ``body`` the start of that answer.

    ``lease`` is set on the error of an enqueue whose outcome is unknown (the answer was
    lost, or not readable): the lease UUID its ticket may hold, to ask for that ticket,
    cancel it, or enqueue again with it. ``None`` otherwise.
    """

    lease: uuid.UUID | None = None

    def __init__(self, message: str, *, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body


class NoSlot(SemaphoreError):
    """``409`` until the caller's whole wait was spent: no slot freed up.

    ``waited`` is the wait asked for, in seconds.
    """

    def __init__(self, waited: float) -> None:
        text = "no slot free" if waited == 0 else f"no slot freed up within {waited:g} s"
        super().__init__(text, status=409)
        self.waited = waited


class PoolNotFound(SemaphoreError):
    """``404 {"error": "pool not found"}``: no pool with this id (never registered, or
    deleted)."""

    def __init__(self) -> None:
        super().__init__("pool not found", status=404)


class TicketNotFound(SemaphoreError):
    """``404 {"error": "ticket not found"}``: the pool has no ticket of that lease UUID
    (async mode)."""

    def __init__(self) -> None:
        super().__init__("ticket not found", status=404)


class InvalidRequest(SemaphoreError):
    """``400`` (or ``413``): the server refused the request. ``message`` is its reason."""


class ServiceNotFound(SemaphoreError):
    """Any other ``404``: the base URL leads to no route of the service (a wrong path or
    stage), or to a server that is not this service."""


class ServiceUnavailable(SemaphoreError):
    """Every attempt failed with a connection error, a timeout or a retryable status
    (``429``, ``502``, ``503``, ``504``). ``attempts`` were made; ``last`` says what the last
    one met."""

    def __init__(self, attempts: int, last: str, *, status: int | None = None) -> None:
        plural = "" if attempts == 1 else "s"
        super().__init__(
            f"service unavailable after {attempts} attempt{plural}: {last}", status=status
        )
        self.attempts = attempts
        self.last = last


class ServerError(SemaphoreError):
    """``500``: the server found a stored pool it cannot read. A server bug; not retried,
    since retrying does not fix it."""


class UnexpectedResponse(SemaphoreError):
    """An answer the service's contract does not allow (a wrong URL, another service), or
    one that cannot be read (a body not in its ``Content-Encoding``)."""
