"""A stdout sink's children: their stdout lines reach the supervisor's stdout verbatim, whole
lines only, one child's run of lines at a time; a torn last line is dropped (and logged)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import trio
import trio.testing

from supervisor.adapters import spawn as child_process
from supervisor.adapters.spawn import StdoutRelay, pump_output


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch):
    read_fd, write_fd = os.pipe()
    relay = StdoutRelay(fd=write_fd)
    relay.enabled = True
    monkeypatch.setattr(child_process, "STDOUT_RELAY", relay)
    yield read_fd
    os.close(write_fd)
    os.close(read_fd)


async def test_lines_of_two_children_never_interleave(relay: int, caplog) -> None:
    caplog.set_level(logging.INFO, logger="shardvisor.child")
    out = bytearray()

    async def read_all() -> None:
        while True:
            data = await trio.to_thread.run_sync(os.read, relay, 65536, abandon_on_cancel=True)
            if not data:
                return
            out.extend(data)

    async def child(name: str, send: trio.abc.SendStream) -> None:
        lines = b"".join(
            b'{"child":"%s","n":%d,"pad":"%s"}\n' % (name.encode(), n, b"x" * (n % 300))
            for n in range(2000)
        )
        for start in range(0, len(lines), 777):  # chunks that cut lines anywhere
            await send.send_all(lines[start : start + 777])
            await trio.sleep(0)
        await send.send_all(b'{"child":"%s","torn":' % name.encode())  # no newline: torn
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        async with trio.open_nursery() as children:
            for name in ("a", "b"):
                send, receive = trio.testing.memory_stream_one_way_pair()
                children.start_soon(pump_output, f"shard-{name}", 1, "stdout", receive)
                children.start_soon(child, name, send)
        with trio.fail_after(5):
            while out.count(b"\n") < 4000:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    lines = out.decode().split("\n")
    assert lines[-1] == ""  # ends with a whole line
    records = [json.loads(line) for line in lines[:-1]]  # every line whole JSON
    for name in ("a", "b"):
        assert [r["n"] for r in records if r["child"] == name] == list(range(2000))
    assert b"torn" not in out
    assert "torn record line of an exiting child dropped" in caplog.text


async def test_stderr_and_a_disabled_relay_are_logged(relay: int, caplog) -> None:
    caplog.set_level(logging.INFO, logger="shardvisor.child")
    child_process.STDOUT_RELAY.enabled = False
    send, receive = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_output, "s1", 7, "stdout", receive)
        await send.send_all(b"a stray print\n")
        await send.aclose()
    assert "a stray print" in caplog.text
