"""DynamoLeaseStore beyond the contract: unreachable and hung stores, error mapping, request
counts, credentials for local servers, and items the contract cannot reach.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import boto3
import pytest
import trio
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
)
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.adapters.lease_store.dynamodb.client import DynamoClient, TableInUse
from supervisor.core.items import WorkerItem
from supervisor.devtools.servers import ServerProcess, start_dynalite

REGION = "us-east-1"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_nothing_listening_is_store_unavailable_quickly(table_name: str) -> None:
    url = closed_port_url()
    store = DynamoLeaseStore(table_name, REGION, url)
    start = trio.current_time()
    with trio.fail_after(10), pytest.raises(StoreUnavailable, match=f"snapshot.*{url}"):
        await store.snapshot()
    assert trio.current_time() - start < 5  # three refused attempts with backoff, no hang


async def test_hung_store_is_store_unavailable_after_the_read_timeout(table_name: str) -> None:
    server = await trio.to_thread.run_sync(start_dynalite)
    try:
        store = DynamoLeaseStore(table_name, REGION, server.url)
        await store.ensure_table(create=True)
        server.pause()
        start = trio.current_time()
        with trio.move_on_after(0.3):
            await store.snapshot()
        assert trio.current_time() - start < 1, "a cancelled call must not wait for the thread"
        start = trio.current_time()
        with pytest.raises(StoreUnavailable, match="Read timeout"):
            await store.heartbeat("w1", "s1", "running", 1.0)
        elapsed = trio.current_time() - start
        assert 3 <= elapsed < 20, elapsed  # 3 attempts of 3 s read timeout, plus backoff
        server.resume()
        assert (await store.snapshot()).shards == ()
    finally:
        server.stop()


async def test_request_counts_count_operations(ddb_url: str, table_name: str) -> None:
    store = DynamoLeaseStore(table_name, REGION, ddb_url)
    await store.ensure_table(create=True)
    await store.register_worker(WorkerItem("w1", "s1", 0, "running", 1.0, 1.0))
    await store.heartbeat("w1", "s1", "running", 2.0)
    await store.heartbeat("w1", "s1", "running", 3.0)
    await store.ensure_shard("a")
    with pytest.raises(LeaseConflict):
        await store.checkpoint("a", "w1", 7, {})
    await store.snapshot()
    counts = dict(store.request_counts)
    assert counts.pop("ensure_table") >= 2  # DescribeTable, CreateTable, maybe polls
    assert counts == {
        "register_worker": 2,  # GetItem + conditional PutItem
        "heartbeat": 2,
        "ensure_shard": 1,
        "checkpoint": 1,
        "snapshot": 1,
    }


async def test_concurrent_creators_share_one_table(ddb_url: str, table_name: str) -> None:
    stores = [DynamoLeaseStore(table_name, REGION, ddb_url) for _ in range(3)]
    created: list[bool] = []

    async def ensure(store: DynamoLeaseStore) -> None:
        created.append(await store.ensure_table(create=True))

    async with trio.open_nursery() as nursery:
        for store in stores:
            nursery.start_soon(ensure, store)
    assert created.count(True) == 1  # the others got ResourceInUseException
    assert await stores[0].ensure_table(create=False) is False


async def test_snapshot_reads_every_page_and_ignores_other_kinds(
    ddb_url: str, table_name: str
) -> None:
    store = DynamoLeaseStore(table_name, REGION, ddb_url)
    await store.ensure_table(create=True)
    for shard_id in ("a", "b"):
        await store.ensure_shard(shard_id)
    client = boto3.client("dynamodb", region_name=REGION, endpoint_url=ddb_url)
    filler = "x" * 300_000  # 4 items of 300 kB: a scan needs more than one 1 MB page
    for n in range(4):
        item = {"pk": {"S": f"other#{n}"}, "kind": {"S": "other"}, "blob": {"S": filler}}
        await trio.to_thread.run_sync(
            lambda item=item: client.put_item(TableName=table_name, Item=item)
        )
    snapshot = await store.snapshot()
    assert [s.id for s in snapshot.shards] == ["a", "b"]
    assert snapshot.workers == ()
    assert store.request_counts["snapshot"] >= 2


async def test_dummy_credentials_for_a_local_endpoint(
    dynalite_server: ServerProcess,
    table_name: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    caplog.set_level(logging.DEBUG, logger="shardvisor.store")
    store = DynamoLeaseStore(table_name, REGION, dynalite_server.url)
    assert await store.ensure_table(create=True) is True  # dynalite wants a signature
    assert "dummy" in caplog.text


def client_error(code: str, status: int = 400) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "UpdateItem")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (client_error("ConditionalCheckFailedException"), LeaseConflict),
        (client_error("ResourceNotFoundException"), TableMissing),
        (client_error("ProvisionedThroughputExceededException"), StoreUnavailable),
        (client_error("ThrottlingException"), StoreUnavailable),
        (client_error("RequestLimitExceeded"), StoreUnavailable),
        (client_error("InternalServerError", 500), StoreUnavailable),
        (client_error("ServiceUnavailable", 503), StoreUnavailable),
        (client_error("ValidationException"), LeaseStoreError),
        (client_error("ResourceInUseException"), TableInUse),
        (EndpointConnectionError(endpoint_url="http://x"), StoreUnavailable),
        (ReadTimeoutError(endpoint_url="http://x"), StoreUnavailable),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.__name__,
)
def test_errors_map_to_the_store_errors(exc: Exception, expected: type[Exception]) -> None:
    client = DynamoClient("t", REGION, "http://127.0.0.1:9", max_concurrency=1)
    error = client.translate("take", exc)  # type: ignore[arg-type]
    assert type(error) is expected
    if expected is not LeaseConflict:  # a conflict is routine: no need to say where
        assert "127.0.0.1:9" in str(error)
