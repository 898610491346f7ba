"""Warm spawns through the zygote: real processes, real pipes, real signals."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from helpers.waiting import wait_until
from helpers.worker_helpers import make_start, stop_in

from shard_worker.contract.pipe import Hello, Message, Ready, Stopped, StreamSpec
from supervisor.adapters import zygote_client
from supervisor.adapters.spawn import ChildHandle, ChildProcess, pump_output
from supervisor.adapters.zygote_client import ZygoteChild, ZygoteSpawner

pytestmark = pytest.mark.slow


@asynccontextmanager
async def running(spawner: ZygoteSpawner) -> AsyncIterator[trio.Nursery]:
    """The spawner's ``run`` in a nursery (as in ``shardvisor run``), cancelled on exit."""
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            await nursery.start(spawner.run)
        yield nursery
        nursery.cancel_scope.cancel()


async def spawn(
    spawner: ZygoteSpawner, nursery: trio.Nursery, shard: str = "s1"
) -> tuple[ChildHandle, Hello]:
    """Spawn, pump its output into the log (as a runner does), and take its Hello."""
    child, outputs = await spawner.spawn(shard)
    for name, stream in outputs:
        nursery.start_soon(pump_output, shard, child.pid, name, stream)
    with trio.fail_after(5):
        hello = await child.receive()
    assert isinstance(hello, Hello), hello
    assert hello.pid == child.pid
    return child, hello


async def receive_until(child: ChildHandle, kind: type[Message]) -> Message:
    """Skip reports (heartbeats, checkpoints) until a ``kind``."""
    with trio.fail_after(5):
        while True:
            msg = await child.receive()
            assert msg is not None, f"report pipe closed before {kind.__name__}"
            if isinstance(msg, kind):
                return msg


async def stop(child: ChildHandle) -> int:
    await child.send(stop_in(3))
    await receive_until(child, Stopped)
    with trio.fail_after(3):
        return await child.wait()


