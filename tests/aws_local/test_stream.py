"""Integration tests of stream.py on DynamoDB Local (and moto's SQS for the on-failure
destination), with a fake dispatcher."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aws_local import event_source_testing as support
from aws_local.event_source_testing import FakeFunction, fail, running, wait_for
from aws_local.model import JsonObject, StreamMapping
from aws_local.stream import StreamSource, partial_failure_index
from aws_local.test_filters import template_patterns


@pytest.fixture
def dynamodb_endpoint(servers: tuple[str, str]) -> str:
    return servers[0]


FN = "DispatcherFunction"


class Table:
    """A table shaped like template.yaml's (pk, sk binary; NEW_IMAGE stream)."""

    def __init__(self, endpoint: str) -> None:
        self.client = support.dynamodb_client(endpoint)
        self.name = f"t{uuid.uuid4().hex[:12]}"
        desc = self.client.create_table(
            TableName=self.name,
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "B"},
                {"AttributeName": "sk", "AttributeType": "B"},
            ],
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
        )
        self.stream_arn: str = desc["TableDescription"]["LatestStreamArn"]

    def put(self, pk: bytes, sk: bytes, **attrs: JsonObject) -> None:
        self.client.put_item(TableName=self.name, Item={"pk": {"B": pk}, "sk": {"B": sk}, **attrs})

    def pool(self, n: int, *, flag: bool = True) -> None:
        """A pool item (sort key 00); with the async-work flag `z` it passes the filter."""
        attrs: dict[str, JsonObject] = {"c": {"N": str(n)}}
        if flag:
            attrs["z"] = {"N": "1"}
        self.put(f"pool-{n}".encode(), b"\x00", **attrs)


def mapping(table: Table, **overrides: Any) -> StreamMapping:
    base: dict[str, Any] = {
        "function": FN,
        "stream_arn": table.stream_arn,
        "batch_size": 100,
        "starting_position": "TRIM_HORIZON",
        "maximum_retry_attempts": 5,
        "bisect_on_error": False,
        "report_item_failures": False,
        "filters": template_patterns(),
    }
    base.update(overrides)
    return StreamMapping(**base)


def pools(event: JsonObject) -> list[int]:
    """The pool numbers of an event's records (from the `c` attribute)."""
    return [int(r["dynamodb"]["NewImage"]["c"]["N"]) for r in event["Records"]]


def seqs(fn: FakeFunction) -> list[int]:
    return [int(r["dynamodb"]["SequenceNumber"]) for e in fn.events for r in e["Records"]]


def test_filters_batches_in_order_with_the_documented_event(dynamodb_endpoint: str) -> None:
    table = Table(dynamodb_endpoint)
    for n in range(7):
        table.pool(n)
        table.pool(100 + n, flag=False)  # no async work: filtered out
    table.put(b"pool-0", b"\x01ticket", tn={"N": "1"}, c={"N": "50"})  # a new ticket: passes
    table.put(b"pool-0", b"\x01ticket", tn={"N": "1"}, c={"N": "51"})  # its MODIFY: does not
    fn = FakeFunction()
    source = StreamSource(mapping(table, batch_size=3), endpoint=dynamodb_endpoint, invoke=fn, delay_ms=0)

    async def body() -> None:
        await wait_for(lambda: sum(len(e["Records"]) for e in fn.events) >= 8)
        await asyncio.sleep(0.3)  # nothing more comes

    asyncio.run(running(source.run, body))

    assert [pools(e) for e in fn.events] == [[0, 1, 2], [3, 4, 5], [6, 50]]
    assert seqs(fn) == sorted(seqs(fn))
    stats = source.stats()
    assert stats["records_read"] == 16
    assert stats["records_filtered_out"] == 8
    assert stats["batches_invoked"] == 3
    assert {f for _, f, _ in fn.calls} == {FN}

    record = fn.events[0]["Records"][0]
    assert set(record) == {
        "eventID",
        "eventName",
        "eventVersion",
        "eventSource",
        "awsRegion",
        "dynamodb",
        "eventSourceARN",
    }
    assert record["eventName"] == "INSERT"
    assert record["eventVersion"] == "1.1"
    assert record["eventSource"] == "aws:dynamodb"
    assert record["awsRegion"] == "us-east-1"
    assert record["eventSourceARN"] == table.stream_arn
    ddb = record["dynamodb"]
    assert set(ddb) == {
        "ApproximateCreationDateTime",
        "Keys",
        "NewImage",
        "SequenceNumber",
        "SizeBytes",
        "StreamViewType",
    }
    assert ddb["Keys"] == {
        "pk": {"B": base64.b64encode(b"pool-0").decode()},
        "sk": {"B": "AA=="},
    }
    assert ddb["NewImage"]["z"] == {"N": "1"}
    assert isinstance(ddb["ApproximateCreationDateTime"], float)
    assert isinstance(ddb["SizeBytes"], int)
    assert ddb["StreamViewType"] == "NEW_IMAGE"
    json.dumps(fn.events)  # the event is plain JSON (no bytes, no datetimes)


