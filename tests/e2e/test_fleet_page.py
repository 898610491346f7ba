"""The live fleet page (`GET /`, `GET /fleet`) and `status --watch`, with real supervisors.

Two supervisors on dynalite share the shards of helpers.fleet; then one host dies (SIGKILL
to its process group: supervisor, zygote and children, no last will) and the survivor's page
must show it without a reload. The browser test drives Debian's `chromium` (headless) over
the DevTools protocol with trio-websocket; without the binary it skips, naming it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from helpers import live_supervisor
from helpers.fleet import FAILOVER, SHARDS, Fleet, running_fleet, start_writing
from trio_websocket import open_websocket_url

pytestmark = pytest.mark.slow

_ENDPOINT = re.compile(r"HTTP endpoint on ([0-9.]+):([0-9]+)")
_DEVTOOLS = re.compile(rb"DevTools listening on (ws://[^\s]+)")


@pytest.fixture
async def two_workers(tmp_path, dynalite_server, table_name, nursery) -> AsyncIterator[Fleet]:
    """w1 and w2 writing every stream of helpers.fleet's shards, balanced."""
    async with running_fleet(
        nursery, tmp_path, dynalite_server.url, table_name, SHARDS, rate=100.0
    ) as fleet:
        await start_writing(fleet, "w1", "w2")
        yield fleet


async def endpoint(fleet: Fleet, worker: str) -> str:
    """http://HOST:PORT of the worker's HTTP endpoint (port 0 is logged at start)."""
    with trio.fail_after(10):
        while not (found := _ENDPOINT.search(fleet.log(worker))):
            await trio.sleep(0.05)
    return f"http://{found.group(1)}:{found.group(2)}"


async def http_get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET, off the event loop (helpers.live_supervisor's client)."""
    return await trio.to_thread.run_sync(live_supervisor.http_get, url)


async def fleet_json(base: str) -> dict[str, Any]:
    status, body = await http_get(base + "/fleet")
    assert status == 200, body
    return json.loads(body)


def kill_host(fleet: Fleet, worker: str) -> None:
    """SIGKILL to the worker's process group: no drain, no last will, a host gone."""
    os.killpg(fleet.procs[worker].pid, signal.SIGKILL)


def shard_owners(doc: dict[str, Any]) -> dict[str, str | None]:
    return {s["id"]: s["owner"] for s in doc["shards"]}


def all_moving(doc: dict[str, Any], worker: str) -> bool:
    """Every stream of the worker's shards is written at a positive rate."""
    rates = [r for s in doc["shards"] if s["owner"] == worker for r in s["rates"].values()]
    return bool(rates) and all(r["written"] > 0 and r["received"] > 0 for r in rates)


def failed_over(doc: dict[str, Any], dead: str, survivor: str) -> bool:
    states = {w["id"]: w["state"] for w in doc["workers"]}
    owners = {s["id"]: s["owner"] for s in doc["shards"]}
    return states.get(dead) == "dead" and set(owners.values()) == {survivor}


async def test_fleet_json_and_page_from_a_running_fleet(two_workers: Fleet) -> None:
    fleet = two_workers
    base = await endpoint(fleet, "w1")
    status, page = await http_get(base + "/")
    assert status == 200 and page.startswith(b"<!doctype html>")
    assert b"<script>" in page and b"http://" not in page and b"https://" not in page  # offline
    owners = await fleet.owners()
    with trio.fail_after(10):  # the page shows the table as of the supervisor's last rounds
        while shard_owners(doc := await fleet_json(base)) != owners:
            await trio.sleep(0.2)
    assert doc["worker"] == "w1"
    assert {w["id"] for w in doc["workers"]} == {"w1", "w2"}
    assert {s["id"] for s in doc["shards"]} == set(SHARDS)
    mine = [s for s in doc["shards"] if s["owner"] == "w1"]
    assert mine and all(s["lag"] is not None and s["restarts"] == 0 for s in mine)
    assert all(s["lag"] is None for s in doc["shards"] if s["owner"] == "w2")
    with trio.fail_after(10):  # rates: from the second document on (one a second at most)
        while not all_moving(doc := await fleet_json(base), "w1"):
            await trio.sleep(0.3)
    before = await fleet.owners()
    kill_host(fleet, "w2")
    with trio.fail_after(FAILOVER + 5):
        while not failed_over(doc := await fleet_json(base), "w2", "w1"):
            await trio.sleep(0.2)
    events = [e for e in doc["events"] if e["kind"] == "failover"]
    assert {e["shard"] for e in events} == {s for s, owner in before.items() if owner == "w2"}
    assert all(e["source"] == "w2" and e["target"] == "w1" and e["seconds"] > 0 for e in events)


# --- status --watch ---------------------------------------------------------------------------


async def test_status_watch_redraws_the_table_every_second(
    tmp_path, dynalite_server, table_name, nursery
) -> None:
    async with running_fleet(
        nursery, tmp_path, dynalite_server.url, table_name, SHARDS, rate=50.0
    ) as fleet:
        await start_writing(fleet, "w1")
        out = tmp_path / "watch.out"
        with out.open("wb") as sink:
            # Started with SIGINT ignored, as a shell starts a background job (and as the
            # suite's processes are when it runs in the background): Ctrl-C still ends it.
            command = f"{shlex.quote(sys.executable)} -m supervisor status --watch -c w1.toml"
            watch = await trio.lowlevel.open_process(
                ["sh", "-c", f"trap '' INT; exec {command}"],
                cwd=fleet.workdir,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
            )
        try:
            with trio.fail_after(30):  # a start and three reads of the table, on a busy host
                while len(watch_screens(out)) < 4:  # three whole screens, a fourth begun
                    await trio.sleep(0.1)
            watch.send_signal(signal.SIGINT)  # Ctrl-C: the way a watch ends
            with trio.fail_after(10):
                await watch.wait()
        finally:
            if watch.returncode is None:
                watch.kill()
                await watch.wait()
        assert watch.returncode == 0, out.read_text()
        screens = watch_screens(out)[:3]
        stamps = [re.search(r"(\d\d:\d\d:\d\d)\n", screen).group(1) for screen in screens]
        assert stamps == sorted(set(stamps)), stamps  # one redraw a second at most
        for screen in screens:
            assert "WORKER" in screen and re.search(r"^w1 +running", screen, flags=re.M)
            for shard in SHARDS:
                assert re.search(rf"^{shard} +w1 ", screen, flags=re.M), screen


def watch_screens(out: Path) -> list[str]:
    """What `status --watch` drew, screen by screen (each starts by clearing the terminal)."""
    return out.read_text().split("\x1b[H\x1b[2J")[1:]


# --- in a real browser ------------------------------------------------------------------------

PAGE_VIEW = """JSON.stringify({
  workers: [...document.querySelectorAll("#workers tbody tr[data-worker]")]
    .map((r) => [r.dataset.worker, r.dataset.state]),
  shards: [...document.querySelectorAll("#shards tbody tr[data-shard]")]
    .map((r) => [r.dataset.shard, r.dataset.owner]),
  events: [...document.querySelectorAll("#events tbody tr[data-kind]")]
    .map((r) => [r.dataset.kind, r.dataset.shard]),
  marker: window.__marker || null,
  problem: document.getElementById("problem").textContent,
})"""


CHROMIUM = shutil.which("chromium")
# Decided before the test starts: a skip raised inside a trio test loses its reason.
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="the chromium binary is not on PATH (Debian: apt-get install chromium)",
)


