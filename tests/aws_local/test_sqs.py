"""Integration tests of sqs.py on moto's server, with a fake dispatcher. They also check
that moto honours what the poller leaves to the queue: VisibilityTimeout, DelaySeconds and
the redrive to the dead-letter queue after maxReceiveCount."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aws_local import event_source_testing as support
from aws_local.event_source_testing import FakeFunction, fail, running, wait_for
from aws_local.model import JsonObject, QueueMapping
from aws_local.sqs import QueueSource, failed_message_ids

FN = "DispatcherFunction"


class Queues:
    """A wake queue and its dead-letter queue, shaped like template.yaml's. The visibility
    timeout is 60 s (720 deployed), longer than any invocation here even on a loaded
    machine, so that a message seen twice is a poller's fault; the tests of reappearance
    set 1 s."""

    def __init__(self, endpoint: str, *, visibility: int = 60, max_receive: int = 5, delay: int = 0) -> None:
        self.client = support.sqs_client(endpoint)
        tag = uuid.uuid4().hex[:8]
        self.dlq = self.client.create_queue(QueueName=f"dlq-{tag}")["QueueUrl"]
        dlq_arn = self.arn(self.dlq)
        self.url = self.client.create_queue(
            QueueName=f"wake-{tag}",
            Attributes={
                "VisibilityTimeout": str(visibility),
                "DelaySeconds": str(delay),
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive}),
            },
        )["QueueUrl"]

    def arn(self, url: str) -> str:
        attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        arn: str = attrs["Attributes"]["QueueArn"]
        return arn

    def send(self, body: str, delay: int | None = None) -> str:
        kwargs: dict[str, Any] = {"QueueUrl": self.url, "MessageBody": body}
        if delay is not None:
            kwargs["DelaySeconds"] = delay
        mid: str = self.client.send_message(**kwargs)["MessageId"]
        return mid

    def left(self, url: str | None = None) -> int:
        """Messages still in a queue, visible, in flight or delayed."""
        attrs = self.client.get_queue_attributes(
            QueueUrl=url or self.url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())

    def mapping(self, **overrides: Any) -> QueueMapping:
        base: dict[str, Any] = {
            "function": FN,
            "queue_url": self.url,
            "queue_arn": self.arn(self.url),
            "batch_size": 10,
            "report_item_failures": False,
        }
        base.update(overrides)
        return QueueMapping(**base)


def bodies(event: JsonObject) -> list[str]:
    return sorted(r["body"] for r in event["Records"])


def source(queues: Queues, fn: FakeFunction, endpoint: str, **overrides: Any) -> QueueSource:
    return QueueSource(queues.mapping(**overrides), endpoint=endpoint, invoke=fn, pollers=1, wait_seconds=1)


def test_success_deletes_the_batch_and_the_event_is_documented(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint)
    for text in ("a", "b", "c"):
        q.send(text)
    fn = FakeFunction()
    src = source(q, fn, sqs_endpoint)

    async def body() -> None:
        await wait_for(lambda: src.stats()["messages_deleted"] == 3)

    asyncio.run(running(src.run, body))
    assert [bodies(e) for e in fn.events] == [["a", "b", "c"]]
    assert q.left() == 0
    record = fn.events[0]["Records"][0]
    assert set(record) == {
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    }
    assert set(record["attributes"]) >= {
        "ApproximateReceiveCount",
        "SentTimestamp",
        "SenderId",
        "ApproximateFirstReceiveTimestamp",
    }
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == q.arn(q.url)
    assert record["awsRegion"] == "us-east-1"
    assert record["messageAttributes"] == {}
    json.dumps(fn.events)


def test_partial_failures_reappear_after_the_visibility_timeout(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint, visibility=1)
    ids = {q.send(b): b for b in ("a", "b", "c")}
    failing = next(i for i, b in ids.items() if b == "b")

    def behaviour(call: int, _event: JsonObject) -> JsonObject:
        if call == 1:
            return {"batchItemFailures": [{"itemIdentifier": failing}]}
        return {"batchItemFailures": []}

    fn = FakeFunction(behaviour)
    src = source(q, fn, sqs_endpoint, report_item_failures=True)

    async def body() -> None:
        await wait_for(lambda: src.stats()["messages_deleted"] == 3)

    asyncio.run(running(src.run, body))
    assert [bodies(e) for e in fn.events] == [["a", "b", "c"], ["b"]]
    retried = fn.events[1]["Records"][0]
    assert retried["attributes"]["ApproximateReceiveCount"] == "2"
    # Not before the visibility timeout (1 s) ran out.
    assert fn.calls[1][0] - fn.calls[0][0] >= 0.9
    assert q.left() == 0


def test_function_error_and_malformed_answer_keep_the_whole_batch(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint, visibility=1)
    for text in ("a", "b"):
        q.send(text)
    answers: list[Any] = [
        "error",
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": None},
    ]

    def behaviour(call: int, _event: JsonObject) -> JsonObject:
        answer = answers[call - 1]
        if answer == "error":
            return fail()
        result: JsonObject = answer
        return result

    fn = FakeFunction(behaviour)
    src = source(q, fn, sqs_endpoint, report_item_failures=True)

    async def body() -> None:
        await wait_for(lambda: src.stats()["messages_deleted"] == 2)

    asyncio.run(running(src.run, body))
    assert [bodies(e) for e in fn.events] == [["a", "b"]] * 3
    counts = [r["attributes"]["ApproximateReceiveCount"] for r in fn.events[2]["Records"]]
    assert counts == ["3", "3"]
    stats = src.stats()
    assert stats["function_errors"] == 1
    assert stats["messages_failed"] == 4


def test_delay_seconds_is_honoured(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint, delay=1)
    fn = FakeFunction()
    src = source(q, fn, sqs_endpoint)
    sent: dict[str, float] = {}

    async def body() -> None:
        sent["queue"] = time.monotonic()
        await asyncio.to_thread(q.send, "queue-delay")  # the queue's DelaySeconds: 1
        sent["message"] = time.monotonic()
        await asyncio.to_thread(q.send, "message-delay", 2)  # a message's own: 2
        await wait_for(lambda: src.stats()["messages_deleted"] == 2)

    asyncio.run(running(src.run, body))
    at = {e["Records"][0]["body"]: t for t, _, e in fn.calls}
    assert at["queue-delay"] - sent["queue"] >= 0.9
    assert at["message-delay"] - sent["message"] >= 1.9


def test_redrive_to_the_dead_letter_queue_after_max_receive_count(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint, visibility=1, max_receive=2)
    q.send("poison")
    fn = FakeFunction(lambda _n, _e: fail())
    src = source(q, fn, sqs_endpoint)

    async def body() -> None:
        await wait_for(lambda: q.left(q.dlq) == 1)

    asyncio.run(running(src.run, body))
    # Received twice (maxReceiveCount), then moved rather than handed out a third time.
    assert [bodies(e) for e in fn.events] == [["poison"], ["poison"]]
    assert q.left() == 0
    moved = q.client.receive_message(QueueUrl=q.dlq, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in moved] == ["poison"]


def test_filtered_out_messages_are_deleted_unseen(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint)
    q.send(json.dumps({"pool": "p1"}))
    q.send(json.dumps({"other": 1}))
    q.send("not json")
    fn = FakeFunction()
    src = source(q, fn, sqs_endpoint, filters=[{"body": {"pool": [{"exists": True}]}}])

    async def body() -> None:
        await wait_for(lambda: src.stats()["messages_deleted"] == 3)

    asyncio.run(running(src.run, body))
    assert [bodies(e) for e in fn.events] == [['{"pool": "p1"}']]
    assert src.stats()["messages_filtered_out"] == 2
    assert q.left() == 0


def test_several_pollers_share_the_queue(sqs_endpoint: str) -> None:
    q = Queues(sqs_endpoint)
    for n in range(30):
        q.send(str(n))
    fn = FakeFunction()
    src = QueueSource(q.mapping(batch_size=5), endpoint=sqs_endpoint, invoke=fn, pollers=3, wait_seconds=1)

    async def body() -> None:
        await wait_for(lambda: src.stats()["messages_deleted"] == 30)

    asyncio.run(running(src.run, body))
    delivered = sorted(int(b) for e in fn.events for b in bodies(e))
    assert delivered == list(range(30))  # each once
    assert all(len(e["Records"]) <= 5 for e in fn.events)
    assert q.left() == 0


def test_failed_message_ids() -> None:
    batch = [{"messageId": m} for m in ("m1", "m2", "m3")]
    everything = {"m1", "m2", "m3"}
    assert failed_message_ids(None, batch) == set()
    assert failed_message_ids({}, batch) == set()
    assert failed_message_ids({"batchItemFailures": []}, batch) == set()
    assert failed_message_ids({"batchItemFailures": None}, batch) == set()
    assert failed_message_ids({"batchItemFailures": [{"itemIdentifier": "m2"}]}, batch) == {"m2"}
    for malformed in (
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"messageId": "m2"}]},
        {"batchItemFailures": [{"itemIdentifier": "unknown"}]},
        {"batchItemFailures": "m2"},
        "m2",
    ):
        assert failed_message_ids(malformed, batch) == everything, malformed
