"""How a shard worker child exits: the codes the child returns and the supervisor reads.

One ``IntEnum`` both processes import: the child returns a member from ``run_worker``, the
supervisor's runner turns a code into a log description and a restart-reason metric label.
The values are a public contract (docs/pipe-protocol.md); never renumber them.
"""

from __future__ import annotations

import enum
import signal


class ChildExit(enum.IntEnum):
    """A child's exit code, with what it means and the restart reason it counts as."""

    OK = 0  # stopped when asked, or the parent went away (nothing to restart for)
    ERROR = 1  # an unexpected error (the traceback is in the child's log)
    PROTOCOL = 2  # the supervisor sent something the child cannot read
    FENCE = 3  # the fence deadline passed: the lease may belong to someone else now
    SINK = 4  # the sink failed for good (handler crash or delivery given up, on_failure=crash)
    SINK_SETUP = 5  # the sink could not be opened (handler import, settings, credentials)

    @property
    def description(self) -> str:
        """Words for the supervisor's "child exited with N (...)" line."""
        return _DESCRIPTIONS[self]

    @property
    def restart_reason(self) -> str:
        """The ``reason`` label of the restarts metric for a child that exited with this code."""
        return _RESTART_REASONS[self]


_DESCRIPTIONS = {
    # An exit 0 the runner did not ask for is, to the runner, a crash like any other.
    ChildExit.OK: "crash",
    ChildExit.ERROR: "error",
    ChildExit.PROTOCOL: "protocol error",
    ChildExit.FENCE: "fence deadline passed",
    ChildExit.SINK: "sink failed (handler crash or delivery given up)",
    ChildExit.SINK_SETUP: "sink could not be set up",
}

_RESTART_REASONS = {
    ChildExit.OK: "error",
    ChildExit.ERROR: "error",
    ChildExit.PROTOCOL: "protocol",
    ChildExit.FENCE: "fence",
    ChildExit.SINK: "sink",
    ChildExit.SINK_SETUP: "sink_setup",
}

# Labels for exits that are not one of our codes (see describe_exit / restart_reason).
UNKNOWN = "unknown"
CRASH = "crash"
SIGNAL = "signal"
ERROR = "error"


def describe_exit(code: int | None) -> str:
    """``code`` in words; a negative code is death by signal ``-code`` (as trio reports it)."""
    if code is None:
        return UNKNOWN
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    try:
        return ChildExit(code).description
    except ValueError:
        return CRASH


def restart_reason(code: int | None, known: str = "") -> str:
    """The restart metric's label: ``known`` (e.g. "hang", set by the runner) wins; then the
    code's own label; death by a signal is "signal"; anything else "error"."""
    if known:
        return known
    if code is not None and code < 0:
        return SIGNAL
    try:
        return ChildExit(code).restart_reason if code is not None else ERROR
    except ValueError:
        return ERROR


__all__ = ["ChildExit", "describe_exit", "restart_reason"]
