"""Sinks through real supervisors: a handler that crashes its child (on_failure = "crash") is
restarted and loses nothing; a stdout sink's records reach the supervisor's stdout whole and
never interleaved. Real processes, moto's DynamoDB server over HTTP, a real feed."""

from __future__ import annotations

import json

import pytest
import trio
from helpers.fleet import STREAMS, Fleet
from helpers.worker_helpers import pythonpath

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("ddb_url", ["moto"], indirect=True),  # the sinks, not the store
]


async def wait_handled(fleet: Fleet, at_least: int, timeout: float) -> None:
    with trio.fail_after(timeout):
        while True:
            audits = fleet.audit()
            if len(audits) == len(STREAMS) and all(a.max_seq >= at_least for a in audits.values()):
                return
            await trio.sleep(0.1)


async def test_a_handler_crash_restarts_the_child_and_loses_nothing(fleet: Fleet) -> None:
    fleet.overrides["sink"] = {
        "kind": "handler",
        "handler": "helpers.sink_handlers:crash_once",
        "batch_max_records": 10,
        "batch_max_wait": "50ms",
        "max_attempts": 2,
        "on_failure": "crash",
    }
    env = {
        "PYTHONPATH": pythonpath(),
        "SINK_HANDLER_OUT": str(fleet.workdir / "out"),
        "SINK_HANDLER_FAIL": "100",
    }
    with trio.fail_after(60):
        await fleet.start("w1", env=env)
        await fleet.wait_until_owned(by=["w1"], timeout=10)
        await wait_handled(fleet, 300, timeout=30)
        await fleet.stop_all()
    log = fleet.log("w1")
    assert "child exited with 4" in log  # on_failure = "crash", then restarted
    assert "refusing seq >= 100" in log  # the handler's error reached the log
    assert (fleet.workdir / "out" / "crash-once.pid").exists()
    for stream, audit in fleet.audit().items():
        assert audit.missing() == [], f"{stream} lost records across the crash"
        assert audit.max_seq >= 300


async def test_stdout_sink_records_reach_the_supervisors_stdout_whole(fleet: Fleet) -> None:
    fleet.overrides["sink"] = {"kind": "stdout", "batch_max_wait": "20ms"}
    stdout = fleet.workdir / "records.jsonl"
    with trio.fail_after(40):
        await fleet.start("w1", stdout=stdout)
        await fleet.wait_until_owned(by=["w1"], timeout=10)
        with trio.fail_after(20):
            while len(stdout.read_bytes().splitlines()) < 200 * len(STREAMS):
                await trio.sleep(0.1)
        await fleet.stop_all()
    text = stdout.read_text()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]  # every line whole JSON
    assert {r["stream"] for r in records} == set(STREAMS)
    for stream in STREAMS:
        seqs = [r["seq"] for r in records if r["stream"] == stream]
        assert seqs == list(range(1, len(seqs) + 1)), f"{stream}: lost, repeated or reordered"
    assert all(
        list(r)[:7] == ["shard", "stream", "seq", "epoch", "worker", "ts", "data"] for r in records
    )
    assert "ready" in fleet.log("w1")  # the log went to stderr, not among the records
