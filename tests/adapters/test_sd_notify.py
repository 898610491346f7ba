"""systemd's notify protocol: the unit's socket is a datagram socket the test creates."""

from __future__ import annotations

import os
import signal
import socket

import pytest
import trio
from helpers.fleet import SHARDS, STREAMS

from supervisor.adapters.sd_notify import Notifier


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield sock, path
    sock.close()


def parse(data: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in data.decode().splitlines())


async def collect(sock: socket.socket, into: list[dict[str, str]]) -> None:
    """Read like systemd does: continuously."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        into.append(parse(sock.recv(4096)))


def test_nothing_happens_without_notify_socket():
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval is None
    notifier.notify(ready=1)  # no error, no socket


def test_watchdog_interval_is_half_of_watchdog_usec_for_our_pid():
    assert Notifier({"WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0
    env = {"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(env).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}).watchdog_interval is None


def test_abstract_socket_address():
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"shardvisor-test-{os.getpid()}"
    server.bind("\0" + name)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        notifier.notify(status="hello")
        assert server.recv(100) == b"STATUS=hello"
        notifier.close()
    finally:
        server.close()


def test_a_full_receiver_never_blocks_the_sender(notify_socket, caplog):
    _sock, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    for _ in range(1000):  # far more than the kernel queues for an unread datagram socket
        notifier.notify(watchdog=1)
    assert any("sd_notify" in r.getMessage() for r in caplog.records)
    notifier.close()


def test_an_unreachable_socket_is_logged_not_raised(tmp_path, caplog):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    notifier.notify(ready=1)
    notifier.notify(ready=1)
    assert sum("sd_notify" in r.getMessage() for r in caplog.records) == 1
    notifier.close()


async def test_a_supervisor_under_systemd_reports_ready_status_watchdog_and_stopping(
    fleet,
    notify_socket,
):
    sock, path = notify_socket
    messages: list[dict[str, str]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, sock, messages)
        await run_one_supervisor(fleet, path)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    keys = [k for m in messages for k in m]
    assert keys.index("READY") < keys.index("STOPPING")
    assert keys.count("WATCHDOG") >= 3  # every 250 ms while healthy
    statuses = [m["STATUS"] for m in messages if "STATUS" in m]
    assert any(f"{len(SHARDS)} shards" in s for s in statuses)
    assert any("EXTEND_TIMEOUT_USEC" in m for m in messages)


async def run_one_supervisor(fleet, path: str) -> None:
    with trio.fail_after(30):
        await fleet.start("w1", env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "500000"})
        await fleet.wait_until_owned(by=["w1"], timeout=10)
        for stream in STREAMS:
            await fleet.wait_written(stream, 1, timeout=10)
        await trio.sleep(1.0)
        fleet.kill("w1", signal.SIGTERM)
        assert await fleet.procs["w1"].wait() == 0
