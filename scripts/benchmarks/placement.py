"""What standby placement costs a supervisor's round, in CPU, as the fleet grows.

    python -m benchmarks.placement [--quick]

Every round each supervisor places the standbys of every shard (``core.standby``): the top
``count`` live workers of each shard's rendezvous ranking, its owner left out. Ranked afresh
each round that is O(shards x workers) hashes, on the event loop; with the rankings kept from
round to round (``Rankings``), a round walks a few workers per shard and ranks only workers
that appeared since. Pure code, one process, 100 shards per worker, ``count`` 1; each figure
is the median of a few rounds: ranked afresh (every round before, and the first round of a
supervisor now), a steady round, and a round after a worker joined or left.

Beside it, protocol 2's candidates (``core.standby_ring``), which look at no shard a worker
does not stand by for: building the ring of a view (sorting the shards' and members' points)
and one worker's candidacies from its arcs, up to 1,000 workers and 100,000 shards.

Not part of scripts/bench.sh (deterministic, not machine-shared): figures in
docs/benchmarks.md, *Standby placement per round*.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from supervisor.core.items import ShardItem
from supervisor.core.standby import Rankings, place_standbys
from supervisor.core.standby_ring import Ring

SHARDS_PER_WORKER = 100
FLEETS = (20, 50, 100, 200, 500)
QUICK_FLEETS = (20, 50)
RING_FLEETS = (20, 100, 1000)
REPEAT = 3


def _seconds(run: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(workers: int) -> dict[str, float]:
    """Seconds per round for ``workers`` workers, afresh and with kept rankings."""
    rng = random.Random(workers)
    live = [f"w{i:04d}" for i in range(workers)]
    shards = [
        ShardItem(f"s{i:06d}", rng.choice(live), 1) for i in range(workers * SHARDS_PER_WORKER)
    ]
    wanted = dict.fromkeys((s.id for s in shards), 1)

    def place(members: list[str], ranks: Rankings | None) -> object:
        return place_standbys(shards=shards, wanted=wanted, live=members, ranks=ranks)

    found = {"afresh": _seconds(lambda: place(live, None))}
    ranks = Rankings()
    place(live, ranks)
    found["steady"] = _seconds(lambda: place(live, ranks))
    joined = [*live, "joiner"]
    found["join"] = _once(lambda: place(joined, ranks))
    left = joined[1:]
    found["leave"] = _once(lambda: place(left, ranks))
    return found


def _once(run: Callable[[], object]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def measure_ring(workers: int) -> dict[str, float]:
    """Seconds to build the ring of ``workers`` workers and find one worker's candidacies."""
    live = [f"w{i:04d}" for i in range(workers)]
    shards = [f"s{i:06d}" for i in range(workers * SHARDS_PER_WORKER)]
    began = time.perf_counter()
    ring = Ring.build(live, shards, 1)
    built = time.perf_counter() - began
    mine = _seconds(lambda: ring.candidate_for(live[0]))
    return {"build": built, "mine": mine, "count": len(ring.candidate_for(live[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two smallest fleets only")
    args = parser.parse_args()
    print(
        "| workers / shards | ranked afresh | kept: steady round | after a join | after a leave |"
    )
    print("|---|---:|---:|---:|---:|")
    for workers in QUICK_FLEETS if args.quick else FLEETS:
        f = measure(workers)
        ms = {k: f"{1000 * v:,.1f} ms" for k, v in f.items()}
        print(
            f"| {workers} / {workers * SHARDS_PER_WORKER:,} | {ms['afresh']} | {ms['steady']} "
            f"| {ms['join']} | {ms['leave']} |",
            flush=True,
        )
    print("\n| workers / shards | ring built | one worker's candidacies (found) |")
    print("|---|---:|---:|")
    for workers in QUICK_FLEETS if args.quick else RING_FLEETS:
        r = measure_ring(workers)
        print(
            f"| {workers} / {workers * SHARDS_PER_WORKER:,} | {1000 * r['build']:,.1f} ms "
            f"| {1000 * r['mine']:,.2f} ms ({r['count']:,.0f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
