"""The lease stores every contract test runs on, as fixtures: the in-memory twin, and
DynamoLeaseStore on moto's in-process mock, on moto's server and on dynalite (both over HTTP on
127.0.0.1). Test modules import the fixtures they use (tests/adapters/test_store_contract.py,
test_fleet_store_contract.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from moto import mock_aws

from supervisor.adapters.lease_store.base import LeaseStore
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.adapters.lease_store.memory import MemoryLeaseStore

REGION = "us-east-1"

StoreFactory = Callable[[], LeaseStore]


@pytest.fixture(params=["memory", "moto-mock", "moto-server", "dynalite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(
    backend: str, request: pytest.FixtureRequest, table_name: str
) -> Iterator[StoreFactory]:
    """Makes stores on one and the same table: each is a separate worker's handle."""
    if backend == "memory":
        yield MemoryLeaseStore().peer
    elif backend == "moto-mock":
        with mock_aws():
            yield lambda: DynamoLeaseStore(table_name, REGION)
    else:
        fixture = "moto_server" if backend == "moto-server" else "dynalite_server"
        url = request.getfixturevalue(fixture).url
        yield lambda: DynamoLeaseStore(table_name, REGION, url)


def racing_writes_not_atomic_on(backend: str, request: pytest.FixtureRequest) -> None:
    """Mark a race test xfail on moto's in-process mock.

    Seen there: about 1 race in 300 lets both conditional writes win. DynamoDB and dynalite
    serialize writes to an item; moto's in-process mock checks the condition and writes
    without a lock, and our store calls it from several threads. (The moto *server* used here
    serves one request at a time and passes: supervisor/devtools/local_dynamodb.py.)
    """
    if backend == "moto-mock":
        request.applymarker(
            pytest.mark.xfail(
                reason="moto's in-process mock: conditional writes not atomic across threads"
            )
        )
