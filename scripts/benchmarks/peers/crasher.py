"""The program supervisord restarts in row 3: it starts like a shard worker, runs, and crashes.

    python -m benchmarks.peers.crasher STAMPS RUN_FOR

Stamps the time as its first statement, imports trio and trio-websocket (what a shard worker
starts with), prints its first line, appends both stamps to STAMPS, runs RUN_FOR seconds, stamps
the crash and ``os._exit(1)``s.
"""

import time

T_EXEC = time.time()  # the first statement

import os  # noqa: E402 - after the first stamp, on purpose
import sys  # noqa: E402

import trio  # noqa: E402, F401 - what a shard worker starts with
import trio_websocket  # noqa: E402, F401


def main() -> None:
    t_ready = time.time()
    print("started", flush=True)  # its first output
    stamps, run_for = sys.argv[1], float(sys.argv[2])
    with open(stamps, "a") as fh:
        fh.write(f"start {os.getpid()} {T_EXEC!r} {t_ready!r}\n")
    time.sleep(run_for)
    with open(stamps, "a") as fh:
        fh.write(f"crash {os.getpid()} {time.time()!r}\n")
    os._exit(1)


if __name__ == "__main__":
    main()
