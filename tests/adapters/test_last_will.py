"""A child's last will over HTTP against moto's server and dynalite: the adapter on its own,
then a real child process that cannot import the supervisor package at all."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio
from helpers.feeds import start_feed
from helpers.worker_helpers import make_start, read_records, spawn_worker

from shard_worker.adapters.last_will import give_last_will
from shard_worker.adapters.log import Log
from shard_worker.contract.pipe import Checkpoint, LastWill, Ready, StreamSpec
from shard_worker.drivers.worker import LAST_WILL_TIMEOUT
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.partition_keys import VACANT_BUCKETS, bucket, vacant_key

REGION = "us-east-1"
REPO = Path(__file__).resolve().parents[2]
BOTO3_MARK = "guard: boto3 imported now"

# Run by the child's interpreter at start-up (sitecustomize): the supervisor package becomes
# unimportable, and the first import of boto3 leaves a mark in the child's stderr, in order
# with its log lines.
GUARD = f"""
import sys

sys.modules["supervisor"] = None  # any `import supervisor...` raises ImportError


class FirstImportOfBoto3:
    def find_spec(self, name, path=None, target=None):
        if name == "boto3":
            sys.stderr.write({BOTO3_MARK!r} + "\\n")
            sys.stderr.flush()
            sys.meta_path.remove(self)
        return None


sys.meta_path.insert(0, FirstImportOfBoto3())
"""


@pytest.fixture
async def store(ddb_url: str, table_name: str) -> DynamoLeaseStore:
    """A table with worker w1 (session s1) owning shard-1 at epoch 1."""
    store = DynamoLeaseStore(table_name, REGION, ddb_url)
    await store.ensure_table(create=True)
    await store.register_worker(WorkerItem("w1", "s1", 0, "running", 1.0, 1.0))
    await store.ensure_shard("shard-1")
    await store.take("shard-1", "w1", "", 0, 1.0)
    return store


def will_for(store: DynamoLeaseStore, session: str = "s1") -> LastWill:
    return LastWill(table=store.table, region=REGION, endpoint_url=store.endpoint, session=session)


async def give(will: LastWill, epoch: int = 1, checkpoint: dict[str, int] | None = None) -> str:
    """The will of w1's child for shard-1; what it logged."""
    out = io.StringIO()
    with trio.fail_after(LAST_WILL_TIMEOUT):
        await give_last_will(
            will,
            shard="shard-1",
            worker="w1",
            epoch=epoch,
            checkpoint=checkpoint or {},
            wall_now=1700000000.5,
            log=Log(out=out),
        )
    return out.getvalue()


async def shard_and_worker(store: DynamoLeaseStore) -> tuple[ShardItem, WorkerItem]:
    snapshot = await store.snapshot()
    (shard,) = snapshot.shards
    (worker,) = snapshot.workers
    return shard, worker


async def test_the_will_releases_the_shard_and_marks_the_session_orphaned(
    store: DynamoLeaseStore,
) -> None:
    log = await give(will_for(store), checkpoint={"a": 41})
    assert "last will: released at epoch 1" in log
    assert "WARNING" not in log
    shard, worker = await shard_and_worker(store)
    assert (shard.owner, shard.epoch, shard.state) == ("", 1, "last-will")
    assert shard.checkpoint == {"a": 41}  # the final checkpoint came with the release
    assert [v.id for v in (await store.vacancies()).shards] == ["shard-1"]  # peers see it at once
    assert worker.state == "orphaned"


