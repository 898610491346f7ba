"""Row 9's arithmetic (``benchmarks.fleet_growth``) with plain numbers: proxy readings become
rates per worker-minute, lease traffic leaves checkpoints out, the growth ratio meets or misses
issue 16's target."""

from __future__ import annotations

import pytest
from benchmarks.fleet_growth import growth, rates, spread


def reading(batch: int, query: int, heartbeat: int, checkpoint: int, rru: float) -> dict:
    return {
        "targets": {"BatchGetItem": batch, "Query": query, "UpdateItem": heartbeat + checkpoint},
        "updates": {"heartbeat": heartbeat, "checkpoint": checkpoint},
        "units": {
            "read_units": {"BatchGetItem": rru, "Query": query / 2},
            "write_units": {"heartbeat": float(heartbeat), "checkpoint": float(checkpoint)},
        },
    }


def test_rates_are_per_worker_minute_and_lease_traffic_leaves_checkpoints_out() -> None:
    before = reading(10, 100, 5, 20, 30.0)
    after = reading(10 + 90, 100 + 1800, 5 + 90, 20 + 360, 30.0 + 270.0)  # 3 workers, 1 min
    found = rates(before, after, workers=3, seconds=60.0)
    assert found["requests"] == pytest.approx((90 + 1800 + 90 + 360) / 3)
    assert found["lease_requests"] == pytest.approx((90 + 1800 + 90) / 3)
    assert found["reads"] == pytest.approx((90 + 1800) / 3)
    assert found["rru"] == pytest.approx((270 + 900) / 3)
    assert found["rru_by_op"] == pytest.approx({"BatchGetItem": 90.0, "Query": 300.0})
    assert found["wru"] == pytest.approx(150.0)
    assert found["lease_wru"] == pytest.approx(30.0)


def test_spread_is_the_standard_error_of_the_slices() -> None:
    samples = [
        (reading(0, 0, 0, 0, 0.0), 0.0),
        (reading(0, 0, 0, 0, 10.0), 60.0),
        (reading(0, 0, 0, 0, 30.0), 120.0),
    ]
    found = spread(samples, workers=1)
    assert found["rru_slices"] == pytest.approx([10.0, 20.0])
    assert found["rru_stderr"] == pytest.approx(5.0)  # stdev 7.07 / sqrt(2)


def test_growth_compares_the_largest_fleet_with_the_smallest() -> None:
    sizes = [
        {"workers": n, "per_worker_minute": {"rru": rru}}
        for n, rru in ((6, 441.0), (3, 346.0), (24, 967.0))
    ]
    found = growth(sizes)
    assert (found["small"], found["large"], found["met"]) == (3, 24, False)
    assert found["rru_ratio"] == pytest.approx(967 / 346)
    flat = [{"workers": 3, "per_worker_minute": {"rru": 165.0}}]
    flat.append({"workers": 24, "per_worker_minute": {"rru": 180.0}})
    assert growth(flat)["met"]


def test_the_host_death_table_tells_watchers_takes_from_the_others() -> None:
    from benchmarks.report.growth_rows import _deaths

    death = {
        "victim": "w23",
        "watchers": ["w07", "w12"],
        "lease_s": 10.0,
        "takes": [
            {"shard": "a", "by": "w00", "watcher": False, "after_last_heartbeat_s": 10.41},
            {"shard": "b", "by": "w07", "watcher": True, "after_last_heartbeat_s": 10.12},
        ],
    }
    text = _deaths([{"workers": 24, "host_death": death}])
    row = next(line for line in text.splitlines() if line.startswith("| 24"))
    assert "w23 (watched by w07, w12)" in row
    assert row.index("10.12 s (w07)") < row.index("10.41 s (w00)")  # watcher's column first
    assert "Lease 10 s" in text


def test_row_9_shows_protocol_2_beside_protocol_1_when_it_was_measured() -> None:
    from benchmarks.report.growth_rows import growth as render

    def size(workers: int, protocol: int, rru: float) -> dict:
        per = {"requests": 500.0, "lease_requests": 400.0, "rru": rru, "wru": 150.0}
        per |= {"lease_wru": 30.0, "by_op": {}, "rru_by_op": {}}
        return {
            "workers": workers,
            "protocol": protocol,
            "window_s": 20.0,
            "worker_minutes": workers / 3,
            "per_worker_minute": per,
            "exit_codes": {"w00": 0},
        }

    def run(protocol: int, rru: float) -> dict:
        sizes = [size(3, protocol, rru), size(24, protocol, rru)]
        return {"sizes": sizes, "growth": growth(sizes)}

    runs = {"fleet_growth": run(1, 245.0), "fleet_growth_p2": run(2, 175.0)}
    text, summary = render(lambda name: runs.get(name))
    assert "**Protocol 2.**" in text
    assert [row[0] for row in summary] == [
        "9. RRU / worker-minute, 3 → 24 workers",
        "9. RRU / worker-minute, 3 → 24 workers, protocol 2",
    ]
    assert summary[1][1] == "175 → 175 (1.00\N{MULTIPLICATION SIGN})"
    alone, rows = render(lambda name: runs.get(name) if name == "fleet_growth" else None)
    assert "Protocol 2." not in alone and len(rows) == 1
