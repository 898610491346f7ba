"""Three and four real supervisors: host death, joins, graceful hand-off, the live shard
registry, SIGHUP reload, drain and the children's last will, over moto's server and dynalite."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
import trio
from helpers.fleet import (
    DURATION,
    FAILOVER,
    RECONCILE,
    assert_no_gap_and_no_overlap,
    catch_up,
    cli,
    epochs,
    running_fleet,
    start_writing,
    wait_balanced,
)

from supervisor.devtools.fleet import alive, child_pids

pytestmark = pytest.mark.slow

SHARDS6 = {f"k{i}": [f"k{i}-a"] for i in range(1, 7)}
STREAMS6 = [stream for streams in SHARDS6.values() for stream in streams]


@pytest.fixture
async def fleet6(tmp_path, ddb_url, table_name, nursery):
    async with running_fleet(nursery, tmp_path, ddb_url, table_name, SHARDS6, rate=100.0) as fleet:
        yield fleet


async def test_host_death_join_and_graceful_leave_across_four_supervisors(fleet6):
    fleet = fleet6
    with trio.fail_after(90):
        await start_writing(fleet, "w1", "w2", "w3")

        # A host dies: supervisor and children at once (no last will can run).
        killed = trio.current_time()
        os.killpg(fleet.procs["w1"].pid, signal.SIGKILL)
        await fleet.procs["w1"].wait()
        await fleet.wait_until_owned(by=["w2", "w3"], timeout=FAILOVER + 5)
        took = trio.current_time() - killed
        assert took <= FAILOVER, f"failover took {took:.2f}s"
        await wait_balanced(fleet, ["w2", "w3"], timeout=10)

        # A worker joins: balanced again, each shard moved at most once, then no flapping.
        before_join = await epochs(fleet)
        await fleet.start("w4")
        owners = await wait_balanced(fleet, ["w2", "w3", "w4"], timeout=25)
        after_join = await epochs(fleet)
        moves = {s: after_join[s] - before_join[s] for s in SHARDS6}
        assert all(m <= 1 for m in moves.values()), f"a shard moved twice on one join: {moves}"
        assert sum(moves.values()) == 2, f"exactly the joiner's share moved: {moves}"
        await trio.sleep(2 * RECONCILE + DURATION)  # dwell time passes: still nothing moves
        assert await fleet.owners() == owners
        assert await epochs(fleet) == after_join

        # A graceful leave: SIGTERM hands its shards off.
        leaving = [s for s, o in owners.items() if o == "w2"]
        fleet.kill("w2", signal.SIGTERM)
        assert await fleet.procs["w2"].wait() == 0
        await fleet.wait_until_owned(by=["w3", "w4"], timeout=RECONCILE + 3)
        await catch_up(fleet)
        await fleet.stop_all()
    assert_no_gap_and_no_overlap(fleet, STREAMS6)
    audits = fleet.audit()
    final = await epochs(fleet)
    for shard in leaving:  # handed off gracefully: the last two epochs share no record
        stream = SHARDS6[shard][0]
        last, previous = final[shard], final[shard] - 1
        seqs = Counter(r.seq for r in audits[stream].records if r.epoch in (last, previous))
        assert not [s for s, n in seqs.items() if n > 1], f"{stream}: rewritten on hand-off"


async def test_live_registry_reload_and_drain(fleet6):
    fleet = fleet6
    with trio.fail_after(90):
        await start_writing(fleet, "w1", "w2", "w3")

        # `shards add` while running: owned within a reconcile interval (plus start-up).
        url = f"{fleet.feed_url}/n1-a?after={{after}}"
        code, out = await cli(fleet, "shards", "add", "n1", "--stream", f"n1-a={url}",
                              "--sequence", "seq")  # fmt: skip
        assert code == 0, out
        added = trio.current_time()
        with trio.fail_after(RECONCILE * 2 + 3):
            while not (await fleet.owners()).get("n1"):
                await trio.sleep(0.05)
        owned_after = trio.current_time() - added
        await fleet.wait_written("n1-a", 1, timeout=10)
        assert (await cli(fleet, "shards", "add", "n1", "--stream", f"n1-a={url}"))[0] == 73
        assert (await cli(fleet, "shards", "add", "k1", "--stream", f"k1-a={url}"))[0] == 73
        code, out = await cli(fleet, "shards", "list", "--json")
        rows = {row["id"]: row for row in json.loads(out)["shards"]}
        assert rows["n1"]["source"] == "table" and rows["k1"]["source"] == "config"
        assert rows["n1"]["streams"][0]["url"] == url

        # `shards remove`: the owner stops its child and the item is retired, not taken again.
        assert (await cli(fleet, "shards", "remove", "n1"))[0] == 0
        with trio.fail_after(RECONCILE * 2 + 5):
            while (await fleet.owners())["n1"]:
                await trio.sleep(0.05)
        await trio.sleep(2 * RECONCILE)
        item = next(s for s in (await fleet.snapshot()).shards if s.id == "n1")
        assert item.owner == "" and item.retired_at > 0
        # The owner when the request landed (n1 may have moved in a rebalance meanwhile).
        assert any("handing off: retired" in fleet.log(w) for w in ("w1", "w2", "w3"))
        assert (await cli(fleet, "shards", "remove", "k1"))[0] == 66  # a TOML shard

        # SIGHUP: only the shard whose definition changed restarts (a new epoch). Taken once
        # the fleet has rebalanced after the removal: until then a shed moves a shard too.
        await wait_balanced(fleet, ["w1", "w2", "w3"], timeout=20)
        before = await epochs(fleet)
        for worker in ("w1", "w2", "w3"):
            path = fleet.workdir / f"{worker}.toml"
            text = fleet.config_text(worker).replace("/k2-a?after=", "/k2-a?v=2&after=")
            path.write_text(text)
            fleet.kill(worker, signal.SIGHUP)
        with trio.fail_after(RECONCILE * 2 + 5):
            while (await epochs(fleet))["k2"] == before["k2"]:
                await trio.sleep(0.05)
        await trio.sleep(2 * RECONCILE)
        after = await epochs(fleet)
        assert after["k2"] == before["k2"] + 1
        assert {s: e for s, e in after.items() if s not in ("k2", "n1")} == {
            s: e for s, e in before.items() if s not in ("k2", "n1")
        }

        # A file that no longer parses: logged, nothing changes, the process keeps running.
        good = (fleet.workdir / "w1.toml").read_text()
        (fleet.workdir / "w1.toml").write_text('[lease]\nduration = "soon"\n')
        fleet.kill("w1", signal.SIGHUP)
        with trio.fail_after(5):
            while "is invalid, keeping the running config" not in fleet.log("w1"):
                await trio.sleep(0.05)
        (fleet.workdir / "w1.toml").write_text(good)
        assert fleet.procs["w1"].returncode is None
        assert await epochs(fleet) == after

        # `drain`: the worker hands off everything, takes nothing, shows as draining.
        assert (await cli(fleet, "drain", "w3"))[0] == 0
        await wait_balanced(fleet, ["w1", "w2"], timeout=RECONCILE * 2 + 5)
        code, out = await cli(fleet, "status", "--json")
        states = {w["id"]: w["state"] for w in json.loads(out)["workers"]}
        assert states == {"w1": "running", "w2": "running", "w3": "draining"}
        await catch_up(fleet)
        await fleet.stop_all()
    assert owned_after <= RECONCILE * 2 + 2
    assert_no_gap_and_no_overlap(fleet, [*STREAMS6, "n1-a"])


async def test_children_of_a_killed_supervisor_release_their_shards_at_once(fleet6):
    """The last will: with a 6 s lease, peers own the shards again long before it could expire,
    because each orphaned child released its own shard on control-pipe EOF."""
    fleet = fleet6
    lease, heartbeat = 6.0, 1.0
    fleet.overrides["lease"] = {"duration": f"{lease}s", "heartbeat_interval": f"{heartbeat}s"}
    # The earliest the lease could hand a shard over: w1's last heartbeat came at most one
    # interval before the kill, and w2 counts the lease from when it saw that heartbeat.
    by_expiry = lease - heartbeat
    with trio.fail_after(60):
        await start_writing(fleet, "w1")
        await fleet.start("w2")
        await fleet.wait_registered("w2", timeout=10)  # the peer is up before w1 dies
        owners = await fleet.owners()
        kids = child_pids(fleet.procs["w1"].pid)
        killed = trio.current_time()
        fleet.kill("w1")  # the supervisor only: its children see EOF on their control pipes
        await fleet.procs["w1"].wait()
        moved = [s for s, o in owners.items() if o == "w1"]
        assert moved
        with trio.fail_after(lease + RECONCILE + 5):  # time to tell a will from an expiry
            while True:
                owners = await fleet.owners()
                if all(owners[s] == "w2" for s in moved):
                    break
                await trio.sleep(0.05)
        took = trio.current_time() - killed
        with trio.fail_after(5):
            while [pid for pid in kids if alive(pid)]:
                await trio.sleep(0.05)
        worker = next(w for w in (await fleet.snapshot()).workers if w.id == "w1")
        assert worker.state == "orphaned"
        await catch_up(fleet)
        await fleet.stop_all()
    assert took < by_expiry, f"took {took:.2f}s: the lease ({lease:g} s) expired instead"
    # Released by the will (vacant when w2 took them), not taken from an expired w1.
    takes = {e["shard"]: e["event"] for e in fleet.log_events("w2") if "took shard" in e["event"]}
    assert all(takes[s].startswith("took shard from nobody") for s in moved), takes
    assert_no_gap_and_no_overlap(fleet, STREAMS6)
    audits = fleet.audit()
    for shard in moved:  # the final checkpoint came with the release: nothing replayed
        stream = SHARDS6[shard][0]
        seqs = Counter(r.seq for r in audits[stream].records)
        assert not [s for s, n in seqs.items() if n > 1], f"{stream}: replayed after last will"
