"""Does recording change what it records? All-reduce time with tracing off and on.

Starts the emulated four-node testbed (as `oddl demo`), then for each collective and message
size runs rounds of all-reduces on the optical network, tracing off and on in turn within the
same run (`oddl trace start|stop` through the controller's `SetTrace`, which tells the agents;
the order alternates per round), and reports the median time of each and their ratio (target
≤ 1.03, issue 25). Every result is checked exact (int32).

    python benchmarks/bench_trace.py [--sizes 16MB,64MB] [--collective ring,halving-doubling]
        [--rounds 5] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import allreduce_results, check_exact, emit, run_meta

from oddl.cli.byte_sizes import parse_size
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed


def _switch(tb: RunningTestbed, on: bool, directory: Path) -> None:
    """Tracing on or off at the controller and every agent; returns once all agree."""
    tb.operator.set_trace(on, str(directory) if on else "")
    deadline = time.monotonic() + 60
    while any(c.status()["tracing"] != on for c in tb.clients):
        if time.monotonic() > deadline:
            raise RuntimeError(f"an agent did not switch tracing {'on' if on else 'off'}")
        time.sleep(0.02)


def measure(tb: RunningTestbed, collective: str, sizes: list[int], rounds: int, repeats: int,
            trace_dir: Path) -> dict[tuple[int, bool], list[float]]:
    """Per (size, tracing) the all-reduce times of `collective`, rounds interleaved."""
    rng = np.random.default_rng(0)
    job = tb.operator.submit(f"bench-trace-{collective}", [], collective, "optical")
    arrays = {size: [rng.integers(-1000, 1000, size // 4).astype(np.int32)
                     for _ in tb.clients] for size in sizes}
    exact = {size: np.sum(a, axis=0) for size, a in arrays.items()}
    times: dict[tuple[int, bool], list[float]] = {(s, on): [] for s in sizes for on in (0, 1)}
    for size in sizes:  # warm-up: schedules, connections, standing schedules
        check_exact(allreduce_results(tb.clients, arrays[size])[1], exact[size])
    for r in range(rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            _switch(tb, on, trace_dir / f"{collective}-{r}")
            for size in sizes:
                for _ in range(repeats):
                    elapsed, outs = allreduce_results(tb.clients, arrays[size])
                    check_exact(outs, exact[size])
                    times[(size, on)].append(elapsed)
            if on:
                _switch(tb, False, trace_dir)
    tb.operator.cancel(job["id"])
    return times


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"all-reduce on 4 emulated nodes, tracing off vs on in the same run, median of "
             f"{summary['samples']} (target ratio <= 1.03)",
             f"{'collective':<18} {'bytes':>10} {'off ms':>9} {'on ms':>9} {'ratio':>6}"]
    for r in summary["results"]:
        lines.append(f"{r['collective']:<18} {r['bytes']:>10} {r['off_ms']:>9.1f} "
                     f"{r['on_ms']:>9.1f} {r['ratio']:>6.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--sizes", default="16MB,64MB", help="message sizes (comma-separated)")
    parser.add_argument("--collective", default="ring,halving-doubling")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="all-reduces per round and mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp, RunningTestbed(
            Path(tmp), Path(args.config), agent_timeout_s=None) as tb:
        for collective in args.collective.split(","):
            times = measure(tb, collective, sizes, args.rounds, args.repeats,
                            Path(tmp) / "trace")
            for size in sizes:
                off = float(np.median(times[(size, False)]))
                on = float(np.median(times[(size, True)]))
                results.append({"collective": collective, "bytes": size, "off_ms": off * 1e3,
                                "on_ms": on * 1e3, "ratio": on / off,
                                "off_all_ms": [t * 1e3 for t in times[(size, False)]],
                                "on_all_ms": [t * 1e3 for t in times[(size, True)]]})
    summary = {**run_meta("trace"), "samples": args.rounds * args.repeats,
               "results": results}
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
