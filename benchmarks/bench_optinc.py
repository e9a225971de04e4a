"""Elements per second through the OptINC MZI model (N = 4, b = 4 and 8), vectorised vs naive.

    python benchmarks/bench_optinc.py [--json] [--repeats R] [--elements E] [--naive K] [--train]

An element is one position across the N servers. Methods, each on the same trained-shape
network (designed phases, 8-bit DAC, 0.02 rad phase noise drawn per pass, unitary+diagonal,
P = dft-mean):

- ``forward``: ``OptincNetwork.forward`` — the MZI model gives the transfer row once per pass,
  then all elements go through it in cache-sized numpy blocks (uint8 levels in).
- ``propagate``: the fields of every element propagated column by column through the mesh
  (``ClementsMesh.propagate``), vectorised over elements — the cost a per-element noise model
  would have.
- ``naive`` (the same-run baseline): a plain Python loop over K elements applying P, Σ, each
  MZI's 2×2 matrix, the screen and the readout one element at a time.

All three give identical levels (checked). Each figure is the best of R repeats with
``time.perf_counter``; ratios are to the naive loop of the same run, so they compare across
machines. ``--train`` also times ``optinc train``'s default training (N=4, b=4).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from oddl.drivers import optinc_model as om

N = 4
NOISE_RAD = 0.02


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Return the best wall time of `repeats` calls (seconds) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def naive_forward(net: om.OptincNetwork, x: np.ndarray, eff: np.ndarray) -> list[int]:
    """The baseline: one element at a time in plain Python (U+D mode, phases ``eff``)."""
    n = net.n_inputs
    m = n * (n - 1) // 2
    p = [[complex(v) for v in row] for row in net.p_matrix]
    mesh = net.meshes(eff)[0]
    lam = 10 ** (-net.loss_db_per_mzi / 20)
    mats = [[[complex(v) * lam for v in r] for r in t] for t in om.mzi(mesh.theta, mesh.phi)]
    # MZI k sits at (column, top mode) in column-major order: that is also light order
    seq = [(top, k) for k, top in enumerate(top for c in range(n)
                                            for top in range(c % 2, n - 1, 2))]
    screen = [complex(math.cos(s), math.sin(s)) for s in mesh.screen]
    sig = [math.sin((a % (2 * math.pi)) / 2) * lam for a in eff[n * n :]]
    assert len(seq) == m
    delta = 0.5 + (1 / (2 * n) if n % 2 == 0 else 0.0)
    top_level = net.levels
    out = []
    for row in x.tolist():
        f = [sum(p[i][j] * row[j] for j in range(n)) for i in range(n)]
        f = [f[i] * sig[i] for i in range(n)]
        for top, kk in seq:
            t = mats[kk]
            a, b = f[top], f[top + 1]
            f[top], f[top + 1] = t[0][0] * a + t[0][1] * b, t[1][0] * a + t[1][1] * b
        y = f[0] * screen[0] * net.readout_gain
        r = abs(y) if net.detection == "intensity" else y.real
        out.append(min(max(math.floor(r + delta), 0), top_level))
    return out


def propagate_forward(net: om.OptincNetwork, x: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """Vectorised field propagation through P, Σ and the mesh, then the readout."""
    n = net.n_inputs
    fields = x.astype(np.float64) @ net.p_matrix.T
    fields *= net.attenuation(eff) * 10 ** (-net.loss_db_per_mzi / 20)
    out = net.meshes(eff)[0].propagate(fields, net.loss_db_per_mzi)[:, 0] * net.readout_gain
    r = np.abs(out) if net.detection == "intensity" else out.real
    delta = 0.5 + (1 / (2 * n) if n % 2 == 0 else 0.0)
    return np.clip(np.floor(r + delta), 0, net.levels).astype(np.int64)


def measure(bits: int, elements: int, naive_k: int, repeats: int) -> dict[str, Any]:
    """Measure the three methods for one bit width and return the row."""
    net = om.OptincNetwork.designed(N, bits, phase_bits=8, noise_rad=NOISE_RAD)
    rng = np.random.default_rng(bits)
    x = rng.integers(0, 1 << bits, size=(elements, N)).astype(np.uint8)
    eff = net.effective_params(rng=np.random.default_rng(1))
    # the same noise realisation (seed 1) for the cross-check
    ref = net.forward(x[:naive_k], rng=np.random.default_rng(1))
    naive = naive_forward(net, x[:naive_k], eff)
    prop = propagate_forward(net, x[:naive_k], eff)
    if not (np.array_equal(ref, naive) and np.array_equal(ref, prop)):
        raise SystemExit("methods disagree: the benchmark would compare different things")
    fwd_s, _ = best_of(repeats, lambda: net.forward(x, rng=rng))
    prop_s, _ = best_of(repeats, lambda: propagate_forward(net, x, net.effective_params(rng=rng)))
    naive_s, _ = best_of(max(1, repeats // 3), lambda: naive_forward(net, x[:naive_k], eff))
    naive_rate = naive_k / naive_s
    return {"n_inputs": N, "bits": bits, "elements": elements, "naive_elements": naive_k,
            "forward_eps": elements / fwd_s, "propagate_eps": elements / prop_s,
            "naive_eps": naive_rate, "forward_ratio": elements / fwd_s / naive_rate,
            "propagate_ratio": elements / prop_s / naive_rate}


def time_training() -> dict[str, Any]:
    """Time the CLI's default training for N=4, b=4 (8-bit phases, 0.02 rad noise)."""
    net = om.OptincNetwork(N, 4, phase_bits=8, noise_rad=NOISE_RAD, seed=0)
    result = om.train(net, steps=1500, noise_rad=NOISE_RAD, seed=0)
    return {"train_seconds": result.seconds, "train_steps": result.steps,
            "train_exact_fraction": result.exact_fraction,
            "train_exact_fraction_noisy": result.exact_fraction_noisy}