async def test_the_will_lists_the_shard_in_its_vacant_bucket_for_protocol_2(
    ddb_url: str, table_name: str
) -> None:
    """The supervisor gives the child the shard's vacant bucket key (it cannot import the
    rule): after the will, protocol 2's index lists the shard there, not under its owner."""
    store = DynamoLeaseStore(table_name, REGION, ddb_url)
    await store.ensure_table(create=True, protocol=2)
    await store.register_worker(WorkerItem("w1", "s1", 0, "running", 1.0, 1.0))
    await store.ensure_shard("shard-1")
    await store.take("shard-1", "w1", "", 0, 1.0)
    fleet = store.fleet()
    assert [s.id for s in await fleet.owned_by("w1")] == ["shard-1"]
    will = attrs.evolve(will_for(store), fleet=vacant_key("shard-1"))
    assert "released at epoch 1" in await give(will)
    assert await fleet.owned_by("w1") == ()
    assert [s.id for s in await fleet.vacant_in(bucket("shard-1", VACANT_BUCKETS))] == ["shard-1"]


async def test_a_shard_that_moved_on_is_left_alone(store: DynamoLeaseStore) -> None:
    await store.take("shard-1", "w2", "w1", 1, 2.0)  # a peer took it: epoch 2
    log = await give(will_for(store), epoch=1, checkpoint={"a": 99})
    assert "last will: the shard has moved on already" in log
    shard, _ = await shard_and_worker(store)
    assert (shard.owner, shard.epoch, shard.checkpoint) == ("w2", 2, {})


async def test_a_new_session_or_a_clean_exit_is_not_marked_orphaned(
    store: DynamoLeaseStore,
) -> None:
    log = await give(will_for(store, session="an-older-session"))
    _, worker = await shard_and_worker(store)
    assert worker.state == "running"
    await store.retire_worker("w1", "s1", 3.0)
    log += await give(will_for(store))
    _, worker = await shard_and_worker(store)
    assert worker.state == "stopped"
    assert "WARNING" not in log  # a condition that failed is not a failure


async def test_an_unreachable_store_is_a_warning_within_the_deadline(table_name: str) -> None:
    with socket.socket() as sock:  # bound, not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        will = LastWill(table=table_name, region=REGION, endpoint_url=url, session="s1")
        start = trio.current_time()
        log = await give(will)
    assert trio.current_time() - start < LAST_WILL_TIMEOUT
    assert "last will: release failed: " in log and url in log
    assert "last will: could not mark the supervisor orphaned: " in log


# --- a real child that cannot import the supervisor ------------------------------------------


@pytest.fixture
async def feed_url(nursery: trio.Nursery) -> AsyncIterator[str]:
    _, url = await start_feed(nursery, 500.0)
    yield url


def guarded_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with the guard's sitecustomize first, then this checkout."""
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    return {"PYTHONPATH": os.pathsep.join([str(guard), str(REPO)])}


@pytest.mark.slow
async def test_a_child_without_the_supervisor_package_gives_its_last_will(
    store: DynamoLeaseStore, feed_url: str, tmp_path: Path
) -> None:
    """The child runs its shard without the supervisor package and without boto3; at EOF on
    its control pipe it imports boto3 (only then) and releases at its final checkpoint."""
    stream = StreamSpec(id="a", url=feed_url, sequence="seq")
    start = attrs.evolve(make_start([stream], tmp_path / "out"), last_will=will_for(store))
    async with spawn_worker(env=guarded_env(tmp_path)) as child:
        await child.send(start)
        await child.expect(Ready)
        await child.wait_for(Checkpoint, predicate=lambda c: c.checkpoint.get("a", 0) > 0)
        assert BOTO3_MARK not in child.log
        await child.close_control()  # as if the supervisor died
        assert await child.wait(timeout=LAST_WILL_TIMEOUT + 5) == 0
    log = child.log
    assert "last will unavailable" not in log
    gone, imported = log.index("supervisor gone"), log.index(BOTO3_MARK)
    assert gone < imported < log.index("last will: released at epoch 1"), log
    records = read_records(tmp_path / "out" / "shard-1" / "a.1.jsonl")
    shard, worker = await shard_and_worker(store)
    assert (shard.owner, shard.state, shard.epoch) == ("", "last-will", 1)
    assert shard.checkpoint == {"a": records[-1]["seq"]}  # nothing written is replayed
    assert worker.state == "orphaned"