def test_latest_starts_after_the_records_already_there(dynamodb_endpoint: str) -> None:
    table = Table(dynamodb_endpoint)
    table.pool(1)
    fn = FakeFunction()
    source = StreamSource(
        mapping(table, starting_position="LATEST"),
        endpoint=dynamodb_endpoint,
        invoke=fn,
        delay_ms=0,
    )

    async def body() -> None:
        await source.ready.wait()
        await asyncio.to_thread(table.pool, 2)
        await wait_for(lambda: len(fn.events) >= 1)
        await asyncio.sleep(0.3)

    asyncio.run(running(source.run, body))
    assert [pools(e) for e in fn.events] == [[2]]


def test_an_empty_map_keeps_its_type(dynamodb_endpoint: str) -> None:
    # DynamoDB Local's stream sends an empty map as {}; every pool item has one (x, y).
    table = Table(dynamodb_endpoint)
    table.put(b"pool-1", b"\x00", z={"N": "1"}, x={"M": {}}, q={"L": []})
    fn = FakeFunction()
    source = StreamSource(mapping(table), endpoint=dynamodb_endpoint, invoke=fn, delay_ms=0)

    async def body() -> None:
        await wait_for(lambda: len(fn.events) >= 1)

    asyncio.run(running(source.run, body))
    image = fn.events[0]["Records"][0]["dynamodb"]["NewImage"]
    assert image["x"] == {"M": {}} and image["q"] == {"L": []}


def test_delay_is_added_before_each_invocation(dynamodb_endpoint: str) -> None:
    table = Table(dynamodb_endpoint)
    fn = FakeFunction()
    source = StreamSource(
        mapping(table, starting_position="LATEST"),
        endpoint=dynamodb_endpoint,
        invoke=fn,
        delay_ms=500,
    )
    written: list[float] = []

    async def body() -> None:
        await source.ready.wait()
        loop = asyncio.get_running_loop()
        written.append(loop.time())
        await asyncio.to_thread(table.pool, 1)
        await wait_for(lambda: len(fn.events) >= 1)

    asyncio.run(running(source.run, body))
    assert fn.calls[0][0] - written[0] >= 0.5


