"""Table administration: create the lease table, add the ``roster`` index to a table made by an
earlier version, wait until both are ACTIVE. The definition is docs/dynamodb-table.md's (the
deploy tests hold the CloudFormation template and the docs to ``roster_index_definition``).

Protocol 2 (``init-table --protocol 2``): its two indexes, the fleet meta item, the backfill of
``fleet``/``spot`` on items written before, and the flip of the meta item's ``protocol``, made
only when every live worker advertises the feature ``p2`` (docs/lease-protocol.md,
*Compatibility and the rolling deploy*).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from shard_worker.contract import table as t
from shard_worker.contract.table import Item, UpdateItem, number, string
from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
)
from supervisor.adapters.lease_store.dynamodb import codec
from supervisor.adapters.lease_store.dynamodb.client import DynamoClient, TableInUse
from supervisor.core import partition_keys as keys
from supervisor.core.items import ShardItem
from supervisor.core.standby_ring import point

log = logging.getLogger("shardvisor.store")

OP = "ensure_table"  # every request here is counted under the store method that makes it
ACTIVE_DEADLINE = 30.0  # seconds for a new table (or index) to become ACTIVE
FLIP_ATTEMPTS = 3  # checks of the fleet before the flip gives up (the generation kept moving)
BACKFILL_ATTEMPTS = 3  # conditional writes of one item's index keys (it kept changing)

# The sparse global secondary index that keeps reconcile reads small: worker items carry
# roster = "worker", unowned shard items roster = "vacant" (removed by a take). Only attributes
# that rarely change are projected, so heartbeats and checkpoints never write to the index.
ROSTER_INDEX = "roster"
ROSTER_PROJECTION = (t.ID, t.KIND, t.EPOCH, t.SUCCESSOR)


# Protocol 2's indexes (docs/lease-protocol.md, *Fleets of a thousand workers*; the keys are
# supervisor/core/partition_keys.py's). `fleet` lists worker items under `w#NN` with what the
# member list needs, and shard items under `own#<worker>` or `v#NNN` with what routing and a
# take need; `successor` lists the shards addressed to a worker, for its hand-off poll.
# Neither projects what heartbeats (counter) or checkpoints change.
FLEET_INDEX, SUCCESSOR_INDEX = "fleet", "successor"
SHARD_PROJECTION = (t.ID, t.KIND, t.STATE, t.OWNER, t.EPOCH, t.SUCCESSOR, t.HANDOFF_STAGE)
MEMBER_PROJECTION = (t.MAX_SHARDS, t.MAX_STANDBYS, t.FEATURES, t.HELD, t.MGEN)
FLEET_PROJECTION = SHARD_PROJECTION + MEMBER_PROJECTION


def _attribute(name: str) -> dict[str, str]:
    return {"AttributeName": name, "AttributeType": "S"}


def _index(name: str, keys: tuple[str, ...], projection: tuple[str, ...]) -> dict[str, Any]:
    """An index whose key attributes are left out of its NonKeyAttributes (always projected,
    and not accepted there)."""
    projection = tuple(attribute for attribute in projection if attribute not in keys)
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": key, "KeyType": kind}
            for key, kind in zip(keys, ("HASH", "RANGE"), strict=False)
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(projection)},
    }


def roster_index_definition() -> dict[str, Any]:
    return _index(ROSTER_INDEX, (t.ROSTER,), ROSTER_PROJECTION)


def fleet_index_definition() -> dict[str, Any]:
    return _index(FLEET_INDEX, (t.FLEET, t.SPOT), FLEET_PROJECTION)


def successor_index_definition() -> dict[str, Any]:
    return _index(SUCCESSOR_INDEX, (t.SUCCESSOR,), SHARD_PROJECTION)


def _key_attributes(index: Mapping[str, Any]) -> list[dict[str, str]]:
    return [_attribute(key["AttributeName"]) for key in index["KeySchema"]]


def table_definition(table: str, protocol: int = 1) -> dict[str, Any]:
    """CreateTable's parameters: ``pk`` only, on demand, with the roster index (and, for
    protocol 2, its two indexes)."""
    indexes = [roster_index_definition()]
    if protocol >= 2:
        indexes += [fleet_index_definition(), successor_index_definition()]
    attributes = [_attribute(t.PK)]
    for index in indexes:
        attributes += [a for a in _key_attributes(index) if a not in attributes]
    return {
        "TableName": table,
        "KeySchema": [{"AttributeName": t.PK, "KeyType": "HASH"}],
        "AttributeDefinitions": attributes,
        "GlobalSecondaryIndexes": indexes,
        "BillingMode": "PAY_PER_REQUEST",
    }


def all_active(table: Mapping[str, Any]) -> bool:
    """The table and every index ACTIVE (a new index backfills for a while first)."""
    indexes = table.get("GlobalSecondaryIndexes", [])
    return table.get("TableStatus") == "ACTIVE" and all(
        index.get("IndexStatus", "ACTIVE") == "ACTIVE" for index in indexes
    )


def has_index(table: Mapping[str, Any], name: str = ROSTER_INDEX) -> bool:
    return any(i["IndexName"] == name for i in table.get("GlobalSecondaryIndexes", []))


async def ensure_table(db: DynamoClient, create: bool, protocol: int = 1) -> bool:
    """The table with its indexes, ACTIVE; created (and True) only if missing and ``create``.
    ``protocol`` 2 also wants protocol 2's two indexes (added one UpdateTable at a time: an
    UpdateTable may create one index only)."""
    try:
        table = await _describe(db)
    except TableMissing:
        if not create:
            raise
        created = await _create(db, protocol)
        table = await _describe(db)
    else:
        created = False
    wanted = [roster_index_definition()]
    if protocol >= 2:
        wanted += [fleet_index_definition(), successor_index_definition()]
    missing = [index for index in wanted if not has_index(table, index["IndexName"])]
    for index in missing:
        await _add_index(db, index, create)
        await _wait_active(db)  # the new index backfills first
        if not has_index(await _describe(db), index["IndexName"]):
            raise LeaseStoreError(
                f"table {db.table} at {db.endpoint} accepted the new {index['IndexName']!r} "
                "index but does not list it (dynalite does not implement adding an index "
                "to an existing table); recreate the table with `shardvisor init-table`"
            )
    if not missing and not all_active(table):
        await _wait_active(db)
    return created


async def _describe(db: DynamoClient) -> dict[str, Any]:
    response = await db.request(OP, "describe_table", TableName=db.table)
    return dict(response["Table"])


async def _create(db: DynamoClient, protocol: int) -> bool:
    """CreateTable. False if a peer created it concurrently."""
    try:
        await db.request(OP, "create_table", **table_definition(db.table, protocol))
    except TableInUse:
        return False
    return True


async def _add_index(db: DynamoClient, index: dict[str, Any], create: bool) -> None:
    """A table made by an earlier version lacks the index: add it (UpdateTable). Items
    written before carry no key attribute of it; full scans still see them (protocol 2's
    ``init-table`` backfills them)."""
    name = index["IndexName"]
    if not create:
        raise TableMissing(
            f"table {db.table} has no {name!r} index; run `shardvisor "
            "init-table` (it adds the index) or set dynamodb.create_table = true"
        )
    log.warning("table %s: adding the %r index", db.table, name)
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
        AttributeDefinitions=_key_attributes(index),
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


# --- protocol 2: the meta item, the backfill and the flip ---------------------------------


@attrs.frozen
class ProtocolChange:
    """What ``init-table --protocol N`` did."""

    created: bool  # the table was created
    protocol: int  # the protocol the meta item says now
    backfilled: int = 0  # items whose ``fleet``/``spot`` were written
    refused: tuple[str, ...] = ()  # live workers without the feature p2: the flip was refused
    registrations: int = 0  # registration items listed or unlisted to match the shards


async def set_protocol(db: DynamoClient, protocol: int) -> ProtocolChange:
    """The table (with protocol 2's indexes if ``protocol`` is 2) and the meta item, then the
    meta item's ``protocol``: 1 at once (compatibility mode, the rollback), 2 only after the
    backfill and only if every worker item not stopped or dead advertises p2, conditional on
    the generation read before the check (a join in between makes it check again)."""
    created = await ensure_table(db, True, protocol)
    await _ensure_meta(db)
    if protocol < 2:
        await _write_protocol(db, protocol, generation=None)
        return ProtocolChange(created, protocol)
    for _ in range(FLIP_ATTEMPTS):
        generation, current = await read_meta(db)
        backfilled, refused, repaired = await _backfill(db)
        if refused:
            return ProtocolChange(created, current, backfilled, refused, repaired)
        try:
            await _write_protocol(db, protocol, generation)
        except LeaseConflict:
            continue  # the membership changed while we checked: check again
        return ProtocolChange(created, protocol, backfilled, registrations=repaired)
    raise LeaseConflict(
        f"init-table: the fleet's generation moved during each of {FLIP_ATTEMPTS} checks; "
        "run it again when the fleet is quieter"
    )


async def read_meta(db: DynamoClient, *, consistent: bool = True) -> tuple[int, int]:
    """(generation, protocol) of the meta item; (0, 1) while it is absent."""
    response = await db.request(
        OP, "get_item", TableName=db.table, Key=t.meta_key(), ConsistentRead=consistent
    )
    item = response.get("Item", {})
    return codec.read_int(item, t.GENERATION), codec.read_int(item, t.PROTOCOL) or 1


async def _ensure_meta(db: DynamoClient) -> None:
    """The meta item at generation 0 in compatibility mode (protocol 1), if absent."""
    update = UpdateItem(
        t.meta_key(),
        "SET #generation = if_not_exists(#generation, :zero),"
        " #protocol = if_not_exists(#protocol, :one)",
        "",
        {":zero": number(0), ":one": number(1)},
    )
    await db.request(OP, "update_item", **update.params(db.table))


async def _write_protocol(db: DynamoClient, protocol: int, generation: int | None) -> None:
    values = {":protocol": number(protocol)}
    condition = "attribute_exists(pk)"
    if generation is not None:
        condition = "#generation = :generation"
        values[":generation"] = number(generation)
    update = UpdateItem(t.meta_key(), "SET #protocol = :protocol", condition, values)
    await db.request(OP, "update_item", **update.params(db.table))


async def _backfill(db: DynamoClient) -> tuple[int, tuple[str, ...], int]:
    """One consistent Scan of the table: each worker and shard item gets the ``fleet`` and
    ``spot`` its state calls for (one conditional UpdateItem per item that lacks them, the
    page's writes at most the client's concurrency at once), and the registration items are
    made to match the registered shards (``_repair_registrations``). Returns how many items
    were written, the live workers (not stopped or dead) that do not advertise p2, and how
    many registration items were listed or unlisted."""
    written, refused = 0, []
    registered: set[str] = set()  # shards with a spec, not retired
    listed: set[str] = set()  # shards whose registration item is listed
    params: dict[str, Any] = {"TableName": db.table, "ConsistentRead": True}
    while True:
        page = await db.request(OP, "scan", **params)
        items = page.get("Items", [])
        refused += [codec.worker_from(i).id for i in items if _refuses(i)]
        registered |= {s.id for s in map(codec.shard_from, _shards(items)) if _registered(s)}
        listed |= {codec.read_str(i, t.ID) for i in items if _listed_registration(i)}
        stale = [item for item in items if _index_keys(item) != _stored_keys(item)]
        async with trio.open_nursery() as nursery:
            for item in stale:
                nursery.start_soon(_write_keys, db, item)
        written += len(stale)
        if not page.get("LastEvaluatedKey"):
            repaired = await _repair_registrations(db, registered, listed)
            return written, tuple(sorted(refused)), repaired
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _shards(items: list[Item]) -> list[Item]:
    return [item for item in items if codec.kind_of(item) == t.KIND_SHARD]


def _registered(shard: ShardItem) -> bool:
    return bool(shard.spec) and not shard.retired_at


def _listed_registration(item: Item) -> bool:
    return codec.kind_of(item) == t.KIND_REG and t.FLEET in item


async def _repair_registrations(db: DynamoClient, registered: set[str], listed: set[str]) -> int:
    """Registration items for the registered shards that lack one (a `shards add` that
    crashed between its two writes, or one of a version before them), none listed for a
    shard no longer registered, and the meta item's count set to what the scan found (one
    more ``shardgen`` when anything changed). A `shards add` racing this scan may leave the
    count one off until the next run; the count steers balance, never safety."""
    missing, extra = sorted(registered - listed), sorted(listed - registered)
    for shard_id in missing:
        await db.request(OP, "update_item", **registration_update(shard_id).params(db.table))
    for shard_id in extra:
        update = UpdateItem(t.registration_key(shard_id), "REMOVE #fleet", "", {})
        await db.request(OP, "update_item", **update.params(db.table))
    changed = 1 if missing or extra else 0
    update = UpdateItem(
        t.meta_key(),
        "SET #registered_count = :count ADD #shardgen :changed",
        "",
        {":count": number(len(registered)), ":changed": number(changed)},
    )
    await db.request(OP, "update_item", **update.params(db.table))
    return len(missing) + len(extra)


def registration_update(shard_id: str, condition: str = "") -> UpdateItem:
    """List the shard's registration item (``fleet`` and ``spot`` from its ring point)."""
    at = point("s", shard_id)
    return UpdateItem(
        t.registration_key(shard_id),
        "SET #kind = :reg, #id = :id, #fleet = :fleet, #spot = :spot",
        condition,
        {
            ":reg": string(t.KIND_REG),
            ":id": string(shard_id),
            ":fleet": string(keys.registration_key(at)),
            ":spot": string(keys.registration_spot(at)),
        },
    )


