"""Unit tests of filters.py: Lambda's filter-pattern rules, and template.yaml's own patterns."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

# tests/ on the path, so that aws_local is importable as a package however pytest is run
# (its modules import each other relatively).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aws_local.filters import (
    FilterPatternError,
    matches,
    parse_pattern,
    passes,
    sqs_record_passes,
    stream_record_passes,
)

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def template_patterns() -> list[dict[str, Any]]:
    """The DispatcherFunction stream mapping's FilterCriteria, read from template.yaml."""
    text = TEMPLATE.read_text()
    section = text[text.index("  DispatcherFunction:") :]
    section = section[: section.index("\n  WakeQueue:")]
    found = re.findall(r"^\s*- Pattern: '(.*)'\s*$", section, re.MULTILINE)
    assert len(found) == 2, found
    return [parse_pattern(p) for p in found]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def ddb_record(
    event_name: str, sk: bytes, new_image: dict[str, Any] | None, seq: str = "100"
) -> dict[str, Any]:
    """A stream record as the function receives it (DynamoDB JSON, base64 binaries)."""
    keys = {"pk": {"B": b64(b"pool-1")}, "sk": {"B": b64(sk)}}
    dynamodb: dict[str, Any] = {
        "ApproximateCreationDateTime": 1700000000,
        "Keys": keys,
        "SequenceNumber": seq,
        "SizeBytes": 20,
        "StreamViewType": "NEW_IMAGE",
    }
    if new_image is not None:
        dynamodb["NewImage"] = {**keys, **new_image}
    return {
        "eventID": "e1",
        "eventName": event_name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": dynamodb,
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:1:table/t/stream/x",
    }


# ---- template.yaml's two patterns ---------------------------------------------------------


class TestTemplatePatterns:
    filters = template_patterns()

    def test_pool_item_with_async_flag_passes(self) -> None:
        rec = ddb_record("MODIFY", b"\x00", {"z": {"N": "1"}, "c": {"N": "3"}})
        assert matches(self.filters[0], rec)
        assert not matches(self.filters[1], rec)
        assert stream_record_passes(self.filters, rec)

    def test_pool_item_without_flag_is_dropped(self) -> None:
        rec = ddb_record("MODIFY", b"\x00", {"c": {"N": "3"}})
        assert not stream_record_passes(self.filters, rec)

    def test_flag_of_another_type_does_not_count(self) -> None:
        # `{"N": [{"exists": true}]}` tests that z is a number, not just that z is there.
        for z in ({"S": "1"}, {"NULL": True}, {"BOOL": True}):
            rec = ddb_record("MODIFY", b"\x00", {"z": z})
            assert not stream_record_passes(self.filters, rec), z

    def test_other_sort_key_with_flag_is_dropped(self) -> None:
        # The binary key is matched as its base64 string: b"\x01" is "AQ==", not "AA==".
        rec = ddb_record("MODIFY", b"\x01", {"z": {"N": "1"}})
        assert not stream_record_passes(self.filters, rec)
        rec = ddb_record("MODIFY", b"\x00\x00", {"z": {"N": "1"}})
        assert not stream_record_passes(self.filters, rec)

    def test_new_ticket_passes_on_insert_only(self) -> None:
        ticket = {"tn": {"N": "42"}}
        assert stream_record_passes(self.filters, ddb_record("INSERT", b"\x01t", ticket))
        assert not stream_record_passes(self.filters, ddb_record("MODIFY", b"\x01t", ticket))
        assert not stream_record_passes(self.filters, ddb_record("INSERT", b"\x01t", {}))

    def test_insert_of_pool_with_flag_passes(self) -> None:
        rec = ddb_record("INSERT", b"\x00", {"z": {"N": "0"}})
        assert stream_record_passes(self.filters, rec)

    def test_remove_has_no_new_image(self) -> None:
        assert not stream_record_passes(self.filters, ddb_record("REMOVE", b"\x00", None))


