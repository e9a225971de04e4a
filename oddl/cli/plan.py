"""`oddl plan` and `oddl schedule plot`: a collective's plan, its circuits, and a picture.

    oddl plan wrht --nodes 8 --wavelengths 4
    oddl plan totientperms --nodes 1024 --degree 8 --bytes 574.67MB --json
    oddl schedule plot --nodes 8 --collective ring --out ring.png

The plan is built and described by `oddl.plan.describe`, printed by `oddl.plan.text` and drawn
by `oddl.plan.schedule_plot`. It is laid out by the TT-FR scheduler on a one-WSS fabric (`Topology.single_wss`: node
i receives on channel i+1) with a fast tunable laser; `--tune-us` and `--gbps` change the
timing. Pure computation, no testbed needed. Exit codes: 0 ok, 1 the plot could not be
written, 2 bad input (unknown collective, a node count or parameter the collective refuses).

Wire it into a command tree with ``register(subparsers)``; every command sets ``func``, a
function of the parsed arguments that returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from oddl.cli.byte_sizes import parse_size
from oddl.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from oddl.common.collective_kinds import KINDS
from oddl.common.config import OPTINC
from oddl.common.errors import PlanError, ScheduleError
from oddl.plan.describe import DETAIL_NODES, Built, build, describe, jsonable
from oddl.plan.schedule_plot import plot_schedule
from oddl.plan.text import format_text, mb, ms

DEFAULT_BYTES = 100_000_000
"""Buffer size when `--bytes` is not given: 100 MB."""
PLOT_MAX_NODES = 64
"""The schedule picture draws at most this many nodes (one row each)."""

def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"bad parameter {text!r}; use KEY=VALUE, e.g. server=2")
    low = value.strip().lower()
    if low in ("true", "false"):
        return key, low == "true"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


# --------------------------------------------------------------------------- registration


def register(subparsers: Any) -> Any:
    """Add the ``plan`` and ``schedule`` commands to an argparse subparsers object; return the
    ``schedule`` sub-command group so that other modules can add to it."""
    plan = subparsers.add_parser(
        "plan",
        help="print a collective's plan: steps, circuits, wavelengths, retunes, bytes",
        description="Expand a collective into steps, schedule them as circuits on a one-WSS "
        "TT-FR fabric and print the result.",
    )
    plan.add_argument("collective", help="registered collective, e.g. ring, wrht, totientperms")
    _add_common(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument(
        "--detail",
        type=int,
        default=DETAIL_NODES,
        metavar="N",
        help="list every slot's circuits up to this many nodes (default %(default)s)",
    )
    plan.set_defaults(func=cmd_plan)

    sched = subparsers.add_parser("schedule", help="a job's slot schedule (show) or a picture of one (plot)")
    ssub = sched.add_subparsers(dest="schedule_cmd", required=True)
    plot = ssub.add_parser(
        "plot",
        help="draw per node the circuit and wavelength it holds in each slot (PNG)",
        description="Draw, per node, the circuit (destination) and channel it holds in each "
        "slot, with guard times shaded.",
    )
    plot.add_argument("--collective", default="ring", help="collective (default %(default)s)")
    _add_common(plot)
    plot.add_argument("--out", required=True, help="PNG file to write")
    plot.set_defaults(func=cmd_schedule_plot)
    return ssub


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, required=True, help="number of nodes (ranks)")
    p.add_argument("--wavelengths", type=int, help="wavelengths per fibre W (wrht)")
    p.add_argument("--degree", type=int, help="node degree d (totientperms)")
    p.add_argument(
        "--param",
        type=_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another collective parameter, e.g. group_size=5, server=2, bidirectional=false",
    )
    p.add_argument(
        "--bytes",
        type=parse_size,
        default=DEFAULT_BYTES,
        metavar="S",
        help="buffer size per node, e.g. 574.67MB (default 100MB)",
    )
    p.add_argument("--itemsize", type=int, default=4, help="bytes per element (default 4)")
    p.add_argument("--kind", default="all_reduce", choices=KINDS,
                   help="the collective a job of this algorithm runs (default %(default)s); "
                   "--bytes is then its work buffer (docs/explanation/collectives.md)")
    p.add_argument("--root", type=int, default=0,
                   help="root rank of broadcast, gather and scatter (default 0)")
    p.add_argument("--gbps", type=float, default=100.0, help="line rate (default 100 Gbit/s)")
    p.add_argument(
        "--tune-us",
        type=float,
        default=1.0,
        help="laser retune time in microseconds (default 1; an ITLA takes ~50000)",
    )


# --------------------------------------------------------------------------- commands


def cmd_plan(args: argparse.Namespace) -> int:
    """Print a collective's plan and schedule (text, or one JSON object with --json)."""
    if args.collective == OPTINC:  # devices, not TT-FR slots: its own report
        from oddl.cli.plan_optinc import plan_report

        return plan_report(args)
    try:
        built = build(args, args.collective)
        d = describe(built, args.detail)
    except (PlanError, ScheduleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(d) if args.json else format_text(d))
    return EXIT_OK


def cmd_schedule_plot(args: argparse.Namespace) -> int:
    """Draw the schedule of a collective to a PNG file."""
    if args.nodes > PLOT_MAX_NODES:
        print(
            f"error: the picture draws at most {PLOT_MAX_NODES} nodes (one row each); got "
            f"--nodes {args.nodes}, use `oddl plan` for larger jobs",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        built = build(args, args.collective)
    except (PlanError, ScheduleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        plot_schedule(built.schedule, args.out, title=_title(built))
    except ImportError:
        print(
            "error: oddl schedule plot needs matplotlib; install it with `pip install matplotlib`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except OSError as exc:
        print(f"failed: cannot write {args.out}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    s = built.schedule
    print(
        f"wrote {args.out}: {built.collective} on {s.plan.n_ranks} nodes, {len(s.slots)} "
        f"slots, {s.reconfigurations} retunes, makespan {ms(s.makespan_s)}"
    )
    return EXIT_OK


def _title(built: Built) -> str:
    s = built.schedule
    params = ", ".join(f"{k}={v}" for k, v in built.params.items() if jsonable(v))
    return (
        f"{built.collective}{f' ({params})' if params else ''} on {s.plan.n_ranks} nodes, "
        f"{mb(built.n_bytes)} at {s.timing.line_rate_bps / 1e9:g} Gbit/s: "
        f"{len(s.slots)} slots, {s.reconfigurations} retunes"
    )


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``plan`` or ``schedule plot`` from `argv`; return the exit code."""
    parser = argparse.ArgumentParser(prog="oddl")
    register(parser.add_subparsers(dest="cmd", required=True))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on a usage error, 0 after --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
