"""The rings, checked on the source: pure cores import no I/O, the child never imports the
supervisor, the shared contract needs neither trio-websocket nor the supervisor.

Read with ``ast`` (nothing is imported), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules a pure core must not import: clocks, processes, sockets, randomness, the event loop
# and the AWS SDK. Randomness and time come in as parameters (an rng, ``now``).
IO_MODULES = frozenset(
    {"trio", "trio_websocket", "boto3", "botocore", "time", "os", "socket", "subprocess", "random"}
)
CORES = ("supervisor/core", "shard_worker/core")
# The last will (shard_worker/drivers/worker.py) still reaches into the supervisor's DynamoDB
# adapter; issue 13 moves its conditional release into shard_worker/contract.


def sources(folder: str) -> Iterator[Path]:
    yield from sorted((ROOT / folder).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def under(name: str, packages: frozenset[str] | set[str]) -> bool:
    return name.split(".")[0] in packages


def offences(folder: str, banned: set[str] | frozenset[str]) -> dict[str, list]:
    found = {}
    for path in sources(folder):
        rel = path.relative_to(ROOT).as_posix()
        bad = sorted(n for n in imported(path) if under(n, banned))
        if bad:
            found[rel] = bad
    return found


def test_the_rule_sees_imports_of_every_kind(tmp_path):
    code = ["import os.path", "from time import monotonic", "def f():", "    import trio"]
    (tmp_path / "m.py").write_text("\n".join([*code, "from . import x", ""]))
    assert imported(tmp_path / "m.py") == {"os.path", "time", "trio"}


@pytest.mark.parametrize("core", CORES)
def test_pure_cores_import_no_io(core):
    assert list(sources(core)), f"no sources under {core}"
    assert offences(core, IO_MODULES) == {}


def test_supervisor_cores_import_no_adapter_or_driver():
    rings = {"supervisor.adapters", "supervisor.drivers", "supervisor.devtools", "supervisor.cli"}
    found = {
        path.relative_to(ROOT).as_posix(): sorted(
            n for n in imported(path) if any(n == r or n.startswith(r + ".") for r in rings)
        )
        for path in sources("supervisor/core")
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_the_child_never_imports_the_supervisor():
    """Its last will included: it runs on the table contract (shard_worker/contract/table.py)."""
    assert offences("shard_worker", {"supervisor"}) == {}


def test_the_shared_contract_needs_neither_trio_websocket_nor_the_supervisor():
    assert offences("shard_worker/contract", {"trio_websocket", "supervisor"}) == {}
