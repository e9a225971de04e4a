"""`oddl optinc train|eval`: train OptINC MZI phases and report how exactly they average.

``register(subparsers)`` adds the ``optinc`` command to the main parser (each sub-command sets
``func``: args → exit code); ``main(argv)`` runs ``oddl optinc <argv>`` on its own (for tests).
The model and its reconstruction choices are in ``oddl.drivers.optinc_model``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from oddl.drivers import optinc_model as om
from oddl.errors import OddlError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SWEEP_NOISE = (0.0, 0.01, 0.02, 0.05)
SWEEP_PHASE_BITS: tuple[int | None, ...] = (4, 6, 8, 10, 12, None)


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


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from exc
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {value}")
    return value


def _ranged_int(lo: int, hi: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
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
        line = f"train: step {step}/{total}  loss {loss:.3g} level²"
        if self.tty:
            end = "\n" if step >= total else ""
            print(f"\r{line}", end=end, file=self.stream, flush=True)
        elif step >= total * self.next_quarter or step >= total:
            print(line, file=self.stream, flush=True)
            while self.next_quarter <= step / total:
                self.next_quarter += 0.25


# ---- train --------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    """Train phases for an N-input, b-bit device and write the phase file."""
    net = om.OptincNetwork(args.nodes, args.bits, args.mode, preprocessing=args.preprocessing,
                           detection=args.detection, phase_bits=args.phase_bits,
                           noise_rad=args.noise_rad, loss_db_per_mzi=args.loss_db,
                           seed=args.seed)
    result = om.train(net, steps=args.steps, lr=args.lr, noise_rad=args.noise_rad,
                      seed=args.seed, restarts=args.restarts,
                      progress=_Progress(sys.stderr, args.quiet))
    stats = result.as_dict()
    om.save_phases(args.out, net, {"training": stats, "created_by": "oddl optinc train",
                                   "created_unix": int(time.time()), "seed": args.seed,
                                   "lr": args.lr})
    summary = {"out": args.out, **net.hardware(), "training": stats}
    if args.json:
        print(json.dumps(summary))
        return EXIT_OK
    hw = net.hardware()
    print(f"{args.out}: N={net.n_inputs}, {net.bits}-bit, {net.mode}, P={net.preprocessing}, "
          f"{hw['mzi_count']} MZIs + {hw['attenuator_count']} attenuators, "
          f"{_phases_label(net.phase_bits)}")
    noisy = ("" if result.exact_fraction_noisy is None else
             f"; with {net.noise_rad:g} rad noise {100 * result.exact_fraction_noisy:.2f} %")
    print(f"exact: {100 * result.exact_fraction:.2f} % of {result.eval_elements} elements "
          f"without noise{noisy}; {result.steps} steps in {result.seconds:.1f} s, "
          f"final loss {result.final_loss:.3g} level²")
    return EXIT_OK


# ---- eval ---------------------------------------------------------------------------------


def evaluate(net: om.OptincNetwork, *, noise_rad: float, phase_bits: int | None, samples: int,
             realisations: int, seed: int) -> dict[str, Any]:
    """Return the evaluation report of ``net`` as a JSON-ready dict."""
    rng = np.random.default_rng(seed)
    x = om.sample_inputs(net.n_inputs, net.bits, samples, rng)
    want = om.exact_mean(x)
    reps = realisations if noise_rad > 0 else 1
    hist: dict[int, int] = {}
    hits = 0
    for _ in range(reps):
        diff = net.forward(x, noise_rad=noise_rad, phase_bits=phase_bits, rng=rng) - want
        hits += int(np.sum(diff == 0))
        values, counts = np.unique(diff, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            hist[v] = hist.get(v, 0) + c
    total = reps * len(x)
    sweep = []
    for bits in SWEEP_PHASE_BITS:
        row: dict[str, Any] = {"phase_bits": bits}
        for sigma in SWEEP_NOISE:
            row[f"{sigma:g}"] = net.exact_fraction(x, noise_rad=sigma, phase_bits=bits,
                                                   realisations=realisations, rng=rng)
        sweep.append(row)
    space = (1 << net.bits) ** net.n_inputs
    return {
        **net.hardware(),
        "eval": {"noise_rad": noise_rad, "phase_bits": phase_bits, "elements": len(x),
                 "whole_input_space": len(x) == space, "realisations": reps,
                 "exact_fraction": hits / total if total else 1.0,
                 "error_histogram": {str(k): v for k, v in sorted(hist.items())}},
        "sweep": {"noise_rad": list(SWEEP_NOISE), "rows": sweep},
        "training": net.metadata.get("training"),
    }


def _print_report(report: dict[str, Any], path: str) -> None:
    ev = report["eval"]
    print(f"{path}: N={report['n_inputs']}, {report['bits']}-bit, {report['mode']}, "
          f"P={report['preprocessing']}, {report['detection']} detection")
    print(f"hardware: {report['mzi_count']} MZIs + {report['attenuator_count']} attenuators "
          f"({report['phase_shifter_count']} phase shifters), depth {report['depth']}, "
          f"splitter T {report['splitter_loss_db']:.1f} dB")
    scope = "all" if ev["whole_input_space"] else "a sample of"
    print(f"exact: {100 * ev['exact_fraction']:.3f} % of {scope} {ev['elements']} elements "
          f"at {ev['noise_rad']:g} rad noise, {_phases_label(ev['phase_bits'])} "
          f"({ev['realisations']} noise realisation{'s' if ev['realisations'] != 1 else ''})")
    total = sum(ev["error_histogram"].values())
    print("error (output − exact, levels):")
    for k, v in ev["error_histogram"].items():
        print(f"  {int(k):+4d}  {v:>10d}  {100 * v / total:8.3f} %")
    noise = report["sweep"]["noise_rad"]
    print("exact fraction by phase resolution (rows) and phase noise in rad (columns):")
    print("  bits  " + "".join(f"{s:>9g}" for s in noise))
    for row in report["sweep"]["rows"]:
        cells = "".join(f"{100 * row[f'{s:g}']:8.2f}%" for s in noise)
        print(f"  {_bits_label(row['phase_bits']):>4}  {cells}")


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a phase file: exact fraction, error histogram, MZI count, noise/DAC sweep."""
    net = om.load_phases(args.phases)
    noise = net.noise_rad if args.noise_rad is None else args.noise_rad
    bits = net.phase_bits if args.phase_bits == "file" else args.phase_bits
    report = evaluate(net, noise_rad=noise, phase_bits=bits, samples=args.samples,
                      realisations=args.realisations, seed=args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, args.phases)
    return EXIT_OK


