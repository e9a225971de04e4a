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
``--help``); the assumptions behind each are in docs/simulator.md. ``--testbed FILE``
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
import math
import sys
from collections.abc import Sequence
from typing import Any

from common.errors import OddlError
from oddl.byte_sizes import parse_size

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

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
        description=__doc__.split("\n\n")[0] + " Assumptions: docs/simulator.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=cmd_simulate)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the simulate options (one flag per `SimConfig` field) to a parser."""
    from offline.simulator.engine import SYSTEMS, SimConfig

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
                    "from performance.md)")
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
    parser = argparse.ArgumentParser(prog="oddl simulate",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    return cmd_simulate(args)


# --------------------------------------------------------------------------- the command


def cmd_simulate(args: argparse.Namespace) -> int:
    """The ``oddl simulate`` command."""
    from offline.simulator.engine import SimConfig, SimulationError, simulate, sweep

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
    except SimulationError as exc:
        print(f"oddl simulate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OddlError as exc:
        print(f"oddl simulate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result.as_dict(), default=_json_default) if args.json else text)
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
    from offline.simulator.engine import SimConfig, SimulationError

    key, sep, raw = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(SimConfig)}
    name = key.strip().replace("-", "_")
    name = ALIASES.get(key.strip(), ALIASES.get(name, name))
    if not sep or name not in fields:
        known = ", ".join(sorted(n.replace("_", "-") for n in fields))
        raise SimulationError(
            f"bad --sweep {text!r}; use PARAM=V1,V2,... with PARAM one of {known} "
            f"(or {', '.join(sorted(ALIASES))})")
    kind = type(fields[name].default)
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
    from offline.workloads import DEFAULT_BATCH, MODELS

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
    print(f"compute: batch {DEFAULT_BATCH}, A100 at 63.8 TFLOP/s sustained; see docs/simulator.md")
    return EXIT_OK


def _testbed(args: argparse.Namespace) -> int:
    from common.config import load_testbed
    from offline.simulator.testbed import TestbedOverheads, predict_testbed_allreduce

    cfg = load_testbed(args.testbed)
    itemsize = args.itemsize or 4
    if args.bytes < itemsize:
        raise OddlError(f"--bytes must be at least one element ({itemsize} B); got {args.bytes}")
    over = TestbedOverheads(fixed_s=args.overhead_ms / 1e3) if args.overhead_ms is not None \
        else None
    pred = predict_testbed_allreduce(cfg, args.bytes // itemsize,
                                     collective=args.collective or "ring",
                                     network=args.network, itemsize=itemsize, overheads=over)
    d = pred.as_dict()
    if args.json:
        print(json.dumps({"testbed": cfg.name, **d}))
        return EXIT_OK
    print(f"{cfg.name}: {d['collective']} all-reduce of {d['bytes']:,} B on {d['nodes']} nodes, "
          f"{d['network']} network at {d['line_rate_gbps']:g} Gbit/s")
    print(f"  predicted {d['total_ms']:.2f} ms = schedule {d['schedule_ms']:.2f} + launch "
          f"{d['launch_ms']:.2f} + fixed {d['fixed_ms']:.2f} + copies {d['copy_ms']:.2f} "
          f"({d['slots']} slots, {d['retunes']} retunes)")
    return EXIT_OK


# --------------------------------------------------------------------------- output


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def format_table(sim: Any) -> str:
    """The simulation as a table for people."""
    from offline.simulator.engine import LABELS, PAPER

    cfg = sim.config
    prof = cfg.profile
    ratios = sim.ratios()
    comm_ratios = sim.ratios(what="comm_s")
    lines = [
        f"oddl simulate — {prof.name}: {prof.params:,} parameters, "
        f"{prof.gradient_bytes(cfg.itemsize) / 1e6:.2f} MB gradient ({cfg.itemsize} B/element); "
        f"{cfg.nodes} nodes at {cfg.gbps:g} Gbit/s",
        f"compute {cfg.compute_s * 1e3:.1f} ms per iteration"
        + (" (given)" if cfg.compute_ms >= 0 else
           f" (batch {cfg.batch}, {cfg.sustained_tflops:g} TFLOP/s sustained)")
        + (f"; {cfg.overlap:.0%} of backward overlaps communication" if cfg.overlap else ""),
        "",
        f"{'system':26}{'collective':19}{'compute ms':>11}{'comm ms':>10}{'reconfig ms':>13}"
        f"{'iteration ms':>13}{'× ODDL':>8}",
    ]
    for r in sim.results:
        ratio = f"{ratios[r.system]:.2f}" if r.system in ratios else "-"
        lines.append(f"{LABELS[r.system]:26}{r.collective:19}{r.compute_s * 1e3:>11.1f}"
                     f"{r.comm_s * 1e3:>10.2f}{r.reconfig_s * 1e3:>13.3f}"
                     f"{r.iteration_s * 1e3:>13.2f}{ratio:>8}")
    setup = [f"{LABELS[r.system]} {_duration(r.setup_s)}" for r in sim.results if r.setup_s]
    if setup:
        how = (f"amortised over {cfg.amortise_iterations} iterations" if cfg.amortise_iterations
               else "not in the iteration")
        lines += ["", f"one-off per job ({how}): " + "; ".join(setup)]
    if (prof.name == PAPER["model"] and cfg.nodes == PAPER["nodes"]
            and cfg.gbps == PAPER["gbps"] and "oddl" in ratios):
        got = [f"{s} {ratios[s]:.2f}× (communication alone {comm_ratios[s]:.2f}×)"
               for s in ("fat-tree", "sip-ring") if s in ratios]
        if got:
            lines += ["", f"paper (VGG19, 1024 nodes, 100 Gbit/s): fat-tree {PAPER['fat-tree']}×, "
                      f"SiP-Ring {PAPER['sip-ring']}× slower than ODDL; this model: "
                      + ", ".join(got)]
    if "wrht" in comm_ratios and "oddl" in comm_ratios:
        lo, hi = PAPER["wrht"]
        lines += ["", f"WRHT's communication is {comm_ratios['wrht']:.2f}× ODDL's "
                  f"{cfg.collective} ({cfg.bandwidth_norm} bandwidth normalisation); WRHT paper: "
                  f"{1 - hi:.2f}–{1 - lo:.2f}× (−{lo:.2%} to −{hi:.2%}) against an "
                  "optical-system all-reduce"]
    lines.append("assumptions: docs/simulator.md")
    return "\n".join(lines)


def format_sweep(sw: Any) -> str:
    """The sweep as a table: iteration time per system (ratio to ODDL)."""
    from offline.simulator.engine import LABELS

    head = sw.points[0].simulation.config
    lines = [f"oddl simulate — sweep of {sw.param}: {head.model}, iteration time in ms "
             f"(× ODDL); other parameters as in the single-point table", ""]
    width = 22
    first = max(12, len(sw.param))
    lines.append(f"{sw.param:>{first}}" + "".join(f"{s:>{width}}" for s in sw.systems))
    for p in sw.points:
        ratios = p.simulation.ratios() if p.simulation else {}
        cells = []
        for s in sw.systems:
            r = next((x for x in p.simulation.results if x.system == s), None) \
                if p.simulation else None
            if r is None:
                cells.append(f"{'n/a':>{width}}")
            else:
                ratio = f" ({ratios[s]:.2f})" if s in ratios else ""
                cells.append(f"{r.iteration_s * 1e3:.2f}{ratio}".rjust(width))
        lines.append(f"{p.value!s:>{first}}" + "".join(cells))
    notes = [f"{sw.param}={p.value}: {LABELS[s]} not simulated: {e}"
             for p in sw.points for s, e in p.errors.items()]
    if notes:
        lines += ["", *notes]
    lines.append(f"({len(sw.points)} points in {sw.elapsed_s:.2f} s; assumptions: "
                 "docs/simulator.md)")
    return "\n".join(lines)


def _duration(s: float) -> str:
    return f"{s:g} s" if s >= 1 else f"{s * 1e3:g} ms"


def _log_if_wide(ax: Any) -> None:
    """Log y axis when the plotted values span more than a factor of 100."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
    if ys and max(ys) / min(ys) > 100:
        ax.set_yscale("log")


def _paper_marks(ax: Any, systems: Sequence[str]) -> None:
    """The papers' figures on the ratio axis: ODDL's 1.6× (fat-tree) and 1.7× (SiP-Ring);
    WRHT's 0.19–0.24× (communication against an optical-system all-reduce)."""
    from offline.simulator.engine import PAPER

    for s, colour in (("fat-tree", "tab:red"), ("sip-ring", "tab:purple")):
        if s in systems:
            ax.axhline(PAPER[s], color=colour, lw=0.8, ls=":",
                       label=f"ODDL paper: {s} {PAPER[s]}×")
    if "wrht" in systems:
        lo, hi = PAPER["wrht"]
        ax.axhspan(1 - hi, 1 - lo, color="tab:green", alpha=0.15,
                   label="WRHT paper: −75.6…−80.8 % (communication)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(result: Any, path: str) -> None:
    """Draw a sweep (iteration time and ratio to ODDL) or one simulation (stacked bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from offline.simulator.engine import LABELS, Sweep

    if isinstance(result, Sweep):
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
        numeric = all(isinstance(v, int | float) for v in result.values)
        xs: list[Any] = list(result.values) if numeric else list(range(len(result.values)))
        base = result.series("oddl") if "oddl" in result.systems else None
        for i, s in enumerate(result.systems):
            style = {"marker": "os^vDx"[i % 6], "linestyle": ("-", "--", ":", "-.")[i % 4]}
            ys = result.series(s)
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], label=LABELS[s],
                        **style)
            if base is not None:
                rs = [(x, y / b) for x, y, b in zip(xs, ys, base, strict=True)
                      if y is not None and b]
                if rs:
                    ax2.plot([p[0] for p in rs], [p[1] for p in rs], label=LABELS[s], **style)
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        _log_if_wide(ax)
        _log_if_wide(ax2)
        _paper_marks(ax2, result.systems)
        if not numeric:
            ax2.set_xticks(xs, [str(v) for v in result.values])
        ax.set_ylabel("iteration time (ms)")
        head = result.points[0].simulation.config
        what = f"{head.message_mb:g} MB" if head.message_mb > 0 else head.model
        ax.set_title(f"{what}, {head.nodes} nodes: sweep of {result.param}"
                     + (" (communication only)" if head.compute_ms == 0 else ""))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax2.set_ylabel("× ODDL")
        ax2.set_xlabel(result.param)
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.grid(alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        names = [LABELS[r.system] for r in result.results]
        comp = [r.compute_s * 1e3 for r in result.results]
        reconf = [r.reconfig_s * 1e3 for r in result.results]
        rest = [(r.iteration_s - r.compute_s - r.reconfig_s) * 1e3 for r in result.results]
        ax.barh(names, comp, label="compute")
        ax.barh(names, rest, left=comp, label="communication")
        ax.barh(names, reconf, left=[a + b for a, b in zip(comp, rest, strict=True)],
                label="reconfiguration")
        cfg = result.config
        ax.set_xlabel("iteration time (ms)")
        ax.set_title(f"{cfg.model}, {cfg.nodes} nodes, {cfg.gbps:g} Gbit/s")
        ax.invert_yaxis()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
