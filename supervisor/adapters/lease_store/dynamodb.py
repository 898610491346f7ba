"""The lease store on DynamoDB: boto3's low-level client, each request in a trio worker thread.

Every request goes through ``DynamoLeaseStore._request``, the one place that counts it, bounds
the concurrency and maps botocore's errors to the store's, so callers only see LeaseStoreErrors.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import boto3
import botocore.loaders
import botocore.session
import trio
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
)
from supervisor.core.items import ShardItem, Snapshot, VacantShard, WorkerItem

log = logging.getLogger("shardvisor.store")

T = TypeVar("T")
AttributeValue = dict[str, Any]  # typed, as the low-level client speaks: {"S": "x"}, {"N": "1"}
Item = dict[str, AttributeValue]

_THROTTLING = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
_ACTIVE_DEADLINE = 30.0  # seconds for a new table to become ACTIVE
_REGISTER_ATTEMPTS = 5  # read-then-conditional-put rounds before register_worker gives up
_SAME_OWNER_AND_EPOCH = "#owner = :me AND #epoch = :epoch"
_BATCH_GET_KEYS = 100  # BatchGetItem's limit per request
_BATCH_GET_ROUNDS = 4  # rounds of UnprocessedKeys before giving up (then StoreUnavailable)
_INDEX_PAGES = 50  # pages of one index query before giving up: a runaway table, not a roster

# The sparse global secondary index that keeps reconcile reads small: worker items carry
# roster = "worker", unowned shard items roster = "vacant" (removed by a take). Only attributes
# that rarely change are projected, so heartbeats and checkpoints never write to the index.
ROSTER_INDEX = "roster"
ROSTER_PROJECTION = ("id", "kind", "epoch", "successor")
_ROSTER_WORKER, _ROSTER_VACANT = "worker", "vacant"


def _all_active(table: Mapping[str, Any]) -> bool:
    """The table and every index ACTIVE (a new index backfills for a while first)."""
    indexes = table.get("GlobalSecondaryIndexes", [])
    return table.get("TableStatus") == "ACTIVE" and all(
        index.get("IndexStatus", "ACTIVE") == "ACTIVE" for index in indexes
    )


def _has_roster(table: Mapping[str, Any]) -> bool:
    return any(i["IndexName"] == ROSTER_INDEX for i in table.get("GlobalSecondaryIndexes", []))


def roster_index_definition() -> dict[str, Any]:
    return {
        "IndexName": ROSTER_INDEX,
        "KeySchema": [{"AttributeName": "roster", "KeyType": "HASH"}],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(ROSTER_PROJECTION)},
    }


def _error_kind(exc: ClientError | BotoCoreError, translated: LeaseStoreError) -> str:
    """A metric label: throttled, unavailable, conflict or other."""
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else ""
    if code in _THROTTLING:
        return "throttled"
    if isinstance(translated, StoreUnavailable):
        return "unavailable"
    if isinstance(translated, LeaseConflict):
        return "conflict"
    return "other"


def _client_config(max_concurrency: int) -> Config:
    # Short timeouts: a lease store that does not answer within seconds is as good as down,
    # and the caller must learn it well before its leases run out.
    return Config(
        connect_timeout=1,
        read_timeout=3,
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=max(max_concurrency, 1),
    )


@functools.cache
def _data_loader() -> botocore.loaders.Loader:
    """Parse botocore's service models once per process, not once per store (~60 ms each)."""
    return botocore.loaders.create_loader()


def _make_client(region: str, endpoint_url: str, max_concurrency: int) -> Any:
    """One client per store; dummy credentials for a local endpoint when boto3 has none."""
    core = botocore.session.get_session()  # a fresh session: credentials as of now
    core.register_component("data_loader", _data_loader())
    session = boto3.session.Session(region_name=region, botocore_session=core)
    kwargs: dict[str, Any] = {}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
        if session.get_credentials() is None:
            # Local DynamoDB servers check the signature's presence, not the credentials.
            log.debug("no AWS credentials found; using dummy ones for %s", endpoint_url)
            kwargs.update(aws_access_key_id="local", aws_secret_access_key="local")
    return session.client("dynamodb", config=_client_config(max_concurrency), **kwargs)


# --- AttributeValue conversions -------------------------------------------------------------


def _s(value: str) -> AttributeValue:
    return {"S": value}


