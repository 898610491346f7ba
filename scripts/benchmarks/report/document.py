"""The whole document: its head, the summary of every row, the machine, the sections, the static
part, and publishing into docs/benchmarks.md above the kept part."""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.report import rendered
from benchmarks.report.common import Load
from benchmarks.tables import table

DOCS = harness.ROOT / "docs" / "benchmarks.md"
KEPT_MARKER = "<!-- Generated above by scripts/bench.sh; kept below as written. -->"

STATIC = """\
## Not part of this run

**Balancing** (pure planner, simulated fleet; deterministic, so not machine-dependent):
`.venv/bin/python -m pytest tests/core/test_balance_simulation.py -s` — 1,000 shards, 20 workers,
lease 10 s, reconcile 2 s, three seeds, every worker planning from the table as it is when its
turn comes.

| change | visible in round | rounds to max − min ≤ 1 | moves (minimum) | failed takes |
|---|---|---|---|---|
| cold start (20 workers at once) | 1 | 1 | 0 (1,000 initial takes) | 0 |
| a worker joins | 1 | 2 | 47–48 (47–48) | 0 |
| a worker leaves (graceful) | 1 | 1 | 50 (50) | 0 |
| a worker dies | 5 (after the lease) | 1 | 50 (50) | 0 |

The KCL steals one lease per 20 s scan: rebalancing 48 shards onto a new worker takes it about
16 minutes.

**Standby placement per round** (pure, one process; 100 shards per worker, `[standby] count` 1):
`PYTHONPATH=scripts .venv/bin/python -m benchmarks.placement`. Every supervisor places every
shard's standbys every round, on its event loop. Ranked afresh, as every round did before the
rankings were kept (a supervisor's first round still does, in steps of 256 shards between which
its event loop runs), that is O(shards x workers) hashes; kept from round to round
(`core.standby.Rankings`), a round walks a few workers per shard and ranks only the workers that
appeared since. 2026-12-05, this machine:

| workers / shards | ranked afresh | kept: steady round | after a join | after a leave |
|---|---:|---:|---:|---:|
| 20 / 2,000 | 41.5 ms | 4.5 ms | 6.1 ms | 4.2 ms |
| 50 / 5,000 | 202 ms | 11.8 ms | 15.9 ms | 11.6 ms |
| 100 / 10,000 | 767 ms | 26.4 ms | 36.4 ms | 26.3 ms |
| 200 / 20,000 | 2,916 ms | 61.3 ms | 80.9 ms | 59.7 ms |
| 500 / 50,000 | 16,956 ms | 170 ms | 213 ms | 173 ms |

A kept round is still O(shards): protocol 2, where a worker reads only what concerns it, has
to place standbys without looking at every shard (docs/lease-protocol.md).

Protocol 2's candidates (`core.standby_ring`, same command; designed in
docs/lease-protocol.md, *Standbys*: the daemon's placement on protocol 2) look at no shard a
worker does not stand by for: the ring of a view is sorted once (shard points when the shard
list changes, members' virtual points when the membership does), then a worker's candidacies
come from its arcs by binary search. `count` 1 (two candidates a shard):

| workers / shards | ring built | one worker's candidacies (found) |
|---|---:|---:|
| 20 / 2,000 | 14.2 ms | 0.03 ms (210) |
| 100 / 10,000 | 41.8 ms | 0.08 ms (209) |
| 1,000 / 100,000 | 488 ms | 0.46 ms (201) |

**Spawn latency and death detection**: `PYTHONPATH=scripts .venv/bin/python -m benchmarks.spawn`
(spawn → hello, idle PSS, SIGKILL → pidfd readable / `wait()` returned, warm and fresh). Almost
all of the few milliseconds of death detection is the kernel tearing down a Python + trio
process; supervisord, for comparison, notices exits in a loop of up to 1 s.

**Backpressure** (a slow handler's child RSS over time): `PYTHONPATH=scripts .venv/bin/python -m
benchmarks.throughput --backpressure 60`; figures in *Sinks: throughput and memory under
backpressure* below.
"""


