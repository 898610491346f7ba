"""The JSON-lines sink: one file per (stream, epoch), one record per line.

Record format (a public contract, keys in this order)::

    {"shard", "stream", "seq", "epoch", "worker", "ts", "data"}   (+ "encoding": "base64")

Records are buffered in-process and reach the OS only on ``flush()`` (at checkpoints and stop)
or when a file's buffer passes ``FLUSH_BYTES``: one syscall per ~64 KiB, not per message.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from .protocol import SinkSpec

FLUSH_BYTES = 64 * 1024

# ensure_ascii (the default) keeps every line ASCII: lone surrogates from JSON escapes survive.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def render_path(template: str, *, shard: str, stream: str, epoch: int, worker: str) -> str:
    """Fill the path placeholders with str.replace: a template may hold other braces."""
    values = {"{shard}": shard, "{stream}": stream, "{epoch}": str(epoch), "{worker}": worker}
    for placeholder, value in values.items():
        template = template.replace(placeholder, value)
    return template


class _SinkFile:
    """One open output file and the lines not yet handed to the OS."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: BinaryIO = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        self._lines: list[str] = []
        self.pending = 0  # characters buffered (the lines are ASCII: characters == bytes)
        self.unsynced = False

    def append(self, line: str) -> None:
        self._lines.append(line)
        self.pending += len(line)
        if self.pending >= FLUSH_BYTES:
            self.write_out()

    def write_out(self) -> None:
        if not self._lines:
            return
        view = memoryview("".join(self._lines).encode())
        self._lines.clear()
        self.pending = 0
        while view:
            view = view[self._file.write(view) :]
        self.unsynced = True

    def sync(self) -> None:
        if self.unsynced:
            os.fsync(self._file.fileno())
            self.unsynced = False

    def close(self) -> None:
        self._file.close()


class JsonlSink:
    """Writes records of one shard epoch; ``flush()`` makes everything written so far durable."""

    def __init__(
        self, spec: SinkSpec, *, shard: str, epoch: int, worker: str, streams: Iterable[str]
    ) -> None:
        if spec.kind != "jsonl":
            raise ValueError(f"unknown sink kind {spec.kind!r} (supported: 'jsonl')")
        self._fsync = spec.fsync
        self._closed = False
        self._files: dict[str, _SinkFile] = {}
        self._prefixes: dict[str, str] = {}
        # Everything but seq, ts and data is constant per stream: render it once.
        self._middle = f',"epoch":{epoch},"worker":{_encode(worker)},"ts":'
        try:
            for stream in streams:
                path = render_path(
                    spec.path, shard=shard, stream=stream, epoch=epoch, worker=worker
                )
                self._files[stream] = _SinkFile(Path(path))
                self._prefixes[stream] = f'{{"shard":{_encode(shard)},"stream":{_encode(stream)}'
        except BaseException:
            self._close_files()
            raise

    def path(self, stream: str) -> Path:
        return self._files[stream].path

    def write(self, stream: str, seq: int | None, data: Any, encoding: str | None = None) -> None:
        """Buffer one record; ``encoding`` ("base64") is added only for binary payloads."""
        if self._closed:
            raise RuntimeError("write to a closed sink")
        tail = "}\n" if encoding is None else f',"encoding":{_encode(encoding)}}}\n'
        line = (
            f'{self._prefixes[stream]},"seq":{"null" if seq is None else seq}{self._middle}'
            f'{time.time()!r},"data":{_encode(data)}{tail}'
        )
        self._files[stream].append(line)

    def flush(self) -> None:
        """Hand every buffered record to the OS, and fsync the files when the spec asks to."""
        for sink_file in self._files.values():
            sink_file.write_out()
            if self._fsync:
                sink_file.sync()

    def close(self) -> None:
        """Flush, then close every file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        for sink_file in self._files.values():
            sink_file.close()


def open_sink(
    spec: SinkSpec, *, shard: str, epoch: int, worker: str, streams: Iterable[str]
) -> JsonlSink:
    """The sink for ``spec.kind`` (only "jsonl" exists today)."""
    return JsonlSink(spec, shard=shard, epoch=epoch, worker=worker, streams=streams)
