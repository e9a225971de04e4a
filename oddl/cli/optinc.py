"""`oddl optinc train|eval`: train OptINC's optical network and report how exactly it averages.

``register(subparsers)`` adds the ``optinc`` command to the main parser (each sub-command sets
``func``: args → exit code); ``main(argv)`` runs ``oddl optinc <argv>`` on its own (for tests).
The model and its reconstruction choices are in ``oddl.offline.optinc.model``; ``oddl plan optinc``
is `oddl.cli.plan_optinc`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oddl.cli.exit_codes import EXIT_OK
from oddl.cli.shared import run_command_tree
from oddl.common.config import OPTINC
from oddl.offline.optinc import model as om

SWEEP_NOISE = (0.0, 0.0005, 0.002, 0.02)
SWEEP_PHASE_BITS: tuple[int | None, ...] = (8, 10, 12, 14, 16, None)
SWEEP_SAMPLES = 4096


def _phase_bits(text: str) -> int | str | None:
    """Parse --phase-bits: 0, 'full' or 'none' mean full precision; 'file' keeps the file's."""
    if text.lower() in ("0", "full", "none"):
        return None
    if text.lower() == "file":
        return "file"
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer or 'full', got {text!r}") from exc
    if not 1 <= value <= 24:
        raise argparse.ArgumentTypeError(f"phase bits must be 1..24 or 0/full, got {value}")
    return value


def _parsed(text: str, kind: type[Any], noun: str) -> Any:
    try:
        return kind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from exc


