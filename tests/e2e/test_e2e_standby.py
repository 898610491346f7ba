"""Make-before-break hand-offs and warm standbys with real supervisors, real children, real
signals, the live-only feed (a client gets only what is generated after it connected), over
HTTP to moto's server and to dynalite.

On such a feed whatever no child was connected for is gone: these tests count it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from helpers.fleet import DURATION, RECONCILE, SHARDS, STREAMS, Fleet

from supervisor.devtools.feed import FeedServer
from supervisor.devtools.fleet import alive, child_pids
from supervisor.devtools.sink_audit import StreamAudit

pytestmark = pytest.mark.slow

FAULTY = str(Path(__file__).resolve().parents[1] / "helpers" / "faulty_worker.py")
GAPS = "shardvisor_stream_messages_total"
HANDOFF_TIMEOUT = 2.0  # with shutdown_timeout 5 s: 2 s + the stop grace 2.5 s fit the 4.5 s drain


@pytest.fixture
async def live_fleet(tmp_path, ddb_url, table_name, nursery):
    """The fleet of helpers.fleet on a live-only feed, make-before-break sized for its drain."""
    async with _live_fleet(tmp_path, ddb_url, table_name, nursery, protocol=1) as fleet:
        yield fleet


@pytest.fixture
async def live_fleet_p2(tmp_path, ddb_url, table_name, nursery):
    """The same on a table that runs protocol 2 from its creation (dynalite cannot add the
    indexes to an existing table)."""
    async with _live_fleet(tmp_path, ddb_url, table_name, nursery, protocol=2) as fleet:
        yield fleet


@asynccontextmanager
async def _live_fleet(tmp_path, ddb_url, table_name, nursery, *, protocol: int):
    feed = FeedServer(rate=200.0, stream_names=STREAMS, live=True)
    port = await nursery.start(feed.serve, "127.0.0.1", 0)
    fleet = Fleet(
        tmp_path,
        ddb_url,
        table_name,
        f"ws://127.0.0.1:{port}/feed",
        SHARDS,
        feed=feed,
        live_feed=True,
    )
    fleet.settings["lease"]["handoff_timeout"] = f"{HANDOFF_TIMEOUT}s"
    if protocol == 2:
        await fleet.store.set_protocol(2)
    else:
        await fleet.store.ensure_table(True)
    try:
        yield fleet
    finally:
        await fleet.stop_all()
        for worker in fleet.procs:  # shown by pytest only when the test failed
            print(f"===== {worker}.log =====\n{fleet.log(worker)}")


def lost(audit: StreamAudit) -> list[int]:
    """Sequence numbers between the first and the last written that nobody wrote (a live
    feed starts wherever the first connect found it)."""
    seqs = audit.seqs
    return [n for n in range(min(seqs), max(seqs) + 1) if n not in seqs] if seqs else []


def assert_nothing_lost(fleet: Fleet, streams: Iterable[str], *, twice: bool = False) -> None:
    audits = fleet.audit()
    for stream in streams:
        audit = audits[stream]
        assert lost(audit) == [], f"{stream} lost records"
        assert audit.interleavings() == [], f"{stream}: two epochs wrote at the same time"
        if not twice:
            assert audit.rewritten == 0, f"{stream}: written twice"


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a supervisor's /metrics (labels in any order), 0 if absent."""
    for line in text.splitlines():
        found = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? ([0-9.e+-]+)", line)
        if found and found.group(1) == name:
            have = dict(re.findall(r'([a-z_]+)="([^"]*)"', found.group(2) or ""))
            if have == labels:
                return float(found.group(3))
    return 0.0


async def scrape(fleet: Fleet, worker: str) -> str:
    """The worker's /metrics (its http.listen port 0 is logged at start)."""
    with trio.fail_after(10):
        while not (found := re.search(r"HTTP endpoint on ([0-9.]+):([0-9]+)", fleet.log(worker))):
            await trio.sleep(0.05)
    stream = await trio.open_tcp_stream(found.group(1), int(found.group(2)))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        chunks = []
        while data := await stream.receive_some():
            chunks.append(data)
    return b"".join(chunks).decode()


