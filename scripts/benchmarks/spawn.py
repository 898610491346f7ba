"""Warm (zygote) versus fresh spawns of shard workers: latency, memory, death detection.

    python -m benchmarks.spawn [--trials N] [--quick]

For each mode it measures, with real processes and pipes:
- spawn -> Hello received: what a shard restart waits before it can send Start;
- PSS per idle child (after Ready) with 8 and 32 children running, from /proc/<pid>/smaps_rollup
  (PSS splits shared pages between their users: what a child really costs);
- SIGKILL -> ``wait()`` returned: how soon the supervisor sees a child die.

Not part of scripts/bench.sh: writes out/bench/spawn.json and prints its table.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from benchmarks import harness, procfs
from benchmarks.report import sections
from benchmarks.stats import percentile
from shard_worker.contract.pipe import Hello, Ready, SinkSpec, Start, Stop, WorkerSettings
from supervisor.adapters.spawn import ChildHandle
from supervisor.adapters.zygote_client import SpawnResult, ZygoteSpawner, spawn_fresh

Spawn = Callable[[str], Awaitable[SpawnResult]]
HELLO_TIMEOUT = 10.0


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Read a child's stdout/stderr to EOF so it never blocks on a full pipe."""
    async with stream:
        while await stream.receive_some(65536):
            pass


async def _reports(child: ChildHandle) -> None:
    """Keep reading an idle child's heartbeats (a parent that reads nothing is broken)."""
    while await child.receive() is not None:
        pass


async def _spawn_to_hello(spawn: Spawn, nursery: trio.Nursery, shard: str) -> ChildHandle:
    child, outputs = await spawn(shard)
    for _name, stream in outputs:
        nursery.start_soon(_drain, stream)
    with trio.fail_after(HELLO_TIMEOUT):
        hello = await child.receive()
    if not isinstance(hello, Hello):
        raise TypeError(f"expected hello, got {hello!r}")
    return child


async def hello_latency(spawn: Spawn, trials: int) -> list[float]:
    samples = []
    async with trio.open_nursery() as nursery:
        for i in range(trials):
            began = time.perf_counter()
            child = await _spawn_to_hello(spawn, nursery, f"lat-{i}")
            samples.append(time.perf_counter() - began)
            await child.aclose()
    return samples


async def death_latency(spawn: Spawn, trials: int) -> tuple[list[float], list[float]]:
    """SIGKILL -> our own pidfd readable (the kernel's part), and -> ``wait()`` returned."""
    seen: list[float] = []
    waited: list[float] = []
    async with trio.open_nursery() as nursery:
        for i in range(trials):
            child = await _spawn_to_hello(spawn, nursery, f"kill-{i}")
            pidfd = os.pidfd_open(child.pid)  # alive and unreaped: it names this very child
            try:
                began = time.perf_counter()
                child.signal(signal.SIGKILL)
                with trio.fail_after(5):
                    async with trio.open_nursery() as both:
                        both.start_soon(_stamp_readable, pidfd, seen)
                        await child.wait()
                        waited.append(time.perf_counter() - began)
                seen[-1] -= began
            finally:
                trio.lowlevel.notify_closing(pidfd)
                os.close(pidfd)
            await child.aclose()
    return seen, waited


async def _stamp_readable(pidfd: int, stamps: list[float]) -> None:
    await trio.lowlevel.wait_readable(pidfd)
    stamps.append(time.perf_counter())


async def idle_pss(spawn: Spawn, count: int, out_dir: Path) -> float:
    """Mean PSS (MiB) of ``count`` idle children, all running at once."""
    children: list[ChildHandle] = []
    start = Start(
        shard="idle",
        epoch=1,
        worker="bench",
        streams=(),
        checkpoint={},
        sink=SinkSpec(path=str(out_dir / "{shard}" / "{stream}.{epoch}.jsonl")),
        settings=WorkerSettings(),
        fence_deadline=time.monotonic() + 3600,
    )
    async with trio.open_nursery() as nursery:
        try:
            for i in range(count):
                child = await _spawn_to_hello(spawn, nursery, f"idle-{i}")
                children.append(child)
                await child.send(start)
                with trio.fail_after(HELLO_TIMEOUT):
                    while not isinstance(await child.receive(), Ready):
                        pass
                nursery.start_soon(_reports, child)
            await trio.sleep(1.0)  # let every child settle into its idle loop
            pss = [procfs.pss_kib(child.pid) for child in children]
        finally:
            with trio.CancelScope(shield=True):
                for child in children:
                    await child.send(Stop(reason="bench", deadline=time.monotonic() + 2))
                for child in children:
                    with trio.move_on_after(3):
                        await child.wait()
                    await child.aclose()
        nursery.cancel_scope.cancel()
    return statistics.mean(pss) / 1024


async def measure(
    spawn: Spawn, trials: int, counts: tuple[int, ...], out_dir: Path
) -> dict[str, float]:
    results: dict[str, float] = {}
    hello = await hello_latency(spawn, trials)
    results["hello_p50"] = percentile(hello, 0.5) * 1e3
    results["hello_p99"] = percentile(hello, 0.99) * 1e3
    for count in counts:
        results[f"pss_{count}"] = await idle_pss(spawn, count, out_dir)
    seen, waited = await death_latency(spawn, trials)
    for key, samples in (("seen", seen), ("death", waited)):
        results[f"{key}_p50"] = percentile(samples, 0.5) * 1e3
        results[f"{key}_p99"] = percentile(samples, 0.99) * 1e3
    return results


async def measure_both(trials: int, counts: tuple[int, ...]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as tmp:
        spawner = ZygoteSpawner()
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(spawner.run)
            if not spawner.available:
                raise RuntimeError("the zygote did not start")
            zygote_pid = spawner.zygote_pid
            assert zygote_pid is not None
            warm = await measure(spawner.spawn, trials, counts, Path(tmp))
            zygote_pss = procfs.pss_kib(zygote_pid) / 1024
            nursery.cancel_scope.cancel()
        fresh = await measure(spawn_fresh, trials, counts, Path(tmp))
    return {
        "trials": trials,
        "counts": counts,
        "warm": warm,
        "fresh": fresh,
        "zygote_pss_mib": zygote_pss,
    }


def main() -> None:
    parser = harness.arguments(__doc__, trials=50)
    args = parser.parse_args()
    harness.interruptible()
    logging.basicConfig(level=logging.WARNING)  # the spawner's warnings, if any
    trials, counts = (min(args.trials, 10), (8,)) if args.quick else (args.trials, (8, 32))
    with harness.recorded("spawn", args.quick) as results:
        results.update(trio.run(measure_both, trials, counts))
    print(sections(["spawn"]))


if __name__ == "__main__":
    main()
