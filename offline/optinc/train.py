"""Hardware-aware training of the OptINC network's phases (numpy only, analytic gradients).

Every step draws a minibatch of digit-sum tuples (the training set P leaves: half by their
probability under uniform random levels, half uniformly, so rare corners are seen), applies the
DAC quantisation of the phases (straight-through estimator: the gradient at the quantised phases
updates the latent ones) and a fresh phase-noise realisation, runs the network with smooth
thresholders (a sigmoid of steepness ``network.steepness`` in place of the step), and takes an
Adam step on the squared error of the receivers' analog digits against the exact digits, plus a
hinge that pushes every analog digit at least ``margin`` inside its decision interval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oddl.offline.optinc.levels import OptincError
from oddl.offline.optinc.mesh import TWO_PI, block_gradients, block_matrices
from oddl.offline.optinc.onn import OptincNetwork
from oddl.offline.optinc.shape import check_nonneg, check_phase_bits

Float = NDArray[np.float64]
START = ("current", "designed", "random")


@dataclass
class TrainResult:
    """Statistics of one training run (also stored in the phase file)."""

    steps: int
    seconds: float
    final_loss: float
    exact_fraction: float  # DAC-quantised phases, no noise, whole training set
    exact_fraction_noisy: float | None  # with the training noise, mean over realisations
    start: str
    exact_fraction_before: float
    history: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready statistics (without the loss history)."""
        return {"steps": self.steps, "seconds": round(self.seconds, 3),
                "final_loss": self.final_loss, "exact_fraction": self.exact_fraction,
                "exact_fraction_noisy": self.exact_fraction_noisy, "start": self.start,
                "exact_fraction_before": self.exact_fraction_before}


def loss_and_grad(net: OptincNetwork, eff: Float, sums: NDArray[np.int64],
                  target: NDArray[np.int64], weight: Float, margin: float = 0.25
                  ) -> tuple[float, Float]:
    """Loss of the soft network on ``sums`` and its gradient wrt the effective phases."""
    s = net.shape
    k, m, r = s.k, s.transceivers, s.blocks
    p1, p2 = net.layer_params(eff)
    b1, b2 = block_matrices(p1, k), block_matrices(p2, k)
    w1, w2 = b1[0], b2[0]
    root = math.sqrt(r)
    x = net.preprocessed(sums)  # (S, k)
    z = np.einsum("rij,sj->sri", w1, x) / root  # (S, R, k)
    a = np.abs(z)
    zt = net.z_threshold
    h = 1.0 / (1.0 + np.exp(-np.clip(net.steepness * (a / zt - 1.0), -60, 60)))
    y = np.einsum("srj,rmj->sm", h, w2[:, :m, :])  # (S, M)
    gain = net.receiver_gain / root
    mag = np.abs(y)
    out = gain * mag
    res = out - target
    over = np.maximum(np.abs(res) - (0.5 - margin), 0.0)
    wcol = weight[:, None]
    loss = float(np.sum(wcol * (res * res + 4.0 * over * over)))
    d_out = wcol * (2.0 * res + 8.0 * over * np.sign(res))
    safe = np.where(mag > 0, mag, 1.0)
    g_y = d_out * gain * y / safe  # ∂L/∂Re y + i ∂L/∂Im y
    g_w2 = np.zeros_like(w2)
    g_w2[:, :m, :] = np.einsum("sm,srj->rmj", g_y, h)
    g_h = np.real(np.einsum("sm,rmj->srj", np.conj(g_y), w2[:, :m, :]))
    g_a = g_h * net.steepness / zt * h * (1.0 - h)
    g_z = g_a * z / np.where(a > 0, a, 1.0)
    g_w1 = np.einsum("sri,sj->rij", g_z, x) / root
    grad = np.concatenate([block_gradients(p1, k, g_w1, b1).reshape(-1),
                           block_gradients(p2, k, g_w2, b2).reshape(-1)])
    return loss, grad


