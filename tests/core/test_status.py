"""``status``: stale streams as the owner published them on the shard item."""

from __future__ import annotations

from supervisor.config.model import Config
from supervisor.core.items import ShardItem, Snapshot
from supervisor.core.status import fleet_status, render_table


def test_stale_streams_show_in_the_json_and_the_table_for_owned_shards_only() -> None:
    snapshot = Snapshot(
        workers=(),
        shards=(
            ShardItem(id="s1", owner="w1", epoch=3, stale=("a", "b")),
            ShardItem(id="s2", owner="w1", epoch=1),
            ShardItem(id="s3", owner="", epoch=2, stale=("c",)),  # released: nobody reads it
        ),
    )
    status = fleet_status(snapshot, Config(), wall_now=0.0)
    assert [s["stale"] for s in status["shards"]] == [["a", "b"], [], []]
    lines = render_table(status).splitlines()
    assert lines[-3].endswith("stale: a,b")
    assert "stale" not in lines[-2] and "stale" not in lines[-1]
