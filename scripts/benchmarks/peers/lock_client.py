"""python-dynamodb-lock's side of row 1, run under its own virtualenv (venv-dynamodb-lock).

    python -m benchmarks.peers.lock_client holder ENDPOINT KEY LEASE HEARTBEAT
    python -m benchmarks.peers.lock_client waiter ENDPOINT LEASE HEARTBEAT

A holder acquires KEY, says so (a JSON line) and heartbeats until it is killed. The waiter reads
keys on stdin and, for each, waits in a thread with ``acquire_lock`` (retry period = heartbeat,
the library's default), saying when it starts waiting and when it took the lock. The table is
named by BENCH_LOCK_TABLE. Only the standard library, boto3 and the peer are imported.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time
from typing import Any


def lock_client(endpoint: str, lease: float, heartbeat: float) -> Any:
    """A DynamoDBLockClient with shardvisor's timers."""
    import boto3
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    logging.getLogger("python_dynamodb_lock").setLevel(logging.ERROR)  # "lease has expired"
    resource = boto3.resource("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    return DynamoDBLockClient(
        resource,
        table_name=os.environ["BENCH_LOCK_TABLE"],
        heartbeat_period=datetime.timedelta(seconds=heartbeat),
        # "in danger" (app callback) this long without a heartbeat; shardvisor's owner stops
        # writing duration/5 before a peer may take over: the same point.
        safe_period=datetime.timedelta(seconds=lease * 0.8),
        lease_duration=datetime.timedelta(seconds=lease),
    )


def holder(endpoint: str, key: str, lease: float, heartbeat: float) -> None:
    client = lock_client(endpoint, lease, heartbeat)
    hb = datetime.timedelta(seconds=heartbeat)
    client.acquire_lock(key, retry_period=hb, retry_timeout=hb * 20)
    print(json.dumps({"held": key, "t": time.time()}), flush=True)
    while True:
        time.sleep(3600)


def waiter(endpoint: str, lease: float, heartbeat: float) -> None:
    client = lock_client(endpoint, lease, heartbeat)
    hb = datetime.timedelta(seconds=heartbeat)
    out = threading.Lock()

    def say(**fields: Any) -> None:
        with out:
            print(json.dumps(fields), flush=True)

    def wait(key: str) -> None:
        say(waiting=key, t=time.time())
        try:
            timeout = datetime.timedelta(seconds=heartbeat * 60 + lease * 4)
            client.acquire_lock(key, retry_period=hb, retry_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which records it
            say(failed=key, error=repr(exc), t=time.time())
            return
        say(acquired=key, t=time.time())

    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=wait, args=(line.strip(),), daemon=True).start()
    os._exit(0)  # the client's heartbeat threads are not daemons


def main() -> None:
    role, endpoint, *rest = sys.argv[1:]
    if role == "holder":
        holder(endpoint, rest[0], float(rest[1]), float(rest[2]))
    else:
        waiter(endpoint, float(rest[0]), float(rest[1]))


if __name__ == "__main__":
    main()