# ---- wiring -------------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``optinc train`` and ``optinc eval`` to the main parser's sub-parsers."""
    top = subparsers.add_parser("optinc", help="OptINC: train and evaluate MZI phases")
    sub = top.add_subparsers(dest="optinc_cmd", metavar="{train,eval}")
    sub.required = True

    tr = sub.add_parser("train", help="train the phases of an N-input averaging device")
    tr.add_argument("--nodes", type=_ranged_int(2, om.MAX_INPUTS), required=True,
                    help="inputs N (servers per device)")
    tr.add_argument("--bits", type=_ranged_int(1, om.MAX_BITS), required=True,
                    help="level bit width b")
    tr.add_argument("--mode", choices=om.MODES, default="unitary+diagonal")
    tr.add_argument("--preprocessing", choices=om.PREPROCESSING, default="dft-mean",
                    help="fixed preprocessing P (reconstruction; default dft-mean)")
    tr.add_argument("--detection", choices=om.DETECTION, default="intensity")
    tr.add_argument("--phase-bits", type=_phase_bits, default=8,
                    help="phase DAC resolution in bits; 0 or 'full' for full precision")
    tr.add_argument("--noise-rad", type=_nonneg_float, default=0.02,
                    help="phase noise during training, rad (default 0.02)")
    tr.add_argument("--loss-db", type=_nonneg_float, default=0.0,
                    help="insertion loss per MZI, dB")
    tr.add_argument("--steps", type=_positive_int, default=1500)
    tr.add_argument("--lr", type=float, default=0.05)
    tr.add_argument("--restarts", type=_positive_int, default=3)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--out", required=True, help="phase file to write (JSON)")
    tr.add_argument("--json", action="store_true", help="print the summary as JSON")
    tr.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    tr.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="report how exactly a phase file averages")
    ev.add_argument("--phases", required=True, help="phase file written by 'optinc train'")
    ev.add_argument("--noise-rad", type=_nonneg_float, default=None,
                    help="phase noise, rad (default: the value trained for)")
    ev.add_argument("--phase-bits", type=_phase_bits, default="file",
                    help="phase DAC bits, 0/full for full precision (default: the file's)")
    ev.add_argument("--samples", type=_positive_int, default=1 << 16,
                    help="elements (the whole input space if it is smaller)")
    ev.add_argument("--realisations", type=_positive_int, default=8,
                    help="noise realisations per figure")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_eval)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oddl optinc <argv>``; return the exit code."""
    parser = argparse.ArgumentParser(prog="oddl")
    register(parser.add_subparsers(dest="command"))
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(["optinc", *args_list])
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except OddlError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
