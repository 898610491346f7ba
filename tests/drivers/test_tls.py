"""wss:// feeds: certificates verified by default, a CA bundle option, and verify = false only
with a loud warning. A real TLS feed on 127.0.0.1 with a certificate from a test CA (trustme)."""

from __future__ import annotations

import json
import signal
import ssl
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio
import trustme
from helpers.feeds import start_feed
from helpers.fleet import start_supervisor, supervisor_toml
from helpers.worker_helpers import FAST_SETTINGS, make_start, read_records, spawn_worker, stop_in

from shard_worker.adapters.tls import client_tls_context
from shard_worker.contract.pipe import (
    VERIFY_OFF_WARNING,
    Checkpoint,
    Ready,
    Stopped,
    StreamSpec,
    WorkerSettings,
)
from supervisor.config.loading import ConfigError, load_document, parse_config
from supervisor.devtools.feed import FeedServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "test-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
async def wss_feed(ca: trustme.CA, nursery: trio.Nursery) -> AsyncIterator[tuple[FeedServer, str]]:
    """A feed serving wss:// with a certificate for 127.0.0.1 signed by the test CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    yield await start_feed(nursery, 500.0, ssl_context=context)


def tls_problem(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_document(tomllib.loads(text))
    (problem,) = caught.value.problems
    return problem


# --- Config -------------------------------------------------------------------------------------


def test_a_ca_bundle_must_be_a_readable_pem_file(tmp_path: Path, ca_file: Path) -> None:
    missing = tmp_path / "nope.pem"
    assert tls_problem(f'[tls]\nca_bundle = "{missing}"') == (
        f"tls.ca_bundle: no such file '{missing}' (a PEM file of CA certificates)"
    )
    assert tls_problem(f'[tls]\nca_bundle = "{tmp_path}"').startswith(
        f"tls.ca_bundle: '{tmp_path}' is a directory"
    )
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert "is not a PEM file of CA certificates" in tls_problem(f'[tls]\nca_bundle = "{junk}"')
    config = parse_config(tomllib.loads(f'[tls]\nca_bundle = "{ca_file}"\nverify = false'))
    assert (config.tls.ca_bundle, config.tls.verify) == (str(ca_file), False)


def test_the_client_context_verifies_unless_told_not_to(ca_file: Path) -> None:
    strict = client_tls_context(str(ca_file), verify=True)
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    assert any(c["subject"] for c in strict.get_ca_certs())  # the bundle was loaded
    loose = client_tls_context("", verify=False)
    assert loose.verify_mode == ssl.CERT_NONE and not loose.check_hostname


# --- A real child against a real wss:// feed ----------------------------------------------------


def spec(url: str) -> StreamSpec:
    return StreamSpec(id="a", url=url, sequence="seq")


async def run_until_written(url: str, tmp_path: Path, settings: WorkerSettings) -> str:
    """Start a child, wait for 100 records, stop it; returns its log."""
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path, settings=settings))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint, timeout=10, predicate=lambda c: c.checkpoint["a"] >= 100)
        await worker.send(stop_in())
        await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    return worker.log


@pytest.mark.slow
async def test_an_unknown_ca_is_refused_and_retried_and_nothing_is_written(
    wss_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = wss_feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path))  # verify on, system CAs
        await worker.expect(Ready)
        with trio.fail_after(5):  # at once: not after the connect timeout (2 s here)
            while worker.log.count("certificate verify failed") < 3:
                await trio.sleep(0.02)
        assert worker.process.returncode is None  # retried, never fatal
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert stopped.written == 0 and stopped.checkpoint == {}
    assert read_records(tmp_path / "shard-1" / "a.1.jsonl") == []
    assert "stream=a cannot connect to wss://127.0.0.1:" in worker.log
    assert "TLS handshake failed" in worker.log
    assert VERIFY_OFF_WARNING not in worker.log


@pytest.mark.slow
async def test_the_ca_bundle_is_trusted(
    wss_feed: tuple[FeedServer, str], tmp_path: Path, ca_file: Path
) -> None:
    _, url = wss_feed
    settings = attrs.evolve(FAST_SETTINGS, ca_bundle=str(ca_file))
    log = await run_until_written(url, tmp_path, settings)
    records = read_records(tmp_path / "shard-1" / "a.1.jsonl")
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert "connected to wss://127.0.0.1:" in log and "certificate" not in log


@pytest.mark.slow
async def test_verify_false_connects_and_says_so_loudly(
    wss_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = wss_feed
    log = await run_until_written(url, tmp_path, attrs.evolve(FAST_SETTINGS, verify_tls=False))
    assert len(read_records(tmp_path / "shard-1" / "a.1.jsonl")) >= 100
    assert f"WARNING shard=shard-1 stream=a {VERIFY_OFF_WARNING}" in log


@pytest.mark.slow
async def test_a_bundle_that_vanished_is_retried_not_a_crash(
    wss_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = wss_feed
    settings = attrs.evolve(FAST_SETTINGS, ca_bundle=str(tmp_path / "gone.pem"))
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path, settings=settings))
        await worker.expect(Ready)
        with trio.fail_after(5):
            while worker.log.count("cannot load the TLS settings (tls.ca_bundle)") < 2:
                await trio.sleep(0.02)
        assert worker.process.returncode is None


# --- A real supervisor ------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_supervisor_with_verify_false_warns_at_start_and_in_its_child(
    tmp_path: Path, moto_server, table_name: str, wss_feed: tuple[FeedServer, str]
) -> None:
    _, url = wss_feed
    stream = {"id": "a", "sequence": "seq", "url": url}
    config = tmp_path / "w1.toml"
    config.write_text(
        supervisor_toml(
            table_name,
            moto_server.url,
            [{"id": "t1", "streams": [stream]}],
            log={"level": "info"},
            tls={"verify": False},
        )
    )
    stderr = tmp_path / "stderr.log"
    proc = await start_supervisor(config, stdout=stderr, stderr=stderr)
    try:
        with trio.fail_after(30):
            while len(read_records(tmp_path / "out" / "t1" / "a.1.jsonl")) < 50:
                await trio.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            code = await proc.wait()
    assert code == 0
    events = [json.loads(line) for line in stderr.read_text().splitlines()]
    warnings = [e for e in events if e["event"] == VERIFY_OFF_WARNING]
    at_start, in_child = warnings[0], warnings[1]
    assert at_start["logger"] == "cli" and at_start["level"] == "warning"
    assert events.index(at_start) < 3  # before the supervisor does anything else
    assert in_child["logger"] == "child" and in_child["level"] == "warning"
    assert (in_child["shard"], in_child["stream"]) == ("t1", "a")
