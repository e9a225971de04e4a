"""Bandwidth sweeps of the TopoOpt co-optimiser, as the paper's figures sweep them.

The authors' scripts (hipersys-team/TopoOpt ``simulation/scripts/fig11_17``) run TopoOpt at
degree 4 and 8 with 10, 25, 40, 100 and 200 Gbit/s per interface and the fat-tree at 10 to
1600 Gbit/s per host; the paper compares them at similar cost. `sweep_bandwidth` runs the
whole co-optimisation (search and baselines) at every interface rate and `format_sweep`
tabulates TopoOpt against the fat-tree of the same cost (`CostModel`) and of the same
bandwidth per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from oddl.offline.topoopt.job_model import JobModel, TopoOptError, describe

PAPER_RATES = (10.0, 25.0, 40.0, 100.0, 200.0)
"""Interface rates of the authors' TopoOpt runs (Gbit/s)."""


def parse_rates(text: str) -> tuple[float, ...]:
    """``"10,25,100"`` (or ``"paper"``) → rates in Gbit/s; TopoOptError naming a bad item."""
    if text.strip().lower() == "paper":
        return PAPER_RATES
    rates = []
    for item in text.split(","):
        try:
            r = float(item)
        except ValueError:
            raise TopoOptError(f"--sweep-bandwidth item {item.strip()!r} is not a rate; write "
                               "Gbit/s per interface separated by commas, e.g. 10,25,100, or "
                               "'paper'") from None
        if not r > 0 or r != r or r == float("inf"):
            raise TopoOptError(f"--sweep-bandwidth rates must be > 0 Gbit/s; got {item.strip()}")
        rates.append(r)
    return tuple(rates)


def sweep_bandwidth(model: JobModel, cfg: Any, rates: Sequence[float],
                    progress: Callable[[str], None] | None = None) -> list[Any]:
    """One `co_optimise` result per interface rate (the fat-tree rates follow the cost)."""
    from oddl.offline.topoopt.search import co_optimise

    out = []
    for r in rates:
        if progress:
            progress(f"topoopt: sweep {model.name} at {r:g} Gbit/s per interface")
        out.append(co_optimise(model, replace(cfg, gbps=float(r))))
    return out


def format_sweep(results: Sequence[Any]) -> str:
    """Table of a sweep: TopoOpt vs the similar-cost and the equal-bandwidth fat-trees."""
    if not results:
        return "no rates"
    r0 = results[0]
    cfg = r0.config
    lines = [f"oddl topoopt — {r0.model.name}, {cfg.nodes} nodes, degree {cfg.degree}; "
             f"search {cfg.search}, rings {cfg.rings}, matching {cfg.matching}, routing "
             f"{cfg.routing}, split {cfg.split}",
             f"{'Gbit/s':>7} {'TopoOpt ms':>11}  {'strategy':24} {'FT Gbit/s':>9} "
             f"{'FT ms':>9} {'vs FT':>6} {'eq-bw ms':>9} {'vs eq-bw':>8}"]
    for r in results:
        strat = describe(r.model, r.topoopt.strategy)
        strat = strat if len(strat) <= 24 else strat[:23] + "…"
        t, ft, eq = (o.iteration_s * 1e3 for o in (r.topoopt, r.fat_tree, r.fat_tree_equal_bw))
        lines.append(f"{r.config.gbps:>7g} {t:>11.2f}  {strat:24} {r.fat_tree.gbps:>9.1f} "
                     f"{ft:>9.2f} {ft / t:>5.2f}× {eq:>9.2f} {eq / t:>7.2f}×")
    lines.append("FT: fat-tree of the same cost per node (CostModel), its own best strategy; "
                 "eq-bw: fat-tree at degree × rate per host")
    return "\n".join(lines)


def sweep_as_dict(results: Sequence[Any]) -> dict[str, Any]:
    """JSON-friendly sweep."""
    return {"sweep": [{"gbps": r.config.gbps, "topoopt_ms": r.topoopt.iteration_s * 1e3,
                       "strategy": describe(r.model, r.topoopt.strategy),
                       "fat_tree_gbps": r.fat_tree.gbps,
                       "fat_tree_ms": r.fat_tree.iteration_s * 1e3,
                       "speedup_vs_fat_tree": r.speedup_vs_fat_tree,
                       "fat_tree_equal_bw_ms": r.fat_tree_equal_bw.iteration_s * 1e3}
                      for r in results]}
