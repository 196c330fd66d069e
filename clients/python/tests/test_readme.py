"""The README's examples, as a user pastes them: the receiver is examples/receiver.py (which
test_async_mode serves), and the quick start and the asyncio example run against local-api."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from http_semaphore import Client

HERE = Path(__file__).resolve().parents[1]
README = (HERE / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_the_receiver_example_is_the_tested_one() -> None:
    assert (HERE / "examples" / "receiver.py").read_text() in BLOCKS


@pytest.mark.parametrize("title", ["## Quick start", "## asyncio"])
def test_the_examples_run(
    url: str, title: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    section = README[README.index(title) :]
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert code is not None
    pool_id = uuid.uuid4()
    monkeypatch.setenv("SEMAPHORE_URL", url)
    monkeypatch.setenv("SEMAPHORE_POOL", str(pool_id))
    exec(compile(code.group(1), f"README.md {title}", "exec"), {"__name__": "readme"})
    assert "slot 0, fence " in capsys.readouterr().out
    state = Client(url).pool(pool_id).inspect()
    assert (state.count, state.in_use) == (2, 0)
