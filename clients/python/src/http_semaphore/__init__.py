"""A client for http-semaphore, a distributed counting semaphore over HTTP.

::

    from http_semaphore import Client

    pool = Client("http://127.0.0.1:3000").pool(POOL_ID)
    with pool.borrow(ttl=60, wait=300) as lease:
        ...  # holds slot lease.position; pass lease.fence to the protected resource

:class:`Client` and :class:`AsyncClient` are twins: the same pools, leases, retries and
errors, blocking or asyncio. Every error is a :class:`SemaphoreError`.
"""

from __future__ import annotations

from . import receiver
from ._async import AsyncBorrow, AsyncClient, AsyncLease, AsyncPool
from ._core import Duration, Id, PoolState, RetryPolicy, Ticket, TicketStatus, Timeouts
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
from ._sync import Client, Lease, Pool

__all__ = [
    "AsyncBorrow",
    "AsyncClient",
    "AsyncLease",
    "AsyncPool",
    "Client",
    "Duration",
    "Id",
    "InvalidRequest",
    "Lease",
    "NoSlot",
    "Pool",
    "PoolNotFound",
    "PoolState",
    "RetryPolicy",
    "SemaphoreError",
    "ServerError",
    "ServiceNotFound",
    "ServiceUnavailable",
    "Ticket",
    "TicketNotFound",
    "TicketStatus",
    "Timeouts",
    "UnexpectedResponse",
    "receiver",
]
__version__ = "0.1.0"
