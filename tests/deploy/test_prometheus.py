"""conf/prometheus-alerts.yml and conf/grafana-dashboard.json against real supervisors.

A small fleet runs once for the module: two supervisors on dynalite, one joins (graceful
hand-offs), one host dies (its shards fail over to the other), a child is killed (a restart).
Then: `promtool check metrics` on the survivor's real /metrics; every metric a rule or a panel
names is in that scrape (and every label it matches on, where the scrape shows the metric's
labels); `promtool check rules` and `promtool test rules`; and a real Prometheus server
scrapes the survivor on 127.0.0.1, answers a query for our series, evaluates every rule
without error (the failover alert fires), and every panel's query runs.

promtool and prometheus come from Debian's `prometheus` package; without them the tests that
need them skip, naming it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from helpers.deploy_files import ALERTS, DASHBOARD, DEPLOY_DOC, K8S_DIR
from helpers.live_supervisor import (
    LiveProcess,
    LiveSupervisor,
    free_port,
    http_get,
    running_feed,
    supervisor_env,
    wait_for,
)

from supervisor.devtools.fleet import child_pids, fleet_config

ALERT_CASES = Path(__file__).with_name("prometheus-alerts.test.yml")
SKIP_REASON = "the {} binary is not on PATH (Debian: apt-get install prometheus)"
SHARDS = {"p1": ["p1-a", "p1-b"], "p2": ["p2-a"], "p3": ["p3-a"], "p4": ["p4-a"]}
TARGET_LABELS = {"instance", "job"}  # added by the scrape, on every series
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval"}
# PromQL words that are neither metrics nor followed by "(" (functions and aggregations are).
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_MATCHERS = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(SKIP_REASON.format(name))
    return path


# --- what a PromQL expression names -----------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, aggregations,
    keywords, label names (in {...}, by/without/on/ignoring/group_*), durations or strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[a-zA-Z_:][\w:]*", text):
        if text[match.end() :].lstrip().startswith("("):
            continue
        if match.group().lower() not in PROMQL_KEYWORDS:
            names.add(match.group())
    return names


def label_names(expr: str) -> dict[str, set[str]]:
    """{metric: label names its selectors match on}, and {"": grouping labels of the expr}."""
    used: dict[str, set[str]] = {}
    for metric, matchers in _MATCHERS.findall(expr):
        names = re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers)
        used.setdefault(metric, set()).update(names)
    for labels in _LABEL_LISTS.findall(expr):
        used.setdefault("", set()).update(n.strip() for n in labels.split(",") if n.strip())
    return used


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows themselves excluded."""
    found = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            found += panel.get("panels", [])
        else:
            found.append(panel)
    return found


def panel_queries(board: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in panels(board) for target in panel["targets"]]


def variable_queries(board: dict[str, Any]) -> list[str]:
    return [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]


def every_expression() -> list[str]:
    return [r["expr"] for r in alert_rules()] + panel_queries(dashboard())


