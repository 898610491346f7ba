"""The benchmark never rots: ``scripts/bench.sh --quick`` runs every part once and renders the
report with every row (figures from a smoke run mean nothing; the full run is not a test). And
the benchmarks stay one package: one percentile rule, no sys.path edits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
REPORT = ROOT / "out" / "bench" / "benchmarks.md"
TIMEOUT = 120.0
NO_PEER = 69  # bench.sh: a peer could not be installed (no package index reachable)
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


@pytest.mark.slow
def test_bench_quick_renders_every_row() -> None:
    with contextlib.suppress(FileNotFoundError):
        REPORT.unlink()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "bench.sh"), "--quick"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # on a timeout the whole run is stopped, not just bash
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the scripts stop what they started
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"bench.sh --quick ran over {TIMEOUT:g} s:\n{output.decode()[-6000:]}")
    text = output.decode(errors="replace")
    if proc.returncode == NO_PEER:
        pytest.skip(f"a peer could not be installed (no package index?):\n{text[-2000:]}")
    assert proc.returncode == 0, text[-6000:]
    report = REPORT.read_text()
    for heading in HEADINGS:
        assert heading in report, f"{heading!r} missing from {REPORT}"
    # The run's own output too: a part that measured nothing says why there.
    unmeasured = [line for line in report.splitlines() if "Not measured in this run" in line]
    logs = _part_logs() + "\n--- bench.sh:\n" + text[-4000:]
    assert unmeasured == [], "\n".join(unmeasured) + logs
    assert "quick smoke run" in report
    docs = ROOT / "docs" / "benchmarks.md"
    assert "quick smoke run" not in docs.read_text(), "a quick run must never be published"


def test_percentiles_are_nearest_rank() -> None:
    """The one rule of every published figure: the ceil(q * n)-th smallest sample, so p50 of an
    even count is the lower middle one and p99 of fewer than 100 samples is the largest."""
    probe = (
        "from benchmarks.stats import percentile as p; "
        "print(p([4, 1, 3, 2], 0.5), p(range(1, 64), 0.99), p(range(1, 301), 0.99), p([], 0.5))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(SCRIPTS)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert found.stdout.split() == ["2", "63", "297", "nan"]


def test_the_benchmarks_edit_no_sys_path() -> None:
    """Programs are modules run with ``python -m``; scripts/bench.sh sets PYTHONPATH."""
    offenders = [p for p in SCRIPTS.rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


def _part_logs() -> str:
    """Each part's own log (out/bench/*.log), the end of it: what a failure needs to be read."""
    found = []
    for path in sorted(REPORT.parent.glob("*.log")):
        found.append(f"\n--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}")
    return "".join(found)
