"""The front door: an API Gateway HTTP API over the template's routes, payload format 2.0.

Each request is matched against the HttpApi's routes (a literal segment beats `{param}`, a
method beats ANY, `$default` catches the rest), turned into the documented version 2.0
event, and answered by the function's response per the 2.0 rules. The HTTP API's own
limits and answers are mirrored: a body over 10 MB is 413, an integration past 30 s is 503,
a function error 500, a route with IAM authorization and no valid signature 403 (sigv4.py),
each with API Gateway's `{"message": ...}` body. Logs name the route
key, never the path: a pool's id in the path is its credential.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from . import sigv4
from .model import FunctionError, JsonObject
from .runtime import Runtime
from .template import Route

log = logging.getLogger("aws-local.front")

MAX_BODY_BYTES = 10 * 1024 * 1024
INTEGRATION_TIMEOUT_S = 30.0
API_ID = "awslocal01"

_TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/javascript",
    "application/x-www-form-urlencoded",
)


@dataclass(frozen=True)
class Match:
    route: Route
    parameters: dict[str, str]


def match(routes: list[Route], method: str, raw_path: str) -> Match | None:
    """The route API Gateway picks for `method` and the (still encoded) `raw_path`."""
    segments = raw_path.split("/")
    best: tuple[tuple[int, int], Match] | None = None
    default = None
    for route in routes:
        if route.path == "$default":
            default = route
            continue
        if route.method not in (method, "ANY"):
            continue
        pattern = route.path.split("/")
        if len(pattern) != len(segments):
            continue
        parameters: dict[str, str] = {}
        literals = 0
        for want, got in zip(pattern, segments, strict=True):
            if want.startswith("{") and want.endswith("}"):
                if not got:
                    break
                parameters[want[1:-1]] = unquote(got)
            elif want == got:
                literals += 1
            else:
                break
        else:
            rank = (literals, 1 if route.method == method else 0)
            if best is None or rank > best[0]:
                best = (rank, Match(route, parameters))
    if best is not None:
        return best[1]
    return Match(default, {}) if default is not None else None


def _request_id() -> str:
    # API Gateway's request ids look like "Jz8gIhzpoAMEV0A=".
    return base64.b64encode(secrets.token_bytes(10)).decode()


def _is_text(content_type: str) -> bool:
    lowered = content_type.lower()
    return any(lowered.startswith(t) for t in _TEXT_TYPES) or lowered.endswith("+json")


def build_event(request: web.Request, found: Match, body: bytes, request_id: str) -> JsonObject:
    """The documented HTTP API payload format 2.0 event (aws_lambda_events'
    ApiGatewayV2httpRequest)."""
    headers: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered == "cookie":
            cookies += [c.strip() for c in value.split(";") if c.strip()]
            continue
        headers[lowered] = f"{headers[lowered]},{value}" if lowered in headers else value
    raw_path, _, raw_query = request.raw_path.partition("?")
    query: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    now = time.time()
    event: JsonObject = {
        "version": "2.0",
        "routeKey": found.route.key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
        "headers": headers,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": API_ID,
            "domainName": request.host,
            "domainPrefix": request.host.split(".", 1)[0],
            "http": {
                "method": request.method,
                "path": raw_path,
                "protocol": f"HTTP/{request.version.major}.{request.version.minor}",
                "sourceIp": request.remote or "127.0.0.1",
                "userAgent": request.headers.get("User-Agent", ""),
            },
            "requestId": request_id,
            "routeKey": found.route.key,
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": False,
    }
    if cookies:
        event["cookies"] = cookies
    if query:
        event["queryStringParameters"] = query
    if found.parameters:
        event["pathParameters"] = found.parameters
    if body:
        text = None
        if _is_text(request.headers.get("Content-Type", "")):
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        if text is None:
            event["body"] = base64.b64encode(body).decode()
            event["isBase64Encoded"] = True
        else:
            event["body"] = text
    return event


def build_response(raw: bytes) -> web.Response:
    """The function's answer per the 2.0 rules: an object with statusCode is a response;
    anything else is a JSON 200 whose body is the answer itself."""
    try:
        value: Any = json.loads(raw) if raw.strip() else None
    except ValueError:
        return _message(502, "Internal Server Error")
    if not (isinstance(value, dict) and "statusCode" in value):
        return web.Response(status=200, body=raw, content_type="application/json")
    headers = {str(k): str(v) for k, v in (value.get("headers") or {}).items()}
    body = value.get("body") or ""
    payload = base64.b64decode(body) if value.get("isBase64Encoded") else str(body).encode()
    response = web.Response(status=int(value["statusCode"]), body=payload, headers=headers)
    if "content-type" not in {k.lower() for k in headers}:
        response.headers["Content-Type"] = "application/json"
    for cookie in value.get("cookies") or []:
        response.headers.add("Set-Cookie", str(cookie))
    return response


async def _drain(request: web.Request, limit: int = 8 * MAX_BODY_BYTES) -> None:
    """Reads and drops an oversized body, so that the client reads the 413 instead of a reset
    connection; past `limit` the connection is closed after the answer."""
    read = 0
    while read < limit:
        chunk = await request.content.read(1024 * 1024)
        if not chunk:
            return
        read += len(chunk)


def _signed(request: web.Request, body: bytes) -> bool:
    """A route with IAM authorization: signed by the stack's admin principal."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    url = f"http://{request.host}{request.raw_path}"
    return sigv4.verify(request.method, url, headers, body)


