"""Time TopoOpt's co-optimisation and the quality it reaches against the search budget.

    python benchmarks/bench_topoopt.py [--json] [--quick] [--no-pin]

Workload (issue 9): the 128-node DLRM job, degree 4 × 100 Gbit/s, the default search (4000
iterations, the authors' budget); aim: under a minute on one core (the process is pinned to
one CPU unless --no-pin). Then:

- quality against the budget: the best iteration time each budget reaches over three seeds,
  as a ratio to the best any run found (1.00 = as good as the best known), with its time;
  the same for the ``lookahead`` variant;
- every shipped model at 128 nodes with the default search: the chosen strategy, the
  predicted iteration and the speed-ups against the similar-cost fat-tree and against data
  parallelism on TotientPerms rings (the numbers docs/topoopt.md reports).

With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from oddl.controller.topoopt_model import MODELS, describe
from oddl.controller.topoopt_search import DEFAULT_BUDGET, SearchConfig, co_optimise

AIM_S = 60.0
NODES, DEGREE, GBPS = 128, 4, 100.0


def run(model: str, budget: int, seed: int, lookahead: bool = False) -> dict[str, Any]:
    """One search; its time, result and counters."""
    cfg = SearchConfig(nodes=NODES, degree=DEGREE, gbps=GBPS, budget=budget, seed=seed,
                       lookahead=lookahead)
    t = time.perf_counter()
    r = co_optimise(MODELS[model], cfg)
    elapsed = time.perf_counter() - t
    return {"model": model, "budget": budget, "seed": seed, "lookahead": lookahead,
            "seconds": elapsed, "search_seconds": r.stats.elapsed_s,
            "iteration_ms": r.topoopt.iteration_s * 1e3,
            "strategy": describe(r.model, r.topoopt.strategy),
            "topologies": r.stats.topologies_built, "best_at": r.stats.best_at,
            "speedup_vs_fat_tree": r.speedup_vs_fat_tree,
            "speedup_vs_dp_rings": r.speedup_vs_dp_rings,
            "fat_tree_gbps": r.fat_tree.gbps, "fat_tree_ms": r.fat_tree.iteration_s * 1e3,
            "fat_tree_strategy": describe(r.model, r.fat_tree.strategy),
            "dp_rings_ms": r.dp_rings.iteration_s * 1e3,
            "fat_tree_equal_bw_ms": r.fat_tree_equal_bw.iteration_s * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer budgets and seeds")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    args = parser.parse_args(argv)
    pinned = False
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = True
    seeds = (1,) if args.quick else (1, 2, 3)
    budgets = (100, 1000, DEFAULT_BUDGET) if args.quick else (
        50, 100, 250, 500, 1000, 2000, DEFAULT_BUDGET, 8000)
    look_budgets = (250,) if args.quick else (250, 1000)

    main_run = run("dlrm", DEFAULT_BUDGET, 1)
    runs = [run("dlrm", b, s) for b in budgets for s in seeds
            if (b, s) != (DEFAULT_BUDGET, 1)] + [main_run]
    runs += [run("dlrm", b, s, lookahead=True) for b in look_budgets for s in seeds]
    best_known = min(r["iteration_ms"] for r in runs)
    quality = []
    for look, bs in ((False, budgets), (True, look_budgets)):
        for b in bs:
            rs = [r for r in runs if r["budget"] == b and r["lookahead"] == look]
            ratios = [r["iteration_ms"] / best_known for r in rs]
            quality.append({"budget": b, "lookahead": look, "seeds": len(rs),
                            "median_ratio_to_best": statistics.median(ratios),
                            "worst_ratio_to_best": max(ratios),
                            "median_seconds": statistics.median(r["seconds"] for r in rs),
                            "strategies": sorted({r["strategy"] for r in rs})})
    models = [run(m, DEFAULT_BUDGET, 1) for m in MODELS] + \
        [run(m, 1000, 1, lookahead=True) for m in MODELS]

    summary = {
        "machine": platform.node(), "python": platform.python_version(),
        "cpus": os.cpu_count(), "pinned_to_one_cpu": pinned,
        "workload": f"dlrm, {NODES} nodes, degree {DEGREE} x {GBPS:g} Gbit/s, budget "
                    f"{DEFAULT_BUDGET}",
        "default_search": {"seconds": main_run["seconds"], "aim": AIM_S,
                           "ok": main_run["seconds"] < AIM_S, **main_run},
        "best_known_ms": best_known,
        "quality_vs_budget": quality,
        "models": models,
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    m = main_run
    print(f"topoopt search — {summary['workload']} ({summary['cpus']} CPUs, "
          f"{'pinned to one' if pinned else 'not pinned'})")
    print(f"  default search: {m['seconds']:.1f} s (aim < {AIM_S:g} s: "
          f"{'ok' if m['seconds'] < AIM_S else 'MISSED'}); {m['strategy']} "
          f"{m['iteration_ms']:.3f} ms, {m['topologies']} topologies")
    print(f"  quality against budget (best known {best_known:.3f} ms):")
    print(f"    {'budget':>7} {'lookahead':>9} {'median':>8} {'worst':>8} {'seconds':>8}")
    for q in quality:
        print(f"    {q['budget']:>7} {str(q['lookahead']):>9} "
              f"{q['median_ratio_to_best']:>8.3f} {q['worst_ratio_to_best']:>8.3f} "
              f"{q['median_seconds']:>8.1f}")
    print(f"  shipped models, {NODES} nodes:")
    print(f"    {'model':11} {'lookahead':>9} {'strategy':32} {'ms':>9} {'× fat-tree':>10} "
          f"{'× DP rings':>10} {'s':>6}")
    for r in models:
        print(f"    {r['model']:11} {str(r['lookahead']):>9} {r['strategy'][:32]:32} "
              f"{r['iteration_ms']:>9.2f} {r['speedup_vs_fat_tree']:>10.2f} "
              f"{r['speedup_vs_dp_rings']:>10.2f} {r['seconds']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
