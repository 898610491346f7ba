"""``python -m benchmarks.report [--publish] [--run-seconds S] [--mode full|quick]``."""

from __future__ import annotations

import argparse
import sys

from benchmarks import harness
from benchmarks.report import document


def main() -> None:
    parser = argparse.ArgumentParser(description="Render out/bench/*.json as Markdown.")
    parser.add_argument("--publish", action="store_true", help="also write docs/benchmarks.md")
    parser.add_argument("--run-seconds", type=float, default=0.0)
    parser.add_argument("--mode", choices=("full", "quick"), default="")
    args = parser.parse_args()
    mode = args.mode
    if not mode:
        parts = ("fleet", "requests", "restart", "throughput", "memory", "scale")
        quick = any((harness.load_json(n) or {}).get("quick") for n in parts)
        mode = "quick" if quick else "full"
    if args.publish and mode == "quick":
        sys.exit("benchmarks.report: a quick run is never published to docs/benchmarks.md")
    text = document.render(mode, args.run_seconds or None)
    harness.OUT.mkdir(parents=True, exist_ok=True)
    (harness.OUT / "benchmarks.md").write_text(text)
    print(f"report: {(harness.OUT / 'benchmarks.md').relative_to(harness.ROOT)}")
    if args.publish:
        current = document.DOCS.read_text() if document.DOCS.exists() else ""
        document.DOCS.write_text(document.published(text, current))
        print(f"published: {document.DOCS.relative_to(harness.ROOT)}")


if __name__ == "__main__":
    main()
