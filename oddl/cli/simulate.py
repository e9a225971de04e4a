"""`oddl simulate`: predict a training iteration at cluster scale on seven networks.

    oddl simulate --model vgg19 --nodes 1024 --gbps 100
    oddl simulate --model resnet50 --nodes 1024 --gbps 100 --json
    oddl simulate --model vgg19 --sweep nodes=16,64,256,1024 --plot nodes.png
    oddl simulate --model vgg19 --sweep ft-oversub=1,2,3,4 --ft-placement random
    oddl simulate --compute-ms 0 --sweep bandwidth-norm=node,lambda
    oddl simulate --systems oddl,wrht --bandwidth-norm lambda --sweep message-mb=0.1,1,10
    oddl simulate --testbed deploy/testbeds/emulated-4node.toml --bytes 256KiB

Systems: ODDL (the controller's TT-FR scheduler), electrical fat-tree, ideal electrical
switch, SiP-Ring, WRHT, TopoOpt (TotientPerms) and OptINC. Every node has the same bandwidth
(``--bandwidth-norm node``, the default) unless ``--bandwidth-norm lambda`` gives every
wavelength or interface the line rate. Every model parameter is a flag (see
``--help``); the assumptions behind each are in docs/explanation/simulator.md. ``--testbed FILE``
instead predicts one all-reduce on that testbed (line rate and device timing from the file).

Exit codes: 0 ok, 1 the plot could not be written, 2 bad input (unknown model, a node count
a collective refuses, a non-positive rate, an unknown parameter).

Wire it into a command tree with ``register(subparsers)``; the command sets ``func``, a
function of the parsed arguments that returns the exit code. ``main(argv)`` runs it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from oddl.cli.byte_sizes import parse_size
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from oddl.cli.shared import json_default, run_alone
from oddl.common.errors import OddlError
from oddl.simulate.plot import plot
from oddl.simulate.text import format_sweep, format_table

ALIASES = {
    "rate": "gbps",
    "line-rate": "gbps",
    "tuning": "tune_us",
    "tune": "tune_us",
    "wss": "wss_ms",
    "oversubscription": "ft_oversub",
    "delta": "sip_delta_us",
    "norm": "bandwidth_norm",
    "normalisation": "bandwidth_norm",
    "step-overhead": "step_overhead_us",
    "hop-latency": "ft_hop_latency_us",
    "message": "message_mb",
    "size": "message_mb",
}
"""Short names accepted by ``--sweep`` besides the parameter names."""

# --------------------------------------------------------------------------- registration


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` command to an argparse subparsers object and return its parser."""
    p = subparsers.add_parser(
        "simulate",
        help="predict a training iteration on ODDL, fat-tree, ideal, SiP-Ring, WRHT, TopoOpt, "
             "OptINC",
        description=__doc__.split("\n\n")[0] + " Assumptions: docs/explanation/simulator.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=cmd_simulate)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the simulate options (one flag per `SimConfig` field) to a parser."""
    from oddl.offline.simulator.core import SYSTEMS, SimConfig

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--systems", metavar="A,B,...",
                     help=f"systems to simulate (default all: {','.join(SYSTEMS)})")
    out.add_argument("--sweep", metavar="PARAM=V1,V2,...",
                     help="simulate each value of one parameter, e.g. nodes=16,64,256,1024, "
                     "gbps=25,100,400, tune-us=0.01,1,100, wss-ms=10,100,500")
    out.add_argument("--plot", metavar="FILE.png",
                     help="draw iteration times (and ratios to ODDL) to a PNG file")
    out.add_argument("--list-models", action="store_true", help="list the model profiles")
    tb = p.add_argument_group("testbed prediction (instead of the cluster simulation)")
    tb.add_argument("--testbed", metavar="FILE",
                    help="predict one all-reduce on this testbed (line rate, timing from it)")
    tb.add_argument("--bytes", type=parse_size, default=2**20, metavar="S",
                    help="all-reduce size for --testbed (default 1MiB)")
    tb.add_argument("--network", choices=("optical", "ideal"), default="optical",
                    help="testbed network for --testbed (default optical)")
    tb.add_argument("--overhead-ms", type=float, metavar="MS",
                    help="fixed overhead per all-reduce for --testbed (default: a priori "
                    "from docs/sources.md §7)")
    params = p.add_argument_group("model parameters (defaults in brackets)")
    for f in dataclasses.fields(SimConfig):
        default = f.default
        params.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=type(default), default=None,
            metavar=type(default).__name__.upper(),
            help=f"{f.metadata.get('help', '')} [{default}]",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oddl simulate`` with `argv` (without the command name); return the exit code."""
    return run_alone("oddl simulate", __doc__, add_arguments, cmd_simulate, argv)


# --------------------------------------------------------------------------- the command


def cmd_simulate(args: argparse.Namespace) -> int:
    """The ``oddl simulate`` command."""
    from oddl.offline.simulator.core import SimConfig
    from oddl.offline.simulator.engine import simulate, sweep

    try:
        if args.list_models:
            return _list_models(args.json)
        if args.testbed:
            return _testbed(args)
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimConfig)
                  if getattr(args, f.name, None) is not None}
        config = SimConfig().with_values(**values)
        systems = _systems(args.systems)
        if args.sweep:
            param, points = _parse_sweep(args.sweep)
            result: Any = sweep(config, param, points, systems)
            text = format_sweep(result)
        else:
            result = simulate(config, systems)
            text = format_table(result)
    except OddlError as exc:  # SimulationError among them
        print(f"oddl simulate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result.as_dict(), default=json_default) if args.json else text)
    if args.plot:
        try:
            plot(result, args.plot)
        except (OSError, ValueError) as exc:
            print(f"oddl simulate: cannot write the plot {args.plot!r}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        if not args.json:
            print(f"plot written to {args.plot}")
    return EXIT_OK


def _systems(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [s.strip() for s in text.split(",") if s.strip()]


def _parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``PARAM=V1,V2,...`` → (field name, typed values); SimulationError when malformed."""
    from oddl.offline.simulator.core import SimConfig, SimulationError

    key, sep, raw = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(SimConfig)}
    name = key.strip().replace("-", "_")
    name = ALIASES.get(key.strip(), ALIASES.get(name, name))
    if not sep or name not in fields:
        known = ", ".join(sorted(n.replace("_", "-") for n in fields))
        raise SimulationError(
            f"bad --sweep {text!r}; use PARAM=V1,V2,... with PARAM one of {known} "
            f"(or {', '.join(sorted(ALIASES))})")
    kind: type[Any] = type(fields[name].default)
    values: list[Any] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            values.append(kind(float(item)) if kind is int and "." in item else kind(item))
        except ValueError:
            raise SimulationError(
                f"--sweep {name}: {item!r} is not a {kind.__name__}") from None
    if not values:
        raise SimulationError(f"--sweep {name} has no values; give e.g. {name}=1,2,4")
    return name, values


