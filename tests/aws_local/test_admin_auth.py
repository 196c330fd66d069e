"""`AdminAuth: AWS_IAM` on a stack of its own: PUT and DELETE answer API Gateway's 403
unless signed (SigV4, service execute-api) by an allowed principal; borrow, return, GET
and async mode stay open to whoever has the pool UUID. The signing here is the one the
docs show (botocore, as the AWS CLI and SDKs sign)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from . import launch, sigv4
from .conftest import ROOT, Answer, Stack, request


@pytest.fixture(scope="module")
def admin_only() -> Iterator[Stack]:
    with contextlib.ExitStack() as stop:
        front, admin = stop.enter_context(
            launch.running(
                ROOT / "target" / "aws-local" / "admin-auth", "--parameter-overrides", "AdminAuth=AWS_IAM"
            )
        )
        yield Stack(front, admin)


def signed(
    stack: Stack, method: str, path: str, body: Any, secret: str = sigv4.ADMIN_SECRET_ACCESS_KEY
) -> Answer:
    data = json.dumps(body).encode() if body is not None else b""
    aws = AWSRequest(
        method=method, url=stack.front + path, data=data, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(Credentials(sigv4.ADMIN_ACCESS_KEY_ID, secret), "execute-api", sigv4.REGION).add_auth(aws)
    prepared = aws.prepare()
    return request(prepared.url, method, raw=data or None, headers=dict(prepared.headers))


def test_put_and_delete_need_a_signature_the_rest_does_not(admin_only: Stack) -> None:
    stack, pool = admin_only, str(uuid.uuid4())
    for method, body in (("PUT", {"count": 2}), ("DELETE", None)):
        answer = stack.api(method, f"/l/{pool}", body)
        assert (answer.status, answer.body) == (403, {"message": "Forbidden"}), (method, answer)
    forged = signed(stack, "PUT", f"/l/{pool}", {"count": 2}, secret="not-the-secret")
    assert forged.status == 403, forged.body
    made = signed(stack, "PUT", f"/l/{pool}", {"count": 2})
    assert made.status == 200, made.body
    # The holders of the pool UUID: borrow, return, GET, as the contract says.
    held = stack.api("POST", f"/l/{pool}/borrow", {"ttl": 30})
    assert held.status == 200, held.body
    assert stack.api("GET", f"/l/{pool}").body["in_use"] == 1
    assert stack.api("POST", f"/l/{pool}/return", {"lease": held.body["lease"]}).status == 200
    assert signed(stack, "DELETE", f"/l/{pool}", None).status == 200
    assert stack.api("GET", f"/l/{pool}").status == 404
