#!/usr/bin/env python3
"""Warm (zygote) versus fresh spawns of shard workers: latency, memory, death detection.

    python scripts/bench_spawn.py [--trials N] [--quick]

For each mode it measures, with real processes and pipes:
- spawn -> Hello received: what a shard restart waits before it can send Start;
- PSS per idle child (after Ready) with 8 and 32 children running, from /proc/<pid>/smaps_rollup
  (PSS splits shared pages between their users: what a child really costs);
- SIGKILL -> ``wait()`` returned: how soon the supervisor sees a child die.

A benchmark, not a test: it prints a markdown table and asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Pss line for pid {pid}")


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
    seen, waited = [], []
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
            pss = [_pss_kib(child.pid) for child in children]
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
    results["hello_p50"] = _percentile(hello, 0.5) * 1e3
    results["hello_p99"] = _percentile(hello, 0.99) * 1e3
    for count in counts:
        results[f"pss_{count}"] = await idle_pss(spawn, count, out_dir)
    seen, waited = await death_latency(spawn, trials)
    for key, samples in (("seen", seen), ("death", waited)):
        results[f"{key}_p50"] = _percentile(samples, 0.5) * 1e3
        results[f"{key}_p99"] = _percentile(samples, 0.99) * 1e3
    return results


async def main_async(trials: int, counts: tuple[int, ...]) -> None:
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
            zygote_pss = _pss_kib(zygote_pid) / 1024
            nursery.cancel_scope.cancel()
        fresh = await measure(spawn_fresh, trials, counts, Path(tmp))

    rows = [
        ("spawn -> Hello p50 (ms)", "hello_p50"),
        ("spawn -> Hello p99 (ms)", "hello_p99"),
        *((f"PSS per idle child, {n} running (MiB)", f"pss_{n}") for n in counts),
        ("SIGKILL -> pidfd readable p50 (ms)", "seen_p50"),
        ("SIGKILL -> pidfd readable p99 (ms)", "seen_p99"),
        ("SIGKILL -> wait() p50 (ms)", "death_p50"),
        ("SIGKILL -> wait() p99 (ms)", "death_p99"),
    ]
    python = f"{platform.python_implementation()} {platform.python_version()}"
    print(f"\n{trials} trials; {python}, Linux {platform.release()}, {os.cpu_count()} CPUs\n")
    print("| metric | warm (zygote) | fresh | fresh / warm |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        ratio = fresh[key] / warm[key] if warm[key] else float("nan")
        print(f"| {label} | {warm[key]:.2f} | {fresh[key]:.2f} | {ratio:.1f}x |")
    print(f"\nThe zygote itself (shared by all warm children): PSS {zygote_pss:.1f} MiB")
    print(f"\ncommand: {shlex.join(['python', *sys.argv])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="latency samples per mode")
    parser.add_argument("--quick", action="store_true", help="10 trials, 8 idle children only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # the spawner's warnings, if any
    trials, counts = (min(args.trials, 10), (8,)) if args.quick else (args.trials, (8, 32))
    trio.run(main_async, trials, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
