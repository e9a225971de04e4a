"""All-reduce time of optinc against ring on the emulated four-node testbed.

Starts the same processes as `oddl demo` (emulators + fabric with the OptINC device,
controller, four agents), then for each size runs R all-reduces of float32 gradients with
ring (optical network) and R with optinc, and reports the medians and their ratio, the ratio
of the two schedules the controller builds (what the testbed would do without software
overhead), the ideal ratio and the OptINC device's throughput (elements/s through the
vectorised MZI model).

Ideal ratio: optinc sends every element once as a b-bit level (S·b/32 bytes for float32) and
the device streams the mean back while the light passes, so one pass S_b/B; ring sends
2(N−1)/N·S/B. For N = 4 and b = 8 that is (1/4)/(3/2) = 0.167; for the same bytes on the wire
(b = 32) it would be N/(2(N−1)) = 0.667.

Every result is checked: ring against the exact sum (float32 summation bound), optinc against
the exact quantised expectation (elements the device's noisy optics missed, which it counts,
are allowed; nothing else).

    python benchmarks/bench_optinc_testbed.py [--sizes-mb 1,4,16,64] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import allreduce_results, check_float_sum, emit, run_meta

from oddl.agents.collective.optinc import optinc_expected
from oddl.common.config import OptincDeviceConfig
from oddl.launch.testbed import DEFAULT_TESTBED, RunningTestbed, fabric_stats


def _check_optinc(outs: list[np.ndarray], arrays: list[np.ndarray], bits: int) -> int:
    """Elements differing from the exact quantised expectation (the device must agree)."""
    want = optinc_expected(arrays, bits)
    for out in outs[1:]:
        if not np.array_equal(out, outs[0]):
            raise RuntimeError("optinc results differ between nodes")
    return int(np.count_nonzero(outs[0] != want))


def measure(tb: RunningTestbed, dev: OptincDeviceConfig, sizes: list[int], repeats: int
            ) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], float],
                       dict[str, Any]]:
    """Ring and optinc at each size: the times, the scheduled makespans and the device's
    counters during the runs (raises if a result is wrong)."""
    op, clients = tb.operator, tb.clients
    rng = np.random.default_rng(0)
    times: dict[tuple[str, int], list[float]] = {}
    makespan: dict[tuple[str, int], float] = {}
    missed = 0
    before = fabric_stats(tb.launched.fabric)["optinc"][dev.id]
    for coll in ("ring", "optinc"):
        job = op.submit(f"bench-{coll}", [], coll, "optical")
        for size in sizes:
            arrays = [rng.standard_normal(size // 4).astype(np.float32) for _ in clients]
            makespan[(coll, size)] = op.schedule(job["id"], size, 4).makespan_s
            times[(coll, size)] = []
            for i in range(repeats + 1):  # the first is a warm-up
                elapsed, outs = allreduce_results(clients, arrays)
                if coll == "ring":
                    check_float_sum(outs, arrays)
                else:
                    missed += _check_optinc(outs, arrays, dev.bits)
                if i:
                    times[(coll, size)].append(elapsed)
                del outs
        op.cancel(job["id"])
    after = fabric_stats(tb.launched.fabric)["optinc"][dev.id]
    device = {k: after[k] - before[k] for k in ("passes", "elements", "model_s",
                                                "inexact_elements")}
    if missed > device["inexact_elements"]:
        raise RuntimeError(f"optinc: {missed} elements differ from the exact quantised mean "
                           f"but the device missed only {device['inexact_elements']}")
    return times, makespan, device


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    lines = [f"optinc vs ring all-reduce, {summary['nodes']} emulated nodes, {summary['bits']}-bit "
             f"levels, {summary['line_rate_gbps']:g} Gbit/s, float32, median of "
             f"{summary['repeats']}",
             f"{'MB':>6} {'ring ms':>9} {'optinc ms':>10} {'ratio':>6} {'scheduled':>10} "
             f"{'ideal':>6}"]
    for r in summary["sizes"]:
        lines.append(f"{r['mb']:>6.0f} {r['ring_ms']:>9.1f} {r['optinc_ms']:>10.1f} "
                     f"{r['ratio']:>6.3f} {r['schedule_ratio']:>10.3f} {r['ideal_ratio']:>6.3f}")
    d = summary["device"]
    lines.append(f"OptINC device: {d['elements']:,} elements in {d['passes']} passes, MZI model "
                 f"{d['elements_per_s'] / 1e6:.1f} M elements/s, {d['inexact_elements']} "
                 "elements missed by the noisy optics; every result checked")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_TESTBED))
    parser.add_argument("--sizes-mb", default="1,4,16,64",
                        help="all-reduce sizes in MB of float32 (comma-separated)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(float(s) * 1_000_000) // 4 * 4 for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory() as tmp, RunningTestbed(
            Path(tmp), Path(args.config), agent_timeout_s=600) as tb:
        dev = tb.cfg.optinc_device(None)
        if dev is None:
            print(f"{args.config} has no OptINC device", file=sys.stderr)
            return 2
        times, makespan, device = measure(tb, dev, sizes, args.repeats)
    n, b = len(tb.cfg.nodes), tb.cfg.fabric.line_rate_gbps * 1e9
    rows = []
    for size in sizes:
        ring = float(np.median(times[("ring", size)]))
        opt = float(np.median(times[("optinc", size)]))
        ideal_ring = 2 * (n - 1) / n * 8 * size / b
        ideal_opt = 8 * (size // 4) * dev.level_itemsize / b + dev.latency_us * 1e-6
        rows.append({"mb": size / 1e6, "bytes": size, "ring_ms": ring * 1e3,
                     "optinc_ms": opt * 1e3, "ratio": opt / ring,
                     "schedule_ratio": makespan[("optinc", size)] / makespan[("ring", size)],
                     "ideal_ratio": ideal_opt / ideal_ring})
    model_s, elements = device["model_s"], device["elements"]
    summary = {
        **run_meta("bench_optinc_testbed"),
        "nodes": n, "bits": dev.bits, "line_rate_gbps": tb.cfg.fabric.line_rate_gbps,
        "repeats": args.repeats, "sizes": rows,
        "ideal_ratio_same_bytes": n / (2 * (n - 1)),
        "device": {**device, "elements_per_s": elements / model_s if model_s else 0.0},
        "results_checked": True,
    }
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
