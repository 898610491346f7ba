"""The child's log: one line per event on stderr, which the supervisor captures and forwards.

Two formats (``WorkerSettings.log_format``, set by the supervisor from ``[log] format``):

- ``text``: ``<iso time> <LEVEL> shard=<id> stream=<id> <message>`` (also before ``start``);
- ``json``: one object per line, ``{"ts", "level", "event", "shard", "stream", "epoch", ...}``,
  which the supervisor merges into one JSON event of its own (adding ``worker`` and ``pid``).

Every string in ``redact`` (config secrets, header values) is replaced by ``***`` in every
line, tracebacks included.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

import attrs

from shard_worker.core.redact import merge_secrets, redact

MAX_EXC_CHARS = 6000  # keep a line well under the supervisor's 8 KiB line cut


@attrs.define
class RateLimitedCount:
    """Counts events; ``hit()`` says whether it is time to log again (once per interval), so a
    burst of the same trouble makes one line, not one per message."""

    interval: float
    count: int = 0
    _last_logged: float = float("-inf")

    def hit(self, n: int = 1) -> bool:
        self.count += n
        now = time.monotonic()
        if now - self._last_logged >= self.interval:
            self._last_logged = now
            return True
        return False


@attrs.define
class Log:
    shard: str = "-"
    out: TextIO = attrs.field(factory=lambda: sys.stderr)
    format: str = "text"  # text | json
    epoch: int | None = None
    _secrets: tuple[str, ...] = ()

    reader_gone: bool = False  # stderr's reader (the supervisor) died: logging is moot

    def configure(
        self, *, shard: str, epoch: int, log_format: str, redact: tuple[str, ...] = ()
    ) -> None:
        """From the start message: who we are, how to write, what never to write."""
        self.shard, self.epoch = shard, epoch
        self.format = "json" if log_format == "json" else "text"
        self._secrets = merge_secrets(self._secrets, redact)

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def line(self, level: str, message: str, *, stream: str = "-", exc: str = "") -> None:
        if self.reader_gone:
            return
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        if self.format == "json":
            record: dict[str, Any] = {
                "ts": stamp.replace("+00:00", "Z"),
                "level": level.lower(),
                "event": message,
                "shard": self.shard,
            }
            if stream != "-":
                record["stream"] = stream
            if self.epoch is not None:
                record["epoch"] = self.epoch
            if exc:
                record["exc"] = exc[-MAX_EXC_CHARS:]
            record = {k: self.redact(v) if isinstance(v, str) else v for k, v in record.items()}
            text = json.dumps(record, ensure_ascii=False) + "\n"
        else:
            text = f"{stamp} {level} shard={self.shard} stream={stream} {message}\n"
            if exc:
                text += exc if exc.endswith("\n") else exc + "\n"
            text = self.redact(text)
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            # Nobody reads our log any more; the work (a last will) must go on regardless.
            self.reader_gone = True

    def info(self, message: str, *, stream: str = "-") -> None:
        self.line("INFO", message, stream=stream)

    def warning(self, message: str, *, stream: str = "-") -> None:
        self.line("WARNING", message, stream=stream)

    def error(self, message: str, *, stream: str = "-", exc: str = "") -> None:
        self.line("ERROR", message, stream=stream, exc=exc)
