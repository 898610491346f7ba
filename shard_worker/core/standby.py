"""A standby child's memory of the recent feed: what it keeps, what it drops, when it is ready,
and what it writes once promoted.

A pure core (no I/O, no clock): the driver (shard_worker/drivers/standby.py) passes every
receive time in. Frames are kept raw, as received, with their sequence number (None: a message
that cannot be a record, dead-lettered only if it is written at promotion): at promotion they
go through the owner's normal write path, so dedup, gaps and dead letters are decided there,
once, the same way as for a live message.

- **By age.** ``trim(now)`` drops what was received more than ``buffer`` seconds ago (the
  driver calls it about once a second: a finer grain buys nothing against a 30 s window),
  except what ``hold`` promised to keep: the records from the ``first_seq`` of a
  ``standby_ready``, for ``buffer`` seconds after it was sent.
- **By size.** Past ``max_bytes`` (all streams together; each record counts its message's
  length plus ``RECORD_OVERHEAD``, so that it bounds the memory taken) the oldest records
  go at once (down to 1/64th below it: a full buffer makes room once per that many bytes, not
  per frame), whatever was promised: memory is bounded first. They are counted in
  ``dropped``; a promotion that misses them sees a gap (counted and logged there).
- **Ready.** ``ready_first_seq``: every stream connected and, per sequenced stream, a record
  held (its oldest is ``first_seq[s]``) or ``quiet`` seconds connected without one.
- **Promotion.** ``take(stream, checkpoint)``: the frames after the last one at or below the
  checkpoint, in the order received; the stream's memory is freed.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping

Frame = str | bytes
Held = tuple[float, int | None, Frame]  # (received at, seq or None, the frame as received)
Append = Callable[[int | None, Frame, float], None]
ROOM_LEFT = 64  # a full buffer drops down to max_bytes less 1/64th of it
# What CPython (3.11, 64-bit) keeps per record besides the message's own characters: the str
# header (49), the tuple (64), the receive time (24), the seq (28), the deque's slot (8).
# Counted with each record, so that max_bytes bounds the memory the buffer takes, not only the
# text (100-byte messages take 2.8 times their length).
RECORD_OVERHEAD = 173


class StandbyBuffer:
    """The recent frames of a shard's streams, bounded by age and by size."""

    def __init__(
        self,
        streams: Iterable[str],
        *,
        buffer: float,
        max_bytes: int,
        overhead: int = RECORD_OVERHEAD,
    ) -> None:
        self.buffer = buffer
        self.max_bytes = max_bytes
        self.overhead = overhead
        self._streams: dict[str, deque[Held]] = {stream: deque() for stream in streams}
        self.bytes = 0  # what the records held take: their lengths plus the overhead each
        self.dropped = 0  # records dropped because of max_bytes (age trims are not counted)
        self._hold_at = math.inf  # hold: nothing received at or after this ages out...
        self._hold_until = -math.inf  # ...before this

    def appender(self, stream: str) -> Append:
        """The append of one stream, ``(seq, frame, now)``: the hot path of a standby, with
        nothing to look up per frame."""
        entries, overhead = self._streams[stream], self.overhead

        def append(seq: int | None, frame: Frame, now: float) -> None:
            entries.append((now, seq, frame))
            self.bytes += len(frame) + overhead
            if self.bytes > self.max_bytes:
                self._make_room()

        return append

    @property
    def buffered(self) -> int:
        """Records held, all streams."""
        return sum(len(entries) for entries in self._streams.values())

    def trim(self, now: float) -> int:
        """Drop what is older than ``buffer`` seconds (but not what a hold keeps); how many."""
        cutoff = now - self.buffer
        if now < self._hold_until:
            cutoff = min(cutoff, self._hold_at)
        trimmed = 0
        for entries in self._streams.values():
            while entries and entries[0][0] < cutoff:
                self.bytes -= len(entries.popleft()[2]) + self.overhead
                trimmed += 1
        return trimmed

    def first_seq(self) -> dict[str, int]:
        """The oldest sequence number held per stream (streams holding none are absent)."""
        found = {}
        for stream, entries in self._streams.items():
            for _, seq, _ in entries:
                if seq is not None:
                    found[stream] = seq
                    break
        return found

    def hold(self, now: float) -> None:
        """Keep what is held now for ``buffer`` seconds from ``now``, whatever its age (the
        promise of a ``standby_ready``); ``max_bytes`` still applies."""
        heads = [entries[0][0] for entries in self._streams.values() if entries]
        self._hold_at = min(heads, default=now)
        self._hold_until = now + self.buffer

    def take(self, stream: str, checkpoint: int) -> list[Frame]:
        """The frames to write at promotion: those after the last one numbered at or below
        ``checkpoint`` (what the old owner wrote), in the order received. The stream's memory
        is freed (a promoted child writes live from then on)."""
        entries = self._streams[stream]
        start = 0
        for index, (_, seq, _) in enumerate(entries):
            if seq is not None and seq <= checkpoint:
                start = index + 1
        frames = [frame for _, _, frame in itertools.islice(entries, start, None)]
        self.bytes -= sum(len(frame) + self.overhead for _, _, frame in entries)
        entries.clear()
        return frames

    def _make_room(self) -> None:
        """Drop the oldest records, all streams together, down to ``ROOM_LEFT`` below
        ``max_bytes``: a full buffer makes room once per that many bytes, not per frame."""
        target = self.max_bytes - self.max_bytes // ROOM_LEFT
        streams = [entries for entries in self._streams.values() if entries]
        while self.bytes > target:
            oldest = streams[0]
            for entries in streams:
                if entries[0][0] < oldest[0][0]:
                    oldest = entries
            self.bytes -= len(oldest.popleft()[2]) + self.overhead
            self.dropped += 1
            if not oldest:
                streams.remove(oldest)


def ready_first_seq(
    connected_since: Mapping[str, float | None],
    sequenced: Collection[str],
    first_seq: Mapping[str, int],
    *,
    quiet: float,
    now: float,
) -> dict[str, int] | None:
    """The ``first_seq`` of a ``standby_ready`` if the standby is ready at ``now``, else None.

    Ready: every stream connected (``connected_since`` not None), and every sequenced stream
    either holds a record (its oldest is reported) or has been connected for ``quiet`` seconds
    without one (then it is absent: it puts no constraint on the cut)."""
    for stream, since in connected_since.items():
        if since is None:
            return None
        if stream in sequenced and stream not in first_seq and now - since < quiet:
            return None
    return {stream: seq for stream, seq in first_seq.items() if stream in sequenced}


def ready_recheck_at(
    connected_since: Mapping[str, float | None],
    sequenced: Collection[str],
    first_seq: Mapping[str, int],
    *,
    quiet: float,
) -> float | None:
    """When ``ready_first_seq`` may turn true with nothing else happening: the first moment a
    connected sequenced stream without a record has been quiet for ``quiet`` seconds. None:
    only a connect or a first record can change it (the standby waits for those, not a
    clock)."""
    due = [
        since + quiet
        for stream, since in connected_since.items()
        if since is not None and stream in sequenced and stream not in first_seq
    ]
    return min(due, default=None)
