"""Reading jsonl sink files back to check the guarantees: no gap, epochs never interleave.

Used by the demo's summary, the end-to-end tests and the benchmarks, so all three judge the same
way. Works on the public record format ``{"shard","stream","seq","epoch","worker","ts","data"}``.

Every ``*.jsonl`` file under the root is read, rotated parts (``name+1.jsonl``...) included.
Dead letters (records with a ``reason``, in the dead-letter files) are not deliveries: they are
counted in ``dead_letters`` per stream, not in the records.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs


@attrs.frozen
class Written:
    seq: int
    epoch: int
    ts: float
    worker: str


@attrs.define
class StreamAudit:
    stream: str
    records: list[Written] = attrs.field(factory=list)
    dead_letters: int = 0  # lines of this stream in dead-letter files (not in ``records``)

    @property
    def seqs(self) -> set[int]:
        return {r.seq for r in self.records}

    @property
    def delivered(self) -> int:
        return len(self.seqs)

    @property
    def max_seq(self) -> int:
        return max((r.seq for r in self.records), default=0)

    @property
    def lost(self) -> int:
        """Sequence numbers between the first and the last written that nobody wrote: what a
        live-only feed lost (it starts wherever the first connect found it; ``gaps`` counts
        from 1, for a feed that replays from the start)."""
        seqs = self.seqs
        return (max(seqs) - min(seqs) + 1 - len(seqs)) if seqs else 0

    @property
    def gaps(self) -> int:
        """Sequence numbers in 1..max never written by anyone."""
        return self.max_seq - self.delivered

    def missing(self) -> list[int]:
        seqs = self.seqs
        return [n for n in range(1, self.max_seq + 1) if n not in seqs]

    @property
    def rewritten(self) -> int:
        """Records written more than once (by a later epoch after a crash: at-least-once)."""
        return len(self.records) - self.delivered

    @property
    def epochs(self) -> list[int]:
        return sorted({r.epoch for r in self.records})

    def span(self, epoch: int) -> tuple[float, float]:
        times = [r.ts for r in self.records if r.epoch == epoch]
        return min(times), max(times)

    def interleavings(self) -> list[tuple[int, int]]:
        """Pairs of epochs whose writing periods overlap in time: two writers at once."""
        spans = sorted((self.span(e), e) for e in self.epochs)
        bad = []
        for (prev_span, prev), (span, epoch) in itertools.pairwise(spans):
            if span[0] < prev_span[1]:
                bad.append((prev, epoch))
        return bad

    def first_write_after(self, t: float) -> float:
        """When an epoch that had not written before ``t`` wrote its first record."""
        old = {r.epoch for r in self.records if r.ts < t}
        new = [r.ts for r in self.records if r.epoch not in old and r.ts >= t]
        return min(new) if new else float("nan")

    def switch_gap_after(self, t: float) -> float:
        """Gap between the last record of the epoch writing at ``t`` and the next epoch's first."""
        before = [r for r in self.records if r.ts < t]
        if not before:
            return float("nan")
        old = max(before, key=lambda r: r.ts).epoch
        old_last = max(r.ts for r in self.records if r.epoch == old)
        later = [r.ts for r in self.records if r.epoch > old]
        return min(later) - old_last if later else float("nan")


def read_records(paths: Iterable[Path]) -> dict[str, StreamAudit]:
    """Every record of the sink files. A last line without its newline is a write still under
    way (the files may be read while children write them): it is not a record yet."""
    audits: dict[str, StreamAudit] = {}
    for path in sorted(paths):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if not line.strip() or not line.endswith("\n"):
                    continue
                rec = json.loads(line)
                if "reason" in rec:  # a dead letter: not delivered
                    audit = audits.setdefault(rec["stream"], StreamAudit(rec["stream"]))
                    audit.dead_letters += 1
                    continue
                if rec.get("seq") is None:
                    continue
                audit = audits.setdefault(rec["stream"], StreamAudit(rec["stream"]))
                audit.records.append(Written(rec["seq"], rec["epoch"], rec["ts"], rec["worker"]))
    for audit in audits.values():
        audit.records.sort(key=lambda r: (r.ts, r.seq))
    return audits


def audit_sink_dir(root: Path) -> dict[str, StreamAudit]:
    return read_records(root.rglob("*.jsonl"))


@attrs.frozen
class EpochChange:
    """A stream's move from one writer (epoch) to the next, as its records show it."""

    shard: str
    stream: str
    old: int
    new: int
    before: list[Written]  # the old epoch's records
    after: list[Written]  # the new epoch's


def epoch_changes(
    shards: Mapping[str, Sequence[str]], audits: Mapping[str, StreamAudit]
) -> Iterator[EpochChange]:
    """Every change of epoch of every stream of ``shards``, in order."""
    for shard, streams in shards.items():
        for stream in streams:
            by_epoch: dict[int, list[Written]] = defaultdict(list)
            for record in audits.get(stream, StreamAudit(stream)).records:
                by_epoch[record.epoch].append(record)
            for old, new in itertools.pairwise(sorted(by_epoch)):
                yield EpochChange(shard, stream, old, new, by_epoch[old], by_epoch[new])


@attrs.define
class SinkFollower:
    """How far each stream has been written under ``root``, read as the files grow: each look
    parses only the lines appended since the last one. Waiting on a busy fleet by re-reading
    every sink file costs what the fleet ever wrote, on each poll, in the process that often
    also runs the feed; this costs what was written since. (The jsonl sink only appends: a
    rotated part is a new file, never a renamed one.)"""

    root: Path
    _offsets: dict[Path, int] = attrs.field(factory=dict)
    _max_seq: dict[str, int] = attrs.field(factory=dict)

    def max_seq(self, stream: str) -> int:
        """The highest sequence number of ``stream`` written so far (0: none)."""
        for path in sorted(self.root.rglob("*.jsonl")):
            self._read_new(path)
        return self._max_seq.get(stream, 0)

    def _read_new(self, path: Path) -> None:
        offset = self._offsets.get(path, 0)
        with path.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        complete = chunk.rfind(b"\n") + 1  # a last line without its newline is still being written
        self._offsets[path] = offset + complete
        for line in chunk[:complete].splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if "reason" in rec or rec.get("seq") is None:  # a dead letter: not delivered
                continue
            stream = rec["stream"]
            self._max_seq[stream] = max(self._max_seq.get(stream, 0), rec["seq"])
