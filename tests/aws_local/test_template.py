"""template.yaml read as CloudFormation reads it: no stack needed."""

from __future__ import annotations

import re

import pytest

from . import calls, policy, template
from .conftest import ROOT
from .front import match


@pytest.fixture(scope="module")
def tpl() -> template.Template:
    return template.load(ROOT / "template.yaml", ROOT / "target" / "aws-local")


def physical(tpl: template.Template) -> template.Physical:
    p = template.Physical(stack_name="t")
    for rid in tpl.of_type("AWS::DynamoDB::Table"):
        p.refs[rid] = "tbl"
        p.attrs[(rid, "Arn")] = calls.table_arn("tbl")
        p.attrs[(rid, "StreamArn")] = calls.table_arn("tbl") + "/stream/x"
    for rid in tpl.of_type("AWS::SQS::Queue"):
        p.refs[rid] = f"http://q/000000000000/{rid}"
        p.attrs[(rid, "Arn")] = f"arn:aws:sqs:us-east-1:000000000000:{rid}"
    for rid in tpl.of_type("AWS::Lambda::Function"):
        p.refs[rid] = rid
        p.attrs[(rid, "Arn")] = f"arn:aws:lambda:us-east-1:000000000000:function:{rid}"
    return p


def test_every_rust_route_is_in_the_template_and_back(tpl: template.Template) -> None:
    routes_rs = (ROOT / "shared" / "src" / "api" / "routes.rs").read_text()
    rust = set(re.findall(r'"((?:GET|PUT|POST|DELETE) /l/[^"]*)"', routes_rs))
    ours = {r.key for r in tpl.routes()}
    assert ours - {"$default"} == rust
    assert "$default" in ours


def test_functions_get_globals_and_their_own(tpl: template.Template) -> None:
    functions = {f.logical_id: f for f in tpl.functions(physical(tpl))}
    assert len(functions) == 10
    borrow, dispatcher = functions["BorrowFunction"], functions["DispatcherFunction"]
    assert (borrow.timeout_s, borrow.memory_mb, borrow.binary) == (29, 128, "borrow")
    assert borrow.environment["TABLE_NAME"] == "tbl"
    assert borrow.environment["METRICS_NAMESPACE"] == "HttpSemaphore/t"
    assert dispatcher.environment["WAKE_QUEUE_URL"] == "http://q/000000000000/WakeQueue"
    assert dispatcher.timeout_s == 120


def test_mappings(tpl: template.Template) -> None:
    p = physical(tpl)
    (stream,) = tpl.stream_mappings(p)
    assert stream.function == "DispatcherFunction" and stream.stream_arn.endswith("/stream/x")
    assert stream.bisect_on_error and stream.maximum_retry_attempts == 5 and len(stream.filters) == 2
    assert stream.on_failure_queue_url == "http://q/000000000000/DeadLetterQueue"
    (queue,) = tpl.queue_mappings(p)
    assert queue.queue_url.endswith("/WakeQueue") and queue.batch_size == 10


def test_register_may_read_pools_and_delete_only_the_warm_up_key(tpl: template.Template) -> None:
    functions = {f.logical_id: f for f in tpl.functions(physical(tpl))}
    keys = calls.KeyNames({"tbl": "pk"}, {})

    def get(function: str, key: str) -> bool:
        body = {"TableName": "tbl", "Key": {"pk": {"B": key}, "sk": {"B": "AA=="}}}
        statements = functions[function].statements
        return all(policy.allowed(statements, c) for c in calls.dynamodb_checks("GetItem", body, keys))

    # Register re-reads the pool item after a write whose outcome is unknown.
    assert get("RegisterFunction", "d2FybS11cA==")
    assert get("RegisterFunction", "AAECAwQFBgcICQoLDA0ODw==")
    # Delete never reads a pool: only the warm-up key that opens its connection.
    assert get("DeleteFunction", "d2FybS11cA==")
    assert not get("DeleteFunction", "AAECAwQFBgcICQoLDA0ODw==")


def test_query_needs_the_index_arn(tpl: template.Template) -> None:
    functions = {f.logical_id: f for f in tpl.functions(physical(tpl))}
    keys = calls.KeyNames({"tbl": "pk"}, {("tbl", "by_ticket"): "pk"})
    body = {
        "TableName": "tbl",
        "IndexName": "by_ticket",
        "KeyConditionExpression": "#p = :p",
        "ExpressionAttributeNames": {"#p": "pk"},
        "ExpressionAttributeValues": {":p": {"B": "AA=="}},
    }
    (check,) = calls.dynamodb_checks("Query", body, keys)
    assert check.resource.endswith("table/tbl/index/by_ticket")
    assert check.context == {"dynamodb:LeadingKeys": ["AA=="]}
    assert policy.allowed(functions["BorrowFunction"].statements, check)
    assert not policy.allowed(functions["ReturnFunction"].statements, check)


