"""The report: out/bench/*.json (written by the programs scripts/bench.sh runs) as Markdown.

``python -m benchmarks.report [--publish]`` writes out/bench/benchmarks.md, and with
``--publish`` the generated part of docs/benchmarks.md (scripts/bench.sh passes it on a full
run, never on a quick one). Each row of the document is one section below, rendered from the
JSON files it names; a program prints the sections of what it measured with ``sections``. A part
whose JSON is missing is shown as not measured, never left out, so every heading is always there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from benchmarks import harness
from benchmarks.report import (
    fleet_rows,
    growth_rows,
    host_rows,
    live_rows,
    requests_rows,
    throughput_rows,
)
from benchmarks.report.common import Load, Rendered


@attrs.frozen
class Section:
    reads: tuple[str, ...]  # the JSON files (out/bench/<name>.json) it is rendered from
    render: Callable[[Load], Rendered]
    published: bool = True  # in docs/benchmarks.md, or only printed by its program


SECTIONS = (  # in the order of the document
    Section(("fleet", "peers_lock"), fleet_rows.failover),
    Section(("fleet",), fleet_rows.failover_detail, published=False),
    Section(("fleet",), fleet_rows.handoff),
    Section(("restart", "peers_supervisord"), host_rows.restart),
    Section(("throughput",), throughput_rows.throughput),
    Section(("throughput",), host_rows.backpressure, published=False),
    Section(("memory", "scale"), host_rows.memory),
    Section(("requests",), requests_rows.requests),
    Section(("scale",), host_rows.scale),
    Section(("live",), live_rows.live),
    Section(("fleet_growth",), growth_rows.growth),
    Section(("spawn",), host_rows.spawn, published=False),
)


def rendered(load: Load = harness.load_json) -> list[Rendered]:
    """Every published section, in order."""
    return [section.render(load) for section in SECTIONS if section.published]


def sections(names: Sequence[str], load: Load = harness.load_json) -> str:
    """The sections rendered from any of ``names``, published or not: what a program prints
    after writing its JSON."""
    chosen = [s for s in SECTIONS if set(s.reads) & set(names)]
    return "\n".join(text for s in chosen for text, _ in [s.render(load)] if text)
