"""Protocol 2's requests on the DynamoDB table: ``MemoryFleet``'s methods, each a real request.

docs/lease-protocol.md, *Fleets of a thousand workers (protocol 2)*, is the design; this is
its adapter. Worker and shard items are protocol 1's items (protocol-1 code keeps reading
them) with protocol 2's attributes added: ``fleet`` and ``spot`` (the ``fleet`` index's keys,
from supervisor/core/partition_keys.py), ``mgen``, ``held`` and ``dead_by``; the meta item
``fleet#meta`` carries ``generation`` and ``protocol``. Every request goes through
``DynamoClient.request`` (counted, bounded, errors mapped once). Index reads are eventually
consistent (as every GSI read is): a stale listing costs a failed conditional write, never
safety, since every write that moves a lease is conditional on the owner and epoch observed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from shard_worker.contract import table as t
from shard_worker.contract.table import Item, UpdateItem, number, shard_key, string, worker_key
from supervisor.adapters.lease_store.base import (
    DeclaredDead,
    LeaseConflict,
    LeaseStoreError,
    WorkerIdTaken,
)
from supervisor.adapters.lease_store.dynamodb import admin, codec
from supervisor.adapters.lease_store.dynamodb.client import DynamoClient
from supervisor.adapters.lease_store.dynamodb.store import take_update
from supervisor.core import partition_keys as keys
from supervisor.core.items import FleetMeta, ShardItem, WantMarker, WorkerItem
from supervisor.core.membership import Member
from supervisor.core.peer_watch import Seen

if TYPE_CHECKING:
    from supervisor.adapters.lease_store.dynamodb.store import DynamoLeaseStore

PAGE = 100  # items per page of an index query (the design's Limit)
_GET_KEYS = 100  # BatchGetItem's limit per request
# A worker item's state is absent only if written without one; such an item is not dead.
_NOT_DEAD = "(attribute_not_exists(#state) OR #state <> :dead)"


class DynamoFleet:
    """Protocol 2 on a DynamoLeaseStore's table (``DynamoLeaseStore.fleet()``)."""

    def __init__(self, store: DynamoLeaseStore, db: DynamoClient) -> None:
        self._store = store
        self._db = db
        self.table = store.table

    async def _update(self, op: str, update: UpdateItem) -> dict[str, Any]:
        return await self._db.request(op, "update_item", **update.params(self.table))

    async def _get(self, op: str, key: Item, names: tuple[str, ...], consistent: bool) -> Item:
        """The item's ``names`` ({} if there is no item)."""
        response = await self._db.request(
            op,
            "get_item",
            TableName=self.table,
            Key=key,
            ConsistentRead=consistent,
            ProjectionExpression=", ".join(f"#{name}" for name in names),
            ExpressionAttributeNames={f"#{name}": name for name in names},
        )
        return dict(response.get("Item", {}))

    async def _conditional(self, op: str, update: UpdateItem) -> bool:
        """A conditional write whose failed condition is an answer (False), not an error."""
        try:
            await self._update(op, update)
        except LeaseConflict:
            return False
        return True

    # --- membership -------------------------------------------------------------------------

    async def read_meta(self, *, consistent: bool = False) -> FleetMeta:
        """The meta item, eventually consistent (one small GetItem every round): the
        generation, the protocol, and the registered shards' counters."""
        names = (t.GENERATION, t.PROTOCOL, t.SHARDGEN, t.REGISTERED_COUNT)
        item = await self._get("read_meta", t.meta_key(), names, consistent)
        read = codec.read_int
        return FleetMeta(
            read(item, t.GENERATION),
            read(item, t.PROTOCOL) or 1,
            read(item, t.SHARDGEN),
            read(item, t.REGISTERED_COUNT),
        )

    async def read_generation(self) -> int:
        return (await self.read_meta()).generation

    async def _bump(self, op: str) -> int:
        """``ADD generation 1`` on the meta item (creating it if absent); the new value."""
        update = UpdateItem(
            t.meta_key(), "ADD #generation :one", "", {":one": number(1)}, returns="UPDATED_NEW"
        )
        response = await self._update(op, update)
        return codec.read_int(response["Attributes"], t.GENERATION)

    async def join(self, worker: WorkerItem) -> WorkerItem:
        """Announce, then register: the generation moves first and the item carries it as
        ``mgen`` (a reader that sees the new generation before the item re-reads once more)."""
        generation = await self._bump("join")
        return await self._store.register(worker, codec.worker_fleet(worker.id, generation, 0))

    async def heartbeat(self, worker_id: str, session: str, state: str, held: int) -> int:
        """Counter + 1 on ``session AND state <> dead``; a changed state is announced (the
        generation moves, then ``mgen``). WorkerIdTaken if the session is not ours any more,
        DeclaredDead (a LeaseConflict) if we were declared dead."""
        update = UpdateItem(
            worker_key(worker_id),
            "SET #counter = #counter + :one, #state = :state, #held = :held",
            f"#session = :session AND {_NOT_DEAD}",
            {
                ":one": number(1),
                ":state": string(state),
                ":held": number(held),
                ":session": string(session),
                ":dead": string(t.DEAD),
            },
            returns="ALL_OLD",
        )
        try:
            old = (await self._update("heartbeat", update))["Attributes"]
        except LeaseConflict as exc:
            raise await self.refused(worker_id, session) from exc
        if codec.read_str(old, t.STATE) != state:
            generation = await self._bump("heartbeat")
            announce = UpdateItem(
                worker_key(worker_id),
                "SET #mgen = :generation",
                "#session = :session",
                {":generation": number(generation), ":session": string(session)},
            )
            await self._update("heartbeat", announce)
        return codec.read_int(old, t.COUNTER) + 1

    async def refused(self, worker_id: str, session: str) -> LeaseStoreError:
        """Why a heartbeat's condition failed: another session, or a death notice (one
        consistent read, made only when it failed)."""
        item = await self._get("heartbeat", worker_key(worker_id), (t.SESSION, t.STATE), True)
        if codec.read_str(item, t.SESSION) != session:
            return WorkerIdTaken(f"worker item {worker_id} no longer carries session {session}")
        return DeclaredDead(f"worker {worker_id} was declared dead")

    async def read_members(self) -> tuple[Member, ...]:
        """Every worker bucket of the fleet index (one query each, paged), at most the client's
        concurrency at once."""
        found: list[Member] = []

        async def bucket(key: str) -> None:
            items = await self._store.query_index(
                "read_members", admin.FLEET_INDEX, t.FLEET, key, limit=PAGE
            )
            found.extend(codec.member_from(item) for item in items)

        async with trio.open_nursery() as nursery:
            for key in keys.worker_keys():
                nursery.start_soon(bucket, key)
        return tuple(sorted(found, key=lambda m: m.id))

    # --- liveness ---------------------------------------------------------------------------

    async def watch_read(self, worker_id: str, *, consistent: bool) -> Seen | None:
        names = (t.COUNTER, t.SESSION, t.STATE)
        item = await self._get("watch_read", worker_key(worker_id), names, consistent)
        if not item:
            return None
        read = codec.read_str
        return Seen(codec.read_int(item, t.COUNTER), read(item, t.SESSION), read(item, t.STATE))

    async def death_notice(self, worker_id: str, counter: int, session: str, by: str = "") -> bool:
        """``state = dead`` on ``counter = :c AND session = :s AND state <> dead``, after
        raising the generation (a notice that then fails leaves a spurious bump: one re-read
        for the fleet, nothing else). ``by``: the watcher, recorded as ``dead_by``."""
        generation = await self._bump("death_notice")
        values = {
            ":dead": string(t.DEAD),
            ":generation": number(generation),
            ":counter": number(counter),
            ":session": string(session),
        }
        sets = "#state = :dead, #mgen = :generation"
        if by:
            sets += ", #dead_by = :by"
            values[":by"] = string(by)
        condition = f"#counter = :counter AND #session = :session AND {_NOT_DEAD}"
        update = UpdateItem(worker_key(worker_id), f"SET {sets}", condition, values)
        return await self._conditional("death_notice", update)

    # --- shards -----------------------------------------------------------------------------

    async def _listed(self, op: str, index: str, key: str, value: str) -> tuple[ShardItem, ...]:
        """The shard items under ``value``. Protocol 1's hand-off notices carry a
        ``successor`` too (the index lists them under it): they are not shards, so left out."""
        items = await self._store.query_index(op, index, key, value, limit=PAGE)
        shards = (item for item in items if codec.read_str(item, t.KIND) == t.KIND_SHARD)
        return tuple(sorted((codec.shard_from(item) for item in shards), key=lambda s: s.id))

    async def owned_by(self, owner: str) -> tuple[ShardItem, ...]:
        """``fleet = own#<owner>``, paged: a dead worker's shards, for its watchers (as the
        index projects them: no checkpoint, no spec)."""
        return await self._listed("owned_by", admin.FLEET_INDEX, t.FLEET, keys.owned_key(owner))

    async def addressed_to(self, me: str) -> tuple[ShardItem, ...]:
        """``successor = <me>``, paged: the hand-off poll."""
        return await self._listed("addressed_to", admin.SUCCESSOR_INDEX, t.SUCCESSOR, me)

    async def vacant_in(self, bucket: int, start: str = "") -> tuple[ShardItem, ...]:
        """``fleet = v#NNN AND spot >= :start``, one page; if that page is short, the rest of
        it from the bucket's beginning (``spot < :start``): one reader's look at the bucket."""
        key = keys.vacant_bucket_key(bucket)
        page = await self._vacant_page(key, ">=", start, PAGE)
        if len(page) < PAGE and start:
            page += await self._vacant_page(key, "<", start, PAGE - len(page))
        return tuple(codec.shard_from(item) for item in page)

    async def _vacant_page(self, key: str, compare: str, start: str, limit: int) -> list[Item]:
        sort, values = "", None
        if start:
            sort, values = f"#spot {compare} :start", {":start": string(start)}
        return await self._store.query_index(
            "vacant_in",
            admin.FLEET_INDEX,
            t.FLEET,
            key,
            limit=limit,
            pages=1,
            sort=sort,
            sort_values=values,
        )

    # --- standby-wanted markers ----------------------------------------------------------

    async def want_standby(self, shard_id: str, holder: str, epoch: int, named: str) -> bool:
        """The holder's standby-wanted marker for ``shard_id`` naming ``named`` (its (k+1)-th
        candidate), listed under ``successor = want#<named>``; ``named`` "" withdraws it (the
        item stays, unlisted, with the holder's epoch: an UpdateItem, as the IAM policy
        grants no DeleteItem). Conditional on no marker of a later epoch: a holder that lost
        the shard can neither overwrite nor withdraw its successor's. False when that
        condition failed."""
        values = {
            ":want": string(t.KIND_WANT),
            ":id": string(shard_id),
            ":holder": string(holder),
            ":epoch": number(epoch),
        }
        sets = "SET #kind = :want, #id = :id, #owner = :holder, #epoch = :epoch"
        if named:
            expression = f"{sets}, #successor = :named"
            values[":named"] = string(t.wanted_by(named))
        else:
            expression = f"{sets} REMOVE #successor"
        update = UpdateItem(
            t.want_marker_key(shard_id),
            expression,
            "attribute_not_exists(pk) OR #epoch <= :epoch",
            values,
        )
        return await self._conditional("want_standby", update)

    async def wanted_of(self, worker_id: str) -> tuple[WantMarker, ...]:
        """The markers naming ``worker_id`` (``successor = want#<worker>``, paged): the shards
        whose holder wants it as their extra standby. Read every lease and after each
        membership change."""
        items = await self._store.query_index(
            "wanted_of", admin.SUCCESSOR_INDEX, t.SUCCESSOR, t.wanted_by(worker_id), limit=PAGE
        )
        read = codec.read_str
        found = (
            WantMarker(read(item, t.ID), read(item, t.OWNER), codec.read_int(item, t.EPOCH))
            for item in items
            if codec.kind_of(item) == t.KIND_WANT
        )
        return tuple(sorted(found, key=lambda m: m.shard))

    # --- registered shards, by their place on the standby ring ----------------------------

    async def register(self, shard_id: str) -> bool:
        """The shard's registration item listed (written, or listed again), then ``shardgen``
        and the count raised on the meta item. False: it was listed already (nothing
        counted). Two writes, not a transaction: a crash between them leaves the count one
        short."""
        update = admin.registration_update(shard_id, "attribute_not_exists(#fleet)")
        if not await self._conditional("register", update):
            return False
        await self._count_registered("register", 1)
        return True

    async def unregister(self, shard_id: str) -> bool:
        """The registration item no longer listed (``REMOVE fleet``: the item stays, as the
        IAM policy grants no DeleteItem), then the meta item's counters moved."""
        update = UpdateItem(
            t.registration_key(shard_id), "REMOVE #fleet", "attribute_exists(#fleet)", {}
        )
        if not await self._conditional("unregister", update):
            return False
        await self._count_registered("unregister", -1)
        return True

    async def _count_registered(self, op: str, change: int) -> None:
        update = UpdateItem(
            t.meta_key(),
            "ADD #shardgen :one, #registered_count :change",
            "",
            {":one": number(1), ":change": number(change)},
        )
        await self._update(op, update)

    async def registered_in(self, start: int, end: int) -> tuple[str, ...]:
        """The registered shards whose ring point lies in ``[start, end)`` (wrapping): one
        range query per registration key the stretch touches, paged."""
        found: list[str] = []
        for key, low, high in keys.registration_reads(start, end):
            items = await self._store.query_index(
                "registered_in",
                admin.FLEET_INDEX,
                t.FLEET,
                key,
                limit=PAGE,
                sort="#spot BETWEEN :low AND :high",
                sort_values={":low": string(low), ":high": string(high)},
            )
            found += (codec.read_str(i, t.ID) for i in items if codec.kind_of(i) == t.KIND_REG)
        return tuple(sorted(found))

    async def ensure_shards(self, shard_ids: list[str]) -> None:
        """Create the missing shard items, vacant: a consistent BatchGetItem of 100 ids finds
        them, then one PutItem each, conditional on ``attribute_not_exists(pk)``
        (BatchWriteItem takes no condition, and an unconditional put over a shard taken
        meanwhile would reset its owner and epoch)."""
        for start in range(0, len(shard_ids), _GET_KEYS):
            chunk = sorted(set(shard_ids[start : start + _GET_KEYS]))
            found = await self._store.batch_get("ensure_shards", [shard_key(s) for s in chunk])
            there = {codec.read_str(item, t.ID) for item in found}
            async with trio.open_nursery() as nursery:
                for shard_id in chunk:
                    if shard_id not in there:
                        nursery.start_soon(self._create, shard_id)

    async def _create(self, shard_id: str) -> None:
        await self._store.create_shard("ensure_shards", shard_id, codec.shard_fleet(shard_id))

    async def route(
        self, shard_id: str, owner: str, epoch: int, to: str, dead: str | None = None
    ) -> bool:
        """Name ``to`` as successor of a dead worker's shard: owned by it (``#owner = :owner
        AND epoch``; the owner stays, only a take changes it), or, unowned, addressed to it
        (``dead``: ``successor = :dead AND epoch``; it leaves its bucket for ``to``'s poll)."""
        values = {":to": string(to), ":epoch": number(epoch)}
        if owner:
            # A make-before-break request the dead owner had made is over: the stage goes,
            # so the routed successor's poll tells a routing from a request.
            update = "SET #successor = :to REMOVE " + ", ".join(
                f"#{name}" for name in t.HANDOFF_ATTRIBUTES
            )
            condition = "#owner = :owner AND #epoch = :epoch"
            values[":owner"] = string(owner)
        else:
            update = "SET #successor = :to REMOVE #fleet"
            addressed = t.equal_or_absent(
                t.SUCCESSOR, string(dead) if dead else None, values, "dead"
            )
            condition = f"attribute_not_exists(#owner) AND #epoch = :epoch AND {addressed}"
        return await self._conditional(
            "route", UpdateItem(shard_key(shard_id), update, condition, values)
        )

    async def take(
        self,
        shard_id: str,
        me: str,
        expected_owner: str,
        expected_epoch: int,
        wall_now: float = 0.0,
    ) -> ShardItem | None:
        """A take as in protocol 1 (owner and epoch as observed, never a retired shard), listed
        under ``own#<me>``; None when the condition failed."""
        update = take_update(shard_id, me, expected_owner, expected_epoch, wall_now)
        try:
            response = await self._update("take", update)
        except LeaseConflict:
            return None
        return codec.shard_from(response["Attributes"])

    async def release(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        successor: str,
        checkpoint: Mapping[str, int] | None = None,
    ) -> bool:
        """Protocol 1's release (the contract's builder), listed under the successor only, or
        back in the shard's vacant bucket; ``checkpoint`` None keeps the stored one."""
        fleet = "" if successor else keys.vacant_key(shard_id)
        update = t.release_shard(shard_id, me, epoch, checkpoint, successor=successor, fleet=fleet)
        return await self._conditional("release", update)
