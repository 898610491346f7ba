"""The lease store in memory: DynamoLeaseStore's conditional semantics without threads or I/O.

For driver tests under trio's MockClock (autojump): every call is one checkpoint, then an atomic
read-check-write, exactly like one conditional request. Knobs inject failures.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping

import attrs
import trio

from shard_worker.contract.table import HANDOFF_READY, HANDOFF_REQUESTED
from supervisor.adapters.lease_store.base import (
    DeclaredDead,
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
)
from supervisor.adapters.lease_store.billing import Meter
from supervisor.adapters.lease_store.memory_fleet import MemoryFleet
from supervisor.core import partition_keys as keys
from supervisor.core.items import (
    DeathMarker,
    HandoffRequest,
    ShardItem,
    Snapshot,
    Vacancies,
    VacantShard,
    WantMarker,
    WorkerItem,
    WorkerRead,
)
from supervisor.core.membership import Member, member_of
from supervisor.core.peer_watch import Seen

OPERATIONS = frozenset(
    {
        "ensure_table",
        "register_worker",
        "request_drain",
        "request_release",
        "heartbeat",
        "record_membership",
        "retire_worker",
        "ensure_shard",
        "snapshot",
        "take",
        "checkpoint",
        "release",
        "read_workers",
        "worker_ids",
        "read_worker_items",
        "announce",
        "mark_death",
        "clear_death_marker",
        "poke",
        "add_shard",
        "retire_shard",
        "mark_orphaned",
        "request_handoff",
        "handoff_ready",
        "hand_over",
        "cancel_handoff",
        "read_shard",
        "read_shards",
        "handoff_requests",
        "vacancies",
        "clear_handoff_notice",
        # protocol 2 (memory_fleet.py)
        "read_meta",
        "read_members",
        "watch_read",
        "death_notice",
        "owned_by",
        "addressed_to",
        "route",
        "vacant_in",
        "ensure_shards",
        "want_standby",
        "wanted_of",
        "register",
        "unregister",
        "registered_in",
    }
)


@attrs.define
class _Table:
    """The items, shared by every handle (``MemoryLeaseStore.peer``) on the same table."""

    exists: bool = False
    workers: dict[str, WorkerItem] = attrs.field(factory=dict)
    shards: dict[str, ShardItem] = attrs.field(factory=dict)
    # Shards listed under roster = "handoff" (the index entry a take, release, cancel or
    # retire removes), as DynamoDB's sparse index would list them.
    handoffs: set[str] = attrs.field(factory=set)
    # Hand-off notices by shard (their own items in DynamoDB, listed under "vacant").
    notices: dict[str, HandoffRequest] = attrs.field(factory=dict)
    # Death markers by worker: the generation each notice raised (listed under "vacant").
    deaths: dict[str, int] = attrs.field(factory=dict)
    # Protocol 2 (memory_fleet.py): the meta item's generation, the fleet index's worker
    # projections, and the index entries by owner and by successor.
    generation: int = 0
    protocol: int = 1  # the meta item's (``MemoryLeaseStore.set_protocol``)
    members: dict[str, Member] = attrs.field(factory=dict)
    listed: dict[str, set[str]] = attrs.field(factory=dict)  # fleet index value -> shards
    addressed: dict[str, set[str]] = attrs.field(factory=dict)  # successor -> shards
    # The member list as last read (members then, in id order, per bucket): a thousand
    # handles re-read it after each change, so it is sorted once per change.
    members_version: int = 0
    members_read: tuple[int, tuple[Member, ...], dict[str, int]] | None = None
    # Standby-wanted markers by shard (the marker, whom it names), and by whom they name
    # (their entries in the successor index under "want#<worker>").
    wants: dict[str, tuple[WantMarker, str]] = attrs.field(factory=dict)
    wanted: dict[str, set[str]] = attrs.field(factory=dict)
    # Registration items (shard -> its ring point), and the meta item's counters of them.
    registrations: dict[str, int] = attrs.field(factory=dict)
    shardgen: int = 0
    registered_count: int = 0

    def put_worker(
        self, new: WorkerItem, *, held: int | None = None, mgen: int | None = None
    ) -> None:
        """Write a worker item and keep its projection in the ``fleet`` index true (``held``
        and ``mgen`` as given, else as they were), as DynamoDB's index follows every write
        of either protocol."""
        self.workers[new.id] = new
        old = self.members.get(new.id)
        member = member_of(
            new,
            held=held if held is not None else old.held if old else 0,
            mgen=mgen if mgen is not None else old.mgen if old else 0,
        )
        if old != member:
            self.members[new.id] = member
            self.members_version += 1

    def put_shard(self, new: ShardItem) -> dict[str, tuple[str | None, str | None]]:
        """Write a shard item and move its protocol-2 index entries, as DynamoDB's indexes
        follow every write of either protocol. Returns the entries that moved, by index
        (``fleet``, ``successor``): (key before, key after), for protocol 2's billing."""
        old = self.shards.get(new.id)
        moves = {
            "fleet": (keys.shard_fleet_key(old) if old else None, keys.shard_fleet_key(new)),
            "successor": (
                keys.shard_successor_key(old) if old else None,
                keys.shard_successor_key(new),
            ),
        }
        for name, entries in (("fleet", self.listed), ("successor", self.addressed)):
            before, after = moves[name]
            if before is not None:
                entries[before].discard(new.id)
            if after is not None:
                entries.setdefault(after, set()).add(new.id)
        self.shards[new.id] = new
        return {name: moved for name, moved in moves.items() if moved[0] != moved[1]}