# ---- equality ------------------------------------------------------------------------------


class TestEquality:
    def test_strings_exact(self) -> None:
        assert matches({"a": ["x", "y"]}, {"a": "y"})
        assert not matches({"a": ["x"]}, {"a": "X"})
        assert not matches({"a": ["x"]}, {"a": "x "})

    def test_empty_string(self) -> None:
        assert matches({"a": [""]}, {"a": ""})
        assert not matches({"a": [""]}, {})

    def test_numbers_and_numeric_strings_differ(self) -> None:
        assert matches({"a": [5]}, {"a": 5})
        assert not matches({"a": [5]}, {"a": "5"})
        assert not matches({"a": ["5"]}, {"a": 5})
        # DynamoDB numbers are strings in the record: match them as strings.
        assert matches({"n": {"N": ["5"]}}, {"n": {"N": "5"}})
        assert not matches({"n": {"N": ["5"]}}, {"n": {"N": "5.0"}})

    def test_booleans_are_not_numbers(self) -> None:
        assert matches({"a": [True]}, {"a": True})
        assert not matches({"a": [True]}, {"a": 1})
        assert not matches({"a": [1]}, {"a": True})
        assert not matches({"a": ["true"]}, {"a": True})

    def test_null(self) -> None:
        assert matches({"a": [None]}, {"a": None})
        assert not matches({"a": [None]}, {})  # a missing key is not null
        assert not matches({"a": [None]}, {"a": ""})

    def test_all_fields_must_match(self) -> None:
        p = {"a": ["1"], "b": ["2"]}
        assert matches(p, {"a": "1", "b": "2", "c": "ignored"})
        assert not matches(p, {"a": "1"})

    def test_nested_objects(self) -> None:
        p = {"x": {"y": {"z": ["v"]}}}
        assert matches(p, {"x": {"y": {"z": "v"}}})
        assert not matches(p, {"x": {"y": "v"}})
        assert not matches(p, {"x": {}})
        assert not matches(p, {})

    def test_empty_value_list_matches_nothing(self) -> None:
        assert not matches({"a": []}, {"a": "x"})


# ---- exists --------------------------------------------------------------------------------


class TestExists:
    def test_true_and_false_on_present_and_missing(self) -> None:
        assert matches({"a": [{"exists": True}]}, {"a": "x"})
        assert not matches({"a": [{"exists": True}]}, {})
        assert matches({"a": [{"exists": False}]}, {})
        assert not matches({"a": [{"exists": False}]}, {"a": "x"})

    def test_false_on_a_missing_parent(self) -> None:
        assert matches({"p": {"a": [{"exists": False}]}}, {})
        assert matches({"p": {"a": [{"exists": False}]}}, {"p": "scalar"})
        assert not matches({"p": {"a": [{"exists": True}]}}, {})

    def test_null_value_exists(self) -> None:
        # A key present with null is a leaf: it exists.
        assert matches({"a": [{"exists": True}]}, {"a": None})
        assert not matches({"a": [{"exists": False}]}, {"a": None})

    def test_only_leaves_exist(self) -> None:
        # event-ruler: exists works on leaf nodes only; an object is not a leaf.
        assert matches({"a": [{"exists": False}]}, {"a": {"b": 1}})
        assert not matches({"a": [{"exists": True}]}, {"a": {"b": 1}})

    def test_empty_array_does_not_exist(self) -> None:
        assert matches({"a": [{"exists": False}]}, {"a": []})
        assert not matches({"a": [{"exists": True}]}, {"a": []})
        assert matches({"a": [{"exists": True}]}, {"a": [1]})

    def test_or_with_a_value(self) -> None:
        p = {"a": ["x", {"exists": False}]}
        assert matches(p, {"a": "x"})
        assert matches(p, {})
        assert not matches(p, {"a": "y"})

    def test_false_is_checked_across_array_elements(self) -> None:
        p = {"l": {"a": [{"exists": False}]}}
        assert not matches(p, {"l": [{"a": 1}, {"b": 2}]})
        assert matches(p, {"l": [{"b": 1}, {"b": 2}]})


