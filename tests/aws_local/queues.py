"""The template's AWS::SQS::Queue resources on moto's SQS, with their attributes.

Queues are created in dependency order (a redrive policy names its dead-letter queue's ARN,
which exists only once that queue does): each pass creates every queue whose properties
resolve.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp

from . import awsjson
from .model import JsonObject
from .template import Unresolved

# CloudFormation's queue properties that are SQS attributes under the same name.
_ATTRIBUTES = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "SqsManagedSseEnabled",
    "FifoQueue",
    "ContentBasedDeduplication",
)


def attributes(properties: JsonObject) -> dict[str, str]:
    """CloudFormation's queue properties as CreateQueue's string attributes."""
    found: dict[str, str] = {}
    for key in _ATTRIBUTES:
        if key in properties:
            value = properties[key]
            found[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    for key in ("RedrivePolicy", "RedriveAllowPolicy"):
        if key in properties:
            found[key] = json.dumps(properties[key])
    return found


async def create_all(
    session: aiohttp.ClientSession,
    endpoint: str,
    queues: dict[str, JsonObject],
    name_of: Callable[[str], str],
    resolve: Callable[[Any], Any],
    created: Callable[[str, str, str], None],
) -> None:
    """Creates every queue (logical id → unresolved properties); `created(id, url, arn)`."""
    left = dict(queues)
    while left:
        progress = False
        for rid, props in list(left.items()):
            try:
                resolved = resolve(props)
            except Unresolved:
                continue
            answer = await awsjson.call(
                session,
                endpoint,
                "sqs",
                "CreateQueue",
                {"QueueName": name_of(rid), "Attributes": attributes(resolved)},
            )
            url = answer["QueueUrl"]
            got = await awsjson.call(
                session,
                endpoint,
                "sqs",
                "GetQueueAttributes",
                {"QueueUrl": url, "AttributeNames": ["QueueArn"]},
            )
            created(rid, url, got["Attributes"]["QueueArn"])
            del left[rid]
            progress = True
        if not progress:
            raise Unresolved(f"queues whose properties never resolve: {sorted(left)}")
