"""What the whole session must leave behind."""

from __future__ import annotations

import pytest

from .conftest import Stack
from .test_wiring import manifest


@pytest.mark.last
def test_no_call_was_denied(stack: Stack) -> None:
    denials = stack.admin_get("/denials")["denials"]
    assert denials == [], "IAM denied calls the functions made (their statements in template.yaml)"


@pytest.mark.last
def test_no_function_crashed_or_timed_out(stack: Stack) -> None:
    functions = stack.admin_get("/stats")["functions"]
    broken = {name: c for name, c in functions.items() if c["crashes"] or c["timeouts"]}
    assert broken == {}


@pytest.mark.last
def test_every_call_a_function_made_is_one_its_manifest_lists(stack: Stack) -> None:
    # The manifest is what the wiring checks hold the template to (test_wiring.py): a call
    # it does not list would go unchecked against the template's statements.
    listed = {fid: {c["action"] for c in f["calls"]} for fid, f in manifest().items()}
    made = {(c["function"], c["action"]) for c in stack.admin_get("/calls")["calls"]}
    assert made, "the session made no AWS call"
    assert {(f, a) for f, a in made if a not in listed.get(f, set())} == set()


@pytest.mark.last
def test_every_event_source_still_polls(stack: Stack) -> None:
    failed = {s["kind"]: s["failed"] for s in stack.stats()["sources"] if s["failed"]}
    assert failed == {}
