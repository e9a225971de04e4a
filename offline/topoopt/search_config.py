"""What the TopoOpt co-optimiser is asked (`SearchConfig`) and what it reports on the way
(`SearchProgress`, `SearchStats`); the search itself is `oddl.offline.topoopt.search`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from oddl.offline.topoopt.evaluation import CostModel, NetParams
from oddl.offline.topoopt.job_model import Memory, TopoOptError, divisors
from oddl.offline.topoopt.our_construction import SPLITS
from oddl.offline.topoopt.topology import VARIANTS

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