def _refuses(item: Item) -> bool:
    if codec.kind_of(item) != t.KIND_WORKER:
        return False
    worker = codec.worker_from(item)
    return worker.state not in (t.STOPPED, t.DEAD) and t.FEATURE_P2 not in worker.features


def _index_keys(item: Item) -> tuple[str | None, str | None]:
    """(fleet, spot) as protocol 2 wants them on this item; (None, None) if it is neither a
    worker nor a shard (the meta item)."""
    kind, name = codec.kind_of(item), codec.read_str(item, t.ID)
    if kind == t.KIND_WORKER:
        return keys.worker_key(name), keys.spot(name)
    if kind == t.KIND_SHARD:
        return keys.shard_fleet_key(codec.shard_from(item)), keys.spot(name)
    if kind == t.KIND_REG:
        return _stored_keys(item)  # its own keys (``_repair_registrations`` lists or unlists)
    return None, None


def _stored_keys(item: Item) -> tuple[str | None, str | None]:
    return codec.read_str(item, t.FLEET) or None, codec.read_str(item, t.SPOT) or None


async def _write_keys(db: DynamoClient, item: Item) -> None:
    """Write ``fleet``/``spot`` conditional on what they were computed from (a shard's owner,
    successor and retirement; a worker's existence); if that changed meanwhile, read the item
    again and retry, a bounded number of times."""
    for _ in range(BACKFILL_ATTEMPTS):
        fleet, spot = _index_keys(item)
        if (fleet, spot) == _stored_keys(item):
            return
        values: dict[str, t.AttributeValue] = {":spot": string(spot or "")}
        update = "SET #spot = :spot"
        if fleet:
            update += ", #fleet = :fleet"
            values[":fleet"] = string(fleet)
        else:
            update += " REMOVE #fleet"
        conditions = ["attribute_exists(pk)"]
        if codec.kind_of(item) == t.KIND_SHARD:
            conditions += [
                t.equal_or_absent(name, item.get(name), values)
                for name in (t.OWNER, t.SUCCESSOR, t.RETIRED_AT)
            ]
        write = UpdateItem({t.PK: item[t.PK]}, update, " AND ".join(conditions), values)
        try:
            await db.request(OP, "update_item", **write.params(db.table))
        except LeaseConflict:
            response = await db.request(
                OP, "get_item", TableName=db.table, Key={t.PK: item[t.PK]}, ConsistentRead=True
            )
            if "Item" not in response:
                return  # deleted meanwhile: nothing to list
            item = response["Item"]
        else:
            return
    raise LeaseConflict(
        f"init-table: item {item[t.PK]['S']} kept changing during the backfill; run it again"
    )
