"""The table as template.yaml declares it and as the Rust `ensure_table` creates it (for
local-api and the tests) must be one schema: both are created on the stack's DynamoDB Local
and their DescribeTable and DescribeTimeToLive compared, names, ARNs, dates and sizes aside."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from . import awsjson, table, template
from .conftest import ROOT, Stack

# What differs between any two tables, whatever their schema.
_INCIDENTAL = {
    # A guard, not the schema: on in the template (a parameter), off for the tables
    # local-api and the tests create and drop (test_template.py checks the template's).
    "DeletionProtectionEnabled",
    "TableName",
    "TableArn",
    "TableId",
    "CreationDateTime",
    "LatestStreamArn",
    "LatestStreamLabel",
    "ItemCount",
    "TableSizeBytes",
    "IndexArn",
    "IndexSizeBytes",
    "LastUpdateToPayPerRequestDateTime",
    "NumberOfDecreasesToday",
    "LastIncreaseDateTime",
    "LastDecreaseDateTime",
    "TableStatus",
}


def _schema(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _schema(v) for k, v in sorted(value.items()) if k not in _INCIDENTAL}
    if isinstance(value, list):
        return sorted((_schema(v) for v in value), key=repr)
    return value


async def _describe(endpoint: str, name: str) -> tuple[Any, Any]:
    async with aiohttp.ClientSession() as session:
        described = await awsjson.call(session, endpoint, "dynamodb", "DescribeTable", {"TableName": name})
        ttl = await awsjson.call(session, endpoint, "dynamodb", "DescribeTimeToLive", {"TableName": name})
        return _schema(described["Table"]), ttl["TimeToLiveDescription"]


async def _from_template(endpoint: str, name: str) -> None:
    tpl = template.load(ROOT / "template.yaml", ROOT / "target" / "aws-local")
    (rid,) = tpl.of_type("AWS::DynamoDB::Table")
    props = tpl.resolve(tpl.properties(rid), template.Physical(stack_name="schema"))
    async with aiohttp.ClientSession() as session:
        await table.create(session, endpoint, name, props)


def _by_ensure_table(endpoint: str, name: str, local_api: Path) -> None:
    """local-api creates its table with `ensure_table` before it listens."""
    process = subprocess.Popen(
        [str(local_api), "--port", "0", "--dynamodb", endpoint, "--table", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        for line in process.stdout:
            if "listening on" in line:
                return
            assert time.monotonic() < deadline
        raise AssertionError(f"local-api exited ({process.wait()}) before it listened")
    finally:
        process.terminate()
        process.wait(10)


def test_the_template_and_ensure_table_create_one_schema(stack: Stack) -> None:
    described = stack.admin_get("/stack")
    endpoint = described["dynamodb"]
    # The stack's build made local-api beside the functions.
    local_api = Path(described["functions"]["InspectFunction"]["binary"]).parent / "local-api"
    suffix = uuid.uuid4().hex[:8]
    ours, theirs = f"schema-template-{suffix}", f"schema-ensure-table-{suffix}"
    asyncio.run(_from_template(endpoint, ours))
    _by_ensure_table(endpoint, theirs, local_api)
    template_table, template_ttl = asyncio.run(_describe(endpoint, ours))
    rust_table, rust_ttl = asyncio.run(_describe(endpoint, theirs))
    assert rust_table == template_table
    assert rust_ttl == template_ttl
