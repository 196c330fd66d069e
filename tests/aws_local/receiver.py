"""A callback receiver for async mode's grants: a threaded HTTP server on 127.0.0.1 that
records every POST (its path, headers and JSON body, and when it came) and answers 200.
The tests and bench.py give each ticket its own path, so that they can wait for its grant.
A path under /hang/ is recorded when it comes but answered only once released (a receiver
that hangs: each attempt times out on the dispatcher's side until then)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    at: float  # time.time() when it came
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any


class Receiver:
    def __init__(self) -> None:
        self._got: list[Received] = []
        self._changed = threading.Condition()
        self._released: set[str] = set()
        self._closed = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # the tests' output is not the place for an access log

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                received = Received(
                    time.time(), self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                if self.path.startswith("/hang/"):
                    with receiver._changed:
                        receiver._got.append(received)
                        receiver._changed.notify_all()
                        receiver._changed.wait_for(
                            lambda: self.path in receiver._released or receiver._closed
                        )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if not self.path.startswith("/hang/"):
                    with receiver._changed:
                        receiver._got.append(received)
                        receiver._changed.notify_all()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_port}{path}"

    def received(self, path: str | None = None) -> list[Received]:
        with self._changed:
            return [r for r in self._got if path in (None, r.path)]

    def wait(self, path: str, timeout: float = 15.0) -> Received:
        """The first request to `path`, waiting for it up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                got = [r for r in self._got if r.path == path]
                if got:
                    return got[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no request to {path} within {timeout} s")
                self._changed.wait(left)

    def release(self, path: str) -> None:
        """Answers the requests to a /hang/ path, those waiting and those to come."""
        with self._changed:
            self._released.add(path)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
