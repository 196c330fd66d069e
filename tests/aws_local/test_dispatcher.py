"""The dispatcher invoked directly (the admin endpoint's POST /invoke), with the documented
SQS event its wake queue's event source sends."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid

from .conftest import Stack, eventually, pool_key, short
from .receiver import Receiver
from .test_async import enqueue, held_pool


def sqs_event(stack: Stack, bodies: list[str]) -> dict[str, object]:
    """The wake queue's event source's event: one message per body, ids m0, m1, …"""
    queue = stack.described()["queues"]["WakeQueue"]
    name = queue.rsplit("/", 1)[-1]
    now = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": f"m{n}",
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
            for n, body in enumerate(bodies)
        ]
    }


def test_a_wake_for_a_pool_that_is_not_there_is_handled(stack: Stack) -> None:
    wake = {"pool": base64.b64encode(os.urandom(16)).decode(), "at": int(time.time() * 1000)}
    answer = stack.admin_post("/invoke/DispatcherFunction", sqs_event(stack, [json.dumps(wake)]))
    assert answer.status == 200
    assert "x-amz-function-error" not in answer.headers, answer.body
    calls = stack.admin_get("/calls?function=DispatcherFunction")["calls"]
    assert calls and all(c["allowed"] for c in calls)


def stream_record(stack: Stack, sequence: str, pk: bytes) -> dict[str, object]:
    """A stream record of a pool item with async work, as the stream's event source sends it."""
    keys = {"pk": {"B": base64.b64encode(pk).decode()}, "sk": {"B": "AA=="}}
    return {
        "eventID": uuid.uuid4().hex,
        "eventName": "MODIFY",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": float(int(time.time())),
            "Keys": keys,
            "NewImage": {**keys, "z": {"N": "1"}},
            "SequenceNumber": sequence,
            "SizeBytes": 64,
            "StreamViewType": "NEW_IMAGE",
        },
        "eventSourceARN": stack.described()["stream_arns"]["PoolTable"],
    }


def waiting_pool(stack: Stack, receiver: Receiver) -> str:
    """A pool whose ticket waits behind a long lease, once the stream's dispatcher has seen it."""
    pool, _ = held_pool(stack, ttl=600)
    enqueue(stack, receiver, pool, "t")
    eventually(lambda: dispatches(stack, pool), "the stream's dispatcher stepped the pool")
    return pool


def dispatches(stack: Stack, pool: str) -> int:
    """How many steps of the pool the dispatcher logged (one line each, by the key's prefix)."""
    return sum(
        1
        for line in stack.log_of("DispatcherFunction").splitlines()
        if '"message":"dispatch"' in line and f'"pool":"{short(pool)}"' in line
    )


def test_a_stream_record_of_no_pool_fails_alone(stack: Stack, receiver: Receiver) -> None:
    pool = waiting_pool(stack, receiver)
    before = dispatches(stack, pool)
    batch = {
        "Records": [
            stream_record(stack, "100", b"not-16-bytes"),  # a key no pool has
            stream_record(stack, "101", pool_key(pool)),
        ]
    }
    answer = stack.admin_post("/invoke/DispatcherFunction", batch)
    assert "x-amz-function-error" not in answer.headers, answer.body
    assert answer.body == {"batchItemFailures": [{"itemIdentifier": "100"}]}
    eventually(lambda: dispatches(stack, pool) > before, "the good record's pool stepped")


def test_a_wake_that_is_not_json_fails_alone(stack: Stack, receiver: Receiver) -> None:
    pool = waiting_pool(stack, receiver)
    before = dispatches(stack, pool)
    good = json.dumps({"pool": base64.b64encode(pool_key(pool)).decode(), "at": int(time.time() * 1000)})
    answer = stack.admin_post("/invoke/DispatcherFunction", sqs_event(stack, ["{not json", good]))
    assert "x-amz-function-error" not in answer.headers, answer.body
    assert answer.body == {"batchItemFailures": [{"itemIdentifier": "m0"}]}
    eventually(lambda: dispatches(stack, pool) > before, "the good wake's pool stepped")
