"""What one DynamoDB or SQS call asks IAM for: its actions, resources and context keys.

DynamoDB's and SQS's JSON protocol name the operation in X-Amz-Target
(`DynamoDB_20120810.GetItem`, `AmazonSQS.SendMessage`); SQS's older query protocol names it
in the form field Action. Batch and transaction calls need one authorization per table and
per kind of write, as AWS checks them. `dynamodb:LeadingKeys` is the partition key's value
as sent (base64 for a binary key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from .awsjson import ACCOUNT, REGION
from .model import JsonObject
from .policy import Check

LEADING_KEYS = "dynamodb:LeadingKeys"

# TransactWriteItems' item kinds and the action each needs.
_TRANSACT_WRITE = {
    "ConditionCheck": "ConditionCheckItem",
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
}


@dataclass(frozen=True)
class KeyNames:
    """Each table's partition key name (and each index's, for Query on a GSI)."""

    tables: dict[str, str]
    indexes: dict[tuple[str, str], str]

    def hash_key(self, table: str, index: str | None = None) -> str | None:
        if index is not None and (table, index) in self.indexes:
            return self.indexes[(table, index)]
        return self.tables.get(table)


def table_arn(table: str) -> str:
    return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"


def queue_arn(queue_url: str) -> str:
    name = urlparse(queue_url).path.rstrip("/").rsplit("/", 1)[-1]
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def _table_name(value: str) -> str:
    # TableName may be an ARN (newer SDKs accept either).
    return value.split(":table/", 1)[1].split("/", 1)[0] if ":table/" in value else value


def _scalar(attribute: Any) -> str | None:
    """The value of a DynamoDB attribute value as sent: {"B": "d2Fy..."} → "d2Fy..."."""
    if isinstance(attribute, dict) and len(attribute) == 1:
        ((kind, value),) = attribute.items()
        if kind in ("S", "N", "B"):
            return str(value)
    return None


def _key_of(item: JsonObject | None, hash_key: str | None) -> list[str]:
    if not item or hash_key is None:
        return []
    value = _scalar(item.get(hash_key))
    return [value] if value is not None else []


def _query_keys(body: JsonObject, hash_key: str | None) -> list[str]:
    if hash_key is None:
        return []
    conditions = body.get("KeyConditions")
    if isinstance(conditions, dict) and hash_key in conditions:
        values = conditions[hash_key].get("AttributeValueList", [])
        return [v for v in (_scalar(a) for a in values) if v is not None]
    expression = str(body.get("KeyConditionExpression", ""))
    names = body.get("ExpressionAttributeNames", {})
    values = body.get("ExpressionAttributeValues", {})
    found = []
    for left, right in re.findall(r"([#:]?[\w.]+)\s*=\s*([#:]?[\w.]+)", expression):
        name, placeholder = (left, right) if right.startswith(":") else (right, left)
        if names.get(name, name) == hash_key and placeholder.startswith(":"):
            value = _scalar(values.get(placeholder))
            if value is not None:
                found.append(value)
    return found


def dynamodb_checks(operation: str, body: JsonObject, keys: KeyNames) -> list[Check]:
    action = f"dynamodb:{operation}"

    def check(act: str, table: str, index: str | None, leading: list[str] | None) -> Check:
        resource = table_arn(table) + (f"/index/{index}" if index else "")
        return Check(act, resource, {LEADING_KEYS: leading} if leading else {})

    if operation in ("GetItem", "DeleteItem", "UpdateItem", "PutItem"):
        table = _table_name(str(body.get("TableName", "")))
        item = body.get("Item") if operation == "PutItem" else body.get("Key")
        return [check(action, table, None, _key_of(item, keys.hash_key(table)))]
    if operation in ("Query", "Scan"):
        table = _table_name(str(body.get("TableName", "")))
        index = body.get("IndexName")
        leading = _query_keys(body, keys.hash_key(table, index)) if operation == "Query" else []
        return [check(action, table, index, leading)]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        checks = []
        for raw, request in body.get("RequestItems", {}).items():
            table = _table_name(raw)
            hash_key = keys.hash_key(table)
            keys_sent: list[str] = []
            if operation == "BatchGetItem":
                for key in request.get("Keys", []):
                    keys_sent += _key_of(key, hash_key)
            else:
                for write in request:
                    one = write.get("PutRequest", {}).get("Item") or write.get("DeleteRequest", {}).get("Key")
                    keys_sent += _key_of(one, hash_key)
            checks.append(check(action, table, None, keys_sent))
        return checks
    if operation in ("TransactWriteItems", "TransactGetItems"):
        checks = []
        for entry in body.get("TransactItems", []):
            for kind, part in entry.items():
                act = "GetItem" if kind == "Get" else _TRANSACT_WRITE.get(kind, kind)
                table = _table_name(str(part.get("TableName", "")))
                item = part.get("Item") if kind == "Put" else part.get("Key")
                checks.append(check(f"dynamodb:{act}", table, None, _key_of(item, keys.hash_key(table))))
        return checks
    if "TableName" in body:
        return [check(action, _table_name(str(body["TableName"])), None, None)]
    if "StreamArn" in body:
        return [Check(action, str(body["StreamArn"]))]
    return [Check(action, "*")]


def sqs_checks(operation: str, params: JsonObject, path_url: str | None = None) -> list[Check]:
    """`params`: the JSON body, or the query protocol's form fields."""
    url = params.get("QueueUrl") or path_url
    if url:
        return [Check(f"sqs:{operation}", queue_arn(str(url)))]
    if "QueueName" in params:
        return [Check(f"sqs:{operation}", f"arn:aws:sqs:{REGION}:{ACCOUNT}:{params['QueueName']}")]
    return [Check(f"sqs:{operation}", "*")]
