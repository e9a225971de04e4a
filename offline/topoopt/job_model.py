"""TopoOpt's job model: layer groups, parallelisation strategies and the traffic they make.

A job is a model cut into **layer groups**. Each group has a parameter count, the activation
elements per sample at its boundary, how many times per pass a sharded copy exchanges them,
and a compute time for one node's batch. A **strategy** gives every group a model-parallel
degree m, a divisor of N:

- m = 1: data parallel. Every node holds the whole group; after the backward pass the N
  replicas all-reduce its gradient.
- m > 1: the group is sharded over blocks of m consecutive nodes ({0..m−1}, {m..2m−1}, …);
  sharded embeddings for an ``embedding`` group. The N/m replicas of each shard (nodes
  s, s+m, s+2m, …: TopoOpt's all-reduce groups, docs/sources.md §3.1) all-reduce 1/m of the
  gradient, and within a block every node sends every other one its samples' activations.

Traffic of a strategy (`traffic`), per iteration:

- all-reduce: per degree m, groups of g = N/m members all-reducing ``S_m = Σ params/m ·
  itemsize`` bytes (ring: each member sends 2(g−1)/g · S_m);
- model-parallel: per group with m > 1, every ordered pair of a block carries
  ``v = 2 · exchanges · batch · itemsize · (in_share + out_elems/m)`` bytes (forward
  activations and backward gradients; ``in_share = in_elems`` for a dense group, whose
  every shard needs the whole input, and ``in_elems/m`` for an embedding group, whose shards
  only need the indices of their own tables).

Assumptions (docs/explanation/topoopt.md): perfect partitioning, so a node's compute time does not depend
on the strategy; weak scaling (every node processes `batch` samples); a group's internal
activations stay local, only its boundary crosses the network `exchanges` times per pass.
The shipped models (`MODELS`, `get_model`) are in `oddl.offline.topoopt.model_zoo`; `Memory` is
what one node holds of a model's parameter state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oddl.common.errors import OddlError

KINDS = ("dense", "embedding")


class TopoOptError(OddlError):
    """Bad input to the TopoOpt co-optimiser: a model, strategy, N or degree it cannot serve."""


@dataclass(frozen=True)
class LayerGroup:
    """One layer group (sizes per sample; compute for one node's batch, forward + backward)."""

    name: str
    params: int
    in_elems: int
    """Activation elements per sample entering the group (indices for an embedding group)."""
    out_elems: int
    """Activation elements per sample leaving the group."""
    compute_ms: float
    exchanges: int = 1
    """Activation exchanges per pass when sharded (e.g. 2 per transformer layer)."""
    kind: str = "dense"


@dataclass(frozen=True)
class JobModel:
    """A model as layer groups, with the batch each node processes per iteration."""

    name: str
    groups: tuple[LayerGroup, ...]
    batch: int
    """Samples per node per iteration."""
    itemsize: int = 4
    """Bytes per parameter and activation element (4: fp32)."""
    source: str = ""

    @property
    def params(self) -> int:
        """Total parameters."""
        return sum(g.params for g in self.groups)

    @property
    def compute_s(self) -> float:
        """Forward + backward time of one node's batch (independent of the strategy)."""
        return sum(g.compute_ms for g in self.groups) / 1e3

    def index(self, name: str) -> int:
        """Position of the group called `name` (TopoOptError naming the groups if unknown)."""
        for i, g in enumerate(self.groups):
            if g.name == name:
                return i
        raise TopoOptError(f"model {self.name} has no layer group {name!r}; its groups are "
                           f"{', '.join(g.name for g in self.groups)}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (the model-file format)."""
        return {"name": self.name, "batch": self.batch, "itemsize": self.itemsize,
                "source": self.source,
                "groups": [{"name": g.name, "kind": g.kind, "params": g.params,
                            "in_elems": g.in_elems, "out_elems": g.out_elems,
                            "exchanges": g.exchanges, "compute_ms": g.compute_ms}
                           for g in self.groups]}


# --------------------------------------------------------------------------- strategies


Strategy = tuple[int, ...]
"""Model-parallel degree of every layer group, in the model's group order (1: data parallel)."""


def data_parallel(model: JobModel) -> Strategy:
    """The plain data-parallel strategy: every group replicated on every node."""
    return (1,) * len(model.groups)


def divisors(n: int) -> tuple[int, ...]:
    """Divisors of n, ascending: the model-parallel degrees N can split a group into."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def describe(model: JobModel, strategy: Strategy) -> str:
    """``"dp"`` or ``"name=m,name=m"`` for the groups that are sharded (the `parse` format)."""
    parts = [f"{g.name}={m}" for g, m in zip(model.groups, strategy, strict=True) if m > 1]
    return ",".join(parts) or "dp"


def parse_strategy(model: JobModel, text: str, nodes: int) -> Strategy:
    """Parse ``dp`` or ``group=m,group=m`` (unnamed groups data parallel) and check it splits N."""
    out = list(data_parallel(model))
    text = text.strip()
    if text and text.lower() != "dp":
        for item in text.split(","):
            name, sep, value = item.partition("=")
            if not sep:
                raise TopoOptError(f"bad strategy item {item!r}; write group=degree, e.g. "
                                   f"{model.groups[-1].name}=2, or dp")
            try:
                m = int(value)
            except ValueError:
                raise TopoOptError(f"strategy {name.strip()}={value!r}: the degree must be a "
                                   "whole number") from None
            out[model.index(name.strip())] = m
    strategy = tuple(out)
    check_split(model, strategy, nodes)
    return strategy


def check_split(model: JobModel, strategy: Strategy, nodes: int) -> None:
    """Raise TopoOptError unless every degree is ≥ 1 and divides N."""
    if len(strategy) != len(model.groups):
        raise TopoOptError(f"strategy has {len(strategy)} degrees; model {model.name} has "
                           f"{len(model.groups)} groups")
    for g, m in zip(model.groups, strategy, strict=True):
        if m < 1 or nodes % m:
            raise TopoOptError(
                f"{nodes} nodes cannot be split into blocks of {m} for group {g.name}: the "
                f"model-parallel degree must divide N; use one of "
                f"{', '.join(map(str, divisors(nodes)))}, or a node count that is a multiple "
                f"of {m}")


def memory_bytes(model: JobModel, strategy: Strategy, state_factor: float) -> float:
    """Bytes of parameter state one node holds: Σ params/m · itemsize · state_factor."""
    return sum(g.params / m for g, m in zip(model.groups, strategy, strict=True)) \
        * model.itemsize * state_factor


@dataclass(frozen=True)
class Traffic:
    """What a strategy puts on the network in one iteration (bytes)."""

    allreduce: tuple[tuple[int, float], ...]
    """(m, S_m): the all-reduce groups of N/m members, each all-reducing S_m bytes."""
    mp: tuple[tuple[int, float, int], ...]
    """(m, v, exchanges): a sharded group; v bytes per ordered pair of every m-block."""
    nodes: int

    @property
    def ar_bytes_per_node(self) -> float:
        """Bytes one node sends for all-reduces (ring: 2(g−1)/g · S per group)."""
        n = self.nodes
        return sum(2.0 * (n // m - 1) / (n // m) * s for m, s in self.allreduce)

    @property
    def mp_bytes_per_node(self) -> float:
        """Bytes one node sends to its block peers."""
        return sum((m - 1) * v for m, v, _ in self.mp)

    def mp_by_degree(self) -> tuple[tuple[int, float], ...]:
        """Pair volume summed per degree m (the demand the matchings see)."""
        acc: dict[int, float] = {}
        for m, v, _ in self.mp:
            acc[m] = acc.get(m, 0.0) + v
        return tuple(sorted(acc.items()))

    @property
    def key(self) -> tuple[Any, ...]:
        """What the topology built for this traffic depends on (a cache key)."""
        return (self.nodes, self.allreduce, self.mp_by_degree())


def traffic(model: JobModel, strategy: Strategy, nodes: int) -> Traffic:
    """The all-reduce groups and model-parallel demand of `strategy` on N nodes."""
    ar: dict[int, float] = {}
    mp: list[tuple[int, float, int]] = []
    b, item = model.batch, model.itemsize
    for g, m in zip(model.groups, strategy, strict=True):
        if nodes // m > 1 and g.params:
            ar[m] = ar.get(m, 0.0) + g.params / m * item
        if m > 1:
            share = g.in_elems / m if g.kind == "embedding" else g.in_elems
            v = 2.0 * g.exchanges * b * item * (share + g.out_elems / m)
            mp.append((m, v, g.exchanges))
    return Traffic(tuple(sorted(ar.items())), tuple(mp), nodes)


@dataclass(frozen=True)
class Memory:
    """Per-node memory for parameter state (weights, gradient, optimiser slots)."""

    gb: float = 40.0
    """A100-40GB, as in TopoOpt's testbed (docs/sources.md §3.4)."""
    state_factor: float = 3.0
    """Copies of each parameter a node keeps: weight, gradient, one optimiser slot."""

    def fits(self, model: JobModel, strategy: Strategy) -> bool:
        """Whether one node holds its share of the parameter state."""
        return memory_bytes(model, strategy, self.state_factor) <= self.gb * 1e9
