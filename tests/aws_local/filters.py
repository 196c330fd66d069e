"""Lambda event filtering (FilterCriteria), as an event source mapping applies it.

Rules: https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html
Lambda uses EventBridge's pattern language (the open-source engine is aws/event-ruler):

- A pattern is a JSON object. Its leaves are arrays of allowed values; a field matches if
  ANY entry of its array matches, and an object matches if ALL its fields match.
- Leaf entries: a string, number, boolean or null (equality: exact, character by character;
  a number equals only a number written the same, so 300 is not "300" nor 300.0), or one
  operator object: `prefix`, `suffix`, `equals-ignore-case`, `anything-but`, `numeric`,
  `exists`.
- `"$or": [{...}, {...}]` (two or more objects) is OR between sub-patterns.
- Event arrays are transparent: a field inside an array matches if any element matches.
- `exists` only looks at leaves: a field whose value is an object, or an empty array, does
  not "exist" (event-ruler's README: "Exists match only works on the leaf nodes"). A key
  present with the value null is a leaf: it exists, and `[null]` matches it.
- `numeric` only matches JSON numbers. DynamoDB stream records carry numbers as strings
  (`{"N": "5"}`), so `numeric` never matches them; match them as strings or with `exists`.

A record passes a mapping if ANY of its filters matches (no filters: everything passes).
Records that pass no filter are dropped by Lambda: a stream advances past them, a queue
deletes them.

Where this differs from event-ruler (none of it reachable with the template's patterns):
- Numbers are compared as parsed Python values of the same type, so 3.0e2 equals 300.0
  (event-ruler compares the written form).
- Fields matched inside one array element are matched element by element (as event-ruler's
  JSON matcher does), but `exists: false` is checked over the whole event (absent from
  every element), which is event-ruler's behaviour for absence as far as documented.
- `wildcard` and `cidr` are not supported (the Lambda guide does not list them): a pattern
  using them is rejected, as Lambda rejects an invalid pattern when the mapping is created.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

JsonObject = dict[str, Any]
Path = tuple[str, ...]

_OPERATORS = frozenset({"prefix", "suffix", "equals-ignore-case", "anything-but", "numeric", "exists"})
_NUMERIC_OPS = frozenset({"=", "<", "<=", ">", ">="})


class FilterPatternError(ValueError):
    """A pattern Lambda would refuse when the event source mapping is created."""


# ---- public API ----------------------------------------------------------------------------


def parse_pattern(text: str) -> JsonObject:
    """Parses and validates one FilterCriteria.Filters[].Pattern string."""
    try:
        pattern = json.loads(text)
    except json.JSONDecodeError as e:
        raise FilterPatternError(f"pattern is not JSON: {e}") from e
    validate(pattern)
    assert isinstance(pattern, dict)
    return pattern


def validate(pattern: Any) -> None:
    """Raises FilterPatternError unless `pattern` is a well-formed filter pattern."""
    if not isinstance(pattern, dict):
        raise FilterPatternError("a pattern is a JSON object")
    for key, rule in pattern.items():
        if _is_or(key, rule):
            for alternative in rule:
                validate(alternative)
        elif isinstance(rule, dict):
            validate(rule)
        elif isinstance(rule, list):
            for entry in rule:
                _validate_entry(key, entry)
        else:
            raise FilterPatternError(f"{key}: a leaf must be an array of values, got {rule!r}")


def matches(pattern: JsonObject, event: JsonObject) -> bool:
    """Whether one pattern matches one event (a record, as the function would receive it)."""
    validate(pattern)
    leaf_paths = set(_leaf_paths(event, ()))
    return _match_object(pattern, event, (), leaf_paths)


def passes(filters: list[JsonObject], event: JsonObject) -> bool:
    """Whether a record passes a mapping's filters: any of them matches, or there are none."""
    return not filters or any(matches(p, event) for p in filters)


def stream_record_passes(filters: list[JsonObject], record: JsonObject) -> bool:
    """A DynamoDB stream record, in the event's wire form (DynamoDB JSON under `dynamodb`,
    binaries as base64 strings, numbers as strings): it is matched as it is."""
    return passes(filters, record)


def sqs_record_passes(filters: list[JsonObject], record: JsonObject) -> bool:
    """An SQS record of the event. Its `body` is matched as JSON when it parses as JSON and
    as a plain string otherwise; a filter whose `body` rule has the other form (an object
    for a plain body, an array of values for a JSON body) does not match (the guide's table
    in "Properly filtering Amazon SQS messages": Lambda drops the message)."""
    if not filters:
        return True
    body = record.get("body")
    parsed: Any = None
    body_is_json = False
    if isinstance(body, str):
        try:
            parsed = json.loads(body)
            body_is_json = True
        except json.JSONDecodeError:
            pass
    as_json = {**record, "body": parsed} if body_is_json else record
    for pattern in filters:
        rule = pattern.get("body")
        if rule is not None and isinstance(rule, dict) != body_is_json:
            continue
        if matches(pattern, as_json):
            return True
    return False


# ---- matching ------------------------------------------------------------------------------


class _Missing:
    """No value at a path (distinct from a JSON null, which is a value)."""


_MISSING = _Missing()


def _is_or(key: str, rule: Any) -> bool:
    # event-ruler reads "$or" as OR only when it holds 2+ objects; otherwise it is a field name.
    return (
        key == "$or"
        and isinstance(rule, list)
        and len(rule) >= 2
        and all(isinstance(r, dict) and not (_OPERATORS & r.keys()) for r in rule)
    )


