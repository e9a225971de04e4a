"""All-reduce time on the emulated four-node testbed: optical (scheduled) vs ideal network.

Starts the same processes as `oddl demo`, then for each message size runs R all-reduces on
the optical network and R on the ideal electrical network (same line rate) and reports
medians and their ratio, plus the slot-gate error of the agents.

    python benchmarks/bench_allreduce.py [--sizes 4096,1048576,4194304] [--repeats 10]
        [--collective ring,halving-doubling,wrht,totientperms,parameter-server] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from agents.client import AgentClient, allreduce_all
from oddl.demo import DEFAULT_TESTBED
from oddl.launch import launch_emulated
from oddl.operator import OperatorClient
from oddl.procs import ProcessGroup


def _allreduce_all(clients: list[AgentClient], arrays: list[np.ndarray]) -> float:
    elapsed, outs = allreduce_all(clients, arrays)
    exact = np.sum(arrays, axis=0)
    for out in outs:
        if not isinstance(out, np.ndarray):
            raise AssertionError(f"all-reduce failed: {out}")
        assert np.array_equal(out, exact), "wrong all-reduce result"
    return elapsed


def _job_retunes(op: OperatorClient, job_id: str) -> int:
    return int(next(j for j in op.jobs() if j["id"] == job_id).get("reconfigurations", 0))


def main(argv: list[str] | None = None) -> int:
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
    results = []
    with tempfile.TemporaryDirectory() as tmp, ProcessGroup(Path(tmp)) as group:
        tb = launch_emulated(group, Path(args.config), Path(tmp))
        cfg = tb.cfg
        clients = [AgentClient(tb.agents[n.id]["local_api"]) for n in cfg.nodes]
        op = OperatorClient(tb.controller)
        rng = np.random.default_rng(0)
        times: dict[tuple[str, str, int], list[float]] = {}
        retunes: dict[tuple[str, int], float] = {}
        collectives = args.collective.split(",")
        for collective in collectives:
            for network in ("optical", "ideal"):
                job = op.submit(f"bench-{collective}-{network}", [], collective, network)
                for size in sizes:
                    arrays = [rng.integers(-1000, 1000, size // 4).astype(np.int32)
                              for _ in clients]
                    _allreduce_all(clients, arrays)  # warm-up: schedule cache, connections
                    before = _job_retunes(op, job["id"])
                    times[(collective, network, size)] = [_allreduce_all(clients, arrays)
                                                          for _ in range(args.repeats)]
                    if network == "optical":
                        retunes[(collective, size)] = (
                            _job_retunes(op, job["id"]) - before) / args.repeats
                op.cancel(job["id"])
        gate = [e for c in clients for e in c.status()["gate_errors"]]
        for c in clients:
            c.close()
        op.close()
    for collective in collectives:
        for size in sizes:
            o = float(np.median(times[(collective, "optical", size)]))
            i = float(np.median(times[(collective, "ideal", size)]))
            results.append({"collective": collective, "bytes": size, "optical_ms": o * 1e3,
                            "ideal_ms": i * 1e3, "ratio": o / i,
                            "retunes_per_allreduce": retunes[(collective, size)]})
    g = np.abs(np.array(gate)) if gate else np.zeros(1)
    summary = {"collectives": collectives, "line_rate_gbps": cfg.fabric.line_rate_gbps,
               "repeats": args.repeats, "sizes": results,
               "gate_error_us": {"p50": float(np.percentile(g, 50) * 1e6),
                                 "p99": float(np.percentile(g, 99) * 1e6),
                                 "max": float(g.max() * 1e6), "samples": len(gate)}}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"all-reduce on 4 emulated nodes, {cfg.fabric.line_rate_gbps:g} Gbit/s, "
              f"median of {args.repeats}; ratio = optical / ideal electrical")
        print(f"{'collective':<18} {'bytes':>10} {'optical ms':>11} {'ideal ms':>9} {'ratio':>6} "
              f"{'retunes':>8}")
        for r in results:
            print(f"{r['collective']:<18} {r['bytes']:>10} {r['optical_ms']:>11.2f} "
                  f"{r['ideal_ms']:>9.2f} {r['ratio']:>6.2f} {r['retunes_per_allreduce']:>8.1f}")
        ge = summary["gate_error_us"]
        print(f"slot-gate error: p50 {ge['p50']:.1f} µs, p99 {ge['p99']:.1f} µs, "
              f"max {ge['max']:.1f} µs ({ge['samples']} sends)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
