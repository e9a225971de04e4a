"""TopoOpt's alternating optimisation: simulated annealing over strategies, topology rebuilt.

Reconstruction of docs/sources.md §3.3 (``FFModel::optimize``, ``SpMulMat::optimize`` [authors'
code]):

1. Start data parallel (or, if that does not fit in memory, with the largest groups sharded
   until it does) and build the topology for its traffic.
2. Each of `budget` iterations rewrites one random layer group's model-parallel degree
   (half the time to a neighbouring divisor of N, otherwise to any other) and evaluates it on
   the *current* topology; accepted if faster, else with probability exp(−α·Δt), α = 1.0 per
   ms of iteration time (FlexFlow's unit).
3. On every accepted move the topology is rebuilt for the new strategy's traffic and taken if
   faster, else with probability exp(−α_topo·Δt), α_topo = 0.5; also after 50 iterations
   without a new best.
4. Every clamp(budget/100, 1, 1000) iterations the search returns to the best pair.

Judged on the current topology, a move towards model parallelism rarely wins (its traffic
crosses links built for other traffic), so the search tends to stay near its start.
``lookahead`` (ours, off by default) also tries a rejected move on the topology built for it.

A fixed seed makes the search reproducible. Topologies are cached by the traffic they were
built for (the construction is deterministic), and their routes per block size are cached on
them, so revisiting a strategy costs one evaluation.

The baselines are the same job on (a) TotientPerms rings with plain data parallelism, the
same hardware; (b) a full-bisection fat-tree whose cost per node equals TopoOpt's
(`CostModel`), with its own best strategy from the same search (no topology to rebuild);
(c) the same fat-tree at TopoOpt's total bandwidth per node (d·B), for reference.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from oddl.offline.topoopt.annealing import anneal, anneal_authors, initial_strategy
from oddl.offline.topoopt.evaluation import Breakdown, FatTree, evaluate
from oddl.offline.topoopt.job_model import (
    JobModel,
    Strategy,
    TopoOptError,
    check_split,
    data_parallel,
    describe,
    memory_bytes,
    traffic,
)
from oddl.offline.topoopt.search_config import (
    Progress,
    SearchConfig,
    SearchStats,
)
from oddl.offline.topoopt.topology import FabricTopology, build_topology

__all__ = ["Outcome", "SearchResult", "co_optimise", "evaluate_strategy"]


@dataclass(frozen=True)
class Outcome:
    """One network's best strategy and its predicted iteration."""

    network: str
    strategy: Strategy
    breakdown: Breakdown
    topology: FabricTopology | None = None
    gbps: float = 0.0
    """Host rate (fat-tree) or interface rate (TopoOpt)."""

    @property
    def iteration_s(self) -> float:
        """Predicted iteration time."""
        return self.breakdown.iteration_s


