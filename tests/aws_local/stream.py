"""The DynamoDB stream event source: Lambda's event source mapping, on DynamoDB Local.

Reads the table's stream as Lambda does (https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html):
every shard is polled about 4 times a second ("Lambda polls shards in your DynamoDB stream
for records at a base rate of 4 times per second"); records are filtered (filters.py) and
those that pass no filter are skipped for good; up to BatchSize records go to one
invocation; a shard has one batch in flight and is read in order; a child shard is read only
once its parent is done. On a function error the batch is retried up to
MaximumRetryAttempts (-1: forever), split in two first when BisectBatchOnFunctionError is
on ("Splitting a batch does not count towards the retry quota", same page, "Error
handling"). With ReportBatchItemFailures, the records before the lowest reported sequence
number are done and the rest is retried (a retry); an empty or null list means success, a
malformed answer fails the whole batch ("Success and failure conditions"). A batch past its
retries is sent to the on-failure queue as the documented invocation record
(DDBStreamBatchInfo) and the shard moves on.

Not modelled: MaximumRecordAgeInSeconds, batching windows, ParallelizationFactor, tumbling
windows, the 6 MB payload cap, and the 24 h retention (DynamoDB Local keeps records).

Where DynamoDB Local's stream differs from AWS's (checked with DynamoDB Local 10.3.0's jar):
- its records say `awsRegion: "ddblocal"`; the event says us-east-1, the deployed region;
- ApproximateCreationDateTime is rounded down to the minute (AWS: to the second). It is
  passed on as it is; the dispatcher does not read it;
- an empty map comes as `{}`, without its type (GetItem of the same item says `{"M": {}}`, as
  AWS's stream does). Every pool item has one (`x`, `y`), so `to_wire` gives it its `M` back;
- it opened no new shard in our runs (AWS rolls a shard over about every 4 hours), so the
  parent-before-child order and the discovery of new shards are not exercised by the tests.

`ready` (an asyncio.Event, not in the brief's interface) is set once the shards open at
the start have their iterators, so that a caller starting with LATEST knows when a write
will be seen.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from .filters import stream_record_passes
from .model import FunctionError, Invoke, JsonObject, StreamMapping

log = logging.getLogger("aws-local.stream")

REGION = "us-east-1"
ACCOUNT = "123456789012"
# Lambda's poll rate for a DynamoDB stream shard: 4 a second (with-ddb.html).
POLL_INTERVAL_S = 0.25
# How often the shard list is read again, to find the shards DynamoDB opens over time.
DISCOVER_INTERVAL_S = 2.0

T = TypeVar("T")


class StreamSource:
    """Polls a table's stream and invokes `mapping.function` with its records.

    `delay_ms` is added before each invocation. Its default, 200 ms, is the typical
    propagation delay AWS publishes for a consumer that polls a stream with GetRecords:
    "an average of around 200 ms if you have one consumer reading from the stream"
    (Amazon Kinesis Data Streams Developer Guide, "Develop enhanced fan-out consumers with
    dedicated throughput", https://docs.aws.amazon.com/streams/latest/dev/enhanced-consumers.html,
    the table comparing shared-throughput and enhanced fan-out consumers). AWS publishes no
    separate figure for DynamoDB Streams → Lambda that we found; Lambda reads a DynamoDB
    stream the same way (GetRecords, 4 polls a second per shard, with-ddb.html). The poll
    interval (up to 250 ms) comes on top of it, as it does on AWS.
    """

    def __init__(
        self,
        mapping: StreamMapping,
        *,
        endpoint: str,
        invoke: Invoke,
        sqs_endpoint: str | None = None,
        delay_ms: int = 200,
    ) -> None:
        if mapping.on_failure_queue_url and not sqs_endpoint:
            raise ValueError("an on-failure queue needs sqs_endpoint")
        self.mapping = mapping
        self.delay_s = delay_ms / 1000
        self._invoke = invoke
        creds: dict[str, Any] = {
            "region_name": REGION,
            "aws_access_key_id": "x",
            "aws_secret_access_key": "x",
            "config": Config(retries={"max_attempts": 3, "mode": "standard"}),
        }
        self._streams = boto3.client("dynamodbstreams", endpoint_url=endpoint, **creds)
        self._sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, **creds) if sqs_endpoint else None
        # boto3 blocks: its calls run on threads of our own, so that the shard loops never
        # wait for a free worker of the loop's shared default executor.
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="stream-source")
        self._stats = {
            "batches_invoked": 0,
            "records_read": 0,
            "records_filtered_out": 0,
            "retries": 0,
            "bisections": 0,
            "records_sent_to_on_failure": 0,
            "shards": 0,
        }
        # Set once every shard open at start has its iterator: from then on, a write to the
        # table is seen even with StartingPosition LATEST.
        self.ready = asyncio.Event()

    def stats(self) -> dict[str, int]:
        """Counters: batches invoked, records read, filtered out, retries, bisections,
        records sent to the on-failure destination, shards being read."""
        return dict(self._stats)

    # ---- shards -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Reads the stream until cancelled."""
        started: set[str] = set()
        done: dict[str, asyncio.Event] = {}
        tasks: list[asyncio.Task[None]] = []
        first = True
        try:
            while True:
                shards = await self._describe_shards()
                for shard in shards:
                    sid = shard["ShardId"]
                    if sid in started:
                        continue
                    started.add(sid)
                    done.setdefault(sid, asyncio.Event())
                    closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
                    if first and self.mapping.starting_position == "LATEST":
                        if closed:
                            # Older than the mapping: LATEST skips it.
                            done[sid].set()
                            continue
                        # Got now, before `ready`, so that no later write is missed.
                        iterator = await self._iterator(sid, "LATEST")
                        tasks.append(asyncio.create_task(self._shard(sid, iterator, None, done)))
                        continue
                    # TRIM_HORIZON, and every shard opened after the start: from its first
                    # record, once its parent is done.
                    parent = shard.get("ParentShardId")
                    parent_done = done.setdefault(parent, asyncio.Event()) if parent else None
                    if parent and parent not in {s["ShardId"] for s in shards}:
                        parent_done = None  # the parent has left the stream: nothing to wait
                    tasks.append(asyncio.create_task(self._shard(sid, None, parent_done, done)))
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        # A shard loop that died (DynamoDB Local gone, a bug): fail loudly
                        # rather than stop delivering in silence.
                        raise RuntimeError("a stream shard reader failed") from task.exception()
                self._stats["shards"] = len([s for s in started if not done[s].is_set()])
                if first:
                    first = False
                    self.ready.set()
                await asyncio.sleep(DISCOVER_INTERVAL_S)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _describe_shards(self) -> list[JsonObject]:
        shards: list[JsonObject] = []
        kwargs: dict[str, Any] = {"StreamArn": self.mapping.stream_arn}
        while True:
            desc = (await self._call(self._streams.describe_stream, **kwargs))["StreamDescription"]
            shards.extend(dict(s) for s in desc.get("Shards", []))
            last = desc.get("LastEvaluatedShardId")
            if not last:
                return shards
            kwargs["ExclusiveStartShardId"] = last

    async def _iterator(self, shard_id: str, kind: str, after: str | None = None) -> str | None:
        kwargs: dict[str, Any] = {
            "StreamArn": self.mapping.stream_arn,
            "ShardId": shard_id,
            "ShardIteratorType": kind,
        }
        if after is not None:
            kwargs["SequenceNumber"] = after
        it: str | None = (await self._call(self._streams.get_shard_iterator, **kwargs)).get("ShardIterator")
        return it

    async def _shard(
        self,
        shard_id: str,
        iterator: str | None,
        parent_done: asyncio.Event | None,
        done: dict[str, asyncio.Event],
    ) -> None:
        """One shard, in order, one batch in flight."""
        if parent_done is not None:
            await parent_done.wait()
        start_kind = "LATEST" if iterator is not None else "TRIM_HORIZON"
        if iterator is None:
            iterator = await self._iterator(shard_id, "TRIM_HORIZON")
        pending: deque[JsonObject] = deque()
        last_seq: str | None = None
        while True:
            if not pending:
                if iterator is None:
                    break  # a closed shard, read to its end
                try:
                    resp = await self._call(self._streams.get_records, ShardIterator=iterator, Limit=1000)
                except ClientError as e:
                    if e.response.get("Error", {}).get("Code") != "ExpiredIteratorException":
                        raise
                    # An iterator lives 15 minutes; take a new one where we were.
                    if last_seq is None:
                        iterator = await self._iterator(shard_id, start_kind)
                    else:
                        iterator = await self._iterator(shard_id, "AFTER_SEQUENCE_NUMBER", last_seq)
                    continue
                iterator = resp.get("NextShardIterator")
                records = resp.get("Records", [])
                self._stats["records_read"] += len(records)
                for raw in records:
                    record = to_event_record(dict(raw), self.mapping.stream_arn)
                    last_seq = record["dynamodb"]["SequenceNumber"]
                    if stream_record_passes(self.mapping.filters, record):
                        pending.append(record)
                    else:
                        self._stats["records_filtered_out"] += 1
                if not pending:
                    if iterator is not None:
                        await asyncio.sleep(POLL_INTERVAL_S)
                    continue
            batch = [pending.popleft() for _ in range(min(self.mapping.batch_size, len(pending)))]
            await self._deliver(shard_id, batch)
        done.setdefault(shard_id, asyncio.Event()).set()

    # ---- one batch: retries, bisection, partial failures, on-failure destination ------------

    async def _deliver(self, shard_id: str, batch: list[JsonObject]) -> None:
        # (records, retries so far): halves of a split go to the front, first half first.
        work: deque[tuple[list[JsonObject], int]] = deque([(batch, 0)])
        while work:
            records, retries = work.popleft()
            failed_from, function_error = await self._attempt(records)
            if failed_from is None:
                continue
            if function_error and self.mapping.bisect_on_error and len(records) > 1:
                self._stats["bisections"] += 1
                mid = len(records) // 2
                work.appendleft((records[mid:], retries))
                work.appendleft((records[:mid], retries))
                continue
            remaining = records[failed_from:]
            limit = self.mapping.maximum_retry_attempts
            if limit != -1 and retries >= limit:
                await self._on_failure(shard_id, remaining, retries + 1, function_error)
                continue
            self._stats["retries"] += 1
            work.appendleft((remaining, retries + 1))

    async def _attempt(self, records: list[JsonObject]) -> tuple[int | None, bool]:
        """Invokes once. Returns (index of the first record to retry or None, whether the
        function itself failed)."""
        await asyncio.sleep(self.delay_s)
        self._stats["batches_invoked"] += 1
        try:
            response = await self._invoke(self.mapping.function, {"Records": records})
        except FunctionError as e:
            log.info("%s failed on a batch of %d: %s", self.mapping.function, len(records), e)
            return 0, True
        if not self.mapping.report_item_failures:
            return None, False
        return partial_failure_index(response, records), False

    async def _on_failure(
        self, shard_id: str, records: list[JsonObject], invokes: int, function_error: bool
    ) -> None:
        self._stats["records_sent_to_on_failure"] += len(records)
        if not self.mapping.on_failure_queue_url or self._sqs is None:
            log.warning("dropped a batch of %d records (no on-failure destination)", len(records))
            return
        body = invocation_record(self.mapping, shard_id, records, invokes, function_error=function_error)
        await self._call(
            self._sqs.send_message,
            QueueUrl=self.mapping.on_failure_queue_url,
            MessageBody=json.dumps(body),
        )

    async def _call(self, fn: Callable[..., T], **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(**kwargs))


