"""TopoOpt's shipped job models by name (`MODELS`, `get_model`): ours and the authors'.

Ours are computed from the architectures (`vgg19`, `resnet50`, `bert_large`, `dlrm`); the
parameter counts and MACs of VGG19 and ResNet50 equal torchvision's (and `oddl.offline.workloads`).
The profiles of the authors' experiments (``dlrm-topoopt``, ``vgg16-topoopt``,
``bert-topoopt``) come from `oddl.offline.topoopt.profiles`. What a job model is (layer groups,
strategies, traffic): `oddl.offline.topoopt.job_model`.
"""

from __future__ import annotations

from collections.abc import Sequence

from oddl.offline.topoopt.job_model import JobModel, LayerGroup, TopoOptError
from oddl.offline.topoopt.profiles import authors_models
from oddl.offline.workloads import SUSTAINED_TFLOPS, compute_s

HBM_GBYTES_S = 1555.0
"""A100-40GB memory bandwidth (GB/s): the rate of embedding lookups and updates."""


def _compute_ms(batch: int, gmacs: float, tflops: float = SUSTAINED_TFLOPS) -> float:
    """`oddl.offline.workloads.compute_s` in ms: batch · 3 passes · 2 FLOPs per MAC / sustained rate."""
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


MODELS: dict[str, JobModel] = {
    **{m.name: m for m in (vgg19(), resnet50(), bert_large(), dlrm())}, **authors_models()}
"""Shipped job models by name: ours, then the profiles of the authors' experiment scripts."""


def get_model(name: str) -> JobModel:
    """The shipped model called `name` (TopoOptError listing them if unknown)."""
    m = MODELS.get(name)
    if m is None:
        raise TopoOptError(f"unknown model {name!r}; shipped models: {', '.join(MODELS)} "
                           "(or give --model-file FILE)")
    return m
