"""The IAM proxy's records and faults, seen through a function's real SDK client."""

from __future__ import annotations

import uuid

from .conftest import Stack, request


def test_calls_are_recorded_per_function(stack: Stack) -> None:
    path = f"/l/{uuid.uuid4()}"
    assert stack.api("PUT", path, {"count": 1}).status == 200
    calls = stack.admin_get("/calls?function=RegisterFunction")["calls"]
    assert calls and all(c["function"] == "RegisterFunction" for c in calls)
    writes = [c for c in calls if c["action"] in ("dynamodb:PutItem", "dynamodb:UpdateItem")]
    assert writes and all(c["allowed"] for c in writes)
    assert all(c["resources"][0].startswith("arn:aws:dynamodb:us-east-1:000000000000:table/") for c in calls)


def test_injected_errors_are_retried_then_answered_502(stack: Stack) -> None:
    path = f"/l/{uuid.uuid4()}"
    assert stack.api("PUT", path, {"count": 1}).status == 200
    # One 500: the SDK retries, the client sees nothing.
    armed = stack.admin_post(
        "/faults", {"function": "InspectFunction", "action": "dynamodb:GetItem", "kind": "error", "count": 1}
    )
    assert armed.status == 201
    assert stack.api("GET", path).status == 200
    # Every read fails (the SDK's retries, then the service's own, to its deadline): 502.
    stack.admin_post(
        "/faults", {"function": "InspectFunction", "action": "GetItem", "kind": "error", "count": 1000}
    )
    failed = stack.api("GET", path)
    assert failed.status == 502 and "error" in failed.body
    assert request(stack.admin + "/faults", "DELETE").body == {"faults": []}
    faulted = [c for c in stack.admin_get("/calls?function=InspectFunction")["calls"] if c["fault"]]
    assert faulted and all(c["status"] == 500 for c in faulted)


def test_admin_invoke_answers_a_function_error_as_lambda_does(stack: Stack) -> None:
    # Not an API Gateway event: lambda_http cannot parse it and the function reports an error.
    answer = stack.admin_post("/invoke/InspectFunction", {"not": "an event"})
    assert answer.status == 200
    assert answer.headers.get("x-amz-function-error") == "Unhandled"
    assert "errorMessage" in answer.body


def test_stats_count_invocations_and_cold_starts(stack: Stack) -> None:
    stack.api("GET", f"/l/{uuid.uuid4()}")
    stats = stack.admin_get("/stats")
    inspect = stats["functions"]["InspectFunction"]
    assert inspect["invocations"] >= 1 and 1 <= inspect["cold_starts"] <= inspect["invocations"]
    assert "DeadLetterQueue" in stats["queues"]