# ---- string and numeric operators ----------------------------------------------------------


class TestOperators:
    def test_prefix_suffix(self) -> None:
        assert matches({"r": [{"prefix": "us-"}]}, {"r": "us-east-1"})
        assert not matches({"r": [{"prefix": "us-"}]}, {"r": "eu-west-1"})
        assert matches({"f": [{"suffix": ".png"}]}, {"f": "a.png"})
        assert not matches({"f": [{"suffix": ".png"}]}, {"f": "a.PNG"})
        assert not matches({"n": [{"prefix": "1"}]}, {"n": 12})  # strings only

    def test_equals_ignore_case(self) -> None:
        assert matches({"n": [{"equals-ignore-case": "alice"}]}, {"n": "ALICE"})
        assert not matches({"n": [{"equals-ignore-case": "alice"}]}, {"n": "bob"})
        assert matches({"n": [{"prefix": {"equals-ignore-case": "AL"}}]}, {"n": "alice"})

    def test_anything_but(self) -> None:
        p = {"w": [{"anything-but": ["Raining", "Snow"]}]}
        assert matches(p, {"w": "Sunny"})
        assert not matches(p, {"w": "Raining"})
        assert not matches(p, {})  # anything-but needs a value
        assert matches({"w": [{"anything-but": "Raining"}]}, {"w": "Sunny"})
        assert matches({"n": [{"anything-but": 5}]}, {"n": 6})
        assert not matches({"n": [{"anything-but": 5}]}, {"n": 5})
        assert matches({"s": [{"anything-but": {"prefix": "init"}}]}, {"s": "running"})
        assert not matches({"s": [{"anything-but": {"prefix": "init"}}]}, {"s": "initial"})

    def test_numeric(self) -> None:
        p = {"price": [{"numeric": [">", 10, "<=", 20]}]}
        assert matches(p, {"price": 20})
        assert matches(p, {"price": 10.5})
        assert not matches(p, {"price": 10})
        assert not matches(p, {"price": 21})
        assert matches({"p": [{"numeric": ["=", 100]}]}, {"p": 100})
        assert matches({"p": [{"numeric": ["<", 0]}]}, {"p": -1})
        assert matches({"p": [{"numeric": [">=", 0]}]}, {"p": 0})

    def test_numeric_never_matches_strings(self) -> None:
        # DynamoDB's {"N": "5"} is a string: numeric does not apply to it.
        p = {"n": {"N": [{"numeric": [">", 1]}]}}
        assert not matches(p, {"n": {"N": "5"}})
        assert not matches({"p": [{"numeric": [">", 0]}]}, {"p": True})


# ---- arrays, $or, several filters -----------------------------------------------------------


