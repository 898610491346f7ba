"""Both halves of the make-before-break handshake, as trio loops over the lease store.

The owner asks and waits for its successor's standby (``await_successor``); the successor
gets a standby ready, answers, and adopts the shard once it is handed over to it (or takes
it once it is released, from an owner of an older version) (``Answer``). Both
read the shard item through the supervisor's ``ShardWatch``: one consistent batch read per
tick for every hand-off under way, so a drain of fifty shards polls with one request, not
fifty (and leaves the store client's threads to the heartbeat).
What each side makes of the item it reads, and how long it waits, is decided in
``supervisor.core.make_before_break``; this module only reads, writes and sleeps. Each side
gives up on its own bound, and giving up is always safe: the shard then moves as it did
before (break-before-make), fenced by its epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStore,
    LeaseStoreError,
    StoreUnavailable,
)
from supervisor.core.items import HandoffRequest, ShardItem
from supervisor.core.make_before_break import (
    OWNER_POLL,
    SUCCESSOR_POLL,
    Fallback,
    OwnerSees,
    SuccessorSees,
    owner_sees,
    successor_sees,
)

log = logging.getLogger("shardvisor.handoff")

Read = Callable[[str], Awaitable[ShardItem | None]]  # a shard item, consistent (None: none)

CANCEL_TIMEOUT = 2.0  # the owner's cancel write, after a timeout: best effort
LAST_LOOK_TIMEOUT = 2.0  # the successor's last read once its wait for the release ran out
TAKEN = "taken"  # how an answer ends when the shard is ours (or being taken here)


@attrs.define
class _Round:
    """One batch read: the shards asked for, then what it found (or why it failed)."""

    wanted: set[str] = attrs.field(factory=set)
    done: trio.Event = attrs.field(factory=trio.Event)
    found: dict[str, ShardItem] = attrs.field(factory=dict)
    error: StoreUnavailable | None = None


@attrs.define
class ShardWatch:
    """Reads the shard items that hand-offs wait on, all at once, at most every ``interval``
    seconds, and only while some hand-off waits (``run`` sleeps otherwise)."""

    store: LeaseStore
    interval: float = SUCCESSOR_POLL
    _next: _Round = attrs.field(factory=_Round)
    _wake: trio.Event = attrs.field(factory=trio.Event)

    async def read(self, shard: str) -> ShardItem | None:
        """The item as the next batch read finds it; StoreUnavailable if that read failed."""
        round_ = self._next
        round_.wanted.add(shard)
        self._wake.set()
        await round_.done.wait()
        if round_.error is not None:
            raise round_.error
        return round_.found.get(shard)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            round_, self._next = self._next, _Round()
            try:
                round_.found = await self.store.read_shards(round_.wanted)
            except LeaseStoreError as exc:
                round_.error = StoreUnavailable(str(exc))
            round_.done.set()
            await trio.sleep(self.interval)


@attrs.define
class Abort:
    """Ends an owner's wait at once, and says why: a second SIGTERM, or the successor
    stopped taking. The first reason given stands."""

    event: trio.Event = attrs.field(factory=trio.Event)
    reason: Fallback = Fallback.FAST_SHUTDOWN

    def set(self, reason: Fallback) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()


@attrs.frozen
class OwnerOutcome:
    """How the owner's wait ended: the successor's first sequences (stop at the cut), a
    fallback (stop now, release as before), or the lease is gone."""

    first: dict[str, int] | None = None
    fallback: Fallback | None = None
    lost: bool = False


async def await_successor(
    store: LeaseStore,
    read: Read,
    *,
    shard: str,
    me: str,
    epoch: int,
    successor: str,
    timeout: float,
    wall: Callable[[], float],
    abort: Abort,
) -> OwnerOutcome:
    """Ask ``successor`` for a make-before-break hand-off and wait (at most ``timeout``) until
    its standby holds every stream. ``abort`` ends the wait at once, for its reason. A
    request that is not answered in time is withdrawn, so a late answer finds nothing."""
    try:
        await store.request_handoff(shard, me, epoch, successor, wall())
    except LeaseConflict:
        return OwnerOutcome(lost=True)
    except StoreUnavailable as exc:
        log.warning("hand-off request failed: %s", exc, extra={"shard": shard})
        return OwnerOutcome(fallback=Fallback.STORE)
    outcome = OwnerOutcome(fallback=Fallback.TIMEOUT)
    with trio.move_on_after(timeout):
        outcome = await _poll_for_ready(read, shard, me, epoch, successor, abort)
    if outcome.fallback in (Fallback.TIMEOUT, Fallback.FAST_SHUTDOWN, Fallback.SUCCESSOR_LEFT):
        await _withdraw(store, shard, me, epoch)
    return outcome


async def _poll_for_ready(
    read: Read, shard: str, me: str, epoch: int, successor: str, abort: Abort
) -> OwnerOutcome:
    while not abort.event.is_set():
        try:
            item = await read(shard)
        except StoreUnavailable as exc:
            log.debug("hand-off read failed, retrying: %s", exc, extra={"shard": shard})
            item = None
        else:
            seen = owner_sees(item, me=me, epoch=epoch, successor=successor)
            if seen is OwnerSees.READY:
                assert item is not None
                return OwnerOutcome(first=dict(item.handoff_first))
            if seen is OwnerSees.CANCELLED:
                return OwnerOutcome(fallback=Fallback.CANCELLED)
            if seen is OwnerSees.LOST:
                return OwnerOutcome(lost=True)
        with trio.move_on_after(OWNER_POLL):
            await abort.event.wait()
    return OwnerOutcome(fallback=abort.reason)


async def _withdraw(store: LeaseStore, shard: str, me: str, epoch: int) -> None:
    """Best effort: a request left behind is ended by our release anyway."""
    with trio.move_on_after(CANCEL_TIMEOUT):
        try:
            await store.cancel_handoff(shard, me, epoch)
        except LeaseConflict:
            pass  # no longer ours: the release will be refused and say so
        except StoreUnavailable as exc:
            log.warning("could not withdraw the hand-off request: %s", exc, extra={"shard": shard})


# --- the successor ----------------------------------------------------------------------


Adopt = Callable[[ShardItem, str], Awaitable[bool]]  # (item handed over, previous owner)


@attrs.define
class Answer:
    """The successor's part, for one request. ``standby`` gives the standby runner's ready
    event and first sequences once it has one (starting it if needed); ``take`` takes the
    released shard (and promotes the standby); ``adopt`` runs a shard handed over to us
    (True: it runs here now; False: released, or not ours); ``accepting`` says whether we
    still take."""

    store: LeaseStore
    read: Read  # the supervisor's ShardWatch
    me: str
    request: HandoffRequest
    ready_within: float  # handoff_timeout: the owner withdraws after that anyway
    release_within: float  # make_before_break.release_wait(stop grace)

    async def run(
        self,
        standby_ready: Callable[[ShardItem], Awaitable[dict[str, int] | None]],
        take: Callable[[str, int], Awaitable[None]],
        adopt: Adopt,
        accepting: Callable[[], bool],
    ) -> str:
        """The handshake; returns how it ended (for the log): ``TAKEN`` once the shard is ours
        (or a take of it is under way here), which leaves the standby to that take."""
        shard, epoch = self.request.id, self.request.epoch
        item = await self.store.read_shard(shard)
        if successor_sees(item, me=self.me, epoch=epoch) is not SuccessorSees.WAIT:
            return "no longer asked"
        assert item is not None
        owner = item.owner
        first = None
        with trio.move_on_after(self.ready_within):
            first = await standby_ready(item)
        if first is None:
            return f"standby not ready within {self.ready_within:g}s"
        try:
            await self.store.handoff_ready(shard, epoch, self.me, first)
        except LeaseConflict:
            return "the owner withdrew the request"
        log.info("standby ready for a hand-off", extra={"shard": shard, "first_seq": first})
        with trio.move_on_after(self.release_within):
            return await self._take_when_released(take, adopt, accepting, owner)
        return await self._last_look(adopt, owner)

    async def _take_when_released(
        self,
        take: Callable[[str, int], Awaitable[None]],
        adopt: Adopt,
        accepting: Callable[[], bool],
        owner: str,
    ) -> str:
        shard, epoch = self.request.id, self.request.epoch
        while True:  # each read waits for the watch's next batch (every SUCCESSOR_POLL)
            try:
                item = await self.read(shard)
            except StoreUnavailable as exc:
                log.debug("hand-off read failed, retrying: %s", exc, extra={"shard": shard})
                await trio.sleep(SUCCESSOR_POLL)
            else:
                seen = successor_sees(item, me=self.me, epoch=epoch)
                if seen is SuccessorSees.TAKE:
                    if not accepting():
                        return "released to us while we stop taking"
                    log.info("released to us: taking", extra={"shard": shard, "epoch": epoch})
                    await take(shard, epoch)
                    return TAKEN
                if seen is SuccessorSees.HANDED_OVER:
                    assert item is not None
                    return await self._adopt(adopt, item, owner)
                if seen is SuccessorSees.GIVE_UP:
                    return "withdrawn or taken by another"

    async def _adopt(self, adopt: Adopt, item: ShardItem, owner: str) -> str:
        log.info("handed over to us: adopting", extra={"shard": item.id, "epoch": item.epoch})
        return TAKEN if await adopt(item, owner) else "handed over to us, released at once"

    async def _last_look(self, adopt: Adopt, owner: str) -> str:
        """The wait ran out. A hand-over we did not see (the reads failed) must not leave the
        shard ours with no child: one more read (the supervisor's next full scan is the
        backstop when this one fails too)."""
        shard, epoch = self.request.id, self.request.epoch
        item = None
        with trio.move_on_after(LAST_LOOK_TIMEOUT):
            try:
                item = await self.store.read_shard(shard)
            except StoreUnavailable as exc:
                log.warning("last read after the wait failed: %s", exc, extra={"shard": shard})
        if item is not None and successor_sees(item, me=self.me, epoch=epoch) is (
            SuccessorSees.HANDED_OVER
        ):
            return await self._adopt(adopt, item, owner)
        return f"not released within {self.release_within:g}s"


__all__ = ["TAKEN", "Abort", "Answer", "OwnerOutcome", "ShardWatch", "await_successor"]