async def wait_split(fleet: Fleet, workers: Sequence[str], timeout: float = 25) -> dict[str, str]:
    with trio.fail_after(timeout):
        while True:
            owners = await fleet.owners()
            loads = sorted(list(owners.values()).count(w) for w in workers)
            if all(owners.values()) and set(owners.values()) <= set(workers) and loads == [2, 2]:
                return owners
            await trio.sleep(0.1)


async def wait_taking(fleet: Fleet, worker: str, timeout: float = 10) -> None:
    """``worker``'s item says it takes shards again (its first heartbeat after an undrain),
    and its peers have had a round to read that: they pick successors among takers only, and
    the rebalance's hand-offs to it may end before they read it (then a SIGTERM has no
    successor and moves break-before-make)."""
    with trio.fail_after(timeout):
        while True:
            item = next(w for w in (await fleet.snapshot()).workers if w.id == worker)
            if item.state == "running":
                break
            await trio.sleep(0.1)
    await trio.sleep(RECONCILE)


async def catch_up(fleet: Fleet, streams: Iterable[str]) -> None:
    for stream in streams:
        await fleet.wait_written(stream, fleet.feed.last_seq(stream) - 20, timeout=10)


async def cli(fleet: Fleet, *args: str) -> int:
    result = await trio.run_process(
        [sys.executable, "-m", "supervisor", *args, "-c", "w1.toml"],
        cwd=fleet.workdir,
        check=False,
        capture_stdout=True,
        capture_stderr=True,
    )
    return result.returncode


async def status_json(fleet: Fleet) -> dict:
    result = await trio.run_process(
        [sys.executable, "-m", "supervisor", "status", "--json", "-c", "w1.toml"],
        cwd=fleet.workdir,
        capture_stdout=True,
    )
    return json.loads(result.stdout)


async def wait_owner(fleet: Fleet, shards: Iterable[str], owner: str, timeout: float) -> None:
    shards = list(shards)
    with trio.fail_after(timeout):
        while True:
            owners = await fleet.owners()
            if all(owners[s] == owner for s in shards):
                return
            await trio.sleep(0.05)


def streams_of(shards: Iterable[str]) -> list[str]:
    return [stream for shard in shards for stream in SHARDS[shard]]


async def test_every_graceful_move_is_make_before_break_and_loses_nothing(live_fleet):
    """A rebalance, `shardvisor release`, `shardvisor drain` (and its undo) and a SIGTERM, one
    after the other on a live-only feed: nothing lost, nothing written twice, every move
    make-before-break."""
    fleet = live_fleet
    with trio.fail_after(90):
        await fleet.start("w1")
        await fleet.wait_until_owned(by=["w1"], timeout=10)
        await fleet.start("w2")
        owners = await wait_split(fleet, ["w1", "w2"])  # w1 sheds two: rebalance
        await catch_up(fleet, STREAMS)
        shard = next(s for s, o in owners.items() if o == "w1")
        assert await cli(fleet, "release", shard) == 0
        await wait_owner(fleet, [shard], "w2", RECONCILE * 2 + 5)
        assert await cli(fleet, "drain", "w2") == 0
        await wait_owner(fleet, SHARDS, "w1", RECONCILE * 2 + 5)
        assert await cli(fleet, "drain", "w2", "--undo") == 0
        await wait_split(fleet, ["w1", "w2"])  # rebalance again, once w1's shards dwelt
        await sigterm_hands_everything(fleet, "w1", to="w2")
        await fleet.stop_all()
    assert_nothing_lost(fleet, STREAMS)
    logs = fleet.log("w1") + fleet.log("w2")
    moves = re.findall(r"successor w[12], (make_before_break|break_before_make)", logs)
    assert len(moves) >= 2 + 1 + 3 + 2 + 2, moves  # shed, release, drain, shed, SIGTERM
    assert set(moves) == {"make_before_break"}
    assert "falls back" not in logs


