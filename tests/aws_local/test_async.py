"""Async mode end to end through the deployed shape: enqueue through the front door, the
table's stream (filtered as the template says) or the wake queue invokes the dispatcher,
which POSTs the grant to a receiver on this machine (the stack runs with
--allow-local-callbacks)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .conftest import Stack, eventually, request
from .receiver import Receiver

GRANT_FIELDS = {"ticket", "position", "fence", "expires_at_unix", "expires_in"}


def held_pool(stack: Stack, ttl: float) -> tuple[str, dict[str, Any]]:
    """A pool of one slot, and the borrow that holds it."""
    pool = str(uuid.uuid4())
    assert stack.api("PUT", f"/l/{pool}", {"count": 1}).status == 200
    held = stack.api("POST", f"/l/{pool}/borrow", {"ttl": ttl})
    assert held.status == 200, held.body
    return pool, held.body


def enqueue(
    stack: Stack, receiver: Receiver, pool: str, token: str, path: str | None = None, **fields: Any
) -> tuple[str, str]:
    """A ticket whose grant goes to its own path on the receiver: (its lease, that path)."""
    lease, path = str(uuid.uuid4()), path or f"/grant/{uuid.uuid4().hex}"
    body = {"ttl": 30, "wait": 600, "lease": lease, "callback": {"url": receiver.url(path), "token": token}}
    answer = stack.api("POST", f"/l/{pool}/enqueue", {**body, **fields})
    assert answer.status == 202, answer.body
    return lease, path


def ticket(stack: Stack, pool: str, lease: str) -> dict[str, Any]:
    answer = stack.api("POST", f"/l/{pool}/ticket", {"lease": lease})
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.body
    return body


def test_a_return_delivers_the_grant(stack: Stack, receiver: Receiver) -> None:
    # Through the return's own wake (or, were the ticket not yet admitted, the stream's).
    pool, held = held_pool(stack, ttl=60)
    lease, path = enqueue(stack, receiver, pool, "s3cr3t")
    assert ticket(stack, pool, lease) == {"state": "waiting", "ticket": 0, "ahead": 0}
    dispatcher = stack.stats()["functions"]["DispatcherFunction"]["invocations"]
    batches = stack.source("StreamSource")["batches_invoked"]

    returned = time.time()
    assert stack.api("POST", f"/l/{pool}/return", {"lease": held["lease"]}).body == {"returned": True}
    grant = receiver.wait(path)

    assert grant.headers["authorization"] == "Bearer s3cr3t"
    assert grant.headers["content-type"].startswith("application/json")
    assert set(grant.body) == GRANT_FIELDS
    assert grant.body["ticket"] == 0 and grant.body["position"] == 0
    assert grant.body["fence"] > held["fence"]
    assert 0 < grant.body["expires_in"] <= 30
    assert grant.body["expires_at_unix"] <= returned + 31
    # The dispatcher records the delivery once the receiver has answered.
    delivered = eventually(
        lambda: (t := ticket(stack, pool, lease))["state"] == "delivered" and t, "the ticket reads delivered"
    )
    assert {k: delivered[k] for k in ("ticket", "position", "fence", "expires_at_unix")} == {
        k: grant.body[k] for k in ("ticket", "position", "fence", "expires_at_unix")
    }
    assert stack.stats()["functions"]["DispatcherFunction"]["invocations"] > dispatcher
    # Issue #25: given cargo-lambda's deadline (600000, a timeout), every round "had no time"
    # and re-armed a wake at once instead of delivering. With its real deadline (120 s) it
    # delivers in the invocation that stepped: no timed wake of the pool was sent for now
    # (the wakes without a time are the return's, and the stream's hand-off).
    wakes = [m for m in stack.wake_messages(pool) if "at" in m["wake"]]
    assert wakes and all(m["wake"]["at"] > m["sent_timestamp"] for m in wakes), wakes
    # The stream still invokes the dispatcher for the same write: the backstop.
    eventually(lambda: stack.source("StreamSource")["batches_invoked"] > batches, "a stream batch")
    # The grant is a lease like a borrow's: returning it frees the slot.
    assert stack.api("POST", f"/l/{pool}/return", {"lease": lease}).body == {"returned": True}
    assert stack.api("GET", f"/l/{pool}").body["available"] == 1
    assert len(receiver.received(path)) == 1


def test_a_cancelled_ticket_is_never_granted(stack: Stack, receiver: Receiver) -> None:
    pool, held = held_pool(stack, ttl=60)
    cancelled, cancelled_path = enqueue(stack, receiver, pool, "first")
    answer = stack.api("POST", f"/l/{pool}/cancel", {"lease": cancelled})
    assert answer.status == 200 and answer.body["state"] == "cancelled", answer.body
    assert ticket(stack, pool, cancelled)["state"] == "cancelled"
    # Idempotent.
    assert stack.api("POST", f"/l/{pool}/cancel", {"lease": cancelled}).body["state"] == "cancelled"
    # A second ticket behind it: its grant shows the line moved past the cancelled one,
    # with no wait for a grant that must not come.
    second, second_path = enqueue(stack, receiver, pool, "second")
    stack.api("POST", f"/l/{pool}/return", {"lease": held["lease"]})
    grant = receiver.wait(second_path)
    assert grant.headers["authorization"] == "Bearer second"
    assert receiver.received(cancelled_path) == []
    assert ticket(stack, pool, cancelled)["state"] == "cancelled"
    assert grant.body["ticket"] == ticket(stack, pool, second)["ticket"] == 1
    assert stack.api("POST", f"/l/{pool}/cancel", {"lease": str(uuid.uuid4())}).status == 404


def test_a_lease_expiry_wakes_the_dispatcher_through_the_queue(stack: Stack, receiver: Receiver) -> None:
    # A lease that ends by expiry writes nothing to the table, so no stream record tells
    # of it: only the wake the dispatcher sent to the queue, delayed until then, can.
    ttl = 2.0
    borrowed = time.time()
    pool, held = held_pool(stack, ttl=ttl)
    queue = stack.source("QueueSource")
    lease, path = enqueue(stack, receiver, pool, "woken")

    grant = receiver.wait(path, timeout=ttl + 15)
    assert grant.at >= borrowed + ttl, "granted before the lease expired"
    assert grant.headers["authorization"] == "Bearer woken"
    assert grant.body["fence"] > held["fence"]
    # The wake: sent with its delay (whole seconds, rounded down: the dispatcher waits out
    # the rest, so the grant still comes after the expiry), then received from the queue
    # and handed to the dispatcher.
    wakes = stack.wake_messages(pool)
    assert wakes, "no wake was sent to the queue"
    assert any(m["delayed_until"] - m["sent_timestamp"] >= 1000 for m in wakes), wakes
    after = stack.source("QueueSource")
    assert after["messages_received"] > queue["messages_received"]
    assert after["batches_invoked"] > queue["batches_invoked"]
    eventually(lambda: ticket(stack, pool, lease)["state"] == "delivered", "the ticket reads delivered")
    # Deleted once the invocation that delivered ended well (its grant came before).
    eventually(
        lambda: stack.source("QueueSource")["messages_deleted"] > queue["messages_deleted"],
        "the wake deleted from the queue",
    )


# Far longer than a wake through the queue takes: a grant sooner than this came by none of
# the stream's batches.
SLOW_STREAM_MS = 5000


@contextlib.contextmanager
def stream_delay(stack: Stack, ms: int) -> Iterator[None]:
    """The stream source's delay before each batch set to `ms`, then set back."""
    answer = request(stack.admin + "/stream-delay", "PUT", {"ms": ms})
    assert answer.status == 200, answer.body
    try:
        yield
    finally:
        assert request(stack.admin + "/stream-delay", "PUT", {"ms": answer.body["ms"]}).status == 200


