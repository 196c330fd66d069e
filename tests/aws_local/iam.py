"""The IAM proxy: one loopback port per function, in front of DynamoDB Local and moto's SQS.

Each function's AWS_ENDPOINT_URL_DYNAMODB and AWS_ENDPOINT_URL_SQS point at its own port, so
every call it makes is authorized against its own statements from the transformed template
before it is forwarded; a denied call gets AWS's AccessDeniedException answer. Every call is
recorded (function, action, resources, allowed, fault), never its keys or items. The same
proxy injects the faults armed in `Faults`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from . import calls, capacity, policy
from .faults import Faults
from .model import JsonObject
from .template import Function

log = logging.getLogger("aws-local.iam")

_HOP_BY_HOP = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
}


@dataclass(frozen=True)
class Call:
    function: str
    service: str
    action: str
    resources: list[str]
    allowed: bool
    fault: str | None
    status: int
    at: float
    # What DynamoDB bills for it (capacity.py): write and read units.
    wcu: float = 0.0
    rcu: float = 0.0
    unsized: bool = False


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    def add(self, call: Call) -> None:
        self.calls.append(call)
        if not call.allowed:
            log.warning("DENIED %s %s on %s", call.function, call.action, call.resources)

    def listed(self, denied_only: bool = False) -> list[JsonObject]:
        return [asdict(c) for c in self.calls if not (denied_only and c.allowed)]


class Proxy:
    """The proxies of all functions, with their shared recorder, faults and upstreams."""

    def __init__(
        self,
        *,
        dynamodb: str,
        sqs: str,
        keys: calls.KeyNames,
        faults: Faults,
        recorder: Recorder,
    ):
        self._upstream = {"dynamodb": dynamodb.rstrip("/"), "sqs": sqs.rstrip("/")}
        self._keys = keys
        self._faults = faults
        self._recorder = recorder
        self._runners: list[web.AppRunner] = []
        self._session: aiohttp.ClientSession | None = None
        self.urls: dict[str, str] = {}

    async def start(self, functions: list[Function]) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False)
        for function in functions:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handler(function))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            self.urls[function.logical_id] = f"http://127.0.0.1:{port}"
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _handler(self, function: Function):  # type: ignore[no-untyped-def]
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._one(function, request)

        return handle

    async def _one(self, function: Function, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        target = request.headers.get("X-Amz-Target", "")
        service, operation, checks = self._classify(target, body, request)
        if service is None:
            return web.json_response({"message": "aws-local: not a DynamoDB or SQS call"}, status=400)
        action = f"{service}:{operation}"
        ok = all(policy.allowed(function.statements, c) for c in checks)
        resources = sorted({c.resource for c in checks})
        if not ok:
            self._recorder.add(
                Call(function.logical_id, service, action, resources, False, None, 400, time.time())
            )
            return _denied(service, function, action, resources)
        fault = self._faults.take(function.logical_id, action)
        kind = fault.kind if fault else None
        billed = capacity.Billed()
        if fault is not None and fault.kind == "error":
            response = _failure(service)
        elif fault is not None and fault.kind == "timeout":
            await asyncio.sleep(fault.hold_s)
            response = _failure(service)
        else:
            response, billed = await self._forward(service, operation, request, body)
            if kind == "lost":
                response = _failure(service)
        self._recorder.add(
            Call(
                function.logical_id,
                service,
                action,
                resources,
                True,
                kind,
                response.status,
                time.time(),
                billed.wcu,
                billed.rcu,
                billed.unsized,
            )
        )
        return response

    def _classify(
        self, target: str, body: bytes, request: web.Request
    ) -> tuple[str | None, str, list[policy.Check]]:
        prefix, _, operation = target.partition(".")
        if prefix.startswith("DynamoDB_"):
            parsed = json.loads(body) if body else {}
            return "dynamodb", operation, calls.dynamodb_checks(operation, parsed, self._keys)
        if prefix == "AmazonSQS":
            parsed = json.loads(body) if body else {}
            return "sqs", operation, calls.sqs_checks(operation, parsed)
        # SQS's query protocol: a form with Action (the queue URL may be the path).
        form = dict(parse_qsl(body.decode("utf-8", "replace"))) if body else dict(request.query)
        if "Action" in form:
            path_url = str(request.url) if request.path.strip("/") else None
            return "sqs", form["Action"], calls.sqs_checks(form["Action"], form, path_url)
        return None, "", []

    async def _forward(
        self, service: str, operation: str, request: web.Request, body: bytes
    ) -> tuple[web.Response, capacity.Billed]:
        """The upstream's answer, and (for DynamoDB) what the call is billed. DynamoDB
        Local checks no signature, so the body may ask for the consumed capacity."""
        assert self._session is not None
        asked = True
        sent = body
        if service == "dynamodb":
            sent, asked = capacity.ask(operation, body)
        # A changed body no longer matches the hash the SDK signed (DynamoDB Local checks
        # no signature): the hash header goes with it.
        skip = _HOP_BY_HOP | ({"x-amz-content-sha256"} if sent != body else set())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        url = self._upstream[service] + request.rel_url.raw_path_qs
        try:
            async with self._session.request(request.method, url, data=sent, headers=headers) as upstream:
                payload = await upstream.read()
                out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
                billed = capacity.Billed()
                if service == "dynamodb":
                    billed, answer = capacity.bill(operation, upstream.status, payload, asked)
                    if answer != payload:
                        # Its CRC32 no longer holds (an SDK may check it).
                        out = {k: v for k, v in out.items() if k.lower() != "x-amz-crc32"}
                        payload = answer
                return web.Response(status=upstream.status, body=payload, headers=out), billed
        except (TimeoutError, aiohttp.ClientError) as err:
            log.warning("upstream %s failed: %s", service, err)
            return _failure(service), capacity.Billed()


def _json_error(status: int, kind: str, message: str, *, query_error: str | None = None) -> web.Response:
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    if query_error:
        # SQS's JSON protocol also names the query protocol's error code.
        headers["x-amzn-query-error"] = query_error
    return web.Response(
        status=status,
        body=json.dumps({"__type": kind, "message": message}),
        content_type="application/x-amz-json-1.0",
        headers=headers,
    )


def _denied(service: str, function: Function, action: str, resources: list[str]) -> web.Response:
    role = f"arn:aws:sts::000000000000:assumed-role/{function.logical_id}Role/{function.name}"
    message = (
        f"User: {role} is not authorized to perform: {action} on resource: "
        f"{', '.join(resources)} because no identity-based policy allows the {action} action"
    )
    kind = "com.amazon.coral.service#AccessDeniedException"
    if service == "sqs":
        return _json_error(403, kind, message, query_error="AccessDenied;Sender")
    return _json_error(400, kind, message)


def _failure(service: str) -> web.Response:
    if service == "sqs":
        return _json_error(
            500,
            "com.amazon.coral.service#InternalFailure",
            "aws-local: injected fault",
            query_error="InternalFailure;Receiver",
        )
    return _json_error(
        500, "com.amazonaws.dynamodb.v20120810#InternalServerError", "aws-local: injected fault"
    )
