"""Shared fixtures: the DynamoDB-compatible servers (once per session) and a clean AWS env."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from helpers.feeds import start_feed
from helpers.fleet import SHARDS, running_fleet
from hypothesis import settings

from supervisor.devtools.feed import FeedServer
from supervisor.devtools.servers import ServerProcess, start_dynalite, start_moto_server

# Hypothesis fails an example that runs over 200 ms of wall-clock time. The properties here are
# pure code, and on a shared 2-core machine an example is sometimes descheduled for longer than
# that (test_frames failed so, in a run beside other suites): a scheduler delay, not a finding.
# The suite's own time budget is what keeps them fast.
settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """End-to-end tests first, then the other real-time ones, then the rest (a stable sort,
    so each group keeps its order). ``scripts/test.sh`` runs two pytest-xdist workers that
    take tests in this order: the long runs start early, and the short tests fill in around
    them instead of one long run starting last and making the tail of the suite."""

    def group(item: pytest.Item) -> int:
        if item.nodeid.startswith("tests/e2e/"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=group)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[ServerProcess]:
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def dynalite_server() -> Iterator[ServerProcess]:
    server = start_dynalite()
    yield server
    server.stop()


@pytest.fixture(params=["moto", "dynalite"])
def ddb_url(request: pytest.FixtureRequest) -> str:
    """The URL of each server in turn; a server starts only when a test first needs it."""
    server: ServerProcess = request.getfixturevalue(f"{request.param}_server")
    return server.url


@pytest.fixture
def table_name() -> str:
    """A fresh table per test, so tests share servers without any reset."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials, and nothing from the developer's AWS setup that could reach AWS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def feed(nursery) -> AsyncIterator[tuple[FeedServer, str]]:
    """The reference feed (2,000 messages/s per stream) and a child's stream URL template."""
    yield await start_feed(nursery, 2000.0)


@pytest.fixture
async def fleet(tmp_path, ddb_url, table_name, nursery):
    """A feed on 127.0.0.1 and a table; tests start real supervisor processes on them."""
    async with running_fleet(nursery, tmp_path, ddb_url, table_name, SHARDS, rate=200.0) as fleet:
        yield fleet
