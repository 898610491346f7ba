"""Watching a peer on the local monotonic clock (protocol 2), on plain numbers.

The property tests play a victim that heartbeats with random latencies and then dies, against a
watcher whose eventually consistent reads may return any value already written (stale replicas),
and check the safety argument of docs/lease-protocol.md: a death is confirmed no earlier than
``duration`` after the send of the last heartbeat that landed, and soon after that.
"""

import random

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from supervisor.core.peer_watch import (
    PROBE_EVERY,
    RETRY_SPLIT,
    PeerClock,
    Seen,
    Standing,
    WatchBook,
    watch_poll,
)

D, H = 10.0, 2.0
STALE = 1.0  # how far behind an eventually consistent read may be, in the model


def seen(counter, session="s1", state="running"):
    return Seen(counter, session, state)


def test_a_peer_is_due_a_full_duration_after_we_first_saw_its_counter():
    clock = PeerClock(D, H)
    assert clock.standing(0.0) is Standing.UNSEEN
    clock.observe(seen(5), at=100.0)
    clock.observe(seen(5), at=108.0)  # unchanged: the clock keeps running
    assert clock.standing(109.9) is Standing.ALIVE
    assert clock.standing(110.0) is Standing.DUE


def test_the_next_read_follows_the_heartbeat_then_polls_until_a_change():
    clock = PeerClock(D, H)
    clock.observe(seen(5), at=100.0)
    assert clock.next_read_at == 100.0 + watch_poll(H) == 100.25  # its rhythm: not known yet
    clock.observe(seen(5), at=101.9)
    assert clock.next_read_at == 101.9 + watch_poll(H) == 102.15
    clock.observe(seen(6), at=102.15)  # it landed within (101.9, 102.15]: in rhythm now
    # The next lands a heartbeat later, about midway: looked for a hair after that (and a
    # quarter poll later if it has not shown).
    assert clock.changed_at == 102.15
    assert clock.next_read_at == pytest.approx((101.9 + 102.15) / 2 + H + watch_poll(H) / 25)
    # From here heartbeats land every H from 102.05; a read shows the last one landed.
    reads, lags = 0, []
    for counter in range(7, 7 + 4 * PROBE_EVERY):
        landing = 102.05 + (counter - 6) * H
        at = clock.next_read_at
        reads += 1
        while at < landing:  # looked early: not there yet, poll
            clock.observe(seen(counter - 1), at=at)
            at = clock.next_read_at
            reads += 1
        clock.observe(seen(counter), at=at)
        lags.append(at - landing)
    # One read a heartbeat, and one more about every PROBE_EVERY-th; each within a poll.
    assert reads <= 4 * (PROBE_EVERY + 1) + 1
    assert max(lags) <= watch_poll(H)
    late = PeerClock(D, H)
    late.observe(seen(1), at=0.0)
    late.observe(seen(1), at=0.25)
    assert late.next_read_at == 0.5


def test_a_lag_grown_by_late_heartbeats_shrinks_back_within_a_poll():
    """Counter 3 lands a second late and we lock onto its rhythm; from 4 on the heartbeats
    land on their old rhythm again, a second before we look. The probes find it out."""
    clock = PeerClock(D, H)
    clock.observe(seen(1), at=0.0)
    clock.observe(seen(2), at=0.2)  # found by polling: in rhythm, landing about 0.2
    lags = []
    for counter in range(3, 3 + 4 * PROBE_EVERY):
        landing = 0.2 + (counter - 2) * H + (1.0 if counter == 3 else 0.0)
        at = clock.next_read_at
        while at < landing:
            clock.observe(seen(counter - 1), at=at)
            at = clock.next_read_at
        clock.observe(seen(counter), at=at)
        lags.append(round(at - landing, 3))
    assert max(lags[1:]) > 0.85  # in the late rhythm for a while
    assert max(lags[-PROBE_EVERY:]) <= watch_poll(H)  # then back within a poll


def test_a_stale_replica_neither_resets_the_clock_nor_raises_a_death():
    clock = PeerClock(D, H)
    clock.observe(seen(7), at=100.0)
    clock.observe(seen(6), at=105.0)  # an older replica: counters only rise
    assert clock.seen == seen(7) and clock.changed_at == 100.0


def test_only_a_strongly_consistent_read_showing_the_same_counter_confirms_a_death():
    clock = PeerClock(D, H)
    clock.observe(seen(5), at=100.0)
    assert not clock.confirm(seen(6), at=110.0)  # a heartbeat landed: alive, clock restarts
    assert clock.changed_at == 110.0 and clock.standing(119.0) is Standing.ALIVE
    assert not clock.confirm(seen(6), at=119.0)  # too early: never before the due time
    assert clock.confirm(seen(6), at=120.0)


def test_a_new_session_is_a_new_incarnation_and_gone_states_need_no_notice():
    clock = PeerClock(D, H)
    clock.observe(seen(9), at=100.0)
    assert not clock.confirm(seen(9, session="s2"), at=110.0)
    assert clock.changed_at == 110.0
    clock.observe(seen(9, session="s2", state="stopped"), at=111.0)
    assert clock.standing(111.0) is Standing.GONE
    assert not clock.confirm(seen(9, session="s2", state="stopped"), at=125.0)


