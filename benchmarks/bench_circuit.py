"""All-reduce on a circuit-switched testbed: TopoOpt's rings on every port vs a ring on one.

Starts the same processes as `oddl demo --config topoopt-12node` (12 hosts × 4 ports through
an emulated 48x48 optical circuit switch; `--config` another circuit-switched file), then per
job: submits it (admission sets the switch's cross-connects in one verified transaction,
timed here as the submit call), and for each message size runs R all-reduces, every result
checked against the exact sum. The jobs, on the same hosts one after another:

- ``topoopt``: TopoOpt's rings, one per port, each both ways (network circuit);
- ``ring``: a plain ring on one port of each host (network circuit);
- ``topoopt`` on the ideal electrical network with each host's bandwidth that of its ports.

Each is reported against the line-rate bound of any all-reduce over the bandwidth it has:
2(N−1)/N × S / (P·B) with P ports of line rate B in use per host (P = the job's ports for
topoopt, 1 for the one-port ring).

    python benchmarks/bench_circuit.py [--config topoopt-12node] [--sizes 1048576,16777216]
        [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import allreduce_results, check_exact, emit

from oddl.launch.shipped import find_testbed
from oddl.launch.testbed import RunningTestbed

JOBS = (("topoopt", "topoopt", "circuit"), ("ring_one_port", "ring", "circuit"),
        ("ideal", "topoopt", "ideal"))
"""(name, collective, network)."""


def measure(tb: RunningTestbed, sizes: list[int], repeats: int) -> dict[str, Any]:
    """Each job at each size: median all-reduce time, the submit time (the topology applied)
    and the job's ports per host."""
    op, clients = tb.operator, tb.clients
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name, collective, network in JOBS:
        t0 = time.perf_counter()
        job = op.submit(f"bench-{name}", [], collective, network)
        submit_s = time.perf_counter() - t0
        rows = {}
        for size in sizes:
            arrays = [rng.integers(-1000, 1000, size // 4).astype(np.int32) for _ in clients]
            expect = np.sum(arrays, axis=0)
            _, outs = allreduce_results(clients, arrays)  # warm-up: schedule cache, streams
            check_exact(outs, expect)
            times = []
            for _ in range(repeats):
                elapsed, outs = allreduce_results(clients, arrays)
                check_exact(outs, expect)
                times.append(elapsed)
            rows[size] = float(np.median(times))
        out[name] = {"collective": collective, "network": network, "submit_s": submit_s,
                     "median_s": rows, "params": dict(job.get("params", {}))}
        op.cancel(job["id"])
    return out


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"all-reduce on {summary['testbed']}: {summary['nodes']} hosts x "
             f"{summary['ports']} ports, {summary['line_rate_gbps']:g} Gbit/s per port, median "
             f"of {summary['repeats']}; /bound = over 2(N-1)/N x S / (P x B)",
             f"{'job':<15} {'bytes':>10} {'ms':>9} {'bound ms':>9} {'/bound':>7} "
             f"{'vs 1-port ring':>15}"]
    for r in summary["rows"]:
        lines.append(f"{r['job']:<15} {r['bytes']:>10} {r['ms']:>9.2f} {r['bound_ms']:>9.2f} "
                     f"{r['over_bound']:>7.2f} {r['over_one_port_ring']:>15.3f}")
    for name, s in summary["submit_ms"].items():
        lines.append(f"submit {name}: {s:.1f} ms (admission, and for circuit jobs the switch's "
                     "cross-connects applied and read back)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="topoopt-12node")
    parser.add_argument("--sizes", default="1048576,16777216",
                        help="message sizes in bytes (int32 elements, comma-separated)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, RunningTestbed(
            Path(tmp), find_testbed(args.config), agent_timeout_s=None) as tb:
        jobs = measure(tb, sizes, args.repeats)
    n, rate_bps = len(tb.cfg.nodes), tb.cfg.fabric.line_rate_gbps * 1e9
    ports = min(node.ports for node in tb.cfg.nodes)
    rows = []
    for name, job in jobs.items():
        in_use = 1 if name == "ring_one_port" else ports
        for size in sizes:
            t = job["median_s"][size]
            bound = 2 * (n - 1) / n * size * 8 / (in_use * rate_bps)
            rows.append({"job": name, "bytes": size, "ms": t * 1e3, "bound_ms": bound * 1e3,
                         "over_bound": t / bound,
                         "over_one_port_ring": t / jobs["ring_one_port"]["median_s"][size]})
    summary = {"testbed": tb.cfg.name, "nodes": n, "ports": ports,
               "line_rate_gbps": tb.cfg.fabric.line_rate_gbps, "repeats": args.repeats,
               "rows": rows,
               "submit_ms": {name: job["submit_s"] * 1e3 for name, job in jobs.items()},
               "params": {name: job["params"] for name, job in jobs.items()}}
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