def _match_object(pattern: JsonObject, node: Any, path: Path, leaf_paths: set[Path]) -> bool:
    for key, rule in pattern.items():
        if _is_or(key, rule):
            if not any(_match_object(alt, node, path, leaf_paths) for alt in rule):
                return False
            continue
        child = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        sub = (*path, key)
        if isinstance(rule, dict):
            objects = list(_objects(child))
            if not objects:
                # Nothing below: only rules that accept absence (exists: false) can match.
                if not _match_object(rule, _MISSING, sub, leaf_paths):
                    return False
            elif not any(_match_object(rule, o, sub, leaf_paths) for o in objects):
                return False
        elif not _match_leaf(rule, list(_leaves(child)), sub in leaf_paths):
            return False
    return True


def _match_leaf(rule: list[Any], values: list[Any], present_anywhere: bool) -> bool:
    for entry in rule:
        if isinstance(entry, dict):
            ((op, arg),) = entry.items()
            if op == "exists":
                if bool(values) if arg else not present_anywhere:
                    return True
            elif any(_match_operator(op, arg, v) for v in values):
                return True
        elif any(_equal(entry, v) for v in values):
            return True
    return False


def _match_operator(op: str, arg: Any, value: Any) -> bool:
    if op == "prefix":
        return isinstance(value, str) and _string_op(arg, value, str.startswith)
    if op == "suffix":
        return isinstance(value, str) and _string_op(arg, value, str.endswith)
    if op == "equals-ignore-case":
        return isinstance(value, str) and value.casefold() == str(arg).casefold()
    if op == "numeric":
        return _is_number(value) and _numeric(arg, value)
    if op == "anything-but":
        return _anything_but(arg, value)
    raise FilterPatternError(f"unsupported operator {op!r}")


def _string_op(arg: Any, value: str, test: Any) -> bool:
    # `{"prefix": {"equals-ignore-case": "x"}}` (EventBridge) folds case first.
    if isinstance(arg, dict):
        return bool(test(value.casefold(), str(arg["equals-ignore-case"]).casefold()))
    return bool(test(value, arg))


def _anything_but(arg: Any, value: Any) -> bool:
    # "Matches anything except what's provided": a null or a value of another type too.
    if isinstance(arg, dict):
        ((op, inner),) = arg.items()
        if op == "equals-ignore-case":
            options = inner if isinstance(inner, list) else [inner]
            return not (isinstance(value, str) and value.casefold() in {str(o).casefold() for o in options})
        return not _match_operator(op, inner, value)
    options = arg if isinstance(arg, list) else [arg]
    return not any(_equal(o, value) for o in options)


def _numeric(arg: list[Any], value: float) -> bool:
    for i in range(0, len(arg), 2):
        op, bound = arg[i], arg[i + 1]
        ok = {
            "=": value == bound,
            "<": value < bound,
            "<=": value <= bound,
            ">": value > bound,
            ">=": value >= bound,
        }[op]
        if not ok:
            return False
    return True


def _equal(expected: Any, value: Any) -> bool:
    # Exact: a string equals only a string, a number only a number of the same form, and
    # True is not 1 (Python's bool is an int, so compare types first).
    return type(expected) is type(value) and expected == value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _objects(value: Any) -> Iterator[JsonObject]:
    """The objects at a path, arrays flattened."""
    if isinstance(value, dict):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v)


def _leaves(value: Any) -> Iterator[Any]:
    """The leaf values at a path, arrays flattened; objects are not leaves."""
    if isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif not isinstance(value, (dict, _Missing)):
        yield value


def _leaf_paths(value: Any, path: Path) -> Iterable[Path]:
    """Every path of the event that holds at least one leaf (for `exists: false`)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaf_paths(v, (*path, k))
    elif isinstance(value, list):
        for v in value:
            yield from _leaf_paths(v, path)
    elif path:
        yield path


# ---- validation ----------------------------------------------------------------------------


def _validate_entry(key: str, entry: Any) -> None:
    if entry is None or isinstance(entry, (str, bool, int, float)):
        return
    if not isinstance(entry, dict) or len(entry) != 1:
        raise FilterPatternError(f"{key}: {entry!r} is neither a value nor one operator")
    ((op, arg),) = entry.items()
    if op not in _OPERATORS:
        raise FilterPatternError(f"{key}: unsupported operator {op!r}")
    if op == "exists" and not isinstance(arg, bool):
        raise FilterPatternError(f"{key}: exists takes true or false")
    if op in ("prefix", "suffix") and not (
        isinstance(arg, str) or (isinstance(arg, dict) and arg.keys() == {"equals-ignore-case"})
    ):
        raise FilterPatternError(f"{key}: {op} takes a string")
    if op == "equals-ignore-case" and not isinstance(arg, str):
        raise FilterPatternError(f"{key}: equals-ignore-case takes a string")
    if op == "numeric":
        _validate_numeric(key, arg)
    if op == "anything-but":
        _validate_anything_but(key, arg)


def _validate_numeric(key: str, arg: Any) -> None:
    if not isinstance(arg, list) or not arg or len(arg) % 2 or len(arg) > 4:
        raise FilterPatternError(f"{key}: numeric takes [op, n] or [op, n, op, n]")
    for i in range(0, len(arg), 2):
        if arg[i] not in _NUMERIC_OPS or not _is_number(arg[i + 1]):
            raise FilterPatternError(f"{key}: bad numeric comparison {arg[i : i + 2]!r}")


def _validate_anything_but(key: str, arg: Any) -> None:
    if isinstance(arg, dict):
        if len(arg) != 1 or next(iter(arg)) not in ("prefix", "suffix", "equals-ignore-case"):
            raise FilterPatternError(f"{key}: anything-but takes values, prefix or suffix")
        return
    options = arg if isinstance(arg, list) else [arg]
    if not options or not all(isinstance(o, str) or _is_number(o) for o in options):
        raise FilterPatternError(f"{key}: anything-but takes strings or numbers")
