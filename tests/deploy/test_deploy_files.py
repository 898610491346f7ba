"""The deployment files operators use as they are: the systemd unit, the install script, the
container image, the ECS task definition, the IAM policy and the DynamoDB table definition.

Each is checked against the code it deploys (console script, CLI, exit codes, default
shutdown_timeout and sink path, the store's DynamoDB calls and index), and with the real tool
where one is at hand: ``systemd-analyze verify``, ``shellcheck``, ``cfn-lint`` (each skipped
with a reason when absent), botocore's ECS API model, and moto's CloudFormation.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator
from helpers.deploy_files import (
    CFN_TEMPLATE,
    CONFIG_PATH,
    DEPLOY_DOC,
    DOCKERFILE,
    DOCKERIGNORE,
    DYNAMO_STORE,
    ECS_TASK,
    EXAMPLE_CONFIG,
    HEALTH_URL,
    IAM_POLICY,
    IMAGE_UID,
    INSTALL_SCRIPT,
    LAST_WILL,
    ROOT,
    SINK_DIR,
    TABLE_DOC,
    UNIT_FILE,
    VENV_BIN,
    console_script_name,
    docker_args,
    dockerfile_instructions,
)
from moto import mock_aws

from shard_worker.contract.pipe import SinkSpec
from supervisor import exit_codes
from supervisor.adapters.lease_store.dynamodb import (
    ROSTER_INDEX,
    DynamoLeaseStore,
    roster_index_definition,
)
from supervisor.adapters.lease_store.dynamodb.admin import (
    fleet_index_definition,
    successor_index_definition,
)
from supervisor.cli import main as cli_main
from supervisor.config.model import SupervisorConfig

DEFAULT_SHUTDOWN = SupervisorConfig().shutdown_timeout

# Data-plane calls of the store; CreateTable/UpdateTable only ever with create_table = true.
CONTROL_PLANE = {"dynamodb:CreateTable", "dynamodb:UpdateTable"}
NOT_API_CALLS = {"meta", "exceptions", "close", "can_paginate", "get_paginator", "get_waiter"}


# --- helpers ----------------------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: sections, repeated keys (all values kept, in order), comments,
    backslash continuations. configparser would keep only the last Environment=."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key)
    assert values is not None, f"{key}= is missing"
    assert len(values) == 1, f"{key}= is set {len(values)} times: {values}"
    return values[0]


def seconds(value: str) -> float:
    """A systemd time span as used in the unit ("30s", "2s", "10min")."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?", value)
    assert match, f"unsupported time span {value!r}"
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}[unit]


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT_FILE.read_text())


class _CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags: !Ref X -> {"Ref": X}, !GetAtt A.B ->
    {"Fn::GetAtt": "A.B"}, !Sub/!If/!Equals... -> {"Fn::<tag>": value}."""


def _cfn_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {"Ref": value} if suffix == "Ref" else {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    return yaml.load(CFN_TEMPLATE.read_text(), Loader=_CfnLoader)  # a SafeLoader subclass


@pytest.fixture(scope="module")
def iam_policy() -> dict[str, Any]:
    return json.loads(IAM_POLICY.read_text())


@pytest.fixture(scope="module")
def task_definition() -> dict[str, Any]:
    return json.loads(ECS_TASK.read_text())


def container(task_definition: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in task_definition["containerDefinitions"] if c["name"] == "shardvisor"]
    return found


def store_api_calls() -> dict[str, str]:
    """Every DynamoDB API the store or a child's last will calls: {method name: API operation
    name}. The store calls them by name through ``DynamoClient.request(op, "api", ...)``, the
    last will on boto3's ``client`` itself."""
    sources = [*sorted(DYNAMO_STORE.glob("*.py")), LAST_WILL]
    source = "\n".join(path.read_text() for path in sources)
    methods = set(re.findall(r"\.request\(\s*[^,()]+,\s*[\"']([a-z_]+)[\"']", source))
    methods |= set(re.findall(r"\bclient\.([a-z_]+)", source)) - NOT_API_CALLS
    methods |= set(re.findall(r"get_(?:paginator|waiter)\(\s*[\"']([a-z_]+)", source))
    # ... and any item API named in a string, however it reaches ``request`` (a variable).
    item_apis = r"[\"']((?:batch_|transact_)?(?:put|delete|update|get|write)_items?)[\"']"
    methods |= set(re.findall(item_apis, source))
    client = botocore.session.get_session().create_client("dynamodb", region_name="us-east-1")
    mapping = client.meta.method_to_api_mapping
    unknown = methods - mapping.keys()
    assert not unknown, f"not DynamoDB client methods (or add them to NOT_API_CALLS): {unknown}"
    return {method: mapping[method] for method in methods}


