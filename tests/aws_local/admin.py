"""The admin endpoint: what the stack did and what the tests arm, on its own loopback port.

GET  /calls[?function=ID]   every DynamoDB and SQS call per function, allowed or denied
GET  /denials               the denied ones only (a run should end with none)
GET  /faults                the faults still armed
POST /faults                arm one: {"function", "action", "kind", "count"[, "hold_s"]}
DELETE /faults              disarm all
GET  /stats                 invocations and cold starts per function, the front door's
                            answers per route, the event sources' counters, the queues'
                            depths (dead-lettered: the dead-letter queue's); an event
                            source that stopped polling says why in `failed`
POST /invoke/{LogicalId}    invoke a function with the body as its event; answers the
                            function's response, or its error with X-Amz-Function-Error
                            (as Lambda's Invoke API does)
GET  /stack                 the endpoints, table, queues, routes and run directory
PUT  /stream-delay          the stream source's delay before each batch from now on:
                            {"ms": N}; answers the one it replaced (--stream-delay-ms)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .faults import Faults
from .front import FrontDoor
from .iam import Recorder
from .model import FunctionError, JsonObject
from .runtime import Runtime

log = logging.getLogger("aws-local.admin")


def counters_of(source: Any) -> JsonObject:
    """An event source's counters, whatever shape its module gives them (a `stats()`
    method, or a `counters` dataclass or dict)."""
    stats = getattr(source, "stats", None)
    if callable(stats):
        value = stats()
        return dict(value) if isinstance(value, dict) else {"stats": value}
    counters = getattr(source, "counters", None)
    if dataclasses.is_dataclass(counters) and not isinstance(counters, type):
        return dataclasses.asdict(counters)
    if isinstance(counters, dict):
        return dict(counters)
    return {}


def _failure(task: asyncio.Task[None]) -> str | None:
    """Why an event source stopped polling (None while it runs)."""
    if not task.done() or task.cancelled():
        return None
    err = task.exception()
    return f"{type(err).__name__}: {err}" if err is not None else "stopped"


class Admin:
    def __init__(
        self,
        *,
        runtime: Runtime,
        front: FrontDoor,
        recorder: Recorder,
        faults: Faults,
        sources: list[Any],
        source_tasks: list[asyncio.Task[None]],
        queue_depths: Callable[[], Awaitable[JsonObject]],
        stack: JsonObject,
    ):
        self.runtime = runtime
        self.front = front
        self.recorder = recorder
        self.faults = faults
        self.sources = sources
        self.source_tasks = source_tasks
        self.queue_depths = queue_depths
        self.stack = stack

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/calls", self.calls)
        app.router.add_get("/denials", self.denials)
        app.router.add_get("/faults", self.list_faults)
        app.router.add_post("/faults", self.arm)
        app.router.add_delete("/faults", self.disarm)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/invoke/{function}", self.invoke)
        app.router.add_get("/stack", self.describe)
        app.router.add_put("/stream-delay", self.stream_delay)
        return app

    async def calls(self, request: web.Request) -> web.Response:
        wanted = request.query.get("function")
        listed = [c for c in self.recorder.listed() if wanted in (None, c["function"])]
        return web.json_response({"calls": listed})

    async def denials(self, request: web.Request) -> web.Response:
        return web.json_response({"denials": self.recorder.listed(denied_only=True)})

    async def list_faults(self, request: web.Request) -> web.Response:
        return web.json_response({"faults": self.faults.listed()})

    async def arm(self, request: web.Request) -> web.Response:
        try:
            spec = await request.json()
            fault = self.faults.arm(spec if isinstance(spec, dict) else {})
        except (ValueError, TypeError) as err:
            return web.json_response({"message": str(err)}, status=400)
        return web.json_response({"armed": dataclasses.asdict(fault)}, status=201)

    async def disarm(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return web.json_response({"faults": []})

    async def stats(self, request: web.Request) -> web.Response:
        sources = [
            {
                "kind": type(s).__name__,
                "function": getattr(getattr(s, "mapping", None), "function", None),
                **counters_of(s),
                "failed": _failure(task),
            }
            for s, task in zip(self.sources, self.source_tasks, strict=True)
        ]
        return web.json_response(
            {
                "functions": self.runtime.stats(),
                "front": dict(self.front.statuses),
                "sources": sources,
                "queues": await self.queue_depths(),
            }
        )

    async def invoke(self, request: web.Request) -> web.Response:
        function = request.match_info["function"]
        if function not in self.runtime.pools:
            return web.json_response({"message": f"no function {function}"}, status=404)
        event = await request.read()
        try:
            raw = await self.runtime.invoke_raw(function, event or b"{}")
        except FunctionError as err:
            payload = err.payload or {"errorMessage": str(err), "errorType": "Unhandled"}
            return web.Response(
                body=json.dumps(payload),
                content_type="application/json",
                headers={"X-Amz-Function-Error": "Unhandled"},
            )
        return web.Response(body=raw, content_type="application/json")

    async def stream_delay(self, request: web.Request) -> web.Response:
        try:
            spec = await request.json()
            ms = spec["ms"] if isinstance(spec, dict) else None
            if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
                raise ValueError("ms must be a whole number of milliseconds, 0 or more")
        except (ValueError, KeyError) as err:
            return web.json_response({"message": str(err)}, status=400)
        streams = [s for s in self.sources if type(s).__name__ == "StreamSource"]
        before = [round(s.delay_s * 1000) for s in streams]
        for source in streams:
            source.delay_s = ms / 1000
        return web.json_response({"ms": before[0] if before else None})

    async def describe(self, request: web.Request) -> web.Response:
        return web.json_response(self.stack)
