"""Simulated annealing over parallelisation strategies: ours (`anneal`) and the authors'
(`anneal_authors`, ``FFModel::optimize`` with ``SpMulMat::optimize``).

Both start from `initial_strategy`, rewrite one random layer group's model-parallel degree per
iteration (`_mutate`), accept by exp(−α·Δt) (`_accept`) and return to the best pair every
`restore` iterations; they differ in when the topology is rebuilt (`oddl.offline.topoopt.search`'s
module docstring). The topology is an opaque context: `rebuild` derives it for a strategy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from oddl.offline.topoopt.job_model import (
    JobModel,
    Strategy,
    TopoOptError,
    data_parallel,
    memory_bytes,
)
from oddl.offline.topoopt.search_config import Progress, SearchConfig, SearchProgress, SearchStats

Evaluate = Callable[[Strategy, Any], float]
"""Iteration time (s) of a strategy on a context (topology)."""
Rebuild = Callable[[Strategy], Any]
"""The context (topology) built for a strategy's traffic."""


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


class _Start:
    """The state both searches start from, and their progress reports."""

    def __init__(self, model: JobModel, cfg: SearchConfig, evaluate_on: Evaluate,
                 rebuild: Rebuild | None, context: Any, network: str,
                 progress: Progress | None, stats: SearchStats | None) -> None:
        self.stats = stats or SearchStats()
        self.rng = np.random.default_rng(cfg.seed)
        self.options = cfg.degrees
        self.t0 = time.perf_counter()
        self.cur = initial_strategy(model, cfg)
        self.ctx = rebuild(self.cur) if rebuild else context
        self.cur_t = evaluate_on(self.cur, self.ctx)
        self.stats.history.append((0, self.cur_t))
        self.restore = min(max(cfg.budget // 100, 1), 1000)
        self.network, self.budget, self.progress = network, cfg.budget, progress
        self.every = max(cfg.budget // 10, 1)
        self.last_report = time.perf_counter()

    def report(self, it: int, best_t: float, cur_t: float) -> None:
        """Call `progress` every tenth of the budget, at least every second, and at the end."""
        now = time.perf_counter()
        if self.progress and (it % self.every == 0 or now - self.last_report > 1.0
                              or it == self.budget):
            self.last_report = now
            self.progress(SearchProgress(self.network, it, self.budget, best_t, cur_t,
                                         self.stats.accepted, self.stats.topologies_built,
                                         now - self.t0))

    def finish(self) -> SearchStats:
        """The stats, with the elapsed time."""
        self.stats.elapsed_s = time.perf_counter() - self.t0
        return self.stats


def anneal(model: JobModel, cfg: SearchConfig, evaluate_on: Evaluate, rebuild: Rebuild | None,
           context: Any, network: str, progress: Progress | None = None,
           stats: SearchStats | None = None) -> tuple[Strategy, Any, float, SearchStats]:
    """Simulated annealing over strategies (module docstring); returns (strategy, context,
    time, stats). `rebuild` derives a new context (topology) for a strategy, or None."""
    st = _Start(model, cfg, evaluate_on, rebuild, context, network, progress, stats)
    stats, rng, cur, ctx, cur_t = st.stats, st.rng, st.cur, st.ctx, st.cur_t
    best, best_ctx, best_t = cur, ctx, cur_t
    since_best = 0
    for it in range(1, cfg.budget + 1):
        stats.iterations = it
        cand = _mutate(cur, st.options, rng)
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
        if it % st.restore == 0 and (cur, ctx) != (best, best_ctx):
            cur, ctx, cur_t = best, best_ctx, best_t
            stats.restores += 1
        st.report(it, best_t, cur_t)
    return best, best_ctx, best_t, st.finish()


class _TopologyRule:
    """The authors' topology optimiser's own acceptance rule (``SpMulMat::optimize``): rebuild
    when a strategy's time is better, or with probability exp(−α_topo·Δt), or after
    `patience` calls without a change; `forced` rebuilds anyway."""

    def __init__(self, t: float, cfg: SearchConfig, rng: np.random.Generator,
                 rebuild: Rebuild | None, stats: SearchStats) -> None:
        self.cur = self.best = t
        self.idle = 0
        self.alpha, self.patience, self.rng = cfg.topo_alpha, cfg.patience, rng
        self.rebuild, self.stats = rebuild, stats

    def step(self, s: Strategy, t: float, forced: bool, ctx: Any) -> Any:
        """The context after the rule has seen strategy `s` at time `t` (rebuilt or `ctx`)."""
        diff = (t - self.cur) * 1e3
        change = diff < 0 or (diff != 0 and self.rng.random() < math.exp(-self.alpha * diff))
        if t < self.best:
            self.best, change = t, True
        if change:
            self.cur = t
        else:
            self.idle += 1
        if not forced and not change and self.idle < self.patience:
            return ctx
        self.idle = 0
        if self.rebuild:
            self.stats.rebuilds += 1
            return self.rebuild(s)
        return ctx


def anneal_authors(model: JobModel, cfg: SearchConfig, evaluate_on: Evaluate,
                   rebuild: Rebuild | None, context: Any, network: str,
                   progress: Progress | None = None, stats: SearchStats | None = None
                   ) -> tuple[Strategy, Any, float, SearchStats]:
    """The authors' search (``FFModel::optimize`` with ``SpMulMat::optimize``).

    Each iteration: every `restore` iterations back to the best strategy *and the topology
    it was measured on*; a random move is measured on the current topology. A new best is
    recorded with that topology, then the topology is rebuilt for the move's traffic; an
    accepted move (faster, else with probability exp(−α·Δt)) rebuilds it too. Then the
    topology optimiser's own rule (`_TopologyRule`) runs on the move's time against its last
    accepted time: it rebuilds the topology for the *move's* traffic even when the move was
    rejected — their look-ahead: the next moves are judged on a topology built for a
    neighbour. A rebuilt topology is not measured before it is taken. Without `rebuild` this
    is plain annealing (the fat-tree's search).
    """
    st = _Start(model, cfg, evaluate_on, rebuild, context, network, progress, stats)
    stats, rng, cur, ctx, cur_t = st.stats, st.rng, st.cur, st.ctx, st.cur_t
    best, best_ctx, best_t = cur, ctx, cur_t
    rule = _TopologyRule(cur_t, cfg, rng, rebuild, stats)
    last_reset = 0
    for it in range(1, cfg.budget + 1):
        stats.iterations = it
        if it - last_reset >= st.restore:
            cur, ctx, cur_t, last_reset = best, best_ctx, best_t, it
            stats.restores += 1
        cand = _mutate(cur, st.options, rng)
        if not cfg.memory.fits(model, cand):
            stats.rejected_memory += 1
            continue
        t = evaluate_on(cand, ctx)
        if t < best_t:
            best, best_ctx, best_t = cand, ctx, t
            stats.best_at = it
            stats.history.append((it, best_t))
            ctx = rule.step(cand, t, True, ctx)
        if _accept(t, cur_t, cfg.alpha, rng):
            cur, cur_t = cand, t
            stats.accepted += 1
            ctx = rule.step(cand, t, True, ctx)
        ctx = rule.step(cand, t, False, ctx)
        st.report(it, best_t, cur_t)
    return best, best_ctx, best_t, st.finish()


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
