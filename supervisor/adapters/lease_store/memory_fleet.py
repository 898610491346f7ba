"""Protocol 2's requests on the in-memory table, each billed as DynamoDB would bill it.

``MemoryLeaseStore.fleet`` returns one of these on the store's own items, so protocol 1's
requests and these see the same table. Every method is one request (or, where DynamoDB needs
several, as many as it needs, each billed): the meter (``billing.Meter``) counts requests,
read and write units per partition key value, for the simulation of a thousand workers
(tests/adapters/test_fleet_simulation.py) and docs/lease-protocol.md's numbers. Reads here are
never stale: the simulation checks load and cost; staleness is the cores' business
(tests/core/test_peer_watch.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from supervisor.adapters.lease_store.base import DeclaredDead, WorkerIdTaken
from supervisor.adapters.lease_store.billing import Meter, item_size
from supervisor.core import partition_keys as keys
from supervisor.core.items import FleetMeta, ShardItem, WantMarker, WorkerItem
from supervisor.core.membership import Member, member_of
from supervisor.core.peer_watch import Seen
from supervisor.core.standby_ring import point

if TYPE_CHECKING:
    from supervisor.adapters.lease_store.memory import MemoryLeaseStore, _Table

META = "fleet#meta"
PAGE = 100  # items per page of an index query
_MEMBER_BYTES = 120  # a worker's projection in the fleet index
_ENTRY_BYTES = 90  # a shard's projection in an index
MARKER_BYTES = 120  # a standby-wanted marker item, and its entry in the successor index
_REGISTRATION_BYTES = 70  # a registration item, and its entry in the fleet index


def _pk(kind: str, name: str) -> str:
    return f"{kind}#{name}"


class MemoryFleet:
    """Protocol 2 on a MemoryLeaseStore's table (share ``meter`` between handles of a table)."""

    def __init__(self, store: MemoryLeaseStore, meter: Meter) -> None:
        self._store = store
        self.meter = meter

    @property
    def _table(self) -> _Table:  # the store's items, shared by every handle
        return self._store._table

    # --- membership -------------------------------------------------------------------------

    async def read_meta(self, *, consistent: bool = False) -> FleetMeta:
        """The meta item, eventually consistent (one small GetItem every round)."""
        table = await self._store._enter("read_meta")
        self.meter.get("read_meta", META, 60, consistent=consistent)
        return FleetMeta(table.generation, table.protocol, table.shardgen, table.registered_count)

    async def read_generation(self) -> int:
        return (await self.read_meta()).generation

    async def _bump(self) -> int:
        self._table.generation += 1
        self.meter.write("bump_generation", META, 40, 40)
        return self._table.generation

    async def join(self, worker: WorkerItem) -> WorkerItem:
        """Register (as protocol 1) and announce: the generation moves, ``mgen`` records it
        (DynamoDB raises the generation first; in memory nothing runs between the two)."""
        old = self._table.members.get(worker.id)
        new = await self._store.register_worker(worker)
        self.meter.write("register_worker", _pk("worker", worker.id), 0, item_size(new))
        generation = await self._bump()
        self._set_member(member_of(new, held=0, mgen=generation))
        key = keys.worker_key(worker.id)
        self.meter.index_write(key if old else None, key)
        return new

    async def heartbeat(self, worker_id: str, session: str, state: str, held: int) -> int:
        """Counter + 1 on ``session AND state <> dead``; a changed state is announced, a changed
        ``held`` written to the index (the planner's dealing reads it)."""
        table = await self._store._enter("heartbeat")
        old = table.workers.get(worker_id)
        size = item_size(old) if old else 0
        self.meter.write("heartbeat", _pk("worker", worker_id), size, size)
        if old is None or old.session != session:
            raise WorkerIdTaken(f"worker item {worker_id} no longer carries session {session}")
        if old.state == "dead":
            raise DeclaredDead(f"worker {worker_id} was declared dead")
        table.workers[worker_id] = attrs.evolve(old, counter=old.counter + 1, state=state)
        member = table.members[worker_id]
        if member.state != state:
            member = attrs.evolve(member, state=state, mgen=await self._bump())
            self.meter.index_write(keys.worker_key(worker_id), keys.worker_key(worker_id))
        if member.held != held:
            member = attrs.evolve(member, held=held)
            self.meter.index_write(keys.worker_key(worker_id), keys.worker_key(worker_id))
        self._set_member(member)
        return old.counter + 1

    async def read_members(self) -> tuple[Member, ...]:
        """Every worker bucket of the fleet index (one query each, one page at this size)."""
        table = await self._store._enter("read_members")
        if table.members_read is None or table.members_read[0] != table.members_version:
            counts = dict.fromkeys(keys.worker_keys(), 0)
            for member in table.members.values():
                counts[keys.worker_key(member.id)] += 1
            listed = tuple(sorted(table.members.values(), key=lambda m: m.id))
            table.members_read = (table.members_version, listed, counts)
        _, listed, counts = table.members_read
        for key, count in counts.items():
            self.meter.query("read_members", f"fleet:{key}", [_MEMBER_BYTES] * count)
        return listed

    def _set_member(self, member: Member) -> None:
        table = self._table
        if table.members.get(member.id) != member:
            table.members[member.id] = member
            table.members_version += 1

    # --- liveness ---------------------------------------------------------------------------

    async def watch_read(self, worker_id: str, *, consistent: bool) -> Seen | None:
        await self._store._enter("watch_read")
        item = self._table.workers.get(worker_id)
        size = item_size(item) if item else 1
        self.meter.get("watch_read", _pk("worker", worker_id), size, consistent=consistent)
        return None if item is None else Seen(item.counter, item.session, item.state)

    async def death_notice(self, worker_id: str, counter: int, session: str, by: str = "") -> bool:
        """``state = dead`` on ``counter = :c AND session = :s AND state <> dead``; announced.
        (``by``, the watcher, is recorded by DynamoDB's ``dead_by`` only.)"""
        table = await self._store._enter("death_notice")
        item = table.workers.get(worker_id)
        self.meter.write("death_notice", _pk("worker", worker_id), item_size(item), 0)
        if item is None or (item.counter, item.session) != (counter, session):
            return False
        if item.state == "dead":
            return False
        table.workers[worker_id] = attrs.evolve(item, state="dead")
        generation = await self._bump()
        member = table.members.get(worker_id)
        if member is not None:  # listed in the fleet index (a protocol-2 join)
            self._set_member(attrs.evolve(member, state="dead", mgen=generation))
            self.meter.index_write(keys.worker_key(worker_id), keys.worker_key(worker_id))
        return True

    # --- shards -----------------------------------------------------------------------------

    async def _query(self, op: str, index_key: str, found: list[ShardItem]) -> None:
        await self._store._enter(op)
        for start in range(0, max(len(found), 1), PAGE):
            page = found[start : start + PAGE]
            self.meter.query(op, index_key, [_ENTRY_BYTES] * len(page))

    async def owned_by(self, owner: str) -> tuple[ShardItem, ...]:
        """``fleet = own#<owner>``, paged: a dead worker's shards, for its watchers."""
        return await self._listed("owned_by", keys.owned_key(owner))

    async def vacant_in(self, bucket: int, start: str = "") -> tuple[ShardItem, ...]:
        """``fleet = v#NN AND spot >= :start``, one page (wrapping to the bucket's start): the
        vacant shards named for nobody that one reader of the bucket looks at this round. A
        short page from ``start`` costs a second query for the wrap, as on DynamoDB."""
        key = keys.vacant_bucket_key(bucket)
        await self._store._enter("vacant_in")
        ordered = sorted(self._table.listed.get(key, ()), key=keys.spot)
        after = [s for s in ordered if keys.spot(s) >= start][:PAGE]
        self.meter.query("vacant_in", f"fleet:{key}", [_ENTRY_BYTES] * len(after))
        wrap: list[str] = []
        if len(after) < PAGE and start:
            wrap = [s for s in ordered if keys.spot(s) < start][: PAGE - len(after)]
            self.meter.query("vacant_in", f"fleet:{key}", [_ENTRY_BYTES] * len(wrap))
        return tuple(self._table.shards[s] for s in after + wrap)

    async def _listed(self, op: str, key: str) -> tuple[ShardItem, ...]:
        found = [self._table.shards[s] for s in sorted(self._table.listed.get(key, ()))]
        await self._query(op, f"fleet:{key}", found)
        return tuple(found)

    # --- standby-wanted markers ----------------------------------------------------------

    async def want_standby(self, shard_id: str, holder: str, epoch: int, named: str) -> bool:
        """The holder's marker naming ``named`` ("" withdraws it: the item stays, unlisted,
        with its epoch), conditional on no marker of a later epoch (billed all the same, as
        a failed condition is on DynamoDB)."""
        table = await self._store._enter("want_standby")
        old = table.wants.get(shard_id)
        self.meter.write(
            "want_standby", _pk("want", shard_id), MARKER_BYTES if old else 0, MARKER_BYTES
        )
        if old is not None and old[0].epoch > epoch:
            return False
        before = old[1] if old and old[1] else None
        if before is not None:
            table.wanted[before].discard(shard_id)
        table.wants[shard_id] = (WantMarker(shard_id, holder, epoch), named)
        if named:
            table.wanted.setdefault(named, set()).add(shard_id)
        if before is not None or named:
            self.meter.index_write(
                before and f"successor:want#{before}", named and f"successor:want#{named}"
            )
        return True

    async def wanted_of(self, worker_id: str) -> tuple[WantMarker, ...]:
        """``successor = want#<worker>``, paged."""
        table = await self._store._enter("wanted_of")
        found = [table.wants[s][0] for s in sorted(table.wanted.get(worker_id, ()))]
        for start in range(0, max(len(found), 1), PAGE):
            page = found[start : start + PAGE]
            self.meter.query("wanted_of", f"successor:want#{worker_id}", [MARKER_BYTES] * len(page))
        return tuple(found)

    # --- registered shards, by their place on the standby ring ----------------------------

    async def register(self, shard_id: str) -> bool:
        """The registration item (absent so far), then the meta item's counters."""
        table = await self._store._enter("register")
        self.meter.write("register", _pk("reg", shard_id), 0, _REGISTRATION_BYTES)
        if shard_id in table.registrations:
            return False
        at = point("s", shard_id)
        table.registrations[shard_id] = at
        self.meter.index_write(None, f"fleet:{keys.registration_key(at)}")
        self._count_registered("register", 1)
        return True

    async def unregister(self, shard_id: str) -> bool:
        table = await self._store._enter("unregister")
        size = _REGISTRATION_BYTES
        self.meter.write("unregister", _pk("reg", shard_id), size, size)  # unlisted, kept
        at = table.registrations.pop(shard_id, None)
        if at is None:
            return False
        self.meter.index_write(f"fleet:{keys.registration_key(at)}", None)
        self._count_registered("unregister", -1)
        return True

    def _count_registered(self, op: str, change: int) -> None:
        self._table.shardgen += 1
        self._table.registered_count += change
        self.meter.write(op, META, 60, 60)

    async def registered_in(self, start: int, end: int) -> tuple[str, ...]:
        """One range query per registration key the stretch touches (billed each)."""
        table = await self._store._enter("registered_in")
        found: list[str] = []
        for key, low, high in keys.registration_reads(start, end):
            here = [
                shard
                for shard, at in table.registrations.items()
                if keys.registration_key(at) == key and low <= keys.registration_spot(at) <= high
            ]
            self.meter.query("registered_in", f"fleet:{key}", [_REGISTRATION_BYTES] * len(here))
            found += here
        return tuple(sorted(found))

    async def ensure_shards(self, shard_ids: list[str]) -> None:
        """Create the missing shard items, vacant: the configured shards at a cold start.
        Billed as 25 puts a request; DynamoDB's store (dynamodb/fleet.py) finds the missing
        ones with a BatchGetItem and puts each conditionally (BatchWriteItem has no
        conditions), which costs the same write units and more requests."""
        for start in range(0, len(shard_ids), 25):
            await self._store._enter("ensure_shards")
            for shard_id in shard_ids[start : start + 25]:
                if shard_id not in self._table.shards:
                    item = ShardItem(shard_id, "", 0)
                    self.meter.write("ensure_shards", _pk("shard", shard_id), 0, item_size(item))
                    self._place(item)

    async def addressed_to(self, me: str) -> tuple[ShardItem, ...]:
        """``successor = <me>``, paged: the hand-off poll."""
        found = [self._table.shards[s] for s in sorted(self._table.addressed.get(me, ()))]
        await self._query("addressed_to", f"successor:{me}", found)
        return tuple(found)

    async def route(
        self, shard_id: str, owner: str, epoch: int, to: str, dead: str | None = None
    ) -> bool:
        """Name ``to`` as successor of a dead worker's shard: owned by it (``#owner = :owner
        AND epoch``), or, unowned, addressed to it (``dead``: ``successor = :dead AND epoch``)."""
        table = await self._store._enter("route")
        item = table.shards.get(shard_id)
        self.meter.write("route", _pk("shard", shard_id), item_size(item), item_size(item))
        if item is None or item.owner != owner or item.epoch != epoch:
            return False
        if not owner and item.successor != (dead or ""):
            return False
        self._place(attrs.evolve(item, successor=to, handoff_stage="", handoff_first={}))
        return True

    async def take(
        self, shard_id: str, me: str, expected_owner: str, expected_epoch: int
    ) -> ShardItem | None:
        """A take as in protocol 1 (owner and epoch as observed, never a retired shard); None
        when the condition failed (billed all the same)."""
        table = await self._store._enter("take")
        old = table.shards.get(shard_id)
        size = item_size(old)
        self.meter.write("take", _pk("shard", shard_id), size, size + 40)
        if (
            old is None
            or old.retired_at
            or (old.owner, old.epoch) != (expected_owner, expected_epoch)
        ):
            return None
        new = attrs.evolve(old, owner=me, epoch=old.epoch + 1, successor="", state="running")
        self._place(new)
        return new

    async def release(self, shard_id: str, me: str, epoch: int, successor: str) -> bool:
        table = await self._store._enter("release")
        item = table.shards.get(shard_id)
        self.meter.write("release", _pk("shard", shard_id), item_size(item), item_size(item))
        if item is None or item.owner != me or item.epoch != epoch:
            return False
        self._place(attrs.evolve(item, owner="", successor=successor, state="released"))
        return True

    def _place(self, new: ShardItem) -> None:
        """Write the item (``_Table.put_shard`` moves its index entries); bill each index
        write."""
        for index, (before, after) in self._table.put_shard(new).items():
            self.meter.index_write(before and f"{index}:{before}", after and f"{index}:{after}")