def test_a_failed_read_retries_a_poll_later_without_resetting_the_clock():
    clock = PeerClock(D, H)
    clock.observe(seen(1), at=0.0)
    clock.read_failed(at=10.0)
    assert clock.next_read_at == 10.25 and clock.changed_at == 0.0


def test_the_book_follows_the_ring_and_wakes_at_the_earliest_read_or_due_time():
    book = WatchBook(D, H)
    book.watch(["a", "b"])
    assert book.to_read(0.0) == ("a", "b")
    book.clocks["a"].observe(seen(1), at=0.0)
    book.clocks["b"].observe(seen(1), at=1.0)
    assert book.next_wake(1.0) == 1.0  # a's first poll (at 0.25) is late already
    assert book.next_read(0.1) == 0.25
    book.clocks["a"].observe(seen(2), at=1.0)  # in rhythm: its next about 3.0
    assert book.next_read(1.0) == 1.25  # b polls until its rhythm is known
    book.watch(["b", "c"])  # the ring moved: b keeps its clock, c starts unseen
    assert book.clocks["b"].changed_at == 1.0 and book.to_read(1.0) == ("c",)
    book.clocks["c"].observe(seen(1, state="stopped"), at=1.0)
    book.clocks["b"].observe(seen(1), at=10.9)
    assert book.gone(2.0) == ("c",) and book.next_wake(10.9) == 11.0
    assert book.to_confirm(11.0) == ("b",)


@st.composite
def victims(draw):
    """A victim's writes as (sent, landed): its registration (counter 0, long landed), then a
    heartbeat every ``H`` with a random latency (counter i), then death."""
    count = draw(st.integers(1, 12))
    latencies = draw(st.lists(st.floats(0.0, 1.5), min_size=count, max_size=count))
    start = draw(st.floats(0.0, 5.0))
    beats = [(start + i * H, start + i * H + lat) for i, lat in enumerate(latencies)]
    return [(-1.0, -1.0), *beats]


@settings(max_examples=150, deadline=None)
@given(victims(), st.randoms(use_true_random=False))
def test_a_death_is_confirmed_after_the_last_landed_heartbeat_plus_duration_and_not_much_later(
    writes, rng
):
    clock = PeerClock(D, H)
    now, declared = 0.0, None
    while declared is None and now < 200.0:
        now = max(now, min(clock.next_read_at, clock.due_at())) + rng.uniform(0.0, 0.02)
        latest = max(i for i, (_, landed) in enumerate(writes) if landed <= now)
        if clock.standing(now) is Standing.DUE:
            if clock.confirm(seen(latest), at=now):
                declared = (now, latest)
        else:  # an eventually consistent read: a replica up to STALE seconds behind
            behind = now - rng.uniform(0.0, STALE)
            clock.observe(seen(max(i for i, (_, w) in enumerate(writes) if w <= behind)), at=now)
    assert declared is not None
    at, counter = declared
    sent, landed = writes[counter]
    assert counter == len(writes) - 1  # never while a later heartbeat had landed
    assert at >= sent + D  # the safety argument: after the victim's validity ended
    # Detection at the lease: the last landing, the duration, and the read lag (a replica's
    # staleness, one heartbeat when the last one landed late, a poll, the loop's jitter).
    assert at <= landed + D + STALE + H + 2 * watch_poll(H)


def test_a_consistent_read_that_finds_a_due_peer_moved_starts_its_clock_over():
    """Stale replicas can leave a live peer due; the round's strongly consistent read then
    shows it moved: its clock starts over unseen (read at once), not left due for good."""
    book = WatchBook(D, H)
    book.watch(["a"])
    book.clocks["a"].observe(seen(4), at=0.0)
    assert not book.confirmed("a", seen(9), at=5.0)  # not due: the reads follow it anyway
    assert book.clocks["a"].standing(D) is Standing.DUE
    assert not book.confirmed("a", seen(4), at=D)  # still: a death, the round's to declare
    assert book.confirmed("a", seen(9), at=D)
    assert book.clocks["a"].standing(D) is Standing.UNSEEN and book.to_read(D) == ("a",)
    assert not book.confirmed("b", seen(1), at=D)  # not watched


def test_heartbeats_landing_a_little_late_are_seen_within_a_quarter_poll_at_the_same_reads():
    """Write latencies vary: a heartbeat lands 0 to 50 ms after its rhythm. A read that misses a
    heartbeat just due looks again a quarter poll later, and a change found by polling puts
    the rhythm where it lies, not where the poll happened to be: the lag stays in tens of
    ms (it was about 140 ms: the rhythm stuck where a poll had found it), and a heartbeat
    still costs 1 + 1/PROBE_EVERY reads."""
    rng = random.Random(7)
    clock = PeerClock(D, H)
    clock.observe(seen(1), at=0.0)
    lags, reads = [], 0
    for counter in range(2, 300):
        landing = 0.1 + (counter - 1) * H + rng.uniform(0.0, 0.05)
        at = clock.next_read_at
        reads += 1
        while at < landing:
            clock.observe(seen(counter - 1), at=at)
            at = clock.next_read_at
            reads += 1
        clock.observe(seen(counter), at=at)
        lags.append(at - landing)
    settled = sorted(lags[20:])
    assert sum(settled) / len(settled) <= watch_poll(H) / RETRY_SPLIT
    assert settled[int(0.99 * len(settled))] <= watch_poll(H) / 2
    assert reads / len(lags) <= 1 + 1 / PROBE_EVERY + 0.05
