"""Log set-up: one line per event on stderr, with the context fields that operators search by.

``[log] format = "json"`` (the default): one JSON object per line, ``{"ts", "level", "logger",
"event", "worker", ...}`` plus every ``extra=`` field the code passes (``shard``, ``stream``,
``epoch``, ``checkpoint``, ``pid``, ``code``...) and ``exc`` for an exception. ``"text"``: one
readable line per event, for terminals.

Secrets (values that came from ``${NAME}`` in the config, header values) are replaced by
``***`` in every line, whatever the format: ``add_secrets`` registers them for this process.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from shard_worker.core.redact import REDACTED as REDACTED  # re-exported: the CLI's marker too
from shard_worker.core.redact import merge_secrets, scrub
from shard_worker.core.redact import redact as redact_text

CONTEXT_FIELDS = ("worker", "shard", "epoch", "pid", "fd", "checkpoint", "code")
FORMATS = ("json", "text")

# Attributes every LogRecord has: anything else on a record came from ``extra=``.
RESERVED_ATTRS = frozenset(
    {
        *logging.LogRecord("", logging.INFO, "", 0, "", (), None).__dict__,
        "message",
        "asctime",
        "taskName",
    }
)


class Redactor:
    """The secrets of this process (only ever grows: an old secret may still be in flight).
    The redaction itself is ``shard_worker.core.redact``, shared with the children."""

    def __init__(self) -> None:
        self._secrets: tuple[str, ...] = ()

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def add(self, values: Iterable[str]) -> None:
        self._secrets = merge_secrets(self._secrets, values)

    def __call__(self, text: str) -> str:
        return redact_text(text, self._secrets)

    def scrub(self, value: Any) -> Any:
        """``value`` with every string in it redacted (dict keys and nested lists too)."""
        return scrub(value, self._secrets)


REDACTOR = Redactor()


def add_secrets(values: Iterable[str]) -> None:
    """Never write these strings to a log line (or, through ``redacting``, to stdout/stderr)."""
    REDACTOR.add(values)


def secrets() -> tuple[str, ...]:
    """Every secret registered in this process (the children are told to redact them too)."""
    return REDACTOR.secrets


def redact(text: str) -> str:
    return REDACTOR(text)


def _utc_stamp(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in RESERVED_ATTRS and not k.startswith("_")
    }


class TextFormatter(logging.Formatter):
    """``<utc time> <level> <logger> <message> key=value ...`` for terminals and journald."""

    def __init__(self, worker: str = "", redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.worker = worker
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _utc_stamp(record),
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
        return self.redactor(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO-8601 UTC, ms), ``level``, ``logger``, ``event``
    (the message), ``worker``, then every ``extra=`` field, and ``exc`` for an exception."""

    def __init__(self, worker: str = "", redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.worker = worker
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": _utc_stamp(record),
            "level": record.levelname.lower(),
            "logger": record.name.removeprefix("shardvisor."),
            "event": record.getMessage(),
        }
        if self.worker:
            event["worker"] = self.worker
        core = ("ts", "level", "logger", "event")
        event.update((k, v) for k, v in _extras(record).items() if v is not None and k not in core)
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        scrubbed = {k: self.redactor.scrub(v) for k, v in event.items()}
        return json.dumps(scrubbed, ensure_ascii=False, default=str)


def make_formatter(fmt: str = "json", worker: str = "") -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    return JsonFormatter(worker) if fmt == "json" else TextFormatter(worker)


def setup_logging(level: str = "info", worker: str = "", fmt: str = "json") -> None:
    """Our loggers at ``level``; other libraries' (botocore, trio-websocket) and Python's
    warnings at WARNING and up, through the same handler: every stderr line is one event in
    one format, and redacted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt, worker))
    handler._shardvisor = True  # type: ignore[attr-defined]  # ours, replaced on a new set-up
    ours = logging.getLogger("shardvisor")
    ours.handlers[:] = [handler]
    ours.setLevel(level.upper())
    ours.propagate = False
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "_shardvisor", False)]
    library = logging.StreamHandler(sys.stderr)
    library.setFormatter(handler.formatter)
    library.setLevel(logging.WARNING)
    library._shardvisor = True  # type: ignore[attr-defined]
    root.addHandler(library)
    logging.captureWarnings(True)


class RedactingWriter(io.TextIOBase):
    """A text stream that redacts what it writes: the CLI's stdout and stderr, so that a
    message or a traceback that is not a log record cannot print a secret either."""

    def __init__(self, stream: TextIO, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self._stream = stream
        self._redactor = redactor

    def write(self, text: str) -> int:
        self._stream.write(self._redactor(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._stream.errors


def redact_std_streams() -> None:
    """From here on, sys.stdout and sys.stderr print no registered secret."""
    if not isinstance(sys.stdout, RedactingWriter):
        sys.stdout = RedactingWriter(sys.stdout)
    if not isinstance(sys.stderr, RedactingWriter):
        sys.stderr = RedactingWriter(sys.stderr)