def refused_url() -> tuple[socket.socket, str]:
    """A bound port with nothing listening: connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"ws://127.0.0.1:{sock.getsockname()[1]}/feed"


async def test_a_warm_child_speaks_the_protocol_and_its_output_reaches_the_pumps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shardvisor.child")
    spawner = ZygoteSpawner()
    closed_port, url = refused_url()
    with closed_port:
        async with running(spawner) as nursery:
            child, _hello = await spawn(spawner, nursery)
            assert isinstance(child, ZygoteChild)
            assert child.returncode is None
            # fds 1 and 2 of the child are the pipes whose read ends the pumps read.
            stdout_inode = os.readlink(f"/proc/{child.pid}/fd/1")
            assert stdout_inode.startswith("pipe:")
            start = make_start([StreamSpec(id="a", url=url, sequence="seq")], tmp_path)
            await child.send(start)
            await receive_until(child, Ready)
            assert await stop(child) == 0
            assert child.returncode == 0
            await child.aclose()
            await child.aclose()  # idempotent
            await wait_until(lambda: "stopped (test)" in caplog.text)
    assert any(r.name == "shardvisor.child" and r.shard == "s1" for r in caplog.records)


async def test_sigkill_of_a_warm_child_is_seen_at_once() -> None:
    spawner = ZygoteSpawner()
    async with running(spawner) as nursery:
        child, _hello = await spawn(spawner, nursery)
        killed = time.monotonic()
        child.signal(signal.SIGKILL)
        with trio.fail_after(zygote_client.EXIT_NOTICE_TIMEOUT + 5):
            assert await child.wait() == -9
        # By events (the pidfd, then the zygote's notice), not by the notice's timeout.
        assert time.monotonic() - killed < zygote_client.EXIT_NOTICE_TIMEOUT
        assert child.returncode == -9
        child.signal(signal.SIGTERM)  # after death: a no-op, never another process
        await child.aclose()


async def test_concurrent_spawns_each_get_their_own_child() -> None:
    spawner = ZygoteSpawner()
    async with running(spawner) as nursery:
        children: list[ChildHandle] = []

        async def one(shard: str) -> None:
            child, _hello = await spawn(spawner, nursery, shard)
            children.append(child)

        with trio.fail_after(10):
            async with trio.open_nursery() as spawns:
                for i in range(6):
                    spawns.start_soon(one, f"s{i}")
        assert len({c.pid for c in children}) == 6
        assert all(isinstance(c, ZygoteChild) for c in children)
        for child in children:
            assert await stop(child) == 0
            await child.aclose()


async def test_zygote_death_degrades_to_fresh_spawns_then_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shardvisor.zygote")
    spawner = ZygoteSpawner()
    async with running(spawner) as nursery:
        orphan, _hello = await spawn(spawner, nursery, "orphan")
        first = spawner.zygote_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # our unreaped child: the pid cannot be reused yet
        await wait_until(lambda: not spawner.available)

        fresh, _hello = await spawn(spawner, nursery)
        assert isinstance(fresh, ChildProcess)
        assert "zygote unavailable: spawning fresh (degraded)" in caplog.text
        assert await stop(fresh) == 0
        await fresh.aclose()

        # The children of the dead zygote keep running: they talk to us, not to it.
        assert await stop(orphan) in (0, -1)  # -1: its reaper (init) did not tell us
        await orphan.aclose()

        await wait_until(lambda: spawner.available, timeout=8)
        assert spawner.zygote_pid not in (None, first)
        warm, _hello = await spawn(spawner, nursery)
        assert isinstance(warm, ZygoteChild)
        assert "recovered" in caplog.text
        assert caplog.text.count("spawning fresh (degraded)") == 1
        await warm.aclose()


async def test_a_zygote_that_does_not_answer_is_replaced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(zygote_client, "SPAWN_TIMEOUT", 0.3)
    spawner = ZygoteSpawner()
    async with running(spawner) as nursery:
        hung = spawner.zygote_pid
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        child, _hello = await spawn(spawner, nursery)
        assert isinstance(child, ChildProcess)
        assert "gave no answer" in caplog.text
        await child.aclose()
        await wait_until(lambda: spawner.available and spawner.zygote_pid != hung, timeout=8)
        assert not Path(f"/proc/{hung}").exists(), "the hung zygote was killed and reaped"


async def test_cancelling_run_stops_and_reaps_the_zygote(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="shardvisor.zygote")
    spawner = ZygoteSpawner()
    async with running(spawner):
        pid = spawner.zygote_pid
        assert pid is not None and Path(f"/proc/{pid}").exists()
        cancelled = time.monotonic()
    assert time.monotonic() - cancelled < zygote_client.STOP_TIMEOUT  # gone at EOF, not killed
    assert not Path(f"/proc/{pid}").exists(), "the zygote is gone and reaped (no zombie)"
    reaped = [r for r in caplog.records if r.getMessage() == "zygote reaped"]
    assert [(r.pid, r.code) for r in reaped] == [(pid, 0)]  # exited at EOF, not killed


async def test_the_zygote_imports_no_supervisor_code() -> None:
    code = (
        "import json, sys\n"
        "from shard_worker import zygote\n"
        "zygote.warm_up()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = await trio.run_process([sys.executable, "-c", code], capture_stdout=True)
    modules = json.loads(result.stdout)
    assert "shard_worker.drivers.worker" in modules and "trio_websocket" in modules
    forbidden = [m for m in modules if m.split(".")[0] in ("boto3", "botocore", "supervisor")]
    assert forbidden == []


async def test_a_warm_child_imports_nothing_after_the_fork() -> None:
    """Each module a child imports after the fork costs every start its import time and every
    child a private copy: the default transport once did (warm restarts 20 -> 45 ms)."""
    code = (
        "import json, sys\n"
        "from shard_worker import zygote\n"
        "zygote.warm_up()\n"
        "before = set(sys.modules)\n"
        "from shard_worker.adapters.transports import TRANSPORTS, open_transport\n"
        "for kind in TRANSPORTS:\n"
        "    open_transport(kind, max_message_size=1 << 20, connect_timeout=1.0,"
        " compression=True)\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    result = await trio.run_process([sys.executable, "-c", code], capture_stdout=True)
    assert json.loads(result.stdout) == []
