"""What tests/aws-local runs, as read from template.yaml: the shapes the parts share.

The front door, the runtime emulator, the IAM proxy and the two event sources are
built from these; each is filled in from the template (after the SAM transform), never
repeated by hand.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

JsonObject = dict[str, Any]

# Invokes a function (by its logical id in template.yaml, e.g. "DispatcherFunction")
# with an event, as Lambda does, and returns its JSON response. Raises
# `FunctionError` when the function reports an error, crashes or times out.
Invoke = Callable[[str, JsonObject], Awaitable[JsonObject]]


class FunctionError(Exception):
    """An invocation that failed: the function's error payload, a crash or a timeout."""

    def __init__(self, function: str, message: str, payload: JsonObject | None = None):
        super().__init__(f"{function}: {message}")
        self.function = function
        self.payload = payload or {}


class Throttled(FunctionError):
    """Lambda refused the invocation: the function's reserved concurrency was all in use
    (TooManyRequestsException). API Gateway answers it with its own 500."""


@dataclass(frozen=True)
class StreamMapping:
    """A DynamoDB stream event source (AWS::Lambda::EventSourceMapping on a stream)."""

    function: str
    stream_arn: str
    batch_size: int
    starting_position: str  # LATEST or TRIM_HORIZON
    maximum_retry_attempts: int  # -1: until the record expires
    bisect_on_error: bool
    report_item_failures: bool  # FunctionResponseTypes has ReportBatchItemFailures
    # FilterCriteria.Filters[].Pattern, each parsed from its JSON string.
    filters: list[JsonObject] = field(default_factory=list)
    # DestinationConfig.OnFailure: the queue (URL) that gets a record of a dropped batch.
    on_failure_queue_url: str | None = None


@dataclass(frozen=True)
class QueueMapping:
    """An SQS event source (AWS::Lambda::EventSourceMapping on a queue)."""

    function: str
    queue_url: str
    queue_arn: str
    batch_size: int
    report_item_failures: bool
    filters: list[JsonObject] = field(default_factory=list)