# --- the systemd unit -------------------------------------------------------------------------


def test_unit_sections_and_notify_contract(unit) -> None:
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert one(service, "Type") == "notify"
    assert one(service, "NotifyAccess") == "main"
    # sd_notify.py pings at half of WATCHDOG_USEC; systemd derives that from WatchdogSec=.
    assert seconds(one(service, "WatchdogSec")) == 30
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def test_unit_commands_match_the_cli(unit) -> None:
    service = unit["Service"]
    assert Path(VENV_BIN).name == console_script_name()
    assert one(service, "ExecStart") == f"{VENV_BIN} run -c {CONFIG_PATH}"
    pre = one(service, "ExecStartPre")
    # "-": RestartPreventExitStatus= looks at the main process only; `run` exits 78 itself.
    assert pre == f"-{VENV_BIN} check-config -c {CONFIG_PATH}"
    assert one(service, "ExecReload") == "/bin/kill -HUP $MAINPID"
    # The same argv, minus the binary, is what the CLI accepts: check-config of the example
    # passes, and `run` gets as far as reading its (missing) config file: exit 78, not usage 2.
    pre_args = shlex.split(pre.lstrip("-"))[1:]
    assert cli_main([*pre_args[:-1], str(EXAMPLE_CONFIG)]) == exit_codes.OK
    run_args = shlex.split(one(service, "ExecStart"))[1:]
    assert cli_main([*run_args[:-1], "/nonexistent/shardvisor.toml"]) == exit_codes.CONFIG


def test_unit_restart_policy_follows_the_exit_codes(unit) -> None:
    service = unit["Service"]
    assert one(service, "Restart") == "on-failure"
    restart_sec = seconds(one(service, "RestartSec"))
    assert restart_sec == 2
    prevented = one(service, "RestartPreventExitStatus").split()
    assert prevented == [str(exit_codes.CONFIG)]  # 78 only: 70 and 75 are restarted
    assert str(exit_codes.STORE_UNAVAILABLE) not in prevented
    assert str(exit_codes.INTERNAL) not in prevented
    # Exit 70 a few times in a row stops the unit: the burst is small, and a restart loop
    # (RestartSec plus a start-up of ~10 s) fits more than `burst` times into the interval.
    burst = int(one(unit["Unit"], "StartLimitBurst"))
    interval = seconds(one(unit["Unit"], "StartLimitIntervalSec"))
    assert 3 <= burst <= 10
    assert burst * (restart_sec + 10) < interval
    assert "StartLimitBurst" not in service  # ignored in [Service] by current systemd


def test_unit_stop_outlasts_the_drain(unit) -> None:
    service = unit["Service"]
    assert one(service, "KillMode") == "mixed"
    assert one(service, "KillSignal") == "SIGTERM"
    assert seconds(one(service, "TimeoutStopSec")) == 30
    assert seconds(one(service, "TimeoutStopSec")) > DEFAULT_SHUTDOWN
    assert "shutdown_timeout" in UNIT_FILE.read_text()  # the comment says why


