"""The command line as users call it: real subprocesses, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shardvisor(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd or REPO,
        check=False,
    )


def test_bad_config_exits_78_with_one_line_per_problem_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[lease]\nduration = "10s"\nheartbeat_interval = "5s"\n[dynamodb]\ntabel = 1\n')
    for command in ("run", "check-config", "status", "init-table"):
        result = shardvisor(command, "-c", str(bad))
        assert result.returncode == 78, (command, result.stderr)
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert f"{bad}: dynamodb.tabel: unknown key (did you mean 'table'?)" in lines
        assert any(
            "lease.heartbeat_interval: must be at most lease.duration / 3" in ln for ln in lines
        )


def test_toml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[lease]\nduration = "10s"\nthis is not toml\n')
    result = shardvisor("check-config", "-c", str(bad))
    assert result.returncode == 78
    assert "line 3" in result.stderr and "Traceback" not in result.stderr


def test_missing_config_file_exits_78(tmp_path):
    result = shardvisor("check-config", "-c", str(tmp_path / "nope.toml"))
    assert result.returncode == 78
    assert result.stderr.count("nope.toml") == 1


def test_check_config_prints_the_effective_config_which_loads_again(tmp_path):
    result = shardvisor("check-config", "-c", "conf/shardvisor.example.toml")
    assert result.returncode == 0, result.stderr
    effective = tmp_path / "effective.toml"
    effective.write_text(result.stdout)
    again = shardvisor("check-config", "-c", str(effective))
    assert again.returncode == 0 and again.stdout == result.stdout


def test_init_table_and_status_against_a_real_server(tmp_path, ddb_url, table_name):
    config = tmp_path / "c.toml"
    config.write_text(
        f'[dynamodb]\ntable = "{table_name}"\nendpoint_url = "{ddb_url}"\n'
        '[[shards]]\nid = "s1"\n[[shards.streams]]\nid = "a"\nurl = "ws://127.0.0.1:1/x"\n'
    )
    first = shardvisor("init-table", "-c", str(config))
    assert first.returncode == 0, first.stderr
    assert "created" in first.stdout
    assert "already exists" in shardvisor("init-table", "-c", str(config)).stdout
    status = shardvisor("status", "-c", str(config), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"workers": [], "shards": []}


def test_status_on_an_unreachable_store_exits_75(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[dynamodb]\nendpoint_url = "http://127.0.0.1:9"\n')
    result = shardvisor("status", "-c", str(config))
    assert result.returncode == 75
    assert "Traceback" not in result.stderr


def test_run_exits_75_when_the_store_stays_unreachable_at_start(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[dynamodb]\nendpoint_url = "http://127.0.0.1:9"\n'
        '[lease]\nduration = "1s"\nheartbeat_interval = "250ms"\nreconcile_interval = "250ms"\n'
    )
    result = shardvisor("run", "-c", str(config))
    assert result.returncode == 75, result.stderr
    assert "lease store unreachable at start-up" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_child_imports_neither_boto3_nor_the_supervisor():
    probe = (
        "import sys, shard_worker.drivers.worker, shard_worker.__main__;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'supervisor')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
