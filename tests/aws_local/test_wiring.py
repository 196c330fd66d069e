"""The template wires each function as its code needs: its routes, the variables it reads
at start, the AWS calls it makes. What the code needs is the function manifest
(shared/src/functions.rs, written out as functions.json; Rust tests keep it equal to
ROUTES, config.rs's reads and each main's calls). No stack needed; the session's closing
check (test_zz_session.py) compares the calls the functions really made with it."""

from __future__ import annotations

import base64
import json
import os
import re
from typing import Any

import pytest

from . import calls, policy, template
from .conftest import ROOT
from .test_template import physical

MANIFEST = ROOT / "tests" / "aws_local" / "functions.json"


def manifest() -> dict[str, dict[str, Any]]:
    listed = json.loads(MANIFEST.read_text())["functions"]
    return {f["logical_id"]: f for f in listed}


@pytest.fixture(scope="module")
def tpl() -> template.Template:
    return template.load(ROOT / "template.yaml", ROOT / "target" / "aws-local")


@pytest.fixture(scope="module")
def functions(tpl: template.Template) -> dict[str, template.Function]:
    return {f.logical_id: f for f in tpl.functions(physical(tpl))}


def test_the_manifest_names_every_function_of_the_template(functions: dict[str, template.Function]) -> None:
    assert set(manifest()) == set(functions)


def test_every_route_has_a_function_and_is_the_manifests(
    tpl: template.Template, functions: dict[str, template.Function]
) -> None:
    # Every route of the HttpApi's body (the transform writes one per HttpApi event)
    # integrates a function of the template: routes() would skip one that does not.
    for api in tpl.of_type("AWS::ApiGatewayV2::Api"):
        for path, methods in tpl.properties(api).get("Body", {}).get("paths", {}).items():
            for method, operation in methods.items():
                uri = json.dumps(operation.get("x-amazon-apigateway-integration", {}).get("uri"))
                target = re.search(r"\$\{(\w+)\.Arn\}", uri)
                assert target and target.group(1) in functions, f"{method} {path} has no function"
    in_template = {(r.function, r.method, r.path) for r in tpl.routes()}
    in_manifest = {(fid, r["method"], r["path"]) for fid, f in manifest().items() for r in f["routes"]}
    assert in_template == in_manifest


def test_every_variable_a_function_reads_is_set_for_it(
    tpl: template.Template, functions: dict[str, template.Function]
) -> None:
    read_by_any: set[str] = set()
    for fid, declared in manifest().items():
        environment = functions[fid].environment
        missing = [v for v in declared["env"]["required"] if not environment.get(v)]
        assert missing == [], f"{fid} reads {missing} at start; the template does not set them"
        # And the template sets nothing it never reads (a typo would pass silently): what a
        # function sets for itself is read by it; Globals reach all, so some function reads each.
        known = set(declared["env"]["required"]) | set(declared["env"]["optional"])
        read_by_any |= known
        own = tpl.original["Resources"][fid]["Properties"].get("Environment", {}).get("Variables", {})
        assert set(own) <= known, f"{fid} never reads {sorted(set(own) - known)}"
    for_all = tpl.original.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    assert for_all and set(for_all) <= read_by_any, sorted(set(for_all) - read_by_any)


def check_of(call: dict[str, Any], p: template.Physical) -> policy.Check:
    """The authorization one call of the manifest needs, as the IAM proxy would ask it."""
    on = call["on"]
    if "queue" in on:
        return policy.Check(call["action"], p.attrs[(on["queue"], "Arn")])
    resource = p.attrs[(on["table"], "Arn")] + (f"/index/{on['index']}" if "index" in on else "")
    # A call on any pool carries that pool's key; some are narrowed to keys of their own.
    keys = on.get("leading_keys") or [base64.b64encode(os.urandom(16)).decode()]
    return policy.Check(call["action"], resource, {calls.LEADING_KEYS: keys})


def test_every_call_a_function_makes_is_allowed_by_its_statements(
    tpl: template.Template, functions: dict[str, template.Function]
) -> None:
    p = physical(tpl)
    for fid, declared in manifest().items():
        denied = [
            c for c in declared["calls"] if not policy.allowed(functions[fid].statements, check_of(c, p))
        ]
        assert denied == [], f"{fid}'s statements do not allow {denied}"


def test_no_statement_allows_an_action_the_code_never_calls(
    functions: dict[str, template.Function],
) -> None:
    for fid, declared in manifest().items():
        called = {c["action"].lower() for c in declared["calls"]}
        for statement in functions[fid].statements:
            actions = statement.get("Action", [])
            for action in actions if isinstance(actions, list) else [actions]:
                assert action.lower() in called, f"{fid} may {action} but never calls it"
