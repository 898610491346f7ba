"""Row 4's peer: a bare ``websockets`` (asyncio) client loop, as a user would write it (defaults).

    python -m benchmarks.peers.ws_client URL SECONDS

Runs under the peers' virtualenv (out/bench/venv-supervisord, which holds websockets), on the
CPU that BENCH_PIN_CPU names. One second of warm-up, then messages counted for SECONDS; prints
``{"messages", "seconds", "cpu"}`` as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from websockets.asyncio.client import connect


async def count(url: str, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    async with connect(url) as ws:
        warm_until = loop.time() + 1.0
        messages, start, cpu = 0, 0.0, 0.0
        async for _message in ws:
            if start == 0.0:
                if loop.time() < warm_until:
                    continue
                start, cpu = loop.time(), time.process_time()
            messages += 1
            if not messages & 255 and loop.time() >= start + seconds:
                break
        elapsed, cpu = loop.time() - start, time.process_time() - cpu
        print(json.dumps({"messages": messages, "seconds": elapsed, "cpu": cpu}), flush=True)
        os._exit(0)  # no close handshake: the feed does not answer it


def main() -> None:
    cpu = os.environ.get("BENCH_PIN_CPU", "")
    if cpu.isdigit() and int(cpu) < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(cpu)})
    asyncio.run(count(sys.argv[1], float(sys.argv[2])))


if __name__ == "__main__":
    main()
