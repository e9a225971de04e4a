"""Job profiles of TopoOpt's published experiments (``-topoopt`` models), next to ours.

Each profile takes its architecture and batch from the authors' experiment scripts
(hipersys-team/TopoOpt ``simulation/scripts/fig11_17/{dlrm,vgg,bert}128_dc.sh``: 128 servers
of 4 GPUs, ``--big-gpu 4``) and its compute times from their A100 measurements
(hipersys-team/FlexFlow ``measures/{dlrm,vgg,transformer}128.json``: forward + backward of
each operator at the 128-way data-parallel split, i.e. one server's share of the batch). Only
facts (sizes, measured milliseconds) are taken; the grouping into layer groups and the traffic
model are ours (docs/explanation/topoopt.md §1.1).

- ``dlrm-topoopt``: ``dlrm128_dc.sh`` — 64 tables of 10,000,000 × 128 (sum-pooled bags of
  100), bottom MLP 2048 → 2048 × 7, concatenation (2048 + 64·128 = 10,240), top MLP
  10240 → 4096, 4096 → 4096 × 14, 4096 → 1; 128 samples per GPU, 512 per server.
- ``vgg16-topoopt``: ``vgg128_dc.sh`` / FlexFlow ``examples/cpp/vgg16sim``: VGG16 on
  229 × 229 inputs with padding 2 (so fc6 has 512·11·11 = 61,952 inputs); 64 per GPU.
- ``bert-topoopt``: ``bert128_dc.sh`` / ``examples/cpp/Transformersim``: 12 layers, each an
  encoder (self-attention, two dense) and a decoder (self- and cross-attention, two dense),
  hidden 1024, 16 heads, sequence 64, a final dense to 1; 16 per GPU.

The profiles are `oddl.offline.topoopt.job_model` types; `oddl.offline.topoopt.model_zoo` lists them in
`MODELS` next to ours.
"""

from __future__ import annotations

from oddl.offline.topoopt.job_model import JobModel, LayerGroup

SCRIPTS = "hipersys-team/TopoOpt simulation/scripts/fig11_17"
MEASURES = "hipersys-team/FlexFlow measures"

# Forward + backward ms per operator at the 128-way split, from the measurement files.
DLRM_MS = {"dense_2048": 0.193536 + 0.296346, "embed": 4.30858 + 8.61716,
           "concat": 0.226202 + 0.226406, "dense_10240_4096": 0.614707 + 1.21088,
           "dense_4096": 0.269824 + 0.521523, "dense_4096_1": 0.0151552 + 0.040448}
VGG_MS = {64: 1.88518 + 6.18906, 128: 1.51757 + 4.69914, 256: 1.6855 + 3.21741,
          512: 1.45613 + 3.30035, "pool": 1.34922 + 3.10139, "flat": 0.0176128 + 0.0314368,
          "fc6": 2.08957 + 3.78675, "fc7": 0.174182 + 0.300442, "fc8": 0.0525312 + 0.097792,
          "softmax": 0.0070656 + 0.004096}
TRANSFORMER_MS = {"mha": 0.301261 + 0.602522, "add": 0.007168 + 0.0136192,
                  "dense": 0.146534 + 0.279142, "dense_1": 0.0108544 + 0.0468992}


def _dense(i: int, o: int) -> int:
    return i * o + o


def dlrm_topoopt(batch: int = 512, tables: int = 64, rows: int = 10_000_000,
                 dim: int = 128) -> JobModel:
    """DLRM of the authors' 128-server script (module docstring)."""
    bottom = 7 * _dense(2048, 2048)
    top_in = 2048 + tables * dim
    top = _dense(top_in, 4096) + 14 * _dense(4096, 4096) + _dense(4096, 1)
    ms = DLRM_MS
    groups = (
        # A table is one operator on one server in FlexFlow's DLRM; its 12.9 ms lookup of the
        # whole batch is the critical path. Indices come with the input (no network bytes).
        LayerGroup("tables", tables * rows * dim, 0, tables * dim, ms["embed"],
                   kind="embedding"),
        LayerGroup("bottom-mlp", bottom, 2048, 2048, 7 * ms["dense_2048"], exchanges=7),
        LayerGroup("top-mlp", top, top_in, 1, ms["concat"] + ms["dense_10240_4096"]
                   + 14 * ms["dense_4096"] + ms["dense_4096_1"], exchanges=16),
    )
    return JobModel("dlrm-topoopt", groups, batch, 4,
                    f"{SCRIPTS}/dlrm128_dc.sh (64 tables 10M x 128, bag 100, MLPs 2048x8 / "
                    f"4096x16-1, 128 per GPU x 4); compute from {MEASURES}/dlrm128.json")


def vgg16_topoopt(batch: int = 256) -> JobModel:
    """VGG16 of the authors' 128-server script (module docstring)."""
    groups = []
    c, h = 3, 229
    for i, widths in enumerate(((64, 64), (128, 128), (256,) * 3, (512,) * 3, (512,) * 3)):
        cin, params = c, 0
        hin = h
        for co in widths:
            params += 9 * c * co + co
            c, h = co, h + 2  # 3x3, stride 1, padding 2
        h = (h - 3) // 2 + 1  # 3x3 pool, stride 2
        groups.append(LayerGroup(f"conv{i + 1}", params, cin * hin * hin, c * h * h,
                                 len(widths) * VGG_MS[widths[0]] + VGG_MS["pool"],
                                 exchanges=len(widths)))
    flat = c * h * h
    for name, i, o, extra in (("fc6", flat, 4096, VGG_MS["flat"]), ("fc7", 4096, 4096, 0.0),
                              ("fc8", 4096, 1000, VGG_MS["softmax"])):
        groups.append(LayerGroup(name, _dense(i, o), i, o, VGG_MS[name] + extra))
    return JobModel("vgg16-topoopt", tuple(groups), batch, 4,
                    f"{SCRIPTS}/vgg128_dc.sh and FlexFlow examples/cpp/vgg16sim (229x229, "
                    f"padding 2, 64 per GPU x 4); compute from {MEASURES}/vgg128.json")


def bert_topoopt(batch: int = 64, layers: int = 12, hidden: int = 1024, seq: int = 64,
                 per_group: int = 3) -> JobModel:
    """The authors' 'BERT' transformer of the 128-server script (module docstring)."""
    mha = 4 * hidden * hidden  # q, k, v, output projections
    layer = 3 * mha + 4 * _dense(hidden, hidden)
    ms = TRANSFORMER_MS
    layer_ms = 3 * ms["mha"] + 3 * ms["add"] + 4 * ms["dense"]
    act = seq * hidden
    groups = [LayerGroup(f"layers{i + 1}-{i + per_group}", per_group * layer, act, act,
                         per_group * layer_ms, exchanges=4 * per_group)
              for i in range(0, layers, per_group)]
    groups.append(LayerGroup("head", _dense(hidden, 1), act, seq, ms["dense_1"]))
    return JobModel("bert-topoopt", tuple(groups), batch, 4,
                    f"{SCRIPTS}/bert128_dc.sh and FlexFlow examples/cpp/Transformersim (12 "
                    f"encoder-decoder layers, hidden 1024, 16 heads, seq 64, 16 per GPU x 4); "
                    f"compute from {MEASURES}/transformer128.json")


def authors_models() -> dict[str, JobModel]:
    """The three profiles by name."""
    return {m.name: m for m in (dlrm_topoopt(), vgg16_topoopt(), bert_topoopt())}
