"""A minimal client of AWS's JSON protocol (DynamoDB, SQS) for the harness's own calls.

DynamoDB Local and moto check no signatures: an Authorization header (DynamoDB Local wants
an alphanumeric access key) whose credential scope
names the region is all they read (moto takes the region from it). The harness uses this,
not boto3, to create the table and the queues: it starts in milliseconds and speaks the same
wire format as the functions' SDK.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from .model import JsonObject

REGION = "us-east-1"
ACCOUNT = "000000000000"

# Enough for DynamoDB Local and moto; the signature itself is never checked.
_AUTH = (
    "AWS4-HMAC-SHA256 Credential=awslocal/20200101/{region}/{service}/aws4_request, "
    "SignedHeaders=host, Signature=0"
)

TARGET_PREFIX = {"dynamodb": "DynamoDB_20120810", "sqs": "AmazonSQS"}


class AwsError(Exception):
    """An AWS error answer: its HTTP status and `__type`."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(f"{status} {kind}: {message}")
        self.status = status
        self.kind = kind.rsplit("#", 1)[-1]
        self.message = message


async def call(
    session: aiohttp.ClientSession,
    endpoint: str,
    service: str,
    operation: str,
    body: JsonObject,
) -> JsonObject:
    """One JSON-protocol call, e.g. call(s, url, "dynamodb", "CreateTable", {...})."""
    headers = {
        "X-Amz-Target": f"{TARGET_PREFIX[service]}.{operation}",
        "Content-Type": "application/x-amz-json-1.0",
        "Authorization": _AUTH.format(region=REGION, service=service),
    }
    async with session.post(endpoint, data=json.dumps(body), headers=headers) as response:
        text = await response.text()
        answer: Any = json.loads(text) if text else {}
        if response.status >= 300:
            kind = str(answer.get("__type", "")) if isinstance(answer, dict) else ""
            message = ""
            if isinstance(answer, dict):
                message = str(answer.get("message") or answer.get("Message") or "")
            raise AwsError(response.status, kind or "Unknown", message or text[:200])
        return answer if isinstance(answer, dict) else {}
