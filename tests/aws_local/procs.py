"""Child processes, each in its own process group, so that stopping one stops all it started.

Every child the harness starts (moto, each function's sandboxes) gets a new session: a
Ctrl-C in the terminal reaches only the harness, which then stops them in order, and
`os.killpg` ends a child together with anything it forked. On Linux a child also dies with
the harness (PR_SET_PDEATHSIG), should the harness itself be killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | IO[Any] | None = None,
    cwd: Path | None = None,
    stdout_pipe: bool = False,
) -> asyncio.subprocess.Process:
    """Starts `argv` in a new process group; its output goes to `log` (appended)."""
    out: Any = asyncio.subprocess.DEVNULL
    opened = None
    if isinstance(log, Path):
        opened = out = log.open("ab")
    elif log is not None:
        out = log
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout_pipe else out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        if opened is not None:
            opened.close()


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signals the process group led by `pid` (the child and whatever it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop(process: asyncio.subprocess.Process, grace_s: float = 3.0) -> None:
    """SIGTERM to the child's group, SIGKILL after `grace_s`; waits for the child."""
    if process.returncode is None:
        kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            pass
    # Whatever is left of the group (a child that ignored SIGTERM, or its own children).
    kill_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await process.wait()
