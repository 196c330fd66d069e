"""The dispatcher invoked directly (the admin endpoint's POST /invoke), with the documented
SQS event its wake queue's event source sends."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid

from .conftest import Stack


def sqs_event(stack: Stack, body: str) -> dict[str, object]:
    queue = stack.admin_get("/stack")["queues"]["WakeQueue"]
    name = queue.rsplit("/", 1)[-1]
    now = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": str(uuid.uuid4()),
                "receiptHandle": "aws-local",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": now,
                    "SenderId": "AIDAAWSLOCAL",
                    "ApproximateFirstReceiveTimestamp": now,
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:us-east-1:000000000000:{name}",
                "awsRegion": "us-east-1",
            }
        ]
    }


def test_a_wake_for_a_pool_that_is_not_there_is_handled(stack: Stack) -> None:
    wake = {"pool": base64.b64encode(os.urandom(16)).decode(), "at": int(time.time() * 1000)}
    answer = stack.admin_post("/invoke/DispatcherFunction", sqs_event(stack, json.dumps(wake)))
    assert answer.status == 200
    assert "x-amz-function-error" not in answer.headers, answer.body
    calls = stack.admin_get("/calls?function=DispatcherFunction")["calls"]
    assert calls and all(c["allowed"] for c in calls)
