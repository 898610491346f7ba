"""What a process costs, from /proc (Linux): its memory and its CPU time so far."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pss_kib(pid: int) -> int:
    """Proportional set size: shared pages split between their users (what a child costs)."""
    return _field(f"/proc/{pid}/smaps_rollup", "Pss:")


def rss_kib(pid: int) -> int:
    return _field(f"/proc/{pid}/status", "VmRSS:")


def cpu_seconds(pid: int) -> float:
    """utime + stime so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _field(path: str, name: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    raise RuntimeError(f"no {name} line in {path}")
