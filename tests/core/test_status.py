"""``shardvisor status`` on plain data: standbys per shard and per worker (issue 14), stale
streams as the owner published them on the shard item (issue 15), with the fields and columns
that were there before."""

from __future__ import annotations

from supervisor.config.model import Config
from supervisor.core.items import ShardItem, Snapshot, WorkerItem
from supervisor.core.status import fleet_status, render_table

NOW = 1000.0


def worker(wid: str, standbys: tuple[str, ...] = (), age: float = 1.0, state="running"):
    return WorkerItem(wid, "x", 3, state, NOW - age, 0.0, host="h", pid=7, standbys=standbys)


SNAPSHOT = Snapshot(
    workers=(
        worker("w1"),
        worker("w2", standbys=("s1",)),
        worker("w3", standbys=("s1", "s2")),
        worker("w4", standbys=("s2",), age=60.0),  # dead: its standbys are gone with it
    ),
    shards=(
        ShardItem("s1", "w1", 4, {"a": 10}, handoff_stage="requested", successor="w2"),
        ShardItem("s2", "w1", 2, {"b": 3}),
        ShardItem("s3", "", 1),
    ),
)


def test_status_json_lists_standbys_per_shard_and_per_worker():
    status = fleet_status(SNAPSHOT, Config(), NOW)
    assert [(w["id"], w["state"], w["shards"], w["standbys"]) for w in status["workers"]] == [
        ("w1", "running", ["s1", "s2"], []),
        ("w2", "running", [], ["s1"]),
        ("w3", "running", [], ["s1", "s2"]),
        ("w4", "dead", [], []),
    ]
    assert status["shards"] == [
        {
            "id": "s1",
            "owner": "w1",
            "epoch": 4,
            "checkpoint": {"a": 10},
            "state": "handing-off",  # a make-before-break request is pending
            "source": "config",
            "stale": [],
            "reconnects": {},
            "standbys": ["w2", "w3"],
        },
        {
            "id": "s2",
            "owner": "w1",
            "epoch": 2,
            "checkpoint": {"b": 3},
            "state": "running",
            "source": "config",
            "stale": [],
            "reconnects": {},
            "standbys": ["w3"],
        },
        {
            "id": "s3",
            "owner": None,
            "epoch": 1,
            "checkpoint": {},
            "state": "unowned",
            "source": "config",
            "stale": [],
            "reconnects": {},
            "standbys": [],
        },
    ]


def test_the_table_has_a_standbys_column_before_the_checkpoint():
    table = render_table(fleet_status(SNAPSHOT, Config(), NOW)).splitlines()
    assert table[0] == "WORKER                STATE     HEARTBEAT  SHARDS"
    assert table[6] == (
        "SHARD                 OWNER                 EPOCH  STATE      STANDBYS              "
        "CHECKPOINT"
    )
    assert table[7] == (
        "s1                    w1                        4  handing-off w2,w3                 a=10"
    )
    assert table[9].startswith("s3                    -                         1  unowned    -")


def test_stale_streams_and_reconnects_show_in_the_json_and_the_table_for_owned_shards_only() -> (
    None
):
    snapshot = Snapshot(
        workers=(),
        shards=(
            ShardItem(
                id="s1", owner="w1", epoch=3, stale=("a", "b"), reconnects={"a": {"idle": 2}}
            ),
            ShardItem(id="s2", owner="w1", epoch=1),
            ShardItem(id="s3", owner="", epoch=2, stale=("c",), reconnects={"c": {"idle": 1}}),
        ),
    )
    status = fleet_status(snapshot, Config(), wall_now=0.0)
    assert [s["stale"] for s in status["shards"]] == [["a", "b"], [], []]
    assert [s["reconnects"] for s in status["shards"]] == [{"a": {"idle": 2}}, {}, {}]
    lines = render_table(status).splitlines()
    assert lines[-3].endswith("stale: a,b  a reconnects: idle=2")
    assert "stale" not in lines[-2] and "stale" not in lines[-1]  # (s3 released: nobody reads it)
    assert "reconnects" not in lines[-2] and "reconnects" not in lines[-1]


def test_a_supervisors_own_view_ages_each_item_as_of_its_read():
    """The fleet page of a worker that reads a peer's item only after a membership change
    (issue 16): a peer read 40 s ago, whose heartbeat was then 0.5 s old, is not dead; one
    whose watchers wrote a death notice is; the CLI's fresh scan is judged as before."""
    snapshot = Snapshot(
        workers=(worker("w1", age=40.5), worker("w2", age=40.5, state="dead"), worker("w3")),
        shards=(),
    )
    view = fleet_status(snapshot, Config(), NOW, read_ago={"w1": 40.0, "w2": 40.0, "w3": 0.0})
    assert [
        (w["id"], w["state"], w["heartbeat_age_s"], w["read_ago_s"]) for w in view["workers"]
    ] == [
        ("w1", "running", 0.5, 40.0),
        ("w2", "dead", 0.5, 40.0),
        ("w3", "running", 1.0, 0.0),
    ]
    fresh = fleet_status(snapshot, Config(), NOW)
    assert [w["state"] for w in fresh["workers"]] == ["dead", "dead", "running"]
    assert all("read_ago_s" not in w for w in fresh["workers"])
