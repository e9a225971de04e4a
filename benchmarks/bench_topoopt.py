"""Time TopoOpt's co-optimisation and the quality it reaches against the search budget.

    python benchmarks/bench_topoopt.py [--json] [--quick] [--no-pin] [--large]

Workload (issues 9, 14): the 128-server DLRM of the authors' scripts (``dlrm-topoopt``),
degree 4 × 100 Gbit/s, the default search (the authors': 4000 iterations, their rebuild
policy, ring allocation, matching and routing); aim: under a minute on one core (the process
is pinned to one CPU unless --no-pin). Then:

- quality against the budget: the best iteration time each budget reaches over three seeds,
  as a ratio to the best any run found (1.00 = as good as the best known), with its time;
  for the authors' search, ours, and ours with ``lookahead``;
- every shipped model at 128 nodes, with the authors' defaults and with all our variants:
  the chosen strategy, the predicted iteration and the speed-ups against the similar-cost
  fat-tree and against data parallelism on TotientPerms rings (docs/explanation/topoopt.md §6);
- with --large: VGG19 on 1024 nodes, degree 8, 1000 iterations (time only).

With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from bench_common import emit

from oddl.offline.topoopt.job_model import describe
from oddl.offline.topoopt.model_zoo import MODELS
from oddl.offline.topoopt.search import co_optimise
from oddl.offline.topoopt.search_config import DEFAULT_BUDGET, SearchConfig

AIM_S = 60.0
NODES, DEGREE, GBPS = 128, 4, 100.0


VARIANTS: dict[str, dict[str, Any]] = {
    "authors": {},
    "ours": {"search": "ours", "rings": "ours", "matching": "ours", "routing": "ours"},
    "ours+lookahead": {"search": "ours", "rings": "ours", "matching": "ours",
                       "routing": "ours", "lookahead": True},
}
"""Search and construction variants (SearchConfig fields)."""


def run(model: str, budget: int, seed: int, variant: str = "authors", nodes: int = NODES,
        degree: int = DEGREE) -> dict[str, Any]:
    """One search; its time, result and counters."""
    cfg = SearchConfig(nodes=nodes, degree=degree, gbps=GBPS, budget=budget, seed=seed,
                       **VARIANTS[variant])
    t = time.perf_counter()
    r = co_optimise(MODELS[model], cfg)
    elapsed = time.perf_counter() - t
    return {"model": model, "budget": budget, "seed": seed, "variant": variant,
            "nodes": nodes, "degree": degree,
            "seconds": elapsed, "search_seconds": r.stats.elapsed_s,
            "iteration_ms": r.topoopt.iteration_s * 1e3,
            "strategy": describe(r.model, r.topoopt.strategy),
            "topologies": r.stats.topologies_built, "rebuilds": r.stats.rebuilds,
            "best_at": r.stats.best_at,
            "speedup_vs_fat_tree": r.speedup_vs_fat_tree,
            "speedup_vs_dp_rings": r.speedup_vs_dp_rings,
            "fat_tree_gbps": r.fat_tree.gbps, "fat_tree_ms": r.fat_tree.iteration_s * 1e3,
            "fat_tree_strategy": describe(r.model, r.fat_tree.strategy),
            "dp_rings_ms": r.dp_rings.iteration_s * 1e3,
            "fat_tree_equal_bw_ms": r.fat_tree_equal_bw.iteration_s * 1e3}


def quality_vs_budget(runs: list[dict[str, Any]], budgets: tuple[int, ...]
                      ) -> list[dict[str, Any]]:
    """For each variant and budget, the seeds' iteration times as ratios to the variant's best."""
    best_of = {v: min(r["iteration_ms"] for r in runs if r["variant"] == v) for v in VARIANTS}
    quality = []
    for v in VARIANTS:
        for b in budgets:
            rs = [r for r in runs if r["budget"] == b and r["variant"] == v]
            ratios = [r["iteration_ms"] / best_of[v] for r in rs]
            quality.append({"budget": b, "variant": v, "seeds": len(rs),
                            "median_ratio_to_best": statistics.median(ratios),
                            "worst_ratio_to_best": max(ratios),
                            "best_of_variant_ms": best_of[v],
                            "median_seconds": statistics.median(r["seconds"] for r in rs),
                            "strategies": sorted({r["strategy"] for r in rs})})
    return quality


def table(summary: dict[str, Any]) -> list[str]:
    """The summary for people."""
    m, quality = summary["default_search"], summary["quality_vs_budget"]
    best_of = {q["variant"]: q["best_of_variant_ms"] for q in quality}
    lines = [f"topoopt search — {summary['workload']} ({summary['cpus']} CPUs, "
             f"{'pinned to one' if summary['pinned_to_one_cpu'] else 'not pinned'})",
             f"  default search: {m['seconds']:.1f} s (aim < {AIM_S:g} s: "
             f"{'ok' if m['ok'] else 'MISSED'}); {m['strategy']} "
             f"{m['iteration_ms']:.3f} ms, {m['topologies']} topologies",
             f"  quality against budget (ratio to the best run of the same variant; best of "
             f"all {summary['best_known_ms']:.3f} ms; "
             + ", ".join(f"{v} {t:.3f}" for v, t in best_of.items()) + ")",
             f"    {'budget':>7} {'variant':>15} {'median':>8} {'worst':>8} {'seconds':>8}"]
    lines += [f"    {q['budget']:>7} {q['variant']:>15} "
              f"{q['median_ratio_to_best']:>8.3f} {q['worst_ratio_to_best']:>8.3f} "
              f"{q['median_seconds']:>8.1f}" for q in quality]
    lines += [f"  shipped models, {NODES} nodes:",
              f"    {'model':14} {'variant':>8} {'strategy':32} {'ms':>9} {'× fat-tree':>10} "
              f"{'× DP rings':>10} {'× eq-bw':>8} {'s':>6}"]
    lines += [f"    {r['model']:14} {r['variant']:>8} {r['strategy'][:32]:32} "
              f"{r['iteration_ms']:>9.2f} {r['speedup_vs_fat_tree']:>10.2f} "
              f"{r['speedup_vs_dp_rings']:>10.2f} "
              f"{r['fat_tree_equal_bw_ms'] / r['iteration_ms']:>8.2f} {r['seconds']:>6.1f}"
              for r in summary["models"]]
    lines += [f"  {r['model']} on {r['nodes']} nodes, degree {r['degree']}, {r['budget']} "
              f"iterations, {r['variant']}: {r['seconds']:.1f} s ({r['strategy']}, "
              f"{r['iteration_ms']:.2f} ms)" for r in summary["large"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer budgets and seeds")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--large", action="store_true", help="also time 1024 nodes")
    args = parser.parse_args(argv)
    pinned = False
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = True
    seeds = (1,) if args.quick else (1, 2, 3)
    budgets = (100, 1000, DEFAULT_BUDGET) if args.quick else (
        50, 100, 250, 500, 1000, 2000, DEFAULT_BUDGET, 8000)
    workload = "dlrm-topoopt"

    main_run = run(workload, DEFAULT_BUDGET, 1)
    runs = [run(workload, b, s, v) for v in VARIANTS for b in budgets for s in seeds
            if (b, s, v) != (DEFAULT_BUDGET, 1, "authors")] + [main_run]
    summary = {
        "machine": platform.node(), "python": platform.python_version(),
        "cpus": os.cpu_count(), "pinned_to_one_cpu": pinned,
        "workload": f"{workload}, {NODES} nodes, degree {DEGREE} x {GBPS:g} Gbit/s, budget "
                    f"{DEFAULT_BUDGET}",
        "default_search": {"seconds": main_run["seconds"], "aim": AIM_S,
                           "ok": main_run["seconds"] < AIM_S, **main_run},
        "best_known_ms": min(r["iteration_ms"] for r in runs),
        "quality_vs_budget": quality_vs_budget(runs, budgets),
        "models": [run(m, DEFAULT_BUDGET, 1, v) for m in MODELS for v in ("authors", "ours")],
        "large": [run("vgg19", 1000, 1, v, 1024, 8) for v in ("authors", "ours")]
        if args.large else [],
    }
    return emit(summary, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
