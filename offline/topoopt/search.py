"""TopoOpt's alternating optimisation: simulated annealing over strategies, topology rebuilt.

Reconstruction of papers.md §3.3 (``FFModel::optimize``, ``SpMulMat::optimize`` [authors'
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

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from offline.topoopt.evaluation import Breakdown, CostModel, FatTree, NetParams, evaluate
from offline.topoopt.model import (
    JobModel,
    Memory,
    Strategy,
    TopoOptError,
    check_split,
    data_parallel,
    describe,
    divisors,
    memory_bytes,
    traffic,
)
from offline.topoopt.our_construction import SPLITS
from offline.topoopt.topology import VARIANTS, FabricTopology, build_topology

DEFAULT_BUDGET = 4000
"""Iterations of the default search, as the authors' (see benchmarks/bench_topoopt.py)."""

Progress = Callable[["SearchProgress"], None]


@dataclass(frozen=True)
class SearchConfig:
    """Everything the co-optimiser needs besides the model."""

    nodes: int
    degree: int = 4
    gbps: float = 100.0
    """Rate of each of the `degree` interfaces (Gbit/s)."""
    transceivers: int = 8
    """Interfaces a node has; the degree cannot exceed it."""
    budget: int = DEFAULT_BUDGET
    seed: int = 1
    alpha: float = 1.0
    """Acceptance exp(−α·Δt), Δt in ms, for strategy moves."""
    topo_alpha: float = 0.5
    """The same for a rebuilt topology."""
    patience: int = 50
    """Rebuild the topology after this many iterations without a new best."""
    split: str = "proportional"
    search: str = "authors"
    """``authors``: `anneal_authors` (their rebuild policy); ``ours``: `anneal`."""
    rings: str = "authors"
    matching: str = "authors"
    routing: str = "authors"
    """Construction and routing variants (`topoopt_topology.build_topology`)."""
    lookahead: bool = False
    """Ours (``search="ours"`` only): a move rejected on the current topology is also tried
    on the topology built for it (the pair is accepted by the same rule)."""
    max_mp: int = 0
    """Largest model-parallel degree tried (0: N)."""
    ft_gbps: float = 0.0
    """Host rate of the fat-tree baseline (0: the similar-cost rate from `cost`)."""
    memory: Memory = field(default_factory=Memory)
    net: NetParams = field(default_factory=NetParams)
    cost: CostModel = field(default_factory=CostModel)

    def validate(self) -> None:
        """Raise TopoOptError naming the first bad value and the fix."""
        if self.nodes < 2:
            raise TopoOptError(f"nodes must be >= 2; got {self.nodes}")
        if self.degree < 2:
            raise TopoOptError(f"degree must be >= 2 (one ring); got {self.degree}, use 2")
        if self.degree > self.transceivers:
            raise TopoOptError(
                f"degree {self.degree} needs {self.degree} transceivers per node, but the "
                f"nodes have {self.transceivers}; use --degree {self.transceivers} or less, or "
                f"--transceivers {self.degree} if the nodes have that many")
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise TopoOptError(f"gbps must be a positive rate per interface; got {self.gbps}")
        if self.budget < 0:
            raise TopoOptError(f"budget must be >= 0 iterations; got {self.budget}")
        if self.split not in SPLITS:
            raise TopoOptError(f"split must be one of {', '.join(SPLITS)}; got {self.split!r}")
        if self.lookahead and self.search != "ours":
            raise TopoOptError("lookahead belongs to our search: add --search ours "
                               "(search='ours'); the authors' search has its own look-ahead")
        for name in ("search", "rings", "matching", "routing"):
            if getattr(self, name) not in VARIANTS:
                raise TopoOptError(f"{name} must be one of {', '.join(VARIANTS)}; got "
                                   f"{getattr(self, name)!r}")
        if self.max_mp < 0:
            raise TopoOptError(f"max_mp must be >= 0 (0: N); got {self.max_mp}")
        if self.ft_gbps < 0 or not math.isfinite(self.ft_gbps):
            raise TopoOptError(f"ft_gbps must be >= 0 (0: similar cost); got {self.ft_gbps}")
        for name, v in (("alpha", self.alpha), ("topo_alpha", self.topo_alpha),
                        ("memory_gb", self.memory.gb), ("patience", self.patience)):
            if not (math.isfinite(v) and v > 0):
                raise TopoOptError(f"{name} must be > 0; got {v}")

    @property
    def degrees(self) -> tuple[int, ...]:
        """Model-parallel degrees the search may give a group."""
        top = self.max_mp or self.nodes
        return tuple(d for d in divisors(self.nodes) if d <= top)

    @property
    def fattree_gbps(self) -> float:
        """Host rate of the fat-tree baseline."""
        return self.ft_gbps or self.cost.equal_cost_fattree_gbps(self.nodes, self.degree,
                                                                 self.gbps, self.net)


