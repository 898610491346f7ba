"""Row 8: nothing lost on a live-only feed, with and without a warm standby; the writer gap at a
hand-off; what a standby costs.

Fleets, each on its own DynamoDB server and live-only feed (``benchmarks.live_fleets``):
deploys (SIGTERM) and host deaths (SIGKILL of a process group, 3 s leases) with ``[standby]
count`` 0 and 1, and the deploys with count 1 again on the other kind of server. They run in
phases, one after another: first the two host-death fleets side by side (what they measure is
a count: messages lost), then each deploy fleet alone, because their hand-offs give the writer
gap, a latency, which is measured alone on the machine like rows 3, 4, 6 and 7. The standbys'
cost is sampled in the host-death fleet with count 1 before its first kill.

    python -m benchmarks.live [--quick] [--trials N] [--server moto|dynalite] [--only NAME]

writes out/bench/live.json.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import trio

from benchmarks import harness
from benchmarks.fleets import servers
from benchmarks.live_fleets import Setup, live_fleet
from benchmarks.report import sections

TRIALS = 5  # each deploy moves half the shards (4 hand-offs), and the rebalance brings 4 back


Phase = list[list[Setup]]  # lanes side by side; a lane's fleets one after another


def phases_of(server: str, quick: bool) -> list[Phase]:
    """The fleets in phases, run one after another. Two lanes at most on 2 cores: more would
    starve the supervisors' heartbeats. The writer gap was measured beside the other lane
    until December 2026: there the hand-offs on moto's server (one request at a time, 5-10 ms
    of its CPU for a hand-over) queued behind the other fleet's work for the two cores, and the
    figure said more about the machine than about the hand-off."""
    other = "dynalite" if server == "moto" else "moto"
    if quick:  # a smoke run: each kind of kill and each count once, two shards, side by side
        return [
            [
                # The deploy on the default lease: a hand-off waits for no expiry, and a 3 s
                # lease (2.4 s of validity) ran out in a smoke run beside the whole suite,
                # where moto answered heartbeats too late: the owner lost the shard
                # mid-hand-off and the run had no make-before-break move to measure.
                [Setup("deploy", 0, server, shards=2)],
                [Setup("host", 1, server, lease="3s", shards=2, cost=True)],
            ]
        ]
    return [
        [[Setup("host", 0, server, lease="3s")], [Setup("host", 1, server, lease="3s", cost=True)]],
        [[Setup("deploy", 0, server)]],
        [[Setup("deploy", 1, server)]],
        [[Setup("deploy", 1, other)]],
    ]


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--only", action="append", default=[], help="a fleet's name (repeat)")
    args = parser.parse_args()
    harness.interruptible()
    harness.use_local_aws()
    phases = [
        [[s for s in lane if s.name in args.only or not args.only] for lane in phase]
        for phase in phases_of(args.server, args.quick)
    ]
    chosen = [s for phase in phases for lane in phase for s in lane]
    trials = args.trials or (1 if args.quick else TRIALS)
    with harness.recorded("live", args.quick) as results:
        results.update(server=args.server, workdir=str(harness.run_dir().relative_to(harness.ROOT)))
        found: list[dict[str, Any]] = []

        def job(setup: Setup, url: str) -> harness.Job:
            async def run() -> None:
                found.append(await live_fleet(setup, trials, url, args.quick))

            return setup.name, run

        try:
            with contextlib.ExitStack() as stack:
                kinds = Counter(setup.server for setup in chosen)
                pools = {k: iter(stack.enter_context(servers(k, n))) for k, n in kinds.items()}
                for phase in phases:
                    lanes = [
                        [job(setup, next(pools[setup.server]).url) for setup in lane]
                        for lane in phase
                        if lane
                    ]
                    if not lanes:
                        continue
                    names = " | ".join(", ".join(name for name, _ in lane) for lane in lanes)
                    print(f"  {'side by side' if len(lanes) > 1 else 'alone'}: {names}", flush=True)
                    trio.run(harness.run_lanes, lanes, results["errors"])
                    results.setdefault("phases", []).append(
                        [[name for name, _ in lane] for lane in lanes]
                    )
        finally:
            harness.end_spawned()
        order = {s.name: i for i, s in enumerate(chosen)}
        results["fleets"] = sorted(found, key=lambda f: order[f["name"]])
    print(sections(["live"]))


if __name__ == "__main__":
    main()
