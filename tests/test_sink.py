"""The JSON-lines sink: the record format (a public contract), paths, and when bytes hit the OS."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shard_worker.protocol import SinkSpec
from shard_worker.sink import FLUSH_BYTES, JsonlSink, render_path

KEYS = ["shard", "stream", "seq", "epoch", "worker", "ts", "data"]


def make_sink(tmp_path: Path, **spec: object) -> JsonlSink:
    template = str(tmp_path / "{shard}" / "{worker}" / "{stream}.{epoch}.jsonl")
    return JsonlSink(
        SinkSpec(path=template, **spec),  # type: ignore[arg-type]
        shard="sh-1",
        epoch=4,
        worker="w-9",
        streams=["a", "b"],
    )


def test_record_format_exactly(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    before = time.time()
    sink.write("a", 12, {"seq": 12, "x": [1, "é"]})
    sink.write("b", None, "plain text")
    sink.write("b", None, "AAEC", "base64")
    sink.close()
    a_lines = (tmp_path / "sh-1" / "w-9" / "a.4.jsonl").read_text().splitlines()
    b_lines = (tmp_path / "sh-1" / "w-9" / "b.4.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in a_lines + b_lines]
    assert [list(r) for r in records] == [KEYS, KEYS, [*KEYS, "encoding"]]
    first = records[0]
    assert isinstance(first["ts"], float)
    assert before <= first["ts"] <= time.time()
    # Exactly what json.dumps with compact separators makes of the same record.
    assert a_lines[0] == json.dumps(
        {"shard": "sh-1", "stream": "a", "seq": 12, "epoch": 4, "worker": "w-9", "ts": first["ts"]}
        | {"data": {"seq": 12, "x": [1, "é"]}},
        separators=(",", ":"),
    )
    assert records[1]["seq"] is None
    assert records[1]["data"] == "plain text"
    assert records[2]["encoding"] == "base64"


def test_path_template_and_appending(tmp_path: Path) -> None:
    template = "{shard}/x{y}/{stream}-{epoch}-{worker}.jsonl"
    rendered = render_path(template, shard="s", stream="t", epoch=3, worker="w")
    assert rendered == "s/x{y}/t-3-w.jsonl"
    for _ in range(2):  # a reopened sink appends
        sink = make_sink(tmp_path)
        sink.write("a", 1, 1)
        sink.close()
    assert len((tmp_path / "sh-1" / "w-9" / "a.4.jsonl").read_text().splitlines()) == 2


def test_nothing_reaches_the_file_before_flush(tmp_path: Path) -> None:
    sink = make_sink(tmp_path, fsync=True)
    path = sink.path("a")
    sink.write("a", 1, {"seq": 1})
    assert path.read_bytes() == b""
    sink.flush()
    assert len(path.read_bytes().splitlines()) == 1
    sink.flush()  # nothing new: nothing written twice
    assert len(path.read_bytes().splitlines()) == 1
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(RuntimeError):
        sink.write("a", 2, {})


def test_big_buffers_are_written_without_flush(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    path = sink.path("a")
    seq = 0
    while path.stat().st_size == 0:
        seq += 1
        sink.write("a", seq, {"pad": "x" * 200})
        assert seq * 250 < 2 * FLUSH_BYTES
    assert path.read_bytes().endswith(b"}\n")  # only whole lines go out
    sink.close()
    assert len(path.read_bytes().splitlines()) == seq


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown sink kind"):
        make_sink(tmp_path, kind="s3")
