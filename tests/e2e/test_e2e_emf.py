"""CloudWatch EMF from a real supervisor: its log lines against the specification's rules.

w1 runs alone with ``[cloudwatch] emf = true`` every second, w2 joins (w1 hands it two
shards) and w2's host dies (w1 takes them back from a dead owner). Every EMF line w1 wrote
must pass helpers.emf_spec, name only the metrics core.emf declares, and its figures must
move with the traffic: messages written per interval, hand-off and failover durations.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import trio
from helpers.emf_spec import check_emf
from helpers.fleet import FAILOVER, SHARDS, STREAMS, running_fleet, start_writing, wait_balanced

from supervisor.core.emf import metric_names

pytestmark = pytest.mark.slow

INTERVAL = 1.0


def emf_lines(log: str) -> list[dict[str, Any]]:
    """The EMF documents among a supervisor's log lines (the others are its JSON log)."""
    found = []
    for line in log.splitlines():
        if line.startswith('{"_aws"'):
            found.append(json.loads(line))
    return found


def kind(doc: dict[str, Any]) -> tuple[str, ...]:
    """A document's first dimension set: what it is about."""
    return tuple(doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0])


def worker_documents(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if kind(d) == ("Worker",) and "ShardsHeld" in d]


async def test_emf_lines_follow_the_specification_and_move_with_traffic(
    tmp_path, dynalite_server, table_name, nursery
) -> None:
    async with running_fleet(
        nursery, tmp_path, dynalite_server.url, table_name, SHARDS, rate=100.0
    ) as fleet:
        fleet.settings["cloudwatch"] = {
            "emf": True,
            "namespace": "shardvisor-test",
            "interval": "1s",
        }
        await start_writing(fleet, "w1")
        await fleet.start("w2")
        await wait_balanced(fleet, ["w1", "w2"], timeout=25)
        os.killpg(fleet.procs["w2"].pid, signal.SIGKILL)  # a host dies: no last will
        await wait_balanced(fleet, ["w1"], timeout=FAILOVER + 5)
        await trio.sleep(3 * INTERVAL)  # a few intervals of w1 writing everything
        docs = emf_lines(fleet.log("w1"))

    assert len(worker_documents(docs)) >= 5
    for doc in docs:
        assert check_emf(doc) == [], doc
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "shardvisor-test"
        assert {m["Name"] for m in directive["Metrics"]} <= metric_names()
        assert doc.get("Worker", "w1") == "w1"
    last = worker_documents(docs)[-1]
    assert (last["ShardsHeld"], last["ChildrenUp"]) == (len(SHARDS), len(SHARDS))
    assert last["LeaseValidSeconds"] > 0
    written = [d["MessagesWritten"] for d in worker_documents(docs)]
    assert all(n > 0 for n in written[-3:]), written  # every interval adds what it wrote
    assert sum(d["Failovers"] for d in worker_documents(docs)) == 2
    assert sum(d["Handoffs"] for d in worker_documents(docs)) == 2
    streams = [d for d in docs if kind(d) == ("Shard", "Stream")]
    assert {d["Stream"] for d in streams} == set(STREAMS)
    assert sum(d["MessagesWritten"] for d in streams) == sum(written)
    handoffs = [d for d in docs if "HandoffSeconds" in d]
    failovers = [d for d in docs if "FailoverSeconds" in d]
    assert len(handoffs) == 2 and all(0 < d["HandoffSeconds"] < 10 for d in handoffs)
    assert len(failovers) == 2 and all(0 < d["FailoverSeconds"] < FAILOVER + 5 for d in failovers)
    assert {d["To"] for d in handoffs} == {"w2"} and {d["From"] for d in failovers} == {"w2"}
    shards = [d for d in docs if kind(d) == ("Shard",)]
    assert {d["Shard"] for d in shards} == set(SHARDS)
    assert all(d["CheckpointAgeSeconds"] >= 0 for d in shards)
