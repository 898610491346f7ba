"""A supervisor's first standby placement ranks every worker for every shard: spread over
steps, so the heartbeat and the children's pipes are served while it runs."""

from __future__ import annotations

import trio

from supervisor.core.standby import Rankings
from supervisor.drivers.standbys import WARM_STEP, warm_rankings


async def test_the_first_ranking_yields_to_the_event_loop_and_leaves_nothing_to_rank():
    live = {f"w{i}" for i in range(20)}
    shards = [f"s{i}" for i in range(10 * WARM_STEP)]
    ranks = Rankings()
    turns = 0
    done = trio.Event()

    async def other_task() -> None:  # stands for the heartbeat, the pipes, the polls
        nonlocal turns
        while not done.is_set():
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()  # let it start
        await warm_rankings(ranks, shards, live)
        done.set()
    assert turns >= 10  # it ran between the steps, not only before and after
    assert all(ranks._prefixes[s].seen == len(live) for s in shards)  # a walk ranks nothing
