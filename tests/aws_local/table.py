"""The table on DynamoDB Local, created from template.yaml's AWS::DynamoDB::Table, not by the
Rust `ensure_table`: keys, attribute definitions, indexes, the stream and TTL as declared.

SSE and point-in-time recovery are left out: they change no schema and DynamoDB Local has
neither. A test (test_schema.py) compares the result with what `ensure_table` creates.
"""

from __future__ import annotations

import asyncio

import aiohttp

from . import awsjson
from .model import JsonObject

# CloudFormation's table properties that CreateTable takes under the same name.
_AS_IS = (
    "AttributeDefinitions",
    "KeySchema",
    "BillingMode",
    "ProvisionedThroughput",
    "LocalSecondaryIndexes",
    "GlobalSecondaryIndexes",
    "TableClass",
    "DeletionProtectionEnabled",
)


def create_table_request(name: str, properties: JsonObject) -> JsonObject:
    """CloudFormation's AWS::DynamoDB::Table properties as a CreateTable request."""
    request: JsonObject = {"TableName": name}
    for key in _AS_IS:
        if key in properties:
            request[key] = properties[key]
    stream = properties.get("StreamSpecification")
    if stream:
        # CloudFormation turns the stream on by naming its view type.
        request["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": stream["StreamViewType"],
        }
    return request


async def create(
    session: aiohttp.ClientSession, endpoint: str, name: str, properties: JsonObject
) -> JsonObject:
    """Creates the table, waits until it is active, turns on its TTL; returns DescribeTable's
    Table (with LatestStreamArn)."""
    await awsjson.call(session, endpoint, "dynamodb", "CreateTable", create_table_request(name, properties))
    ttl = properties.get("TimeToLiveSpecification")
    if ttl:
        await awsjson.call(
            session,
            endpoint,
            "dynamodb",
            "UpdateTimeToLive",
            {
                "TableName": name,
                "TimeToLiveSpecification": {
                    "AttributeName": ttl["AttributeName"],
                    "Enabled": bool(ttl.get("Enabled", False)),
                },
            },
        )
    for _ in range(200):
        described = await awsjson.call(session, endpoint, "dynamodb", "DescribeTable", {"TableName": name})
        table: JsonObject = described["Table"]
        if table.get("TableStatus") == "ACTIVE":
            return table
        await asyncio.sleep(0.05)
    raise RuntimeError(f"table {name} did not become ACTIVE")