def admitted(stack: Stack, pool: str) -> bool:
    """The pool's tickets are all admitted to its queue (none left in the backlog)."""
    item = stack.pool_item(pool)
    return bool(item.get("y", {}).get("M")) and item.get("a") == item.get("n")


def test_a_returns_grant_reaches_the_receiver_before_it_answers(stack: Stack, receiver: Receiver) -> None:
    # Issue #26: the return that hands the slot on delivers the grant itself before it
    # answers, instead of leaving it to the wake queue (an SQS hop and an invocation) or
    # the table's stream (about 200 ms on AWS, and a shard's batches wait for each other).
    pool, held = held_pool(stack, ttl=60)
    lease, path = enqueue(stack, receiver, pool, "early")
    eventually(lambda: admitted(stack, pool), "the ticket admitted to the queue")
    # The admission's own stream records handled before the stream slows down.
    time.sleep(1.0)
    with stream_delay(stack, SLOW_STREAM_MS):
        # Batches that began their wait before it: invoked by now.
        time.sleep(0.5)
        batches = stack.source("StreamSource")["batches_invoked"]
        returning = time.time()
        assert stack.api("POST", f"/l/{pool}/return", {"lease": held["lease"]}).body == {"returned": True}
        answered = time.time()
        grant = receiver.wait(path, timeout=1)
        assert ticket(stack, pool, lease)["state"] == "delivered"
        assert stack.source("StreamSource")["batches_invoked"] == batches, "the stream invoked the dispatcher"
    assert grant.at <= answered
    assert grant.headers["authorization"] == "Bearer early"
    # Nothing left to the dispatcher: no wake sent. The ticket's writes were the return
    # function's, allowed by its role. (Other tests' returns came before it.)
    assert not [m for m in stack.wake_messages(pool) if "at" not in m["wake"]], stack.wake_messages(pool)
    calls = [c for c in stack.admin_get("/calls?function=ReturnFunction")["calls"] if c["at"] >= returning]
    assert not [c for c in calls if c["action"] == "sqs:SendMessage"], calls
    writes = [c for c in calls if c["action"] == "dynamodb:UpdateItem"]
    assert len(writes) >= 3 and all(c["allowed"] for c in writes), writes


