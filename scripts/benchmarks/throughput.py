"""Row 4: messages/s of one shard worker child beside bare client loops; RSS under backpressure.

A feed process (``benchmarks.throughput_feed``) sends 100-byte messages as fast as TCP takes them,
so the receiver is the bottleneck; with two CPUs the feed runs on one and every receiver on the
other. In rounds, each on a fresh feed, side by side in one run: a real ``python -m shard_worker``
driven over its pipes as the supervisor does, writing the jsonl sink, once per WebSocket
transport (``[websocket] transport``: websockets, trio-websocket), then handing batches to a
no-op handler (rates from its heartbeats' ``written`` counter); a bare trio-websocket receive
loop in this process with the worker's connection settings; a bare ``websockets`` (asyncio) loop
(the peer, ``benchmarks.peers.ws_client``). Then the same with permessage-deflate (the feed
compresses when the URL asks and the client offers): the websockets child and the bare
websockets loop (trio-websocket negotiates no extension). Each: one second of warm-up, then
``--seconds``. Bytes on the wire per message are the feed's own frames, counted.

``--backpressure S``: then a child whose handler takes a tenth of a 20,000 msg/s feed, its RSS
every 5 s for S seconds, and the records handled checked against its final checkpoint.

    python -m benchmarks.throughput [--quick] [--trials RUNS] [--seconds S] [--backpressure S]

writes out/bench/throughput.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trio

from benchmarks import harness, procfs
from benchmarks.report import sections
from benchmarks.stats import summary
from benchmarks.throughput_feed import PAYLOAD_BYTES, deflater, frames
from shard_worker.adapters.pipes import MessageChannel
from shard_worker.adapters.websocket import RECEIVE_BUFFER_BYTES
from shard_worker.contract.pipe import (
    Heartbeat,
    Hello,
    Ready,
    SinkSpec,
    Start,
    Stop,
    Stopped,
    StreamSpec,
    WorkerSettings,
)
from supervisor.devtools.servers import ServerProcess, accepts_tcp, start_server

# The feed on one CPU, every receiver on another: less noise from the scheduler's placement.
FEED_CPU, LOOP_CPU = 0, 1
FEED = "`benchmarks.throughput_feed`: raw frames after a wsproto handshake"
DEFLATE = "&deflate=1"  # the feed's URL asks it to compress (when the client offers it)


def pin(pid: int, cpu: int | None) -> None:
    if cpu is not None and (os.cpu_count() or 1) > cpu and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, {cpu})


@contextlib.contextmanager
def feed(rate: float = 0.0) -> Iterator[str]:
    """A fresh feed process on its own CPU; yields the URL of a stream (``{after}`` open)."""
    server: ServerProcess = start_server(
        "throughput-feed",
        lambda port: [
            sys.executable, "-m", "benchmarks.throughput_feed",
            "--port", str(port), "--rate", f"{rate:g}",
        ],
        url=lambda port: f"ws://127.0.0.1:{port}/blast?after={{after}}",
        ready=accepts_tcp,
    )  # fmt: skip
    with server:
        pin(server.proc.pid, FEED_CPU)
        yield server.url


async def bare_loop(url: str, seconds: float) -> tuple[float, float]:
    """Messages/s of get_message() alone, with the worker's connection settings; and CPU
    seconds per message."""
    from trio_websocket import DisconnectionTimeout, open_websocket_url

    count = 0
    pin(0, LOOP_CPU)
    try:
        async with open_websocket_url(
            url.replace("{after}", "0"),
            max_message_size=1 << 20,
            receive_buffer_size=RECEIVE_BUFFER_BYTES,
            disconnect_timeout=0.1,  # the feed does not answer the close handshake
        ) as ws:
            end = trio.current_time() + 1.0
            while trio.current_time() < end:  # warm-up
                await ws.get_message()
            start, cpu = trio.current_time(), time.process_time()
            end = start + seconds
            while True:
                await ws.get_message()
                count += 1
                if not count & 255 and trio.current_time() >= end:
                    break
            elapsed = trio.current_time() - start
            cpu = time.process_time() - cpu
    except DisconnectionTimeout:
        pass
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return count / elapsed, cpu / count


class Child:
    """A real ``python -m shard_worker`` over two pipes, as the supervisor runs it."""

    def __init__(self, process: trio.Process, channel: MessageChannel) -> None:
        self.process = process
        self.channel = channel

    @classmethod
    async def spawn(cls, env: dict[str, str]) -> Child:
        control_r, control_w = os.pipe()
        report_r, report_w = os.pipe()
        try:
            process = await trio.lowlevel.open_process(
                [
                    *(sys.executable, "-m", "shard_worker"),
                    *("--control-fd", str(control_r), "--report-fd", str(report_w)),
                ],
                pass_fds=(control_r, report_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(control_r)
            os.close(report_w)
        pin(process.pid, LOOP_CPU)
        fd = trio.lowlevel.FdStream
        child = cls(process, MessageChannel(fd(report_r), fd(control_w)))
        assert isinstance(await child.channel.receive(), Hello)
        return child

    async def next(self, kind: type) -> Any:
        while True:
            message = await self.channel.receive()
            if message is None:
                raise RuntimeError("the child closed its report pipe")
            if isinstance(message, kind):
                return message

    async def start(
        self, url: str, sink: SinkSpec, heartbeat: float = 1.0, transport: str = "websockets"
    ) -> None:
        await self.channel.send(
            Start(
                shard="bench",
                epoch=1,
                worker="bench",
                streams=(StreamSpec(id="a", url=url, sequence="seq"),),
                checkpoint={},
                sink=sink,
                settings=WorkerSettings(
                    checkpoint_interval=1.0, heartbeat_interval=heartbeat, transport=transport
                ),
                fence_deadline=time.monotonic() + 3600,
            )
        )
        await self.next(Ready)

    async def stop(self) -> Stopped:
        await self.channel.send(Stop(reason="bench", deadline=time.monotonic() + 20))
        with trio.fail_after(25):
            stopped = await self.next(Stopped)
            await self.process.wait()
        await self.channel.aclose()
        return stopped


async def child_rate(
    url: str, sink: SinkSpec, seconds: float, transport: str
) -> tuple[float, float]:
    """Messages/s written by a child, from its heartbeats (every 0.25 s, each carrying the
    ``written`` count) over ``seconds`` after one second of warm-up; and its CPU seconds per
    message over the same time."""
    child = await Child.spawn(harness.benchmarks_env())
    await child.start(url, sink, heartbeat=0.25, transport=transport)
    ready = time.monotonic()
    first = await child.next(Heartbeat)
    while time.monotonic() - ready < 1.0:
        first = await child.next(Heartbeat)
    t0, cpu = time.monotonic(), procfs.cpu_seconds(child.process.pid)
    last = first
    while time.monotonic() - t0 < seconds - 0.1:
        last = await child.next(Heartbeat)
    elapsed, cpu = time.monotonic() - t0, procfs.cpu_seconds(child.process.pid) - cpu
    count = last.written - first.written
    await child.stop()
    return count / elapsed, cpu / count


def websockets_rate(url: str, seconds: float) -> tuple[float, float]:
    """The peer's loop, as a process under its own virtualenv, on the receivers' CPU."""
    python = harness.peer_python(harness.SUPERVISORD_VENV)
    found = subprocess.run(
        [
            str(python),
            "-m",
            "benchmarks.peers.ws_client",
            url.replace("{after}", "0"),
            f"{seconds}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        env=harness.benchmarks_env(BENCH_PIN_CPU=str(LOOP_CPU)),
    )
    lines = found.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"the websockets loop failed: {found.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return result["messages"] / result["seconds"], result["cpu"] / result["messages"]


Loop = Callable[[str], tuple[float, float]]  # the feed's URL -> (messages/s, CPU s/message)


def loops(out: Path, seconds: float) -> dict[str, Loop]:
    """Each receiver measured: a function of the feed's URL -> (messages/s, CPU s/message).
    The names ending in ", deflate" are measured on a feed that compresses."""
    jsonl = SinkSpec(path=str(out / "{shard}" / "{stream}.{epoch}.jsonl"))
    noop = SinkSpec(kind="handler", handler="benchmarks.handlers:noop_handler")

    def child(sink: SinkSpec, transport: str = "websockets") -> Loop:
        return lambda url: trio.run(child_rate, url, sink, seconds, transport)

    def deflating(loop: Loop) -> Loop:
        return lambda url: loop(url + DEFLATE)

    return {
        "bare trio-websocket": lambda url: trio.run(bare_loop, url, seconds),
        "child → jsonl": child(jsonl),
        "child (trio-websocket) → jsonl": child(jsonl, "trio-websocket"),
        "child → no-op handler": child(noop),
        "bare websockets": lambda url: websockets_rate(url.replace("{after}", "0"), seconds),
        "child → jsonl, deflate": deflating(child(jsonl)),
        "bare websockets, deflate": deflating(
            lambda url: websockets_rate(url.replace("{after}", "0"), seconds)
        ),
    }


def wire_bytes(messages: int = 100_000) -> dict[str, float]:
    """Bytes on the wire per message, of the feed's own frames: plain and deflated (one
    connection's context, as the feed sends them)."""
    plain = len(frames(1, messages, None)) / messages
    deflated = len(frames(1, messages, deflater())) / messages
    return {"plain": plain, "deflate": deflated}


