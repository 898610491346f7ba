"""Seeded chaos over real processes: SIGKILL and SIGSTOP/SIGCONT of supervisors and children, and
feed disconnects; then the guarantees read back from the sink files (see tests/helpers/chaos.py).

SHARDVISOR_CHAOS_SEED picks the plan (default 1), SHARDVISOR_CHAOS_STEPS its length (default 8);
every failure message names both, so a failing run can be repeated with the same faults.
"""

from __future__ import annotations

import pytest
from helpers.chaos import DEFAULT_KINDS, ChaosPlan, ChaosRun
from helpers.fleet import SHARDS, STREAMS

pytestmark = pytest.mark.slow


def test_the_plan_is_a_function_of_the_seed():
    plan = ChaosPlan.build(7, 20, list(SHARDS), STREAMS)
    assert plan == ChaosPlan.build(7, 20, list(SHARDS), STREAMS)
    assert plan != ChaosPlan.build(8, 20, list(SHARDS), STREAMS)
    assert len(plan.steps) == 20
    assert {s.kind for s in plan.steps[: len(DEFAULT_KINDS)]} == set(DEFAULT_KINDS)  # early


async def test_chaos_keeps_every_stream_gapless_and_single_writer(fleet):
    plan = ChaosPlan.from_env(list(SHARDS), STREAMS)
    run = ChaosRun(fleet, plan)
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
