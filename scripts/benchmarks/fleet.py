"""Rows 1 and 2, with the timer-bound peers and row 5 side by side: the fleet stage of the run.

Failover (``benchmarks.failover``) and hand-off (``benchmarks.handoff``) fleets in three lanes
side by side, beside python-dynamodb-lock (``benchmarks.peers.dynamodb_lock``), supervisord
(``benchmarks.peers.supervisord``) and, in a full run, row 5 (``benchmarks.scale --part memory``
on dynalite): every figure here is dominated by lease and loop timers (seconds), or does not
depend on timing at all (memory), so the stage fits the 10 minutes of the whole run. A quick run
runs each code path once.

    python -m benchmarks.fleet [--quick] [--trials N] [--server moto|dynalite]

writes out/bench/fleet.json, peers_lock.json, peers_supervisord.json (and memory.json).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import trio

from benchmarks import harness
from benchmarks.failover import failover_fleet
from benchmarks.fleets import servers
from benchmarks.handoff import handoff_fleet
from benchmarks.peers import dynamodb_lock, supervisord
from benchmarks.report import sections
from supervisor.devtools.servers import ServerProcess, start_dynamodb

ORDER = {("host", "3s"): 0, ("host", "10s"): 1, ("supervisor", "3s"): 2}  # as in the report


def lanes(
    args: Any, dynamodb: list[ServerProcess], results: dict[str, Any], lock: dict[str, Any]
) -> list[list[harness.Job]]:
    trials = args.trials or (1 if args.quick else 20)

    def failover(mode: str, setting: str, server: ServerProcess) -> harness.Job:
        async def job() -> None:
            results["failover"].append(await failover_fleet(mode, setting, trials, server.url))

        return f"failover {mode} {setting}", job

    def handoff(server: ServerProcess, count: int) -> harness.Job:
        async def job() -> None:
            results["handoff"] = await handoff_fleet(count, server.url)

        return "hand-off", job

    async def supervisord_job() -> None:
        found = await supervisord.beside(trials, args.quick)
        found["side_by_side_with"] = "the fleet stage (timer-bound parts of the same run)"
        harness.write_json("peers_supervisord", found)

    def lock_job(server: ServerProcess, settings: list[str], other: bool) -> harness.Job:
        """The peer on a server like the fleet's; with ``other``, then on the other kind too
        (moto's and dynalite: how little the server matters)."""

        async def job() -> None:
            lock.update(
                await dynamodb_lock.beside(server.url, args.server, trials, args.parallel, settings)
            )
            if other:
                kind = "dynalite" if args.server == "moto" else "moto"
                with await trio.to_thread.run_sync(start_dynamodb, kind) as second:
                    found = await dynamodb_lock.beside(
                        second.url, kind, trials, args.parallel, settings
                    )
                lock["other_servers"] = {kind: found["settings"]}

        return "python-dynamodb-lock", job

    async def memory_job() -> None:
        argv = [
            sys.executable,
            "-m",
            "benchmarks.scale",
            "--part",
            "memory",
            "--server",
            "dynalite",
        ]
        with (harness.OUT / "memory.log").open("wb") as log:
            await trio.run_process(
                argv, stdout=log, stderr=subprocess.STDOUT, env=harness.benchmarks_env()
            )

    s = dynamodb
    if args.quick:  # a smoke test: each code path once
        return [
            [failover("host", "3s", s[0]), handoff(s[0], trials)],
            [lock_job(s[1], ["3s"], other=True), ("supervisord", supervisord_job)],
        ]
    return [  # about equally long: 5.5 minutes on 2 cores
        [failover("host", "10s", s[0])],
        [
            failover("host", "3s", s[1]),
            failover("supervisor", "3s", s[1]),
            ("supervisord", supervisord_job),
        ],
        [
            handoff(s[2], args.trials or 20),
            ("memory (row 5)", memory_job),
            failover("supervisor", "10s", s[2]),
            lock_job(s[3], list(dynamodb_lock.SETTINGS), other=False),
        ],
    ]


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--parallel", type=int, default=10, help="lock trials side by side")
    args = parser.parse_args()
    harness.interruptible()
    harness.use_local_aws()
    lock: dict[str, Any] = {}
    with harness.recorded("fleet", args.quick) as results:
        workdir = harness.run_dir().relative_to(harness.ROOT)
        results.update(server=args.server, workdir=str(workdir), failover=[])
        try:
            with servers(args.server, 2 if args.quick else 4) as dynamodb:
                chosen = lanes(args, dynamodb, results, lock)
                print(f"  {len(chosen)} lanes side by side", flush=True)
                trio.run(harness.run_lanes, chosen, results["errors"])
        finally:
            harness.end_spawned()
        results["failover"].sort(key=lambda r: ORDER.get((r["mode"], r["setting"]), 3))
    if lock:
        lock.update(
            quick=args.quick,
            side_by_side_with="shardvisor's fleet measurements (same run, own server)",
            machine=harness.machine(),
            command=harness.command(),
        )
        harness.write_json("peers_lock", lock)
    print(sections(["fleet", "peers_lock"]))


if __name__ == "__main__":
    main()