def ready_for_failover(fleet: Fleet, worker: str, shard: str) -> list[dict]:
    """``worker``'s log events saying its standby of ``shard`` covers the owner's checkpoint."""
    return [
        e
        for e in fleet.log_events(worker)
        if e.get("event", "").startswith("standby ready for a failover") and e.get("shard") == shard
    ]


async def advertised(fleet: Fleet) -> dict[str, list[str]]:
    """Shard -> workers whose item lists a ready standby of it."""
    found: dict[str, list[str]] = {}
    for worker in (await fleet.snapshot()).workers:
        for shard in worker.standbys:
            found.setdefault(shard, []).append(worker.id)
    return found


async def wait_standbys_everywhere(fleet: Fleet, timeout: float = 15) -> dict[str, str]:
    """Every shard owned, and a ready standby of it advertised by another worker."""
    with trio.fail_after(timeout):
        while True:
            owners, ready = await fleet.owners(), await advertised(fleet)
            if all(o and ready.get(s, []) and o not in ready[s] for s, o in owners.items()):
                return owners
            await trio.sleep(0.1)


async def split_with_standbys(fleet: Fleet) -> dict[str, str]:
    """`[standby] count = 1`: w1 takes every shard, w2 joins, two each, and every shard has
    a ready standby on the other worker. Returns the owners."""
    fleet.settings["standby"] = {"count": 1}
    await fleet.start("w1")
    await fleet.wait_until_owned(by=["w1"], timeout=10)
    await fleet.start("w2")
    await wait_split(fleet, ["w1", "w2"])
    return await wait_standbys_everywhere(fleet)


async def sigterm_hands_everything(fleet: Fleet, leaving: str, *, to: str) -> None:
    """Once ``to`` takes shards again (else the drain has no successor: break-before-make)
    and every stream is written up to date: SIGTERM of ``leaving``, which exits 0, until
    ``to`` owns every shard and has caught up."""
    await wait_taking(fleet, to)
    await catch_up(fleet, STREAMS)
    fleet.kill(leaving, signal.SIGTERM)
    assert await fleet.procs[leaving].wait() == 0
    await wait_owner(fleet, SHARDS, to, RECONCILE + 3)
    await catch_up(fleet, STREAMS)


async def kill_host_of_w1(fleet: Fleet, owners: dict[str, str]) -> tuple[list[str], float]:
    """SIGKILL of w1's process group once every stream is written up to date; until w2 owns
    what w1 did and has caught up. The shards moved, and how long their take took."""
    await catch_up(fleet, STREAMS)
    os.killpg(fleet.procs["w1"].pid, signal.SIGKILL)
    died = trio.current_time()
    await fleet.procs["w1"].wait()
    moved = [s for s, o in owners.items() if o == "w1"]
    await wait_owner(fleet, moved, "w2", DURATION + RECONCILE + 5)
    took = trio.current_time() - died
    await catch_up(fleet, STREAMS)
    return moved, took


def shard_of(pid: int) -> str:
    """A zygote child is named "shard <id>"."""
    return Path(f"/proc/{pid}/comm").read_text().strip().removeprefix("shard ")


