#!/usr/bin/env python3
"""Messages/s of one shard worker child against a bare trio-websocket loop; RSS under backpressure.

    .venv/bin/python scripts/bench_throughput.py [--quick] [--rounds N] [--seconds S]
                                                 [--rss-seconds S] [--feed-rate R]

About 2 minutes (``--quick``: about 45 s). Everything on 127.0.0.1. A feed process sends
100-byte sequenced JSON text messages as fast as TCP takes them (frames built in bulk, so the
feed is never the bottleneck). With two CPUs the feed is pinned to one and the loop measured to
the other. In the same run, in rounds (bare, then each child, ``--rounds`` times):

1. ``bare``: a trio-websocket receive loop in this process (``get_message()`` and a counter),
   with the worker's connection settings;
2. ``jsonl``: a real child (``python -m shard_worker``, driven over its pipes as the supervisor
   does) writing the jsonl sink, sequence checked, checkpoints every second;
3. ``no-op handler``: the same child with ``[sink] kind = "handler"`` and a handler that
   returns at once (``bench_throughput:noop_handler``).

Each is measured over ``--seconds`` after one second of warm-up; a child's rate comes from its
heartbeats' ``written`` counter (every 0.25 s). The ratio is the median over the rounds of the
child's rate over the bare loop's in the same round; the CPU time per message (user + system,
of the loop's process) is shown too: it varies less than the rates on a noisy machine.

Then the backpressure run: the feed at ``--feed-rate`` messages/s (20,000) into a child whose
handler sleeps so that it takes a tenth of that; the child's RSS (VmRSS of /proc/<pid>/status)
every 5 s for ``--rss-seconds`` (60; 15 with ``--quick``), then a graceful stop, and the records
handled are checked against the final checkpoint: none missing, none twice (exit 1 otherwise).
Prints markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shard_worker.adapters.pipes import MessageChannel  # noqa: E402
from shard_worker.contract.pipe import (  # noqa: E402
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

PAYLOAD_BYTES = 100
# With two CPUs or more, the feed runs on one and the loop measured (this process's bare loop,
# or the child) on another, the same for every loop: less noise from the scheduler's placement.
FEED_CPU, LOOP_CPU = 0, 1


def pin(pid: int, cpu: int) -> None:
    if (os.cpu_count() or 1) > cpu and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, {cpu})


def unpin(pid: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, range(os.cpu_count() or 1))


CHUNK_MESSAGES = 512  # frames per send_all of the feed

# --- Handlers for the child (imported as bench_throughput:<name>, scripts/ on PYTHONPATH) ------

_handled = {"count": 0, "last": {}}


def noop_handler(batch) -> None:
    """Takes the batch and does nothing: the cost of the handler path itself."""


def slow_handler(batch) -> None:
    """Sleeps so that it handles BENCH_HANDLER_RATE records per second, and appends each
    record's (stream, seq) to BENCH_HANDLER_OUT (one write per batch) for the gap check."""
    time.sleep(len(batch) / float(os.environ["BENCH_HANDLER_RATE"]))
    lines = "".join(f"{record.stream} {record.seq}\n" for record in batch)
    with open(os.environ["BENCH_HANDLER_OUT"], "a") as out:
        out.write(lines)


# --- The feed: raw frames after a wsproto handshake ---------------------------------------------


def _frame(text: bytes) -> bytes:
    n = len(text)
    if n < 126:
        return bytes((0x81, n)) + text
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + text
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + text


def _message(seq: int) -> bytes:
    head = b'{"seq":%d,"pad":"' % seq
    return head + b"x" * max(0, PAYLOAD_BYTES - len(head) - 2) + b'"}'


async def _serve_connection(stream: trio.SocketStream, rate: float) -> None:
    from urllib.parse import parse_qs, urlsplit

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    ws = WSConnection(ConnectionType.SERVER)
    target = ""
    try:
        while not target:
            data = await stream.receive_some(65536)
            if not data:
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    target = event.target
        await stream.send_all(ws.send(AcceptConnection()))
        query = parse_qs(urlsplit(target).query)
        seq = int(query.get("after", ["0"])[0])
        started = trio.current_time()
        while True:
            count = CHUNK_MESSAGES
            if rate:
                due = int((trio.current_time() - started) * rate) - seq
                if due <= 0:
                    await trio.sleep(0.005)
                    continue
                count = min(count, due)
            chunk = b"".join(_frame(_message(n)) for n in range(seq + 1, seq + count + 1))
            seq += count
            await stream.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return


