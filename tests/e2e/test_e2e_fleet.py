"""Real supervisors, real children, real signals, over HTTP to moto's server and to dynalite."""

from __future__ import annotations

import os
import signal

import pytest
import trio
from helpers.fleet import (
    DURATION,
    FAILOVER,
    RECONCILE,
    SHARDS,
    STREAMS,
    assert_no_gap_and_no_overlap,
    catch_up,
    cli,
    start_writing,
    status_json,
)

from supervisor.devtools.fleet import alive, child_pids

pytestmark = pytest.mark.slow


async def test_sigkill_of_a_supervisor_moves_all_its_shards_within_the_bound(fleet):
    with trio.fail_after(40):
        await start_writing(fleet, "w1")  # every child of w1 is writing before it dies
        await fleet.start("w2")
        await fleet.wait_registered("w2", timeout=10)  # the peer is up before w1 dies
        supervisor_pid = fleet.procs["w1"].pid
        kids = child_pids(supervisor_pid)
        assert kids, "w1 runs one child per shard"
        killed = trio.current_time()
        fleet.kill("w1")
        await fleet.procs["w1"].wait()
        await fleet.wait_until_owned(by=["w2"], timeout=FAILOVER + 5)
        took = trio.current_time() - killed
        assert took <= FAILOVER, f"failover took {took:.2f}s"
        with trio.move_on_after(1.2):  # orphans exit within a second (their last will)
            while [pid for pid in kids if alive(pid)]:
                await trio.sleep(0.05)
        assert not [pid for pid in kids if alive(pid)], "children outlived their supervisor"
        await catch_up(fleet)
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS)
    epochs = {stream: audit.epochs for stream, audit in fleet.audit().items()}
    assert all(len(e) >= 2 for e in epochs.values()), epochs


async def test_sigterm_releases_every_lease_and_exits_zero(fleet):
    with trio.fail_after(40):
        await start_writing(fleet, "w1")
        started = trio.current_time()
        fleet.kill("w1", signal.SIGTERM)
        code = await fleet.procs["w1"].wait()
        assert code == 0
        assert trio.current_time() - started < 5.0
        snapshot = await fleet.snapshot()
        assert all(s.owner == "" for s in snapshot.shards)
        assert [w.state for w in snapshot.workers] == ["stopped"]
        assert all(s.checkpoint for s in snapshot.shards)
    # Nothing written beyond the final checkpoint: the next owner starts exactly after it.
    for shard in snapshot.shards:
        for stream, seq in shard.checkpoint.items():
            assert fleet.audit()[stream].max_seq == seq


async def test_graceful_hand_off_loses_nothing_and_writes_nothing_twice(fleet):
    with trio.fail_after(40):
        await fleet.start("w1")
        await fleet.start("w2")
        await fleet.wait_until_owned(timeout=10)
        for stream in STREAMS:
            await fleet.wait_written(stream, 1, timeout=10)
        fleet.kill("w1", signal.SIGTERM)
        assert await fleet.procs["w1"].wait() == 0
        await fleet.wait_until_owned(by=["w2"], timeout=RECONCILE + 3)
        await catch_up(fleet)
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS, graceful=True)


async def test_a_killed_child_is_restarted_and_resumes_without_gap(fleet):
    with trio.fail_after(30):
        await start_writing(fleet, "w1")
        victims = child_pids(fleet.procs["w1"].pid)
        os.kill(victims[0], signal.SIGKILL)
        with trio.fail_after(5):
            while len([p for p in child_pids(fleet.procs["w1"].pid) if p not in victims]) < 1:
                await trio.sleep(0.05)
        restarted = {stream: fleet.feed.last_seq(stream) for stream in STREAMS}
        for stream in STREAMS:  # every stream written past the restart: the new child resumed
            await fleet.wait_written(stream, restarted[stream] + 1, timeout=5)
        await catch_up(fleet)
        assert "restarting in" in fleet.log("w1")
        assert set((await fleet.owners()).values()) == {"w1"}
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS)


async def test_two_supervisors_started_together_split_the_shards_with_one_writer_each(fleet):
    with trio.fail_after(40):
        await fleet.start("w1")
        await fleet.start("w2")
        with trio.fail_after(25):  # balanced: 2 shards each, after any rebalancing hand-off
            while sorted((await fleet.owners()).values()) != ["w1", "w1", "w2", "w2"]:
                await trio.sleep(0.1)
        status = await status_json(fleet, "w1")
        assert {w["id"]: (w["state"], len(w["shards"])) for w in status["workers"]} == {
            "w1": ("running", 2),
            "w2": ("running", 2),
        }
        assert all(w["heartbeat_age_s"] < DURATION for w in status["workers"])
        assert {s["id"] for s in status["shards"]} == set(SHARDS)
        assert all(s["owner"] in ("w1", "w2") and s["epoch"] >= 1 for s in status["shards"])
        assert all(s["state"] == "running" for s in status["shards"])
        balanced = {stream: fleet.feed.last_seq(stream) for stream in STREAMS}
        for stream in STREAMS:  # each owner writes on while the two run side by side
            await fleet.wait_written(stream, balanced[stream] + 1, timeout=5)
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS)
    for stream, audit in fleet.audit().items():
        writers = {}
        for record in audit.records:
            writers.setdefault(record.epoch, set()).add(record.worker)
        assert all(len(w) == 1 for w in writers.values()), f"{stream}: {writers}"


async def test_operator_release_and_drain_hand_off_without_loss_or_duplicates(fleet):
    with trio.fail_after(60):
        await fleet.start("w1")
        await fleet.start("w2")
        with trio.fail_after(25):
            while sorted((await fleet.owners()).values()) != ["w1", "w1", "w2", "w2"]:
                await trio.sleep(0.1)
        for stream in STREAMS:
            await fleet.wait_written(stream, 1, timeout=10)
        before = await fleet.owners()
        shard = next(s for s, o in before.items() if o == "w1")
        assert (await cli(fleet, "release", shard))[0] == 0
        with trio.fail_after(RECONCILE * 2 + 5):  # handed to w2 (w1 keeps its hands off)
            while (await fleet.owners())[shard] != "w2":
                await trio.sleep(0.05)
        assert (await cli(fleet, "drain", "w2"))[0] == 0
        with trio.fail_after(RECONCILE * 2 + 5):
            while set((await fleet.owners()).values()) != {"w1"}:
                await trio.sleep(0.05)
        status = await status_json(fleet, "w1")
        states = {w["id"]: w["state"] for w in status["workers"]}
        assert states == {"w1": "running", "w2": "draining"}
        assert fleet.procs["w2"].returncode is None  # drained, not stopped
        assert (await cli(fleet, "release", "no-such-shard"))[0] == 66
        assert (await cli(fleet, "drain", "no-such-worker"))[0] == 66
        await catch_up(fleet)
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS, graceful=True)