def _message(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"message": message}), content_type="application/json")


class FrontDoor:
    def __init__(self, routes: list[Route], runtime: Runtime, access_log: logging.Logger):
        self.routes = routes
        self.runtime = runtime
        self.access = access_log
        self.statuses: Counter[str] = Counter()

    def app(self) -> web.Application:
        # aiohttp's own body limit above the HTTP API's, so that this module answers 413.
        app = web.Application(client_max_size=MAX_BODY_BYTES * 2)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        request_id = _request_id()
        raw_path = request.raw_path.partition("?")[0]
        found = match(self.routes, request.method, raw_path)
        route_key = found.route.key if found else "-"
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            await _drain(request)
            response = _message(413, "Request Entity Too Large")
        elif found is None:
            response = _message(404, "Not Found")
        else:
            body = await request.content.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                await _drain(request)
                response = _message(413, "Request Entity Too Large")
            elif found.route.authorization == "AWS_IAM" and not _signed(request, body):
                response = _message(403, "Forbidden")
            else:
                response = await self._integrate(request, found, body, request_id)
        response.headers["apigw-requestid"] = request_id
        response.headers["Date"] = formatdate(usegmt=True)
        self.statuses[f"{route_key} {response.status}"] += 1
        self.access.info(
            json.dumps(
                {
                    "requestId": request_id,
                    "routeKey": route_key,
                    "status": response.status,
                    "ms": round((time.monotonic() - started) * 1000, 1),
                }
            )
        )
        return response

    async def _integrate(
        self, request: web.Request, found: Match, body: bytes, request_id: str
    ) -> web.Response:
        event = build_event(request, found, body, request_id)
        call = asyncio.ensure_future(
            self.runtime.invoke_raw(found.route.function, json.dumps(event).encode())
        )
        # An invocation that outlives the 503 still ends, maybe in an error nobody awaits.
        call.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            raw = await asyncio.wait_for(asyncio.shield(call), INTEGRATION_TIMEOUT_S)
        except TimeoutError:
            # API Gateway answers; the invocation runs on to its own deadline.
            return _message(503, "Service Unavailable")
        except FunctionError as err:
            log.warning("%s: %s", found.route.key, err)
            return _message(500, "Internal Server Error")
        return build_response(raw)
