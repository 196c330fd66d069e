"""schemathesis hooks for tests/schemathesis (loaded through SCHEMATHESIS_HOOKS).

A generated callback URL is almost never one the service calls (it must be
http(s), resolve, and to an allowed address: offline, no name resolves), so
enqueue would answer 400 to nearly every case and its success path, and the
ticket and cancel operations linked from it, would go untested. Every
schema-valid callback URL is replaced by a loopback receiver, which local-api
allows with --allow-local-callbacks (nothing listens there: deliveries fail at
once, and their tickets end `failed`). A URL that breaks the schema is left as
generated, for the negative cases; which URLs are refused is tested in
tests/tests/async_mode.rs.
"""

from __future__ import annotations

from typing import Any

import schemathesis

RECEIVER = "http://127.0.0.1:9/granted"


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    # Before each call, whatever phase made the case (the coverage phase's
    # cases are built from the examples, not drawn through map_body).
    if not str(case.operation.path).endswith("/enqueue"):
        return
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("callback"), dict):
        return
    url = body["callback"].get("url")
    if isinstance(url, str) and 1 <= len(url) <= 2048:
        body["callback"]["url"] = RECEIVER

