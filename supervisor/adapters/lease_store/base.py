"""The lease store's interface: what the supervisor needs from DynamoDB, and nothing more.

Two implementations: ``dynamodb.DynamoLeaseStore`` (boto3) and ``memory.MemoryLeaseStore``
(an in-memory twin with the same conditional semantics, for driver tests under a fake clock).
Every method maps store failures to the errors below, so the drivers never see botocore.
See docs/lease-protocol.md for the items and the conditions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from supervisor.core.items import (
    FleetMeta,
    HandoffRequest,
    ShardItem,
    Snapshot,
    Vacancies,
    WantMarker,
    WorkerItem,
    WorkerRead,
)
from supervisor.core.membership import Member
from supervisor.core.peer_watch import Seen


class LeaseStoreError(Exception):
    """Root of the lease store's errors."""


class StoreUnavailable(LeaseStoreError):
    """The store could not be reached or refused for now (network, throttling, 5xx): retry later."""


class LeaseConflict(LeaseStoreError):
    """A conditional write failed: the item is not in the state this worker observed or owns."""


class WorkerIdTaken(LeaseStoreError):
    """Our worker item now carries another session: a second process runs with our worker id."""


class DeclaredDead(LeaseConflict):
    """Protocol 2: our heartbeat found our item ``dead`` (a watcher's death notice): our
    lease had lapsed; we drop every shard and join again."""


class TableMissing(LeaseStoreError):
    """The table does not exist (and this call does not create it)."""


class FleetRequests(Protocol):
    """Protocol 2's requests the daemon makes (``LeaseStore.fleet()``; both stores)."""

    async def read_meta(self, *, consistent: bool = False) -> FleetMeta: ...

    async def read_members(self) -> tuple[Member, ...]: ...

    async def watch_read(self, worker_id: str, *, consistent: bool) -> Seen | None: ...

    async def owned_by(self, owner: str) -> tuple[ShardItem, ...]: ...

    async def addressed_to(self, me: str) -> tuple[ShardItem, ...]: ...

    async def vacant_in(self, bucket: int, start: str = "") -> tuple[ShardItem, ...]: ...

    async def route(
        self, shard_id: str, owner: str, epoch: int, to: str, dead: str | None = None
    ) -> bool: ...

    async def want_standby(self, shard_id: str, holder: str, epoch: int, named: str) -> bool: ...

    async def wanted_of(self, worker_id: str) -> tuple[WantMarker, ...]: ...

    async def registered_in(self, start: int, end: int) -> tuple[str, ...]: ...


