"""What the deployment tests share (tests/deploy/): where each file operators use lives in the
repository, the paths the image and the install put things at, and readers for the Dockerfile
and the console script that more than one test file checks a manifest against."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF, DOCS = ROOT / "conf", ROOT / "docs"
UNIT_FILE = CONF / "shardvisor.service"
INSTALL_SCRIPT = ROOT / "scripts" / "install-systemd.sh"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ECS_TASK = CONF / "ecs-task-definition.json"
CFN_TEMPLATE = CONF / "dynamodb-table.cfn.yaml"
EXAMPLE_CONFIG = CONF / "shardvisor.example.toml"
K8S_DIR = CONF / "kubernetes"
ALERTS = CONF / "prometheus-alerts.yml"
DASHBOARD = CONF / "grafana-dashboard.json"
IAM_POLICY = DOCS / "iam-policy.json"
TABLE_DOC = DOCS / "dynamodb-table.md"
DEPLOY_DOC = DOCS / "deploy.md"
BENCHMARKS_DOC = DOCS / "benchmarks.md"
DYNAMO_STORE = ROOT / "supervisor" / "adapters" / "lease_store" / "dynamodb"  # a package
LAST_WILL = ROOT / "shard_worker" / "adapters" / "last_will.py"  # a child's two writes

VENV_BIN = "/opt/shardvisor/venv/bin/shardvisor"
CONFIG_PATH = "/etc/shardvisor/shardvisor.toml"
SINK_DIR = "/var/lib/shardvisor"
HEALTH_URL = "http://127.0.0.1:9400/healthz"
IMAGE_UID = "10001"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line:
            keyword, _, args = line.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    return instructions


def docker_args(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def console_script_name() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (name,) = [name for name, target in scripts.items() if target == "supervisor.cli:main"]
    return name