def train(network: OptincNetwork, steps: int = 400, lr: float = 0.01,
          noise_rad: float | None = None, phase_bits: Any = "network", seed: int = 0, *,
          batch: int = 512, start: str = "current", margin: float = 0.25,
          realisations: int = 4,
          progress: Callable[[int, int, float], None] | None = None) -> TrainResult:
    """Learn the phases of ``network`` in place, hardware-aware (see the module docstring).

    ``start``: ``current`` (the network's phases), ``designed`` (the textbook exact network,
    `OptincNetwork.designed`) or ``random`` (uniform phases). ``phase_bits`` also becomes the
    network's DAC resolution; ``noise_rad`` defaults to the network's. ``progress(step, total,
    loss)`` is called about 20 times.
    """
    _check_train_args(steps, lr, start)
    if phase_bits != "network":
        network.phase_bits = check_phase_bits(phase_bits)
    sigma = network.noise_rad if noise_rad is None else check_nonneg("noise_rad", noise_rad)
    rng = np.random.default_rng(seed)
    _set_start(network, start, rng)
    before = network.set_exact_fraction(noise_rad=0.0)
    tuples, prob = network.training_set()
    target = network.target_digits(tuples)
    draw = 0.5 * prob + 0.5 / len(prob)
    t0 = time.perf_counter()
    p = network.params.copy()
    adam = _Adam(p, lr, steps)
    hist: list[tuple[int, float]] = []
    loss = float("nan")
    every = max(1, steps // 20)
    keeper = _BestPhases(network, tuples, target, prob, sigma, seed, rng, steps)
    keeper.offer(p)
    for i in range(steps):
        if len(tuples) <= batch:
            idx = np.arange(len(tuples))
        else:
            idx = rng.choice(len(tuples), size=batch, replace=False, p=draw)
        eff = network.effective_params(noise_rad=sigma, rng=rng, params=p)
        wts = np.full(len(idx), 1.0 / len(idx))
        loss, g = loss_and_grad(network, eff, tuples[idx], target[idx], wts, margin)
        adam.step(p, g, i)
        if i % every == 0 or i == steps - 1:
            hist.append((i + 1, loss))
            if progress is not None:
                progress(i + 1, steps, loss)
        if (i + 1) % keeper.check == 0 or i == steps - 1:
            keeper.offer(p)
    network.params = np.mod(keeper.best, TWO_PI)
    exact = network.set_exact_fraction(noise_rad=0.0)
    noisy = None
    if sigma > 0:
        noisy = network.set_exact_fraction(noise_rad=sigma, realisations=realisations,
                                           rng=np.random.default_rng(seed + 1))
    return TrainResult(steps=steps, seconds=time.perf_counter() - t0, final_loss=loss,
                       exact_fraction=exact, exact_fraction_noisy=noisy, start=start,
                       exact_fraction_before=before, history=hist)


def _check_train_args(steps: Any, lr: float, start: str) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise OptincError(f"steps must be an integer ≥ 0, got {steps!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise OptincError(f"lr must be a positive number, got {lr!r}")
    if start not in START:
        raise OptincError(f"start must be one of {', '.join(START)}, got {start!r}")


def _set_start(network: OptincNetwork, start: str, rng: np.random.Generator) -> None:
    """Set the starting phases: the designed network, uniform random ones, or keep them."""
    if start == "designed":
        network.params = OptincNetwork.designed(
            network.n_inputs, network.bits, network.transceivers, blocks=network.blocks,
            phase_bits=None).params
    elif start == "random":
        network.params = rng.uniform(0.0, TWO_PI, network.param_count)


class _Adam:
    """Adam on the phases, with a cosine learning rate from `lr` down to 5 % of it."""

    def __init__(self, p: Float, lr: float, steps: int) -> None:
        self.m1, self.m2 = np.zeros_like(p), np.zeros_like(p)
        self.lr, self.steps = lr, steps

    def step(self, p: Float, g: Float, i: int) -> None:
        """Update `p` in place from gradient `g` at step `i`."""
        b1, b2, eps = 0.9, 0.999, 1e-12
        self.m1 = b1 * self.m1 + (1 - b1) * g
        self.m2 = b2 * self.m2 + (1 - b2) * g * g
        lr_i = self.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * i / self.steps)))
        p -= lr_i * (self.m1 / (1 - b1 ** (i + 1))) / (np.sqrt(self.m2 / (1 - b2 ** (i + 1)))
                                                       + eps)


class _BestPhases:
    """Keep the phases that decide best (hard thresholders, DAC, the training noise), checked
    on the whole set (or on 4096 tuples drawn by probability when it is larger) every
    `check` steps."""

    def __init__(self, network: OptincNetwork, tuples: NDArray[np.int64],
                 target: NDArray[np.int64], prob: Float, sigma: float, seed: int,
                 rng: np.random.Generator, steps: int) -> None:
        self.network, self.sigma, self.seed = network, sigma, seed
        self.check = max(1, steps // (40 if len(tuples) <= 4096 else 8))
        probe = (np.arange(len(tuples)) if len(tuples) <= 4096 else
                 np.unique(rng.choice(len(tuples), size=4096, p=prob)))
        self.tuples, self.target = tuples[probe], target[probe]
        self.weights = prob[probe] / prob[probe].sum()
        self.best: Float = np.empty(0)
        self.best_frac = -math.inf

    def decides(self, params: Float) -> float:
        """Weighted fraction decided exactly; with noise in the loop, the mean over fixed
        noise draws (the same for every check)."""
        sigma, net = self.sigma, self.network
        draws = ([np.random.default_rng(self.seed + 100 + j) for j in range(3)] if sigma > 0
                 else [None])
        total = 0.0
        for gen in draws:
            eff = net.effective_params(noise_rad=sigma if gen else 0.0, rng=gen, params=params)
            ok = np.all(net.decide(self.tuples, eff) == self.target, axis=1)
            total += float(np.sum(self.weights[ok]))
        return total / len(draws)

    def offer(self, p: Float) -> None:
        """Keep a copy of `p` if it decides at least as well as the best so far."""
        frac = self.decides(p)
        if frac >= self.best_frac:
            self.best, self.best_frac = p.copy(), frac
