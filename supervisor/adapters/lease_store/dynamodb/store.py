"""``DynamoLeaseStore``: the lease operations on one DynamoDB table.

Each operation builds its request from the table's contract and the item codec and sends it
through ``DynamoClient.request`` (count, bounded concurrency, errors mapped once). The release
and the mark-orphaned write are the contract's own builders, the ones a child's last will uses.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs
import trio

from shard_worker.contract import table as t
from shard_worker.contract.table import (
    Item,
    UpdateItem,
    checkpoint_value,
    expression_names,
    number,
    shard_key,
    string,
    worker_key,
)
from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    WorkerIdTaken,
)
from supervisor.adapters.lease_store.dynamodb import admin, codec
from supervisor.adapters.lease_store.dynamodb.client import DynamoClient
from supervisor.core import partition_keys as keys
from supervisor.core.items import (
    HandoffRequest,
    ShardItem,
    Snapshot,
    Vacancies,
    WorkerItem,
    WorkerRead,
)
from supervisor.core.peer_watch import Seen

if TYPE_CHECKING:
    from supervisor.adapters.lease_store.billing import Meter
    from supervisor.adapters.lease_store.dynamodb.fleet import DynamoFleet

_REGISTER_ATTEMPTS = 5  # read-then-conditional-put rounds before register_worker gives up
_BATCH_GET_KEYS = 100  # BatchGetItem's limit per request
_BATCH_GET_ROUNDS = 4  # rounds of UnprocessedKeys before giving up (then StoreUnavailable)
_INDEX_PAGES = 50  # pages of one index query before giving up: a runaway table, not a roster


class DynamoLeaseStore:
    """The LeaseStore on one DynamoDB table (``base.LeaseStore`` says what each method means)."""

    def __init__(
        self, table: str, region: str, endpoint_url: str = "", *, max_concurrency: int = 8
    ) -> None:
        self._db = DynamoClient(table, region, endpoint_url, max_concurrency)
        self.table = table
        self.region = region
        self.endpoint = self._db.endpoint
        self._fleet: DynamoFleet | None = None

    def __repr__(self) -> str:
        return f"DynamoLeaseStore({self.table!r}, {self.region!r}, {self.endpoint!r})"

    @property
    def request_counts(self) -> collections.Counter[str]:
        """DynamoDB requests made, per store method (a scan counts one per page)."""
        return self._db.request_counts

    @property
    def observer(self) -> Callable[[str, float, str], None] | None:
        """Called after every request: (operation, seconds, error kind or ""); for metrics."""
        return self._db.observer

    @observer.setter
    def observer(self, observer: Callable[[str, float, str], None] | None) -> None:
        self._db.observer = observer

    async def _update(self, op: str, update: UpdateItem) -> dict[str, Any]:
        return await self._db.request(op, "update_item", **update.params(self.table))

    # --- table ------------------------------------------------------------------------------

    async def ensure_table(self, create: bool, protocol: int = 1) -> bool:
        """``protocol`` 2 wants protocol 2's indexes too (``init-table --protocol 2``)."""
        return await admin.ensure_table(self._db, create, protocol)

    async def set_protocol(self, protocol: int) -> admin.ProtocolChange:
        """``init-table --protocol N``: see ``admin.set_protocol``."""
        return await admin.set_protocol(self._db, protocol)

    def fleet(self, meter: Meter | None = None) -> DynamoFleet:
        """Protocol 2's requests on this table (as ``MemoryLeaseStore.fleet``; ``meter`` is the
        memory store's billing and is ignored: DynamoDB bills itself)."""
        from supervisor.adapters.lease_store.dynamodb.fleet import DynamoFleet

        if self._fleet is None:  # one per store: the watch reads use it several times a second
            self._fleet = DynamoFleet(self, self._db)
        return self._fleet

    # --- workers ----------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerItem) -> WorkerItem:
        # Protocol 2's keys from the start (held 0, no change recorded yet): once
        # `init-table --protocol 2` has added the fleet index, it lists today's workers too.
        return await self.register(worker, codec.worker_fleet(worker.id, 0, 0))

    async def register(self, worker: WorkerItem, extra: Item) -> WorkerItem:
        """register_worker, putting ``extra`` attributes with the item (protocol 2's join)."""
        for _ in range(_REGISTER_ATTEMPTS):
            response = await self._db.request(
                "register_worker",
                "get_item",
                TableName=self.table,
                Key=worker_key(worker.id),
                ConsistentRead=True,
            )
            old = response.get("Item")
            condition: dict[str, Any]
            if old is None:
                new, condition = worker, {"ConditionExpression": "attribute_not_exists(pk)"}
            else:
                # Counters never go backwards: peers watching ours must see it change.
                counter = max(worker.counter, codec.worker_from(old).counter + 1)
                new = attrs.evolve(worker, counter=counter)
                condition = {
                    "ConditionExpression": "#counter = :old",
                    "ExpressionAttributeNames": expression_names("#counter = :old"),
                    "ExpressionAttributeValues": {":old": old.get(t.COUNTER, number(0))},
                }
            try:
                await self._db.request(
                    "register_worker",
                    "put_item",
                    TableName=self.table,
                    Item={**codec.worker_item(new), **extra},
                    **condition,
                )
            except LeaseConflict:
                continue  # a heartbeat of the earlier incarnation came between: read again
            return new
        raise LeaseConflict(
            f"register_worker: worker item {worker.id} kept changing; "
            f"gave up after {_REGISTER_ATTEMPTS} attempts"
        )

    async def heartbeat(
        self,
        worker_id: str,
        session: str,
        state: str,
        wall_now: float,
        standbys: tuple[str, ...] | None = None,
        held: int | None = None,
        *,
        not_dead: bool = False,
        write_state: bool = True,
    ) -> WorkerItem:
        response = await self._update_own_worker(
            "heartbeat",
            worker_id,
            session,
            state if write_state else None,
            wall_now,
            standbys,
            held,
            not_dead=not_dead,
        )
        return codec.worker_from(response["Attributes"])

    async def retire_worker(self, worker_id: str, session: str, wall_now: float) -> None:
        await self._update_own_worker(
            "retire_worker", worker_id, session, t.STOPPED, wall_now, (), 0
        )

    async def record_membership(self, worker_id: str, session: str, generation: int) -> None:
        update = UpdateItem(
            worker_key(worker_id),
            "SET #mgen = :generation",
            "#session = :session AND (attribute_not_exists(#mgen) OR #mgen < :generation)",
            {":generation": number(generation), ":session": string(session)},
        )
        await self._update("record_membership", update)

    async def _update_own_worker(
        self,
        op: str,
        worker_id: str,
        session: str,
        state: str | None,
        wall_now: float,
        standbys: tuple[str, ...] | None,
        held: int | None = None,
        *,
        not_dead: bool = False,
    ) -> dict[str, Any]:
        """Counter + 1 with a new state (``state`` None: the item's stays, so a heartbeat
        writes no attribute protocol 2's ``fleet`` index projects), and ``standbys``,
        ``held`` if given, if the item still carries our session (and, ``not_dead``:
        protocol 2's heartbeat, no death notice was written on it: DeclaredDead)."""
        values = {":one": number(1), ":now": number(wall_now), ":session": string(session)}
        expression = "SET #counter = #counter + :one, #heartbeat_at = :now"
        if state is not None:
            expression += ", #state = :state"
            values[":state"] = string(state)
        if standbys is not None:
            expression += ", #standbys = :standbys"
            values[":standbys"] = codec.standbys_value(standbys)
        if held is not None:
            expression += ", #held = :held"
            values[":held"] = number(held)
        condition = "#session = :session"
        if not_dead:
            condition += " AND (attribute_not_exists(#state) OR #state <> :dead)"
            values[":dead"] = string(t.DEAD)
        update = UpdateItem(worker_key(worker_id), expression, condition, values, "ALL_NEW")
        try:
            return await self._update(op, update)
        except LeaseConflict as exc:
            if not_dead:
                raise await self.fleet().refused(worker_id, session) from exc
            raise WorkerIdTaken(
                f"worker item {worker_id} no longer carries session {session} "
                "(another process registered this worker id, or the item is gone)"
            ) from exc

    async def request_drain(self, worker_id: str, wall_now: float, *, undo: bool = False) -> None:
        update = UpdateItem(
            worker_key(worker_id),
            "SET #drain_requested = :when",
            "attribute_exists(pk)",
            {":when": number(0 if undo else wall_now)},
        )
        await self._update("request_drain", update)

    async def request_release(self, shard_id: str, wall_now: float) -> str:
        update = UpdateItem(
            shard_key(shard_id),
            "SET #release_requested = :when",
            "attribute_exists(#owner)",
            {":when": number(wall_now)},
            returns="ALL_NEW",
        )
        response = await self._update("request_release", update)
        return codec.read_str(response["Attributes"], t.OWNER)

    async def poke(self, worker_id: str) -> None:
        update = UpdateItem(
            worker_key(worker_id), "ADD #mailbox :one", "attribute_exists(pk)", {":one": number(1)}
        )
        await self._update("poke", update)

    async def mark_orphaned(self, worker_id: str, session: str, wall_now: float) -> None:
        """A child's last will: our supervisor (this session) is gone. Peers stop counting it
        as a member at once; its shards still wait for its lease (some child may still run)."""
        await self._update("mark_orphaned", t.mark_orphaned(worker_id, session, wall_now))

    # --- reads ------------------------------------------------------------------------------

    async def read_workers(self) -> tuple[WorkerItem, ...]:
        return (await self.read_worker_items(await self.worker_ids())).workers

    async def worker_ids(self) -> tuple[str, ...]:
        listed = await self._query_roster("read_workers", t.ROSTER_WORKER)
        return tuple(sorted(codec.read_str(item, t.ID) for item in listed))

    async def read_worker_items(self, worker_ids: Collection[str]) -> WorkerRead:
        """One consistent ``BatchGetItem`` (per 100 keys) of the items and the meta item."""
        keys = [t.meta_key()] + [worker_key(worker_id) for worker_id in sorted(worker_ids)]
        meta: Item = {}
        workers = []
        for start in range(0, len(keys), _BATCH_GET_KEYS):
            for item in await self.batch_get("read_workers", keys[start : start + _BATCH_GET_KEYS]):
                if item[t.PK] == t.meta_key()[t.PK]:
                    meta = item
                else:
                    workers.append(codec.worker_from(item))
        return WorkerRead(
            codec.read_int(meta, t.GENERATION),
            tuple(sorted(workers, key=lambda w: w.id)),
            codec.read_int(meta, t.PROTOCOL) or 1,
            codec.read_int(meta, t.REGISTERED_COUNT),
            shardgen=codec.read_int(meta, t.SHARDGEN),
        )

    async def watch_read(self, worker_id: str) -> Seen | None:
        return await self.fleet().watch_read(worker_id, consistent=False)

    async def announce(self, why: str) -> int:
        return await self.fleet()._bump("announce")

    async def death_notice(self, worker_id: str, counter: int, session: str, by: str) -> bool:
        return await self.fleet().death_notice(worker_id, counter, session, by)

    async def vacancies(self) -> Vacancies:
        listed = await self._query_roster("vacancies", t.ROSTER_VACANT)
        shards = [codec.vacant_from(i) for i in listed if codec.kind_of(i) == t.KIND_SHARD]
        notices = [codec.notice_from(i) for i in listed if codec.kind_of(i) == t.KIND_HANDOFF]
        deaths = [codec.death_from(i) for i in listed if codec.kind_of(i) == t.KIND_DEATH]
        return Vacancies(
            tuple(sorted(shards, key=lambda v: v.id)),
            tuple(sorted(notices, key=lambda r: r.id)),
            tuple(sorted(deaths, key=lambda d: d.worker)),
        )

    async def mark_death(self, worker_id: str, generation: int) -> None:
        await self._db.request(
            "mark_death",
            "put_item",
            TableName=self.table,
            Item=codec.death_marker_item(worker_id, generation),
        )

    async def clear_death_marker(self, worker_id: str) -> None:
        update = UpdateItem(
            {t.PK: string(t.death_marker_id(worker_id))},
            "REMOVE #roster",
            "attribute_exists(#roster) AND #kind = :death",
            {":death": string(t.KIND_DEATH)},
        )
        with contextlib.suppress(LeaseConflict):  # no marker listed: nothing to clear
            await self._update("clear_death_marker", update)

    async def _query_roster(self, op: str, value: str) -> list[Item]:
        """Every item the sparse index lists under ``value`` (keys and projected attributes)."""
        return await self.query_index(op, admin.ROSTER_INDEX, t.ROSTER, value)

    async def query_index(
        self,
        op: str,
        index: str,
        key: str,
        value: str,
        *,
        limit: int = 0,
        pages: int = _INDEX_PAGES,
        sort: str = "",
        sort_values: Item | None = None,
    ) -> list[Item]:
        """What ``index`` lists under ``key = value`` (keys and projected attributes), page by
        page (``Limit`` = ``limit`` items a page, if given), at most ``pages`` pages: more is
        an error, except with ``pages = 1``, one bounded read. ``sort`` adds a condition on
        the index's sort key (``#spot >= :start``, its values in ``sort_values``)."""
        condition = f"#{key} = :value" + (f" AND {sort}" if sort else "")
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": index,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": expression_names(condition),
            "ExpressionAttributeValues": {":value": string(value), **(sort_values or {})},
        }
        if limit:
            params["Limit"] = limit
        return await self._pages(op, params, pages)

    async def _pages(self, op: str, params: dict[str, Any], pages: int) -> list[Item]:
        found: list[Item] = []
        for _ in range(pages):
            page = await self._db.request(op, "query", **params)
            found += page.get("Items", [])
            if not page.get("LastEvaluatedKey") or pages == 1:
                return found
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        raise LeaseStoreError(f"{op}: more than {pages} pages in the {params['IndexName']} index")

    async def batch_get(self, op: str, keys: list[Item]) -> list[Item]:
        """Strongly consistent: liveness is judged on these counters, never on stale ones."""
        items: list[Item] = []
        request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
        for attempt in range(_BATCH_GET_ROUNDS):
            response = await self._db.request(op, "batch_get_item", RequestItems=request)
            items += response.get("Responses", {}).get(self.table, [])
            request = response.get("UnprocessedKeys") or {}
            if not request:
                return items
            await trio.sleep(0.05 * 2**attempt)
        raise StoreUnavailable(
            f"{op}: {self.endpoint} left keys unprocessed {_BATCH_GET_ROUNDS} times"
        )

    async def snapshot(self, consistent: bool = True) -> Snapshot:
        workers: list[WorkerItem] = []
        shards: list[ShardItem] = []
        params: dict[str, Any] = {"TableName": self.table, "ConsistentRead": consistent}
        while True:
            page = await self._db.request("snapshot", "scan", **params)
            for item in page.get("Items", []):
                kind = codec.kind_of(item)
                if kind == t.KIND_WORKER:
                    workers.append(codec.worker_from(item))
                elif kind == t.KIND_SHARD:
                    shards.append(codec.shard_from(item))
            if not page.get("LastEvaluatedKey"):
                break
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return Snapshot(
            workers=tuple(sorted(workers, key=lambda w: w.id)),
            shards=tuple(sorted(shards, key=lambda s: s.id)),
        )

    # --- shards -----------------------------------------------------------------------------

    async def ensure_shard(self, shard_id: str) -> None:
        await self.create_shard("ensure_shard", shard_id, codec.shard_fleet(shard_id))

    async def create_shard(self, op: str, shard_id: str, extra: Item) -> None:
        """A new shard item with ``extra`` attributes; one already there keeps its owner,
        epoch and checkpoint (the put is conditional on its absence)."""
        with contextlib.suppress(LeaseConflict):
            await self._db.request(
                op,
                "put_item",
                TableName=self.table,
                Item={**codec.new_shard_item(shard_id), **extra},
                ConditionExpression="attribute_not_exists(pk)",
            )

    async def take(
        self, shard_id: str, me: str, expected_owner: str, expected_epoch: int, wall_now: float
    ) -> ShardItem:
        update = take_update(shard_id, me, expected_owner, expected_epoch, wall_now)
        response = await self._update("take", update)
        return codec.shard_from(response["Attributes"])

    async def checkpoint(
        self, shard_id: str, me: str, epoch: int, checkpoint: dict[str, int]
    ) -> None:
        update = UpdateItem(
            shard_key(shard_id),
            "SET #checkpoint = :cp",
            t.OWNED_AT_EPOCH,
            {":cp": checkpoint_value(checkpoint), **t.fence_values(me, epoch)},
        )
        await self._update("checkpoint", update)

    async def publish_streams(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        stale: tuple[str, ...],
        reconnects: Mapping[str, Mapping[str, int]],
    ) -> None:
        values = t.fence_values(me, epoch)
        sets, removes = [], []
        if stale:
            sets.append("#stale = :stale")
            values[":stale"] = {"SS": list(stale)}
        else:
            removes.append("#stale")
        if reconnects:
            sets.append("#reconnects = :reconnects")
            values[":reconnects"] = string(codec.reconnects_text(reconnects))
        else:
            removes.append("#reconnects")
        expression = " ".join(
            f"{verb} {', '.join(parts)}"
            for verb, parts in (("SET", sets), ("REMOVE", removes))
            if parts
        )
        update = UpdateItem(shard_key(shard_id), expression, t.OWNED_AT_EPOCH, values)
        await self._update("streams", update)

    async def release(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        checkpoint: dict[str, int],
        state: str = t.RELEASED,
        successor: str = "",
    ) -> None:
        # The same write as a child's last will (the contract's builder), with our own state;
        # listed under its successor only, or back in its vacant bucket (protocol 2's keys).
        fleet = "" if successor else keys.vacant_key(shard_id)
        update = t.release_shard(shard_id, me, epoch, checkpoint, state, successor, fleet)
        await self._update("release", update)

    async def add_shard(self, shard_id: str, spec: str, wall_now: float) -> None:
        # Registered again after `shards remove`: the epoch stays (never reused), the
        # checkpoint starts over (a new registration is a new definition).
        update = UpdateItem(
            shard_key(shard_id),
            "SET #kind = :shard, #id = :id, #spec = :spec, #roster = :vacant,"
            " #epoch = if_not_exists(#epoch, :zero), #checkpoint = :empty,"
            " #state = :registered, #registered_at = :now, #fleet = :fleet, #spot = :spot"
            " REMOVE #retired_at, #successor, #release_requested",
            "attribute_not_exists(pk)"
            " OR (attribute_exists(#retired_at) AND attribute_not_exists(#owner))",
            {
                ":shard": string(t.KIND_SHARD),
                ":id": string(shard_id),
                ":spec": string(spec),
                ":vacant": string(t.ROSTER_VACANT),
                ":zero": number(0),
                ":empty": checkpoint_value({}),
                ":registered": string("registered"),
                ":now": number(wall_now),
                ":fleet": string(keys.vacant_key(shard_id)),
                ":spot": string(keys.spot(shard_id)),
            },
        )
        await self._update("add_shard", update)
        # Protocol 2's registration item, kept true by protocol 1's writes as the keys are
        # (a crash between the two writes leaves it missing: `lease-protocol.md`, *Shards
        # nobody lists*).
        await self.fleet().register(shard_id)

    async def retire_shard(self, shard_id: str, wall_now: float) -> ShardItem:
        update = UpdateItem(
            shard_key(shard_id),
            "SET #retired_at = :now REMOVE #roster, #successor, #fleet",
            "attribute_exists(#spec)",
            {":now": number(wall_now)},
            returns="ALL_NEW",
        )
        response = await self._update("retire_shard", update)
        await self.fleet().unregister(shard_id)
        return codec.shard_from(response["Attributes"])

    # --- make-before-break hand-off (docs/lease-protocol.md) -------------------------------

    async def request_handoff(
        self, shard_id: str, me: str, epoch: int, to: str, wall_now: float
    ) -> None:
        update = UpdateItem(
            shard_key(shard_id),
            "SET #successor = :to, #handoff_stage = :requested, #roster = :handoff,"
            " #handoff_at = :now REMOVE #handoff_first",
            t.OWNED_AT_EPOCH,
            {
                ":to": string(to),
                ":requested": string(t.HANDOFF_REQUESTED),
                ":handoff": string(t.ROSTER_HANDOFF),
                ":now": number(wall_now),
                **t.fence_values(me, epoch),
            },
        )
        await self._update("request_handoff", update)
        await self._db.request(
            "request_handoff",
            "put_item",
            TableName=self.table,
            Item=codec.notice_item(shard_id, epoch, to),
        )

    async def handoff_ready(
        self, shard_id: str, epoch: int, me: str, first_seq: dict[str, int]
    ) -> None:
        update = UpdateItem(
            shard_key(shard_id),
            "SET #handoff_stage = :ready, #handoff_first = :first",
            "attribute_exists(#owner) AND #epoch = :epoch AND #successor = :me"
            " AND #handoff_stage = :requested",
            {
                ":ready": string(t.HANDOFF_READY),
                ":first": checkpoint_value(first_seq),
                ":requested": string(t.HANDOFF_REQUESTED),
                ":epoch": number(epoch),
                ":me": string(me),
            },
        )
        await self._update("handoff_ready", update)

    async def hand_over(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        successor: str,
        checkpoint: dict[str, int],
        wall_now: float,
    ) -> ShardItem:
        # The take's write, made by the owner for its ready successor: one request less
        # between the old child's last write and the new one's first.
        update = UpdateItem(
            shard_key(shard_id),
            "SET #owner = :to, #epoch = :next, #owner_since = :now, #state = :running,"
            " #checkpoint = :cp, #fleet = :fleet"
            " REMOVE #release_requested, #successor, #roster, #stale, #reconnects, "
            + ", ".join(f"#{name}" for name in t.HANDOFF_ATTRIBUTES),
            t.OWNED_AT_EPOCH + " AND #successor = :to AND #handoff_stage = :ready"
            " AND attribute_not_exists(#retired_at)",
            {
                ":to": string(successor),
                ":next": number(epoch + 1),
                ":now": number(wall_now),
                ":running": string("running"),
                ":cp": checkpoint_value(checkpoint),
                ":ready": string(t.HANDOFF_READY),
                ":fleet": string(keys.owned_key(successor)),
                **t.fence_values(me, epoch),
            },
            returns="ALL_NEW",
        )
        response = await self._update("hand_over", update)
        return codec.shard_from(response["Attributes"])

    async def cancel_handoff(self, shard_id: str, me: str, epoch: int) -> None:
        update = UpdateItem(
            shard_key(shard_id),
            "REMOVE #successor, #roster, " + ", ".join(f"#{n}" for n in t.HANDOFF_ATTRIBUTES),
            t.OWNED_AT_EPOCH,
            t.fence_values(me, epoch),
        )
        await self._update("cancel_handoff", update)
        await self._unlist_notice("cancel_handoff", shard_id, "#epoch = :epoch", epoch)

    async def clear_handoff_notice(self, shard_id: str, successor: str, epoch: int) -> bool:
        return await self._unlist_notice(
            "clear_handoff_notice",
            shard_id,
            "#epoch = :epoch AND #successor = :successor",
            epoch,
            {":successor": string(successor)},
        )

    async def _unlist_notice(
        self,
        op: str,
        shard_id: str,
        condition: str,
        epoch: int,
        values: Mapping[str, Any] = MappingProxyType({}),
    ) -> bool:
        """Take the notice out of the index (``REMOVE roster``: an UpdateItem, so the IAM
        policy still grants no DeleteItem; the next request of the shard overwrites the
        item). False when the condition failed: the notice is gone, or a later request's."""
        update = UpdateItem(
            {t.PK: string(t.handoff_notice_id(shard_id))},
            "REMOVE #roster",
            "attribute_exists(#roster) AND " + condition,
            {":epoch": number(epoch), **values},
        )
        try:
            await self._update(op, update)
        except LeaseConflict:
            return False
        return True

    async def read_shard(self, shard_id: str) -> ShardItem | None:
        response = await self._db.request(
            "read_shard",
            "get_item",
            TableName=self.table,
            Key=shard_key(shard_id),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return None if item is None else codec.shard_from(item)

    async def read_shards(self, shard_ids: Collection[str]) -> dict[str, ShardItem]:
        keys = [shard_key(shard_id) for shard_id in sorted(set(shard_ids))]
        found: dict[str, ShardItem] = {}
        for start in range(0, len(keys), _BATCH_GET_KEYS):
            for item in await self.batch_get("read_shards", keys[start : start + _BATCH_GET_KEYS]):
                shard = codec.shard_from(item)
                found[shard.id] = shard
        return found

    async def handoff_requests(self) -> tuple[HandoffRequest, ...]:
        listed = await self._query_roster("handoff_requests", t.ROSTER_HANDOFF)
        requests = (codec.handoff_request_from(item) for item in listed)
        return tuple(sorted(requests, key=lambda r: r.id))


def take_update(
    shard_id: str,
    me: str,
    expected_owner: str,
    expected_epoch: int,
    wall_now: float,
) -> UpdateItem:
    """The take: owner and epoch as observed (no owner: unowned), never a retired shard; the
    epoch rises, and the shard is listed under its new owner (``fleet = own#<me>`` and its
    ``spot``: protocol 2's keys, written by both protocols so that the index is true whenever
    it is read; an item written before them gets both here)."""
    if not me:
        raise ValueError("take: the new owner must not be empty")
    values = {
        ":me": string(me),
        ":expected_epoch": number(expected_epoch),
        ":next": number(expected_epoch + 1),
        ":now": number(wall_now),
        ":running": string("running"),
        ":fleet": string(keys.owned_key(me)),
        ":spot": string(keys.spot(shard_id)),
    }
    expected = string(expected_owner) if expected_owner else None
    owner_condition = t.equal_or_absent(t.OWNER, expected, values, "expected_owner")
    return UpdateItem(
        shard_key(shard_id),
        "SET #owner = :me, #epoch = :next, #owner_since = :now, #state = :running,"
        " #fleet = :fleet, #spot = :spot"
        " REMOVE #release_requested, #successor, #roster, #stale, #reconnects, "
        + ", ".join(f"#{name}" for name in t.HANDOFF_ATTRIBUTES),
        f"#epoch = :expected_epoch AND {owner_condition} AND attribute_not_exists(#retired_at)",
        values,
        returns="ALL_NEW",
    )
