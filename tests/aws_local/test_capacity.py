"""What the IAM proxy bills each DynamoDB call (capacity.py): DynamoDB Local's own report for
calls that succeed, the item's size for a conditional write that fails."""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from typing import Any

from . import capacity, stream
from .conftest import Stack


def test_item_size_follows_dynamodbs_rules() -> None:
    item = {
        "pk": {"B": base64.b64encode(bytes(16)).decode()},
        "c": {"N": "10004"},  # 5 significant digits: 3 bytes + 1
        "s": {"L": [{"N": "0"}, {"B": base64.b64encode(bytes(10)).decode()}]},
        "x": {"M": {"ab": {"N": "120"}}},
        "t": {"S": "é"},
    }
    # 2+16, 1+4, 1+(3+(1+1)+(10+1)), 1+(3+2+2+1), 1+2
    assert capacity.item_size(item) == 18 + 5 + 17 + 9 + 3


def test_a_failed_conditional_write_is_billed_at_the_size_of_the_item_it_handed_back() -> None:
    big = {"pk": {"B": base64.b64encode(bytes(16)).decode()}, "s": {"S": "x" * 3000}}
    answer = {"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException", "Item": big}
    billed, payload = capacity.bill("UpdateItem", 400, json.dumps(answer).encode(), asked=False)
    assert billed == capacity.Billed(wcu=3)
    assert json.loads(payload) == answer
    no_item = {"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}
    billed, _ = capacity.bill("PutItem", 400, json.dumps(no_item).encode(), asked=False)
    assert billed == capacity.Billed(wcu=1, unsized=True)
    # Other errors bill nothing.
    other = {"__type": "com.amazon.coral.validate#ValidationException", "message": "no"}
    assert capacity.bill("UpdateItem", 400, json.dumps(other).encode(), asked=False)[0] == capacity.Billed()


def test_the_capacity_the_proxy_asked_for_is_taken_out_of_the_answer() -> None:
    sent, asked = capacity.ask("GetItem", json.dumps({"TableName": "t", "Key": {}}).encode())
    assert not asked and json.loads(sent)["ReturnConsumedCapacity"] == "TOTAL"
    answer = {"Item": {}, "ConsumedCapacity": {"TableName": "t", "CapacityUnits": 1.0}}
    billed, payload = capacity.bill("GetItem", 200, json.dumps(answer).encode(), asked=False)
    assert billed == capacity.Billed(rcu=1.0)
    assert json.loads(payload) == {"Item": {}}
    # A caller that asked gets it.
    sent, asked = capacity.ask("UpdateItem", json.dumps({"ReturnConsumedCapacity": "TOTAL"}).encode())
    assert asked
    answer = {"ConsumedCapacity": {"TableName": "t", "CapacityUnits": 2.0}}
    billed, payload = capacity.bill("UpdateItem", 200, json.dumps(answer).encode(), asked=True)
    assert billed == capacity.Billed(wcu=2.0) and json.loads(payload) == answer


def _calls_since(stack: Stack, since: float, function: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = stack.admin_get("/calls")["calls"]
    return [c for c in calls if c["at"] >= since and c["function"] == function and c["service"] == "dynamodb"]


def test_a_borrow_and_a_return_on_a_small_pool_bill_one_unit_a_call(stack: Stack) -> None:
    path = f"/l/{uuid.uuid4()}"
    assert stack.api("PUT", path, {"count": 2}).status == 200
    # Both functions started (each opens its connection at init with one read).
    warm = stack.api("POST", path + "/borrow", {"ttl": 30})
    assert stack.api("POST", path + "/return", {"lease": warm.body["lease"]}).status == 200
    since = time.time()
    borrowed = stack.api("POST", path + "/borrow", {"ttl": 30})
    assert borrowed.status == 200, borrowed
    returned = stack.api("POST", path + "/return", {"lease": borrowed.body["lease"]})
    assert returned.status == 200 and returned.body == {"returned": True}
    for function in ("BorrowFunction", "ReturnFunction"):
        made = {(c["action"], c["wcu"], c["rcu"]) for c in _calls_since(stack, since, function)}
        assert made == {("dynamodb:GetItem", 0.0, 1.0), ("dynamodb:UpdateItem", 1.0, 0.0)}, function


def test_registering_an_existing_pool_bills_its_failed_write_at_the_items_size(stack: Stack) -> None:
    pool = str(uuid.uuid4())
    # The largest pool kept in one item, fully held with day-long leases: over 1 KB.
    assert stack.api("PUT", f"/l/{pool}", {"count": 48}).status == 200
    for _ in range(48):
        assert stack.api("POST", f"/l/{pool}/borrow", {"ttl": 86_400, "wait": 0}).status == 200
    since = time.time()
    again = stack.api("PUT", f"/l/{pool}", {"count": 48})
    assert again.status == 200, again
    failed = [c for c in _calls_since(stack, since, "RegisterFunction") if c["action"] == "dynamodb:PutItem"]
    assert len(failed) == 1 and failed[0]["status"] == 400, failed
    stored = {name: stream.to_wire(value) for name, value in stack.pool_item(pool).items()}
    size = capacity.item_size(stored)
    assert size > 1024
    assert failed[0]["wcu"] == math.ceil(size / 1024) and not failed[0]["unsized"]
