"""The lease table's items as values: what the cores decide on and the stores read and write.

Pure data (attrs, frozen); the stores (``supervisor.adapters.lease_store``) map them to and from
their own representation. See docs/lease-protocol.md for what each field means to the protocol.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class WorkerItem:
    id: str
    session: str  # random per supervisor process: tells two incarnations of one id apart
    counter: int  # +1 on every heartbeat; peers watch it change on their own monotonic clock
    state: str  # running | draining | stopped | orphaned (its children saw it die)
    heartbeat_at: (
        float  # wall clock of the last heartbeat, for humans only (status), never compared
    )
    started_at: float
    host: str = ""
    pid: int = 0
    drain_requested: float = 0.0  # wall time of `shardvisor drain`, 0 = none
    max_shards: int = 0  # its cap, advertised so every worker computes the same targets
    mailbox: int = 0  # +1 by anyone who needs this worker to re-read the table (see poke)
    # Warm standbys (issue 14): the shards whose standby child is ready on this worker
    # (written by a heartbeat when it changes), its cap on standby children (0 = none,
    # advertised like max_shards), and what this version does ("mbb": it answers
    # make-before-break requests and runs standbys; an older peer has none).
    standbys: tuple[str, ...] = ()
    max_standbys: int = 0
    features: frozenset[str] = frozenset()


@attrs.frozen
class ShardItem:
    id: str
    owner: str  # "" = unowned
    epoch: int  # fencing token: +1 on every change of owner, never reused
    checkpoint: dict[str, int] = attrs.field(factory=dict)
    owner_since: float = 0.0  # wall clock, for humans only
    state: str = ""  # "" | running | released | quarantined
    release_requested: float = 0.0  # wall time of `shardvisor release`, 0 = none
    successor: str = ""  # named on a graceful release: this worker takes it first
    spec: str = ""  # JSON streams of a shard registered with `shards add`; "" = from TOML
    retired_at: float = 0.0  # wall time of `shards remove`; a retired shard is never taken
    # The owner's streams silent past their timeout (sorted; published when the set changes,
    # cleared by a take): `status` shows them stale.
    stale: tuple[str, ...] = ()
    # The owner's reconnects since its take, per stream and reason (published with the stale
    # set, at most every few seconds; cleared by a take): `status` shows them.
    reconnects: dict[str, dict[str, int]] = attrs.field(factory=dict)
    # A make-before-break hand-off to ``successor`` under way: "" (none), "requested" by the
    # owner, "ready" (the successor's standby is connected; ``handoff_first`` holds the first
    # sequence it buffered per stream, so the owner stops at the one before).
    handoff_stage: str = ""
    handoff_first: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class VacantShard:
    """An unowned shard as the sparse ``roster`` index lists it: what a take needs."""

    id: str
    epoch: int
    successor: str = ""


@attrs.frozen
class HandoffRequest:
    """An owned shard whose owner asks ``successor`` for a make-before-break hand-off, as the
    ``roster`` index lists it (eventually consistent: only to find; the writes are fenced)."""

    id: str
    epoch: int  # the owner's
    successor: str


@attrs.frozen
class WorkerRead:
    """Some worker items and the fleet's membership generation, strongly consistent, in one
    request (the meta item read beside them; 0 while no change was ever announced)."""

    generation: int
    workers: tuple[WorkerItem, ...] = ()
    protocol: int = 1  # the meta item's: 2 once `init-table --protocol 2` flipped the fleet
    registered_count: int = 0  # shards registered with `shards add` (protocol 2's targets)
    consistent: bool = True  # False: the meta item from a replica that may lag
    shardgen: int = 0  # the meta item's: raised by every `shards add` and `remove`


@attrs.frozen
class DeathMarker:
    """A worker declared dead moments ago, and the membership generation its notice raised."""

    worker: str
    generation: int


@attrs.frozen
class FleetMeta:
    """The fleet meta item as one read finds it (protocol 2 reads it every round)."""

    generation: int = 0  # raised by every membership change
    protocol: int = 1  # 1: compatibility mode; 2: protocol 2
    shardgen: int = 0  # raised by every `shards add` and `remove`
    registered_count: int = 0  # shards registered with `shards add`


@attrs.frozen
class WantMarker:
    """A standby-wanted marker (protocol 2): ``holder`` holds ``shard`` at ``epoch`` and names
    the reader as the shard's extra standby (the holder is among its first candidates)."""

    shard: str
    holder: str
    epoch: int


@attrs.frozen
class Vacancies:
    """What one query of the ``vacant`` roster lists: the unowned shards, the hand-off notices
    of make-before-break requests and the recent death markers (the hand-off poll's one
    request)."""

    shards: tuple[VacantShard, ...] = ()
    requests: tuple[HandoffRequest, ...] = ()
    deaths: tuple[DeathMarker, ...] = ()


@attrs.frozen
class Snapshot:
    workers: tuple[WorkerItem, ...]
    shards: tuple[ShardItem, ...]