class MemoryLeaseStore:
    """The LeaseStore in memory. Set ``unavailable`` or call ``fail_next`` to inject failures."""

    def __init__(self, *, table_exists: bool = False) -> None:
        self._table = _Table(exists=table_exists)
        self.unavailable = False  # every call raises StoreUnavailable while set
        self._failures: dict[str, collections.deque[LeaseStoreError]] = collections.defaultdict(
            collections.deque
        )
        self.request_counts: collections.Counter[str] = collections.Counter()
        self.observer = None  # as DynamoLeaseStore's: (operation, seconds, error kind or "")
        # Two replicas that disagree: eventually consistent scans alternate between the table
        # as it is and as the first of them found it (items created since missing, others at
        # an older state), as successive reads may land on an up-to-date and a lagging one.
        self.stale_scans = False
        self._stuck: Snapshot | None = None
        self._eventual_scans = 0

    def fleet(self, meter: Meter | None = None) -> MemoryFleet:
        """Protocol 2's requests on these items, billed on ``meter`` (share one per table)."""
        return MemoryFleet(self, meter if meter is not None else Meter())

    def peer(self) -> MemoryLeaseStore:
        """Another handle on the same items with its own knobs: a second worker's view."""
        other = MemoryLeaseStore()
        other._table = self._table
        return other

    def fail_next(self, op: str, exc: LeaseStoreError) -> None:
        """Make the next call of ``op`` (a method name) raise ``exc``; calls queue up."""
        if op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}; one of {sorted(OPERATIONS)}")
        self._failures[op].append(exc)

    async def _enter(self, op: str, *, needs_table: bool = True) -> _Table:
        """One checkpoint, like a request in flight; then the injected failures, if any."""
        await trio.lowlevel.checkpoint()
        self.request_counts[op] += 1
        if self.observer is not None:
            self.observer(op, 0.0, "unavailable" if self.unavailable else "")
        if self.unavailable:
            raise StoreUnavailable(f"{op}: memory store set unavailable")
        if self._failures[op]:
            raise self._failures[op].popleft()
        if needs_table and not self._table.exists:
            raise TableMissing(f"{op}: memory table does not exist")
        return self._table

    # --- table ------------------------------------------------------------------------------

    async def ensure_table(self, create: bool) -> bool:
        table = await self._enter("ensure_table", needs_table=False)
        if table.exists:
            return False
        if not create:
            raise TableMissing("memory table does not exist; run `shardvisor init-table`")
        table.exists = True
        return True

    # --- workers ----------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerItem) -> WorkerItem:
        table = await self._enter("register_worker")
        old = table.workers.get(worker.id)
        if old is not None:
            # Counters never go backwards: peers watching ours must see it change.
            worker = attrs.evolve(worker, counter=max(worker.counter, old.counter + 1))
        table.put_worker(worker, held=0, mgen=0)  # a put: protocol 2's attributes start anew
        return worker

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
        table = await self._enter("heartbeat")
        old = table.workers.get(worker_id)
        if not_dead and old is not None and old.session == session and old.state == "dead":
            raise DeclaredDead(f"worker {worker_id} was declared dead")
        if not write_state and old is not None:
            state = old.state
        new = self._update_own_worker(table, worker_id, session, state, wall_now)
        if standbys is not None:
            new = attrs.evolve(new, standbys=tuple(sorted(standbys)))
        table.put_worker(new, held=held)
        return new

    async def retire_worker(self, worker_id: str, session: str, wall_now: float) -> None:
        table = await self._enter("retire_worker")
        new = self._update_own_worker(table, worker_id, session, "stopped", wall_now)
        table.put_worker(attrs.evolve(new, standbys=()), held=0)

    async def record_membership(self, worker_id: str, session: str, generation: int) -> None:
        table = await self._enter("record_membership")
        old = table.workers.get(worker_id)
        member = table.members.get(worker_id)
        if old is None or old.session != session or (member and member.mgen >= generation):
            raise LeaseConflict(f"worker {worker_id!r}: not session {session}, or a later change")
        table.put_worker(old, mgen=generation)

    @staticmethod
    def _update_own_worker(
        table: _Table, worker_id: str, session: str, state: str, wall_now: float
    ) -> WorkerItem:
        old = table.workers.get(worker_id)
        if old is None or old.session != session:
            raise WorkerIdTaken(f"worker item {worker_id} no longer carries session {session}")
        new = attrs.evolve(old, counter=old.counter + 1, state=state, heartbeat_at=wall_now)
        table.put_worker(new)
        return new

    # --- shards -----------------------------------------------------------------------------

    async def request_drain(self, worker_id: str, wall_now: float, *, undo: bool = False) -> None:
        table = await self._enter("request_drain")
        if worker_id not in table.workers:
            raise LeaseConflict(f"no worker {worker_id!r}")
        when = 0.0 if undo else wall_now
        table.put_worker(attrs.evolve(table.workers[worker_id], drain_requested=when))

    async def request_release(self, shard_id: str, wall_now: float) -> str:
        table = await self._enter("request_release")
        item = table.shards.get(shard_id)
        if item is None or not item.owner:
            raise LeaseConflict(f"shard {shard_id!r} has no owner")
        table.put_shard(attrs.evolve(item, release_requested=wall_now))
        return item.owner

    async def poke(self, worker_id: str) -> None:
        table = await self._enter("poke")
        if worker_id not in table.workers:
            raise LeaseConflict(f"no worker {worker_id!r}")
        old = table.workers[worker_id]
        table.put_worker(attrs.evolve(old, mailbox=old.mailbox + 1))

    async def mark_orphaned(self, worker_id: str, session: str, wall_now: float) -> None:
        table = await self._enter("mark_orphaned")
        old = table.workers.get(worker_id)
        if old is None or old.session != session or old.state == "stopped":
            raise LeaseConflict(f"worker {worker_id!r} is not session {session}")
        table.put_worker(attrs.evolve(old, state="orphaned"))

    async def read_workers(self) -> tuple[WorkerItem, ...]:
        table = await self._enter("read_workers")
        return tuple(table.workers[k] for k in sorted(table.workers))

    async def worker_ids(self) -> tuple[str, ...]:
        table = await self._enter("worker_ids")
        return tuple(sorted(table.workers))

    async def read_worker_items(self, worker_ids: Collection[str]) -> WorkerRead:
        table = await self._enter("read_worker_items")
        found = sorted(set(worker_ids) & table.workers.keys())
        workers = tuple(table.workers[k] for k in found)
        return WorkerRead(
            table.generation,
            workers,
            table.protocol,
            table.registered_count,
            shardgen=table.shardgen,
        )

    def set_protocol(self, protocol: int) -> None:
        """The meta item's ``protocol``, as ``init-table --protocol N`` writes it (for tests:
        the gate's checks are the DynamoDB admin's, tested on both servers)."""
        self._table.protocol = protocol

    async def watch_read(self, worker_id: str) -> Seen | None:
        return await self.fleet().watch_read(worker_id, consistent=False)

    async def announce(self, why: str) -> int:
        table = await self._enter("announce")
        table.generation += 1
        return table.generation

    async def death_notice(self, worker_id: str, counter: int, session: str, by: str) -> bool:
        return await self.fleet().death_notice(worker_id, counter, session, by)

    async def vacancies(self) -> Vacancies:
        table = await self._enter("vacancies")
        notices = tuple(table.notices[sid] for sid in sorted(table.notices))
        deaths = tuple(DeathMarker(w, g) for w, g in sorted(table.deaths.items()))
        return Vacancies(_vacant(table), notices, deaths)

    async def mark_death(self, worker_id: str, generation: int) -> None:
        table = await self._enter("mark_death")
        table.deaths[worker_id] = generation

    async def clear_death_marker(self, worker_id: str) -> None:
        table = await self._enter("clear_death_marker")
        table.deaths.pop(worker_id, None)

    async def add_shard(self, shard_id: str, spec: str, wall_now: float) -> None:
        table = await self._enter("add_shard")
        old = table.shards.get(shard_id)
        if old is not None and (not old.retired_at or old.owner):
            raise LeaseConflict(f"shard {shard_id!r} exists")
        table.put_shard(
            ShardItem(
                id=shard_id, owner="", epoch=old.epoch if old else 0, state="registered", spec=spec
            )
        )
        await self.fleet().register(shard_id)  # protocol 2's registration item, kept true

    async def retire_shard(self, shard_id: str, wall_now: float) -> ShardItem:
        table = await self._enter("retire_shard")
        old = table.shards.get(shard_id)
        if old is None or not old.spec:
            raise LeaseConflict(f"no registered shard {shard_id!r}")
        new = attrs.evolve(old, retired_at=wall_now, successor="")
        table.put_shard(new)
        table.handoffs.discard(shard_id)
        await self.fleet().unregister(shard_id)
        return _copy(new)

    async def ensure_shard(self, shard_id: str) -> None:
        table = await self._enter("ensure_shard")
        if shard_id not in table.shards:
            table.put_shard(ShardItem(id=shard_id, owner="", epoch=0))

    async def snapshot(self, consistent: bool = True) -> Snapshot:
        table = await self._enter("snapshot")
        found = Snapshot(
            workers=tuple(table.workers[k] for k in sorted(table.workers)),
            shards=tuple(_copy(table.shards[k]) for k in sorted(table.shards)),
        )
        if consistent or not self.stale_scans:
            return found
        self._stuck = self._stuck or found
        self._eventual_scans += 1
        return found if self._eventual_scans % 2 else self._stuck

    async def take(
        self, shard_id: str, me: str, expected_owner: str, expected_epoch: int, wall_now: float
    ) -> ShardItem:
        if not me:
            raise ValueError("take: the new owner must not be empty")
        table = await self._enter("take")
        old = table.shards.get(shard_id)
        if (
            old is None
            or old.epoch != expected_epoch
            or old.owner != expected_owner
            or old.retired_at
        ):
            raise LeaseConflict(
                f"take {shard_id}: not owned by {expected_owner!r}@{expected_epoch}"
            )
        return _new_owner(table, old, me, old.checkpoint, wall_now)

    async def checkpoint(
        self, shard_id: str, me: str, epoch: int, checkpoint: dict[str, int]
    ) -> None:
        table = await self._enter("checkpoint")
        old = _owned(table, shard_id, me, epoch)
        table.put_shard(attrs.evolve(old, checkpoint=dict(checkpoint)))

    async def publish_streams(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        stale: tuple[str, ...],
        reconnects: Mapping[str, Mapping[str, int]],
    ) -> None:
        table = await self._enter("streams")
        old = _owned(table, shard_id, me, epoch)
        counts = {stream: dict(reasons) for stream, reasons in reconnects.items()}
        table.put_shard(attrs.evolve(old, stale=tuple(sorted(stale)), reconnects=counts))

    async def release(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        checkpoint: dict[str, int],
        state: str = "released",
        successor: str = "",
    ) -> None:
        table = await self._enter("release")
        old = _owned(table, shard_id, me, epoch)
        # The epoch stays: the next take bumps it, so an epoch is never reused.
        table.put_shard(
            attrs.evolve(
                old,
                owner="",
                state=state,
                checkpoint=dict(checkpoint),
                release_requested=0.0,
                successor=successor,
                handoff_stage="",
                handoff_first={},
            )
        )
        table.handoffs.discard(shard_id)

    # --- make-before-break hand-off ---------------------------------------------------------

    async def request_handoff(
        self, shard_id: str, me: str, epoch: int, to: str, wall_now: float
    ) -> None:
        table = await self._enter("request_handoff")
        old = _owned(table, shard_id, me, epoch)
        table.put_shard(
            attrs.evolve(old, successor=to, handoff_stage=HANDOFF_REQUESTED, handoff_first={})
        )
        table.handoffs.add(shard_id)
        await self._enter("request_handoff")  # the notice: a second request in DynamoDB
        table.notices[shard_id] = HandoffRequest(shard_id, epoch, to)

    async def handoff_ready(
        self, shard_id: str, epoch: int, me: str, first_seq: dict[str, int]
    ) -> None:
        table = await self._enter("handoff_ready")
        old = table.shards.get(shard_id)
        if (
            old is None
            or not old.owner
            or old.epoch != epoch
            or old.successor != me
            or old.handoff_stage != HANDOFF_REQUESTED
        ):
            raise LeaseConflict(f"handoff_ready {shard_id}: no request of epoch {epoch} for {me}")
        table.put_shard(
            attrs.evolve(old, handoff_stage=HANDOFF_READY, handoff_first=dict(first_seq))
        )

    async def hand_over(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        successor: str,
        checkpoint: dict[str, int],
        wall_now: float,
    ) -> ShardItem:
        table = await self._enter("hand_over")
        old = _owned(table, shard_id, me, epoch)
        if not successor or old.successor != successor or old.handoff_stage != HANDOFF_READY:
            raise LeaseConflict(f"hand_over {shard_id}: {successor!r} is not ready at {epoch}")
        return _new_owner(table, old, successor, checkpoint, wall_now)

    async def cancel_handoff(self, shard_id: str, me: str, epoch: int) -> None:
        table = await self._enter("cancel_handoff")
        old = _owned(table, shard_id, me, epoch)
        table.put_shard(attrs.evolve(old, successor="", handoff_stage="", handoff_first={}))
        table.handoffs.discard(shard_id)
        await self._enter("cancel_handoff")
        notice = table.notices.get(shard_id)
        if notice is not None and notice.epoch == epoch:
            del table.notices[shard_id]

    async def clear_handoff_notice(self, shard_id: str, successor: str, epoch: int) -> bool:
        table = await self._enter("clear_handoff_notice")
        if table.notices.get(shard_id) != HandoffRequest(shard_id, epoch, successor):
            return False
        del table.notices[shard_id]
        return True

    async def read_shard(self, shard_id: str) -> ShardItem | None:
        table = await self._enter("read_shard")
        item = table.shards.get(shard_id)
        return None if item is None else _copy(item)

    async def read_shards(self, shard_ids: Collection[str]) -> dict[str, ShardItem]:
        table = await self._enter("read_shards")
        return {
            sid: _copy(table.shards[sid]) for sid in sorted(set(shard_ids)) if sid in table.shards
        }

    async def handoff_requests(self) -> tuple[HandoffRequest, ...]:
        table = await self._enter("handoff_requests")
        return tuple(
            HandoffRequest(sid, table.shards[sid].epoch, table.shards[sid].successor)
            for sid in sorted(table.handoffs)
        )


