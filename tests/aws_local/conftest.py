"""The stack the tests run against: one `tests/aws-local --allow-local-callbacks` per session,
on free ports, stopped (SIGTERM, as Ctrl-C would) when the session ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The event sources' servers: fixtures for the session, shared by their test modules.
from aws_local.event_source_testing import servers, sqs_endpoint  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
# A clean clone builds the whole workspace first (minutes on 2 cores); after that, seconds.
START_TIMEOUT_S = float(os.environ.get("AWS_LOCAL_START_TIMEOUT", "1800"))


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


def request(
    url: str, method: str = "GET", body: Any = None, raw: bytes | None = None, timeout: float = 40.0
) -> Answer:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
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

    def api(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        return request(self.front + path, method, body, **kw)

    def admin_get(self, path: str) -> Any:
        return request(self.admin + path).body

    def admin_post(self, path: str, body: Any) -> Answer:
        return request(self.admin + path, "POST", body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    front, admin = _free_port(), _free_port()
    process = subprocess.Popen(
        [
            str(ROOT / "tests" / "aws-local"),
            "--port",
            str(front),
            "--admin-port",
            str(admin),
            "--allow-local-callbacks",
            # One run directory for every session (logs/ is emptied at each start).
            "--run-dir",
            str(ROOT / "target" / "aws-local" / "pytest"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("admin:"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    ready.wait(START_TIMEOUT_S)
    if not any(line.startswith("admin:") for line in lines):
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        pytest.fail(f"tests/aws-local did not get ready: {lines}")
    print(f"\naws-local ready in {time.monotonic() - started:.1f} s")
    try:
        yield Stack(f"http://127.0.0.1:{front}", f"http://127.0.0.1:{admin}")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: runs after every other test of the session")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The session's closing checks (no IAM denial) look back on every other test.
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)