@dataclass(frozen=True)
class SearchProgress:
    """A progress report (also the last one, with ``iteration == budget``)."""

    network: str
    iteration: int
    budget: int
    best_s: float
    current_s: float
    accepted: int
    topologies: int
    elapsed_s: float


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


@dataclass
class SearchStats:
    """What the search did."""

    iterations: int = 0
    accepted: int = 0
    rejected_memory: int = 0
    topologies_built: int = 0
    topology_cache_hits: int = 0
    rebuilds: int = 0
    """Times the search took a topology rebuilt for a strategy (cached or not)."""
    restores: int = 0
    elapsed_s: float = 0.0
    best_at: int = 0
    """Iteration of the last new best."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """(iteration, best iteration time in s) at every new best."""


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


# --------------------------------------------------------------------------- the search


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


def initial_strategy(model: JobModel, cfg: SearchConfig) -> Strategy:
    """Data parallel, or the largest groups sharded (smallest degrees) until it fits in memory."""
    s = list(data_parallel(model))
    options = cfg.degrees
    while not cfg.memory.fits(model, tuple(s)):
        grow = [i for i in range(len(s)) if s[i] != options[-1]]
        if not grow:
            need = memory_bytes(model, tuple(s), cfg.memory.state_factor)
            raise TopoOptError(
                f"{model.name} does not fit on {cfg.nodes} nodes with {cfg.memory.gb:g} GB each "
                f"even fully sharded ({need / 1e9:.1f} GB per node); use more nodes (a "
                f"multiple of the shard count), --memory-gb, or --max-mp up to {cfg.nodes}")
        i = max(grow, key=lambda k: model.groups[k].params / s[k])
        s[i] = options[options.index(s[i]) + 1] if s[i] in options else options[1]
    return tuple(s)


def anneal(model: JobModel, cfg: SearchConfig, evaluate_on: Callable[[Strategy, Any], float],
           rebuild: Callable[[Strategy], Any] | None, context: Any, network: str,
           progress: Progress | None = None, stats: SearchStats | None = None
           ) -> tuple[Strategy, Any, float, SearchStats]:
    """Simulated annealing over strategies (module docstring); returns (strategy, context,
    time, stats). `rebuild` derives a new context (topology) for a strategy, or None."""
    stats = stats or SearchStats()
    rng = np.random.default_rng(cfg.seed)
    options = cfg.degrees
    t0 = time.perf_counter()
    cur = initial_strategy(model, cfg)
    ctx = rebuild(cur) if rebuild else context
    cur_t = evaluate_on(cur, ctx)
    best, best_ctx, best_t = cur, ctx, cur_t
    stats.history.append((0, best_t))
    restore = min(max(cfg.budget // 100, 1), 1000)
    since_best = 0
    report = max(cfg.budget // 10, 1)
    last_report = time.perf_counter()
    for it in range(1, cfg.budget + 1):
        stats.iterations = it
        cand = _mutate(cur, options, rng)
        if not cfg.memory.fits(model, cand):
            stats.rejected_memory += 1
        else:
            t = evaluate_on(cand, ctx)
            if _accept(t, cur_t, cfg.alpha, rng):
                cur, cur_t = cand, t
                stats.accepted += 1
                if rebuild:
                    ctx, cur_t = _retopo(cur, ctx, cur_t, rebuild, evaluate_on, cfg, rng)
            elif rebuild and cfg.lookahead:
                own = rebuild(cand)
                t = evaluate_on(cand, own) if own is not ctx else t
                if own is not ctx and _accept(t, cur_t, cfg.alpha, rng):
                    cur, ctx, cur_t = cand, own, t
                    stats.accepted += 1
        if cur_t < best_t:
            best, best_ctx, best_t = cur, ctx, cur_t
            stats.best_at = it
            stats.history.append((it, best_t))
            since_best = 0
        else:
            since_best += 1
            if rebuild and since_best % cfg.patience == 0:
                ctx, cur_t = _retopo(cur, ctx, cur_t, rebuild, evaluate_on, cfg, rng)
        if it % restore == 0 and (cur, ctx) != (best, best_ctx):
            cur, ctx, cur_t = best, best_ctx, best_t
            stats.restores += 1
        now = time.perf_counter()
        if progress and (it % report == 0 or now - last_report > 1.0 or it == cfg.budget):
            last_report = now
            progress(SearchProgress(network, it, cfg.budget, best_t, cur_t, stats.accepted,
                                    stats.topologies_built, now - t0))
    stats.elapsed_s = time.perf_counter() - t0
    return best, best_ctx, best_t, stats


def anneal_authors(model: JobModel, cfg: SearchConfig,
                   evaluate_on: Callable[[Strategy, Any], float],
                   rebuild: Callable[[Strategy], Any] | None, context: Any, network: str,
                   progress: Progress | None = None, stats: SearchStats | None = None
                   ) -> tuple[Strategy, Any, float, SearchStats]:
    """The authors' search (``FFModel::optimize`` with ``SpMulMat::optimize``).

    Each iteration: every `restore` iterations back to the best strategy *and the topology
    it was measured on*; a random move is measured on the current topology. A new best is
    recorded with that topology, then the topology is rebuilt for the move's traffic; an
    accepted move (faster, else with probability exp(−α·Δt)) rebuilds it too. Then the
    topology optimiser's own rule runs on the move's time against its last accepted time
    (faster, or exp(−α_topo·Δt), or 50 calls without a change): it rebuilds the topology for
    the *move's* traffic even when the move was rejected — their look-ahead: the next moves
    are judged on a topology built for a neighbour. A rebuilt topology is not measured before
    it is taken. Without `rebuild` this is plain annealing (the fat-tree's search).
    """
    stats = stats or SearchStats()
    rng = np.random.default_rng(cfg.seed)
    options = cfg.degrees
    t0 = time.perf_counter()
    cur = initial_strategy(model, cfg)
    ctx = rebuild(cur) if rebuild else context
    cur_t = evaluate_on(cur, ctx)
    best, best_ctx, best_t = cur, ctx, cur_t
    stats.history.append((0, best_t))
    restore = min(max(cfg.budget // 100, 1), 1000)
    l1 = {"cur": cur_t, "best": cur_t, "idle": 0}
    report = max(cfg.budget // 10, 1)
    last_report, last_reset = time.perf_counter(), 0

    def topo_step(s: Strategy, t: float, forced: bool) -> None:
        nonlocal ctx
        diff = (t - l1["cur"]) * 1e3
        change = diff < 0 or (diff != 0 and rng.random() < math.exp(-cfg.topo_alpha * diff))
        if t < l1["best"]:
            l1["best"], change = t, True
        if change:
            l1["cur"] = t
        else:
            l1["idle"] += 1
        if not forced and not change and l1["idle"] < cfg.patience:
            return
        l1["idle"] = 0
        if rebuild:
            ctx = rebuild(s)
            stats.rebuilds += 1

    for it in range(1, cfg.budget + 1):
        stats.iterations = it
        if it - last_reset >= restore:
            cur, ctx, cur_t, last_reset = best, best_ctx, best_t, it
            stats.restores += 1
        cand = _mutate(cur, options, rng)
        if not cfg.memory.fits(model, cand):
            stats.rejected_memory += 1
            continue
        t = evaluate_on(cand, ctx)
        if t < best_t:
            best, best_ctx, best_t = cand, ctx, t
            stats.best_at = it
            stats.history.append((it, best_t))
            topo_step(cand, t, True)
        if _accept(t, cur_t, cfg.alpha, rng):
            cur, cur_t = cand, t
            stats.accepted += 1
            topo_step(cand, t, True)
        topo_step(cand, t, False)
        now = time.perf_counter()
        if progress and (it % report == 0 or now - last_report > 1.0 or it == cfg.budget):
            last_report = now
            progress(SearchProgress(network, it, cfg.budget, best_t, cur_t, stats.accepted,
                                    stats.topologies_built, now - t0))
    stats.elapsed_s = time.perf_counter() - t0
    return best, best_ctx, best_t, stats


def _mutate(s: Strategy, options: tuple[int, ...], rng: np.random.Generator) -> Strategy:
    out = list(s)
    i = int(rng.integers(len(s)))
    k = options.index(s[i]) if s[i] in options else 0
    if len(options) == 1:
        return s
    if rng.random() < 0.5:
        step = -1 if k == len(options) - 1 else 1 if k == 0 else int(rng.choice((-1, 1)))
        out[i] = options[k + step]
    else:
        others = [d for d in options if d != s[i]]
        out[i] = others[int(rng.integers(len(others)))]
    return tuple(out)


def _accept(t: float, cur: float, alpha: float, rng: np.random.Generator) -> bool:
    if t < cur:
        return True
    return bool(rng.random() < math.exp(-alpha * (t - cur) * 1e3))


def _retopo(s: Strategy, ctx: Any, cur_t: float, rebuild: Callable[[Strategy], Any],
            evaluate_on: Callable[[Strategy, Any], float], cfg: SearchConfig,
            rng: np.random.Generator) -> tuple[Any, float]:
    new = rebuild(s)
    if new is ctx:
        return ctx, cur_t
    t = evaluate_on(s, new)
    if _accept(t, cur_t, cfg.topo_alpha, rng):
        return new, t
    return ctx, cur_t


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
    dp = data_parallel(model)
    if not cfg.memory.fits(model, dp):
        dp = initial_strategy(model, cfg)
    dp_topo = _dp_topology(model, cfg, dp)
    dp_out = Outcome("dp-rings", dp, evaluate(model, dp, dp_topo, p), dp_topo, cfg.gbps)
    ft = FatTree(cfg.nodes, cfg.fattree_gbps, p)
    ft_out = _fat_tree_search(model, cfg, ft, progress)
    ft_dp = Outcome("fat-tree", dp, ft.evaluate(model, dp), None, ft.gbps)
    eq = FatTree(cfg.nodes, cfg.degree * cfg.gbps, p)
    eq_out = _fat_tree_search(model, cfg, eq, None)
    return SearchResult(model, cfg, best, dp_out, ft_out, ft_dp, eq_out, stats)


def _dp_topology(model: JobModel, cfg: SearchConfig, dp: Strategy) -> FabricTopology:
    """The data-parallel baseline's topology: every interface to rings."""
    return build_topology(traffic(model, dp, cfg.nodes), cfg.degree, cfg.gbps, "all-dp",
                          cfg.rings, cfg.matching, cfg.routing)


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
    dp = data_parallel(model)
    if not cfg.memory.fits(model, dp):
        dp = initial_strategy(model, cfg)
    dp_topo = _dp_topology(model, cfg, dp)
    dp_out = Outcome("dp-rings", dp, evaluate(model, dp, dp_topo, p), dp_topo, cfg.gbps)
    ft = FatTree(cfg.nodes, cfg.fattree_gbps, p)
    eq = FatTree(cfg.nodes, cfg.degree * cfg.gbps, p)
    return SearchResult(model, cfg, best, dp_out,
                        Outcome("fat-tree", strategy, ft.evaluate(model, strategy), None, ft.gbps),
                        Outcome("fat-tree", dp, ft.evaluate(model, dp), None, ft.gbps),
                        Outcome("fat-tree", strategy, eq.evaluate(model, strategy), None,
                                eq.gbps),
                        SearchStats())