def _list_models(as_json: bool) -> int:
    from oddl.offline.workloads import DEFAULT_BATCH, MODELS

    rows = [{"name": m.name, "params": m.params, "gradient_mb_fp32": m.gradient_bytes(4) / 1e6,
             "gmacs": m.gmacs, "compute_ms": m.compute_s(DEFAULT_BATCH) * 1e3,
             "source": m.source} for m in MODELS.values()]
    if as_json:
        print(json.dumps({"models": rows}))
        return EXIT_OK
    print(f"{'model':10} {'parameters':>12} {'fp32 MB':>9} {'GMACs':>6} {'compute ms':>11}")
    for r in rows:
        print(f"{r['name']:10} {r['params']:>12,} {r['gradient_mb_fp32']:>9.2f} "
              f"{r['gmacs']:>6.2f} {r['compute_ms']:>11.1f}")
    print(f"compute: batch {DEFAULT_BATCH}, A100 at 63.8 TFLOP/s sustained; see docs/explanation/simulator.md")
    return EXIT_OK


def _testbed(args: argparse.Namespace) -> int:
    from oddl.common.config import load_testbed
    from oddl.offline.simulator.testbed import TestbedOverheads, predict_testbed_allreduce

    cfg = load_testbed(args.testbed)
    itemsize = args.itemsize or 4
    if args.bytes < itemsize:
        raise OddlError(f"--bytes must be at least one element ({itemsize} B); got {args.bytes}")
    over = TestbedOverheads(fixed_s=args.overhead_ms / 1e3) if args.overhead_ms is not None \
        else None
    pred = predict_testbed_allreduce(cfg, args.bytes // itemsize,
                                     collective=args.collective or "ring",
                                     network=args.network, itemsize=itemsize, overheads=over,
                                     kind=args.kind or "all_reduce")
    d = pred.as_dict()
    if args.json:
        print(json.dumps({"testbed": cfg.name, **d}))
        return EXIT_OK
    kind = (args.kind or "all_reduce").replace("_", "-")
    print(f"{cfg.name}: {d['collective']} {kind} of {d['bytes']:,} B on {d['nodes']} nodes, "
          f"{d['network']} network at {d['line_rate_gbps']:g} Gbit/s")
    print(f"  predicted {d['total_ms']:.2f} ms = schedule {d['schedule_ms']:.2f} + launch "
          f"{d['launch_ms']:.2f} + fixed {d['fixed_ms']:.2f} + copies {d['copy_ms']:.2f} "
          f"({d['slots']} slots, {d['retunes']} retunes)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
