"""OptINC optics: elements per second through the device model, training time, exactness figures.

    python benchmarks/bench_optinc.py [--json] [--repeats R] [--elements E] [--naive K]
                                      [--figures]

Throughput (the shipped N = 4, 8-bit phases: 4 PAM4 transceivers, 255 U·Σ blocks of 5×5 per
layer, 1275 thresholders), each the best of R repeats with ``time.perf_counter``:

- ``forward, no noise``: ``OptincNetwork.forward`` with a table of every digit-sum tuple (built
  once per set of phases; the first call is timed separately as ``table build``);
- ``forward, noise``: a fresh phase-noise realisation per pass, the optics evaluated for every
  distinct digit-sum tuple of the batch;
- ``naive`` (the same-run baseline): a plain Python loop over K elements — digits, P, layer 1,
  thresholders, layer 2, receivers — one element at a time, through the same matrices.

All give identical levels where they overlap (checked). Training: hardware-aware fine-tuning
of the designed N = 4, 4-bit network on an 8-bit DAC (600 steps) and training N = 2, 2-bit from
random phases (600 steps). ``--figures`` adds the exact fraction of the designed networks
against DAC resolution and phase noise (the table in docs/explanation/optinc.md).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from typing import Any

import numpy as np
from bench_common import best_of

from oddl.offline.optinc import model as om
from oddl.offline.optinc import train as ot

NOISE_RAD = 0.0005


def naive_forward(net: om.OptincNetwork, x: np.ndarray, eff: np.ndarray) -> list[int]:
    """The baseline: one element at a time in plain Python through the same optics."""
    w1, w2 = net.matrices(eff)
    s = net.shape
    root = math.sqrt(net.blocks)
    w1l = [[[complex(v) for v in row] for row in blk] for blk in w1]
    w2l = [[[complex(v) for v in row] for row in blk] for blk in w2]
    th, gain = net.z_threshold, net.receiver_gain / root
    out = []
    for row in x.tolist():
        sums = [sum((v >> (s.digit_bits * m)) & s.digit_top for v in row)
                for m in range(s.transceivers)]
        field = [v / (s.digit_top * math.sqrt(net.n_inputs)) for v in sums] + [1.0]
        hidden = []
        for blk in w1l:
            for r in blk:
                z = sum(a * b for a, b in zip(r, field, strict=True)) / root
                hidden.append(1.0 if abs(z) > th else 0.0)
        level = 0
        for m in range(s.transceivers):
            y = 0j
            for b, blk in enumerate(w2l):
                y += sum(blk[m][j] * hidden[b * s.k + j] for j in range(s.k))
            digit = min(max(math.floor(gain * abs(y) + 0.5), 0), s.digit_top)
            level += digit << (s.digit_bits * m)
        out.append(level)
    return out


def throughput(repeats: int, elements: int, naive: int) -> dict[str, Any]:
    net = om.shipped_phases(4, 8)
    if net is None:
        raise SystemExit("the shipped phase file optinc-n4-b8.json is missing")
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(elements, 4)).astype(np.uint8)
    t0 = time.perf_counter()
    first = net.forward(x[:1], noise_rad=0.0)
    build = time.perf_counter() - t0
    t_clean, clean = best_of(repeats, lambda: net.forward(x, noise_rad=0.0))
    t_noisy, noisy = best_of(repeats, lambda: net.forward(x, noise_rad=NOISE_RAD, rng=rng))
    eff = net.effective_params(noise_rad=0.0)
    t_naive, slow = best_of(1, lambda: naive_forward(net, x[:naive], eff))
    exact = om.exact_mean(x)
    same = bool(np.array_equal(np.asarray(slow), clean[:naive]) and first[0] == clean[0])
    naive_rate = naive / t_naive
    return {
        "network": net.hardware(), "elements": elements,
        "table_build_s": build,
        "forward_no_noise": {"s": t_clean, "elements_per_s": elements / t_clean,
                             "vs_naive": elements / t_clean / naive_rate,
                             "exact_fraction": float(np.mean(clean == exact))},
        "forward_noise": {"noise_rad": NOISE_RAD, "s": t_noisy,
                          "elements_per_s": elements / t_noisy,
                          "vs_naive": elements / t_noisy / naive_rate,
                          "exact_fraction": float(np.mean(noisy == exact))},
        "naive": {"elements": naive, "s": t_naive, "elements_per_s": naive_rate},
        "identical": same,
    }


def training() -> dict[str, Any]:
    net = om.OptincNetwork(4, 4, 2, phase_bits=8)
    hw = ot.train(net, steps=600, lr=0.001, start="designed", seed=1, margin=0.1)
    small = om.OptincNetwork(2, 2, phase_bits=None, seed=0)
    rnd = ot.train(small, steps=600, lr=0.03, start="random", seed=0)
    return {"n4_b4_dac8_designed": hw.as_dict(), "n2_b2_random": rnd.as_dict()}


def figures() -> dict[str, Any]:
    rows = []
    for n, bits, m in ((4, 4, 2), (4, 8, 4)):
        net = om.OptincNetwork.designed(n, bits, m, phase_bits=None)
        rng = np.random.default_rng(0)
        for pb in (8, 10, 12, 14, 16):
            for sigma in (0.0, 0.0005, 0.002, 0.01):
                rows.append({"n": n, "bits": bits, "transceivers": m, "phase_bits": pb,
                             "noise_rad": sigma,
                             "exact_fraction": net.set_exact_fraction(
                                 phase_bits=pb, noise_rad=sigma, realisations=2, rng=rng)})
    return {"designed": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--elements", type=int, default=1 << 22)
    p.add_argument("--naive", type=int, default=200)
    p.add_argument("--figures", action="store_true")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                              "machine": platform.machine(),
                              "throughput": throughput(args.repeats, args.elements, args.naive),
                              "training": training()}
    if args.figures:
        report["figures"] = figures()
    if args.json:
        print(json.dumps(report))
        return 0
    t = report["throughput"]
    print(f"OptINC device model, shipped N=4 8-bit phases ({t['network']['mzi_count']} MZIs, "
          f"{t['network']['hidden']} thresholders), {t['elements']:,} elements")
    print(f"  table build (first call)    {t['table_build_s']:8.3f} s")
    for key, label in (("forward_no_noise", "forward, no noise"),
                       ("forward_noise", f"forward, {NOISE_RAD} rad")):
        r = t[key]
        print(f"  {label:<26}{r['elements_per_s'] / 1e6:8.2f} M elements/s  "
              f"({r['vs_naive']:,.0f}× naive)  exact {100 * r['exact_fraction']:.2f} %")
    print(f"  naive Python loop          {t['naive']['elements_per_s']:8.0f} elements/s  "
          f"identical: {t['identical']}")
    tr = report["training"]
    a, b = tr["n4_b4_dac8_designed"], tr["n2_b2_random"]
    print(f"training N=4 4-bit, 8-bit DAC, from designed: {100 * a['exact_fraction_before']:.2f}"
          f" % → {100 * a['exact_fraction']:.2f} % in {a['seconds']:.2f} s")
    print(f"training N=2 2-bit from random phases: {100 * b['exact_fraction_before']:.2f} % → "
          f"{100 * b['exact_fraction']:.2f} % in {b['seconds']:.2f} s")
    if args.figures:
        print("designed networks, exact fraction by DAC bits and phase noise:")
        for r in report["figures"]["designed"]:
            print(f"  N={r['n']} b={r['bits']} M={r['transceivers']} DAC {r['phase_bits']:>2} "
                  f"noise {r['noise_rad']:<7g} {100 * r['exact_fraction']:7.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
