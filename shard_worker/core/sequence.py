"""Sequence numbers of a feed: find them in a message, then drop duplicates and count gaps.

Pure code (no I/O) so the dedup rules can be tested exhaustively on their own.
"""

from __future__ import annotations

from typing import Any

import attrs


class MalformedMessage(ValueError):
    """A message of a sequenced stream carries no usable sequence number."""


@attrs.frozen
class SequencePath:
    """A dotted path such as ``"seq"`` or ``"meta.seq"``, split once instead of per message."""

    parts: tuple[str, ...]

    @classmethod
    def parse(cls, path: str) -> SequencePath:
        parts = tuple(path.split("."))
        if not path or any(not part for part in parts):
            raise ValueError(f"bad sequence path {path!r}")
        return cls(parts)

    def lookup(self, data: Any) -> Any:
        """The value at this path; MalformedMessage when a step is missing."""
        node = data
        for part in self.parts:
            if not isinstance(node, dict) or part not in node:
                raise MalformedMessage(f"no {'.'.join(self.parts)!r} in the message")
            node = node[part]
        return node

    def extract(self, data: Any) -> int:
        """The sequence number at this path; a bool or a float is not one."""
        value = self.lookup(data)
        if type(value) is not int:
            raise MalformedMessage(f"sequence {value!r:.50} is not an integer")
        return value


@attrs.define
class SequenceTracker:
    """Remembers the last admitted sequence of one stream and counts what was off.

    ``last`` starts at the checkpoint the worker resumes from (0 = from the beginning).
    """

    last: int = 0
    duplicates: int = 0
    gaps: int = 0  # gap events
    missing: int = 0  # sequence numbers skipped over, all gaps together

    def admit(self, seq: int) -> int | None:
        """None for a duplicate (drop it); else how many numbers were skipped before ``seq``.

        An admitted ``seq`` becomes ``last``: the caller writes it (or the process exits).
        """
        if seq <= self.last:
            self.duplicates += 1
            return None
        skipped = seq - self.last - 1
        if skipped:
            self.gaps += 1
            self.missing += skipped
        self.last = seq
        return skipped
