"""The live fleet page served at ``GET /``: one self-contained HTML document.

Inline CSS and JavaScript, no CDN, no build step: it works offline and behind any proxy. It
polls ``fleet`` (relative, so a path prefix in front of the endpoint still works) every
``REFRESH_MS`` and redraws its tables in place; the JSON it reads is
``core.fleet_view.fleet_document``. Rows carry ``data-*`` attributes (worker id and state,
shard id and owner) for scripts and for the browser test.
"""

from __future__ import annotations

REFRESH_MS = 1000

PAGE = (
    """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>shardvisor fleet</title>
<style>
  :root { --bg:#fbfbfa; --fg:#1d1f21; --dim:#6b7075; --line:#e3e4e6; --ok:#1f7a3a;
          --warn:#a36200; --bad:#b3261e; --head:#f0f1f2; }
  body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
         background: var(--bg); color: var(--fg); }
  header { padding: 12px 20px; border-bottom: 1px solid var(--line); display: flex;
           gap: 24px; align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  header span { color: var(--dim); }
  main { padding: 8px 20px 24px; }
  h2 { font-size: 15px; margin: 18px 0 6px; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
           vertical-align: top; white-space: nowrap; }
  th { background: var(--head); font-weight: 600; font-size: 12px; text-transform: uppercase;
       letter-spacing: .03em; color: var(--dim); }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; }
  .state { font-weight: 600; }
  .s-running, .s-ready { color: var(--ok); }
  .s-draining, .s-handing-off, .s-starting, .s-released, .s-retiring { color: var(--warn); }
  .s-dead, .s-quarantined, .s-lost, .s-stopped, .s-unowned { color: var(--bad); }
  .empty { color: var(--dim); font-style: italic; }
  #problem { color: var(--bad); font-weight: 600; }
</style>
</head>
<body>
<header>
  <h1>shardvisor fleet</h1>
  <span>answered by <b id="me">…</b></span>
  <span>this worker: <b id="my-state">…</b>, lease valid for <b id="my-lease">…</b></span>
  <span>updated <b id="updated">never</b></span>
  <span id="problem"></span>
</header>
<main>
  <h2>Workers</h2>
  <table id="workers"><thead><tr><th>Worker</th><th>State</th><th>Heartbeat age</th>
    <th>Host</th><th>Shards held</th><th>Standbys</th></tr></thead><tbody></tbody></table>
  <h2>Shards</h2>
  <table id="shards"><thead><tr><th>Shard</th><th>Owner</th><th>Epoch</th><th>State</th>
    <th>Checkpoint per stream</th><th>Lag (records)</th><th>Restarts</th><th>Quarantined</th>
    <th>Standbys</th></tr></thead><tbody></tbody></table>
  <h2>Message rates (per second, measured by this worker)</h2>
  <table id="rates"><thead><tr><th>Shard</th><th>Stream</th><th>Received</th><th>Written</th>
    <th>Gaps</th><th>Dead-lettered</th></tr></thead><tbody></tbody></table>
  <h2>Recent hand-offs and failovers (seen by this worker)</h2>
  <table id="events"><thead><tr><th>When</th><th>Kind</th><th>Shard</th><th>From</th>
    <th>To</th><th>Duration</th></tr></thead><tbody></tbody></table>
</main>
<script>
"use strict";
const REFRESH_MS = """
    + str(REFRESH_MS)
    + """;
const $ = (id) => document.getElementById(id);
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined || text === "" ? "-" : String(text);
  if (cls) td.className = cls;
  return td;
}
function pairs(obj) {
  if (!obj) return "-";
  const keys = Object.keys(obj);
  return keys.length ? keys.map((k) => k + "=" + obj[k]).join(" ") : "-";
}
function fill(id, rows, empty, columns) {
  const body = $(id).tBodies[0];
  const fresh = document.createElement("tbody");
  for (const row of rows) fresh.appendChild(row);
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(empty, "empty");
    td.colSpan = columns;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}
function row(data, cells) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(data)) tr.dataset[k] = v;
  for (const td of cells) tr.appendChild(td);
  return tr;
}
function draw(doc) {
  $("me").textContent = doc.worker;
  $("my-state").textContent = doc.local.state;
  $("my-lease").textContent = doc.local.lease_valid_for_s.toFixed(1) + " s";
  $("updated").textContent = new Date(doc.generated_at * 1000).toLocaleTimeString();
  document.body.dataset.generatedAt = doc.generated_at;
  fill("workers", doc.workers.map((w) => row({worker: w.id, state: w.state}, [
    cell(w.id, "mono"), cell(w.state, "state s-" + w.state),
    cell(w.heartbeat_age_s.toFixed(1) + " s", "num"), cell(w.host),
    cell(w.shards.join(", ")), cell(w.standbys.join(", ")),
  ])), "no workers in the table", 6);
  fill("shards", doc.shards.map((s) => row({shard: s.id, owner: s.owner || ""}, [
    cell(s.id, "mono"), cell(s.owner, "mono"), cell(s.epoch, "num"),
    cell(s.state, "state s-" + s.state), cell(pairs(s.checkpoint), "mono"),
    cell(pairs(s.lag), "mono"), cell(s.restarts, "num"), cell(s.quarantined ? "yes" : "no"),
    cell(s.standbys.join(", ")),
  ])), "no shards in the table", 9);
  const rates = [];
  for (const s of doc.shards) {
    for (const [stream, r] of Object.entries(s.rates)) {
      rates.push(row({shard: s.id, stream: stream}, [
        cell(s.id, "mono"), cell(stream, "mono"), cell(r.received, "num"),
        cell(r.written, "num"), cell(r.gaps, "num"), cell(r.dead_lettered, "num"),
      ]));
    }
  }
  fill("rates", rates, "no stream runs on this worker", 6);
  fill("events", doc.events.slice().reverse().map((e) => row({kind: e.kind, shard: e.shard}, [
    cell(new Date(e.at * 1000).toLocaleTimeString()), cell(e.kind), cell(e.shard, "mono"),
    cell(e.source, "mono"), cell(e.target || "any", "mono"),
    cell(e.seconds.toFixed(3) + " s", "num"),
  ])), "none since this worker started", 6);
}
async function refresh() {
  try {
    const response = await fetch("fleet", {cache: "no-store"});
    if (!response.ok) throw new Error("/fleet answered " + response.status);
    draw(await response.json());
    $("problem").textContent = "";
  } catch (err) {
    $("problem").textContent = "not updating: " + err.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
</script>
</body>
</html>
"""
).encode()

CONTENT_TYPE = "text/html; charset=utf-8"

__all__ = ["CONTENT_TYPE", "PAGE", "REFRESH_MS"]
