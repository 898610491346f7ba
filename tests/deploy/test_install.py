"""The production install stays lean: a plain `pip install` pulls no development tool (moto and its
server stack are the `demo` extra), and every package the product imports is declared."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from supervisor import exit_codes
from supervisor.cli import DEMO_NEEDS_MOTO

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("supervisor", "shard_worker")
DEVTOOLS = ROOT / "supervisor" / "devtools"
# Development tools that must never reach a production host or the container image.
DEV_ONLY = {"moto", "werkzeug", "flask", "flask-cors", "pytest", "hypothesis", "docker"}


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _plain_closure() -> set[str]:
    """Every distribution a plain install of shardvisor brings in, read from the metadata of
    the installed packages (no network): the requirements without extras, recursively."""
    seen: set[str] = set()
    todo = ["shardvisor"]
    while todo:
        dist = todo.pop()
        if _name(dist) in seen:
            continue
        seen.add(_name(dist))
        for line in metadata.requires(dist) or ():
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's requirement, or one for another platform
            todo.append(req.name)
    return seen - {"shardvisor"}


def _product_modules() -> list[Path]:
    return [
        path
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if DEVTOOLS not in path.parents
    ]


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_a_plain_install_holds_no_development_tool() -> None:
    closure = _plain_closure()
    assert {"boto3", "trio", "trio-websocket", "attrs", "prometheus-client", "h11"} <= closure
    assert not closure & DEV_ONLY, f"a plain install pulls {sorted(closure & DEV_ONLY)}"


def test_every_package_the_product_imports_is_declared() -> None:
    declared = {
        _name(Requirement(line).name)
        for line in metadata.requires("shardvisor") or ()
        if "extra ==" not in line
    }
    providers = metadata.packages_distributions()  # import name -> distributions
    undeclared = {}
    for path in _product_modules():
        for module in _top_level_imports(path):
            if module in PRODUCT or module in sys.stdlib_module_names:
                continue
            dists = {_name(d) for d in providers.get(module, [module])}
            # botocore comes with boto3, whose API it is (the error classes, the config).
            if not dists & declared and not (module == "botocore" and "boto3" in declared):
                undeclared.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not declared: {undeclared}"


def test_the_product_imports_devtools_only_lazily() -> None:
    """Only a command that needs a dev tool imports it, inside the function that runs it."""
    offenders = []
    for path in _product_modules():
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "supervisor.devtools"
            ):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_demo_without_moto_says_what_to_install_and_exits_69() -> None:
    probe = (
        "import sys; sys.modules['moto'] = None\n"
        "from supervisor.cli import main\n"
        "sys.exit(main(['demo']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == exit_codes.UNAVAILABLE == 69
    assert result.stderr.strip() == DEMO_NEEDS_MOTO
    assert "pip install 'shardvisor[demo]'" in result.stderr


def test_only_the_demo_installs_the_demo_extra() -> None:
    assert '-e ".[demo]"' in (ROOT / "scripts" / "demo.sh").read_text()
    for production in ("Dockerfile", "scripts/install-systemd.sh"):
        text = (ROOT / production).read_text()
        assert "[demo]" not in text and "moto" not in text, production