def measure(runs: int, seconds: float) -> dict[str, Any]:
    """``runs`` rounds of every loop, each on a fresh feed; rates and CPU per message."""
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}  # CPU microseconds per message
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        for run in range(runs):
            for name, loop in loops(Path(tmp), seconds).items():
                if name in errors:
                    continue
                try:
                    with feed() as url:
                        rate, cpu = loop(url)
                except Exception as exc:  # noqa: BLE001 - one loop failing is reported, not fatal
                    errors[name] = f"failed: {exc!r}"[:500]
                    continue
                rates.setdefault(name, []).append(rate)
                cpus.setdefault(name, []).append(cpu * 1e6)
                print(f"  run {run + 1}/{runs}: {name} {rate:,.0f} msg/s", flush=True)
    return {
        "loops": {
            name: {
                "rate": summary(values),
                "samples": values,
                "cpu_us_per_message": summary(cpus.get(name, [])),
            }
            for name, values in rates.items()
        },
        "errors": errors,
    }


async def backpressure(seconds: float, feed_rate: float, out: Path) -> dict[str, Any]:
    """RSS samples of a child whose handler takes a tenth of the feed's rate, then its records
    checked against its final checkpoint: none missing, none twice."""
    out.mkdir(parents=True, exist_ok=True)
    handled = out / "handled.txt"
    env = harness.benchmarks_env(
        BENCH_HANDLER_RATE=str(feed_rate / 10), BENCH_HANDLER_OUT=str(handled)
    )
    sink = SinkSpec(
        kind="handler", handler="benchmarks.handlers:slow_handler", batch_max_records=100
    )
    samples: list[tuple[float, float]] = []
    with feed(rate=feed_rate) as url:
        child = await Child.spawn(env)
        await child.start(url, sink)
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain_reports, child)
            while True:
                elapsed = time.monotonic() - t0
                samples.append((elapsed, procfs.rss_kib(child.process.pid) / 1024))
                if elapsed >= seconds:
                    break
                await trio.sleep(min(5.0, seconds - elapsed))
            nursery.cancel_scope.cancel()
        offered = int(feed_rate * (time.monotonic() - t0))
        stopped = await child.stop()
    seqs = [int(line.split()[1]) for line in handled.read_text().splitlines()]
    last = stopped.checkpoint.get("a", 0)
    missing = len(set(range(1, last + 1)) - set(seqs))
    return {
        "feed_rate": feed_rate,
        "handler_rate": feed_rate / 10,
        "rss_mib": samples,
        "handled": len(seqs),
        "checkpoint": last,
        "offered": offered,
        "missing_or_repeated": missing + len(seqs) - len(set(seqs)),
    }


