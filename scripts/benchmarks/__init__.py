"""shardvisor's benchmarks: small programs over shared harness parts.

Run from the repository root with ``scripts/`` on the module path (scripts/bench.sh runs them all
and sets it)::

    PYTHONPATH=scripts .venv/bin/python -m benchmarks.<program> [--quick] ...

Harness parts: ``stats`` (the one percentile rule), ``tables`` (the one Markdown table renderer),
``harness`` (results, run facts, lanes side by side), ``fleets`` (fleets of real supervisors on
``supervisor.devtools.fleet``, servers of ``supervisor.devtools.servers``), ``procfs`` (memory
and CPU of a process), ``report`` (out/bench/*.json as the document docs/benchmarks.md).

Programs, each writing out/bench/<name>.json: ``fleet`` (rows 1, 2 with the timer-bound peers
side by side), ``dynamodb_requests`` (row 6), ``restart`` (row 3), ``throughput`` (row 4), ``scale``
(rows 5, 7), ``live`` (row 8), ``fleet_growth`` (row 9), ``spawn`` (not in the one command);
``peers`` holds what runs the peers. Pure parts with unit tests (tests/bench/): ``wire_billing``
(the counting proxy's read and write units), ``lease_cost`` (the lease cost model).

A new benchmark is one module: measure with the harness parts, ``harness.recorded(name)`` for its
JSON, a section in ``report`` to render it, a line in scripts/bench.sh to run it.
"""