def _vacant(table: _Table) -> tuple[VacantShard, ...]:
    return tuple(
        VacantShard(item.id, item.epoch, item.successor)
        for _, item in sorted(table.shards.items())
        if not item.owner and not item.retired_at
    )


def _owned(table: _Table, shard_id: str, me: str, epoch: int) -> ShardItem:
    item = table.shards.get(shard_id)
    if item is None or not me or item.owner != me or item.epoch != epoch:
        raise LeaseConflict(f"{shard_id}: not owned by {me!r}@{epoch}")
    return item


def _new_owner(
    table: _Table, old: ShardItem, owner: str, checkpoint: Mapping[str, int], wall_now: float
) -> ShardItem:
    """A take's (or a hand-over's) write: ``owner`` at the next epoch; whatever described
    the previous owner's tenure goes."""
    new = attrs.evolve(
        old,
        owner=owner,
        epoch=old.epoch + 1,
        owner_since=wall_now,
        state="running",
        checkpoint=dict(checkpoint),
        release_requested=0.0,
        successor="",
        stale=(),
        reconnects={},
        handoff_stage="",
        handoff_first={},
    )
    table.put_shard(new)
    table.handoffs.discard(old.id)
    return _copy(new)


def _copy(item: ShardItem) -> ShardItem:
    """Callers get their own checkpoint dict: the stored one changes only by a write."""
    return attrs.evolve(item, checkpoint=dict(item.checkpoint))
