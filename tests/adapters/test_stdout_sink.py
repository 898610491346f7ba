"""The stdout sink (JSON lines, one write + flush per batch, a gone reader is a failed
delivery), and the public record: record_json is the JSONL sink's line, byte for byte."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

import pytest
import trio

from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.adapters.sinks.jsonl import JsonlSink
from shard_worker.adapters.sinks.stdout import StdoutSink
from shard_worker.contract.pipe import SinkSpec
from shard_worker.records import Record, record_dict, record_json

TS = 1712345678.1234567

RECORDS = [
    Record("shard-a", "feed", 1, 7, "w-1", TS, {"a": [1, 2.5, None, True], "é": "☃"}),
    Record("shard-a", "feed", 2, 7, "w-1", TS, "text with \n and \u2028 and \ud800"),
    Record("shard-a", "other", None, 7, "w-1", TS, 42),
    Record("shard-a", "other", None, 7, "w-1", TS, "AAEC/w==", "base64"),
]


class CountingBytes(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flushes = 0

    def write(self, data) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(data)

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_record_json_is_the_jsonl_sink_line(tmp_path, monkeypatch):
    monkeypatch.setattr("shard_worker.adapters.sinks.jsonl.time.time", lambda: TS)
    spec = SinkSpec(kind="jsonl", path=str(tmp_path / "{stream}.{epoch}.jsonl"))
    sink = JsonlSink(spec, shard="shard-a", epoch=7, worker="w-1", streams=["feed", "other"])
    try:
        for record in RECORDS:
            sink.write(record.stream, record.seq, record.data, record.encoding or None)
    finally:
        sink.close()
    jsonl = (tmp_path / "feed.7.jsonl").read_bytes() + (tmp_path / "other.7.jsonl").read_bytes()
    assert jsonl == "".join(record_json(r) + "\n" for r in RECORDS).encode()
    assert jsonl.isascii()
    line = json.loads(record_json(RECORDS[3]))
    assert list(line) == ["shard", "stream", "seq", "epoch", "worker", "ts", "data", "encoding"]
    assert line == record_dict(RECORDS[3])
    assert list(json.loads(record_json(RECORDS[0]))) == list(line)[:-1]


async def test_one_write_and_flush_per_batch():
    out = CountingBytes()
    sink = StdoutSink(out)
    with trio.fail_after(5):
        await sink.deliver(RECORDS[:3])
        await sink.deliver(RECORDS[3:])
        await sink.deliver([])
    assert (out.writes, out.flushes) == (2, 2)
    assert out.getvalue().decode().splitlines() == [record_json(r) for r in RECORDS]
    assert sink.size(RECORDS[0]) == len(record_json(RECORDS[0])) + 1
    await sink.aclose()
    await sink.aclose()
    with pytest.raises(RuntimeError):
        await sink.deliver(RECORDS)


async def test_through_a_pipe():
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as reader, open(write_end, "wb") as writer:
        sink = StdoutSink(writer)
        with trio.fail_after(5):
            await sink.deliver(RECORDS)
            await sink.aclose()
        writer.close()
        assert reader.read().decode().splitlines() == [record_json(r) for r in RECORDS]


async def test_a_gone_reader_is_a_failed_delivery():
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "wb", buffering=0) as writer:
        sink = StdoutSink(writer)
        with trio.fail_after(5), pytest.raises(DeliveryFailed) as caught:
            await sink.deliver(RECORDS)
        assert caught.value.records == tuple(RECORDS)
        assert "BrokenPipeError" in caught.value.reason
        await sink.aclose()  # nothing to flush to: no error


async def test_a_gone_reader_behind_a_buffer():
    read_end, write_end = os.pipe()
    os.close(read_end)
    writer = open(write_end, "wb")  # noqa: SIM115 - closed below, whatever its buffer holds
    try:
        sink = StdoutSink(writer)
        with trio.fail_after(5), pytest.raises(DeliveryFailed):
            await sink.deliver(RECORDS)
        await sink.aclose()
    finally:
        with contextlib.suppress(BrokenPipeError):
            writer.close()


async def test_defaults_to_the_standard_output(capsysbinary):
    sink = StdoutSink()
    assert sink._stream is sys.stdout.buffer
    with trio.fail_after(5):
        await sink.deliver(RECORDS[:1])
    assert capsysbinary.readouterr().out == (record_json(RECORDS[0]) + "\n").encode()
