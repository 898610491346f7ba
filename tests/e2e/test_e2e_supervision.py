"""Supervision with real misbehaving children (tests/helpers/faulty_worker.py), real signals and
a real DynamoDB server."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from helpers.fleet import (
    DURATION,
    RECONCILE,
    STREAMS,
    assert_no_gap_and_no_overlap,
    catch_up,
    start_writing,
    wait_for_log,
)

from shard_worker.drivers.worker import LAST_WILL_TIMEOUT
from supervisor.devtools.fleet import alive, child_pids

pytestmark = pytest.mark.slow
FAULTY = str(Path(__file__).resolve().parents[1] / "helpers" / "faulty_worker.py")


def faulty(fleet, mode: str, **supervisor: object) -> None:
    fleet.overrides["supervisor"] = {
        "spawn": "fresh",
        "worker_command": [sys.executable, FAULTY, mode],
        **supervisor,
    }


async def test_a_child_stuck_in_a_busy_loop_is_replaced_within_hang_timeout(fleet):
    fleet.shards = {"s1": ["s1-a"]}
    faulty(fleet, "hang", hang_timeout="1s", max_restarts=100)
    await fleet.start("w1")
    await fleet.wait_until_owned(by=["w1"], timeout=10)
    await fleet.wait_written("s1-a", 1, timeout=10)
    (first,) = child_pids(fleet.procs["w1"].pid)
    match = await wait_for_log(fleet, "w1", r"child hung: no heartbeat for ([0-9.]+)s", 10)
    assert float(match.group(1)) <= 1.0 + 0.5  # noticed within a watch tick of the timeout
    await wait_for_log(fleet, "w1", r"child exited with -9 \(hang\); restarting", 3)
    with trio.fail_after(3):
        while not [p for p in child_pids(fleet.procs["w1"].pid) if p != first]:
            await trio.sleep(0.05)


async def test_a_child_that_ignores_sigterm_is_killed_at_its_deadline(fleet):
    fleet.shards = {"s1": ["s1-a"]}
    faulty(fleet, "ignore-term", shutdown_timeout="3s")
    await fleet.start("w1")
    await fleet.wait_written("s1-a", 1, timeout=10)
    (child,) = child_pids(fleet.procs["w1"].pid)
    started = trio.current_time()
    fleet.kill("w1", signal.SIGTERM)
    with trio.fail_after(10):
        assert await fleet.procs["w1"].wait() == 0
    assert trio.current_time() - started < 3.0
    log = fleet.log("w1")
    assert "missed its stop deadline: SIGTERM" in log and "ignored SIGTERM: SIGKILL" in log
    assert not alive(child)
    assert (await fleet.owners()) == {"s1": ""}  # released all the same


async def test_a_crash_looping_shard_is_quarantined_and_released(fleet):
    fleet.shards = {"s1": ["s1-a"]}
    faulty(fleet, "crash", max_restarts=3, restart_window="1m")
    await fleet.start("w1")
    await wait_for_log(fleet, "w1", r"crash loop: 3 restarts within 60", 20)
    with trio.fail_after(5):
        while (await fleet.snapshot()).shards[0].state != "quarantined":
            await trio.sleep(0.05)
    (shard,) = (await fleet.snapshot()).shards
    assert shard.owner == "" and shard.epoch == 1
    assert fleet.procs["w1"].returncode is None  # one poison shard does not stop the host


async def test_a_host_whose_shards_all_crash_loop_exits_70(fleet):
    faulty(fleet, "crash", max_restarts=2, restart_window="1m")
    await fleet.start("w1")
    with trio.fail_after(30):
        code = await fleet.procs["w1"].wait()
    assert code == 70
    assert "this host is unhealthy" in fleet.log("w1")
    assert {s.state for s in (await fleet.snapshot()).shards} <= {"quarantined", "released"}


@pytest.mark.parametrize("spawn", ["zygote", "fresh"])
async def test_sigkill_of_the_supervisor_its_children_release_their_shards_and_exit(fleet, spawn):
    """Orphaned children stop writing, release their own shard (the last will, which imports
    boto3 and makes two requests) and exit: bounded by the will's own deadline."""
    fleet.overrides["supervisor"] = {"spawn": spawn}
    await start_writing(fleet, "w1")
    children = child_pids(fleet.procs["w1"].pid)
    assert len(children) == len(fleet.shards)
    fleet.kill("w1")
    await fleet.procs["w1"].wait()
    with trio.fail_after(LAST_WILL_TIMEOUT + 1.0):  # a zombie awaiting reaping counts as exited
        while any(alive(pid) for pid in children):
            await trio.sleep(0.02)
    snapshot = await fleet.snapshot()
    assert {(s.owner, s.state) for s in snapshot.shards} == {("", "last-will")}
    assert [w.state for w in snapshot.workers] == ["orphaned"]


@pytest.mark.parametrize("whole_group", [False, True], ids=["supervisor", "process-group"])
async def test_a_frozen_host_never_writes_after_a_peer_took_over(fleet, whole_group):
    """SIGSTOP for 2 x lease.duration: the peer takes every shard; the frozen host's children
    stop at their fence (or, if frozen too, find it passed when continued); after SIGCONT the
    old supervisor drops what it lost. The sink must show no old epoch after a newer one."""
    await start_writing(fleet, "w1")
    await fleet.start("w2")
    await fleet.wait_registered("w2", timeout=10)
    pid = fleet.procs["w1"].pid
    freeze = os.killpg if whole_group else os.kill
    freeze(pid, signal.SIGSTOP)
    try:
        await fleet.wait_until_owned(by=["w2"], timeout=DURATION + RECONCILE + 3)
        await trio.sleep(2 * DURATION - (DURATION + RECONCILE))
    finally:
        freeze(pid, signal.SIGCONT)
    continued = time.time()
    await wait_for_log(fleet, "w1", r"lease lost", 5)
    await trio.sleep(1.5)
    await catch_up(fleet, behind=50, timeout=10)
    await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS)  # no old epoch wrote after a newer one
    for stream, audit in fleet.audit().items():
        first_epoch = min(audit.epochs)
        late = [r for r in audit.records if r.epoch == first_epoch and r.ts >= continued]
        assert late == [], f"{stream}: the frozen owner wrote after it was continued"