def grafana_to_promql(expr: str) -> str:
    """A panel's query as Grafana sends it with every variable at "All" (regex ".*")."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr.replace("$__interval", "15s"))


# --- the scrape -------------------------------------------------------------------------------


@attrs.frozen
class Scrape:
    """A /metrics text: the series names it declares and the labels seen on each family."""

    text: str
    names: frozenset[str]  # every series name Prometheus can store from it
    labels: dict[str, frozenset[str]]  # series name -> label names seen on its samples

    @classmethod
    def parse(cls, text: str) -> Scrape:
        names: set[str] = set()
        labels: dict[str, set[str]] = {}
        for kind_line in re.findall(r"^# TYPE (\S+) (\w+)$", text, flags=re.M):
            name, kind = kind_line
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names.update(name + suffix for suffix in suffixes)
        for name, body in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? ", text, flags=re.M):
            names.add(name)
            labels.setdefault(name, set()).update(re.findall(r'(\w+)="', body or ""))
        return cls(text, frozenset(names), {k: frozenset(v) for k, v in labels.items()})


@attrs.frozen
class LiveFleet:
    survivor: LiveSupervisor
    scrape: Scrape


# Short leases: the failover below takes seconds, not the default's ten. A standby of every
# shard, with the smallest buffer allowed: standbys that drop records and get promoted, for the
# standby rules and panels (a labelled counter has no series before its first event).
SETTINGS = {
    "lease": {"duration": "2s", "heartbeat_interval": "500ms", "reconcile_interval": "500ms"},
    "supervisor": {"shutdown_timeout": "5s", "checkpoint_interval": "200ms"},
    "standby": {"count": 1, "max_buffer_bytes": 1024},
    "http": {"listen": "127.0.0.1:0"},
}


def config(worker: str, table: str, ddb_url: str, feed_url: str) -> dict[str, Any]:
    return fleet_config(
        worker, table=table, ddb_url=ddb_url, feed_url=feed_url, shards=SHARDS, sections=[SETTINGS]
    )


def shards_held(supervisor: LiveSupervisor) -> float:
    return metric_value(supervisor.get("/metrics")[1].decode(), "shardvisor_shards_held") or 0.0


def metric_value(text: str, sample: str) -> float | None:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, flags=re.M)
    return float(found.group(1)) if found else None


def standby_drops(supervisor: LiveSupervisor) -> float:
    text = supervisor.get("/metrics")[1].decode()
    found = re.findall(r"^shardvisor_standby_dropped_records_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(value) for value in found)


def signal_restarts(supervisor: LiveSupervisor) -> float:
    text = supervisor.get("/metrics")[1].decode()
    return metric_value(text, 'shardvisor_child_restarts_total{reason="signal"}') or 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory, dynalite_server) -> Iterator[LiveFleet]:
    """w1 takes every shard; w2 joins (w1 hands some off, and stands by for them: its small
    buffers drop records); w2's host dies (w1 takes them back from a dead owner, promoting its
    standbys); one of w1's children is killed (a restart). w1 keeps running."""
    root = tmp_path_factory.mktemp("prometheus")
    table = "prom-" + uuid.uuid4().hex[:12]
    with running_feed(root, rate=50.0) as feed_url:
        (root / "w1").mkdir()
        (root / "w2").mkdir()
        w1 = LiveSupervisor(root / "w1", config("w1", table, dynalite_server.url, feed_url))
        w2: LiveSupervisor | None = None
        try:
            w1.wait_status("/readyz", 200)
            wait_for(lambda: shards_held(w1) == len(SHARDS), 30, "w1 holding every shard")
            w2 = LiveSupervisor(root / "w2", config("w2", table, dynalite_server.url, feed_url))
            wait_for(lambda: shards_held(w2) > 0, 30, "a hand-off to w2")
            wait_for(lambda: standby_drops(w1) > 0, 30, "w1's standbys dropping records")
            w2.kill_host()
            wait_for(lambda: shards_held(w1) == len(SHARDS), 30, "the failover to w1")
            victim = wait_for(lambda: child_pids(w1.proc.pid), 10, "w1's children")[0]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: signal_restarts(w1) >= 1, 20, "a restart counted")
            wait_for(lambda: w1.get("/readyz")[0] == 200, 20, "w1 ready")
            yield LiveFleet(w1, Scrape.parse(w1.get("/metrics")[1].decode()))
        finally:
            if w2 is not None:
                w2.kill_host()
            w1.stop()