def _n(value: float) -> AttributeValue:
    return {"N": str(value) if isinstance(value, int) else repr(float(value))}


def _checkpoint_value(checkpoint: Mapping[str, int]) -> AttributeValue:
    return {"M": {stream: {"N": str(int(pos))} for stream, pos in checkpoint.items()}}


def _names(*names: str) -> dict[str, str]:
    """ExpressionAttributeNames for every attribute: `owner`, `state`... are reserved words."""
    return {f"#{name}": name for name in names}


def _key(kind: str, item_id: str) -> Item:
    return {"pk": _s(f"{kind}#{item_id}")}


def _with_strings(item: Item, **strings: str) -> Item:
    """Add the non-empty strings only: dynalite rejects empty ones, and absent reads back as ""."""
    item.update({name: _s(value) for name, value in strings.items() if value})
    return item


def _worker_item(worker: WorkerItem) -> Item:
    item = {
        **_key("worker", worker.id),
        "kind": _s("worker"),
        "id": _s(worker.id),
        "counter": _n(worker.counter),
        "heartbeat_at": _n(worker.heartbeat_at),
        "started_at": _n(worker.started_at),
        "pid": _n(worker.pid),
        "max_shards": _n(worker.max_shards),
        "mailbox": _n(worker.mailbox),
        "roster": _s(_ROSTER_WORKER),
    }
    return _with_strings(item, session=worker.session, state=worker.state, host=worker.host)


def _new_shard_item(shard_id: str) -> Item:
    return {
        **_key("shard", shard_id),
        "kind": _s("shard"),
        "id": _s(shard_id),
        "epoch": _n(0),
        "checkpoint": _checkpoint_value({}),
        "roster": _s(_ROSTER_VACANT),
    }


def _str(item: Item, name: str) -> str:
    return str(item[name]["S"]) if name in item else ""


def _int(item: Item, name: str) -> int:
    return int(item[name]["N"]) if name in item else 0


def _float(item: Item, name: str) -> float:
    return float(item[name]["N"]) if name in item else 0.0


@contextlib.contextmanager
def _decoding(item: Item) -> Iterator[None]:
    """A malformed item is the store's fault, not a crash of the caller."""
    try:
        yield
    except (KeyError, ValueError, TypeError) as exc:
        raise LeaseStoreError(f"malformed item {item.get('pk')!r}: {exc!r}") from exc


def _worker_from(item: Item) -> WorkerItem:
    with _decoding(item):
        return WorkerItem(
            id=_str(item, "id"),
            session=_str(item, "session"),
            counter=_int(item, "counter"),
            state=_str(item, "state"),
            heartbeat_at=_float(item, "heartbeat_at"),
            started_at=_float(item, "started_at"),
            host=_str(item, "host"),
            pid=_int(item, "pid"),
            drain_requested=_float(item, "drain_requested"),
            max_shards=_int(item, "max_shards"),
            mailbox=_int(item, "mailbox"),
        )


def _shard_from(item: Item) -> ShardItem:
    with _decoding(item):
        checkpoint = item.get("checkpoint", {"M": {}})["M"]
        return ShardItem(
            id=_str(item, "id"),
            owner=_str(item, "owner"),
            epoch=_int(item, "epoch"),
            checkpoint={stream: int(pos["N"]) for stream, pos in checkpoint.items()},
            owner_since=_float(item, "owner_since"),
            state=_str(item, "state"),
            release_requested=_float(item, "release_requested"),
            successor=_str(item, "successor"),
            spec=_str(item, "spec"),
            retired_at=_float(item, "retired_at"),
        )


def _vacant_from(item: Item) -> VacantShard:
    with _decoding(item):
        return VacantShard(
            id=_str(item, "id"), epoch=_int(item, "epoch"), successor=_str(item, "successor")
        )


