"""An emulator of the documented Lambda Runtime API, running each function's real binary.

Each sandbox is one process with its own Runtime API listener (AWS_LAMBDA_RUNTIME_API), as
each Lambda execution environment has: it polls `/2018-06-01/runtime/invocation/next`, gets
one event with its request id and deadline (now + the template's Timeout, the real one:
cargo-lambda's `watch` sends 600000), and posts `/response` or `/error` (`/init/error` if
it cannot start). A sandbox runs one invocation at a time; when every sandbox of a function
is busy, another starts (a cold start), up to `max_concurrency` (the account's limit: past
it an invocation waits); a function with reserved concurrency (ReservedConcurrentExecutions)
has at most that many, and past it an invocation is refused at once (`Throttled`), as
Lambda refuses it. A sandbox whose process
exits, fails its init, or runs past its deadline is killed and its invocation fails with
`FunctionError`, as Lambda's would. Each function's output, with Lambda's START / END /
REPORT lines, is appended to `<log_dir>/<LogicalId>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from . import procs
from .model import FunctionError, JsonObject, Throttled
from .template import Function

log = logging.getLogger("aws-local.runtime")

PREFIX = "/2018-06-01/runtime"
# Lambda's init phase limit (a custom runtime's init gets 10 s).
INIT_TIMEOUT_S = 10.0
# Lambda's synchronous invocation response limit.
MAX_RESPONSE_BYTES = 6 * 1024 * 1024


@dataclass
class Counters:
    invocations: int = 0
    cold_starts: int = 0
    errors: int = 0  # /error answers
    timeouts: int = 0
    crashes: int = 0  # exits and init failures
    sandboxes: int = 0  # alive now
    throttles: int = 0  # refused: its reserved concurrency in use


class _Invocation:
    def __init__(self, event: bytes):
        loop = asyncio.get_running_loop()
        self.request_id = str(uuid.uuid4())
        self.event = event
        self.handed: asyncio.Future[None] = loop.create_future()
        self.result: asyncio.Future[bytes] = loop.create_future()
        self.deadline_ms = 0

    def fail(self, error: FunctionError) -> None:
        for future in (self.handed, self.result):
            if not future.done():
                future.set_exception(error)
        # Both futures may go unawaited (a crash before the handoff): mark them retrieved.
        for future in (self.handed, self.result):
            if future.done() and not future.cancelled():
                future.exception()


def _trace_id() -> str:
    return f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=0"


class _Sandbox:
    def __init__(self, pool: FunctionPool):
        self.pool = pool
        self.function = pool.function
        self.current: _Invocation | None = None
        self._slot: asyncio.Queue[_Invocation] = asyncio.Queue(maxsize=1)
        self.process: asyncio.subprocess.Process | None = None
        self._runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None
        # Set when the sandbox stops: a pending /next answers, so that no handler is
        # left for the listener's shutdown to cancel.
        self._closed = asyncio.Event()
        self.dead = False

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self, env: dict[str, str], binary: Path, log_file: Path) -> None:
        app = web.Application(client_max_size=MAX_RESPONSE_BYTES * 2)
        app.router.add_get(PREFIX + "/invocation/next", self._next)
        app.router.add_post(PREFIX + "/invocation/{id}/response", self._response)
        app.router.add_post(PREFIX + "/invocation/{id}/error", self._error)
        app.router.add_post(PREFIX + "/init/error", self._init_error)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        env = dict(env, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{port}")
        self.process = await procs.start([str(binary)], env=env, log=log_file, cwd=binary.parent)
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        assert self.process is not None
        code = await self.process.wait()
        if not self.dead:
            self.pool.counters.crashes += 1
            self._fail(f"Runtime exited with error: exit status {code}", "Runtime.ExitError")
        await self.stop()

    def _fail(self, message: str, kind: str) -> None:
        self.dead = True
        if self.current is not None:
            self.current.fail(
                FunctionError(self.function.logical_id, message, {"errorMessage": message, "errorType": kind})
            )

    async def kill(self) -> None:
        self.dead = True
        if self.process is not None:
            procs.kill_group(self.process.pid)

    async def stop(self) -> None:
        """Ends the process (SIGTERM, then SIGKILL) and the listener."""
        self.dead = True
        self.pool.forget(self)
        self._closed.set()
        if self.process is not None:
            await procs.stop(self.process, grace_s=0.5)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.shutdown()
            await runner.cleanup()

    # ---- one invocation ---------------------------------------------------------------------
    async def run(self, event: bytes, cold: bool) -> bytes:
        invocation = _Invocation(event)
        self.current = invocation
        started = time.monotonic()
        timeout_s = self.function.timeout_s
        self.pool.note(f"START RequestId: {invocation.request_id} Version: $LATEST")
        try:
            await self._slot.put(invocation)
            try:
                await asyncio.wait_for(asyncio.shield(invocation.handed), INIT_TIMEOUT_S if cold else 5.0)
            except TimeoutError:
                self.pool.counters.crashes += 1
                self._fail("init did not finish in time (no /next)", "Runtime.InitTimeout")
                await self.kill()
                raise FunctionError(self.function.logical_id, "init timed out") from None
            left = max(0.0, invocation.deadline_ms / 1000 - time.time())
            try:
                payload = await asyncio.wait_for(asyncio.shield(invocation.result), left)
            except TimeoutError:
                self.pool.counters.timeouts += 1
                message = f"Task timed out after {timeout_s:.2f} seconds"
                self._fail(message, "Sandbox.Timedout")
                self.pool.note(f"{invocation.request_id} {message}")
                await self.kill()
                raise FunctionError(self.function.logical_id, message) from None
            if len(payload) > MAX_RESPONSE_BYTES:
                raise FunctionError(
                    self.function.logical_id,
                    "Response payload size exceeded maximum allowed payload size (6291556 bytes).",
                )
            return payload
        finally:
            elapsed = (time.monotonic() - started) * 1000
            self.pool.note(f"END RequestId: {invocation.request_id}")
            self.pool.note(
                f"REPORT RequestId: {invocation.request_id}\tDuration: {elapsed:.2f} ms\t"
                f"Memory Size: {self.function.memory_mb} MB" + ("\t(cold start)" if cold else "")
            )
            self.current = None

    # ---- the Runtime API --------------------------------------------------------------------
    async def _next(self, request: web.Request) -> web.Response:
        getting = asyncio.ensure_future(self._slot.get())
        closing = asyncio.ensure_future(self._closed.wait())
        await asyncio.wait({getting, closing}, return_when=asyncio.FIRST_COMPLETED)
        closing.cancel()
        if not getting.done():
            getting.cancel()
            return _api_error(410, "SandboxStopped", "this sandbox is stopping")
        invocation = getting.result()
        invocation.deadline_ms = int(time.time() * 1000) + self.function.timeout_s * 1000
        if not invocation.handed.done():
            invocation.handed.set_result(None)
        return web.Response(
            body=invocation.event,
            content_type="application/json",
            headers={
                "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
                "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": self.function.arn,
                "Lambda-Runtime-Trace-Id": _trace_id(),
            },
        )

    def _by_id(self, request: web.Request) -> _Invocation | None:
        current = self.current
        if current is None or current.request_id != request.match_info["id"]:
            return None
        return current

    async def _response(self, request: web.Request) -> web.Response:
        invocation = self._by_id(request)
        if invocation is None:
            return _api_error(400, "InvalidRequestID", "unknown or finished request id")
        body = await request.read()
        if not invocation.result.done():
            invocation.result.set_result(body)
        return web.json_response({"status": "OK"}, status=202)

    async def _error(self, request: web.Request) -> web.Response:
        invocation = self._by_id(request)
        if invocation is None:
            return _api_error(400, "InvalidRequestID", "unknown or finished request id")
        payload = _json_or_text(await request.read())
        self.pool.counters.errors += 1
        message = str(payload.get("errorMessage", "")) or "error"
        if not invocation.result.done():
            invocation.result.set_exception(FunctionError(self.function.logical_id, message, payload))
        return web.json_response({"status": "OK"}, status=202)

    async def _init_error(self, request: web.Request) -> web.Response:
        payload = _json_or_text(await request.read())
        self.pool.counters.crashes += 1
        message = f"init failed: {payload.get('errorMessage', '')}"
        self.pool.note(message)
        self.dead = True
        if self.current is not None:
            self.current.fail(FunctionError(self.function.logical_id, message, payload))
        # Lambda ends an environment whose init failed.
        asyncio.get_running_loop().call_later(0.1, self._kill_soon)
        return web.json_response({"status": "OK"}, status=202)

    def _kill_soon(self) -> None:
        if self.process is not None:
            procs.kill_group(self.process.pid)


def _json_or_text(raw: bytes) -> JsonObject:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"errorMessage": raw.decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"errorMessage": str(value)}


def _api_error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"errorType": kind, "errorMessage": message}, status=status)


class FunctionPool:
    """The sandboxes of one function."""

    def __init__(
        self,
        function: Function,
        *,
        binary: Path,
        env: dict[str, str],
        log_file: Path,
        max_concurrency: int,
    ):
        self.function = function
        self.counters = Counters()
        self._binary = binary
        self._env = env
        self._log_path = log_file
        self._log: TextIO = log_file.open("a", buffering=1)
        self._max = max_concurrency
        self._reserved = function.reserved_concurrency
        self._idle: list[_Sandbox] = []
        self._all: set[_Sandbox] = set()
        self._freed = asyncio.Condition()

    def note(self, line: str) -> None:
        self._log.write(line + "\n")

    def forget(self, sandbox: _Sandbox) -> None:
        if sandbox in self._all:
            self._all.discard(sandbox)
            self.counters.sandboxes = len(self._all)
        if sandbox in self._idle:
            self._idle.remove(sandbox)

    async def _acquire(self) -> tuple[_Sandbox, bool]:
        async with self._freed:
            while True:
                while self._idle:
                    sandbox = self._idle.pop()
                    if not sandbox.dead:
                        return sandbox, False
                if self._reserved is not None and len(self._all) >= self._reserved:
                    self.counters.throttles += 1
                    raise Throttled(self.function.logical_id, "Rate Exceeded: reserved concurrency in use")
                if len(self._all) < self._max:
                    sandbox = _Sandbox(self)
                    self._all.add(sandbox)
                    self.counters.sandboxes = len(self._all)
                    self.counters.cold_starts += 1
                    break
                await self._freed.wait()
        try:
            await sandbox.start(self._env, self._binary, self._log_path)
        except BaseException:
            self.forget(sandbox)
            await sandbox.stop()
            raise
        return sandbox, True

    async def _release(self, sandbox: _Sandbox) -> None:
        async with self._freed:
            if not sandbox.dead:
                self._idle.append(sandbox)
            self._freed.notify()

    async def invoke(self, event: bytes) -> bytes:
        self.counters.invocations += 1
        sandbox, cold = await self._acquire()
        try:
            return await sandbox.run(event, cold)
        finally:
            if sandbox.dead:
                await sandbox.stop()
            await self._release(sandbox)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in list(self._all)), return_exceptions=True)
        with contextlib.suppress(OSError):
            self._log.close()


class Runtime:
    """Every function's pool; `invoke` is the harness's `model.Invoke`."""

    def __init__(self, pools: Mapping[str, FunctionPool]):
        self.pools = dict(pools)

    async def invoke_raw(self, function: str, event: bytes) -> bytes:
        pool = self.pools.get(function)
        if pool is None:
            raise FunctionError(function, "no such function in the template")
        return await pool.invoke(event)

    async def invoke(self, function: str, event: JsonObject) -> JsonObject:
        raw = await self.invoke_raw(function, json.dumps(event).encode())
        value: Any = json.loads(raw) if raw.strip() else None
        return value if isinstance(value, dict) else {"value": value}

    def stats(self) -> dict[str, JsonObject]:
        return {name: asdict(pool.counters) for name, pool in self.pools.items()}

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.pools.values()), return_exceptions=True)


def environment(
    function: Function,
    *,
    proxy_url: str,
    allow_local_callbacks: bool,
    extra: Callable[[Function], dict[str, str]] | None = None,
) -> dict[str, str]:
    """What Lambda sets for a function, the template's variables, and the harness's endpoints."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TZ": ":UTC",
        "_HANDLER": "bootstrap",
        "AWS_EXECUTION_ENV": "AWS_Lambda_provided.al2023",
        "AWS_LAMBDA_FUNCTION_NAME": function.name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_mb),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function.name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": f"aws-local/{uuid.uuid4().hex}",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Dummy credentials: DynamoDB Local and moto check no signature.
        "AWS_ACCESS_KEY_ID": "AKIAAWSLOCAL",
        "AWS_SECRET_ACCESS_KEY": "aws-local",
        "AWS_SESSION_TOKEN": "aws-local",
        "AWS_EC2_METADATA_DISABLED": "true",
        # Every DynamoDB and SQS call through this function's IAM proxy.
        "AWS_ENDPOINT_URL_DYNAMODB": proxy_url,
        "AWS_ENDPOINT_URL_SQS": proxy_url,
    }
    env.update(function.environment)
    if allow_local_callbacks:
        env["ALLOW_LOCAL_CALLBACKS"] = "true"
    if extra is not None:
        env.update(extra(function))
    return env