def test_retries_then_on_failure_destination_then_moves_on(dynamodb_endpoint: str, sqs_endpoint: str) -> None:
    table = Table(dynamodb_endpoint)
    sqs = support.sqs_client(sqs_endpoint)
    dlq = sqs.create_queue(QueueName=f"dlq-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    table.pool(1)
    # Fails on pool 1, whatever the batch; succeeds on anything else.
    fn = FakeFunction(lambda _n, e: fail() if 1 in pools(e) else {})
    source = StreamSource(
        mapping(table, maximum_retry_attempts=2, on_failure_queue_url=dlq),
        endpoint=dynamodb_endpoint,
        invoke=fn,
        sqs_endpoint=sqs_endpoint,
        delay_ms=0,
    )

    async def body() -> None:
        await wait_for(lambda: source.stats()["records_sent_to_on_failure"] == 1)
        await asyncio.to_thread(table.pool, 2)
        await wait_for(lambda: any(pools(e) == [2] for e in fn.events))

    asyncio.run(running(source.run, body))
    # The first try and 2 retries, then the next record.
    assert [pools(e) for e in fn.events] == [[1], [1], [1], [2]]
    stats = source.stats()
    assert stats["retries"] == 2
    assert stats["bisections"] == 0

    msgs = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=1).get("Messages", [])
    assert len(msgs) == 1
    doc = json.loads(msgs[0]["Body"])
    seq = fn.events[0]["Records"][0]["dynamodb"]["SequenceNumber"]
    info = doc["DDBStreamBatchInfo"]
    assert info["startSequenceNumber"] == info["endSequenceNumber"] == seq
    assert info["batchSize"] == 1
    assert info["streamArn"] == table.stream_arn
    assert info["shardId"].startswith("shardId-")
    assert doc["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert doc["requestContext"]["approximateInvokeCount"] == 3
    assert doc["requestContext"]["functionArn"].endswith(f":function:{FN}")
    assert doc["responseContext"]["functionError"] == "Unhandled"
    assert doc["version"] == "1.0"


def test_bisects_to_isolate_a_poison_record(dynamodb_endpoint: str) -> None:
    table = Table(dynamodb_endpoint)
    for n in range(4):
        table.pool(n)
    fn = FakeFunction(lambda _n, e: fail() if 2 in pools(e) else {})
    source = StreamSource(
        mapping(table, batch_size=4, maximum_retry_attempts=1, bisect_on_error=True),
        endpoint=dynamodb_endpoint,
        invoke=fn,
        delay_ms=0,
    )

    async def body() -> None:
        await wait_for(lambda: any(pools(e) == [3] for e in fn.events))
        await asyncio.sleep(0.3)

    asyncio.run(running(source.run, body))
    # Split on error (not a retry), down to the poison record, which is retried once and
    # dropped (no destination); the rest is delivered in order.
    assert [pools(e) for e in fn.events] == [[0, 1, 2, 3], [0, 1], [2, 3], [2], [2], [3]]
    stats = source.stats()
    assert stats["bisections"] == 2
    assert stats["retries"] == 1
    assert stats["records_sent_to_on_failure"] == 1


@pytest.mark.parametrize(
    ("first_answer", "expected"),
    [
        # Records before the lowest failed sequence number are done; the rest is retried.
        ("fail-third-and-second", [[0, 1, 2, 3], [1, 2, 3]]),
        # An empty list: all succeeded.
        ({"batchItemFailures": []}, [[0, 1, 2, 3]]),
        # Malformed: the whole batch failed.
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, [[0, 1, 2, 3], [0, 1, 2, 3]]),
    ],
)
def test_partial_batch_responses(
    dynamodb_endpoint: str, first_answer: Any, expected: list[list[int]]
) -> None:
    table = Table(dynamodb_endpoint)
    for n in range(4):
        table.pool(n)

    def behaviour(call: int, event: JsonObject) -> JsonObject:
        if call > 1:
            return {}
        seq = [r["dynamodb"]["SequenceNumber"] for r in event["Records"]]
        if first_answer == "fail-third-and-second":
            return {"batchItemFailures": [{"itemIdentifier": s} for s in (seq[2], seq[1])]}
        answer: JsonObject = first_answer
        return answer

    fn = FakeFunction(behaviour)
    source = StreamSource(
        mapping(table, batch_size=4, report_item_failures=True, bisect_on_error=True),
        endpoint=dynamodb_endpoint,
        invoke=fn,
        delay_ms=0,
    )

    async def body() -> None:
        await wait_for(lambda: len(fn.events) >= len(expected))
        await asyncio.sleep(0.3)

    asyncio.run(running(source.run, body))
    assert [pools(e) for e in fn.events] == expected
    assert source.stats()["retries"] == len(expected) - 1
    assert source.stats()["bisections"] == 0  # a partial answer is no function error


def test_partial_failure_answers() -> None:
    """Every form of a ReportBatchItemFailures answer (with-ddb.html, "Success and failure
    conditions"), on the pure function the source uses."""
    records = [{"dynamodb": {"SequenceNumber": s}} for s in ("10", "20", "30")]

    def at(answer: Any) -> int | None:
        return partial_failure_index(answer, records)

    assert at(None) is None
    assert at({}) is None
    assert at({"batchItemFailures": None}) is None
    assert at({"batchItemFailures": []}) is None
    assert at({"batchItemFailures": [{"itemIdentifier": "20"}]}) == 1
    assert at({"batchItemFailures": [{"itemIdentifier": "30"}, {"itemIdentifier": "20"}]}) == 1
    for malformed in (
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"id": "20"}]},
        {"batchItemFailures": [{"itemIdentifier": "999"}]},
        {"batchItemFailures": "all"},
        {"batchItemFailures": ["20"]},
        "not an object",
    ):
        assert at(malformed) == 0, malformed