# --- static checks ----------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [tool("promtool"), "check", "rules", str(ALERTS)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_alerts_fire_on_their_trouble_and_stay_quiet_otherwise(tmp_path) -> None:
    """`promtool test rules` on tests/deploy/prometheus-alerts.test.yml; every alert has cases."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # prose: promtool would compare it word for word
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(ALERT_CASES, tmp_path / ALERT_CASES.name)
    cases = yaml.safe_load(ALERT_CASES.read_text())
    tested = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for r in alert_rules()}, "an alert without unit tests"
    result = subprocess.run(
        [tool("promtool"), "test", "rules", ALERT_CASES.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scrape_config_in_the_docs_passes_promtool(tmp_path) -> None:
    doc = DEPLOY_DOC.read_text()
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.S) if "scrape_configs" in b
    ]
    config = yaml.safe_load(block)
    assert config["rule_files"] == ["/etc/prometheus/rules/shardvisor.yml"]
    config["rule_files"] = [str(ALERTS)]  # the path on a Prometheus host, here the repo's file
    # Debian builds Prometheus without Kubernetes discovery ("field kubernetes_sd_configs not
    # found"): promtool checks the rest with a static target in its place.
    (job,) = config["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "endpoints"}]
    job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    service = yaml.safe_load((K8S_DIR / "service.yaml").read_text())
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep["regex"] == f"{service['metadata']['name']};{service['spec']['ports'][0]['name']}"


def test_every_alert_says_how_bad_and_what_happened() -> None:
    for rule in alert_rules():
        assert re.fullmatch(r"Shardvisor[A-Z]\w+", rule["alert"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "shardvisor" and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"] == {**variables["datasource"], "query": "prometheus"}
    nested = [q for p in board["panels"] if p["type"] == "row" for q in p.get("panels", [])]
    ids = [p["id"] for p in board["panels"] + nested]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
    for expr in panel_queries(board) + variable_queries(board):
        for variable in re.findall(r"\$\{?(\w+)", expr):
            assert variable in variables or variable in GRAFANA_BUILTINS, f"${variable}: {expr}"


def test_the_dashboard_covers_what_operators_asked_for() -> None:
    """Fleet, per worker, per stream: throughput, gaps, dead letters, restarts, lease validity,
    hand-offs and failovers, DynamoDB latency and errors."""
    queries = " ".join(panel_queries(dashboard()))
    variables = {v["name"] for v in dashboard()["templating"]["list"]}
    assert {"worker", "shard", "stream"} <= variables
    for needle in (
        'outcome="written"', "gaps", "dead_lettered", "shardvisor_child_restarts_total",
        "shardvisor_lease_valid_seconds", "shardvisor_handoff_seconds_bucket",
        'source="dead-owner"', "shardvisor_dynamodb_request_seconds_bucket",
        "shardvisor_dynamodb_errors_total", "group_left (worker) shardvisor_worker_info",
    ):  # fmt: skip
        assert needle in queries, needle


def test_promql_names_are_found() -> None:
    """The name extraction the checks below rely on, on known expressions."""
    expr = (
        'sum without (reason) (increase(a_total{x="y"}[5m] offset 1m)) > 3 or '
        'histogram_quantile(0.99, sum by (le) (rate(b_bucket{job=~"$job"}[$__rate_interval])))'
        " * on (instance, job) group_left (worker) c_info and vector(1) unless d"
    )
    assert metric_names(expr) == {"a_total", "b_bucket", "c_info", "d"}
    assert label_names(expr) == {
        "a_total": {"x"},
        "b_bucket": {"job"},
        "": {"reason", "le", "instance", "job", "worker"},
    }


# --- against a real scrape --------------------------------------------------------------------


def test_promtool_check_metrics_on_a_real_scrape(live) -> None:
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=live.scrape.text, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_named_by_a_rule_or_panel_is_scraped(live) -> None:
    scrape = live.scrape
    board = dashboard()
    for expr in every_expression():
        for name in metric_names(expr):
            assert name.startswith("shardvisor_"), f"not one of ours: {name} in {expr}"
            assert name in scrape.names, f"{name} is not in a real /metrics: {expr}"
    for query in variable_queries(board):
        metric, label = _LABEL_VALUES.fullmatch(query).groups()
        assert metric in scrape.names, query
        assert label in scrape.labels[metric] | TARGET_LABELS, query


def test_every_label_a_rule_or_panel_uses_is_on_its_metric(live) -> None:
    scrape = live.scrape
    for expr in every_expression():
        used = label_names(expr)
        named = metric_names(expr)
        seen = set().union(*(scrape.labels.get(n, set()) for n in named)) | TARGET_LABELS
        for metric, labels in used.items():
            if metric and metric in scrape.labels:
                assert labels <= scrape.labels[metric] | TARGET_LABELS, f"{metric}: {expr}"
        if all(n in scrape.labels for n in named):  # every family has samples to look at
            assert used.get("", set()) <= seen, expr


def test_the_fleet_events_are_in_the_scrape(live) -> None:
    """The events the fixture caused show in the counters that the rules and panels read."""
    text = live.scrape.text
    assert metric_value(text, 'shardvisor_epoch_changes_total{source="dead-owner"}') >= 1
    assert metric_value(text, 'shardvisor_child_restarts_total{reason="signal"}') >= 1
    assert metric_value(text, "shardvisor_handoff_seconds_count") >= 1
    assert metric_value(text, "shardvisor_shards_held") == len(SHARDS)
    assert metric_value(text, 'shardvisor_promotions_total{kind="failover"}') >= 1


# --- a real Prometheus server -----------------------------------------------------------------


@attrs.frozen
class PrometheusServer:
    url: str

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        document = json.loads(body) if body else {}
        assert document.get("status") == "success", f"{path} {params}: {status} {body[:500]!r}"
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]


@pytest.fixture(scope="module")
def prometheus(live, tmp_path_factory) -> Iterator[PrometheusServer]:
    """Debian's prometheus on a free loopback port, scraping the survivor every second and
    evaluating conf/prometheus-alerts.yml; stopped (and reaped) at the end."""
    binary = tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus-server")
    target = live.survivor.base_url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "shardvisor", "static_configs": [{"targets": [target]}]}],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    server, url = start_prometheus(binary, root)
    try:
        yield PrometheusServer(url)
    finally:
        assert server.stop(timeout=10) == 0, server.log()


def start_prometheus(binary: str, root: Path) -> tuple[LiveProcess, str]:
    """Started and answering /-/ready; a port taken between free_port() and the bind makes
    it exit, and another port is tried."""
    for _ in range(3):
        port = free_port()
        argv = [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / f'data-{port}'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        server = LiveProcess(argv, root / "prometheus.log", root, supervisor_env())
        url = f"http://127.0.0.1:{port}"

        def up_or_gone(server: LiveProcess = server, url: str = url) -> bool:
            return server.proc.poll() is not None or http_get(f"{url}/-/ready")[0] == 200

        try:
            wait_for(up_or_gone, 30, "Prometheus ready")
        except TimeoutError:
            server.stop(timeout=10)
            raise
        if server.proc.poll() is None:
            return server, url
        server.stop(timeout=10)
    pytest.fail(f"Prometheus did not start:\n{server.log()}")


def test_prometheus_scrapes_the_supervisor_and_answers_a_query(live, prometheus) -> None:
    (sample,) = wait_for(lambda: prometheus.query("shardvisor_worker_info"), 30, "our series")
    assert sample["metric"]["worker"] == "w1"
    assert sample["metric"]["job"] == "shardvisor"
    assert sample["metric"]["instance"] == live.survivor.base_url.removeprefix("http://")
    (held,) = prometheus.query("shardvisor_shards_held")
    assert float(held["value"][1]) == len(SHARDS)
    (up,) = prometheus.query('up{job="shardvisor"}')
    assert up["value"][1] == "1"


def test_prometheus_evaluates_every_rule_and_fires_the_failover_alert(live, prometheus) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
        return rules if done else None

    rules = wait_for(evaluated, 30, "every rule evaluated")
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"

    def failover_alert() -> dict[str, Any] | None:
        firing = [a for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
        return next((a for a in firing if a["labels"]["alertname"].endswith("DeadOwner")), None)

    alert = wait_for(failover_alert, 30, "the failover alert firing")
    assert alert["labels"]["instance"] == live.survivor.base_url.removeprefix("http://")
    for text in alert["annotations"].values():
        assert "error expanding template" not in text and "{{" not in text, text


def test_every_panel_query_runs_in_prometheus(live, prometheus) -> None:
    """Every query parses and runs; the per-worker panels (joined with shardvisor_worker_info
    for the worker's name) show w1 once two scrapes are in for rate()."""
    wait_for(lambda: prometheus.query("shardvisor_shards_held"), 30, "a first scrape")
    for expr in panel_queries(dashboard()):
        prometheus.query(grafana_to_promql(expr))  # a PromQL error fails the API call
    per_worker = [p for p in panels(dashboard()) if p["title"].endswith("per worker")]
    assert len(per_worker) == 4
    for panel in per_worker:
        (target,) = panel["targets"]
        expr = grafana_to_promql(target["expr"])
        (series,) = wait_for(lambda e=expr: prometheus.query(e), 30, panel["title"])
        assert series["metric"] == {"worker": "w1"}, panel["title"]
    for query in variable_queries(dashboard()):
        metric, label = _LABEL_VALUES.fullmatch(query).groups()
        assert prometheus.api(f"label/{label}/values", **{"match[]": metric}), query
