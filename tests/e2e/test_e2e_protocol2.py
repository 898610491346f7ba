"""Protocol 2 (issue 16) with real supervisors, real children and real signals, over HTTP to
moto's server and to dynalite: a running fleet flipped by `init-table --protocol 2`, then a
join, a host death and a drain on protocol 2's reads alone."""

from __future__ import annotations

import os
import re
import signal

import pytest
import trio
from helpers.fleet import (
    FAILOVER,
    SHARDS,
    STREAMS,
    assert_no_gap_and_no_overlap,
    catch_up,
    cli,
    running_fleet,
    wait_balanced,
    wait_for_log,
)

from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore

pytestmark = pytest.mark.slow

SWITCHED = "the fleet runs protocol 2 from now on"


async def test_a_running_fleet_flips_to_protocol_2_then_joins_fails_over_and_drains(
    tmp_path, ddb_url, table_name, nursery
):
    # dynalite ignores an index added to an existing table: the table has them from the start.
    await DynamoLeaseStore(table_name, "us-east-1", ddb_url).ensure_table(True, protocol=2)
    async with running_fleet(nursery, tmp_path, ddb_url, table_name, SHARDS, rate=200.0) as fleet:
        with trio.fail_after(90):
            for worker in ("w1", "w2"):
                await fleet.start(worker)
            await wait_balanced(fleet, ["w1", "w2"], timeout=20)
            code, out = await cli(fleet, "init-table", "--protocol", "2")
            assert code == 0, out
            assert "protocol 2" in out
            for worker in ("w1", "w2"):
                await wait_for_log(fleet, worker, SWITCHED, timeout=10)
            await fleet.start("w3")
            await wait_for_log(fleet, "w3", "registered worker w3", timeout=20)
            assert SWITCHED in fleet.log("w3")  # it read the meta item at start
            await wait_balanced(fleet, ["w1", "w2", "w3"], timeout=30)
            await catch_up(fleet)

            # A host death (its process group at once: no child is left to leave a last
            # will): a watcher declares it at the lease, routes its shards, and the named
            # peers' hand-off polls take them.
            killed = trio.current_time()
            os.killpg(fleet.procs["w3"].pid, signal.SIGKILL)
            await fleet.procs["w3"].wait()
            await fleet.wait_until_owned(by=["w1", "w2"], timeout=FAILOVER + 5)
            took = trio.current_time() - killed
            assert took <= FAILOVER, f"failover took {took:.2f}s"
            logs = fleet.log("w1") + fleet.log("w2")
            assert "declared worker w3 dead" in logs
            assert re.search(r"routed [1-9]\d* of \d+ shards of w3", logs), "nothing routed"

            fleet.kill("w2", signal.SIGTERM)  # a drain: every shard to w1 by name
            assert await fleet.procs["w2"].wait() == 0
            await fleet.wait_until_owned(by=["w1"], timeout=10)
            await catch_up(fleet)
            await fleet.stop_all()
        for worker in ("w1", "w2", "w3"):
            log = fleet.log(worker)
            assert "Traceback" not in log, f"{worker}:\n{log}"
    assert_no_gap_and_no_overlap(fleet, STREAMS)
