"""The end-to-end tests' fleet: ``supervisor.devtools.fleet`` with short leases and debug logs,
started on a feed and a table (``running_fleet``), and what the tests ask of it: the shardvisor
CLI on a supervisor's config, balance and epochs in the table, log lines, and the sink audit."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from supervisor.devtools import fleet
from supervisor.devtools.feed import FeedServer

SHARDS = {"s1": ["s1-a", "s1-b"], "s2": ["s2-a"], "s3": ["s3-a"], "s4": ["s4-a"]}
STREAMS = [s for streams in SHARDS.values() for s in streams]

# Short leases keep the tests fast; the same code runs with production values. 3 s, not 2:
# the suite runs two pytest-xdist workers on two cores, and a heartbeat has duration / 2 to
# reach a busy moto server (one request at a time) before the lease counts it failed.
DURATION, HEARTBEAT, RECONCILE = 3.0, 0.5, 0.5
SETTINGS: dict[str, dict[str, object]] = {
    "lease": {
        "duration": f"{DURATION}s",
        "heartbeat_interval": f"{HEARTBEAT}s",
        "reconcile_interval": f"{RECONCILE}s",
    },
    "supervisor": {
        "shutdown_timeout": "5s",
        "checkpoint_interval": "200ms",
        "restart_backoff_initial": "50ms",
    },
    "log": {"level": "debug"},
    "http": {"listen": "127.0.0.1:0"},  # several supervisors share this host
}
# From a host's death to its peers owning its shards. A peer starts a lease's clock when it
# reads the dead owner's last heartbeat, at its next round: up to a reconcile interval after
# the heartbeat was written (and the owner may die right after writing it). It judges the
# owner dead at its first round a lease duration later: up to another reconcile interval.
# The margin: those rounds' own requests, the takes, and the test's poll of the table.
FAILOVER = DURATION + 2 * RECONCILE + 1.0


@attrs.define
class Fleet(fleet.Fleet):
    """``Fleet(workdir, ddb_url, table, feed_url, shards, feed=...)``; tests tweak a section
    with ``fleet.overrides[section] = {...}`` before starting a supervisor."""

    settings: dict[str, dict[str, object]] = attrs.field(factory=lambda: copy.deepcopy(SETTINGS))
    feed: FeedServer | None = None  # the feed the streams come from (tests ask how far it is)


@asynccontextmanager
async def running_fleet(
    nursery: trio.Nursery,
    workdir: Path,
    ddb_url: str,
    table: str,
    shards: Mapping[str, Sequence[str]],
    *,
    rate: float,
) -> AsyncIterator[Fleet]:
    """A feed on 127.0.0.1 (every stream of ``shards`` at ``rate`` messages/s) and a table;
    tests start real supervisor processes on them. On exit every supervisor is stopped and its
    log printed (pytest shows it only when the test failed)."""
    feed = FeedServer(rate=rate, stream_names=[s for streams in shards.values() for s in streams])
    port = await nursery.start(feed.serve, "127.0.0.1", 0)
    fleet = Fleet(workdir, ddb_url, table, f"ws://127.0.0.1:{port}/feed", shards, feed=feed)
    await fleet.store.ensure_table(True)
    try:
        yield fleet
    finally:
        await fleet.stop_all()
        for worker in fleet.procs:
            print(f"===== {worker}.log =====\n{fleet.log(worker)}")


def supervisor_toml(
    table: str, ddb_url: str, shards: list[dict[str, Any]], **sections: dict[str, object]
) -> str:
    """The config file of one supervisor ``w1`` outside a Fleet: the fleet's settings without
    an HTTP endpoint, ``sections`` merged over them, and ``shards`` (tables of TOML's
    [[shards]], each with its ``streams``)."""
    settings = [SETTINGS, {"http": {"listen": ""}}, sections]
    config = fleet.fleet_config(
        "w1", table=table, ddb_url=ddb_url, feed_url="", shards={}, sections=settings
    )
    config["shards"] = shards
    return fleet.render_toml(config)


async def start_supervisor(
    config: Path, stdout: Path, stderr: Path, env: Mapping[str, str] | None = None
) -> trio.Process:
    """``python -m supervisor run -c CONFIG`` outside a Fleet, in the config's directory (this
    checkout first on its PYTHONPATH), its output appended to ``stdout`` and ``stderr`` (which
    may be one file); ``env`` is added to ours."""
    repo = Path(__file__).resolve().parents[2]
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(repo), **(env or {})}
    with ExitStack() as files:
        out = files.enter_context(stdout.open("ab"))
        err = out if stderr == stdout else files.enter_context(stderr.open("ab"))
        return await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", "run", "-c", str(config)],
            cwd=config.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=environ,
        )


# --- the command line and the logs ----------------------------------------------------------


async def cli(fleet: Fleet, *args: str, config: str = "w1.toml") -> tuple[int, str]:
    """``shardvisor ARGS -c CONFIG`` in the fleet's directory: exit code, stdout + stderr."""
    result = await trio.run_process(
        [sys.executable, "-m", "supervisor", *args, "-c", config],
        cwd=fleet.workdir,
        check=False,
        capture_stdout=True,
        capture_stderr=True,
    )
    return result.returncode, (result.stdout + result.stderr).decode()


