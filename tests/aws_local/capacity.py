"""What DynamoDB bills for one call, counted by the IAM proxy on the wire.

DynamoDB Local reports the capacity a call consumed when asked (`ReturnConsumedCapacity`),
but a conditional write that fails reports none, though DynamoDB bills it: at the size of
the item the condition was checked against, one write unit per started KB. The proxy asks
for the capacity of every call (and strips it from the answer when the function did not
ask), and bills a failed conditional write from the item it handed back (`ALL_OLD`) by
DynamoDB's item-size rules; one that handed back no item is billed one unit and counted
apart (`unsized`).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from .model import JsonObject

_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}
_CONDITION_FAILED = "ConditionalCheckFailedException"


@dataclass(frozen=True)
class Billed:
    wcu: float = 0.0
    rcu: float = 0.0
    # A failed conditional write whose item size was not known (billed 1 unit).
    unsized: bool = False


def value_size(value: JsonObject) -> int:
    """One attribute value's size by DynamoDB's rules (as shared/src/store/dynamodb/size.rs):
    a number is one byte per two significant digits plus one; a map or list is 3 bytes
    plus, per element, its key, its value and one byte; a set the sum of its elements."""
    (kind, inner), *_ = value.items()
    if kind == "S":
        return len(str(inner).encode("utf-8"))
    if kind == "N":
        digits = "".join(c for c in str(inner) if c.isdigit()).strip("0")
        return math.ceil(len(digits) / 2) + 1
    if kind == "B":
        return len(base64.b64decode(inner))
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + value_size(v) + 1 for k, v in inner.items())
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in inner)
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in inner)
    if kind == "NS":
        return sum(value_size({"N": n}) for n in inner)
    if kind == "BS":
        return sum(len(base64.b64decode(b)) for b in inner)
    return 1  # BOOL, NULL


def item_size(item: JsonObject) -> int:
    return sum(len(name.encode("utf-8")) + value_size(value) for name, value in item.items())


def ask(operation: str, body: bytes) -> tuple[bytes, bool]:
    """The request as forwarded (asking for its consumed capacity), and whether the caller
    asked for it itself."""
    if not body:
        return body, False
    parsed = json.loads(body)
    asked = parsed.get("ReturnConsumedCapacity", "NONE") != "NONE"
    if asked or not _reports_capacity(operation):
        return body, asked
    parsed["ReturnConsumedCapacity"] = "TOTAL"
    return json.dumps(parsed).encode("utf-8"), False


def _reports_capacity(operation: str) -> bool:
    return operation in _WRITES | {
        "GetItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "BatchWriteItem",
        "TransactWriteItems",
        "TransactGetItems",
    }


def bill(operation: str, status: int, payload: bytes, asked: bool) -> tuple[Billed, bytes]:
    """What DynamoDB bills for this answer, and the answer as the caller gets it."""
    try:
        parsed: Any = json.loads(payload) if payload else {}
    except ValueError:
        return Billed(), payload
    if not isinstance(parsed, dict):
        return Billed(), payload
    if status != 200:
        kind = str(parsed.get("__type", "")).rpartition("#")[2]
        if kind == _CONDITION_FAILED and operation in _WRITES:
            item = parsed.get("Item")
            if isinstance(item, dict) and item:
                return Billed(wcu=max(1, math.ceil(item_size(item) / 1024))), payload
            return Billed(wcu=1, unsized=True), payload
        return Billed(), payload
    consumed = parsed.get("ConsumedCapacity")
    entries = consumed if isinstance(consumed, list) else [consumed] if isinstance(consumed, dict) else []
    wcu = sum(float(e.get("WriteCapacityUnits", 0) or 0) for e in entries)
    rcu = sum(float(e.get("ReadCapacityUnits", 0) or 0) for e in entries)
    if wcu == 0 and rcu == 0:
        # Only the total is given: a write's units are write units.
        total = sum(float(e.get("CapacityUnits", 0) or 0) for e in entries)
        writes = operation in _WRITES | {"BatchWriteItem", "TransactWriteItems"}
        wcu, rcu = (total, 0.0) if writes else (0.0, total)
    if not asked and "ConsumedCapacity" in parsed:
        del parsed["ConsumedCapacity"]
        payload = json.dumps(parsed).encode("utf-8")
    return Billed(wcu=wcu, rcu=rcu), payload