def test_unit_user_paths_and_environment(unit) -> None:
    service = unit["Service"]
    assert one(service, "User") == "shardvisor"
    assert one(service, "Group") == "shardvisor"
    assert one(service, "WorkingDirectory") == SINK_DIR
    assert one(service, "StateDirectory") == "shardvisor"
    assert one(service, "ReadWritePaths") == SINK_DIR
    # The default sink path is relative: it lands in the working directory.
    assert not SinkSpec().path.startswith("/")
    assert one(service, "LimitNOFILE") == "65536"
    assert "PYTHONUNBUFFERED=1" in service["Environment"]
    assert one(service, "EnvironmentFile") == "-/etc/shardvisor/env"


HARDENING = {
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "NoNewPrivileges": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
}


@pytest.mark.parametrize(("key", "value"), sorted(HARDENING.items()))
def test_unit_hardening(unit, key: str, value: str) -> None:
    assert one(unit["Service"], key) == value


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("the systemd-analyze binary is not on PATH (Debian: apt-get install systemd)")
    true = shutil.which("true")
    assert true is not None
    # verify checks that every Exec*= binary exists: point ours at one that does.
    text = UNIT_FILE.read_text().replace(VENV_BIN, true)
    copy = tmp_path / "shardvisor.service"
    copy.write_text(text)
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    # Unknown keys and unparsable values are only warnings (exit 0): none is allowed.
    complaints = [line for line in result.stderr.splitlines() if "shardvisor" in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []


# --- the install script -----------------------------------------------------------------------


def test_install_script_syntax() -> None:
    assert INSTALL_SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in INSTALL_SCRIPT.read_text()
    assert os.access(INSTALL_SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(INSTALL_SCRIPT)], check=True, timeout=30)


