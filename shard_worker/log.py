"""The child's log: plain lines on stderr, which the supervisor captures and forwards.

Format: ``<iso time> <level> shard=<id> stream=<id> <message>``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TextIO

import attrs


@attrs.define
class Log:
    shard: str = "-"
    out: TextIO = attrs.field(factory=lambda: sys.stderr)

    reader_gone: bool = False  # stderr's reader (the supervisor) died: logging is moot

    def line(self, level: str, message: str, *, stream: str = "-") -> None:
        if self.reader_gone:
            return
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        try:
            self.out.write(f"{now} {level} shard={self.shard} stream={stream} {message}\n")
            self.out.flush()
        except BrokenPipeError:
            # Nobody reads our log any more; the work (a last will) must go on regardless.
            self.reader_gone = True

    def info(self, message: str, *, stream: str = "-") -> None:
        self.line("INFO", message, stream=stream)

    def warning(self, message: str, *, stream: str = "-") -> None:
        self.line("WARNING", message, stream=stream)

    def error(self, message: str, *, stream: str = "-") -> None:
        self.line("ERROR", message, stream=stream)