def test_a_return_that_frees_a_slot_while_tickets_wait_unadmitted_wakes_the_dispatcher(
    stack: Stack, receiver: Receiver
) -> None:
    # Issue #26: a return that leaves its slot free while tickets wait in the backlog (not yet
    # admitted to the queue) wakes the dispatcher through the queue to admit them, rather
    # than leave the slot idle until the table's stream gets to it.
    pool, held = held_pool(stack, ttl=60)
    with stream_delay(stack, SLOW_STREAM_MS):
        time.sleep(0.5)
        lease, path = enqueue(stack, receiver, pool, "backlog")
        assert not admitted(stack, pool), "admitted before the return"
        returning = time.time()
        assert stack.api("POST", f"/l/{pool}/return", {"lease": held["lease"]}).body == {"returned": True}
        grant = receiver.wait(path, timeout=SLOW_STREAM_MS / 1000 - 1)
    assert grant.at - returning < 2.0
    assert grant.headers["authorization"] == "Bearer backlog"
    eventually(lambda: ticket(stack, pool, lease)["state"] == "delivered", "delivered")
    calls = [c for c in stack.admin_get("/calls?function=ReturnFunction")["calls"] if c["at"] >= returning]
    assert [c for c in calls if c["action"] == "sqs:SendMessage"], calls


def test_a_hanging_receiver_holds_up_no_other_pool(stack: Stack, receiver: Receiver) -> None:
    # Issue #26: a delivery to a receiver that never answers (retried, each attempt cut by
    # the dispatcher's 5-s timeout, while the lease lives) must not hold up other pools'.
    hanging_pool, hanging_held = held_pool(stack, ttl=60)
    fine_pool, fine_held = held_pool(stack, ttl=60)
    hang = f"/hang/{uuid.uuid4().hex}"
    stuck, _ = enqueue(stack, receiver, hanging_pool, "hangs", path=hang)
    _, fine = enqueue(stack, receiver, fine_pool, "fine")
    eventually(lambda: admitted(stack, hanging_pool) and admitted(stack, fine_pool), "both tickets admitted")
    try:
        stack.api("POST", f"/l/{hanging_pool}/return", {"lease": hanging_held["lease"]})
        receiver.wait(hang)  # its delivery under way, unanswered
        returned = time.time()
        stack.api("POST", f"/l/{fine_pool}/return", {"lease": fine_held["lease"]})
        grant = receiver.wait(fine, timeout=15)
        # While the other delivery still hangs, sooner than its first attempt's timeout.
        assert ticket(stack, hanging_pool, stuck)["state"] == "granted"
        assert grant.at - returned < 5.0
    finally:
        receiver.release(hang)
    eventually(
        lambda: ticket(stack, hanging_pool, stuck)["state"] == "delivered", "the released one, delivered"
    )