def test_route_matching() -> None:
    routes = [
        template.Route("GET", "/l/{id}", "Inspect"),
        template.Route("POST", "/l/{id}/borrow", "Borrow"),
        template.Route("ANY", "$default", "Fallback"),
    ]
    found = match(routes, "GET", "/l/ab%2Dcd")
    assert found is not None and found.route.function == "Inspect" and found.parameters == {"id": "ab-cd"}
    assert match(routes, "GET", "/l/x/borrow").route.function == "Fallback"  # type: ignore[union-attr]
    assert match(routes, "GET", "/l/").route.function == "Fallback"  # type: ignore[union-attr]


# Managed policies whose statements name every stream or every queue of the account.
WILDCARD_MANAGED = ("AWSLambdaDynamoDBExecutionRole", "AWSLambdaSQSQueueExecutionRole")


def test_no_role_of_the_transformed_template_allows_every_resource(tpl: template.Template) -> None:
    """Least privilege, as SAM's translator writes the roles: no statement on `*`, and none
    of the managed policies SAM attaches for event sources (they grant every stream and
    every queue of the account)."""
    roles = tpl.of_type("AWS::IAM::Role")
    assert roles
    for rid in roles:
        props = tpl.transformed["Resources"][rid]["Properties"]
        for policy_ in props.get("Policies", []):
            listed = policy_["PolicyDocument"]["Statement"]
            for statement in listed if isinstance(listed, list) else [listed]:
                resources = statement.get("Resource", [])
                for resource in resources if isinstance(resources, list) else [resources]:
                    assert resource != "*", f"{rid} {policy_['PolicyName']}: {statement}"
        for arn in props.get("ManagedPolicyArns", []):
            text = str(arn)
            assert not any(name in text for name in WILDCARD_MANAGED), f"{rid} attaches {text}"


def test_the_table_is_protected_from_deletion_by_default(tpl: template.Template) -> None:
    table = tpl.original["Resources"]["PoolTable"]
    assert table["DeletionPolicy"] == "Retain"
    assert table["Properties"]["DeletionProtectionEnabled"] == {"Ref": "DeletionProtection"}
    assert tpl.original["Parameters"]["DeletionProtection"]["Default"] == "true"


def test_every_function_has_its_errors_and_throttles_alarmed(tpl: template.Template) -> None:
    """Each function's Errors and Throttles are in some alarm, and so are the stream's
    iterator age, the wake queue's oldest message and the dead-letter queue."""
    watched: set[tuple[str, str]] = set()
    for rid in tpl.of_type("AWS::CloudWatch::Alarm"):
        props = tpl.original["Resources"][rid]["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        if "MetricName" in props:
            stats.append(props)
        for metric in stats:
            for dimension in metric.get("Dimensions", []):
                value = dimension["Value"]
                if not isinstance(value, dict):
                    continue
                getatt = value.get("Fn::GetAtt", [None])
                target = value.get("Ref") or (getatt.split(".")[0] if isinstance(getatt, str) else getatt[0])
                watched.add((metric["MetricName"], str(target)))
    for fid in tpl.of_type("AWS::Lambda::Function"):
        for metric in ("Errors", "Throttles"):
            assert (metric, fid) in watched, f"no alarm on {fid}'s {metric}"
    assert ("IteratorAge", "DispatcherFunction") in watched
    assert ("ApproximateAgeOfOldestMessage", "WakeQueue") in watched
    assert ("ApproximateNumberOfMessagesVisible", "DeadLetterQueue") in watched


def test_admin_auth_puts_put_and_delete_alone_behind_iam() -> None:
    """`AdminAuth` (default NONE, the contract): AWS_IAM signs PUT and DELETE /l/{id} alone."""
    tpl = template.load(ROOT / "template.yaml", ROOT / "target" / "aws-local")
    assert {r.authorization for r in tpl.routes()} == {"NONE"}
    tpl.override({"AdminAuth": "AWS_IAM"})
    behind = {r.key for r in tpl.routes() if r.authorization == "AWS_IAM"}
    assert behind == {"PUT /l/{id}", "DELETE /l/{id}"}
