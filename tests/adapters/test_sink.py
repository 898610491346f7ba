"""The JSON-lines sink: the record format (a public contract), paths, and when bytes hit the OS."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shard_worker.adapters.sinks.jsonl import FLUSH_BYTES, JsonlSink, render_path
from shard_worker.contract.pipe import SinkSpec

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


def test_rotation_starts_new_parts_and_a_restart_appends_to_the_last(tmp_path: Path) -> None:
    rotate = 2 * FLUSH_BYTES
    seq = 0

    def write_some(count: int) -> None:
        nonlocal seq
        sink = make_sink(tmp_path, rotate_bytes=rotate)
        for _ in range(count):
            seq += 1
            sink.write("a", seq, {"pad": "x" * 200})
        sink.close()

    write_some(2000)  # ~480 KB: several parts
    base = tmp_path / "sh-1" / "w-9"
    parts = sorted(base.glob("a.4*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    names = [p.name for p in parts]
    assert names[0] == "a.4.jsonl" and names[1:] == [f"a.4+{n}.jsonl" for n in range(1, len(names))]
    assert len(names) >= 3
    # Each closed part reached the size, by at most one write (64 KiB) more; whole lines only.
    for part in parts[:-1]:
        assert rotate <= part.stat().st_size < rotate + FLUSH_BYTES + 300
    last_size = parts[-1].stat().st_size
    write_some(1)  # a restarted child of the same epoch: appends to the last part
    assert parts[-1].stat().st_size > last_size
    assert sorted(p.name for p in base.glob("a.4*.jsonl")) == sorted(names)
    lines = [line for p in parts for line in p.read_text().splitlines()]
    assert sorted(json.loads(line)["seq"] for line in lines) == list(range(1, seq + 1))
    assert not list(base.glob("b.4+*.jsonl"))  # an idle stream never rotates


def test_sink_audit_reads_every_part_and_skips_dead_letters(tmp_path: Path) -> None:
    from shard_worker.adapters.sinks.jsonl import DeadLetterSink
    from supervisor.devtools.sink_audit import audit_sink_dir

    sink = make_sink(tmp_path, rotate_bytes=FLUSH_BYTES)
    for seq in range(1, 1001):
        sink.write("a", seq, {"pad": "x" * 200})
    sink.close()
    dead = DeadLetterSink(
        str(tmp_path / "{shard}" / "dead-letter.{epoch}.jsonl"), shard="sh-1", epoch=4, worker="w"
    )
    dead.write("a", 1001, {"seq": 1001}, reason="malformed", error="x")
    dead.close()
    audit = audit_sink_dir(tmp_path)["a"]
    assert audit.delivered == 1000 and audit.missing() == [] and audit.dead_letters == 1


def test_dead_letters_are_records_plus_reason_and_error(tmp_path: Path) -> None:
    from shard_worker.adapters.sinks.jsonl import DeadLetterSink
    from shard_worker.records import Record

    template = str(tmp_path / "{shard}" / "dl.{epoch}.jsonl")
    dead = DeadLetterSink(template, shard="sh-1", epoch=4, worker="w-9")
    assert not (tmp_path / "sh-1").exists()  # opened at the first dead letter only
    dead.write("a", None, "not json", reason="malformed", error="not JSON")
    dead.write("a", None, "//4=", reason="malformed", error="binary", encoding="base64")
    dead.write_record(
        Record("sh-1", "b", 7, 4, "w-9", 1.5, {"seq": 7}), reason="delivery_failed", error="e"
    )
    path = tmp_path / "sh-1" / "dl.4.jsonl"
    assert path.read_bytes() == b""  # buffered until flush
    dead.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [list(line) for line in lines] == [
        [*KEYS, "reason", "error"],
        [*KEYS, "encoding", "reason", "error"],
        [*KEYS, "reason", "error"],
    ]
    assert lines[2] == {
        **{"shard": "sh-1", "stream": "b", "seq": 7, "epoch": 4, "worker": "w-9", "ts": 1.5},
        **{"data": {"seq": 7}, "reason": "delivery_failed", "error": "e"},
    }
    assert dead.count == 3


def test_data_json_is_written_as_is(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    sink.write("a", 1, {"seq": 1, "x": 2}, data_json='{"seq": 1, "x": 2}')
    sink.close()
    line = (tmp_path / "sh-1" / "w-9" / "a.4.jsonl").read_text()
    assert line.endswith(',"data":{"seq": 1, "x": 2}}\n')
    assert json.loads(line)["data"] == {"seq": 1, "x": 2}


def test_sink_audit_skips_a_line_still_being_written(tmp_path: Path) -> None:
    """Tests read sink files while children write them: a torn last line is not a record yet
    (it failed a fleet test with a JSONDecodeError)."""
    from supervisor.devtools.sink_audit import audit_sink_dir

    sink = make_sink(tmp_path)
    for seq in range(1, 4):
        sink.write("a", seq, {"n": seq})
    sink.close()
    (path,) = tmp_path.rglob("a.*.jsonl")
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"shard": "sh-1", "stream": "a", "seq": 4, "epo')
    audit = audit_sink_dir(tmp_path)["a"]
    assert [r.seq for r in audit.records] == [1, 2, 3]


def test_the_follower_sees_what_the_files_gain_and_agrees_with_the_audit(tmp_path: Path) -> None:
    """``Fleet.wait_written`` polls it: each look parses only what was appended (new rotated
    parts included), a torn last line waits for its newline, dead letters are not records."""
    from shard_worker.adapters.sinks.jsonl import DeadLetterSink
    from supervisor.devtools.sink_audit import SinkFollower, audit_sink_dir

    follower = SinkFollower(tmp_path)
    assert follower.max_seq("a") == 0  # nothing written yet: no files at all
    sink = make_sink(tmp_path, rotate_bytes=FLUSH_BYTES)
    for seq in range(1, 501):
        sink.write("a", seq, {"pad": "x" * 200})
    sink.flush()
    assert follower.max_seq("a") == audit_sink_dir(tmp_path)["a"].max_seq
    for seq in range(501, 1001):  # rotates into new parts
        sink.write("a", seq, {"pad": "x" * 200})
    sink.close()
    assert len(list(tmp_path.rglob("a.4*.jsonl"))) >= 3
    assert follower.max_seq("a") == 1000 == audit_sink_dir(tmp_path)["a"].max_seq
    last = max(tmp_path.rglob("a.4*.jsonl"), key=lambda p: int(p.stem.partition("+")[2] or 0))
    with last.open("a", encoding="utf-8") as fh:
        fh.write('{"shard": "sh-1", "stream": "a", "seq": 1001, "epo')
    assert follower.max_seq("a") == 1000  # a line still being written
    with last.open("a", encoding="utf-8") as fh:
        fh.write('ch": 4, "worker": "w-9", "ts": 1.0, "data": {}}\n')
    assert follower.max_seq("a") == 1001
    dead = DeadLetterSink(
        str(tmp_path / "{shard}" / "dead-letter.{epoch}.jsonl"), shard="sh-1", epoch=4, worker="w"
    )
    dead.write("a", 2000, {"seq": 2000}, reason="malformed", error="x")
    dead.close()
    assert follower.max_seq("a") == 1001
