"""Log set-up: one line per event on stderr, with the context fields that operators search by."""

from __future__ import annotations

import logging
import sys
import time

CONTEXT_FIELDS = ("worker", "shard", "epoch", "pid", "fd", "checkpoint", "code")


class TextFormatter(logging.Formatter):
    """``<utc time> <level> <logger> <message> key=value ...`` for terminals and journald."""

    def __init__(self, worker: str = "") -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"{stamp}.{int(record.msecs):03d}Z",
            record.levelname.lower(),
            record.name.removeprefix("shardvisor."),
            record.getMessage(),
        ]
        fields = {"worker": self.worker} if self.worker else {}
        fields.update(
            {k: getattr(record, k) for k in CONTEXT_FIELDS if getattr(record, k, None) is not None}
        )
        parts.extend(f"{k}={v}" for k, v in fields.items())
        line = " ".join(str(part) for part in parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "info", worker: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter(worker))
    root = logging.getLogger("shardvisor")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
