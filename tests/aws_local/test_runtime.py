"""The Runtime API emulator against a stand-in function (a Python script that speaks the
Runtime API), for what the real functions never do on purpose: run past their deadline,
crash, report an error. No stack needed."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from .model import FunctionError, JsonObject, Throttled
from .runtime import FunctionPool, Runtime, environment
from .template import Function

STAND_IN = """\
import json, os, sys, time, urllib.request

base = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    opener.open(request).read()


while True:
    answer = opener.open(base + "/invocation/next")
    rid = answer.headers["Lambda-Runtime-Aws-Request-Id"]
    event = json.loads(answer.read())
    if event.get("do") == "sleep":
        time.sleep(event["s"])
    if event.get("do") == "crash":
        os._exit(3)
    if event.get("do") == "error":
        post(f"/invocation/{rid}/error", {"errorMessage": "boom", "errorType": "Boom"})
        continue
    post(f"/invocation/{rid}/response", {
        "event": event,
        "pid": os.getpid(),
        "deadline_ms": int(answer.headers["Lambda-Runtime-Deadline-Ms"]),
        "arn": answer.headers["Lambda-Runtime-Invoked-Function-Arn"],
        "trace": answer.headers["Lambda-Runtime-Trace-Id"],
        "table": os.environ.get("TABLE_NAME"),
        "memory": os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"),
        "local": os.environ.get("ALLOW_LOCAL_CALLBACKS"),
    })
"""


def with_runtime(
    tmp_path: Path, body: Callable[[Runtime], Awaitable[None]], reserved: int | None = None
) -> FunctionPool:
    binary = tmp_path / "stand-in"
    binary.write_text(f"#!{sys.executable}\n" + STAND_IN)
    binary.chmod(0o755)
    function = Function(
        logical_id="StandIn",
        name="aws-local-StandIn-X",
        arn="arn:aws:lambda:us-east-1:000000000000:function:aws-local-StandIn-X",
        binary="stand-in",
        timeout_s=1,
        memory_mb=256,
        environment={"TABLE_NAME": "t"},
        statements=[],
        reserved_concurrency=reserved,
    )
    pools: list[FunctionPool] = []

    async def run() -> None:
        env = environment(function, proxy_url="http://127.0.0.1:9", allow_local_callbacks=True)
        pool = FunctionPool(function, binary=binary, env=env, log_file=tmp_path / "log", max_concurrency=4)
        pools.append(pool)
        runtime = Runtime({"StandIn": pool})
        try:
            await body(runtime)
        finally:
            await runtime.stop()

    asyncio.run(run())
    return pools[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")


def test_an_invocation_gets_the_template_s_deadline_and_environment(tmp_path: Path) -> None:
    got: list[JsonObject] = []

    async def body(runtime: Runtime) -> None:
        started_ms = time.time() * 1000
        got.append(await runtime.invoke("StandIn", {"hello": 1}))
        got.append({"started_ms": started_ms})

    with_runtime(tmp_path, body)
    answer, started = got[0], got[1]["started_ms"]
    assert answer["event"] == {"hello": 1}
    # The Timeout (1 s) from the moment the event is handed out, not 600000.
    assert started + 900 <= answer["deadline_ms"] <= started + 1000 + 1000
    assert answer["arn"].endswith(":function:aws-local-StandIn-X")
    assert answer["trace"].startswith("Root=1-")
    assert (answer["table"], answer["memory"], answer["local"]) == ("t", "256", "true")
    assert "REPORT RequestId:" in (tmp_path / "log").read_text()


def test_past_its_deadline_the_sandbox_is_killed(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def body(runtime: Runtime) -> None:
        first = await runtime.invoke("StandIn", {})
        with pytest.raises(FunctionError, match=r"Task timed out after 1\.00 seconds"):
            await runtime.invoke("StandIn", {"do": "sleep", "s": 5})
        await asyncio.sleep(0.2)
        seen["killed"] = not alive(first["pid"])
        seen["after"] = await runtime.invoke("StandIn", {})

    pool = with_runtime(tmp_path, body)
    assert seen["killed"]
    assert pool.counters.timeouts == 1 and pool.counters.cold_starts == 2


def test_a_crash_fails_the_invocation_and_the_next_starts_cold(tmp_path: Path) -> None:
    async def body(runtime: Runtime) -> None:
        with pytest.raises(FunctionError, match="Runtime exited"):
            await runtime.invoke("StandIn", {"do": "crash"})
        assert "event" in await runtime.invoke("StandIn", {})

    pool = with_runtime(tmp_path, body)
    assert pool.counters.crashes == 1 and pool.counters.cold_starts == 2


def test_an_error_report_keeps_the_sandbox(tmp_path: Path) -> None:
    async def body(runtime: Runtime) -> None:
        first = await runtime.invoke("StandIn", {})
        with pytest.raises(FunctionError) as raised:
            await runtime.invoke("StandIn", {"do": "error"})
        assert raised.value.payload == {"errorMessage": "boom", "errorType": "Boom"}
        assert (await runtime.invoke("StandIn", {}))["pid"] == first["pid"]

    pool = with_runtime(tmp_path, body)
    assert (pool.counters.errors, pool.counters.cold_starts, pool.counters.invocations) == (1, 1, 3)


def test_busy_sandboxes_make_cold_starts_and_idle_ones_are_reused(tmp_path: Path) -> None:
    async def body(runtime: Runtime) -> None:
        answers = await asyncio.gather(
            *(runtime.invoke("StandIn", {"do": "sleep", "s": 0.3}) for _ in range(3))
        )
        assert len({a["pid"] for a in answers}) == 3
        await asyncio.gather(*(runtime.invoke("StandIn", {}) for _ in range(2)))

    pool = with_runtime(tmp_path, body)
    assert (pool.counters.cold_starts, pool.counters.invocations, pool.counters.sandboxes) == (3, 5, 0)


def test_past_its_reserved_concurrency_an_invocation_is_throttled_at_once(tmp_path: Path) -> None:
    """ReservedConcurrentExecutions 1: while its one sandbox is busy, Lambda refuses another
    invocation at once (no wait, no second sandbox); once it is free, it runs again."""
    got: list[str] = []

    async def body(runtime: Runtime) -> None:
        busy = asyncio.ensure_future(runtime.invoke("StandIn", {"do": "sleep", "s": 0.5}))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        try:
            await runtime.invoke("StandIn", {"hello": 2})
            got.append("ran")
        except Throttled:
            got.append(f"throttled in {time.monotonic() - started:.2f} s")
        await busy
        got.append(str((await runtime.invoke("StandIn", {"hello": 3}))["event"]))

    pool = with_runtime(tmp_path, body, reserved=1)
    assert got[0].startswith("throttled in 0.0"), got
    assert got[1] == "{'hello': 3}", got
    assert (pool.counters.throttles, pool.counters.cold_starts) == (1, 1)
