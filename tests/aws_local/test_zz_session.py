"""What the whole session must leave behind."""

from __future__ import annotations

import pytest

from .conftest import Stack


@pytest.mark.last
def test_no_call_was_denied(stack: Stack) -> None:
    denials = stack.admin_get("/denials")["denials"]
    assert denials == [], "IAM denied calls the functions made (their statements in template.yaml)"


@pytest.mark.last
def test_no_function_crashed_or_timed_out(stack: Stack) -> None:
    functions = stack.admin_get("/stats")["functions"]
    broken = {name: c for name, c in functions.items() if c["crashes"] or c["timeouts"]}
    assert broken == {}