class DynamoLeaseStore:
    """The LeaseStore on one DynamoDB table (``base.LeaseStore`` says what each method means)."""

    def __init__(
        self, table: str, region: str, endpoint_url: str = "", *, max_concurrency: int = 8
    ) -> None:
        self.table = table
        self.region = region
        self._client = _make_client(region, endpoint_url, max_concurrency)
        self.endpoint = str(self._client.meta.endpoint_url)
        self._limiter = trio.CapacityLimiter(max_concurrency)
        # DynamoDB requests made, per store method (snapshot counts one per page).
        self.request_counts: collections.Counter[str] = collections.Counter()
        # Called after every request: (operation, seconds, error kind or ""); for metrics.
        self.observer: Callable[[str, float, str], None] | None = None

    def __repr__(self) -> str:
        return f"DynamoLeaseStore({self.table!r}, {self.region!r}, {self.endpoint!r})"

    async def _request(self, op: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run one blocking client call in a worker thread, mapping its errors once.

        abandon_on_cancel: a cancelled caller (shutdown, a lease deadline) returns at once
        instead of waiting out the read timeout and retries; the thread keeps its limiter
        token until the call really ends, so the concurrency stays bounded.
        """
        self.request_counts[op] += 1
        started = time.monotonic()
        error = ""
        try:
            return await trio.to_thread.run_sync(
                functools.partial(fn, **kwargs), limiter=self._limiter, abandon_on_cancel=True
            )
        except (ClientError, BotoCoreError) as exc:
            translated = self._translate(op, exc)
            error = _error_kind(exc, translated)
            raise translated from exc
        finally:
            if self.observer is not None:
                self.observer(op, time.monotonic() - started, error)

    def _translate(self, op: str, exc: ClientError | BotoCoreError) -> LeaseStoreError:
        """The one mapping from botocore's errors to the store's."""
        if isinstance(exc, BotoCoreError):
            return StoreUnavailable(f"{op}: {self.endpoint} unreachable: {exc}")
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code == "ConditionalCheckFailedException":
            return LeaseConflict(f"{op}: condition failed on table {self.table}")
        if code == "ResourceNotFoundException":
            return TableMissing(
                f"table {self.table} does not exist in {self.region} at {self.endpoint}; "
                "run `shardvisor init-table` or set dynamodb.create_table = true"
            )
        if code in _THROTTLING or status >= 500:
            return StoreUnavailable(
                f"{op}: {self.endpoint} refused for now: {code} (HTTP {status})"
            )
        return LeaseStoreError(f"{op}: {self.endpoint} failed: {code}: {error.get('Message', '')}")

    # --- table ------------------------------------------------------------------------------

    async def ensure_table(self, create: bool) -> bool:
        try:
            table = await self._describe()
        except TableMissing:
            if not create:
                raise
            created = await self._request("ensure_table", self._create_table)
            table = await self._describe()
        else:
            created = False
        if not _has_roster(table):
            await self._add_roster_index(create)
            await self._wait_active()  # the new index backfills first
            if not _has_roster(await self._describe()):
                raise LeaseStoreError(
                    f"table {self.table} at {self.endpoint} accepted the new {ROSTER_INDEX!r} "
                    "index but does not list it (dynalite does not implement adding an index "
                    "to an existing table); recreate the table with `shardvisor init-table`"
                )
        elif not _all_active(table):
            await self._wait_active()
        return created

    async def _describe(self) -> dict[str, Any]:
        response = await self._request(
            "ensure_table", self._client.describe_table, TableName=self.table
        )
        return dict(response["Table"])

    async def _add_roster_index(self, create: bool) -> None:
        """A table made by an earlier version lacks the index: add it (UpdateTable).
        Items written before carry no ``roster`` attribute; full scans still see them."""
        if not create:
            raise TableMissing(
                f"table {self.table} has no {ROSTER_INDEX!r} index; run `shardvisor "
                "init-table` (it adds the index) or set dynamodb.create_table = true"
            )
        log.warning("table %s: adding the %r index", self.table, ROSTER_INDEX)
        index = roster_index_definition()
        try:
            await self._request("ensure_table", self._update_table_index, index=index)
        except LeaseStoreError as exc:
            if "provisionedThroughput" not in str(exc):
                raise
            # dynalite insists on a throughput even for an on-demand table (DynamoDB and moto
            # do not); the value is ignored by both in PAY_PER_REQUEST mode.
            throughput = {"ReadCapacityUnits": 1, "WriteCapacityUnits": 1}
            await self._request(
                "ensure_table",
                self._update_table_index,
                index={**index, "ProvisionedThroughput": throughput},
            )

    def _update_table_index(self, index: dict[str, Any]) -> None:
        self._client.update_table(
            TableName=self.table,
            AttributeDefinitions=[{"AttributeName": "roster", "AttributeType": "S"}],
            GlobalSecondaryIndexUpdates=[{"Create": index}],
        )

    def _create_table(self) -> bool:
        """CreateTable (in a worker thread). False if a peer created it concurrently."""
        try:
            self._client.create_table(
                TableName=self.table,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "roster", "AttributeType": "S"},
                ],
                GlobalSecondaryIndexes=[roster_index_definition()],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
                return False
            raise
        return True

    async def _wait_active(self) -> None:
        delay = 0.02
        with trio.move_on_after(_ACTIVE_DEADLINE):
            while not _all_active(await self._describe()):
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
            return
        raise StoreUnavailable(
            f"table {self.table} at {self.endpoint} not ACTIVE after {_ACTIVE_DEADLINE:.0f} s"
        )

    # --- workers ----------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerItem) -> WorkerItem:
        for _ in range(_REGISTER_ATTEMPTS):
            response = await self._request(
                "register_worker",
                self._client.get_item,
                TableName=self.table,
                Key=_key("worker", worker.id),
                ConsistentRead=True,
            )
            old = response.get("Item")
            if old is None:
                new, condition = worker, {"ConditionExpression": "attribute_not_exists(pk)"}
            else:
                # Counters never go backwards: peers watching ours must see it change.
                counter = max(worker.counter, _worker_from(old).counter + 1)
                new = attrs.evolve(worker, counter=counter)
                condition = {
                    "ConditionExpression": "#counter = :old",
                    "ExpressionAttributeNames": _names("counter"),
                    "ExpressionAttributeValues": {":old": old.get("counter", _n(0))},
                }
            try:
                await self._request(
                    "register_worker",
                    self._client.put_item,
                    TableName=self.table,
                    Item=_worker_item(new),
                    **condition,
                )
            except LeaseConflict:
                continue  # a heartbeat of the earlier incarnation came between: read again
            return new
        raise LeaseConflict(
            f"register_worker: worker item {worker.id} kept changing; "
            f"gave up after {_REGISTER_ATTEMPTS} attempts"
        )

    async def heartbeat(self, worker_id: str, session: str, state: str, wall_now: float) -> int:
        response = await self._update_own_worker("heartbeat", worker_id, session, state, wall_now)
        return int(response["Attributes"]["counter"]["N"])

    async def retire_worker(self, worker_id: str, session: str, wall_now: float) -> None:
        await self._update_own_worker("retire_worker", worker_id, session, "stopped", wall_now)

    async def request_drain(self, worker_id: str, wall_now: float, *, undo: bool = False) -> None:
        await self._request(
            "request_drain",
            self._client.update_item,
            TableName=self.table,
            Key=_key("worker", worker_id),
            UpdateExpression="SET #drain_requested = :when",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames=_names("drain_requested"),
            ExpressionAttributeValues={":when": _n(0 if undo else wall_now)},
        )

    async def request_release(self, shard_id: str, wall_now: float) -> str:
        response = await self._request(
            "request_release",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression="SET #release_requested = :when",
            ConditionExpression="attribute_exists(#owner)",
            ExpressionAttributeNames=_names("release_requested", "owner"),
            ExpressionAttributeValues={":when": _n(wall_now)},
            ReturnValues="ALL_NEW",
        )
        return _str(response["Attributes"], "owner")

    async def poke(self, worker_id: str) -> None:
        await self._request(
            "poke",
            self._client.update_item,
            TableName=self.table,
            Key=_key("worker", worker_id),
            UpdateExpression="ADD #mailbox :one",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames=_names("mailbox"),
            ExpressionAttributeValues={":one": _n(1)},
        )

    async def read_workers(self) -> tuple[WorkerItem, ...]:
        listed = await self._query_roster("read_workers", _ROSTER_WORKER)
        keys = [{"pk": item["pk"]} for item in listed]
        workers: list[WorkerItem] = []
        for start in range(0, len(keys), _BATCH_GET_KEYS):
            items = await self._batch_get(keys[start : start + _BATCH_GET_KEYS])
            workers += [_worker_from(item) for item in items]
        return tuple(sorted(workers, key=lambda w: w.id))

    async def vacant_shards(self) -> tuple[VacantShard, ...]:
        found = [
            _vacant_from(item) for item in await self._query_roster("vacant_shards", _ROSTER_VACANT)
        ]
        return tuple(sorted(found, key=lambda v: v.id))

    async def _query_roster(self, op: str, value: str) -> list[Item]:
        """Every item the sparse index lists under ``value`` (keys and projected attributes)."""
        found: list[Item] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": ROSTER_INDEX,
            "KeyConditionExpression": "#roster = :value",
            "ExpressionAttributeNames": _names("roster"),
            "ExpressionAttributeValues": {":value": _s(value)},
        }
        for _ in range(_INDEX_PAGES):
            page = await self._request(op, self._client.query, **kwargs)
            found += page.get("Items", [])
            if not page.get("LastEvaluatedKey"):
                return found
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        raise LeaseStoreError(f"{op}: more than {_INDEX_PAGES} pages in the roster index")

    async def _batch_get(self, keys: list[Item]) -> list[Item]:
        """Strongly consistent: liveness is judged on these counters, never on stale ones."""
        items: list[Item] = []
        request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
        for attempt in range(_BATCH_GET_ROUNDS):
            response = await self._request(
                "read_workers", self._client.batch_get_item, RequestItems=request
            )
            items += response.get("Responses", {}).get(self.table, [])
            request = response.get("UnprocessedKeys") or {}
            if not request:
                return items
            await trio.sleep(0.05 * 2**attempt)
        raise StoreUnavailable(
            f"read_workers: {self.endpoint} left keys unprocessed {_BATCH_GET_ROUNDS} times"
        )

    async def _update_own_worker(
        self, op: str, worker_id: str, session: str, state: str, wall_now: float
    ) -> dict[str, Any]:
        """Counter + 1 with a new state, if the item still carries our session."""
        try:
            return await self._request(
                op,
                self._client.update_item,
                TableName=self.table,
                Key=_key("worker", worker_id),
                UpdateExpression=(
                    "SET #counter = #counter + :one, #state = :state, #heartbeat_at = :now"
                ),
                ConditionExpression="#session = :session",
                ExpressionAttributeNames=_names("counter", "state", "heartbeat_at", "session"),
                ExpressionAttributeValues={
                    ":one": _n(1),
                    ":state": _s(state),
                    ":now": _n(wall_now),
                    ":session": _s(session),
                },
                ReturnValues="UPDATED_NEW",
            )
        except LeaseConflict as exc:
            raise WorkerIdTaken(
                f"worker item {worker_id} no longer carries session {session} "
                "(another process registered this worker id, or the item is gone)"
            ) from exc

    # --- shards -----------------------------------------------------------------------------

    async def ensure_shard(self, shard_id: str) -> None:
        # Already there: keep its owner, epoch and checkpoint.
        with contextlib.suppress(LeaseConflict):
            await self._request(
                "ensure_shard",
                self._client.put_item,
                TableName=self.table,
                Item=_new_shard_item(shard_id),
                ConditionExpression="attribute_not_exists(pk)",
            )

    async def snapshot(self) -> Snapshot:
        workers: list[WorkerItem] = []
        shards: list[ShardItem] = []
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = await self._request("snapshot", self._client.scan, **kwargs)
            for item in page.get("Items", []):
                kind = _str(item, "kind")
                if kind == "worker":
                    workers.append(_worker_from(item))
                elif kind == "shard":
                    shards.append(_shard_from(item))
            if not page.get("LastEvaluatedKey"):
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return Snapshot(
            workers=tuple(sorted(workers, key=lambda w: w.id)),
            shards=tuple(sorted(shards, key=lambda s: s.id)),
        )

    async def take(
        self, shard_id: str, me: str, expected_owner: str, expected_epoch: int, wall_now: float
    ) -> ShardItem:
        if not me:
            raise ValueError("take: the new owner must not be empty")
        values = {
            ":me": _s(me),
            ":expected_epoch": _n(expected_epoch),
            ":next": _n(expected_epoch + 1),
            ":now": _n(wall_now),
            ":running": _s("running"),
        }
        if expected_owner:
            owner_condition = "#owner = :expected_owner"
            values[":expected_owner"] = _s(expected_owner)
        else:
            owner_condition = "attribute_not_exists(#owner)"
        response = await self._request(
            "take",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression=(
                "SET #owner = :me, #epoch = :next, #owner_since = :now, #state = :running"
                " REMOVE #release_requested, #successor, #roster"
            ),
            ConditionExpression=(
                f"#epoch = :expected_epoch AND {owner_condition}"
                " AND attribute_not_exists(#retired_at)"
            ),
            ExpressionAttributeNames=_names(
                "owner",
                "epoch",
                "owner_since",
                "state",
                "release_requested",
                "successor",
                "roster",
                "retired_at",
            ),
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
        )
        return _shard_from(response["Attributes"])

    async def checkpoint(
        self, shard_id: str, me: str, epoch: int, checkpoint: dict[str, int]
    ) -> None:
        await self._request(
            "checkpoint",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression="SET #checkpoint = :cp",
            ConditionExpression=_SAME_OWNER_AND_EPOCH,
            ExpressionAttributeNames=_names("checkpoint", "owner", "epoch"),
            ExpressionAttributeValues={
                ":cp": _checkpoint_value(checkpoint),
                ":me": _s(me),
                ":epoch": _n(epoch),
            },
        )

    async def release(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        checkpoint: dict[str, int],
        state: str = "released",
        successor: str = "",
    ) -> None:
        # The epoch stays: the next take bumps it, so an epoch is never reused.
        await self._request(
            "release",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression=(
                "SET #checkpoint = :cp, #state = :released, #roster = :vacant"
                + (", #successor = :successor" if successor else "")
                + " REMOVE #owner, #release_requested"
                + ("" if successor else ", #successor")
            ),
            ConditionExpression=_SAME_OWNER_AND_EPOCH,
            ExpressionAttributeNames=_names(
                "checkpoint", "state", "owner", "epoch", "release_requested", "successor", "roster"
            ),
            ExpressionAttributeValues={
                **({":successor": _s(successor)} if successor else {}),
                ":vacant": _s(_ROSTER_VACANT),
                ":cp": _checkpoint_value(checkpoint),
                ":released": _s(state),
                ":me": _s(me),
                ":epoch": _n(epoch),
            },
        )

    async def add_shard(self, shard_id: str, spec: str, wall_now: float) -> None:
        # Registered again after `shards remove`: the epoch stays (never reused), the
        # checkpoint starts over (a new registration is a new definition).
        await self._request(
            "add_shard",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression=(
                "SET #kind = :shard, #id = :id, #spec = :spec, #roster = :vacant,"
                " #epoch = if_not_exists(#epoch, :zero), #checkpoint = :empty,"
                " #state = :registered, #registered_at = :now"
                " REMOVE #retired_at, #successor, #release_requested"
            ),
            ConditionExpression=(
                "attribute_not_exists(pk)"
                " OR (attribute_exists(#retired_at) AND attribute_not_exists(#owner))"
            ),
            ExpressionAttributeNames=_names(
                "kind",
                "id",
                "spec",
                "roster",
                "epoch",
                "checkpoint",
                "state",
                "registered_at",
                "retired_at",
                "successor",
                "release_requested",
                "owner",
            ),
            ExpressionAttributeValues={
                ":shard": _s("shard"),
                ":id": _s(shard_id),
                ":spec": _s(spec),
                ":vacant": _s(_ROSTER_VACANT),
                ":zero": _n(0),
                ":empty": _checkpoint_value({}),
                ":registered": _s("registered"),
                ":now": _n(wall_now),
            },
        )

    async def retire_shard(self, shard_id: str, wall_now: float) -> ShardItem:
        response = await self._request(
            "retire_shard",
            self._client.update_item,
            TableName=self.table,
            Key=_key("shard", shard_id),
            UpdateExpression="SET #retired_at = :now REMOVE #roster, #successor",
            ConditionExpression="attribute_exists(#spec)",
            ExpressionAttributeNames=_names("retired_at", "roster", "successor", "spec"),
            ExpressionAttributeValues={":now": _n(wall_now)},
            ReturnValues="ALL_NEW",
        )
        return _shard_from(response["Attributes"])

    async def mark_orphaned(self, worker_id: str, session: str, wall_now: float) -> None:
        """A child's last will: our supervisor (this session) is gone. Peers stop counting it
        as a member at once; its shards still wait for its lease (some child may still run)."""
        await self._request(
            "mark_orphaned",
            self._client.update_item,
            TableName=self.table,
            Key=_key("worker", worker_id),
            UpdateExpression="SET #state = :orphaned, #orphaned_at = :now",
            ConditionExpression="#session = :session AND #state <> :stopped",
            ExpressionAttributeNames=_names("state", "orphaned_at", "session"),
            ExpressionAttributeValues={
                ":orphaned": _s("orphaned"),
                ":now": _n(wall_now),
                ":session": _s(session),
                ":stopped": _s("stopped"),
            },
        )
