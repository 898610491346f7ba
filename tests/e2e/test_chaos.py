"""Seeded chaos over real processes: SIGKILL and SIGSTOP/SIGCONT of supervisors and children, and
feed disconnects; then the guarantees read back from the sink files (see tests/helpers/chaos.py).

SHARDVISOR_CHAOS_SEED picks the plan (default 1), SHARDVISOR_CHAOS_STEPS its length (default 8);
every failure message names both, so a failing run can be repeated with the same faults.
"""

from __future__ import annotations

import pytest
from helpers.chaos import DEFAULT_KINDS, STANDBY_KINDS, ChaosPlan, ChaosRun
from helpers.fleet import SHARDS, STREAMS, Fleet, running_fleet

from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.devtools.feed import FeedServer

pytestmark = pytest.mark.slow


def test_the_plan_is_a_function_of_the_seed():
    plan = ChaosPlan.build(7, 20, list(SHARDS), STREAMS)
    assert plan == ChaosPlan.build(7, 20, list(SHARDS), STREAMS)
    assert plan != ChaosPlan.build(8, 20, list(SHARDS), STREAMS)
    assert len(plan.steps) == 20
    assert {s.kind for s in plan.steps[: len(DEFAULT_KINDS)]} == set(DEFAULT_KINDS)  # early


async def test_chaos_keeps_every_stream_gapless_and_single_writer(fleet):
    await chaos(fleet, ChaosRun(fleet, ChaosPlan.from_env(list(SHARDS), STREAMS)))


@pytest.mark.parametrize("ddb_url", ["dynalite"], indirect=True)
async def test_chaos_on_protocol_2(tmp_path, ddb_url, table_name, nursery):
    """The same faults on a fleet that runs protocol 2 (issue 16) from its first round: a
    frozen supervisor is declared dead and its shards routed, and when it thaws its heartbeat
    is refused and it joins again; the sink invariants hold all the same."""
    await DynamoLeaseStore(table_name, "us-east-1", ddb_url).set_protocol(2)
    async with running_fleet(nursery, tmp_path, ddb_url, table_name, SHARDS, rate=200.0) as fleet:
        await chaos(fleet, ChaosRun(fleet, ChaosPlan.from_env(list(SHARDS), STREAMS)))
        assert "the fleet runs protocol 2 from now on" in fleet.log("w1")


@pytest.mark.parametrize("ddb_url", ["dynalite"], indirect=True)
@pytest.mark.parametrize("protocol", [1, 2])
async def test_chaos_with_warm_standbys_on_a_live_feed(
    tmp_path, ddb_url, table_name, nursery, protocol
):
    """The faults a standby bridges, on a live-only feed with `[standby] count = 1` (issue
    14): epochs still never interleave, and nothing is lost where a standby took over. On
    protocol 1 and on protocol 2 (issue 16: standbys from the ring, routed to at a death).
    (Five steps by default: the run is long; SHARDVISOR_CHAOS_STEPS/KINDS choose others.)"""
    feed = FeedServer(rate=200.0, stream_names=STREAMS, live=True)
    port = await nursery.start(feed.serve, "127.0.0.1", 0)
    url = f"ws://127.0.0.1:{port}/feed"
    fleet = Fleet(tmp_path, ddb_url, table_name, url, SHARDS, feed=feed, live_feed=True)
    fleet.settings["standby"] = {"count": 1}
    fleet.settings["lease"]["handoff_timeout"] = "2s"  # fits the 5 s shutdown_timeout
    if protocol == 2:
        await fleet.store.set_protocol(2)
    else:
        await fleet.store.ensure_table(True)
    try:
        plan = ChaosPlan.from_env(list(SHARDS), STREAMS, steps=5, kinds=STANDBY_KINDS)
        run = ChaosRun(fleet, plan, standbys=True)
        await chaos(fleet, run)
        assert run.promoted, f"{run.tag()} no standby was ever promoted: nothing was checked"
    finally:
        await fleet.stop_all()
        for worker in fleet.procs:
            print(f"===== {worker}.log (last lines) =====\n{fleet.log(worker)[-20000:]}")


async def chaos(fleet: Fleet, run: ChaosRun) -> None:
    try:
        await run.run()
    finally:
        print(run.summary())
    tag = run.tag()
    assert not run.audit_problems, f"{tag} sink invariants broken:\n" + "\n".join(
        run.audit_problems
    )
    assert not run.process_problems, f"{tag} processes:\n" + "\n".join(run.process_problems)
    assert not run.recovery_problems(), f"{tag} recovery over its bound:\n" + "\n".join(
        run.recovery_problems()
    )
