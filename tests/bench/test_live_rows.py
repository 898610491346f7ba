"""Row 8 of the report (``benchmarks.report.live_rows``): the standby cost verdict (on the
figures of a full run that rendered two equal CPU shares as "above the owner"), and which
hand-offs the writer gap's target holds."""

from __future__ import annotations

from typing import Any

from benchmarks.report.live_rows import _cost_section, _gap_section


def fleet_with(owner: float, standby: float) -> dict[str, Any]:
    def stats(p50: float) -> dict[str, float]:
        return {"n": 8, "p50": p50, "p99": p50, "min": p50, "max": p50}

    return {
        "standby_cost": {
            "buffer_s": 30.0,
            "feed_rate": 200.0,
            "window_s": 10.0,
            "filled_after_s": 31.0,
            "buffered_records": stats(6000.0),
            "buffered_bytes": stats(1638000.0),
            "cpu_percent": {"owner": stats(owner), "standby": stats(standby)},
            "pss_mib": {"owner": stats(9.2), "standby": stats(10.6)},
            "streams_per_child": 1,
        }
    }


def verdict(owner: float, standby: float) -> str:
    _, [row] = _cost_section([fleet_with(owner, standby)])
    return row[3]


def test_the_same_tick_count_is_the_same_cost_whatever_the_rounding() -> None:
    # 15 ticks of 10 ms over 10 s each, as /proc's counters gave them in cf42ac5's second run
    assert verdict(owner=1.4999999999999991, standby=1.4999999999999996) == "✓"


def test_one_tick_more_is_above_the_owner() -> None:
    assert verdict(owner=1.5, standby=1.6) == "above the owner"
    assert verdict(owner=1.6, standby=1.5) == "✓"


def test_the_gap_says_where_its_hand_offs_ran() -> None:
    move = {"mode": "make_before_break", "gap_s": 0.03, "lost": 0, "duplicates": 0, "steps": {}}
    fleets = [
        {"name": "live-deploy-c1-moto", "server": "moto", "moves": [move]},
        {"name": "live-host-c1-moto", "server": "moto", "moves": [move, move]},
    ]
    alone, _ = _gap_section(fleets, {"live-deploy-c1-moto"})
    assert "each alone on the machine" in alone
    assert "| moto | 1 |" in alone  # the fleet that ran alone, not the side-by-side one
    assert "side by side (not held to the target): moto 2 hand-offs" in alone
    smoke, _ = _gap_section(fleets, set())
    assert "side by side (a smoke run" in smoke and "| moto | 3 |" in smoke