async def _drain_reports(child: Child) -> None:
    while await child.channel.receive() is not None:
        pass


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--seconds", type=float, default=0.0, help="counted per measurement")
    parser.add_argument("--backpressure", type=float, default=0.0, help="seconds of RSS samples")
    parser.add_argument("--feed-rate", type=float, default=20_000.0, help="backpressure feed")
    args = parser.parse_args()
    harness.interruptible()
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    runs = args.trials or (1 if args.quick else 3)
    with harness.recorded("throughput", args.quick) as results:
        results.update(measure(runs, seconds))
        results.update(
            message_bytes=PAYLOAD_BYTES,
            wire_bytes_per_message=wire_bytes(),
            seconds_per_measurement=seconds,
            warm_up_s=1.0,
            runs=runs,
            feed=FEED,
            versions={
                "trio-websocket": harness.version("trio-websocket"),
                "websockets (transport)": harness.version("websockets"),
                "websockets": harness.version(
                    "websockets", harness.SUPERVISORD_VENV / "bin" / "python"
                ),
            },
        )
        if args.backpressure:
            with tempfile.TemporaryDirectory(prefix="bench-backpressure-") as tmp:
                found = trio.run(backpressure, args.backpressure, args.feed_rate, Path(tmp))
            results["backpressure"] = found
    print(sections(["throughput"]))
    if results.get("backpressure", {}).get("missing_or_repeated"):
        sys.exit(1)


if __name__ == "__main__":
    main()
