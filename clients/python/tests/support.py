"""A real local-api to test against, a fault-injecting HTTP proxy, and small helpers."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx
import pytest

from http_semaphore import AsyncClient, Client, Pool, RetryPolicy

ROOT = Path(__file__).resolve().parents[3]
#: Runs a test once per twin: Client and AsyncClient.
TWINS = pytest.mark.parametrize("twin", ["sync", "async"])


def local_api_binary() -> str:
    """tests/python-client passes the workspace's build; by hand, the debug build."""
    return os.environ.get("LOCAL_API") or str(ROOT / "target" / "debug" / "local-api")


class Server:
    """A running local-api on a free port, on ``store`` (``memory`` or ``dynamodb``, on
    $DYNAMODB_ENDPOINT, a table of its own: every local-api on a table delivers its async
    grants), with ``env`` (``MAX_WAIT_SECONDS``) and loopback callbacks allowed."""

    def __init__(self, store: str, env: dict[str, str] | None = None) -> None:
        command = [local_api_binary(), "--port", "0", "--allow-local-callbacks"]
        if store == "dynamodb":
            endpoint = os.environ.get("DYNAMODB_ENDPOINT")
            if not endpoint:
                raise RuntimeError("DYNAMODB_ENDPOINT is not set (tests/python-client sets it)")
            command += ["--dynamodb", endpoint, "--table", f"py-client-{uuid.uuid4().hex[:12]}"]
        self.process = subprocess.Popen(
            command,
            env={**os.environ, "RUST_LOG": "warn", **(env or {})},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        # It prints its address once it serves (after creating the table).
        line = self.process.stdout.readline()
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not found:
            self.stop()
            raise RuntimeError(f"no port in local-api's first line {line!r}")
        self.url = f"http://127.0.0.1:{found.group(1)}"
        # Its later lines go to the test's output, and its writes never meet a closed pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            print("local-api:", line, end="")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


T = TypeVar("T")


def on(
    twin: str,
    url: str,
    pool_id: uuid.UUID,
    action: Callable[[Pool], T],
    retry: RetryPolicy = RetryPolicy(),  # noqa: B008 (frozen)
) -> T:
    """``action`` on the pool through the sync twin, or through the asyncio twin (the same
    method names; what it answers is awaited)."""
    if twin == "sync":
        with Client(url, retry=retry) as client:
            return action(client.pool(pool_id))

    async def run() -> T:
        async with AsyncClient(url, retry=retry) as client:
            result: Any = action(client.pool(pool_id))  # type: ignore[arg-type]
            return await result if inspect.isawaitable(result) else result  # type: ignore[no-any-return]

    return asyncio.run(run())


def new_pool(url: str, count: int) -> Pool:
    """A new random pool with ``count`` slots, through a client that never retries."""
    pool = Client(url, retry=RetryPolicy(retries=0)).pool(uuid.uuid4())
    pool.register(count)
    return pool


def wait_until(what: str, condition: Callable[[], bool], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


class Proxy:
    """An HTTP proxy in front of ``upstream`` that injects ``fault``:

    - ``gateway``: passes everything through and, like API Gateway, finishes every call
      upstream even when its client hangs up, so local-api never learns that a waiting
      borrow's client went away (it would give the wait up by itself);
    - ``drop-first-borrow``: forwards the first borrow, then closes the connection without
      its answer (so the server took a slot the client never hears of);
    - ``502-first-borrow``: forwards the first borrow, answers the client 502;
    - ``always-502``: answers every request 502 without forwarding it;
    - ``html-404``: answers every request 404 with an HTML page, as another server would;
    - ``502-after-forwarding``: forwards every request, answers the client 502 (each
      request takes effect, and its client never learns it);
    - ``garbled``: forwards every request, answers it with a body that is not in the
      ``Content-Encoding`` it claims (gzip).

    ``fault`` can be changed while it runs. ``borrows`` keeps the body of every borrow that
    reached it."""

    def __init__(self, upstream: str, fault: str) -> None:
        self.upstream = upstream
        self.fault = fault
        self.borrows: list[bytes] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=60)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = handle_one

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        with self._lock:
            self.requests += 1
            first_borrow = False
            if handler.path.endswith("/borrow"):
                self.borrows.append(body)
                first_borrow = len(self.borrows) == 1
        if self.fault == "always-502":
            return self.respond(handler, 502, b'{"error":"injected by the test proxy"}')
        if self.fault == "html-404":
            page = b"<html><h1>Not Found</h1></html>"
            return self.respond(handler, 404, page, "text/html")
        try:
            answer = self._http.request(
                handler.command, self.upstream + handler.path, content=body or None
            )
            status, content = answer.status_code, answer.content
        except httpx.HTTPError:
            status, content = 502, b'{"error":"proxy: upstream"}'
        if first_borrow and self.fault == "drop-first-borrow":
            handler.close_connection = True
            return None
        if self.fault == "502-after-forwarding" or (
            first_borrow and self.fault == "502-first-borrow"
        ):
            return self.respond(handler, 502, b'{"error":"injected by the test proxy"}')
        if self.fault == "garbled":
            return self.respond(handler, status, b"not gzip", encoding="gzip")
        return self.respond(handler, status, content)

    @staticmethod
    def respond(
        handler: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        encoding: str | None = None,
    ) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            if encoding is not None:
                handler.send_header("Content-Encoding", encoding)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        except OSError:
            handler.close_connection = True  # the client hung up

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()


def borrow_leases(proxy: Proxy) -> Iterator[str]:
    """The lease UUID of each borrow that reached the proxy."""
    import json

    for body in proxy.borrows:
        yield json.loads(body)["lease"]
