"""The pieces both processes share, pinned once: the child's exit codes, the redaction, the
full-jitter formula."""

from __future__ import annotations

import random
import signal

import pytest

from shard_worker.contract.exit_codes import ChildExit, describe_exit, restart_reason
from shard_worker.core.backoff import Backoff, full_jitter, jitter_cap
from shard_worker.core.redact import REDACTED, merge_secrets, redact, scrub
from supervisor.core.restart_policy import RestartPolicy


@pytest.mark.parametrize(
    ("code", "value", "description", "reason"),
    [
        (ChildExit.OK, 0, "crash", "error"),  # an exit 0 nobody asked for is a crash
        (ChildExit.ERROR, 1, "error", "error"),
        (ChildExit.PROTOCOL, 2, "protocol error", "protocol"),
        (ChildExit.FENCE, 3, "fence deadline passed", "fence"),
        (ChildExit.SINK, 4, "sink failed (handler crash or delivery given up)", "sink"),
        (ChildExit.SINK_SETUP, 5, "sink could not be set up", "sink_setup"),
    ],
)
def test_each_exit_code_its_value_words_and_restart_label(code, value, description, reason):
    assert int(code) == value
    assert (describe_exit(value), restart_reason(value)) == (description, reason)
    assert (code.description, code.restart_reason) == (description, reason)


def test_exits_that_are_not_our_codes():
    assert describe_exit(None) == "unknown"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(77) == "crash"
    assert restart_reason(-signal.SIGKILL) == "signal"
    assert restart_reason(77) == "error"
    assert restart_reason(None) == "error"
    assert restart_reason(3, known="hang") == "hang"  # the runner knows better


def test_secrets_merge_longest_first_without_empties():
    assert merge_secrets(["abc", ""], ["Bearer abc", "xyz", "abc"]) == ("Bearer abc", "abc", "xyz")


def test_redact_leaves_no_part_of_a_longer_secret():
    secrets = merge_secrets(["abc", "Bearer abc"])
    assert redact("auth: Bearer abc; key abc.", secrets) == f"auth: {REDACTED}; key {REDACTED}."
    assert redact("nothing here", secrets) == "nothing here"


class Shown:
    def __str__(self) -> str:
        return "obj s3cret"


def test_scrub_reaches_keys_and_nested_values():
    value = {"s3cret": ["a s3cret", ("s3cret",), 1, None, True, 2.5], "k": Shown()}
    assert scrub(value, ("s3cret",)) == {
        "***": ["a ***", ["***"], 1, None, True, 2.5],
        "k": "obj ***",
    }


def test_the_cap_doubles_from_initial_to_maximum():
    assert [jitter_cap(0.1, 1.0, n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert jitter_cap(0.1, 1.0, 100_000) == 1.0  # a reader reconnecting for days: no overflow
    assert full_jitter(0.1, 1.0, 2, lambda: 0.5) == 0.2


def test_the_child_and_the_supervisor_draw_the_same_delays():
    """``Backoff`` (reconnects, sink retries) and ``RestartPolicy`` (after the free first
    restart) are one formula: the same seeded draws give the same delays."""
    backoff = Backoff(0.1, 30.0, rng=random.Random(7))
    draws = random.Random(7)
    policy = RestartPolicy(0.1, 30.0, 60.0, max_restarts=100, rng=draws.random)
    policy.child_started(0.0)
    assert policy.child_crashed(0.0).delay == 0.0
    for n in range(10):
        policy.child_started(float(n))
        assert policy.child_crashed(float(n)).delay == backoff.next_delay()


def test_backoff_reset_starts_over_and_matches_uniform():
    rng, twin = random.Random(3), random.Random(3)
    backoff = Backoff(0.5, 4.0, rng=rng)
    assert [backoff.next_delay() for _ in range(3)] == [twin.uniform(0, c) for c in (0.5, 1, 2)]
    backoff.reset()
    assert backoff.next_delay() == twin.uniform(0, 0.5)