def chromium_binary() -> str:
    assert CHROMIUM is not None, "tests that start Chromium are marked NEEDS_CHROMIUM"
    return CHROMIUM


def chromium_argv(binary: str, profile: Path, *more: str) -> list[str]:
    argv = [binary, "--headless", "--disable-gpu", f"--user-data-dir={profile}", *more]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses root without it (CI containers)
    return argv


@asynccontextmanager
async def headless_chromium(workdir: Path) -> AsyncIterator[str]:
    """A headless Chromium with the DevTools protocol on a free port; yields its HTTP base
    (``/json/list`` names the page's websocket). Terminated and reaped on exit."""
    log = workdir / "chromium.log"
    argv = chromium_argv(chromium_binary(), workdir / "profile", "--remote-debugging-port=0")
    with log.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            [*argv, "about:blank"], stdin=subprocess.DEVNULL, stdout=err, stderr=err
        )
    try:
        with trio.fail_after(30):
            while not (found := _DEVTOOLS.search(log.read_bytes())):
                await trio.sleep(0.1)
        yield re.sub(r"^ws://([^/]+)/.*$", r"http://\1", found.group(1).decode())
    finally:
        proc.terminate()
        with trio.move_on_after(5):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class DevTools:
    """Calls over one page's DevTools websocket (no events enabled: replies only)."""

    def __init__(self, ws) -> None:
        self.ws, self.calls = ws, 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        await self.ws.send_message(
            json.dumps({"id": self.calls, "method": method, "params": params})
        )
        with trio.fail_after(10):
            while True:
                reply = json.loads(await self.ws.get_message())
                if reply.get("id") == self.calls:
                    assert "error" not in reply, reply
                    return reply["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def view(self) -> dict[str, Any]:
        return json.loads(await self.evaluate(PAGE_VIEW))


async def wait_view(page: DevTools, done, timeout: float) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while not done(view := await page.view()):
            await trio.sleep(0.2)
    return view


@NEEDS_CHROMIUM
async def test_the_page_in_headless_chromium_follows_a_host_death_without_reload(
    two_workers: Fleet, tmp_path
) -> None:
    fleet = two_workers
    base = await endpoint(fleet, "w1")
    async with headless_chromium(tmp_path) as devtools:
        _, listing = await http_get(devtools + "/json/list")
        (target,) = [t for t in json.loads(listing) if t["type"] == "page"]
        async with open_websocket_url(target["webSocketDebuggerUrl"]) as ws:
            page = DevTools(ws)
            await page.call("Page.navigate", url=base + "/")
            with trio.fail_after(15):  # navigate answers before the page has loaded
                while not await page.evaluate("!!document.getElementById('shards')"):
                    await trio.sleep(0.1)
            before = await fleet.owners()  # balanced: each worker holds two
            view = await wait_view(page, lambda v: dict(v["shards"]) == before, 15)
            assert sorted(view["workers"]) == [["w1", "running"], ["w2", "running"]]
            await page.evaluate("window.__marker = 'same page'")  # gone if the page reloads
            kill_host(fleet, "w2")
            view = await wait_view(
                page,
                lambda v: (
                    ["w2", "dead"] in v["workers"] and {owner for _, owner in v["shards"]} == {"w1"}
                ),
                FAILOVER + 8,
            )
            assert view["marker"] == "same page" and view["problem"] == ""
            moved = {shard for shard, owner in before.items() if owner == "w2"}
            view = await wait_view(page, lambda v: len(v["events"]) >= len(moved), 5)
            assert {shard for kind, shard in view["events"] if kind == "failover"} == moved
        if screenshot := os.environ.get("SHARDVISOR_SCREENSHOT"):
            # How docs/fleet-page.png is refreshed: this test with the variable set.
            argv = chromium_argv(chromium_binary(), tmp_path / "shot-profile")
            argv += [f"--screenshot={screenshot}", "--window-size=1280,860"]
            argv += ["--virtual-time-budget=3000", "--hide-scrollbars", base + "/"]
            await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
