"""The stack the tests run against: one `tests/aws-local --allow-local-callbacks` per session,
on free ports, stopped (SIGTERM, as Ctrl-C would) when the session ends."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from aws_local import launch

# The event sources' servers: fixtures for the session, shared by their test modules.
from aws_local.event_source_testing import servers, sqs_endpoint  # noqa: F401
from aws_local.receiver import Receiver

T = TypeVar("T")

ROOT = launch.ROOT


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


def request(
    url: str,
    method: str = "GET",
    body: Any = None,
    raw: bytes | None = None,
    timeout: float = 40.0,
    headers: dict[str, str] | None = None,
) -> Answer:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as response:
            status, headers, payload = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        status, headers, payload = err.code, dict(err.headers), err.read()
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = payload.decode("utf-8", "replace")
    return Answer(status, {k.lower(): v for k, v in headers.items()}, parsed)


@dataclass
class Stack:
    front: str  # http://127.0.0.1:PORT (no trailing slash)
    admin: str
    _described: dict[str, Any] = field(default_factory=dict)

    def api(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        return request(self.front + path, method, body, **kw)

    def admin_get(self, path: str) -> Any:
        return request(self.admin + path).body

    def admin_post(self, path: str, body: Any) -> Answer:
        return request(self.admin + path, "POST", body)

    def described(self) -> dict[str, Any]:
        """GET /stack, read once."""
        if not self._described:
            self._described.update(self.admin_get("/stack"))
        return self._described

    def pool_item(self, pool: str) -> dict[str, Any]:
        """The pool's item as stored (read from DynamoDB Local itself, past the IAM proxy)."""
        info = self.described()
        client = boto3.client(
            "dynamodb",
            endpoint_url=info["dynamodb"],
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        got = client.get_item(
            TableName=info["tables"]["PoolTable"],
            Key={"pk": {"B": pool_key(pool)}, "sk": {"B": b"\x00"}},
            ConsistentRead=True,
        )
        item: dict[str, Any] = got.get("Item", {})
        return item

    def wake_messages(self, pool: str) -> list[dict[str, Any]]:
        """Every message sent to the wake queue for the pool, delayed or not, received or
        not (moto's own record of its messages: a delayed one cannot be received)."""
        data = request(self.described()["sqs"] + "/moto-api/data.json").body
        wanted = base64.b64encode(pool_key(pool)).decode()
        messages = []
        for message in data.get("sqs", {}).get("Message", []):
            try:
                body = json.loads(message["body"])
            except ValueError:
                continue
            if isinstance(body, dict) and body.get("pool") == wanted:
                messages.append({**message, "wake": body})
        return messages

    def log_of(self, function: str) -> str:
        return Path(self.described()["functions"][function]["log"]).read_text()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.admin_get("/stats")
        return stats

    def source(self, kind: str) -> dict[str, Any]:
        """One event source's counters from /stats: StreamSource or QueueSource."""
        return next(s for s in self.stats()["sources"] if s["kind"] == kind)


def pool_key(pool: str) -> bytes:
    """The table's key of a pool: the first 16 bytes of the SHA-256 of its UUID's bytes."""
    return hashlib.sha256(uuid.UUID(pool).bytes).digest()[:16]


def short(pool: str) -> str:
    """A pool as the functions' logs name it: its key's first 8 hex digits."""
    return pool_key(pool).hex()[:8]


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
    """`probe()` polled until it answers something truthy, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    started = time.monotonic()
    # One run directory for every session (logs/ is emptied at each start).
    with contextlib.ExitStack() as stop:
        try:
            front, admin = stop.enter_context(launch.running(ROOT / "target" / "aws-local" / "pytest"))
        except launch.NotReady as err:
            pytest.fail(str(err))
        print(f"\naws-local ready in {time.monotonic() - started:.1f} s")
        yield Stack(front, admin)


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    try:
        yield got
    finally:
        got.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: runs after every other test of the session")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The session's closing checks (no IAM denial) look back on every other test.
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)