def machine() -> list[tuple[str, str]]:
    cpu, ram = "?", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    node = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        node = subprocess.run(
            ["node", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    dynalite = "?"
    with contextlib.suppress(OSError, ValueError):
        package = harness.ROOT / "node_modules" / "dynalite" / "package.json"
        dynalite = json.loads(package.read_text())["version"]
    stack = " · ".join(harness.version(d) for d in ("trio", "trio-websocket", "wsproto"))
    return [
        ("CPUs (nproc)", str(os.cpu_count())),
        ("CPU model", cpu),
        ("RAM", ram),
        ("kernel", f"Linux {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("trio · trio-websocket · wsproto", stack),
        ("boto3", harness.version("boto3")),
        ("moto (its DynamoDB server, one request at a time)", harness.version("moto")),
        ("dynalite · Node.js", f"{dynalite} · {node}"),
    ]


def render(mode: str, run_seconds: float | None, load: Load = harness.load_json) -> str:
    sections = rendered(load)
    fleet, requests = load("fleet"), load("requests")
    head = ["# Benchmarks\n"]
    add = head.append
    add(
        "Generated by `scripts/bench.sh` (one command: set-up included, everything on "
        "127.0.0.1 against moto's DynamoDB server and dynalite; about 23 minutes on 2 cores) "
        "through `python -m benchmarks.report` from `out/bench/*.json`. Do not edit this part "
        "by hand: change the templates in `scripts/benchmarks/report/` and re-run. The "
        "sections after *Further measurements* are kept as written when the report is "
        "published.\n"
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = str(harness.git_state()["head"]) or "?"
    took = f", the whole run took {run_seconds / 60:.1f} min" if run_seconds else ""
    add(f"Run: {stamp}, commit {commit}, mode **{mode}**{took}.")
    if mode == "quick":
        add(
            "\n**This is a quick smoke run (`scripts/bench.sh --quick`): one or two trials "
            "each, parts side by side. Its figures show that the benchmark runs, nothing more.**"
        )
    if fleet and not fleet.get("quick"):
        busy = fleet.get("machine_cpu_busy_percent")
        add(
            "\nStage 1 runs rows 1 and 2, python-dynamodb-lock, supervisord and row 5 in three "
            "lanes side by side: their figures are dominated by lease and loop timers (seconds), "
            "or do not depend on timing at all (memory)"
            + (f"; the machine was {busy:.0f} % busy during that stage" if busy else "")
            + ". Rows 6, 3, 4 and 7 then run one at a time, alone; row 8, its two host-death"
            " fleets side by side, then each deploy fleet alone (their hand-offs give the"
            " writer gap, a latency); row 9 last, alone."
        )
        parts = [part for part in (fleet, requests) if part]
        keys = ("busy_at_start", "busy_at_end")
        others = sorted({line for part in parts for key in keys for line in part.get(key, [])})
        if others:
            add(
                "\n**Note: other test or benchmark processes were running during the run:** "
                + "; ".join(f"`{line[:80]}`" for line in others[:5])
            )
    live, growth = load("live"), load("fleet_growth")
    parts = (fleet, requests, live, growth)
    failed = [e for part in parts if part for e in part.get("errors", [])]
    if failed:
        add(
            "\n**Parts that failed in this run:** "
            + "; ".join(f"`{e.get('job', '?')}`: {str(e.get('error', '?'))[:200]}" for e in failed)
        )
    add(
        "\nPercentiles are nearest-rank: the p-th percentile of n samples is the ⌈p/100 · n⌉-th "
        "smallest, so p50 of an even count is the lower middle sample, and with fewer than 100 "
        "samples p99 is the largest. Ratios are shardvisor ÷ peer: below 1 means shardvisor "
        "takes less time (rows 1–3, 6), above 1 means it moves more messages (row 4).\n"
    )
    add("## Summary\n")
    header = ("row", "shardvisor (p50 · p99)", "peer (same run, unless a reference)", "ratio")
    add(table((*header, "trials"), [row for _, rows in sections for row in rows]))
    add("\n## Machine\n")
    add(table(("", ""), [*machine(), ("peers (own virtualenvs under out/bench/)", _peers(load))]))
    add("")
    texts = "\n".join(text for text, _ in sections)
    return "\n".join(head) + "\n" + texts + "\n" + STATIC


def _peers(load: Load) -> str:
    peers = []
    if lock := load("peers_lock"):
        peers.append(f"python-dynamodb-lock {lock.get('version', '?')}")
    if supervisord := load("peers_supervisord"):
        peers.append(f"supervisor (supervisord) {supervisord.get('version', '?')}")
    if throughput := load("throughput"):
        peers.append(f"websockets {throughput.get('versions', {}).get('websockets', '?')}")
    return ", ".join(peers) or "—"


def published(generated: str, current: str) -> str:
    """The new generated part, then whatever ``current`` keeps after the marker."""
    _, marker, kept = current.partition(KEPT_MARKER)
    return generated.rstrip("\n") + "\n\n" + KEPT_MARKER + (kept if marker else "\n")
