"""Shared fixtures: the DynamoDB-compatible servers (once per session) and a clean AWS env."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from servers import ServerProcess, start_dynalite, start_moto_server


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