# ---- the event's wire form ------------------------------------------------------------------


def to_event_record(raw: JsonObject, stream_arn: str) -> JsonObject:
    """A GetRecords record (as boto3 parses it) in the form Lambda sends: base64 strings for
    binaries, numbers as strings, ApproximateCreationDateTime in epoch seconds (the Rust side,
    aws_lambda_events' dynamodb::EventRecord, reads exactly these fields)."""
    ddb = raw["dynamodb"]
    change: JsonObject = {}
    created = ddb.get("ApproximateCreationDateTime")
    if isinstance(created, dt.datetime):
        change["ApproximateCreationDateTime"] = created.timestamp()
    elif created is not None:
        change["ApproximateCreationDateTime"] = float(created)
    for key in ("Keys", "NewImage", "OldImage"):
        if key in ddb:
            change[key] = {name: to_wire(value) for name, value in ddb[key].items()}
    for key in ("SequenceNumber", "SizeBytes", "StreamViewType"):
        if key in ddb:
            change[key] = ddb[key]
    return {
        "eventID": raw["eventID"],
        "eventName": raw["eventName"],
        "eventVersion": raw.get("eventVersion", "1.1"),
        "eventSource": "aws:dynamodb",
        # DynamoDB Local says "ddblocal"; the deployed stack's region is what the function sees.
        "awsRegion": REGION,
        "dynamodb": change,
        "eventSourceARN": stream_arn,
    }


