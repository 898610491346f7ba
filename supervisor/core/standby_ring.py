"""Protocol 2's standby candidates as pure code: which shards a worker may stand by for, found
without looking at every shard (docs/lease-protocol.md, *Standbys: candidates from a ring*).

Every known shard and ``VNODES`` virtual points of every live member sit on one ring of 64-bit
``blake2b`` points. A shard's candidates are the first ``k + 1`` distinct members clockwise
from its point (points strictly after it, wrapping). A worker finds the shards it is a
candidate for from the sorted points alone: each of its virtual points owns the arc back to
the nearer of its own previous point or the point where a (k+1)-th distinct other member
appears; the shards in those arcs are found by binary search. After sorting, that is
O(S·(k+1)/W) per worker, where ranking every member for every shard was O(S·W).

The standbys of a shard are its first ``k`` candidates that do not hold it
(``standbys``); only when the holder is among the first ``k`` does the (k+1)-th stand by,
and only the holder knows that: it names that worker with a marker (``wants_extra``).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

VNODES = 16  # virtual points per member: evens out each member's share of the ring
_SPAN = 1 << 64  # the ring's points are 64-bit


def point(kind: str, name: str) -> int:
    """A name's place on the ring (``kind`` keeps shard and member points apart)."""
    digest = hashlib.blake2b(f"{kind}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@attrs.frozen
class Ring:
    """The ring of one view: its members' virtual points and its shards' points, sorted."""

    k: int
    _vpoints: tuple[int, ...]
    _vowners: tuple[str, ...]
    _spoints: tuple[int, ...]
    _sids: tuple[str, ...]
    members: frozenset[str]

    @classmethod
    def build(
        cls, members: Iterable[str], shards: Iterable[str], k: int, vnodes: int = VNODES
    ) -> Ring:
        """``k`` standbys wanted per shard: each shard gets ``k + 1`` candidates."""
        members = frozenset(members)
        virtual = sorted((point(f"m{i}", m), m) for m in members for i in range(vnodes))
        placed = sorted((point("s", s), s) for s in set(shards))
        return cls(
            k,
            tuple(p for p, _ in virtual),
            tuple(m for _, m in virtual),
            tuple(p for p, _ in placed),
            tuple(s for _, s in placed),
            members,
        )

    def candidates(self, shard: str) -> tuple[str, ...]:
        """The first ``k + 1`` distinct members clockwise from the shard's point, nearest
        first (all members when there are fewer)."""
        want = min(self.k + 1, len(self.members))
        found: list[str] = []
        start = bisect.bisect_right(self._vpoints, point("s", shard))
        count = len(self._vowners)
        for step in range(count):
            owner = self._vowners[(start + step) % count]
            if owner not in found:
                found.append(owner)
                if len(found) == want:
                    break
        return tuple(found)

    def candidate_for(self, me: str) -> frozenset[str]:
        """The shards of the ring whose candidates include ``me``, from ``me``'s arcs."""
        if me not in self.members:
            return frozenset()
        if len(self.members) <= self.k + 1:
            return frozenset(self._sids)  # every member is a candidate of every shard
        found: set[str] = set()
        for start, end in self.arcs(me):
            found.update(self._shards_in(start, end))
        return frozenset(found)

    def arcs(self, me: str) -> tuple[tuple[int, int], ...]:
        """The ring's stretches ``[start, end)`` (wrapping) whose shards count ``me`` among
        their candidates: where to read the registered shards it may stand by for
        (``partition_keys.registration_reads``). The whole ring (``(0, 0)``) when every
        member is a candidate of every shard."""
        if me not in self.members:
            return ()
        if len(self.members) <= self.k + 1:
            return ((0, 0),)
        return tuple(
            (self._arc_start(j, me), self._vpoints[j])
            for j, owner in enumerate(self._vowners)
            if owner == me
        )

    def _arc_start(self, j: int, me: str) -> int:
        """Where the arc of ``me``'s virtual point ``j`` begins: the nearer (walking back) of
        ``me``'s previous point or the point at which a (k+1)-th other member appears.
        Shards from there (inclusive) up to point ``j`` (exclusive) meet ``me`` within their
        first ``k + 1`` distinct members."""
        others: set[str] = set()
        count = len(self._vowners)
        for step in range(1, count):
            at = (j - step) % count
            owner = self._vowners[at]
            if owner == me:
                return self._vpoints[at]
            others.add(owner)
            if len(others) == self.k + 1:
                return self._vpoints[at]
        return self._vpoints[j]  # only ``me``'s points: cannot happen with k + 2 members

    def _shards_in(self, start: int, end: int) -> Sequence[str]:
        """The shards whose point lies in ``[start, end)`` on the ring (wrapping)."""
        points, sids = self._spoints, self._sids
        if start < end:
            return sids[bisect.bisect_left(points, start) : bisect.bisect_left(points, end)]
        return sids[bisect.bisect_left(points, start) :] + sids[: bisect.bisect_left(points, end)]


def standbys(candidates: Sequence[str], holder: str, k: int) -> tuple[str, ...]:
    """A shard's standbys: its first ``k`` candidates that do not hold it."""
    return tuple(c for c in candidates if c != holder)[:k]


def wants_extra(candidates: Sequence[str], holder: str, k: int) -> str:
    """Whom the holder names with a standby-wanted marker ("" = none): the (k+1)-th
    candidate, when the holder itself is among the first ``k``."""
    if holder in candidates[:k] and len(candidates) > k:
        return candidates[k]
    return ""


def stands_by(
    me: str, candidates: Sequence[str], *, holds: bool, marked: Collection[str], shard: str, k: int
) -> bool:
    """Whether ``me`` runs a standby of ``shard``, from what it knows: its own holdings and
    the markers naming it (``marked``: shard ids)."""
    if holds or me not in candidates:
        return False
    return candidates.index(me) < k or shard in marked


def candidates_of(ring: Ring, shard: str, k: int) -> tuple[str, ...]:
    """A shard wanting ``k`` standbys: its first ``k + 1`` candidates on a ring built for at
    least ``k`` (a prefix of the ring's: the same walk, cut shorter)."""
    return ring.candidates(shard)[: k + 1]


def first_standby(ring: Ring, shard: str, holder: str, k: int) -> str:
    """The standby that takes the shard first when ``holder`` dies ("" = none wanted). The
    same with or without ``holder`` among the ring's members: leaving it out keeps the
    others' order."""
    if k <= 0:
        return ""
    found = standbys(candidates_of(ring, shard, k), holder, k)
    return found[0] if found else ""


@attrs.frozen
class RingPlacement:
    """The shards one worker runs standbys for, and the ones its cap left uncovered."""

    mine: frozenset[str] = frozenset()
    uncovered: frozenset[str] = frozenset()


def place_on_ring(
    me: str,
    ring: Ring,
    wanted: Mapping[str, int],
    *,
    holding: Collection[str],
    marked: Collection[str],
    cap: int = 0,
) -> RingPlacement:
    """The shards ``me`` stands by for (``stands_by``), from the shards of the ring that count
    it among their candidates, each wanting ``wanted[shard]`` standbys (absent: none). Past
    ``cap`` (0 = none) it keeps the shards whose candidates it leads (nearest first, then by
    id) and leaves the others uncovered: caps are local, nobody else counts them."""
    found: list[tuple[int, str]] = []
    for shard in ring.candidate_for(me):
        k = wanted.get(shard, 0)
        if k <= 0:
            continue
        cands = candidates_of(ring, shard, k)
        if stands_by(me, cands, holds=shard in holding, marked=marked, shard=shard, k=k):
            found.append((cands.index(me), shard))
    found.sort()
    kept = found if cap <= 0 else found[:cap]
    left = found[len(kept) :]
    return RingPlacement(frozenset(s for _, s in kept), frozenset(s for _, s in left))


def markers_wanted(
    me: str, ring: Ring, held: Iterable[str], wanted: Mapping[str, int]
) -> dict[str, str]:
    """For each shard ``me`` holds that wants standbys: whom its marker names ("" = nobody,
    ``wants_extra``). Shards wanting none are left out (no marker at all)."""
    out = {}
    for shard in held:
        k = wanted.get(shard, 0)
        if k > 0:
            out[shard] = wants_extra(candidates_of(ring, shard, k), me, k)
    return out


__all__ = [
    "VNODES",
    "Ring",
    "RingPlacement",
    "candidates_of",
    "first_standby",
    "markers_wanted",
    "place_on_ring",
    "point",
    "standbys",
    "stands_by",
    "wants_extra",
]