def test_install_script_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("the shellcheck binary is not on PATH (Debian: apt-get install shellcheck)")
    result = subprocess.run(
        [shellcheck, str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A copy of what the script reads from its checkout, in a directory an unprivileged user
    can read (pytest's tmp_path is private to the user running the tests)."""
    with tempfile.TemporaryDirectory(prefix="shardvisor-install-") as directory:
        root = Path(directory)
        root.chmod(0o755)
        for name in ("scripts/install-systemd.sh", "conf/shardvisor.service", "pyproject.toml"):
            (root / name).parent.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, root / name)
        shutil.copy2(EXAMPLE_CONFIG, root / "conf" / EXAMPLE_CONFIG.name)
        (root / "supervisor").mkdir()
        for path in root.rglob("*"):
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        yield root


def run_unprivileged(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run as a non-root user: as we are, or, when the tests run as root, as uid 65534."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and the setpriv binary (util-linux) is not on PATH")
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", *argv]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_install_dry_run_needs_no_root_and_prints_the_plan(checkout: Path) -> None:
    prefix = checkout / "prefix"
    config = checkout / "absent" / "shardvisor.toml"
    script = checkout / "scripts" / "install-systemd.sh"
    argv = [str(script), "--dry-run", "--prefix", str(prefix), "--config", str(config)]
    result = run_unprivileged(argv, checkout)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"-m venv {prefix}/venv" in out
    assert f"{prefix}/venv/bin/python -m pip install" in out
    assert f"{checkout}/conf/shardvisor.example.toml {config}" in out  # absent: installed
    assert f"{prefix}/venv/bin/shardvisor check-config -c {config}" in out
    assert "/etc/systemd/system/shardvisor.service" in out
    assert "+ systemctl daemon-reload" in out
    # A config just made from the example is not started on: enable only, and say so.
    assert "+ systemctl enable shardvisor.service" in out
    assert "--now" not in out
    assert "edit it" in result.stderr
    assert not prefix.exists()  # nothing was run
    assert not config.exists()


def test_install_dry_run_with_an_existing_config_starts_the_service(checkout: Path) -> None:
    config = checkout / "shardvisor.toml"
    shutil.copy2(EXAMPLE_CONFIG, config)
    config.chmod(0o644)
    before = config.read_text()
    script = str(checkout / "scripts" / "install-systemd.sh")
    result = run_unprivileged([script, "--dry-run", "--config", str(config)], checkout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "+ systemctl enable --now shardvisor.service" in result.stdout
    assert f"shardvisor.example.toml {config}" not in result.stdout  # never overwritten
    assert f"keeping the existing {config}" in result.stderr
    assert "/opt/shardvisor/venv/bin/shardvisor check-config" in result.stdout  # default prefix
    assert config.read_text() == before

    no_start = run_unprivileged(
        [script, "--dry-run", "--no-start", "--config", str(config)], checkout
    )
    assert no_start.returncode == 0, no_start.stderr
    assert "+ systemctl enable shardvisor.service" in no_start.stdout
    assert "--now" not in no_start.stdout


def test_install_without_dry_run_refuses_non_root(checkout: Path) -> None:
    script = str(checkout / "scripts" / "install-systemd.sh")
    result = run_unprivileged([script, "--prefix", str(checkout / "p")], checkout)
    assert result.returncode != 0
    assert "must be run as root" in result.stderr
    assert result.stdout == ""  # refused before doing anything


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument: --bogus"),
        (["--prefix"], "--prefix needs a directory"),
        (["--prefix", "relative/dir"], "--prefix must be an absolute path"),
        (["--config", "/home/me/x.toml"], "ProtectHome=yes"),
    ],
)
def test_install_rejects_bad_arguments(checkout: Path, args: list[str], message: str) -> None:
    script = str(checkout / "scripts" / "install-systemd.sh")
    result = run_unprivileged([script, "--dry-run", *args], checkout)
    assert result.returncode != 0
    assert message in result.stderr


# --- the container image ----------------------------------------------------------------------


def test_dockerfile_multi_stage_non_root_tini() -> None:
    instructions = dockerfile_instructions()
    text = DOCKERFILE.read_text()
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in text
    froms = docker_args(instructions, "FROM")
    assert len(froms) >= 2 and all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    assert any("pip wheel" in args for args in docker_args(instructions, "RUN"))
    assert any("--from=build /opt/venv /opt/venv" in a for a in docker_args(instructions, "COPY"))
    users = docker_args(instructions, "USER")
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0] == IMAGE_UID
    assert any(f"--uid {IMAGE_UID}" in args for args in docker_args(instructions, "RUN"))
    assert any(
        re.search(r"apt-get install .*\btini\b", args) for args in docker_args(instructions, "RUN")
    )
    assert docker_args(instructions, "WORKDIR")[-1] == SINK_DIR
    assert json.loads(docker_args(instructions, "VOLUME")[-1]) == [SINK_DIR]
    assert any(
        args.split() == ["conf/shardvisor.example.toml", CONFIG_PATH]
        for args in docker_args(instructions, "COPY")
    )
    assert "PYTHONUNBUFFERED=1" in " ".join(docker_args(instructions, "ENV"))


