"""The designed OptINC network: phases that average and quantise exactly, before training.

Block t of layer 1 fires thresholder t when the mean of the levels reaches t − 1/2: its first
row puts a common weight g·2**(c·m) on the digit sums and a bias b_t on the bias laser. The
threshold sits midway between the achievable means (multiples of 1/N) below each rounding
point, so the rounding is half-up. Block t of layer 2 adds, to each output digit, the increment
that digit takes from level t − 1 to level t. The other rows of each block stay unused: U·Σ has
orthogonal columns, so one block cannot give several units the same weights.

Biases run from +z_th down to (1 − ``BIAS_SWING``)·z_th = −0.8·z_th (opposite phase to the
data): |z| stays below z_th under the threshold, and the common gain is ``BIAS_SWING`` × what
non-negative biases allow, so a phase error moves a threshold less. More swing helps at small
phase noise and hurts at larger noise, where biases near −z_th fire spuriously
(docs/explanation/optinc.md has the figures).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from oddl.offline.optinc.levels import OptincError, to_digits
from oddl.offline.optinc.mesh import (
    block_matrices,
    block_param_count,
    designed_block,
    from_unitary,
)
from oddl.offline.optinc.shape import BIAS_SCALE, Shape

Float = NDArray[np.float64]

BIAS_SWING = 1.8
"""The common gain relative to the largest that keeps every bias ≥ 0."""


def designed_params(s: Shape) -> Float:
    """Phases of the designed network of shape ``s`` (layer 1's blocks, then layer 2's)."""
    if s.blocks < s.thresholds:
        raise OptincError(f"the designed network needs {s.thresholds} blocks, got {s.blocks}")
    n, top = s.n_inputs, s.digit_top
    weights = np.array([2.0 ** (s.digit_bits * m) for m in range(s.transceivers)])
    theta = np.arange(1, s.thresholds + 1) - 0.5 - (0.5 / n if n % 2 == 0 else 0.0)
    z = BIAS_SCALE
    # z_t·√R = g·Σ 2^{cm} s_m + b_t = g·√N·A/top + b_t fires when it exceeds z at A = θ_t
    g = min(BIAS_SWING * z * top / (theta[-1] * math.sqrt(n)),
            math.sqrt(1 - z * z) / float(np.linalg.norm(weights)))
    bias = z - g * math.sqrt(n) * theta / top
    per = block_param_count(s.k)
    p1 = np.zeros((s.blocks, per))
    p2 = np.zeros((s.blocks, per))
    dig = to_digits(np.arange(s.thresholds + 1), s.bits, s.transceivers)
    steps = (dig[1:] - dig[:-1]).astype(np.float64)  # (thresholds, M) digit increments
    norm = math.sqrt(top ** 2 * (s.transceivers - 1) + 1)
    for t in range(s.blocks):
        if t < s.thresholds:
            p1[t] = designed_block(np.append(g * weights, bias[t]), s.k)
            p2[t] = designed_column(steps[t] / norm, s.k)
        else:
            p1[t] = designed_block(np.zeros(s.k), s.k)
            p2[t] = designed_column(np.zeros(s.transceivers), s.k)
    return np.concatenate([p1.reshape(-1), p2.reshape(-1)])


def designed_column(col: NDArray[np.float64], k: int) -> Float:
    """Phases of a U·Σ block whose column 0 is ``col`` (padded) and whose other columns are off."""
    full = np.zeros(k)
    full[: len(col)] = col
    # U·Σ column 0 = U[:, 0]·σ_0: the transpose problem of a row (U^T is unitary as well)
    p = designed_block(full, k)  # row 0 of U' = col/|col| with Σ = |col|·I
    u_row = block_matrices(p[None], k)[1][0]
    mesh = from_unitary(u_row.T, atol=1e-8)
    alpha = np.zeros(k)
    alpha[0] = 2.0 * math.asin(min(1.0, float(np.linalg.norm(full))))
    return np.concatenate([mesh.phases, alpha])
