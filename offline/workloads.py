"""Model profiles shared by the offline tools: gradient size and per-iteration compute time.

The simulator (`oddl.offline.simulator`) and the TopoOpt co-optimiser (`oddl.offline.topoopt`) both
import this module and nothing of each other.

Gradient size: the parameter count from the torchvision model docs (``num_params``), times the
bytes per element (fp32 by default). Compute time per iteration (forward + backward of one
data-parallel worker's batch) is estimated, not measured:

    compute_s = batch × 3 × 2 × GMACs·1e9 / sustained_flops

- GMACs: torchvision's "GFLOPS" column, which counts multiply-accumulates of one 224×224
  forward pass (VGG19: 19.63; Caffe2 lists the same network as 39.3 GFLOPs = 2 × 19.63).
  A forward pass is 2·MACs FLOPs and a training step ≈ 3 forward passes (backward ≈ 2×).
- sustained_flops: 63.8 TFLOP/s on one A100 with mixed precision, derived from a measured
  ResNet50 training throughput of ~2,600 images/s (timm ``benchmark.py``, A100, AMP,
  channels-last; huggingface/pytorch-image-models#1491): 2600 × 6 × 4.09e9 = 63.8e12.
  The same sustained rate is assumed for every model, so VGG19's compute time is scaled from
  ResNet50's by their FLOP ratio (VGG's large convolutions usually run at a higher rate, so
  this likely over-estimates VGG19's compute time, which makes network differences look
  smaller in iteration-time ratios; the communication-only ratios do not depend on it).
- batch: 64 per worker (TopoOpt's VGG setting, docs/sources.md §3.4).

Every number is overridable (``batch``, ``sustained_tflops``, ``compute_ms`` in `SimConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

SUSTAINED_TFLOPS = 63.8
"""Sustained training FLOP rate of one worker (A100, AMP), from ResNet50 at ~2,600 images/s."""

DEFAULT_BATCH = 64
"""Images per worker per iteration."""


@dataclass(frozen=True)
class ModelProfile:
    """One network: parameters (gradient elements) and forward multiply-accumulates per image."""

    name: str
    params: int
    gmacs: float
    """Forward multiply-accumulates per 224×224 image, in units of 1e9 (torchvision 'GFLOPS')."""
    source: str

    def gradient_bytes(self, itemsize: int = 4) -> int:
        """Bytes of one full gradient at `itemsize` bytes per element."""
        return self.params * itemsize

    def compute_s(self, batch: int = DEFAULT_BATCH, sustained_tflops: float = SUSTAINED_TFLOPS
                  ) -> float:
        """Forward + backward time of one worker's batch (3 forward passes of 2·MACs FLOPs)."""
        return compute_s(batch, self.gmacs, sustained_tflops)


def compute_s(batch: int, gmacs: float, sustained_tflops: float = SUSTAINED_TFLOPS) -> float:
    """Forward + backward time (s) of `batch` samples of `gmacs` forward MACs (1e9) each."""
    return batch * 6.0 * gmacs * 1e9 / (sustained_tflops * 1e12)


_TV = "https://pytorch.org/vision/stable/models/generated/torchvision.models.{}.html"

MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("vgg19", 143_667_240, 19.63, _TV.format("vgg19")),
        ModelProfile("vgg16", 138_357_544, 15.47, _TV.format("vgg16")),
        ModelProfile("resnet50", 25_557_032, 4.09, _TV.format("resnet50")),
        ModelProfile("resnet101", 44_549_160, 7.80, _TV.format("resnet101")),
        ModelProfile("resnet152", 60_192_808, 11.51, _TV.format("resnet152")),
        ModelProfile("alexnet", 61_100_840, 0.71, _TV.format("alexnet")),
    )
}
"""Known models by name (parameter counts and GMACs from the torchvision docs)."""