class LeaseStore(Protocol):
    def fleet(self) -> FleetRequests:
        """Protocol 2's requests on the same table."""
        ...

    async def ensure_table(self, create: bool) -> bool:
        """Check the table exists; create it (PAY_PER_REQUEST) when ``create``. True if created."""

    async def register_worker(self, worker: WorkerItem) -> WorkerItem:
        """Write our worker item, replacing an earlier incarnation; the counter keeps rising."""

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
        """Counter + 1, conditional on our session. Returns our item as written (its counter,
        and what others wrote on it: a drain request, a poke; a write's response costs no
        read unit). ``standbys``
        (the shards whose standby child is ready here) and ``held`` (how many shards we
        own: protocol 2's member list carries it) are written only when given: the caller
        passes them when they changed, so a heartbeat stays one small write."""

    async def retire_worker(self, worker_id: str, session: str, wall_now: float) -> None:
        """Mark our worker item stopped (clean exit), conditional on our session."""

    async def request_drain(self, worker_id: str, wall_now: float, *, undo: bool = False) -> None:
        """Ask a worker to hand off all its shards and take none (``undo``: take them again).
        TableMissing/LeaseConflict if there is no such worker."""

    async def request_release(self, shard_id: str, wall_now: float) -> str:
        """Ask the owner to hand the shard off gracefully; returns the owner (to poke).
        LeaseConflict if it has no owner."""

    async def ensure_shard(self, shard_id: str) -> None:
        """Create the shard item unowned at epoch 0 if it does not exist yet."""

    async def snapshot(self, consistent: bool = True) -> Snapshot:
        """A read of every worker and shard item (a full scan); strongly consistent unless
        ``consistent`` is False (half the read units; may show any item as it was a moment
        ago, never a later state than it has)."""

    async def read_workers(self) -> tuple[WorkerItem, ...]:
        """Every worker item, strongly consistent, without reading any shard item."""

    async def worker_ids(self) -> tuple[str, ...]:
        """The ids of every worker item (the ``roster`` index: small, eventually consistent)."""

    async def read_worker_items(self, worker_ids: Collection[str]) -> WorkerRead:
        """These worker items and the membership generation, strongly consistent (liveness is
        judged on these counters). A worker with no item is left out."""

    async def watch_read(self, worker_id: str) -> Seen | None:
        """A watched peer's counter, session and state, eventually consistent (half a read
        unit): between rounds, to see its heartbeats land within a fraction of one."""

    async def announce(self, why: str) -> int:
        """Raise the membership generation (after writing the change it announces: peers
        that see it re-read every worker item). The new generation."""

    async def record_membership(self, worker_id: str, session: str, generation: int) -> None:
        """``mgen = generation`` on our worker item (the generation that announced our last
        membership change), conditional on our session and never lowering it: protocol 2's
        readers re-read a member list whose items lag the generation they were read for.
        LeaseConflict when our session is gone or a later change was recorded."""

    async def death_notice(self, worker_id: str, counter: int, session: str, by: str) -> bool:
        """``state = dead`` if the item still shows ``counter`` and ``session`` and is not dead
        already (its watcher confirmed it a full lease later); False if not written."""

    async def mark_death(self, worker_id: str, generation: int) -> None:
        """List a death marker among the vacant shards (``t.KIND_DEATH``): every worker's next
        hand-off poll sees that ``generation`` holds a death and runs a round."""

    async def clear_death_marker(self, worker_id: str) -> None:
        """Take the marker out of the index (its writer, a few seconds later; the worker
        itself when it registers again). Nothing to clear is not an error."""

    async def vacancies(self) -> Vacancies:
        """The unowned shards and the hand-off notices (the requests of owners that list one,
        ``FEATURE_HANDOFF_NOTICE``), from the sparse index in one query (eventually consistent:
        a take is conditional anyway). Cheap when few shards are unowned, whatever the table's
        size: the reconcile round's and the hand-off poll's one request."""

    async def poke(self, worker_id: str) -> None:
        """Mailbox + 1: the worker re-reads the whole table at its next reconcile.
        LeaseConflict if there is no such worker."""

    async def mark_orphaned(self, worker_id: str, session: str, wall_now: float) -> None:
        """State "orphaned" if the item still carries ``session`` (a child's last will):
        peers stop counting that worker; its next heartbeat, if any, sets it running again.
        LeaseConflict otherwise."""

    async def add_shard(self, shard_id: str, spec: str, wall_now: float) -> None:
        """Register a shard defined by ``spec`` (JSON streams), unowned; a retired one is
        registered again with its epoch kept. LeaseConflict if it exists (or is still owned)."""

    async def retire_shard(self, shard_id: str, wall_now: float) -> ShardItem:
        """Mark a registered shard retired; its owner stops it. Returns the item as written.
        LeaseConflict if there is no such registered (``spec``) shard."""

    async def take(
        self, shard_id: str, me: str, expected_owner: str, expected_epoch: int, wall_now: float
    ) -> ShardItem:
        """Own the shard at ``expected_epoch + 1`` if it is as observed; else LeaseConflict."""

    async def checkpoint(
        self, shard_id: str, me: str, epoch: int, checkpoint: dict[str, int]
    ) -> None:
        """Store the checkpoint, conditional on owner = me and epoch = mine."""

    async def publish_streams(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        stale: tuple[str, ...],
        reconnects: Mapping[str, Mapping[str, int]],
    ) -> None:
        """Name the streams silent past their timeout (sorted) and the reconnects per stream
        and reason since the take (empty ones remove their attribute), conditional on
        owner = me and epoch = mine, like a checkpoint."""

    async def release(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        checkpoint: dict[str, int],
        state: str = "released",
        successor: str = "",
    ) -> None:
        """Final checkpoint and give the shard up, conditional on owner = me and epoch = mine.
        ``successor`` (a live peer) takes it first, even when at its fair share.

        ``state`` is ``released``, or ``quarantined`` after a crash loop (peers may still take
        it; ``status`` shows why it moved)."""

    # --- make-before-break hand-off (docs/lease-protocol.md) -------------------------------

    async def request_handoff(
        self, shard_id: str, me: str, epoch: int, to: str, wall_now: float
    ) -> None:
        """Ask ``to`` to get a standby ready before we stop: names it as successor, stage
        ``requested``, lists the shard in the index under ``handoff`` (for successors of an
        older version), then lists the hand-off notice among the vacancies. Fenced on owner
        and epoch (LeaseConflict: not ours any more)."""

    async def handoff_ready(
        self, shard_id: str, epoch: int, me: str, first_seq: dict[str, int]
    ) -> None:
        """The successor's answer: its standby holds every stream from ``first_seq`` on.
        LeaseConflict unless the shard is owned at ``epoch``, names us, and is ``requested``
        (the owner cancelled, or someone else took it)."""

    async def hand_over(
        self,
        shard_id: str,
        me: str,
        epoch: int,
        successor: str,
        checkpoint: dict[str, int],
        wall_now: float,
    ) -> ShardItem:
        """The owner's last write once its child stopped at the cut: ``successor`` owns the
        shard at ``epoch + 1`` with ``checkpoint`` (the cut), the hand-off's fields gone. One
        write instead of a release and the successor's take. LeaseConflict unless the item is
        owned by ``me`` at ``epoch``, names ``successor`` and its stage is ``ready``.
        Returns the item as written."""

    async def cancel_handoff(self, shard_id: str, me: str, epoch: int) -> None:
        """Withdraw our request (the successor was not ready in time): successor, stage and
        the index entry go (fenced on owner and epoch), then the notice of our epoch."""

    async def clear_handoff_notice(self, shard_id: str, successor: str, epoch: int) -> bool:
        """The successor's answer ended (whatever the outcome): its notice goes, if it still
        names ``successor`` at ``epoch`` (a later request's notice stays). False if not."""

    async def read_shard(self, shard_id: str) -> ShardItem | None:
        """One shard item, strongly consistent (None if there is none). Polled only while a
        hand-off is under way."""

    async def read_shards(self, shard_ids: Collection[str]) -> dict[str, ShardItem]:
        """Several shard items at once, strongly consistent (BatchGetItem), by id; missing
        ones are absent. Every hand-off waiting on this worker reads through one request."""

    async def handoff_requests(self) -> tuple[HandoffRequest, ...]:
        """The owned shards whose owner asks for a hand-off, from the sparse index
        (eventually consistent: only to find them)."""