class TestCombinations:
    def test_event_array_matches_if_any_element_does(self) -> None:
        assert matches({"r": ["b"]}, {"r": ["a", "b"]})
        assert not matches({"r": ["c"]}, {"r": ["a", "b"]})
        assert matches({"r": [{"prefix": "b"}]}, {"r": [["a"], ["bb"]]})

    def test_array_of_objects(self) -> None:
        p = {"items": {"k": ["v"]}}
        assert matches(p, {"items": [{"k": "x"}, {"k": "v"}]})
        assert not matches(p, {"items": [{"k": "x"}]})

    def test_array_element_consistency(self) -> None:
        # Both fields must match in the same element (event-ruler's JSON matcher).
        p = {"items": {"a": ["1"], "b": ["2"]}}
        assert matches(p, {"items": [{"a": "1", "b": "2"}]})
        assert not matches(p, {"items": [{"a": "1", "b": "x"}, {"a": "x", "b": "2"}]})

    def test_dollar_or(self) -> None:
        p = {"src": ["s"], "$or": [{"a": ["1"]}, {"b": ["2"]}]}
        assert matches(p, {"src": "s", "a": "1"})
        assert matches(p, {"src": "s", "b": "2"})
        assert not matches(p, {"src": "s", "a": "2"})
        assert not matches(p, {"a": "1"})

    def test_dollar_or_nested(self) -> None:
        p = {"d": {"$or": [{"x": ["1"]}, {"y": [{"exists": True}]}]}}
        assert matches(p, {"d": {"y": 0}})
        assert not matches(p, {"d": {"z": 0}})

    def test_dollar_or_with_one_object_is_a_field_name(self) -> None:
        assert matches({"$or": {"a": ["1"]}}, {"$or": {"a": "1"}})
        assert not matches({"$or": {"a": ["1"]}}, {"a": "1"})

    def test_several_filters_are_or(self) -> None:
        filters = [{"a": ["1"]}, {"b": ["2"]}]
        assert passes(filters, {"a": "1"})
        assert passes(filters, {"b": "2"})
        assert not passes(filters, {"a": "2", "b": "1"})

    def test_no_filters_pass_everything(self) -> None:
        assert passes([], {"anything": 1})
        assert sqs_record_passes([], {"body": "x"})


# ---- SQS bodies ------------------------------------------------------------------------------


def sqs(body: str) -> dict[str, Any]:
    return {"messageId": "m1", "body": body, "attributes": {"ApproximateReceiveCount": "1"}}


class TestSqsBody:
    def test_json_body_with_json_pattern(self) -> None:
        f = [{"body": {"RequestCode": ["BBBB"]}}]
        assert sqs_record_passes(f, sqs(json.dumps({"RequestCode": "BBBB"})))
        assert not sqs_record_passes(f, sqs(json.dumps({"RequestCode": "AAAA"})))

    def test_plain_body_with_plain_pattern(self) -> None:
        assert sqs_record_passes([{"body": ["wake"]}], sqs("wake"))
        assert sqs_record_passes([{"body": [{"prefix": "wa"}]}], sqs("wake"))

    def test_format_mismatch_drops(self) -> None:
        # Plain body, JSON pattern: dropped; JSON body, plain pattern: dropped.
        assert not sqs_record_passes([{"body": {"a": [{"exists": False}]}}], sqs("not json"))
        assert not sqs_record_passes([{"body": [{"prefix": "{"}]}], sqs('{"a": 1}'))

    def test_no_body_rule_matches_metadata_only(self) -> None:
        f = [{"attributes": {"ApproximateReceiveCount": ["1"]}}]
        assert sqs_record_passes(f, sqs("not json"))
        assert sqs_record_passes(f, sqs('{"a": 1}'))

    def test_numbers_in_json_bodies_are_numbers(self) -> None:
        f = [{"body": {"at": [{"numeric": [">", 100]}]}}]
        assert sqs_record_passes(f, sqs('{"at": 101}'))
        assert not sqs_record_passes(f, sqs('{"at": "101"}'))


# ---- validation -------------------------------------------------------------------------------


class TestValidation:
    @pytest.mark.parametrize(
        "text",
        [
            "not json",
            "[1]",
            '{"a": "x"}',
            '{"a": 1}',
            '{"a": [{"wildcard": "*"}]}',
            '{"a": [{"exists": "yes"}]}',
            '{"a": [{"numeric": [">"]}]}',
            '{"a": [{"numeric": ["!=", 1]}]}',
            '{"a": [{"prefix": 1}]}',
            '{"a": [{"prefix": "x", "suffix": "y"}]}',
            '{"a": [{"anything-but": []}]}',
        ],
    )
    def test_rejected(self, text: str) -> None:
        with pytest.raises(FilterPatternError):
            parse_pattern(text)

    def test_template_patterns_parse(self) -> None:
        assert len(template_patterns()) == 2
