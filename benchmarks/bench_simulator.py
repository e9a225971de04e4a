"""Time the cluster simulator: one 1024-node VGG19 iteration, and a 10-point sweep.

    python benchmarks/bench_simulator.py [--json] [--repeats R]

Workload: `simulate(SimConfig(model="vgg19", nodes=1024, gbps=100))` with all seven systems
(ODDL through the controller's scheduler, fat-tree, ideal, SiP-Ring, WRHT, TopoOpt, OptINC),
best and median of R runs; per system, the time of that system alone; then a sweep of the
line rate over 10 values at 1024 nodes (every point all seven systems), run once; then, once,
SiP-Ring with halving-doubling at 1024 nodes, the case where its wavelength LP is solved many
times (most configurations). Aims (issues 5 and 14): the iteration under 5 s, the sweep under
60 s.

Same-run baselines, so numbers compare across noisy machines: the closed-form ring formula
(`ring_formula_s`, a few arithmetic operations) and the ring's successor permutations built in
plain Python (2(N−1) lists of N ints, as in bench_plans.py); each simulator time is also given
as a ratio to the latter. With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_common import emit
from bench_scheduler import ring_permutations_baseline

from oddl.offline.simulator.core import SYSTEMS, SimConfig
from oddl.offline.simulator.engine import ring_formula_s, simulate, sweep

AIM_ITERATION_S = 5.0
AIM_SWEEP_S = 60.0
SWEEP = ("gbps", [10.0, 25.0, 40.0, 50.0, 100.0, 150.0, 200.0, 250.0, 400.0, 800.0])


def timed(repeats: int, fn: Callable[[], Any]) -> tuple[list[float], Any]:
    """Run `fn` `repeats` times; return the times and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return times, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    cfg = SimConfig(model="vgg19", nodes=1024, gbps=100.0)

    base_times, _ = timed(max(args.repeats, 3), lambda: ring_permutations_baseline(cfg.nodes))
    formula_times, _ = timed(1000, lambda: ring_formula_s(cfg))
    baseline_s = min(base_times)

    times, sim = timed(args.repeats, lambda: simulate(cfg))
    per_system = {s: min(timed(args.repeats, lambda s=s: simulate(cfg, [s]))[0])
                  for s in SYSTEMS}
    sweep_times, sw = timed(1, lambda: sweep(cfg, *SWEEP))
    hd = cfg.with_values(collective="halving-doubling")
    lp_times, lp_sim = timed(1, lambda: simulate(hd, ["sip-ring"]))
    lp_detail = lp_sim.result("sip-ring").detail

    it_best, it_median, sweep_s = min(times), statistics.median(times), sweep_times[0]
    summary = {
        "machine": platform.node(), "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "workload": "vgg19, 1024 nodes, 100 Gbit/s, all seven systems",
        "iteration_s": {"best": it_best, "median": it_median, "repeats": args.repeats,
                        "aim": AIM_ITERATION_S, "ok": it_best < AIM_ITERATION_S,
                        "x_baseline": it_best / baseline_s},
        "per_system_s": per_system,
        "sweep": {"param": SWEEP[0], "points": len(SWEEP[1]), "seconds": sweep_s,
                  "aim": AIM_SWEEP_S, "ok": sweep_s < AIM_SWEEP_S,
                  "x_baseline": sweep_s / baseline_s},
        "sip_ring_halving_doubling": {
            "seconds": lp_times[0], "configurations": lp_detail["configurations"],
            "lp_solves": lp_detail["lp_solves"],
            "equal_share_configurations": lp_detail["equal_share_configurations"]},
        "baseline": {"ring_permutations_s": baseline_s,
                     "ring_formula_s": min(formula_times)},
        "prediction": {"iteration_ms": {r.system: r.iteration_s * 1e3 for r in sim.results},
                       "ratio_vs_oddl": sim.ratios(),
                       "ring_formula_ms": ring_formula_s(cfg) * 1e3},
        "sweep_ratio_fat_tree": dict(zip(sw.values, [
            (f / o if f and o else None)
            for f, o in zip(sw.series("fat-tree"), sw.series("oddl"), strict=True)],
            strict=True)),
    }
    return emit(summary, args.json, table)


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    it, sw, lp = summary["iteration_s"], summary["sweep"], summary["sip_ring_halving_doubling"]
    base = summary["baseline"]
    lines = [f"simulator — {summary['workload']} ({summary['cpus']} CPUs)",
             f"  one iteration:  best {it['best']:.3f} s, median {it['median']:.3f} s of "
             f"{it['repeats']} (aim < {AIM_ITERATION_S:g} s: {'ok' if it['ok'] else 'MISSED'}); "
             f"{it['x_baseline']:.1f}× the baseline"]
    lines += [f"    {s:9} {t * 1e3:8.1f} ms" for s, t in summary["per_system_s"].items()]
    lines += [
        f"  sweep of {SWEEP[0]} over {len(SWEEP[1])} points: {sw['seconds']:.2f} s (aim < "
        f"{AIM_SWEEP_S:g} s: {'ok' if sw['ok'] else 'MISSED'}); "
        f"{sw['x_baseline']:.1f}× the baseline",
        f"  SiP-Ring, halving-doubling: {lp['seconds']:.2f} s "
        f"({lp['configurations']} configurations, {lp['lp_solves']} LP "
        f"solves, {lp['equal_share_configurations']} equal-share)",
        f"  baselines: ring permutations in plain Python {base['ring_permutations_s'] * 1e3:.2f} "
        f"ms; closed-form ring formula {base['ring_formula_s'] * 1e6:.2f} µs",
        "  iteration ratio vs ODDL: " + ", ".join(
            f"{k} {v:.2f}" for k, v in summary["prediction"]["ratio_vs_oddl"].items())]
    return lines


if __name__ == "__main__":
    sys.exit(main())