async def feed_main(port_file: str, rate: float) -> None:
    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, rate)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    Path(port_file).write_text(str(listeners[0].socket.getsockname()[1]))
    await trio.serve_listeners(handler, listeners)


class Feed:
    """The feed as a subprocess (its own core), for the duration of a ``with``."""

    def __init__(self, rate: float = 0.0) -> None:
        self.rate = rate

    def __enter__(self) -> Feed:
        self._dir = tempfile.TemporaryDirectory()
        port_file = Path(self._dir.name) / "port"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "_feed", str(port_file), "--rate", str(self.rate)]
        )
        pin(self.proc.pid, FEED_CPU)
        deadline = time.monotonic() + 10
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the feed did not start")
            time.sleep(0.02)
        self.url = f"ws://127.0.0.1:{port_file.read_text()}/blast?after={{after}}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        self._dir.cleanup()


# --- Measurements -------------------------------------------------------------------------------


async def bare_loop(url: str, seconds: float) -> tuple[float, float]:
    """Messages/s of get_message() alone, with the worker's connection settings; and CPU
    seconds per message."""
    from trio_websocket import DisconnectionTimeout, open_websocket_url

    from shard_worker.drivers.reader import RECEIVE_BUFFER_BYTES

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
        unpin(0)
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

    async def next(self, kind: type) -> object:
        while True:
            message = await self.channel.receive()
            if message is None:
                raise RuntimeError("the child closed its report pipe")
            if isinstance(message, kind):
                return message

    def cpu_seconds(self) -> float:
        """utime + stime of the child so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    async def stop(self) -> Stopped:
        await self.channel.send(Stop(reason="bench", deadline=time.monotonic() + 20))
        with trio.fail_after(25):
            stopped = await self.next(Stopped)
            await self.process.wait()
        await self.channel.aclose()
        return stopped  # type: ignore[return-value]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def start_message(url: str, out: Path, sink: SinkSpec, heartbeat: float = 1.0) -> Start:
    return Start(
        shard="bench",
        epoch=1,
        worker="bench",
        streams=(StreamSpec(id="a", url=url, sequence="seq"),),
        checkpoint={},
        sink=sink,
        settings=WorkerSettings(checkpoint_interval=1.0, heartbeat_interval=heartbeat),
        fence_deadline=time.monotonic() + 3600,
    )


async def child_rate(url: str, sink: SinkSpec, out: Path, seconds: float) -> tuple[float, float]:
    """Messages/s written by a child, from its heartbeats (every 0.25 s, each carrying the
    ``written`` count) over ``seconds`` after one second of warm-up; and its CPU seconds per
    message over the same time."""
    child = await Child.spawn(child_env())
    await child.channel.send(start_message(url, out, sink, heartbeat=0.25))
    await child.next(Ready)
    ready = time.monotonic()
    first = await child.next(Heartbeat)
    while time.monotonic() - ready < 1.0:
        first = await child.next(Heartbeat)
    t0, cpu = time.monotonic(), child.cpu_seconds()
    last = first
    while time.monotonic() - t0 < seconds - 0.1:
        last = await child.next(Heartbeat)
    elapsed, cpu = time.monotonic() - t0, child.cpu_seconds() - cpu
    count = last.written - first.written  # type: ignore[attr-defined]
    await child.stop()
    return count / elapsed, cpu / count


async def backpressure(
    seconds: float, feed_rate: float, out: Path
) -> tuple[list[tuple[float, int]], dict[str, int], int]:
    """RSS samples (t, KiB) of a child whose handler takes a tenth of the feed's rate."""
    out.mkdir(parents=True, exist_ok=True)
    handled = out / "handled.txt"
    env = child_env({"BENCH_HANDLER_RATE": str(feed_rate / 10), "BENCH_HANDLER_OUT": str(handled)})
    sink = SinkSpec(kind="handler", handler="bench_throughput:slow_handler", batch_max_records=100)
    samples: list[tuple[float, int]] = []
    with Feed(rate=feed_rate) as feed:
        child = await Child.spawn(env)
        await child.channel.send(start_message(feed.url, out, sink))
        await child.next(Ready)
        t0 = time.monotonic()

        async def drain_reports() -> None:
            while await child.channel.receive() is not None:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_reports)
            while True:
                elapsed = time.monotonic() - t0
                samples.append((elapsed, child.rss_kib()))
                if elapsed >= seconds:
                    break
                await trio.sleep(min(5.0, seconds - elapsed))
            nursery.cancel_scope.cancel()
        offered = int(feed_rate * (time.monotonic() - t0))
        stopped = await child.stop()
    seqs = [int(line.split()[1]) for line in handled.read_text().splitlines()]
    last = stopped.checkpoint.get("a", 0)
    missing = len(set(range(1, last + 1)) - set(seqs))
    counts = {"handled": len(seqs), "checkpoint": last, "offered": offered}
    return samples, counts, missing + len(seqs) - len(set(seqs))