async def test_host_death_with_a_warm_standby_loses_nothing(live_fleet):
    """`[standby] count = 1`: a standby's own crash is restarted and leaves its owner alone;
    then SIGKILL of w1's whole host (process group): its shards go to their standbys, which
    write from their buffers. Nothing lost on the live-only feed."""
    fleet = live_fleet
    with trio.fail_after(90):
        owners = await split_with_standbys(fleet)
        status = await status_json(fleet)
        assert {s["id"]: s["standbys"] for s in status["shards"]} == {
            shard: ["w2" if owner == "w1" else "w1"] for shard, owner in owners.items()
        }
        assert {w["id"]: len(w["standbys"]) for w in status["workers"]} == {"w1": 2, "w2": 2}
        await catch_up(fleet, STREAMS)
        # A standby child of w2 crashes: restarted; its owner (w1) never notices.
        standby = next(
            pid for pid in child_pids(fleet.procs["w2"].pid) if owners[shard_of(pid)] == "w1"
        )
        victim = shard_of(standby)
        owner_children = child_pids(fleet.procs["w1"].pid)
        covering = len(ready_for_failover(fleet, "w2", victim))
        os.kill(standby, signal.SIGKILL)
        with trio.fail_after(10):
            while "standby child exited with -9" not in fleet.log("w2"):
                await trio.sleep(0.05)
        # The restarted standby holds the feed from its connect on; a new owner resumes after
        # the dead owner's checkpoint: w2 says the standby is ready for a failover (and
        # advertises it) only once that checkpoint has reached its first record. The host
        # dies right then: nothing may be lost.
        with trio.fail_after(15):
            while len(ready_for_failover(fleet, "w2", victim)) == covering:
                await trio.sleep(0.02)
        assert child_pids(fleet.procs["w1"].pid) == owner_children
        assert (await fleet.owners()) == owners
        moved, took = await kill_host_of_w1(fleet, owners)
        await fleet.stop_all()
    assert took <= DURATION + 2 * RECONCILE + 1.0
    assert_nothing_lost(fleet, streams_of(moved), twice=True)
    assert fleet.log("w2").count("promoting the standby child (failover)") == len(moved)
    assert "gap:" not in fleet.log("w2")
    assert not [pid for pid in child_pids(fleet.procs["w1"].pid) if alive(pid)]


@pytest.mark.parametrize("ddb_url", ["moto"], indirect=True)
async def test_host_death_without_a_standby_counts_what_the_live_feed_lost(live_fleet):
    """`count = 0` (today's behaviour): the new owner connects at the present; what was
    generated meanwhile is gone, logged as a gap and counted in the gaps metric."""
    fleet = live_fleet
    fleet.shards = {"s1": SHARDS["s1"]}
    moved = ["s1"]
    with trio.fail_after(60):
        await fleet.start("w1")
        await fleet.wait_until_owned(by=["w1"], timeout=10)
        await fleet.start("w2")
        await catch_up(fleet, SHARDS["s1"])
        await wait_registered(fleet, "w2")
        os.killpg(fleet.procs["w1"].pid, signal.SIGKILL)
        await fleet.procs["w1"].wait()
        await wait_owner(fleet, moved, "w2", DURATION + RECONCILE + 5)
        await catch_up(fleet, SHARDS["s1"])
        gaps = {}
        for shard in moved:  # the children report their counts in their heartbeats (1 s)
            for stream in SHARDS[shard]:
                labels = {"shard": shard, "stream": stream, "outcome": "gaps"}
                with trio.fail_after(5):
                    while not (found := metric(await scrape(fleet, "w2"), GAPS, **labels)):
                        await trio.sleep(0.2)
                gaps[stream] = found
        await fleet.stop_all()
    audits = fleet.audit()
    for stream in streams_of(moved):
        missing = len(lost(audits[stream]))
        print(f"{stream}: {missing} messages lost at the host death, {gaps[stream]:g} gap counted")
        assert missing > 0
    assert fleet.log("w2").count("message(s) missing before seq") >= len(streams_of(moved))


@pytest.mark.parametrize("ddb_url", ["moto"], indirect=True)
async def test_a_successor_never_ready_falls_back_within_the_timeout(live_fleet):
    fleet = live_fleet
    fleet.shards = {"s1": SHARDS["s1"]}
    await fleet.start("w1")
    await fleet.wait_until_owned(by=["w1"], timeout=10)
    fleet.overrides["supervisor"] = {
        "spawn": "fresh",
        "worker_command": [sys.executable, FAULTY, "standby-never-ready"],
    }
    await fleet.start("w2")
    with trio.fail_after(30):
        await wait_registered(fleet, "w2")
        await trio.sleep(RECONCILE * 2)  # w1 sees w2 live
        assert await cli(fleet, "release", "s1") == 0
        await wait_owner(fleet, ["s1"], "w2", RECONCILE * 2 + HANDOFF_TIMEOUT + 5)
        text = await scrape(fleet, "w1")
    assert metric(text, "shardvisor_handoff_fallbacks_total", reason="timeout") == 1
    assert metric(text, "shardvisor_handoffs_total", mode="break_before_make") == 1
    log = fleet.log("w1")
    assert log.count("falls back to break-before-make: timeout") == 1
    asked = _log_time(log, "handing off make-before-break to w2")
    fell = _log_time(log, "falls back to break-before-make")
    assert HANDOFF_TIMEOUT <= fell - asked <= HANDOFF_TIMEOUT + 1.0


