"""What every section of the report shares: its heading, the quick-run mark, "not measured"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Load = Callable[[str], dict[str, Any] | None]  # out/bench/<name>.json, None when missing
SummaryRow = tuple[str, str, str, str, str]  # row, shardvisor, peer, ratio, trials
Rendered = tuple[str, list[SummaryRow]]  # a section's Markdown, its rows of the summary

HEADINGS = (
    "## 1. Failover after SIGKILL",
    "## 2. Graceful hand-off on SIGTERM",
    "## 3. Child crash → writing again",
    "## 4. Throughput per child",
    "## 5. Memory per host",
    "## 6. DynamoDB requests per worker-minute",
    "## 7. Scale on one host",
    "## 8. Nothing lost on a live-only feed",
    "## 9. DynamoDB work per worker as the fleet grows",
)


def heading(row: int, data: dict[str, Any] | None) -> str:
    """Row ``row``'s heading, marked when its figures come from a quick smoke run."""
    quick = " **(quick smoke run: not a measurement)**" if data and data.get("quick") else ""
    return HEADINGS[row - 1] + quick + "\n"


def not_measured(why: str) -> str:
    return f"_Not measured in this run ({why})._\n"