def to_wire(value: JsonObject) -> JsonObject:
    """One DynamoDB attribute value back in DynamoDB JSON (boto3 decodes binaries to bytes)."""
    if not value:
        # DynamoDB Local's stream drops an empty map's type (see the module's docstring).
        return {"M": {}}
    ((kind, v),) = value.items()
    if kind == "B":
        return {"B": _b64(v)}
    if kind == "BS":
        return {"BS": [_b64(b) for b in v]}
    if kind == "M":
        return {"M": {k: to_wire(x) for k, x in v.items()}}
    if kind == "L":
        return {"L": [to_wire(x) for x in v]}
    return {kind: v}


def _b64(raw: bytes | str) -> str:
    return base64.b64encode(raw if isinstance(raw, bytes) else raw.encode()).decode()


def partial_failure_index(response: Any, records: list[JsonObject]) -> int | None:
    """Where a ReportBatchItemFailures answer says to resume: the index of the record with
    the lowest reported sequence number, None if all succeeded, 0 if the answer is malformed
    (then the whole batch failed)."""
    if response is None:
        return None
    if not isinstance(response, dict):
        return 0
    failures = response.get("batchItemFailures")
    if failures is None or failures == []:
        return None
    if not isinstance(failures, list):
        return 0
    index = {r["dynamodb"]["SequenceNumber"]: i for i, r in enumerate(records)}
    lowest: int | None = None
    for failure in failures:
        ident = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(ident, str) or ident not in index:
            return 0  # empty, null, a bad key or an unknown id: the whole batch failed
        lowest = index[ident] if lowest is None else min(lowest, index[ident])
    return lowest


def invocation_record(
    mapping: StreamMapping,
    shard_id: str,
    records: list[JsonObject],
    invokes: int,
    *,
    function_error: bool,
) -> JsonObject:
    """The on-failure destination's document for a discarded batch (with-ddb.html,
    "Error handling", Example Invocation Record)."""
    now = dt.datetime.now(dt.UTC)
    first, last = records[0]["dynamodb"], records[-1]["dynamodb"]
    response_context: JsonObject = {"statusCode": 200, "executedVersion": "$LATEST"}
    if function_error:
        response_context["functionError"] = "Unhandled"
    return {
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{mapping.function}",
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": invokes,
        },
        "responseContext": response_context,
        "version": "1.0",
        "timestamp": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": first["SequenceNumber"],
            "endSequenceNumber": last["SequenceNumber"],
            "approximateArrivalOfFirstRecord": _iso(first.get("ApproximateCreationDateTime")),
            "approximateArrivalOfLastRecord": _iso(last.get("ApproximateCreationDateTime")),
            "batchSize": len(records),
            "streamArn": mapping.stream_arn,
        },
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
