"""The sink record as a value: what every sink (jsonl, stdout, kinesis, sqs) carries.

One public format for all of them, so a consumer can switch destinations without a new parser::

    {"shard", "stream", "seq", "epoch", "worker", "ts", "data"}   (+ "encoding": "base64")

``record_json`` renders exactly the line of the jsonl sink (shard_worker/adapters/sinks/jsonl.py:
same keys, same order, same encoder settings), without the trailing newline: a line framing
belongs to the sinks that write streams of lines, not to a message that holds one record.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

# The settings of the jsonl sink: compact separators; ensure_ascii (the default) keeps every
# line ASCII, so lone surrogates from JSON escapes survive and len(line) == its bytes.
_encode = json.JSONEncoder(separators=(",", ":")).encode


@attrs.frozen
class Record:
    """One message of one stream, as received by the worker of ``epoch``.

    ``seq`` is None for unsequenced streams; ``received_at`` is unix seconds (time.time());
    ``data`` is the parsed JSON value, or a str (the text, or base64 when ``encoding`` says so).
    """

    shard: str
    stream: str
    seq: int | None
    epoch: int
    worker: str
    received_at: float
    data: Any
    encoding: str = ""  # "" or "base64" (a binary frame)


def record_dict(record: Record) -> dict[str, Any]:
    """The public record as a dict, keys in the contract's order."""
    out: dict[str, Any] = {
        "shard": record.shard,
        "stream": record.stream,
        "seq": record.seq,
        "epoch": record.epoch,
        "worker": record.worker,
        "ts": record.received_at,
        "data": record.data,
    }
    if record.encoding:
        out["encoding"] = record.encoding
    return out


def record_json(record: Record) -> str:
    """The record's JSON text (ASCII, no newline): the JsonlSink line minus its "\\n"."""
    return _encode(record_dict(record))
