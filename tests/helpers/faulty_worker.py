"""A shard worker that misbehaves on purpose, for supervision tests (``worker_command``).

    python tests/helpers/faulty_worker.py MODE --control-fd R --report-fd W

It runs the real worker with one fault patched in:
- ``hang``: once ready, blocks its own event loop with a busy loop (CPU-bound code);
- ``ignore-term``: ignores SIGTERM and every stop message;
- ``crash``: exits 1 shortly after ready;
- ``standby-never-ready``: a standby child connects and buffers but never says standby_ready
  (an owner child is unaffected);
- ``ok``: no fault (a control).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import trio

import shard_worker.drivers.owner as owner
import shard_worker.drivers.standby as standby
from shard_worker.__main__ import main
from shard_worker.contract.pipe import Fence

real_checkpoint_loop = owner._checkpoint_loop
real_serve_control = owner._serve_control


async def busy_after_a_while(*args):
    await trio.sleep(0.5)
    while True:  # never yields: no heartbeat, no checkpoint, nothing
        time.sleep(0.001)


async def crash_after_a_while(*args):
    await trio.sleep(0.2)
    os._exit(1)


async def never_ready(*args):
    await trio.sleep_forever()


async def ignore_stop(channel, recorder):
    while True:
        message = await channel.receive()
        if message is None:
            await trio.sleep_forever()  # not even EOF makes it leave
        if isinstance(message, Fence):
            recorder.fence_deadline = message.deadline


if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if mode == "hang":
        owner._checkpoint_loop = busy_after_a_while
    elif mode == "crash":
        owner._checkpoint_loop = crash_after_a_while
    elif mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        owner._serve_control = ignore_stop
    elif mode == "standby-never-ready":
        standby.Standby._announce_ready = never_ready
    elif mode != "ok":
        sys.exit(f"unknown mode {mode!r}")
    sys.exit(main())