def test_dockerfile_entrypoint_signal_and_healthcheck() -> None:
    instructions = dockerfile_instructions()
    # Exec form (JSON), so tini is PID 1 and SIGTERM reaches the supervisor, not a shell.
    entrypoint = json.loads(docker_args(instructions, "ENTRYPOINT")[-1])
    assert entrypoint == ["tini", "--", console_script_name()]
    assert json.loads(docker_args(instructions, "CMD")[-1]) == ["run", "-c", CONFIG_PATH]
    assert docker_args(instructions, "STOPSIGNAL") == ["SIGTERM"]
    (healthcheck,) = docker_args(instructions, "HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    assert HEALTH_URL in argv[2]


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (".venv", "node_modules", "out", ".git"):
        assert needed in patterns
    assert any("__pycache__" in p for p in patterns)
    # Nothing the Dockerfile copies from the context may be ignored.
    copied = []
    for args in docker_args(dockerfile_instructions(), "COPY"):
        if not args.startswith("--from"):
            copied += args.split()[:-1]
    for source in copied:
        assert (ROOT / source).exists(), source
        top = source.split("/")[0]
        assert top not in patterns and source not in patterns, f"{source} is in .dockerignore"


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok\n" if code == 200 else b"no\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


def run_health_probe(snippet: str, status: int) -> int:
    """The probe's exit code against a local server answering /healthz with ``status``."""
    handler = type("Handler", (_HealthHandler,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        probe = snippet.replace("127.0.0.1:9400", f"127.0.0.1:{port}")
        assert probe != snippet
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, timeout=30, check=False
        )
        return result.returncode
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_health_probe_exits_0_on_200_and_1_otherwise(task_definition) -> None:
    ecs_probe = container(task_definition)["healthCheck"]["command"]
    (healthcheck,) = docker_args(dockerfile_instructions(), "HEALTHCHECK")
    docker_probe = json.loads(healthcheck.partition(" CMD ")[2])
    assert ecs_probe[1:] == docker_probe  # one probe for both platforms
    snippet = docker_probe[2]
    assert run_health_probe(snippet, 200) == 0
    assert run_health_probe(snippet, 503) == 1


# --- the ECS task definition ------------------------------------------------------------------


def test_ecs_task_definition_matches_the_ecs_api_model(task_definition) -> None:
    model = botocore.session.get_session().get_service_model("ecs")
    shape = model.operation_model("RegisterTaskDefinition").input_shape
    report = ParamValidator().validate(task_definition, shape)
    assert not report.has_errors(), report.generate_report()


def test_ecs_task_definition_fargate_and_roles(task_definition) -> None:
    assert task_definition["requiresCompatibilities"] == ["FARGATE"]
    assert task_definition["networkMode"] == "awsvpc"
    assert (task_definition["cpu"], task_definition["memory"]) == ("512", "1024")
    assert "<account>" in task_definition["taskRoleArn"]
    assert "<account>" in task_definition["executionRoleArn"]
    c = container(task_definition)
    assert c["image"] == "<account>.dkr.ecr.<region>.amazonaws.com/shardvisor:latest"
    assert c["essential"] is True
    assert c["command"] == ["run", "-c", CONFIG_PATH]


def test_ecs_container_stops_gracefully(task_definition) -> None:
    c = container(task_definition)
    assert DEFAULT_SHUTDOWN + 5 <= c["stopTimeout"] <= 120  # Fargate's maximum is 120 s
    assert c["linuxParameters"]["initProcessEnabled"] is True
    assert c["ulimits"] == [{"name": "nofile", "softLimit": 65536, "hardLimit": 65536}]


def test_ecs_container_is_non_root_with_a_read_only_root(task_definition) -> None:
    c = container(task_definition)
    assert c["user"] == IMAGE_UID
    assert c["readonlyRootFilesystem"] is True
    (mount,) = c["mountPoints"]
    assert mount["containerPath"] == SINK_DIR and mount["readOnly"] is False
    assert mount["sourceVolume"] in {v["name"] for v in task_definition["volumes"]}


def test_ecs_health_check_and_logs(task_definition) -> None:
    c = container(task_definition)
    check = c["healthCheck"]
    assert check["command"][:3] == ["CMD", "python", "-c"]
    assert HEALTH_URL in check["command"][3]
    compile(check["command"][3], "<healthCheck>", "exec")
    # ECS's allowed ranges, and the probe must time out before ECS gives up on it.
    assert 5 <= check["interval"] <= 300 and 2 <= check["timeout"] <= 60
    assert 1 <= check["retries"] <= 10 and 0 <= check["startPeriod"] <= 300
    assert check["timeout"] < check["interval"]
    logs = c["logConfiguration"]
    assert logs["logDriver"] == "awslogs"
    assert logs["options"] == {
        "awslogs-group": "/ecs/shardvisor",
        "awslogs-region": "<region>",
        "awslogs-stream-prefix": "shardvisor",
        "awslogs-create-group": "true",
    }


# --- IAM --------------------------------------------------------------------------------------


def test_iam_policy_has_no_wildcard_action_or_resource(iam_policy) -> None:
    assert iam_policy["Version"] == "2012-10-17"
    for statement in iam_policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"]
        resources = statement["Resource"]
        actions = [actions] if isinstance(actions, str) else actions
        resources = [resources] if isinstance(resources, str) else resources
        assert all("*" not in action for action in actions), actions
        for resource in resources:
            assert resource != "*" and not resource.endswith(":*"), resource
            assert resource.startswith("arn:aws:dynamodb:<region>:<account>:table/shardvisor")
            assert resource.endswith(("table/shardvisor", "table/shardvisor/index/*"))


def test_iam_policy_allows_exactly_the_calls_of_the_store(iam_policy) -> None:
    used = {f"dynamodb:{api}" for api in store_api_calls().values()}
    by_sid = {s["Sid"]: set(s["Action"]) for s in iam_policy["Statement"]}
    allowed = set().union(*by_sid.values())
    assert used <= allowed, f"the store calls actions the policy denies: {used - allowed}"
    assert allowed <= used, f"allowed but never called (least privilege): {allowed - used}"
    (create_sid,) = [sid for sid, actions in by_sid.items() if actions == CONTROL_PLANE]
    assert "CreateTable" in create_sid  # says when it is needed
    data_plane = [s for s in iam_policy["Statement"] if s["Sid"] != create_sid]
    (data,) = data_plane
    assert any(r.endswith("/index/*") for r in data["Resource"])  # the roster query


# --- the table: CloudFormation, docs, code ----------------------------------------------------


def table_properties(cfn: dict[str, Any]) -> dict[str, Any]:
    (table,) = [r for r in cfn["Resources"].values() if r["Type"] == "AWS::DynamoDB::Table"]
    return table["Properties"]


def test_cfn_table_matches_the_code(cfn) -> None:
    assert cfn["Parameters"]["TableName"]["Default"] == "shardvisor"
    props = table_properties(cfn)
    assert props["TableName"] == {"Ref": "TableName"}
    assert props["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert props["AttributeDefinitions"] == [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "roster", "AttributeType": "S"},
    ]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["GlobalSecondaryIndexes"] == [roster_index_definition()]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["DeletionProtectionEnabled"] is True
    outputs = json.dumps(cfn["Outputs"])
    assert '{"Fn::GetAtt": "LeaseTable.Arn"}' in outputs


def cfn_policy_statements(cfn: dict[str, Any]) -> list[dict[str, Any]]:
    """The managed policy's statements with every !If taken on its true branch."""
    (policy,) = [r for r in cfn["Resources"].values() if r["Type"] == "AWS::IAM::ManagedPolicy"]
    statements = []
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        if "Fn::If" in statement:
            statement = statement["Fn::If"][1]
        statements.append(statement)
    return statements


def test_cfn_policy_has_the_statements_of_the_iam_policy(cfn, iam_policy) -> None:
    statements = cfn_policy_statements(cfn)
    assert {s["Sid"]: sorted(s["Action"]) for s in statements} == {
        s["Sid"]: sorted(s["Action"]) for s in iam_policy["Statement"]
    }
    resources = json.dumps([s["Resource"] for s in statements])
    assert '"Fn::GetAtt": "LeaseTable.Arn"' in resources
    assert "${LeaseTable.Arn}/index/*" in resources


def test_table_doc_matches_the_code() -> None:
    doc = TABLE_DOC.read_text()
    assert "conf/dynamodb-table.cfn.yaml" in doc
    (command,) = re.findall(r"aws dynamodb create-table .*?(?=\naws )", doc, flags=re.S)
    argv = shlex.split(command.replace("\\\n", " "))
    options = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert options["--table-name"] == "shardvisor"
    assert options["--billing-mode"] == "PAY_PER_REQUEST"
    assert options["--key-schema"] == "AttributeName=pk,KeyType=HASH"
    assert json.loads(options["--global-secondary-indexes"]) == [roster_index_definition()]
    assert "--deletion-protection-enabled" in argv
    assert "PointInTimeRecoveryEnabled=true" in doc
    assert f"`{ROSTER_INDEX}`" in doc and '`["id", "kind", "epoch", "successor"]`' in doc
    for value in ('roster = "worker"', 'roster = "vacant"', "`counter`"):
        assert value in doc


def test_table_doc_gives_protocol_2s_indexes_as_the_code_defines_them() -> None:
    doc = TABLE_DOC.read_text()
    for index in (fleet_index_definition(), successor_index_definition()):
        keys = index["KeySchema"]
        projected = json.dumps(index["Projection"]["NonKeyAttributes"])
        assert f"**`{index['IndexName']}`**: HASH `{keys[0]['AttributeName']}` (S)" in doc
        assert f"NonKeyAttributes `{projected}`" in doc


def test_docs_links_resolve() -> None:
    for doc in (DEPLOY_DOC, TABLE_DOC):
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if not target.startswith("http"):
                assert (doc.parent / target).resolve().exists(), f"{doc.name}: {target}"


def test_deploy_doc_states_the_exit_codes() -> None:
    doc = DEPLOY_DOC.read_text()
    for code in (exit_codes.OK, exit_codes.INTERNAL, exit_codes.STORE_UNAVAILABLE):
        assert f"| {code} |" in doc
    assert f"| {exit_codes.CONFIG} |" in doc
    assert "RestartPreventExitStatus=78" in doc and "StartLimitBurst" in doc


def test_cfn_lint() -> None:
    cfn_lint = shutil.which("cfn-lint")
    if cfn_lint is None:
        pytest.skip("the cfn-lint binary is not on PATH (pip install cfn-lint)")
    result = subprocess.run(
        [cfn_lint, "--format", "parseable", str(CFN_TEMPLATE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode & 0b11 == 0, result.stdout + result.stderr  # 1 fatal, 2 errors


async def test_cfn_template_deploys_and_the_store_accepts_the_table() -> None:
    """moto's CloudFormation deploys the template; the store then finds the table and its
    index as it needs them: with create_table = false it neither creates nor alters anything."""
    region, name = "us-east-1", "shardvisor-cfn-test"
    with mock_aws():
        cloudformation = boto3.client("cloudformation", region_name=region)
        cloudformation.create_stack(
            StackName="shardvisor-table",
            TemplateBody=CFN_TEMPLATE.read_text(),
            # moto cannot drop a list item through !If/AWS::NoValue (CloudFormation can, and
            # cfn-lint accepts it): deploy the variant whose !If keeps the statement.
            Parameters=[
                {"ParameterKey": "TableName", "ParameterValue": name},
                {"ParameterKey": "AllowTableManagement", "ParameterValue": "true"},
            ],
            Capabilities=["CAPABILITY_IAM"],
        )
        (stack,) = cloudformation.describe_stacks(StackName="shardvisor-table")["Stacks"]
        assert stack["StackStatus"] == "CREATE_COMPLETE"
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        assert outputs["TableArn"].endswith(f":table/{name}")

        table = boto3.client("dynamodb", region_name=region).describe_table(TableName=name)
        gsis = table["Table"]["GlobalSecondaryIndexes"]
        assert [(g["IndexName"], g["Projection"]) for g in gsis] == [
            (ROSTER_INDEX, roster_index_definition()["Projection"])
        ]
        iam = boto3.client("iam", region_name=region)
        policy = iam.get_policy(PolicyArn=outputs["PolicyArn"])["Policy"]
        version = iam.get_policy_version(
            PolicyArn=outputs["PolicyArn"], VersionId=policy["DefaultVersionId"]
        )
        document = version["PolicyVersion"]["Document"]
        if isinstance(document, str):
            document = json.loads(document)
        iam_policy = json.loads(IAM_POLICY.read_text())
        assert [(s["Sid"], s["Action"]) for s in document["Statement"]] == [
            (s["Sid"], s["Action"]) for s in iam_policy["Statement"]
        ]
        assert document["Statement"][0]["Resource"] == [
            outputs["TableArn"],
            f"{outputs['TableArn']}/index/*",
        ]
        store = DynamoLeaseStore(name, region)
        assert await store.ensure_table(False) is False
        assert set(store.request_counts) == {"ensure_table"}
