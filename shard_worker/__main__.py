"""``python -m shard_worker --control-fd R --report-fd W``: the child process of the supervisor."""

from __future__ import annotations

import argparse
import signal
import sys

import trio

from shard_worker.adapters.log import Log
from shard_worker.adapters.pipes import MessageChannel
from shard_worker.drivers.worker import run_worker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shard_worker", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True, help="pipe to read commands from")
    parser.add_argument("--report-fd", type=int, required=True, help="pipe to write reports to")
    return parser.parse_args(argv)


async def _main(control_fd: int, report_fd: int) -> int:
    channel = MessageChannel(trio.lowlevel.FdStream(control_fd), trio.lowlevel.FdStream(report_fd))
    try:
        return await run_worker(channel, Log())
    finally:
        await channel.aclose()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group; the supervisor owns shutdown
    # and stops us in order (flush, final checkpoint), so the child ignores SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return trio.run(_main, args.control_fd, args.report_fd)


if __name__ == "__main__":
    sys.exit(main())