async def status_json(fleet: Fleet, worker: str = "w1") -> dict[str, Any]:
    """``shardvisor status --json`` on ``worker``'s config: the fleet as the table shows it."""
    code, out = await cli(fleet, "status", "--json", config=f"{worker}.toml")
    assert code == 0, out
    return json.loads(out)


async def wait_for_log(fleet: Fleet, worker: str, pattern: str, timeout: float) -> re.Match[str]:
    """The first match of ``pattern`` in ``worker``'s log, once it is there."""
    with trio.fail_after(timeout):
        while not (match := re.search(pattern, fleet.log(worker))):
            await trio.sleep(0.05)
    return match


# --- the table ------------------------------------------------------------------------------


async def wait_balanced(fleet: Fleet, workers: Sequence[str], timeout: float) -> dict[str, str]:
    """Every configured shard owned by one of ``workers``, loads within one of each other.
    (Not before every shard has an item: an empty table is not a balanced fleet.)"""
    with trio.fail_after(timeout):
        while True:
            owners = {s: o for s, o in (await fleet.owners()).items() if s in fleet.shards}
            loads = Counter(owners.values())
            if len(owners) == len(fleet.shards) and set(loads) <= set(workers):
                counts = [loads[w] for w in workers]
                if max(counts) - min(counts) <= 1:
                    return owners
            await trio.sleep(0.1)


async def start_writing(fleet: Fleet, *workers: str) -> None:
    """Start ``workers``; return once the shards are spread over them (``wait_balanced``) and
    every stream has records in the sink."""
    for worker in workers:
        await fleet.start(worker)
    await wait_balanced(fleet, workers, timeout=25)
    for streams in fleet.shards.values():
        for stream in streams:
            await fleet.wait_written(stream, 1, timeout=10)


async def catch_up(fleet: Fleet, behind: int = 20, timeout: float = 5.0) -> None:
    """Until every stream of the fleet is written to within ``behind`` records of the feed."""
    for streams in fleet.shards.values():
        for stream in streams:
            await fleet.wait_written(stream, fleet.feed.last_seq(stream) - behind, timeout)


async def epochs(fleet: Fleet) -> dict[str, int]:
    return {s.id: s.epoch for s in (await fleet.snapshot()).shards}


# --- the sink files -------------------------------------------------------------------------


def assert_no_gap_and_no_overlap(
    fleet: Fleet, streams: Sequence[str], *, graceful: bool = False
) -> None:
    """The sink files hold exactly ``streams``, each without a gap and never written by two
    epochs at once; with ``graceful`` (every hand-off was one), no record written twice."""
    audits = fleet.audit()
    assert sorted(audits) == sorted(streams)
    for stream in streams:
        assert audits[stream].missing() == [], f"{stream} lost records"
        assert audits[stream].interleavings() == [], f"{stream}: two epochs wrote at once"
        if graceful:
            assert audits[stream].rewritten == 0, f"{stream}: a graceful hand-off wrote twice"
