"""The JSON-lines sink: one file per (stream, epoch), one record per line.

Record format (a public contract, keys in this order)::

    {"shard", "stream", "seq", "epoch", "worker", "ts", "data"}   (+ "encoding": "base64")

Records are buffered in-process and reach the OS only on ``flush()`` (at checkpoints and stop)
or when a file's buffer passes ``FLUSH_BYTES``: one syscall per ~64 KiB, not per message.

With ``rotate_bytes`` a file that has reached that size is closed and the next part opened: part
0 is the rendered path itself, part n the same name with ``+n`` before its extension
(``s1-a.7.jsonl``, ``s1-a.7+1.jsonl``, ...). ``+`` is never in a shard or stream id, so parts of
different streams never collide, and the epoch stays in every name. A child restarted within the
same epoch appends to the last part.

``DeadLetterSink`` writes the records (and events) that could not be delivered: the same record
format plus ``reason`` and ``error``, one file per shard epoch by default.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from shard_worker.contract.pipe import SinkSpec
from shard_worker.records import Record, record_dict

FLUSH_BYTES = 64 * 1024

# One stream's record writer: (seq, data, encoding, data_json); see JsonlSink.write.
LineWriter = Callable[[int | None, Any, str, str | None], None]

# ensure_ascii (the default) keeps every line ASCII: lone surrogates from JSON escapes survive.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def render_path(template: str, *, shard: str, stream: str, epoch: int, worker: str) -> str:
    """Fill the path placeholders with str.replace: a template may hold other braces."""
    values = {"{shard}": shard, "{stream}": stream, "{epoch}": str(epoch), "{worker}": worker}
    for placeholder, value in values.items():
        template = template.replace(placeholder, value)
    return template


def part_path(path: Path, part: int) -> Path:
    """Part ``part`` of a rotated file: the path itself, then ``name+1.jsonl``, ``name+2...``."""
    if part == 0:
        return path
    return path.with_name(f"{path.stem}+{part}{path.suffix}")


class _SinkFile:
    """One open output file (or rotated series of files) and the lines not yet handed to the OS."""

    def __init__(self, path: Path, *, rotate_bytes: int = 0, fsync: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.base = path
        self.rotate_bytes = rotate_bytes
        self.fsync = fsync
        self.part = 0
        if rotate_bytes:  # a restarted child of the same epoch continues the last part
            while part_path(path, self.part + 1).exists():
                self.part += 1
        self._lines: list[str] = []
        self.pending = 0  # characters buffered (the lines are ASCII: characters == bytes)
        self.unsynced = False
        self._open()

    def _open(self) -> None:
        self.path = part_path(self.base, self.part)
        self._file: BinaryIO = open(self.path, "ab", buffering=0)  # noqa: SIM115 - see close()
        self.size = os.fstat(self._file.fileno()).st_size
        if self.rotate_bytes and self.size >= self.rotate_bytes:
            self._rotate()

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
        self.size += len(view)
        while view:
            view = view[self._file.write(view) :]
        self.unsynced = True
        if self.rotate_bytes and self.size >= self.rotate_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """Close this part (synced first when fsync is on: nothing will sync it later)."""
        if self.fsync:
            self.sync()
        self._file.close()
        self.part += 1
        self._open()

    def sync(self) -> None:
        if self.unsynced:
            os.fsync(self._file.fileno())
            self.unsynced = False

    def close(self) -> None:
        self._file.close()


class _FileSet:
    """What both file sinks share: flush (fsync on request) and an idempotent close."""

    _files: dict[str, _SinkFile]
    _fsync: bool
    _closed: bool

    def flush(self) -> None:
        """Hand every buffered line to the OS, and fsync the files when asked to."""
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
            for sink_file in self._files.values():
                sink_file.close()


class JsonlSink(_FileSet):
    """Writes records of one shard epoch; ``flush()`` makes everything written so far durable."""

    def __init__(
        self, spec: SinkSpec, *, shard: str, epoch: int, worker: str, streams: Iterable[str]
    ) -> None:
        if spec.kind != "jsonl":
            raise ValueError(f"unknown sink kind {spec.kind!r} (JsonlSink writes 'jsonl')")
        self._fsync = spec.fsync
        self._closed = False
        self._files: dict[str, _SinkFile] = {}
        self._writers: dict[str, LineWriter] = {}
        # Everything but seq, ts and data is constant per stream: render it once.
        middle = f',"epoch":{epoch},"worker":{_encode(worker)},"ts":'
        try:
            for stream in streams:
                path = render_path(
                    spec.path, shard=shard, stream=stream, epoch=epoch, worker=worker
                )
                self._files[stream] = _SinkFile(
                    Path(path), rotate_bytes=spec.rotate_bytes, fsync=spec.fsync
                )
                prefix = f'{{"shard":{_encode(shard)},"stream":{_encode(stream)},"seq":'
                self._writers[stream] = self._line_writer(self._files[stream], prefix, middle)
        except BaseException:
            for sink_file in self._files.values():
                sink_file.close()
            raise

    def path(self, stream: str) -> Path:
        return self._files[stream].path

    def write(
        self,
        stream: str,
        seq: int | None,
        data: Any,
        encoding: str | None = None,
        data_json: str | None = None,
    ) -> None:
        """Buffer one record; ``encoding`` ("base64") is added only for binary payloads.

        ``data_json``: ``data`` as JSON text already (the message as received, when it is
        ASCII on one line: see shard_worker/core/frames.py), written as is instead of encoding
        ``data`` again: the same JSON value, without a second pass over it."""
        self._writers[stream](seq, data, encoding or "", data_json)

    def line_writer(self, stream: str) -> LineWriter:
        """``write`` of one stream, ``(seq, data, encoding, data_json)``: the hot path of a busy
        stream (see Recorder.writer), with nothing to look up per record."""
        return self._writers[stream]

    def _line_writer(self, sink_file: _SinkFile, prefix: str, middle: str) -> LineWriter:
        lines = sink_file._lines  # (write_out clears it in place: the same list throughout)
        wall = time.time

        def write(seq: int | None, data: Any, encoding: str, data_json: str | None) -> None:
            if self._closed:
                raise RuntimeError("write to a closed sink")
            if data_json is None:
                data_json = _encode(data)
            tail = f',"encoding":{_encode(encoding)}}}\n' if encoding else "}\n"
            seq_json = "null" if seq is None else seq
            line = f'{prefix}{seq_json}{middle}{wall()!r},"data":{data_json}{tail}'
            lines.append(line)  # _SinkFile.append, inlined: this runs per message
            sink_file.pending += len(line)
            if sink_file.pending >= FLUSH_BYTES:
                sink_file.write_out()

        return write


class DeadLetterSink(_FileSet):
    """Records (and feed events) that could not be delivered, as JSON lines: the public record
    plus ``reason`` (a short code) and ``error`` (what happened). Files are opened at the first
    dead letter, so a healthy shard leaves none. ``flush()`` hands them to the OS (and fsyncs
    with ``fsync``); the worker flushes them before it reports any checkpoint that covers them.
    """

    def __init__(
        self, template: str, *, shard: str, epoch: int, worker: str, fsync: bool = False
    ) -> None:
        self._template = template
        self._shard, self._epoch, self._worker = shard, epoch, worker
        self._fsync = fsync
        self._files: dict[str, _SinkFile] = {}  # by rendered path
        self._closed = False
        self.count = 0

    def path(self, stream: str) -> Path:
        return Path(
            render_path(
                self._template,
                shard=self._shard,
                stream=stream,
                epoch=self._epoch,
                worker=self._worker,
            )
        )

    def write_record(self, record: Record, *, reason: str, error: str) -> None:
        """A record that could not be delivered (or was not fit to be)."""
        self._append(record.stream, {**record_dict(record), "reason": reason, "error": error})

    def write(
        self,
        stream: str,
        seq: int | None,
        data: Any,
        *,
        reason: str,
        error: str,
        encoding: str = "",
    ) -> None:
        """A message of ``stream`` (or an event: ``data`` None) that never became a record."""
        line: dict[str, Any] = {"shard": self._shard, "stream": stream, "seq": seq}
        line |= {"epoch": self._epoch, "worker": self._worker, "ts": time.time(), "data": data}
        if encoding:
            line["encoding"] = encoding
        self._append(stream, {**line, "reason": reason, "error": error})

    def _append(self, stream: str, line: dict[str, Any]) -> None:
        if self._closed:
            raise RuntimeError("write to a closed dead-letter sink")
        path = str(self.path(stream))
        sink_file = self._files.get(path)
        if sink_file is None:
            sink_file = self._files[path] = _SinkFile(Path(path))
        sink_file.append(_encode(line) + "\n")
        self.count += 1


def open_sink(
    spec: SinkSpec, *, shard: str, epoch: int, worker: str, streams: Iterable[str]
) -> JsonlSink:
    """The JSON-lines sink of ``spec`` (the other kinds are batch sinks in this package)."""
    return JsonlSink(spec, shard=shard, epoch=epoch, worker=worker, streams=streams)
