"""The SQS event source: Lambda's event source mapping on a queue of moto's server.

As Lambda does (https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html): pollers
long-poll the queue, receive up to BatchSize messages and invoke the function with them
synchronously. Messages that pass no filter are deleted unseen ("If an Amazon SQS message
doesn't satisfy your filter criteria, Lambda automatically removes the message"). After
the invocation:
- success: every message of the batch is deleted;
- a function error (or crash, or timeout): none is; they come back when their visibility
  timeout ends, and the queue's redrive policy moves one to the dead-letter queue once it
  has been received maxReceiveCount times;
- with ReportBatchItemFailures, all but the reported `itemIdentifier`s (message ids) are
  deleted; an empty or null list means success, and a malformed answer (an empty, null or
  unknown id, a bad key, not a list) fails the whole batch.

The queue itself does the rest: moto's server (5.2.5) honours VisibilityTimeout,
DelaySeconds (queue and message) and the RedrivePolicy's maxReceiveCount (a message
received that many times is moved to the dead-letter queue instead of being handed out
again), and its long polls return as soon as a message becomes visible;
tests/aws_local/test_sqs.py checks each, so the poller does not reimplement them. Gaps
found, none of which the poller needs to cover: moto accepts a queue DelaySeconds above
900 (SQS refuses it; a message's DelaySeconds above 900 is refused by both); and a
message moved after maxReceiveCount 2 shows ApproximateReceiveCount 3 in the dead-letter
queue (the move counts as a receive; not compared with SQS).

Concurrency: `pollers` loops (Lambda starts with five for a standard queue), each with one
batch in flight. Not modelled: Lambda's scaling beyond them, batching windows
(MaximumBatchingWindowInSeconds), the 6 MB payload cap, and FIFO queues.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
from botocore.config import Config

from .filters import sqs_record_passes
from .model import FunctionError, Invoke, JsonObject, QueueMapping

log = logging.getLogger("aws-local.sqs")

REGION = "us-east-1"
# SQS hands out at most 10 messages per ReceiveMessage.
RECEIVE_MAX = 10

T = TypeVar("T")


class QueueSource:
    """Polls `mapping.queue_url` and invokes `mapping.function` with its messages.

    `wait_seconds` is each long poll's wait. Lambda waits 20 s; a long poll returns as soon
    as a message is visible, so a shorter wait changes only how often an empty queue is
    asked, and lets a stop (Ctrl-C) end the blocked receive within that time.
    """

    def __init__(
        self,
        mapping: QueueMapping,
        *,
        endpoint: str,
        invoke: Invoke,
        pollers: int = 5,
        wait_seconds: int = 2,
    ) -> None:
        if pollers < 1:
            raise ValueError("pollers must be at least 1")
        self.mapping = mapping
        self.pollers = pollers
        self.wait_seconds = wait_seconds
        self._invoke = invoke
        self._sqs = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(retries={"max_attempts": 3, "mode": "standard"}),
        )
        # One thread per poller (its long poll blocks one) and one for deletes.
        self._pool = ThreadPoolExecutor(max_workers=pollers + 1, thread_name_prefix="queue-source")
        self._stats = {
            "batches_invoked": 0,
            "messages_received": 0,
            "messages_filtered_out": 0,
            "messages_deleted": 0,
            "messages_failed": 0,
            "function_errors": 0,
        }

    def stats(self) -> dict[str, int]:
        """Counters: batches invoked, messages received, filtered out (deleted unseen),
        deleted after success, failed (left to reappear), function errors."""
        return dict(self._stats)

    async def run(self) -> None:
        """Polls until cancelled."""
        tasks = [asyncio.create_task(self._poller()) for _ in range(self.pollers)]
        try:
            # The first poller to fail ends the run loudly.
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _poller(self) -> None:
        while True:
            messages = await self._receive()
            if not messages:
                continue
            self._stats["messages_received"] += len(messages)
            records = [to_event_record(m, self.mapping.queue_arn) for m in messages]
            batch = [r for r in records if sqs_record_passes(self.mapping.filters, r)]
            dropped = [r for r in records if r not in batch]
            if dropped:
                self._stats["messages_filtered_out"] += len(dropped)
                await self._delete(dropped)
            if batch:
                await self._deliver(batch)

    async def _receive(self) -> list[JsonObject]:
        """Up to BatchSize messages: one long poll, then (for a BatchSize above 10) more
        receives without waiting while the queue has more."""
        messages: list[JsonObject] = []
        wait = self.wait_seconds
        while len(messages) < self.mapping.batch_size:
            want = min(RECEIVE_MAX, self.mapping.batch_size - len(messages))
            resp = await self._call(
                self._sqs.receive_message,
                QueueUrl=self.mapping.queue_url,
                MaxNumberOfMessages=want,
                WaitTimeSeconds=wait,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            got: list[JsonObject] = [dict(m) for m in resp.get("Messages", [])]
            messages.extend(got)
            if len(got) < want:
                break
            wait = 0
        return messages

    async def _deliver(self, batch: list[JsonObject]) -> None:
        self._stats["batches_invoked"] += 1
        try:
            response = await self._invoke(self.mapping.function, {"Records": batch})
        except FunctionError as e:
            self._stats["function_errors"] += 1
            self._stats["messages_failed"] += len(batch)
            log.info("%s failed on %d messages: %s", self.mapping.function, len(batch), e)
            return
        failed = failed_message_ids(response, batch) if self.mapping.report_item_failures else set()
        done = [r for r in batch if r["messageId"] not in failed]
        self._stats["messages_failed"] += len(batch) - len(done)
        if done:
            await self._delete(done)

    async def _delete(self, records: list[JsonObject]) -> None:
        for i in range(0, len(records), RECEIVE_MAX):
            chunk = records[i : i + RECEIVE_MAX]
            resp = await self._call(
                self._sqs.delete_message_batch,
                QueueUrl=self.mapping.queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": r["receiptHandle"]} for n, r in enumerate(chunk)],
            )
            failed = resp.get("Failed", [])
            for f in failed:
                log.warning("could not delete a message: %s", f.get("Message", f.get("Code")))
            self._stats["messages_deleted"] += len(chunk) - len(failed)

    async def _call(self, fn: Callable[..., T], **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(**kwargs))


def failed_message_ids(response: Any, batch: list[JsonObject]) -> set[str]:
    """The message ids a ReportBatchItemFailures answer reports; every id of the batch when
    the answer is malformed (then the whole batch failed)."""
    everything = {r["messageId"] for r in batch}
    if response is None:
        return set()
    if not isinstance(response, dict):
        return everything
    failures = response.get("batchItemFailures")
    if failures is None:
        return set()
    if not isinstance(failures, list):
        return everything
    failed: set[str] = set()
    for failure in failures:
        ident = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(ident, str) or ident not in everything:
            return everything
        failed.add(ident)
    return failed


def to_event_record(message: JsonObject, queue_arn: str) -> JsonObject:
    """A received message in the form Lambda sends (aws_lambda_events' sqs::SqsMessage)."""
    record: JsonObject = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message.get("Body", ""),
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {
            name: _attribute(value) for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message.get("MD5OfBody"),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def _attribute(value: JsonObject) -> JsonObject:
    out: JsonObject = {
        "stringValue": value.get("StringValue"),
        "binaryValue": _b64(value["BinaryValue"]) if "BinaryValue" in value else None,
        "stringListValues": list(value.get("StringListValues", [])),
        "binaryListValues": [_b64(b) for b in value.get("BinaryListValues", [])],
        "dataType": value.get("DataType"),
    }
    return out


def _b64(raw: bytes | str) -> str:
    return base64.b64encode(raw if isinstance(raw, bytes) else raw.encode()).decode()
