"""Percentiles and summaries: one rule for every figure the benchmarks print or publish.

Nearest rank: the q-quantile of n samples is the ceil(q * n)-th smallest sample (counting from
1), a measured value, never an interpolation between two. So the p50 of an even count is the
lower of the two middle samples, and with fewer than 100 samples p99 is the largest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

SCALE = 10**6  # q is taken to 6 decimals, so that 0.99 * 300 is rank 297, not 298


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of ``values``; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = -(-round(q * SCALE) * len(ordered) // SCALE)  # ceil(q * n) in integers
    return ordered[min(len(ordered), max(1, rank)) - 1]


def summary(values: Iterable[float]) -> dict[str, float]:
    """Count, p50, p99, min and max: the shape every JSON file of the benchmarks keeps."""
    found = list(values)
    return {
        "n": len(found),
        "p50": percentile(found, 0.5),
        "p99": percentile(found, 0.99),
        "min": min(found) if found else math.nan,
        "max": max(found) if found else math.nan,
    }
