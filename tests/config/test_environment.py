"""Validation has no side effect; the checks against this host (the CA bundle parses, the
handler imports) run in load_config, after it, and their problems are reported with the
others: one line each, naming the key, exit 78 at the command line."""

from __future__ import annotations

import builtins
import importlib
import io
import os
import pathlib
import ssl
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trustme

from supervisor.config.loading import ConfigError, load_config, load_document, parse_config

REPO = Path(__file__).resolve().parents[2]
HANDLER_DIR = REPO / "conf"


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def document(ca_bundle: str, handler: str = "no_such_module_xyz:handle", extra: str = "") -> dict:
    return tomllib.loads(
        f'[sink]\nkind = "handler"\nhandler = "{handler}"\n[tls]\nca_bundle = "{ca_bundle}"\n'
        + extra
    )


def problems(data: dict, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_document(data, environ=environ)
    return caught.value.problems


def _refuse(name: object, *args: object, **kwargs: object) -> None:
    raise AssertionError(f"validation must not open or import anything (got {name})")


def test_parse_config_opens_no_file_and_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = document(str(tmp_path / "missing.pem"), extra='[log]\nlevel = "debug"\n')
    with monkeypatch.context() as patch:
        for owner, name in (
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (pathlib.Path, "open"),
            (importlib, "import_module"),
            (ssl, "create_default_context"),
            (builtins, "__import__"),  # last: monkeypatch imports while it patches
        ):
            patch.setattr(owner, name, _refuse)
        config = parse_config(data)
        with pytest.raises(ConfigError) as caught:
            parse_config({**data, "log": {"level": "loud"}})  # and still finds problems
    assert (config.sink.handler, config.log.level) == ("no_such_module_xyz:handle", "debug")
    assert caught.value.problems == [
        "log.level: must be one of debug, info, warning, error (got 'loud')"
    ]


def test_load_reports_the_host_problems_with_the_others_in_file_order(tmp_path: Path) -> None:
    data = document(str(tmp_path / "missing.pem"), extra='[log]\nlevel = "loud"\n')
    data["dynamodb"] = {"tabel": "x"}
    assert problems(data) == [
        "dynamodb.tabel: unknown key (did you mean 'table'?)",
        "sink.handler: cannot import module 'no_such_module_xyz': No module named"
        " 'no_such_module_xyz' (is its directory on PYTHONPATH?)",
        "log.level: must be one of debug, info, warning, error (got 'loud')",
        f"tls.ca_bundle: no such file '{tmp_path / 'missing.pem'}' (a PEM file of CA certificates)",
    ]


def test_a_good_ca_bundle_and_handler_load(ca_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HANDLER_DIR))
    config = load_document(document(str(ca_file), "example_handler:handle"))
    assert (config.tls.ca_bundle, config.sink.handler) == (str(ca_file), "example_handler:handle")


def test_a_handler_key_of_another_kind_is_not_imported(tmp_path: Path) -> None:
    """Only the kind's problem is reported: the key is not used, so nothing is imported."""
    data = tomllib.loads('[sink]\nhandler = "no_such_module_xyz:handle"\n')
    assert problems(data) == [
        "sink.handler: applies only to kind = handler (this sink is 'jsonl'); remove it or"
        " change sink.kind"
    ]


def test_a_ca_bundle_from_the_environment_is_never_shown(tmp_path: Path) -> None:
    secret = str(tmp_path / "secret-ca-location.pem")
    data = tomllib.loads('[tls]\nca_bundle = "${CA}"\n')
    assert problems(data, {"CA": secret}) == [
        "tls.ca_bundle: no such file '***' (a PEM file of CA certificates)"
    ]


def test_no_host_check_of_a_value_that_could_not_be_substituted() -> None:
    data = tomllib.loads('[tls]\nca_bundle = "${CA}"\n')
    assert problems(data, {}) == ["tls.ca_bundle: environment variable CA is not set"]


def test_load_config_runs_the_host_checks(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[tls]\nca_bundle = "{tmp_path}"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.problems == [
        f"tls.ca_bundle: '{tmp_path}' is a directory, not a PEM file of CA certificates"
    ]
    assert caught.value.source == str(path)


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_the_command_line_prints_every_problem_and_exits_78(tmp_path: Path, command: str) -> None:
    config = tmp_path / "bad.toml"
    missing = tmp_path / "missing.pem"
    config.write_text(
        '[sink]\nkind = "handler"\nhandler = "no_such_module_xyz:handle"\n'
        f'[log]\nlevel = "loud"\n[tls]\nca_bundle = "{missing}"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", command, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{config}: sink.handler: cannot import module 'no_such_module_xyz': No module named"
        " 'no_such_module_xyz' (is its directory on PYTHONPATH?)",
        f"{config}: log.level: must be one of debug, info, warning, error (got 'loud')",
        f"{config}: tls.ca_bundle: no such file '{missing}' (a PEM file of CA certificates)",
    ]
