"""Fixtures: real local-api servers on both stores, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import Proxy, Server

STORES = ["memory", "dynamodb"]


class Servers:
    """local-api servers by store and settings, started when first asked for."""

    def __init__(self) -> None:
        self.running: dict[tuple[str, str], Server] = {}

    def get(self, store: str, max_wait: str = "") -> Server:
        key = (store, max_wait)
        if key not in self.running:
            env = {"MAX_WAIT_SECONDS": max_wait} if max_wait else {}
            self.running[key] = Server(store, env)
        return self.running[key]

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store",
        choices=[*STORES, "both"],
        default="both",
        help="the store of the local-api servers the tests run against (default: both)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses a server runs once per store."""
    if "store" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("store")
        metafunc.parametrize("store", STORES if chosen == "both" else [chosen], scope="session")


@pytest.fixture
def url(servers: Servers, store: str) -> str:
    """A local-api with the default limits (25 s of waiting per call at most)."""
    return servers.get(store).url


@pytest.fixture
def short_wait_url(servers: Servers, store: str) -> str:
    """A local-api that blocks a borrow 0.4 s at most."""
    return servers.get(store, max_wait="0.4").url


@pytest.fixture
def proxies() -> Iterator[list[Proxy]]:
    """Proxies a test starts, closed at its end."""
    started: list[Proxy] = []
    yield started
    for proxy in started:
        proxy.close()
