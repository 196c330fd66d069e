"""What the event sources' integration tests share: DynamoDB Local and moto's server as
pytest fixtures, and a fake function that records its events and fails on demand."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from .model import FunctionError, JsonObject

ROOT = Path(__file__).resolve().parents[2]


def _start_dynamodb() -> dict[str, str]:
    out = subprocess.run(
        [str(ROOT / "tests" / "dynamodb-local"), "start"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.split())


def _stop_dynamodb(env: dict[str, str]) -> None:
    subprocess.run(
        [str(ROOT / "tests" / "dynamodb-local"), "stop", env["DYNAMODB_PID"]],
        check=False,
        capture_output=True,
    )


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """Starts moto's server (from the tools venv, the interpreter running the tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"http://127.0.0.1:{port}"


def _wait_moto(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.1)


def _stop_moto(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    """moto's server, one for the session (each test makes queues of its own)."""
    proc, url = _start_moto()
    try:
        _wait_moto(proc, url)
        yield url
    finally:
        _stop_moto(proc)


@pytest.fixture(scope="session")
def servers(sqs_endpoint: str) -> Iterator[tuple[str, str]]:
    """(DynamoDB Local's endpoint, moto's). tests/run's DynamoDB Local when it runs
    one (DYNAMODB_ENDPOINT; each test makes tables of its own), else one started
    for the session, in memory."""
    shared = os.environ.get("DYNAMODB_ENDPOINT")
    if shared:
        yield shared, sqs_endpoint
        return
    env = _start_dynamodb()
    try:
        yield env["DYNAMODB_ENDPOINT"], sqs_endpoint
    finally:
        _stop_dynamodb(env)


def sqs_client(endpoint: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )


def dynamodb_client(endpoint: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )


Behaviour = Callable[[int, JsonObject], JsonObject]


class FakeFunction:
    """Stands for the dispatcher: records every event with the time it came, and answers
    with `behaviour(call_number, event)`, which may raise FunctionError."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or (lambda _n, _e: {})
        self.calls: list[tuple[float, str, JsonObject]] = []

    async def __call__(self, function: str, event: JsonObject) -> JsonObject:
        self.calls.append((time.monotonic(), function, event))
        return self.behaviour(len(self.calls), event)

    @property
    def events(self) -> list[JsonObject]:
        return [event for _, _, event in self.calls]


def fail(message: str = "boom") -> JsonObject:
    raise FunctionError("DispatcherFunction", message)


async def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls `check` until it holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.05)


async def running(
    source_run: Callable[[], Coroutine[Any, Any, None]], body: Callable[[], Awaitable[None]]
) -> None:
    """Runs `body` while an event source runs, then stops the source (as Ctrl-C would)."""
    task = asyncio.create_task(source_run())
    try:
        await body()
        if task.done():
            task.result()  # the source died: show why
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
