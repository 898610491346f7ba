"""CloudWatch files: conf/cloudwatch-dashboard.json and the ECS task's config with EMF on.

The dashboard must be JSON CloudWatch accepts (a 24-column grid of widgets, each metric
widget with its region, title and metrics) and name only metrics the supervisor emits, under
dimension sets it writes them with (``core.emf.dimension_sets``; tests/core/test_emf.py and
tests/e2e/test_e2e_emf.py hold the documents to those). conf/ecs-shardvisor.toml is what the ECS
task runs: it loads, has EMF on in the dashboard's namespace, and its endpoint is the one the
task definition's health check calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers.deploy_files import CONF, DEPLOY_DOC, ECS_TASK, HEALTH_URL

from supervisor.config.loading import load_config
from supervisor.core.emf import dimension_sets

DASHBOARD = CONF / "cloudwatch-dashboard.json"
ECS_CONFIG = CONF / "ecs-shardvisor.toml"
NAMESPACE = "shardvisor"
STATS = re.compile(r"Sum|Average|Minimum|Maximum|SampleCount|p\d{1,2}(?:\.\d+)?")
_SEARCH = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\"', '(\w+)', (\d+)\)")


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def metric_widgets(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in board["widgets"] if w["type"] == "metric"]


def named_metrics(widget: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(namespace, metric, dimension names, stat) of each line: SEARCH expressions and
    plain [namespace, metric, dim, value, ..., {options}] arrays alike."""
    found = []
    for line in widget["properties"]["metrics"]:
        if isinstance(line[0], dict):
            search = _SEARCH.fullmatch(line[0]["expression"])
            assert search, line[0]["expression"]
            namespace, *dims = search.group(1).split(",")
            found.append((namespace, search.group(2), tuple(dims), search.group(3)))
            continue
        options = line[-1] if isinstance(line[-1], dict) else {}
        names = line[2 : len(line) - (1 if options else 0)]
        stat = options.get("stat", widget["properties"].get("stat", "Average"))
        found.append((line[0], line[1], tuple(names[::2]), stat))
    return found


def test_the_dashboard_is_a_grid_of_well_formed_widgets(board) -> None:
    cells: dict[tuple[int, int], str] = {}
    for widget in board["widgets"]:
        assert widget["type"] in {"metric", "text"}
        assert widget["x"] >= 0 and widget["x"] + widget["width"] <= 24, widget
        for x in range(widget["x"], widget["x"] + widget["width"]):
            for y in range(widget["y"], widget["y"] + widget["height"]):
                assert (x, y) not in cells, f"{widget} overlaps {cells[(x, y)]}"
                cells[(x, y)] = widget["properties"].get("title", "text")
    for widget in metric_widgets(board):
        props = widget["properties"]
        assert props["title"] and props["region"] and props["metrics"], widget
        ids = [line[0]["id"] for line in props["metrics"] if isinstance(line[0], dict)]
        assert len(ids) == len(set(ids)), props["title"]


def test_the_dashboard_names_only_metrics_the_supervisor_emits(board) -> None:
    declared = dimension_sets()
    lines = [line for widget in metric_widgets(board) for line in named_metrics(widget)]
    assert len(lines) > 20
    for namespace, metric, dims, stat in lines:
        assert namespace == NAMESPACE, (metric, namespace)
        assert metric in declared, f"{metric} is not emitted"
        assert dims in declared[metric], f"{metric} is not written with dimensions {dims}"
        assert STATS.fullmatch(stat), (metric, stat)


def test_the_dashboard_covers_what_operators_asked_for(board) -> None:
    """Fleet, per worker, per stream: throughput, gaps, dead letters, restarts, lease
    validity, hand-off and failover durations, DynamoDB errors."""
    seen = {(m, d) for w in metric_widgets(board) for _, m, d, _ in named_metrics(w)}
    for wanted in (
        ("MessagesWritten", ()), ("MessagesWritten", ("Shard", "Stream")), ("Gaps", ()),
        ("DeadLettered", ("Shard", "Stream")), ("ChildRestarts", ("Worker", "Reason")),
        ("LeaseValidSeconds", ("Worker",)), ("HandoffSeconds", ()), ("FailoverSeconds", ()),
        ("DynamoDBErrors", ("Worker", "Kind")), ("ShardsHeld", ()),
    ):  # fmt: skip
        assert wanted in seen, wanted


def test_the_ecs_task_runs_with_emf_on() -> None:
    config = load_config(ECS_CONFIG)
    assert config.cloudwatch.emf is True
    assert config.cloudwatch.namespace == NAMESPACE
    assert config.worker.id == ""  # the ECS task id
    assert HEALTH_URL.startswith(f"http://{config.http.listen}/")
    task = json.loads(ECS_TASK.read_text())
    (container,) = task["containerDefinitions"]
    assert container["logConfiguration"]["logDriver"] == "awslogs"  # carries the EMF lines
    doc = DEPLOY_DOC.read_text()
    assert "conf/ecs-shardvisor.toml" in doc and "cloudwatch-dashboard.json" in doc
