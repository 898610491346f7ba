"""Table administration: create the lease table, add the ``roster`` index to a table made by an
earlier version, wait until both are ACTIVE. The definition is docs/dynamodb-table.md's (the
deploy tests hold the CloudFormation template and the docs to ``roster_index_definition``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from shard_worker.contract import table as t
from supervisor.adapters.lease_store.base import LeaseStoreError, StoreUnavailable, TableMissing
from supervisor.adapters.lease_store.dynamodb.client import DynamoClient, TableInUse

log = logging.getLogger("shardvisor.store")

OP = "ensure_table"  # every request here is counted under the store method that makes it
ACTIVE_DEADLINE = 30.0  # seconds for a new table (or index) to become ACTIVE

# The sparse global secondary index that keeps reconcile reads small: worker items carry
# roster = "worker", unowned shard items roster = "vacant" (removed by a take). Only attributes
# that rarely change are projected, so heartbeats and checkpoints never write to the index.
ROSTER_INDEX = "roster"
ROSTER_PROJECTION = (t.ID, t.KIND, t.EPOCH, t.SUCCESSOR)


def _roster_attribute() -> dict[str, str]:
    return {"AttributeName": t.ROSTER, "AttributeType": "S"}


def roster_index_definition() -> dict[str, Any]:
    return {
        "IndexName": ROSTER_INDEX,
        "KeySchema": [{"AttributeName": t.ROSTER, "KeyType": "HASH"}],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(ROSTER_PROJECTION)},
    }


def table_definition(table: str) -> dict[str, Any]:
    """CreateTable's parameters: ``pk`` only, on demand, with the roster index."""
    return {
        "TableName": table,
        "KeySchema": [{"AttributeName": t.PK, "KeyType": "HASH"}],
        "AttributeDefinitions": [
            {"AttributeName": t.PK, "AttributeType": "S"},
            _roster_attribute(),
        ],
        "GlobalSecondaryIndexes": [roster_index_definition()],
        "BillingMode": "PAY_PER_REQUEST",
    }


def all_active(table: Mapping[str, Any]) -> bool:
    """The table and every index ACTIVE (a new index backfills for a while first)."""
    indexes = table.get("GlobalSecondaryIndexes", [])
    return table.get("TableStatus") == "ACTIVE" and all(
        index.get("IndexStatus", "ACTIVE") == "ACTIVE" for index in indexes
    )


def has_roster(table: Mapping[str, Any]) -> bool:
    return any(i["IndexName"] == ROSTER_INDEX for i in table.get("GlobalSecondaryIndexes", []))


async def ensure_table(db: DynamoClient, create: bool) -> bool:
    """The table with its index, ACTIVE; created (and True) only if missing and ``create``."""
    try:
        table = await _describe(db)
    except TableMissing:
        if not create:
            raise
        created = await _create(db)
        table = await _describe(db)
    else:
        created = False
    if not has_roster(table):
        await _add_roster_index(db, create)
        await _wait_active(db)  # the new index backfills first
        if not has_roster(await _describe(db)):
            raise LeaseStoreError(
                f"table {db.table} at {db.endpoint} accepted the new {ROSTER_INDEX!r} "
                "index but does not list it (dynalite does not implement adding an index "
                "to an existing table); recreate the table with `shardvisor init-table`"
            )
    elif not all_active(table):
        await _wait_active(db)
    return created


async def _describe(db: DynamoClient) -> dict[str, Any]:
    response = await db.request(OP, "describe_table", TableName=db.table)
    return dict(response["Table"])


async def _create(db: DynamoClient) -> bool:
    """CreateTable. False if a peer created it concurrently."""
    try:
        await db.request(OP, "create_table", **table_definition(db.table))
    except TableInUse:
        return False
    return True


async def _add_roster_index(db: DynamoClient, create: bool) -> None:
    """A table made by an earlier version lacks the index: add it (UpdateTable). Items
    written before carry no ``roster`` attribute; full scans still see them."""
    if not create:
        raise TableMissing(
            f"table {db.table} has no {ROSTER_INDEX!r} index; run `shardvisor "
            "init-table` (it adds the index) or set dynamodb.create_table = true"
        )
    log.warning("table %s: adding the %r index", db.table, ROSTER_INDEX)
    index = roster_index_definition()
    try:
        await _update_table_index(db, index)
    except LeaseStoreError as exc:
        if "provisionedThroughput" not in str(exc):
            raise
        # dynalite insists on a throughput even for an on-demand table (DynamoDB and moto
        # do not); the value is ignored by both in PAY_PER_REQUEST mode.
        throughput = {"ReadCapacityUnits": 1, "WriteCapacityUnits": 1}
        await _update_table_index(db, {**index, "ProvisionedThroughput": throughput})


async def _update_table_index(db: DynamoClient, index: dict[str, Any]) -> None:
    await db.request(
        OP,
        "update_table",
        TableName=db.table,
        AttributeDefinitions=[_roster_attribute()],
        GlobalSecondaryIndexUpdates=[{"Create": index}],
    )


async def _wait_active(db: DynamoClient) -> None:
    delay = 0.02
    with trio.move_on_after(ACTIVE_DEADLINE):
        while not all_active(await _describe(db)):
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)
        return
    raise StoreUnavailable(
        f"table {db.table} at {db.endpoint} not ACTIVE after {ACTIVE_DEADLINE:.0f} s"
    )