def table(rows: list[dict[str, Any]]) -> str:
    """Format the rows as a fixed-width table."""
    head = (f"{'N':>3}{'b':>4}{'elements':>11}{'forward el/s':>15}{'propagate el/s':>17}"
            f"{'naive el/s':>13}{'fwd/naive':>11}{'prop/naive':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['n_inputs']:>3}{r['bits']:>4}{r['elements']:>11}"
                     f"{r['forward_eps']:>15.3e}{r['propagate_eps']:>17.3e}"
                     f"{r['naive_eps']:>13.3e}{r['forward_ratio']:>11.0f}"
                     f"{r['propagate_ratio']:>12.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, or JSON with --json."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per figure (best is kept)")
    ap.add_argument("--elements", type=int, default=1 << 21, help="elements per vectorised pass")
    ap.add_argument("--naive", type=int, default=20000, help="elements for the naive loop")
    ap.add_argument("--train", action="store_true", help="also time the default training")
    args = ap.parse_args(argv)
    repeats = max(1, args.repeats)
    naive_k = min(args.naive, args.elements)
    rows = [measure(bits, args.elements, naive_k, repeats) for bits in (4, 8)]
    training = time_training() if args.train else None
    if args.json:
        print(json.dumps({"benchmark": "bench_optinc", "python": platform.python_version(),
                          "numpy": np.__version__, "machine": platform.machine(),
                          "repeats": repeats, "noise_rad": NOISE_RAD, "phase_bits": 8,
                          "baseline": "plain Python loop over elements", "rows": rows,
                          "training": training}, indent=2))
        return 0
    print(f"OptINC forward model, unitary+diagonal, P=dft-mean, 8-bit phases, {NOISE_RAD} rad "
          f"noise per pass, best of {repeats}; ratio = elements/s over the naive loop")
    print(table(rows))
    if training:
        print(f"training N=4 b=4 (8-bit phases, {NOISE_RAD} rad): {training['train_steps']} "
              f"steps in {training['train_seconds']:.2f} s, exact "
              f"{100 * training['train_exact_fraction']:.2f} % without noise, "
              f"{100 * training['train_exact_fraction_noisy']:.2f} % with noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
