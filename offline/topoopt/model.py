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
Our shipped profiles are computed from the architectures; the parameter counts and MACs of
VGG19 and ResNet50 equal torchvision's (and `offline.workloads`). The profiles of the
authors' experiments (``dlrm-topoopt``, ``vgg16-topoopt``, ``bert-topoopt``) come from
`offline.topoopt.profiles` and are registered in `MODELS` at the end of this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import OddlError
from offline.workloads import SUSTAINED_TFLOPS, compute_s

KINDS = ("dense", "embedding")

HBM_GBYTES_S = 1555.0
"""A100-40GB memory bandwidth (GB/s): the rate of embedding lookups and updates."""


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


# --------------------------------------------------------------------------- shipped models


def _compute_ms(batch: int, gmacs: float, tflops: float = SUSTAINED_TFLOPS) -> float:
    """`offline.workloads.compute_s` in ms: batch · 3 passes · 2 FLOPs per MAC / sustained rate."""
    return compute_s(batch, gmacs, tflops) * 1e3


def vgg19(batch: int = 64) -> JobModel:
    """VGG19 on 224×224 images: five conv blocks and three FC layers (torchvision's layout)."""
    groups: list[LayerGroup] = []
    c, h = 3, 224
    for i, widths in enumerate(((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4)):
        params = macs = 0
        cin = c
        for co in widths:
            params += 9 * c * co + co
            macs += h * h * 9 * c * co
            c = co
        groups.append(LayerGroup(f"conv{i + 1}", params, cin * h * h, c * (h // 2) ** 2,
                                 _compute_ms(batch, macs / 1e9), exchanges=len(widths)))
        h //= 2
    for name, i, o in (("fc6", 25088, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000)):
        groups.append(LayerGroup(name, i * o + o, i, o, _compute_ms(batch, i * o / 1e9)))
    return JobModel("vgg19", tuple(groups), batch, 4,
                    "architecture (Simonyan & Zisserman 2015, configuration E); totals equal "
                    "torchvision's vgg19: 143,667,240 parameters, 19.63 GMACs")


def resnet50(batch: int = 64) -> JobModel:
    """ResNet50 (v1.5, stride on the 3×3 conv): stem, four stages, FC."""
    groups = [LayerGroup("stem", 7 * 7 * 3 * 64 + 2 * 64, 3 * 224 * 224, 64 * 56 * 56,
                         _compute_ms(batch, 112 * 112 * 7 * 7 * 3 * 64 / 1e9))]
    cin, h = 64, 56
    for si, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        params = macs = 0
        first_in = cin * h * h
        for b in range(blocks):
            ho = h // 2 if (b == 0 and si > 0) else h
            params += cin * planes + 9 * planes * planes + planes * planes * 4 + 2 * 6 * planes
            macs += h * h * cin * planes + ho * ho * (9 * planes * planes + 4 * planes * planes)
            if b == 0:
                params += cin * planes * 4 + 2 * planes * 4
                macs += ho * ho * cin * planes * 4
            cin, h = planes * 4, ho
        groups.append(LayerGroup(f"stage{si + 1}", params, first_in, cin * h * h,
                                 _compute_ms(batch, macs / 1e9), exchanges=3 * blocks))
    groups.append(LayerGroup("fc", 2048 * 1000 + 1000, 2048, 1000,
                             _compute_ms(batch, 2048 * 1000 / 1e9)))
    return JobModel("resnet50", tuple(groups), batch, 4,
                    "architecture (He et al. 2016, torchvision v1.5); totals equal torchvision's "
                    "resnet50: 25,557,032 parameters, 4.09 GMACs")


def bert_large(batch: int = 8, seq: int = 512, masked: int = 80) -> JobModel:
    """BERT-large pre-training (24 layers, hidden 1024, vocabulary 30522) in 4 groups of 6
    encoder layers; a sharded encoder group exchanges seq×hidden twice per layer (Megatron)."""
    h, vocab, layers_per_group = 1024, 30522, 6
    emb = vocab * h + 512 * h + 2 * h + 2 * h
    layer = 3 * (h * h + h) + (h * h + h) + 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * h
    layer_macs = seq * (12 * h * h + 2 * seq * h)  # linear layers + attention scores and sums
    heads = (h * h + h) + (h * h + h + 2 * h) + vocab + (2 * h + 2)  # pooler, MLM, NSP
    heads_macs = h * h + masked * (h * h + h * vocab) + 2 * h
    act = seq * h
    groups = [LayerGroup("embeddings", emb, 2 * seq, act, 0.0, kind="embedding")]
    for i in range(4):
        groups.append(LayerGroup(f"encoder{i + 1}", layers_per_group * layer, act, act,
                                 _compute_ms(batch, layers_per_group * layer_macs / 1e9),
                                 exchanges=2 * layers_per_group))
    groups.append(LayerGroup("heads", heads, act, 2 + masked, _compute_ms(batch, heads_macs / 1e9)))
    return JobModel("bert-large", tuple(groups), batch, 4,
                    f"architecture (Devlin et al. 2019, BERT-large with pre-training heads, "
                    f"MLM decoder tied to the word embeddings); {seq}-token sequences, "
                    f"{masked} masked positions")


DLRM_TABLES = (3, 4, 10, 14, 36, 61, 101, 122, 970, 1442, 2208, 7112, 7378, 11156, 12420, 17217,
               20134, 36084, 313829, 415421, 1333352, 7267859, 9758201, 9946608, 9980333,
               9994222)
"""Rows of the 26 tables: facebookresearch/dlrm's Criteo Terabyte configuration with
``--max-ind-range=10000000`` (its ``--arch-embedding-size``)."""


def dlrm(batch: int = 2048, dim: int = 64) -> JobModel:
    """A DLRM on Criteo Terabyte (facebookresearch/dlrm's terabyte run: dim 64, bottom MLP
    13-512-256-64, top MLP 512-512-256-1): 3.08 G parameters, almost all in 26 tables."""
    big = [r for r in DLRM_TABLES if r >= 1_000_000]
    small = [r for r in DLRM_TABLES if r < 1_000_000]

    def emb_ms(n_tables: int) -> float:  # lookup + gradient read + update, HBM-bound
        return batch * n_tables * dim * 4 * 3 / (HBM_GBYTES_S * 1e9) * 1e3

    def mlp(widths: Sequence[int]) -> tuple[int, int]:
        p = sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))
        return p, sum(a * b for a, b in zip(widths, widths[1:], strict=False))

    n_vec = len(DLRM_TABLES) + 1
    pairs = n_vec * (n_vec - 1) // 2
    bot_p, bot_m = mlp((13, 512, 256, dim))
    top_p, top_m = mlp((dim + pairs, 512, 512, 256, 1))
    inter_macs = n_vec * n_vec * dim
    groups = (
        LayerGroup("emb-big", sum(big) * dim, 2 * len(big), len(big) * dim,
                   emb_ms(len(big)), kind="embedding"),
        LayerGroup("emb-small", sum(small) * dim, 2 * len(small), len(small) * dim,
                   emb_ms(len(small)), kind="embedding"),
        LayerGroup("bottom-mlp", bot_p, 13, dim, _compute_ms(batch, bot_m / 1e9), exchanges=3),
        LayerGroup("top-mlp", top_p, dim + pairs, 1,
                   _compute_ms(batch, (top_m + inter_macs) / 1e9), exchanges=4),
    )
    return JobModel("dlrm", groups, batch, 4,
                    "facebookresearch/dlrm Criteo Terabyte configuration (max-ind-range 10M, "
                    "sparse feature size 64); one lookup per table per sample; "
                    f"batch {batch} per node")


MODELS: dict[str, JobModel] = {m.name: m for m in (vgg19(), resnet50(), bert_large(), dlrm())}
"""Shipped job models by name: ours, then the profiles of the authors' experiment scripts."""


def get_model(name: str) -> JobModel:
    """The shipped model called `name` (TopoOptError listing them if unknown)."""
    m = MODELS.get(name)
    if m is None:
        raise TopoOptError(f"unknown model {name!r}; shipped models: {', '.join(MODELS)} "
                           "(or give --model-file FILE)")
    return m


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


from offline.topoopt.profiles import authors_models  # noqa: E402  (no cycle: see there)

MODELS.update(authors_models())
