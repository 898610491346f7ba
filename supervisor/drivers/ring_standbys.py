"""Protocol 2's standby placement for one worker: the ring of live members and known shards
(``core.standby_ring``), the registered shards of its arcs, and the standby-wanted markers it
writes as a holder and reads as the named (k+1)-th candidate (docs/lease-protocol.md,
*Standbys: candidates from a ring*).

No scan and no ranking of every worker for every shard: the ring is rebuilt when the live
members or the known shards change; the registered shards of its arcs are read when the arcs
moved or ``shards add``/``remove`` raised ``shardgen``; its markers every ``lease.duration``
and after each membership change. Standbys write nothing per message, so none of this can
touch safety: a stale view costs an idle or a missing standby until the next read.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import attrs
import trio

from supervisor.adapters.lease_store.base import FleetRequests, LeaseStoreError
from supervisor.config.model import ShardConfig
from supervisor.core.standby_ring import (
    Ring,
    RingPlacement,
    candidates_of,
    first_standby,
    markers_wanted,
    place_on_ring,
    standbys,
)

log = logging.getLogger("shardvisor.standby")

MARKER_WRITES_PER_ROUND = 32  # the rest wait for the next round (a cold start's takes)
STORE_TIMEOUT = 5.0  # s, per request


@attrs.define
class RingStandbys:
    """``default`` is ``[standby] count``; ``overrides`` the configured shards' own counts."""

    me: str
    fleet: FleetRequests
    default: int
    overrides: Mapping[str, int] = attrs.field(factory=dict)
    ring: Ring | None = None
    _ring_key: tuple[frozenset[str], frozenset[str], int] | None = None
    registered: frozenset[str] = frozenset()  # registered shards of our arcs, as last read
    _registered_key: tuple[object, ...] | None = None  # (arcs, shardgen) read for
    marked: frozenset[str] = frozenset()  # shards whose holder's marker names us
    _marked_at: float = float("-inf")
    _marked_members: frozenset[str] | None = None
    _written: dict[str, tuple[int, str]] = attrs.field(factory=dict)  # shard -> (epoch, named)
    _short: tuple[int, int] | None = None  # (wanted, peers) last reported as too few

    def widest(self) -> int:
        """The most standbys any shard we know wants: the ring's ``k`` (arcs cover them all)."""
        return max([self.default, *self.overrides.values()])

    def wanted(self, shard_id: str) -> int:
        return self.overrides.get(shard_id, self.default)

    async def refresh(
        self,
        *,
        live: Collection[str],
        configured: Collection[str],
        shardgen: int,
        now: float,
        marker_period: float,
    ) -> frozenset[str]:
        """Bring the ring, our arcs' registered shards and our markers up to date. Returns
        the registered shards found in our arcs (their definitions may still be unknown).
        A failed read keeps what was read before (next round)."""
        live = frozenset(live)
        k = self.widest()
        self._report_short(k, len(live) - 1)  # a shard's holder is one of them
        same_members = self._ring_key is not None and self._ring_key[0::2] == (live, k)
        arcs_ring = self.ring if same_members and self.ring else Ring.build(live, (), k)
        arcs = arcs_ring.arcs(self.me)  # the members' points alone decide them
        key = (arcs, shardgen)
        if key != self._registered_key:
            try:
                found: set[str] = set()
                with trio.fail_after(STORE_TIMEOUT):  # all arcs: ~16 small queries
                    for start, end in arcs:
                        found.update(await self.fleet.registered_in(start, end))
                self.registered, self._registered_key = frozenset(found), key
            except (LeaseStoreError, trio.TooSlowError) as exc:
                log.warning("registered shards of our arcs not read: %s", str(exc) or "timeout")
        shards = frozenset(configured) | self.registered
        ring_key = (live, shards, k)
        if ring_key != self._ring_key:
            self.ring, self._ring_key = Ring.build(live, shards, k), ring_key
        if live != self._marked_members or now - self._marked_at >= marker_period:
            try:
                with trio.fail_after(STORE_TIMEOUT):
                    markers = await self.fleet.wanted_of(self.me)
                self.marked = frozenset(m.shard for m in markers)
                self._marked_at, self._marked_members = now, live
            except (LeaseStoreError, trio.TooSlowError) as exc:
                log.warning("standby-wanted markers not read: %s", str(exc) or "timeout")
        return self.registered

    def _report_short(self, k: int, peers: int) -> None:
        """Fewer live peers than standbys wanted per shard: the rest are not placed (a
        warning, once per change, never a crash)."""
        short = (k, peers) if peers < k else None
        if short is not None and short != self._short:
            log.warning(
                "%d standby(s) per shard wanted, %d other live worker(s) can run one: "
                "%d per shard not placed",
                k,
                max(peers, 0),
                k - max(peers, 0),
            )
        self._short = short

    def place(
        self, runnable: Mapping[str, ShardConfig], holding: Collection[str], cap: int
    ) -> RingPlacement:
        """The shards we stand by for (``core.standby_ring.place_on_ring``): runnable ones."""
        if self.ring is None:
            return RingPlacement()
        wanted = {sid: self.wanted(sid) for sid in runnable}
        return place_on_ring(
            self.me, self.ring, wanted, holding=holding, marked=self.marked, cap=cap
        )

    def first(self, shard_id: str, holder: str) -> str:
        """Where a dead ``holder``'s shard goes first ("" = no standby wanted, no ring yet)."""
        if self.ring is None:
            return ""
        return first_standby(self.ring, shard_id, holder, self.wanted(shard_id))

    def standbys_of(self, shard_id: str, holder: str) -> tuple[str, ...]:
        """The shard's standbys while ``holder`` holds it, nearest first."""
        k = self.wanted(shard_id)
        if self.ring is None or k <= 0:
            return ()
        return standbys(candidates_of(self.ring, shard_id, k), holder, k)

    async def write_markers(self, held: Mapping[str, int]) -> None:
        """The holder's part: each shard we hold (shard -> epoch) that wants standbys gets a
        marker naming its (k+1)-th candidate while we are among the first k, withdrawn
        otherwise (written at each take: a marker of an earlier holder goes); the markers of
        shards we let go are withdrawn. Each write is conditional on no later epoch's marker
        (refused: a later holder's stands, forgotten here). At most
        ``MARKER_WRITES_PER_ROUND`` a round; a failed write is tried again next round."""
        if self.ring is None:
            return
        wanted = {sid: self.wanted(sid) for sid in held}
        names = markers_wanted(self.me, self.ring, held, wanted)
        due = [(sid, held[sid], named) for sid, named in sorted(names.items())]
        due = [d for d in due if self._written.get(d[0]) != (d[1], d[2])]
        for sid, (epoch, named) in sorted(self._written.items()):
            if sid in names:
                continue
            if named:
                due.append((sid, epoch, ""))  # let go: withdraw the name it carries
            else:
                del self._written[sid]
        for sid, epoch, named in due[:MARKER_WRITES_PER_ROUND]:
            try:
                with trio.fail_after(STORE_TIMEOUT):
                    written = await self.fleet.want_standby(sid, self.me, epoch, named)
            except (LeaseStoreError, trio.TooSlowError) as exc:
                log.warning("standby-wanted marker not written: %s", str(exc) or "timeout")
                return
            if not written or (sid not in names):
                self._written.pop(sid, None)
            else:
                self._written[sid] = (epoch, named)
                if named:
                    log.info("naming %s as an extra standby", named, extra={"shard": sid})


__all__ = ["RingStandbys"]
