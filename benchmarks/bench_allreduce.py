"""All-reduce time on an emulated testbed: optical (scheduled) vs ideal network vs the bound.

Starts the same processes as `oddl demo` (on the four-node testbed, or `--config` another,
e.g. the shipped emulated-8node), then for each message size runs R all-reduces on the optical
network and R on the ideal electrical network (same line rate) and reports medians, their
ratio, and each against the line-rate bound of any all-reduce, 2(N-1)/N x S / B per node
(N nodes, S bytes, B the line rate), plus the slot-gate error of the agents.

    python benchmarks/bench_allreduce.py [--config FILE] [--sizes 4096,1048576,4194304]
        [--repeats 10] [--collective ring,halving-doubling,wrht,totientperms,parameter-server]
        [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import allreduce_results, check_exact, emit, percentiles

from oddl.agents.client.agent_client import AgentClient
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed
from oddl.operator.client import OperatorClient


def _allreduce_all(clients: list[AgentClient], arrays: list[np.ndarray]) -> float:
    elapsed, outs = allreduce_results(clients, arrays)
    check_exact(outs, np.sum(arrays, axis=0))
    return elapsed


def _job_retunes(op: OperatorClient, job_id: str) -> int:
    return int(next(j for j in op.jobs() if j["id"] == job_id).get("reconfigurations", 0))


Key = tuple[str, str, int]
"""(collective, network, bytes)"""


def measure(tb: RunningTestbed, collectives: list[str], sizes: list[int], repeats: int
            ) -> tuple[dict[Key, list[float]], dict[tuple[str, int], float], list[float]]:
    """Each collective on both networks at each size: the times, the optical retunes per
    all-reduce and the agents' slot-gate errors."""
    op, clients = tb.operator, tb.clients
    rng = np.random.default_rng(0)
    times: dict[Key, list[float]] = {}
    retunes: dict[tuple[str, int], float] = {}
    for collective in collectives:
        for network in ("optical", "ideal"):
            job = op.submit(f"bench-{collective}-{network}", [], collective, network)
            for size in sizes:
                arrays = [rng.integers(-1000, 1000, size // 4).astype(np.int32)
                          for _ in clients]
                _allreduce_all(clients, arrays)  # warm-up: schedule cache, connections
                before = _job_retunes(op, job["id"])
                times[(collective, network, size)] = [_allreduce_all(clients, arrays)
                                                      for _ in range(repeats)]
                if network == "optical":
                    retunes[(collective, size)] = (
                        _job_retunes(op, job["id"]) - before) / repeats
            op.cancel(job["id"])
    gate = [e for c in clients for e in c.status()["gate_errors"]]
    return times, retunes, gate


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"all-reduce on {summary['nodes']} emulated nodes, {summary['line_rate_gbps']:g} "
             f"Gbit/s, median of {summary['repeats']}; ratio = optical / ideal electrical; "
             "/bound = over 2(N-1)/N x S / B",
             f"{'collective':<18} {'bytes':>10} {'optical ms':>11} {'ideal ms':>9} {'ratio':>6} "
             f"{'bound ms':>9} {'opt/bound':>9} {'ideal/bound':>11} {'retunes':>8}"]
    for r in summary["sizes"]:
        lines.append(f"{r['collective']:<18} {r['bytes']:>10} {r['optical_ms']:>11.2f} "
                     f"{r['ideal_ms']:>9.2f} {r['ratio']:>6.2f} {r['bound_ms']:>9.2f} "
                     f"{r['optical_ms'] / r['bound_ms']:>9.2f} "
                     f"{r['ideal_ms'] / r['bound_ms']:>11.2f} "
                     f"{r['retunes_per_allreduce']:>8.1f}")
    ge = summary["gate_error_us"]
    lines.append(f"slot-gate error: p50 {ge['p50']:.1f} µs, p99 {ge['p99']:.1f} µs, "
                 f"max {ge['max']:.1f} µs ({ge['samples']} sends)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--sizes", default="4096,262144,1048576,4194304",
                        help="message sizes in bytes (int32 elements, comma-separated)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--collective", default="ring",
                        help="one collective, or several comma-separated (each on both networks)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    collectives = args.collective.split(",")
    with tempfile.TemporaryDirectory() as tmp, RunningTestbed(
            Path(tmp), Path(args.config), agent_timeout_s=None) as tb:
        times, retunes, gate = measure(tb, collectives, sizes, args.repeats)
    results = []
    n, rate_bps = len(tb.cfg.nodes), tb.cfg.fabric.line_rate_gbps * 1e9
    for collective in collectives:
        for size in sizes:
            o = float(np.median(times[(collective, "optical", size)]))
            i = float(np.median(times[(collective, "ideal", size)]))
            bound = 2 * (n - 1) / n * size * 8 / rate_bps
            results.append({"collective": collective, "bytes": size, "optical_ms": o * 1e3,
                            "ideal_ms": i * 1e3, "ratio": o / i, "bound_ms": bound * 1e3,
                            "retunes_per_allreduce": retunes[(collective, size)]})
    g = percentiles(gate)
    summary = {"collectives": collectives, "line_rate_gbps": tb.cfg.fabric.line_rate_gbps,
               "nodes": n, "testbed": tb.cfg.name,
               "repeats": args.repeats, "sizes": results,
               "gate_error_us": {"p50": g["p50"] * 1e6, "p99": g["p99"] * 1e6,
                                 "max": g["max"] * 1e6, "samples": len(gate)}}
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
