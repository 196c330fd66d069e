"""A flood of waiting borrows on a stack of its own, with a small waiting budget and small
reserved concurrencies (template parameters, as `sam deploy --parameter-overrides` sets
them): past the budget a borrow that would wait gets a fast JSON 429, Lambda never has to
throttle, and return, register and the dispatcher keep answering as before the flood."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from . import launch
from .conftest import ROOT, Stack
from .receiver import Receiver
from .test_async import enqueue

BUDGET = 4
# The budget and room for the quick answers: a refused borrow holds its execution for
# tens of ms, so arrivals a tenth of a second apart need one or two more.
RESERVED = BUDGET + 4
POOLS = 4
WAITERS = 16  # four times the budget, on POOLS pools
ARRIVALS_S = 0.1  # between two of them
WAIT_S = 6


@pytest.fixture(scope="module")
def guarded() -> Iterator[Stack]:
    overrides = [f"WaitingBudget={BUDGET}", f"BorrowConcurrency={RESERVED}", "DispatcherConcurrency=4"]
    with contextlib.ExitStack() as stop:
        front, admin = stop.enter_context(
            launch.running(
                ROOT / "target" / "aws-local" / "guard",
                "--max-concurrency",
                "32",
                "--parameter-overrides",
                *overrides,
            )
        )
        yield Stack(front, admin)


def timed(stack: Stack, method: str, path: str, body: Any = None) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = stack.api(method, path, body)
    return time.perf_counter() - started, answer


def p99_ms(samples: list[float]) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def others(stack: Stack, rounds: int) -> dict[str, list[float]]:
    """Register, then a borrow and a return of a free slot, on pools of their own."""
    took: dict[str, list[float]] = {"register": [], "return": []}
    for _ in range(rounds):
        pool = str(uuid.uuid4())
        t, answer = timed(stack, "PUT", f"/l/{pool}", {"count": 2})
        assert answer.status == 200, answer.body
        took["register"].append(t)
        held = stack.api("POST", f"/l/{pool}/borrow", {"ttl": 30})
        assert held.status == 200, held.body
        t, answer = timed(stack, "POST", f"/l/{pool}/return", {"lease": held.body["lease"]})
        assert answer.status == 200, answer.body
        took["return"].append(t)
    return took


def callback_once(stack: Stack, receiver: Receiver) -> float:
    """Return → callback of one async ticket on a pool of its own, in seconds."""
    pool = str(uuid.uuid4())
    assert stack.api("PUT", f"/l/{pool}", {"count": 1}).status == 200
    held = stack.api("POST", f"/l/{pool}/borrow", {"ttl": 30}).body
    _, path = enqueue(stack, receiver, pool, "guard")
    time.sleep(0.5)  # the enqueue's own stream record handled first
    returned = time.time()
    assert stack.api("POST", f"/l/{pool}/return", {"lease": held["lease"]}).status == 200
    return receiver.wait(path, timeout=10).at - returned


def test_a_flood_of_waits_gets_429_and_leaves_the_rest_answering(guarded: Stack, receiver: Receiver) -> None:
    stack = guarded
    others(stack, 5)  # warm: every function's first sandbox started
    for _ in range(2):
        callback_once(stack, receiver)
    before = others(stack, 20)
    delivered_before = [callback_once(stack, receiver) for _ in range(3)]
    full = []
    for _ in range(POOLS):
        pool = str(uuid.uuid4())
        assert stack.api("PUT", f"/l/{pool}", {"count": 1}).status == 200
        assert stack.api("POST", f"/l/{pool}/borrow", {"ttl": 60}).status == 200
        full.append(pool)
    answers: list[tuple[float, Any]] = []
    lock = threading.Lock()

    def wait_on(pool: str) -> None:
        got = timed(stack, "POST", f"/l/{pool}/borrow", {"ttl": 30, "wait": WAIT_S})
        with lock:
            answers.append(got)

    flood = [threading.Thread(target=wait_on, args=(full[n % POOLS],)) for n in range(WAITERS)]
    for thread in flood:
        thread.start()
        time.sleep(ARRIVALS_S)
    # During the flood: the other routes, and a grant delivered by the dispatcher.
    during = others(stack, 20)
    delivered = [callback_once(stack, receiver) for _ in range(3)]
    for thread in flood:
        thread.join()

    statuses = sorted(a.status for _, a in answers)
    refused = [(t, a) for t, a in answers if a.status == 429]
    waited = [a for _, a in answers if a.status == 409]
    assert len(waited) <= BUDGET, statuses
    assert len(refused) >= WAITERS - BUDGET, statuses
    assert all(a.status in (409, 429) for _, a in answers), statuses  # never Lambda's 500
    for t, a in refused:
        assert "WAITING_BUDGET" in a.body["error"], a.body
        assert t < 1.0, f"a 429 after {t:.2f} s"
    functions = stack.stats()["functions"]
    assert functions["BorrowFunction"]["throttles"] == 0, functions["BorrowFunction"]
    assert functions["BorrowFunction"]["sandboxes"] <= RESERVED
    for route in ("register", "return"):
        usual, flooded = p99_ms(before[route]), p99_ms(during[route])
        print(f"{route}: p99 {usual:.0f} ms before, {flooded:.0f} ms during the flood")
        assert flooded <= max(2 * usual, usual + 100), (route, before[route], during[route])
    usual, flooded = statistics.median(delivered_before), statistics.median(delivered)
    print(f"return → callback: median {usual * 1000:.0f} ms before, {flooded * 1000:.0f} ms during the flood")
    assert flooded <= usual + 0.15, (delivered_before, delivered)
    median = statistics.median(t for t, _ in refused) * 1000
    print(f"flood: {len(refused)} answered 429 (median {median:.0f} ms)")
