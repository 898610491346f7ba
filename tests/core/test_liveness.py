"""The keepalive and staleness decisions of one stream, on a clock we move by hand."""

from __future__ import annotations

import math

import pytest

from shard_worker.contract.pipe import StreamSpec, WorkerSettings
from shard_worker.core.liveness import Due, Keepalive, LivenessSettings, Staleness


def test_a_stream_takes_its_own_values_else_the_workers() -> None:
    settings = WorkerSettings(ping_interval=20, ping_timeout=10, idle_timeout=0, compression="none")
    spec = StreamSpec(id="a", url="ws://h/", idle_timeout=5.0, ping_interval=0.0)
    assert LivenessSettings.of(spec, settings) == LivenessSettings(0.0, 10, 5.0, "none")
    own = StreamSpec(id="b", url="ws://h/", compression="deflate")
    assert LivenessSettings.of(own, settings).compression == "deflate"
    assert LivenessSettings.of(StreamSpec(id="c", url="ws://h/"), WorkerSettings()) == (
        LivenessSettings(20.0, 20.0, 0.0, "deflate")
    )


def test_silence_brings_a_ping_then_a_timeout() -> None:
    keepalive = Keepalive(LivenessSettings(ping_interval=2, ping_timeout=3), now=100)
    assert keepalive.deadline() == 102
    assert keepalive.due(101.9) is None
    assert keepalive.due(102) is Due.PING
    keepalive.pinged(102)
    assert keepalive.deadline() == 105
    assert keepalive.due(104.9) is None
    assert keepalive.due(105) is Due.PING_TIMEOUT


def test_any_frame_after_the_ping_answers_it() -> None:
    keepalive = Keepalive(LivenessSettings(ping_interval=2, ping_timeout=3), now=100)
    keepalive.pinged(102)
    keepalive.received(101.5, messages=False)  # before the ping: not an answer
    assert keepalive.due(105) is Due.PING_TIMEOUT
    keepalive.received(103, messages=False)  # the pong
    assert keepalive.ping_sent is None
    assert keepalive.deadline() == 105  # the next ping, 2 s after the pong
    assert keepalive.due(104) is None


def test_messages_hold_off_pings_and_the_idle_timeout() -> None:
    keepalive = Keepalive(LivenessSettings(ping_interval=2, ping_timeout=3, idle_timeout=5), 0)
    for t in (1, 2, 3, 4):
        keepalive.received(t, messages=True)
        assert keepalive.due(t + 1.5) is None
    assert keepalive.deadline() == 6  # the ping after 2 s of silence
    keepalive.received(7, messages=False)  # pongs keep the connection alive...
    assert keepalive.deadline() == 9  # ...but not the subscription: idle at 4 + 5
    assert keepalive.due(9) is Due.IDLE


def test_with_every_timer_off_nothing_is_ever_due() -> None:
    keepalive = Keepalive(LivenessSettings(ping_interval=0, ping_timeout=0, idle_timeout=0), 0)
    assert keepalive.deadline() == math.inf
    assert keepalive.due(1e9) is None


@pytest.mark.parametrize(
    ("settings", "stale_after"),
    [
        (LivenessSettings(ping_interval=20, ping_timeout=10, idle_timeout=5), 5),
        (LivenessSettings(ping_interval=20, ping_timeout=10, idle_timeout=0), 30),
        (LivenessSettings(ping_interval=0, ping_timeout=10, idle_timeout=0), 0),
    ],
)
def test_stale_after_is_the_idle_timeout_else_a_pings_round(
    settings: LivenessSettings, stale_after: float
) -> None:
    assert settings.stale_after == stale_after


def test_with_an_idle_timeout_silence_is_stale_until_a_message_comes() -> None:
    staleness = Staleness(stale_after=5, now=0)
    staleness.connected()
    assert not staleness.stale(5, idle_timeout=5)
    assert staleness.stale(5.1, idle_timeout=5)
    staleness.disconnected(6)  # the idle reconnect...
    staleness.connected()  # ...connects again: still silent, still stale
    assert staleness.stale(8, idle_timeout=5)
    staleness.delivered(9)
    assert not staleness.stale(9, idle_timeout=5)


def test_without_an_idle_timeout_only_a_connection_down_too_long_is_stale() -> None:
    staleness = Staleness(stale_after=30, now=0)
    staleness.connected()
    assert not staleness.stale(1000, idle_timeout=0)  # quiet, but alive
    staleness.disconnected(1000)
    staleness.disconnected(1010)  # (a failed connect: down since the first)
    assert not staleness.stale(1030, idle_timeout=0)
    assert staleness.stale(1030.5, idle_timeout=0)
    staleness.connected()
    assert not staleness.stale(1031, idle_timeout=0)
    assert not Staleness(stale_after=0, now=0).stale(1e9, idle_timeout=0)  # no timer: never