async def wait_registered(fleet: Fleet, worker: str) -> None:
    with trio.fail_after(10):
        while f"registered worker {worker}" not in fleet.log(worker):
            await trio.sleep(0.05)


def _log_time(log: str, event: str) -> float:
    """Seconds of the day of the first JSON log line whose event contains ``event``."""
    line = next(line for line in log.splitlines() if event in line)
    stamp = re.search(r'"ts": "[0-9-]+T([0-9]+):([0-9]+):([0-9.]+)Z"', line)
    assert stamp is not None, line
    hours, minutes, seconds = stamp.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


async def test_a_worker_restarted_under_its_own_id_leaves_its_shards_to_their_standbys(
    live_fleet,
):
    """SIGKILL of w1's host, and w1 starts again at once (same id, new session): its shards
    still carry its id. Retaking them with fresh children would lose, on a live-only feed,
    everything since the death; instead the restarted w1 releases each to its ready standby
    on w2, which takes it and promotes its child. Nothing lost. (A lease of 5 s: a supervisor's
    restart on a loaded 2-core host took longer than the suite's usual 2 s, and w2 then took
    the shards as a dead owner's, which is the other test's case.)"""
    fleet = live_fleet
    lease = 5.0
    fleet.settings["lease"]["duration"] = f"{lease}s"
    with trio.fail_after(90):
        owners = await split_with_standbys(fleet)
        moved = [s for s, o in owners.items() if o == "w1"]
        await catch_up(fleet, STREAMS)
        os.killpg(fleet.procs["w1"].pid, signal.SIGKILL)
        await fleet.procs["w1"].wait()
        await fleet.start("w1")  # before its lease could lapse: its id stays live
        # The restarted w1 hands back once warm (registered for a lease), within rounds.
        await wait_owner(fleet, moved, "w2", lease + 4 * RECONCILE + 5)
        await catch_up(fleet, streams_of(moved))
        await fleet.stop_all()
    assert_nothing_lost(fleet, streams_of(moved), twice=True)
    restarted = fleet.log("w1").split("registered worker w1")[-1]
    assert restarted.count("left to w2's standby") == len(moved)
    assert "took shard from w1" not in restarted
    assert fleet.log("w2").count("promoting the standby child") >= len(moved)


async def test_on_protocol_2_the_ring_standbys_bridge_a_host_death_and_a_sigterm(
    live_fleet_p2,
):
    """Protocol 2 (issue 16) from the first round, `[standby] count = 1`, on the live-only
    feed: standbys placed from the ring with no scan (two workers: each stands by for the
    other's shards). w1's host is SIGKILLed: its shards are routed to their standbys, which
    promote and write from their buffers. Then w3 joins and w2's SIGTERM moves everything
    make-before-break. Nothing lost; written twice only what the dead owner wrote last."""
    fleet = live_fleet_p2
    with trio.fail_after(120):
        owners = await split_with_standbys(fleet)
        moved, took = await kill_host_of_w1(fleet, owners)
        await fleet.start("w3")
        await wait_split(fleet, ["w2", "w3"], timeout=40)
        await sigterm_hands_everything(fleet, "w2", to="w3")
        await fleet.stop_all()
    assert took <= DURATION + RECONCILE + 1.0
    assert_nothing_lost(fleet, streams_of(moved), twice=True)
    assert_nothing_lost(fleet, streams_of(s for s in SHARDS if s not in moved))
    logs = {w: fleet.log(w) for w in ("w2", "w3")}
    assert logs["w2"].count("promoting the standby child (failover)") == len(moved)
    assert "the fleet runs protocol 2 from now on" in logs["w2"]
    moves = re.findall(r"successor w3, (make_before_break|break_before_make)", logs["w2"])
    assert set(moves) == {"make_before_break"}, moves
    assert "gap:" not in logs["w2"] + logs["w3"]
