"""conf/example_handler.py, the documented handler: one transaction per batch, idempotent on
(stream, seq), an older epoch never overwrites a newer one, and importable as the docs say."""

from __future__ import annotations

import importlib
import sqlite3
import sys
from pathlib import Path

import pytest

from shard_worker.adapters.sinks.handler import load_handler
from shard_worker.records import Record

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(CONF))
    monkeypatch.setenv("EXAMPLE_HANDLER_DB", str(tmp_path / "events.sqlite3"))
    sys.modules.pop("example_handler", None)
    yield load_handler("example_handler:handle")
    module = importlib.import_module("example_handler")
    if getattr(module._local, "connection", None) is not None:
        module._local.connection.close()
    sys.modules.pop("example_handler", None)


def rows(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "events.sqlite3") as db:
        return db.execute("SELECT stream, seq, epoch, data FROM events ORDER BY seq").fetchall()


def test_replays_collapse_and_a_zombie_epoch_changes_nothing(handle, tmp_path: Path) -> None:
    def rec(seq: int | None, epoch: int, value: str) -> Record:
        return Record("s1", "a", seq, epoch, "w", 1.0, {"v": value})

    handle((rec(1, 7, "x"), rec(2, 7, "x"), rec(None, 7, "u")))
    handle((rec(2, 7, "x"), rec(3, 7, "x")))  # a replay after a crash: same rows
    handle((rec(3, 8, "new"),))  # the next owner
    handle((rec(3, 7, "zombie"), rec(4, 7, "zombie")))  # a late write of the old epoch
    assert rows(tmp_path) == [
        ("a", 1, 7, '{"v": "x"}'),
        ("a", 2, 7, '{"v": "x"}'),
        ("a", 3, 8, '{"v": "new"}'),
        ("a", 4, 7, '{"v": "zombie"}'),  # (a new seq: keep the per-stream epoch to drop it)
    ]
    with sqlite3.connect(tmp_path / "events.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM unsequenced").fetchone() == (1,)
