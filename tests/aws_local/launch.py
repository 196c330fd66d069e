"""`tests/aws-local` started as a child on free ports, for the tests (conftest.py) and
bench.py: ready once it prints its admin line, stopped with SIGTERM as Ctrl-C would."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A clean clone builds the whole workspace first (minutes on 2 cores); after that, seconds.
START_TIMEOUT_S = float(os.environ.get("AWS_LOCAL_START_TIMEOUT", "1800"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NotReady(RuntimeError):
    pass


@contextlib.contextmanager
def running(run_dir: Path, *options: str) -> Iterator[tuple[str, str]]:
    """The stack with `--allow-local-callbacks` and `options`: (front door, admin) URLs."""
    front, admin = free_port(), free_port()
    process = subprocess.Popen(
        [
            str(ROOT / "tests" / "aws-local"),
            "--port",
            str(front),
            "--admin-port",
            str(admin),
            "--allow-local-callbacks",
            "--run-dir",
            str(run_dir),
            *options,
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("admin:"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(START_TIMEOUT_S)
        if not any(line.startswith("admin:") for line in lines):
            raise NotReady(f"tests/aws-local did not get ready: {lines}")
        yield f"http://127.0.0.1:{front}", f"http://127.0.0.1:{admin}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
