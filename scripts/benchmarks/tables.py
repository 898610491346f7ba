"""Markdown tables and their cells: the one renderer of every table the benchmarks print or publish.

A program prints the report's sections for what it measured (``benchmarks.report.sections``),
and the report renders them again from the same JSON: one table per measurement, written once.
"""

# ruff: noqa: RUF001, RUF002 - the cells use typographic signs on purpose
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

LEFT, RIGHT = "-", ">"  # column alignments: ``align="-->"`` is left, left, right


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown table; ``align`` has one LEFT or RIGHT per column (default: all LEFT)."""
    marks = (align or LEFT * len(header)).ljust(len(header), LEFT)
    lines = [_line(header), "|" + "|".join("---:" if m == RIGHT else "---" for m in marks) + "|"]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)


def _line(cells: Sequence[object]) -> str:
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def s(value: Any, digits: int = 2) -> str:
    """Seconds: ``1.23 s``."""
    return "—" if missing(value) else f"{value:.{digits}f} s"


def ms(value: Any) -> str:
    """Seconds shown in milliseconds: ``449 ms``, ``20.6 ms`` below 0.1 s."""
    if missing(value):
        return "—"
    return f"{value * 1e3:.0f} ms" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def mib(value: Any) -> str:
    return "—" if missing(value) else f"{value:.1f} MiB"


def count(value: Any) -> str:
    """A rate or a count with thousands separators: ``52,001``."""
    return "—" if missing(value) else f"{value:,.0f}"


def ratio(a: Any, b: Any) -> str:
    """``a ÷ b`` as ``0.96×``."""
    if missing(a) or missing(b) or not b:
        return "—"
    return f"{a / b:.2f}×"


def lat(found: dict[str, Any] | None, fmt: Callable[[Any], str] = s) -> str:
    """``p50 · p99`` of a ``stats.summary``."""
    if not found or not found.get("n"):
        return "—"
    return f"{fmt(found['p50'])} · {fmt(found['p99'])}"
