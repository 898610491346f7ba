"""What a warm standby costs next to its owner, per stream: memory (PSS) and CPU.

In a settled ``[standby] count = 1`` fleet every worker runs owner children for its own shards
and standby children for its peer's, each shard one stream at the same rate. Once every standby
holds a full ``standby.buffer`` (it has been ready for that long: the age trim then keeps it
full, whatever rate a busy feed really reaches), the children's CPU time (utime + stime from
/proc) is sampled over a window and their PSS read at its end; a child's shard is in its
process name (``shard <id>``), its role in the table. What the standbys hold comes from the
supervisors' ``/metrics``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio

from benchmarks.fleets import snapshot
from benchmarks.procfs import cpu_seconds, pss_kib
from benchmarks.stats import summary
from supervisor.config.model import StandbyConfig
from supervisor.devtools.fleet import Fleet, child_pids

WINDOW, QUICK_WINDOW = 10.0, 2.0  # seconds of CPU time sampled
TRIM = 1.0  # seconds: the age trim runs with each standby heartbeat
SAMPLES = 3  # windows tried until one sees the same children at its start and its end
# A quick run samples without waiting for the buffers to fill, so standbys may still be placed
# and started during its first windows (on a loaded machine, during the whole suite, for
# several): it tries more of its short windows, until one has a standby in it.
QUICK_SAMPLES = 10


async def standby_cost(fleet: Fleet, rate: float, quick: bool) -> dict[str, Any]:
    buffer = StandbyConfig().buffer
    filled_after = None
    if not quick:  # the fleet is settled: every standby is ready
        await trio.sleep(buffer + TRIM)
        filled_after = buffer + TRIM
    window = QUICK_WINDOW if quick else WINDOW
    for _ in range(QUICK_SAMPLES if quick else SAMPLES):
        roles = await _roles(fleet)
        try:
            before = {pid: cpu_seconds(pid) for pid in roles}
            await trio.sleep(window)
            cpu = {pid: (cpu_seconds(pid) - before[pid]) / window * 100 for pid in roles}
            pss = {pid: pss_kib(pid) / 1024 for pid in roles}
        except FileNotFoundError:
            continue  # a child exited during the window (its /proc entry went): sample again
        if await _roles(fleet) == roles and "standby" in roles.values():
            break
        # A child came or went (a rebalance, a standby placed anew), or no standby has been
        # placed yet (a quick run does not wait for them: a window of owners only would
        # leave the row unmeasured): sample again.
    else:
        raise RuntimeError(
            "no sample saw the same children, a standby among them, at its start and its end"
        )
    held = await buffered(fleet)

    def of(role: str, values: dict[int, float]) -> dict[str, float]:
        return summary(v for pid, v in values.items() if roles[pid] == role)

    return {
        "buffer_s": buffer,
        "feed_rate": rate,
        "window_s": window,
        "filled_after_s": filled_after,
        "buffered_records": summary(held.values()),
        "buffered_bytes": summary((await buffered(fleet, "bytes")).values()),
        "cpu_percent": {role: of(role, cpu) for role in ("owner", "standby")},
        "pss_mib": {role: of(role, pss) for role in ("owner", "standby")},
        "streams_per_child": 1,
    }


async def _roles(fleet: Fleet) -> dict[int, str]:
    """Every child of the live supervisors: "owner" or "standby" of its shard."""
    owners = {s.id: s.owner for s in (await snapshot(fleet)).shards}
    roles = {}
    for worker in fleet.live():
        for pid in child_pids(fleet.procs[worker].pid):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text()
            except FileNotFoundError:
                continue  # it exited meanwhile: the next look differs, the window is retried
            shard = comm.strip().removeprefix("shard ")
            roles[pid] = "owner" if owners.get(shard) == worker else "standby"
    return roles


async def buffered(fleet: Fleet, what: str = "records") -> dict[str, float]:
    """Per standby (shard), what its child holds, from its supervisor's /metrics."""
    name = f"shardvisor_standby_buffered_{what}"
    found = {}
    for worker in fleet.live():
        text = await _metrics(fleet, worker)
        for shard, value in re.findall(rf'^{name}{{shard="([^"]+)"}} (\S+)$', text, re.M):
            found[shard] = float(value)
    return found


async def _metrics(fleet: Fleet, worker: str) -> str:
    log = fleet.log(worker)
    ports = re.findall(r"HTTP endpoint on ([0-9.]+):([0-9]+)", log)
    if not ports:
        raise RuntimeError(f"{worker} logged no HTTP endpoint")
    host, port = ports[-1]  # the current process's (a restarted worker logs again)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        chunks = []
        while data := await stream.receive_some():
            chunks.append(data)
    return b"".join(chunks).decode()