@dataclass(frozen=True)
class SearchResult:
    """The co-optimised job and its baselines."""

    model: JobModel
    config: SearchConfig
    topoopt: Outcome
    dp_rings: Outcome
    fat_tree: Outcome
    fat_tree_dp: Outcome
    fat_tree_equal_bw: Outcome
    stats: SearchStats

    @property
    def speedup_vs_fat_tree(self) -> float:
        """Similar-cost fat-tree (its own best strategy) iteration / TopoOpt's."""
        return self.fat_tree.iteration_s / self.topoopt.iteration_s

    @property
    def speedup_vs_dp_rings(self) -> float:
        """Plain data parallel on TotientPerms rings / TopoOpt's."""
        return self.dp_rings.iteration_s / self.topoopt.iteration_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (milliseconds)."""
        cfg = self.config
        m = self.model

        def out(o: Outcome) -> dict[str, Any]:
            d: dict[str, Any] = {"network": o.network, "gbps": o.gbps,
                                 "strategy": describe(m, o.strategy),
                                 "degrees": dict(zip((g.name for g in m.groups), o.strategy,
                                                     strict=True)),
                                 **o.breakdown.as_dict()}
            if o.topology is not None:
                d["topology"] = o.topology.as_dict()
            return d

        return {
            "model": {"name": m.name, "params": m.params, "batch": m.batch,
                      "itemsize": m.itemsize, "compute_ms": m.compute_s * 1e3,
                      "source": m.source},
            "config": {"nodes": cfg.nodes, "degree": cfg.degree, "gbps": cfg.gbps,
                       "transceivers": cfg.transceivers, "budget": cfg.budget,
                       "seed": cfg.seed, "alpha": cfg.alpha, "topo_alpha": cfg.topo_alpha,
                       "split": cfg.split, "search": cfg.search, "rings": cfg.rings,
                       "matching": cfg.matching, "routing": cfg.routing,
                       "lookahead": cfg.lookahead,
                       "max_mp": cfg.max_mp or cfg.nodes,
                       "memory_gb": cfg.memory.gb, "state_factor": cfg.memory.state_factor,
                       "net": asdict(cfg.net), "cost": cfg.cost.as_dict(),
                       "fat_tree_gbps": cfg.fattree_gbps,
                       "topoopt_cost_per_node": cfg.cost.topoopt_per_node(cfg.degree,
                                                                          cfg.gbps)},
            "topoopt": out(self.topoopt),
            "dp_rings": out(self.dp_rings),
            "fat_tree": out(self.fat_tree),
            "fat_tree_dp": out(self.fat_tree_dp),
            "fat_tree_equal_bandwidth": out(self.fat_tree_equal_bw),
            "speedup_vs_fat_tree": self.speedup_vs_fat_tree,
            "speedup_vs_dp_rings": self.speedup_vs_dp_rings,
            "paper_up_to": 3.4,
            "search": {k: v for k, v in asdict(self.stats).items() if k != "history"}
            | {"history": [[i, t * 1e3] for i, t in self.stats.history]},
        }


class _Topologies:
    """Topologies by the traffic they were built for (LRU)."""

    def __init__(self, model: JobModel, cfg: SearchConfig, stats: SearchStats,
                 size: int = 512) -> None:
        self.model, self.cfg, self.stats, self.size = model, cfg, stats, size
        self._lru: OrderedDict[Any, FabricTopology] = OrderedDict()

    def for_strategy(self, s: Strategy) -> FabricTopology:
        tr = traffic(self.model, s, self.cfg.nodes)
        key = tr.key
        topo = self._lru.get(key)
        if topo is not None:
            self._lru.move_to_end(key)
            self.stats.topology_cache_hits += 1
            return topo
        cfg = self.cfg
        topo = build_topology(tr, cfg.degree, cfg.gbps, cfg.split, cfg.rings, cfg.matching,
                              cfg.routing)
        self.stats.topologies_built += 1
        self._lru[key] = topo
        if len(self._lru) > self.size:
            self._lru.popitem(last=False)
        return topo


def co_optimise(model: JobModel, cfg: SearchConfig, progress: Progress | None = None
                ) -> SearchResult:
    """Search strategy and topology together; evaluate the baselines (module docstring)."""
    cfg.validate()
    stats = SearchStats()
    topos = _Topologies(model, cfg, stats)
    p = cfg.net

    def on_topo(s: Strategy, topo: FabricTopology) -> float:
        return evaluate(model, s, topo, p).iteration_s

    search = anneal_authors if cfg.search == "authors" else anneal
    s, topo, _, stats = search(model, cfg, on_topo, topos.for_strategy, None, "topoopt",
                               progress, stats)
    best = Outcome("topoopt", s, evaluate(model, s, topo, p), topo, cfg.gbps)
    dp, dp_out = _dp_rings(model, cfg)
    ft = FatTree(cfg.nodes, cfg.fattree_gbps, p)
    ft_out = _fat_tree_search(model, cfg, ft, progress)
    ft_dp = Outcome("fat-tree", dp, ft.evaluate(model, dp), None, ft.gbps)
    eq = FatTree(cfg.nodes, cfg.degree * cfg.gbps, p)
    eq_out = _fat_tree_search(model, cfg, eq, None)
    return SearchResult(model, cfg, best, dp_out, ft_out, ft_dp, eq_out, stats)


def _dp_rings(model: JobModel, cfg: SearchConfig) -> tuple[Strategy, Outcome]:
    """The data-parallel baseline (sharded as little as memory needs) on a topology that gives
    every interface to rings."""
    dp = data_parallel(model)
    if not cfg.memory.fits(model, dp):
        dp = initial_strategy(model, cfg)
    topo = build_topology(traffic(model, dp, cfg.nodes), cfg.degree, cfg.gbps, "all-dp",
                          cfg.rings, cfg.matching, cfg.routing)
    return dp, Outcome("dp-rings", dp, evaluate(model, dp, topo, cfg.net), topo, cfg.gbps)


def _fat_tree_search(model: JobModel, cfg: SearchConfig, ft: FatTree,
                     progress: Progress | None) -> Outcome:
    s, _, _, _ = anneal(model, cfg, lambda s, _: ft.evaluate(model, s).iteration_s, None, None,
                        f"fat-tree {ft.gbps:.4g}G", progress)
    return Outcome("fat-tree", s, ft.evaluate(model, s), None, ft.gbps)


def evaluate_strategy(model: JobModel, cfg: SearchConfig, strategy: Strategy) -> SearchResult:
    """No search: `strategy` on its own topology, with the same baselines (fat-trees use it
    too)."""
    cfg.validate()
    check_split(model, strategy, cfg.nodes)
    if not cfg.memory.fits(model, strategy):
        need = memory_bytes(model, strategy, cfg.memory.state_factor)
        raise TopoOptError(f"strategy {describe(model, strategy)} needs {need / 1e9:.1f} GB per "
                           f"node; nodes have {cfg.memory.gb:g} GB: shard the largest groups "
                           "further, or raise --memory-gb")
    p = cfg.net
    topo = build_topology(traffic(model, strategy, cfg.nodes), cfg.degree, cfg.gbps, cfg.split,
                          cfg.rings, cfg.matching, cfg.routing)
    best = Outcome("topoopt", strategy, evaluate(model, strategy, topo, p), topo, cfg.gbps)
    dp, dp_out = _dp_rings(model, cfg)
    ft = FatTree(cfg.nodes, cfg.fattree_gbps, p)
    eq = FatTree(cfg.nodes, cfg.degree * cfg.gbps, p)
    return SearchResult(model, cfg, best, dp_out,
                        Outcome("fat-tree", strategy, ft.evaluate(model, strategy), None, ft.gbps),
                        Outcome("fat-tree", dp, ft.evaluate(model, dp), None, ft.gbps),
                        Outcome("fat-tree", strategy, eq.evaluate(model, strategy), None,
                                eq.gbps),
                        SearchStats())
