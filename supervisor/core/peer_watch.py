"""When to read a watched peer and when its death falls due, on the local monotonic clock.

Protocol 2 (docs/lease-protocol.md): a worker reads only the K peers the watch ring gives it,
eventually consistently, phase-locked to their heartbeats (polls until the first change, then
one read a ``heartbeat_interval`` after each change, one poll earlier every ``PROBE_EVERY``-th
time, every ``poll / RETRY_SPLIT`` for a poll while a heartbeat just due has not shown, and
every ``poll`` while a read shows no change). A peer whose counter has not moved
for ``duration`` since our *first* observation of it is *due*: then, and only then, one strongly
consistent read confirms it before anyone may write its death notice. So a stale replica can
delay a death but never hasten it, and nothing is ever declared on an eventually consistent
read alone.

Every time here is the *arrival* of a response on our monotonic clock: a value seen at ``at``
was written no later than ``at``, which is what the safety argument needs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

_NEVER = float("inf")
PROBE_EVERY = 4  # one heartbeat in this many is looked for a poll before it should land
# A read that missed a heartbeat just due looks again after a poll / RETRY_SPLIT, for one poll:
# a heartbeat a few ms late (its write's latency varied) is then seen within tens of ms, not a
# whole poll later; the reads are those a late beat costs anyway, sooner.
RETRY_SPLIT = 4
GONE_STATES = frozenset({"stopped", "dead"})  # a clean exit, or a notice someone wrote already


class Standing(enum.Enum):
    UNSEEN = "unseen"  # not read yet: no clock runs until we have seen it once
    ALIVE = "alive"
    DUE = "due"  # unchanged for a full duration: confirm with a strongly consistent read
    GONE = "gone"  # stopped cleanly, or already declared dead: no notice needed from us


@attrs.frozen
class Seen:
    """What a read of a worker item showed (the fields liveness needs)."""

    counter: int
    session: str
    state: str


def watch_poll(heartbeat_interval: float) -> float:
    """How often to re-read a peer whose next heartbeat is late: the lag between a heartbeat
    landing and our seeing it is at most this, and it adds to the failover time."""
    return min(heartbeat_interval / 4, 0.25)


@attrs.define
class PeerClock:
    """One watched peer: the counter we last saw, since when, and when to look again."""

    duration: float
    heartbeat_interval: float
    seen: Seen | None = None
    changed_at: float = _NEVER  # arrival of our first observation of ``seen.counter``
    beats: int = 0  # changes seen since the first sight
    early: float = 0.0  # how far ahead of the expected landing the next read looks
    landed: float = _NEVER  # when, about, the counter we hold landed (our clock)
    polled: bool = False  # a read since the last change showed no change
    missed_at: float = _NEVER  # the last such read's arrival
    next_read_at: float = float("-inf")  # read at once

    @property
    def poll(self) -> float:
        return watch_poll(self.heartbeat_interval)

    def due_at(self) -> float:
        return self.changed_at + self.duration

    def observe(self, seen: Seen, at: float) -> None:
        """An eventually consistent read arrived at ``at``. A lower counter than the one we
        hold is a stale replica (counters only rise): ignored, the clock keeps running."""
        old = self.seen
        if old is None or seen.session != old.session:
            # Its rhythm is unknown: poll until the first change shows, which then lands
            # within a poll of our read.
            self.seen, self.changed_at, self.beats = seen, at, 0
            self.landed, self.next_read_at = _NEVER, at + self.poll
            self.polled, self.missed_at = False, _NEVER
            return
        if seen.counter > old.counter:
            self._changed(seen, at)
            return
        step = self.poll
        if seen.counter == old.counter:
            self.seen = seen  # a state written without a heartbeat (orphaned, dead)
            self.polled, self.missed_at = True, at
            if 0.0 <= at - (self.landed + self.heartbeat_interval) < self.poll:
                step = self.poll / RETRY_SPLIT  # a heartbeat just due: it is late, not gone
        self.next_read_at = min(at + step, max(self.due_at(), at))

    def _changed(self, seen: Seen, at: float) -> None:
        """A new counter. It landed no later than ``at``: if a read since the last change
        showed none, after that read (where its rhythm said, if that lies between, else about
        midway: taking ``at`` itself kept a rhythm found by polling a poll late for good);
        else about a heartbeat after the last one. The next lands a heartbeat later: read
        then (a hair after: a look at the very instant misses it as often as not), and a
        quarter poll later while it has not shown, so each change is seen within about that
        of landing. Every PROBE_EVERY-th time read a poll early and poll until it shows, so a
        rhythm read late (a heartbeat came late, the next ones on time) is found out; while
        an early read still finds the change already there, the next looks twice as early.
        1 + 1/PROBE_EVERY reads a heartbeat, where always looking early would cost two."""
        heartbeat = self.heartbeat_interval
        if self.polled:  # it landed after our last read that missed it, before this one
            expected = self.landed + heartbeat
            if self.missed_at < expected <= at:
                self.landed = expected  # on its rhythm: a probe looked early, as it should
            else:
                self.landed = (self.missed_at + at) / 2  # off it: about midway between
        else:
            self.landed = min(at, self.landed + heartbeat)
        self.beats += 1
        if not self.polled and self.early > 0:
            early = min(2 * self.early, heartbeat / 2)  # still late
        else:
            early = self.poll if self.beats % PROBE_EVERY == 0 else 0.0
        self.seen, self.changed_at, self.early, self.polled = seen, at, early, False
        self.next_read_at = max(at, self.landed + heartbeat + self.poll / 25 - early)

    def read_failed(self, at: float) -> None:
        """The read (or the confirmation) did not answer: try again one poll later. The
        clock is not reset: no news is not a heartbeat."""
        self.next_read_at = at + self.poll

    def standing(self, now: float) -> Standing:
        if self.seen is None:
            return Standing.UNSEEN
        if self.seen.state in GONE_STATES:
            return Standing.GONE
        return Standing.DUE if now >= self.due_at() else Standing.ALIVE

    def confirm(self, seen: Seen, at: float) -> bool:
        """A *strongly consistent* read arrived at ``at``: True when the peer is dead (same
        session, same counter a full duration after we first saw it), and the caller may then
        write the notice conditional on exactly ``seen.counter`` and ``seen.session``.
        Anything else is a fresh observation."""
        old = self.seen
        dead = (
            old is not None
            and at >= self.due_at()
            and seen.session == old.session
            and seen.counter == old.counter
            and seen.state not in GONE_STATES
        )
        self.observe(seen, at)
        return dead


@attrs.define
class WatchBook:
    """The clocks of the peers this worker watches; tells the driver what to do and when."""

    duration: float
    heartbeat_interval: float
    clocks: dict[str, PeerClock] = attrs.field(factory=dict)

    def watch(self, peers: Iterable[str]) -> None:
        """Follow the ring: keep the clocks of peers still watched (their time keeps counting),
        start new ones unseen (a full duration from first sight), drop the rest."""
        wanted = set(peers)
        self.clocks = {
            peer: self.clocks.get(peer) or PeerClock(self.duration, self.heartbeat_interval)
            for peer in sorted(wanted)
        }

    def to_read(self, now: float) -> tuple[str, ...]:
        """Peers to read eventually consistently now (unseen or alive, read time reached)."""
        return tuple(
            peer
            for peer, clock in self.clocks.items()
            if clock.standing(now) in (Standing.UNSEEN, Standing.ALIVE)
            and clock.next_read_at <= now
        )

    def to_confirm(self, now: float) -> tuple[str, ...]:
        """Peers due now: read each strongly consistently, then ``confirm``."""
        return tuple(
            peer
            for peer, clock in self.clocks.items()
            if clock.standing(now) is Standing.DUE and clock.next_read_at <= now
        )

    def gone(self, now: float) -> tuple[str, ...]:
        return tuple(p for p, c in self.clocks.items() if c.standing(now) is Standing.GONE)

    def confirmed(self, peer: str, seen: Seen, at: float) -> bool:
        """A strongly consistent read (the driver's round) of a watched peer. When our reads
        had left it due (stale replicas can show a live peer still) but it moved, its clock
        starts over, unseen, so that the reads find its rhythm again rather than leave it to
        the rounds. True when that happened (the driver wakes its reads)."""
        clock = self.clocks.get(peer)
        if clock is None or clock.seen is None or clock.standing(at) is not Standing.DUE:
            return False
        if (seen.counter, seen.session) == (clock.seen.counter, clock.seen.session):
            return False
        self.clocks[peer] = PeerClock(self.duration, self.heartbeat_interval)
        return True

    def next_read(self, now: float) -> float:
        """When the next eventually consistent read is due (not before ``now``): the driver of
        protocol 1 confirms due peers in its reconcile round, so only reads wake it."""
        times = [
            max(clock.next_read_at, now)
            for clock in self.clocks.values()
            if clock.standing(now) in (Standing.UNSEEN, Standing.ALIVE)
        ]
        return min(times, default=_NEVER)

    def next_wake(self, now: float) -> float:
        """When the driver must act next: a read time or a due time, whichever comes first (a
        timer, so a death is acted on when it falls due, not at the next round)."""
        times = [
            max(min(clock.next_read_at, clock.due_at()), now)
            for clock in self.clocks.values()
            if clock.standing(now) is not Standing.GONE
        ]
        return min(times, default=_NEVER)
