"""IAM policy evaluation, as far as the template's statements need it.

An explicit Deny wins; otherwise a request is allowed when an Allow statement matches its
action, its resource and all its conditions. Actions match case-insensitively, resources
case-sensitively, both with `*` and `?` wildcards. Conditions: the String operators with
the ForAllValues / ForAnyValue set qualifiers and IfExists, on the context keys a call
carries (dynamodb:LeadingKeys). An operator this module does not know never matches, so an
unknown condition shows up as a denial rather than passing silently.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from .model import JsonObject


@dataclass(frozen=True)
class Check:
    """One authorization a call needs: an action on a resource, with its context keys."""

    action: str  # e.g. dynamodb:GetItem
    resource: str  # an ARN, or * for actions without one
    context: dict[str, list[str]] = field(default_factory=dict)


def allowed(statements: list[JsonObject], check: Check) -> bool:
    verdict = False
    for statement in statements:
        if not _applies(statement, check):
            continue
        if statement.get("Effect") == "Deny":
            return False
        verdict = True
    return verdict


def _listed(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _glob(pattern: str, value: str, *, fold: bool) -> bool:
    if fold:
        pattern, value = pattern.lower(), value.lower()
    # fnmatch's [...] classes are not IAM's: escape them, keep * and ?.
    regex = fnmatch.translate(re.sub(r"([\[\]])", r"[\1]", pattern))
    return re.match(regex, value, re.DOTALL) is not None


def _names(statement: JsonObject, element: str, value: str, *, fold: bool) -> bool:
    """Whether the statement's `element` (Action, Resource) covers `value`, or its
    `Not…` twin leaves it out; a statement with neither covers nothing."""
    if element in statement:
        return any(_glob(p, value, fold=fold) for p in _listed(statement[element]))
    if f"Not{element}" in statement:
        return not any(_glob(p, value, fold=fold) for p in _listed(statement[f"Not{element}"]))
    return False


def _applies(statement: JsonObject, check: Check) -> bool:
    if not _names(statement, "Action", check.action, fold=True):
        return False
    if not _names(statement, "Resource", check.resource, fold=False):
        return False
    return all(
        _condition(operator, key, _listed(values), check.context.get(key))
        for operator, keys in statement.get("Condition", {}).items()
        for key, values in keys.items()
    )


def _string_test(base: str) -> tuple[bool, bool] | None:
    """(like, negated) for a String operator, None for an operator this module lacks."""
    table = {
        "StringEquals": (False, False),
        "StringNotEquals": (False, True),
        "StringLike": (True, False),
        "StringNotLike": (True, True),
    }
    return table.get(base)


def _condition(operator: str, key: str, wanted: list[str], have: list[str] | None) -> bool:
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    test = _string_test(base)
    if test is None or qualifier not in ("", "ForAllValues", "ForAnyValue"):
        return False
    like, negated = test

    def one(value: str) -> bool:
        hit = any(_glob(w, value, fold=False) if like else w == value for w in wanted)
        return hit != negated

    if qualifier == "ForAllValues":
        # True for a request without the key: IAM's documented (and surprising) rule.
        return all(one(v) for v in have or [])
    if qualifier == "ForAnyValue":
        return any(one(v) for v in have or [])
    if not have:
        return if_exists or negated
    return any(one(v) for v in have)