async def main(args: argparse.Namespace) -> None:
    seconds = args.seconds
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        sinks = {"jsonl": SinkSpec(path=str(out / "{shard}" / "{stream}.{epoch}.jsonl"))}
        if not args.no_handler:
            sinks["no-op handler"] = SinkSpec(
                kind="handler", handler="bench_throughput:noop_handler"
            )
        runs: dict[str, list[float]] = {"bare": [], **{name: [] for name in sinks}}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        # Rounds of bare, then each child: drift of the machine hits every loop alike.
        for _ in range(args.rounds):
            with Feed() as feed:
                rate, per_message = await bare_loop(feed.url, seconds)
            runs["bare"].append(rate)
            cpu["bare"].append(per_message)
            for name, sink in sinks.items():
                with Feed() as feed:
                    rate, per_message = await child_rate(feed.url, sink, out, seconds)
                runs[name].append(rate)
                cpu[name].append(per_message)
        print(f"\nmachine: {os.cpu_count()} CPU, Python {platform.python_version()}")
        if not args.rounds:
            runs = {}
        print(
            f"messages of {PAYLOAD_BYTES} bytes; {args.rounds} rounds of {seconds:g} s per loop"
            " (bare, then each child, in turn); ratio: median over the rounds of the child's"
            " rate over the bare loop's of the same round; CPU: user+system µs per message\n"
        )
        print("| loop | messages/s (median) | ratio to bare | CPU µs/msg | runs (messages/s) |")
        print("|---|---:|---:|---:|---|")
        for name, rates in runs.items():
            label = "bare trio-websocket receive loop" if name == "bare" else f"child → {name}"
            ratio = statistics.median(r / b for r, b in zip(rates, runs["bare"], strict=True))
            shown = ", ".join(f"{rate:,.0f}" for rate in rates)
            per_message = statistics.median(cpu[name]) * 1e6
            print(
                f"| {label} | {statistics.median(rates):,.0f} | {ratio:.2f} |"
                f" {per_message:.1f} | {shown} |"
            )
        if args.rss_seconds:
            samples, counts, missing = await backpressure(
                args.rss_seconds, args.feed_rate, out / "bp"
            )
            print(
                f"\nbackpressure: feed {args.feed_rate:,.0f} msg/s, handler "
                f"{args.feed_rate / 10:,.0f} msg/s (sleeps), batches of 100\n"
            )
            print("| t (s) | VmRSS (MiB) |")
            print("|---:|---:|")
            for t, kib in samples:
                print(f"| {t:.0f} | {kib / 1024:.1f} |")
            print(
                f"\nhandled {counts['handled']:,} records ({counts['handled'] / t:,.0f}/s) while"
                f" the feed offered {counts['offered']:,}; final checkpoint"
                f" {counts['checkpoint']:,}; missing or repeated below it: {missing}"
            )
            if missing:
                sys.exit(1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="of bare, jsonl, handler")
    parser.add_argument("--rss-seconds", type=float, default=60.0, help="backpressure run")
    parser.add_argument("--feed-rate", type=float, default=20_000.0, help="backpressure feed")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 s, 15 s RSS run")
    parser.add_argument("--no-handler", action="store_true", help="jsonl only (no handler)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.rss_seconds = 2.0, 3, 15.0
    return args


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_feed":
        feed_args = argparse.ArgumentParser()
        feed_args.add_argument("port_file")
        feed_args.add_argument("--rate", type=float, default=0.0)
        parsed = feed_args.parse_args(sys.argv[2:])
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        trio.run(feed_main, parsed.port_file, parsed.rate)
    else:
        trio.run(main, parse_args())