def _nonneg_float(text: str) -> float:
    value = float(_parsed(text, float, "a number"))
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(_parsed(text, int, "an integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {value}")
    return value


def _ranged_int(lo: int, hi: int) -> Any:
    def parse(text: str) -> int:
        value = int(_parsed(text, int, "an integer"))
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected {lo}..{hi}, got {value}")
        return value
    return parse


def _bits_label(bits: int | None) -> str:
    return "full" if bits is None else str(bits)


def _phases_label(bits: int | None) -> str:
    return "full-precision phases" if bits is None else f"{bits}-bit phases"


class _Progress:
    """Training progress on stderr: one rewritten line on a terminal, a few lines otherwise."""

    def __init__(self, stream: Any, quiet: bool) -> None:
        self.stream, self.quiet = stream, quiet
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.next_quarter = 0.25

    def __call__(self, step: int, total: int, loss: float) -> None:
        if self.quiet:
            return
        line = f"train: step {step}/{total}  loss {loss:.3g} digit²"
        if self.tty:
            end = "\n" if step >= total else ""
            print(f"\r{line}", end=end, file=self.stream, flush=True)
        elif step >= total * self.next_quarter or step >= total:
            print(line, file=self.stream, flush=True)
            while self.next_quarter <= step / total:
                self.next_quarter += 0.25


# ---- train --------------------------------------------------------------------------------


def _network(args: argparse.Namespace) -> om.OptincNetwork:
    return om.OptincNetwork(args.nodes, args.bits, args.transceivers, blocks=args.blocks,
                            phase_bits=args.phase_bits, noise_rad=args.noise_rad,
                            seed=args.seed)


def _hardware_line(hw: dict[str, Any]) -> str:
    return (f"N={hw['n_inputs']}, {hw['bits']}-bit on M={hw['transceivers']} transceivers "
            f"({hw['digit_bits']} bit/symbol), {hw['blocks']} U·Σ blocks of "
            f"{hw['block_size']}×{hw['block_size']} per layer: {hw['mzi_count']} MZIs + "
            f"{hw['attenuator_count']} attenuators (U·Σ·V† would need {hw['svd_mzi_count']} "
            f"MZIs), {hw['hidden']} thresholders, training set {hw['training_set']:,} digit sums")


def cmd_train(args: argparse.Namespace) -> int:
    """Train phases for an N-input, b-bit device and write the phase file."""
    net = _network(args)
    result = om.train(net, steps=args.steps, lr=args.lr, noise_rad=args.noise_rad,
                      seed=args.seed, start=args.start,
                      progress=_Progress(sys.stderr, args.quiet))
    stats = result.as_dict()
    net.metadata = {"training": stats, "created_by": "oddl optinc train",
                    "created_unix": int(time.time()), "seed": args.seed, "lr": args.lr}
    om.save_phases(args.out, net)
    summary = {"out": args.out, **net.hardware(), "training": stats}
    if args.json:
        print(json.dumps(summary))
        return EXIT_OK
    print(f"{args.out}: {_hardware_line(net.hardware())}; {_phases_label(net.phase_bits)}")
    noisy = ("" if result.exact_fraction_noisy is None else
             f"; with {net.noise_rad:g} rad noise {100 * result.exact_fraction_noisy:.2f} %")
    print(f"exact: {100 * result.exact_fraction_before:.2f} % before ({args.start} phases) → "
          f"{100 * result.exact_fraction:.2f} % after training, without noise{noisy}; "
          f"{result.steps} steps in {result.seconds:.1f} s")
    return EXIT_OK


# ---- eval ---------------------------------------------------------------------------------


def evaluate(net: om.OptincNetwork, *, noise_rad: float, phase_bits: int | None, samples: int,
             realisations: int, seed: int, sweep: bool = True) -> dict[str, Any]:
    """Return the evaluation report of ``net`` as a JSON-ready dict.

    ``exact_fraction`` is over the whole training set weighted by its probability (the exact
    figure for uniform random levels); the error histogram is over ``samples`` random elements.
    """
    rng = np.random.default_rng(seed)
    reps = realisations if noise_rad > 0 else 1
    exact = net.set_exact_fraction(noise_rad=noise_rad, phase_bits=phase_bits,
                                   realisations=reps, rng=rng)
    x = om.sample_inputs(net.n_inputs, net.bits, samples, rng)
    want = om.exact_mean(x)
    hist: dict[int, int] = {}
    for _ in range(reps):
        diff = net.forward(x, noise_rad=noise_rad, phase_bits=phase_bits, rng=rng) - want
        values, counts = np.unique(diff, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            hist[v] = hist.get(v, 0) + c
    rows = []
    if sweep:
        probe = x[: min(len(x), SWEEP_SAMPLES)]
        for bits in SWEEP_PHASE_BITS:
            row: dict[str, Any] = {"phase_bits": bits}
            for sigma in SWEEP_NOISE:
                row[f"{sigma:g}"] = net.exact_fraction(probe, noise_rad=sigma, phase_bits=bits,
                                                       realisations=realisations, rng=rng)
            rows.append(row)
    random_net = om.OptincNetwork(net.n_inputs, net.bits, net.transceivers, blocks=net.blocks,
                                  phase_bits=phase_bits, seed=seed)
    baselines: dict[str, Any] = {"random_phases": random_net.set_exact_fraction(noise_rad=0.0)}
    if net.blocks >= (1 << net.bits) - 1:
        designed = om.OptincNetwork.designed(net.n_inputs, net.bits, net.transceivers,
                                             blocks=net.blocks, phase_bits=phase_bits)
        baselines["designed_untrained"] = designed.set_exact_fraction(
            noise_rad=noise_rad, realisations=reps, rng=np.random.default_rng(seed))
    return {
        **net.hardware(),
        "eval": {"noise_rad": noise_rad, "phase_bits": phase_bits, "realisations": reps,
                 "exact_fraction": exact, "elements": len(x),
                 "error_histogram": {str(k): v for k, v in sorted(hist.items())}},
        "baselines": baselines,
        "sweep": {"noise_rad": list(SWEEP_NOISE), "elements": min(len(x), SWEEP_SAMPLES),
                  "rows": rows},
        "training": net.metadata.get("training"),
    }


def _print_report(report: dict[str, Any], source: str) -> None:
    ev = report["eval"]
    print(f"{source}: {_hardware_line(report)}")
    print(f"exact: {100 * ev['exact_fraction']:.3f} % of uniform random elements (whole "
          f"training set, weighted) at {ev['noise_rad']:g} rad noise, "
          f"{_phases_label(ev['phase_bits'])} ({ev['realisations']} noise "
          f"realisation{'s' if ev['realisations'] != 1 else ''})")
    b = report["baselines"]
    line = f"  untrained, random phases: {100 * b['random_phases']:.3f} %"
    if "designed_untrained" in b:
        line += (f"; designed phases before hardware-aware training: "
                 f"{100 * b['designed_untrained']:.3f} %")
    print(line)
    total = sum(ev["error_histogram"].values())
    print(f"error (output − exact, levels) over {ev['elements']} random elements:")
    for k, v in ev["error_histogram"].items():
        print(f"  {int(k):+4d}  {v:>10d}  {100 * v / total:8.3f} %")
    if report["sweep"]["rows"]:
        noise = report["sweep"]["noise_rad"]
        print(f"exact fraction by phase DAC bits (rows) and phase noise in rad (columns), "
              f"{report['sweep']['elements']} elements:")
        print("  bits  " + "".join(f"{s:>9g}" for s in noise))
        for row in report["sweep"]["rows"]:
            cells = "".join(f"{100 * row[f'{s:g}']:8.2f}%" for s in noise)
            print(f"  {_bits_label(row['phase_bits']):>4}  {cells}")


def _network_to_evaluate(args: argparse.Namespace) -> tuple[om.OptincNetwork, str]:
    """The phase file given, else the one shipped for (N, b), else phases trained now."""
    if args.phases:
        return om.load_phases(args.phases), args.phases
    path = om.shipped_path(args.nodes, args.bits)
    if path is not None:
        return om.load_phases(path, args.nodes, args.bits), f"shipped {Path(path).name}"
    net = om.OptincNetwork(args.nodes, args.bits, noise_rad=0.0005, phase_bits=16,
                           seed=args.seed)
    if not args.json:
        print(f"no phase file for N={args.nodes}, {args.bits}-bit: training the designed "
              "network hardware-aware (16-bit DAC, 0.0005 rad)", file=sys.stderr)
    result = om.train(net, steps=60, lr=0.0005, seed=args.seed, start="designed",
                      realisations=2)
    net.metadata = {"training": result.as_dict()}
    return net, "trained now"


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate phases: exact fraction, error histogram, hardware, DAC/noise sweep."""
    net, source = _network_to_evaluate(args)
    noise = net.noise_rad if args.noise_rad is None else args.noise_rad
    bits = net.phase_bits if args.phase_bits == "file" else args.phase_bits
    report = evaluate(net, noise_rad=noise, phase_bits=bits, samples=args.samples,
                      realisations=args.realisations, seed=args.seed, sweep=not args.no_sweep)
    report["source"] = source
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, source)
    return EXIT_OK


# ---- wiring -------------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``optinc train`` and ``optinc eval`` to the main parser's sub-parsers."""
    top = subparsers.add_parser(OPTINC, help="OptINC: train and evaluate the optical network")
    sub = top.add_subparsers(dest="optinc_cmd", metavar="{train,eval}")
    sub.required = True

    tr = sub.add_parser("train", help="train the phases of an N-input averaging device")
    tr.add_argument("--nodes", type=_ranged_int(2, om.MAX_INPUTS), required=True,
                    help="inputs N (servers per device)")
    tr.add_argument("--bits", type=_ranged_int(1, om.MAX_BITS), required=True,
                    help="level bit width b")
    tr.add_argument("--transceivers", type=_positive_int, default=None,
                    help="transceivers per server M, dividing b (default: PAM4, b/2)")
    tr.add_argument("--blocks", type=_positive_int, default=None,
                    help="U·Σ blocks per layer R (default 2**b − 1; fewer = under-sized)")
    tr.add_argument("--start", choices=("designed", "random"), default="designed",
                    help="starting phases (default: the designed network)")
    tr.add_argument("--phase-bits", type=_phase_bits, default=16,
                    help="phase DAC resolution in bits; 0 or 'full' for full precision")
    tr.add_argument("--noise-rad", type=_nonneg_float, default=0.0005,
                    help="phase noise during training, rad (default 0.0005)")
    tr.add_argument("--steps", type=_positive_int, default=300)
    tr.add_argument("--lr", type=float, default=0.001)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--out", required=True, help="phase file to write (JSON)")
    tr.add_argument("--json", action="store_true", help="print the summary as JSON")
    tr.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    tr.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="report how exactly phases average and quantise")
    ev.add_argument("--phases", default=None,
                    help="phase file from 'optinc train' (default: the file shipped for "
                         "--nodes/--bits, or phases trained now)")
    ev.add_argument("--nodes", type=_ranged_int(2, om.MAX_INPUTS), default=4,
                    help="N when no --phases is given (default 4)")
    ev.add_argument("--bits", type=_ranged_int(1, om.MAX_BITS), default=8,
                    help="b when no --phases is given (default 8)")
    ev.add_argument("--noise-rad", type=_nonneg_float, default=None,
                    help="phase noise, rad (default: the value trained for)")
    ev.add_argument("--phase-bits", type=_phase_bits, default="file",
                    help="phase DAC bits, 0/full for full precision (default: the file's)")
    ev.add_argument("--samples", type=_positive_int, default=1 << 14,
                    help="random elements for the error histogram (default 16384)")
    ev.add_argument("--realisations", type=_positive_int, default=2,
                    help="noise realisations per figure")
    ev.add_argument("--no-sweep", action="store_true", help="skip the DAC × noise sweep")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_eval)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oddl optinc <argv>``; return the exit code."""
    return run_command_tree(register, argv, prefix=(OPTINC,), dest="command", required=False)

if __name__ == "__main__":
    sys.exit(main())
