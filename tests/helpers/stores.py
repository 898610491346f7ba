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


# A race (two handles, one conditional write each: exactly one wins) is proven on the memory
# twin and on the two servers, which serialize writes to an item (moto's server answers one
# request at a time: supervisor/devtools/local_dynamodb.py). moto's in-process mock checks a
# condition and writes without a lock, and the store calls it from several threads, so both
# writes can win there: it cannot tell a race right from wrong, and is left out of races.
atomic_backends = pytest.mark.parametrize(
    "backend", ["memory", "moto-server", "dynalite"], indirect=True
)
