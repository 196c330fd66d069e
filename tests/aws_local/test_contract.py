"""The API's contract through the front door, as a deployed stack answers it (docs/API.md)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from .conftest import Answer, Stack


def pool(stack: Stack, count: int) -> str:
    path = f"/l/{uuid.uuid4()}"
    answer = stack.api("PUT", path, {"count": count})
    assert answer.status == 200, answer
    return path


def test_register_and_inspect(stack: Stack) -> None:
    pid = str(uuid.uuid4())
    put = stack.api("PUT", f"/l/{pid.upper()}", {"count": 3})
    assert put.status == 200
    assert put.headers["content-type"].startswith("application/json")
    assert put.body == {"id": pid, "count": 3, "in_use": 0, "available": 3, "waiting": 0}
    assert "apigw-requestid" in put.headers
    got = stack.api("GET", f"/l/{pid}")
    assert got.status == 200 and got.body == put.body


def test_borrow_without_wait_and_return(stack: Stack) -> None:
    path = pool(stack, 2)
    first = stack.api("POST", path + "/borrow", {"ttl": 30})
    second = stack.api("POST", path + "/borrow", {"ttl": 30, "wait": 0})
    assert first.status == 200 and second.status == 200
    assert {first.body["position"], second.body["position"]} == {0, 1}
    assert set(first.body) == {"lease", "position", "expires_at_unix", "expires_in", "fence"}
    full = stack.api("POST", path + "/borrow", {"ttl": 30})
    assert full.status == 409 and full.body == {"error": "no resource available"}
    assert stack.api("GET", path).body["available"] == 0

    back = stack.api("POST", path + "/return", {"lease": first.body["lease"]})
    assert back.status == 200 and back.body == {"returned": True}
    again = stack.api("POST", path + "/return", {"lease": first.body["lease"]})
    assert again.status == 200 and again.body == {"returned": False}
    assert stack.api("GET", path).body["available"] == 1


def test_a_waiter_gets_the_slot_another_returns(stack: Stack) -> None:
    path = pool(stack, 1)
    held = stack.api("POST", path + "/borrow", {"ttl": 60})
    assert held.status == 200
    answers: list[Answer] = []
    waiter = threading.Thread(
        target=lambda: answers.append(stack.api("POST", path + "/borrow", {"ttl": 30, "wait": 15}))
    )
    waiter.start()
    # Until the waiter shows in the pool (its function may be starting cold).
    deadline = time.monotonic() + 10
    while stack.api("GET", path).body["waiting"] == 0:
        assert time.monotonic() < deadline, "the waiter never joined the queue"
        time.sleep(0.1)
    returned_at = time.monotonic()
    assert stack.api("POST", path + "/return", {"lease": held.body["lease"]}).body == {"returned": True}
    waiter.join(20)
    assert answers and answers[0].status == 200, answers
    assert answers[0].body["position"] == 0
    assert time.monotonic() - returned_at < 5


def test_expiry_frees_the_slot(stack: Stack) -> None:
    path = pool(stack, 1)
    assert stack.api("POST", path + "/borrow", {"ttl": 1}).status == 200
    assert stack.api("POST", path + "/borrow", {"ttl": 1}).status == 409
    waited = stack.api("POST", path + "/borrow", {"ttl": 5, "wait": 5})
    assert waited.status == 200, waited


def test_resize_lets_a_waiter_in_and_keeps_leases(stack: Stack) -> None:
    path = pool(stack, 1)
    assert stack.api("POST", path + "/borrow", {"ttl": 60}).status == 200
    answers: list[Answer] = []
    waiter = threading.Thread(
        target=lambda: answers.append(stack.api("POST", path + "/borrow", {"ttl": 30, "wait": 15}))
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while stack.api("GET", path).body["waiting"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    resized = stack.api("PUT", path, {"count": 3})
    assert resized.status == 200 and resized.body["count"] == 3
    waiter.join(20)
    assert answers and answers[0].status == 200, answers
    inspected = stack.api("GET", path).body
    assert (inspected["in_use"], inspected["available"]) == (2, 1)


def test_delete(stack: Stack) -> None:
    path = pool(stack, 1)
    assert stack.api("DELETE", path).body == {"deleted": True}
    assert stack.api("DELETE", path).body == {"deleted": False}
    gone = stack.api("GET", path)
    assert gone.status == 404 and "error" in gone.body


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("PUT", "/l/not-a-uuid", {"count": 1}, 400),
        ("PUT", "/l/{id}", {"count": -1}, 400),
        ("PUT", "/l/{id}", "not an object", 400),
        ("POST", "/l/{id}/borrow", {"ttl": 0}, 400),
        ("GET", "/l/{id}", None, 404),
        ("POST", "/l/{id}/return", {"lease": str(uuid.uuid4())}, 404),
        ("GET", "/nowhere", None, 404),
    ],
)
def test_error_bodies(stack: Stack, method: str, path: str, body: object, status: int) -> None:
    answer = stack.api(method, path.replace("{id}", str(uuid.uuid4())), body)
    assert answer.status == status, answer
    assert isinstance(answer.body, dict) and isinstance(answer.body.get("error"), str), answer


def test_malformed_json_is_400(stack: Stack) -> None:
    answer = stack.api("PUT", f"/l/{uuid.uuid4()}", raw=b"{not json")
    assert answer.status == 400 and "error" in answer.body


def test_wrong_method_is_405_with_allow(stack: Stack) -> None:
    # No route matches: the $default route's function answers.
    answer = stack.api("GET", f"/l/{uuid.uuid4()}/borrow")
    assert answer.status == 405 and "error" in answer.body
    assert answer.headers["allow"] == "POST"


def test_a_body_over_10_mb_is_413(stack: Stack) -> None:
    answer = stack.api("PUT", f"/l/{uuid.uuid4()}", raw=b" " * (10 * 1024 * 1024 + 1))
    assert answer.status == 413
    assert answer.body == {"message": "Request Entity Too Large"}
