"""`oddl plan` and `oddl schedule plot`: a collective's plan, its circuits, and a picture.

    oddl plan wrht --nodes 8 --wavelengths 4
    oddl plan totientperms --nodes 1024 --degree 8 --bytes 574.67MB --json
    oddl schedule plot --nodes 8 --collective ring --out ring.png

The plan is laid out by the TT-FR scheduler on a one-WSS fabric (`Topology.single_wss`: node
i receives on channel i+1) with a fast tunable laser; `--tune-us` and `--gbps` change the
timing. Pure computation, no testbed needed. Exit codes: 0 ok, 1 the plot could not be
written, 2 bad input (unknown collective, a node count or parameter the collective refuses).

Wire it into a command tree with ``register(subparsers)``; every command sets ``func``, a
function of the parsed arguments that returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import PlanError, ScheduleError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_BYTES = 100_000_000
"""Buffer size when `--bytes` is not given: 100 MB."""
DETAIL_NODES = 16
"""Up to this many nodes, every slot's circuits are listed."""
PLOT_MAX_NODES = 64
"""The schedule picture draws at most this many nodes (one row each)."""

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a byte count such as ``4096``, ``100MB``, ``574.67 MB`` or ``1GiB`` (MB = 10⁶ B)."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}; use a byte count with an optional unit, e.g. 4096, 100MB, 1GiB"
        )
    return round(float(m.group(1)) * _UNITS[unit])


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
    p.add_argument("--gbps", type=float, default=100.0, help="line rate (default 100 Gbit/s)")
    p.add_argument(
        "--tune-us",
        type=float,
        default=1.0,
        help="laser retune time in microseconds (default 1; an ITLA takes ~50000)",
    )


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class Built:
    """A plan, its schedule, and the inputs they came from."""

    collective: str
    params: dict[str, Any]
    n_bytes: int
    plan: Any
    schedule: Any


def build(args: argparse.Namespace, collective: str) -> Built:
    """Make the plan and the schedule the arguments ask for (PlanError/ScheduleError if not)."""
    from controller.scheduling import TimingModel, Topology, make_plan, schedule_plan

    if collective == "optinc":
        raise PlanError("optinc has no TT-FR slot schedule (its OptINC devices are not "
                        "tunable-laser nodes); `oddl plan optinc --nodes N` lays it out")
    params: dict[str, Any] = dict(args.param)
    if args.wavelengths is not None:
        params["wavelengths"] = args.wavelengths
    if args.degree is not None:
        params["degree"] = args.degree
    if args.itemsize < 1:
        raise PlanError(f"--itemsize must be >= 1 byte; got {args.itemsize}, e.g. 4 for float32")
    n_elems = args.bytes // args.itemsize
    plan = make_plan(collective, args.nodes, n_elems, **params)
    if not args.gbps > 0:
        raise PlanError(f"--gbps must be positive; got {args.gbps}")
    timing = TimingModel(
        tune_s=args.tune_us * 1e-6,
        skew_s=1e-7,  # hardware-timestamped PTP
        cdr_s=1e-6,  # receiver clock-recovery lock
        command_s=0.0,  # agents gate from the published schedule
        wss_settle_s=0.1,  # job scale, not in any slot
        slot_margin_s=1e-6,
        line_rate_bps=args.gbps * 1e9,
    )
    topo = Topology.single_wss(plan.n_ranks)
    sched = schedule_plan(plan, topo.node_ids, topo, timing, args.itemsize)
    return Built(collective, params, n_elems * args.itemsize, plan, sched)


def describe(built: Built, detail_nodes: int = DETAIL_NODES) -> dict[str, Any]:
    """Return the plan and its schedule as one JSON-ready dict."""
    plan, sched = built.plan, built.schedule
    itemsize = sched.itemsize
    sent = plan.bytes_sent(itemsize)
    out: dict[str, Any] = {
        "collective": built.collective,
        "nodes": plan.n_ranks,
        "params": {k: v for k, v in built.params.items() if _jsonable(v)},
        "bytes": built.n_bytes,
        "itemsize": itemsize,
        "elements": plan.n_elems,
        "line_rate_gbps": sched.timing.line_rate_bps / 1e9,
        "retune_guard_s": sched.timing.guard_s,
        "steps": plan.n_steps,
        "slots": len(sched.slots),
        "reconfigurations": sched.reconfigurations,
        "guard_total_s": sched.guard_total_s,
        "hold_total_s": sched.hold_total_s,
        "makespan_s": sched.makespan_s,
        "efficiency": sched.efficiency,
        "bytes_sent": {
            "min": int(sent.min()),
            "max": int(sent.max()),
            "mean": float(sent.mean()),
            "total": int(sent.sum()),
        },
        "phases": _phases(plan, sched),
    }
    extra = _collective_details(built)
    if extra:
        out.update(extra)
    if plan.n_ranks <= detail_nodes:
        out["step_list"] = _step_list(plan, sched)
    return out


def _phases(plan: Any, sched: Any) -> list[dict[str, Any]]:
    """Summarise consecutive steps of one phase: steps, slots, transfers, bytes, retunes."""
    slots_of = [0] * plan.n_steps
    retunes_of = [0] * plan.n_steps
    for slot in sched.slots:
        slots_of[slot.step] += 1
        retunes_of[slot.step] += len(slot.retune_flows)
    rows: list[dict[str, Any]] = []
    for i, step in enumerate(plan.steps):
        label = step.phase or str(step.op)
        if not rows or rows[-1]["phase"] != label:
            rows.append(
                {
                    "phase": label,
                    "op": str(step.op),
                    "first_step": i,
                    "steps": 0,
                    "slots": 0,
                    "transfers": 0,
                    "bytes": 0,
                    "retunes": 0,
                }
            )
        row = rows[-1]
        row["steps"] += 1
        row["slots"] += slots_of[i]
        row["transfers"] += len(step)
        row["bytes"] += int(step.length.sum()) * sched.itemsize
        row["retunes"] += retunes_of[i]
    return rows


def _step_list(plan: Any, sched: Any) -> list[dict[str, Any]]:
    nodes = sched.nodes
    by_step: list[list[Any]] = [[] for _ in range(plan.n_steps)]
    for slot in sched.slots:
        by_step[slot.step].append(slot)
    steps = []
    for i, step in enumerate(plan.steps):
        slots = []
        for slot in by_step[i]:
            movers = {int(slot.src_rank[f]) for f in slot.retune_flows.tolist()}
            circuits = [
                {
                    "src": nodes[s],
                    "dst": nodes[d],
                    "channel": int(ch),
                    "bytes": int(b),
                    "retune": s in movers,
                }
                for s, d, ch, b in zip(
                    slot.src_rank.tolist(),
                    slot.dst_rank.tolist(),
                    slot.channels().tolist(),
                    slot.bytes.tolist(),
                    strict=True,
                )
            ]
            slots.append(
                {
                    "slot": slot.index,
                    "start_s": slot.start_s,
                    "guard_s": slot.guard_s,
                    "hold_s": slot.hold_s,
                    "end_s": slot.end_s,
                    "retunes": len(slot.retune_flows),
                    "circuits": circuits,
                }
            )
        lengths = step.length * sched.itemsize
        steps.append(
            {
                "step": i,
                "phase": step.phase,
                "op": str(step.op),
                "transfers": len(step),
                "bytes_min": int(lengths.min()),
                "bytes_max": int(lengths.max()),
                "slots": slots,
            }
        )
    return steps


def _collective_details(built: Built) -> dict[str, Any]:
    """WRHT's wavelength plan, or TotientPerms' jumps and diameter."""
    plan, params = built.plan, built.params
    if built.collective == "wrht":
        from controller.scheduling.wrht import wrht_wavelength_plan

        keys = ("wavelengths", "group_size", "bidirectional", "balanced", "budget")
        wp = wrht_wavelength_plan(plan.n_ranks, **{k: params[k] for k in keys if k in params})
        return {
            "wavelength_plan": {
                "wavelengths": wp.wavelengths,
                "group_size": wp.group_size,
                "bidirectional": wp.bidirectional,
                "wavelengths_needed": wp.wavelengths_needed,
                "steps": [
                    {
                        "step": s.step,
                        "phase": s.phase,
                        "level": s.level,
                        "groups": s.groups,
                        "largest_group": s.largest_group,
                        "wavelengths": s.wavelengths,
                        "max_hops": s.max_hops,
                        "loss_db": round(s.budget.loss_db, 4),
                        "slack_db": round(s.budget.slack_db, 4),
                    }
                    for s in wp.steps
                ],
            }
        }
    if built.collective == "totientperms" and plan.n_ranks >= 2:
        from controller.scheduling.totient import (
            circulant_diameter,
            ring_jumps,
            select_permutations,
        )

        degree = params.get("degree", 2)
        jumps = select_permutations(plan.n_ranks, degree)
        rings = ring_jumps(plan.n_ranks, degree, params.get("both_directions", False))
        return {
            "topology": {
                "degree": degree,
                "jumps": list(jumps),
                "rings": list(rings),
                "diameter": circulant_diameter(plan.n_ranks, jumps),
            }
        }
    return {}


def _jsonable(v: Any) -> bool:
    return isinstance(v, bool | int | float | str) or v is None


# --------------------------------------------------------------------------- text


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def format_text(d: dict[str, Any]) -> str:
    """Render `describe`'s dict for a terminal."""
    params = ", ".join(f"{k}={v}" for k, v in d["params"].items())
    lines = [
        f"{d['collective']} all-reduce on {d['nodes']} nodes"
        f"{f' ({params})' if params else ''}: {d['steps']} steps, {d['slots']} slots, "
        f"{d['reconfigurations']} reconfigurations (transmitter retunes)",
        f"  buffer {_mb(d['bytes'])} ({d['elements']:,} x {d['itemsize']} B) at "
        f"{d['line_rate_gbps']:g} Gbit/s; retune guard {d['retune_guard_s'] * 1e6:.2f} us",
        f"  makespan {_ms(d['makespan_s'])}, guard total {d['guard_total_s'] * 1e6:.2f} us, "
        f"efficiency {d['efficiency']:.5f}",
        f"  bytes sent per node: min {_mb(d['bytes_sent']['min'])}, max "
        f"{_mb(d['bytes_sent']['max'])}, mean {_mb(d['bytes_sent']['mean'])}",
    ]
    if "wavelength_plan" in d:
        wp = d["wavelength_plan"]
        ring = "bidirectional" if wp["bidirectional"] else "unidirectional"
        lines.append(
            f"  WRHT ring: W={wp['wavelengths']}, group size m={wp['group_size']}, {ring}; "
            f"wavelengths needed {wp['wavelengths_needed']} (reused by every group)"
        )
        for s in wp["steps"]:
            lines.append(
                f"    step {s['step']}: {s['phase']} level {s['level']}, "
                f"{_n(s['groups'], 'group')} of <= {s['largest_group']} nodes, "
                f"{_n(s['wavelengths'], 'wavelength')}, longest path "
                f"passes {s['max_hops']} nodes, loss {s['loss_db']:.2f} dB, slack "
                f"{s['slack_db']:.2f} dB"
            )
    if "topology" in d:
        t = d["topology"]
        lines.append(
            f"  TotientPerms degree {t['degree']}: jumps {t['jumps']}, diameter {t['diameter']}; "
            f"all-reduce rings {t['rings']}"
        )
    if "step_list" in d:
        for st in d["step_list"]:
            size = (
                _mb(st["bytes_min"])
                if st["bytes_min"] == st["bytes_max"]
                else f"{st['bytes_min']:,}..{st['bytes_max']:,} B"
            )
            lines.append(
                f"step {st['step']}  {st['phase'] or st['op']}  {st['op'].upper()}  "
                f"{_n(st['transfers'], 'transfer')} of {size} -> {_n(len(st['slots']), 'slot')}"
            )
            for sl in st["slots"]:
                circuits = "  ".join(
                    f"{c['src']}->{c['dst']} ch{c['channel']}{'*' if c['retune'] else ''}"
                    for c in sl["circuits"]
                )
                retuned = f"  ({_n(sl['retunes'], 'retune')})" if sl["retunes"] else ""
                lines.append(f"  slot {sl['slot']:<3} t={_ms(sl['start_s'])}  {circuits}{retuned}")
        lines.append("(* = the transmitter retunes at the start of the slot)")
    else:
        lines.append(
            f"{'phase':<22}{'steps':>7}{'slots':>8}{'transfers':>11}{'MB':>12}{'retunes':>9}"
        )
        for p in d["phases"]:
            lines.append(
                f"{p['phase']:<22}{p['steps']:>7}{p['slots']:>8}{p['transfers']:>11}"
                f"{p['bytes'] / 1e6:>12.2f}{p['retunes']:>9}"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


def cmd_plan(args: argparse.Namespace) -> int:
    """Print a collective's plan and schedule (text, or one JSON object with --json)."""
    if args.collective == "optinc":  # devices, not TT-FR slots: its own report
        from oddl.optinc_cli import plan_report

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
        f"slots, {s.reconfigurations} retunes, makespan {_ms(s.makespan_s)}"
    )
    return EXIT_OK


def _title(built: Built) -> str:
    s = built.schedule
    params = ", ".join(f"{k}={v}" for k, v in built.params.items() if _jsonable(v))
    return (
        f"{built.collective}{f' ({params})' if params else ''} on {s.plan.n_ranks} nodes, "
        f"{_mb(built.n_bytes)} at {s.timing.line_rate_bps / 1e9:g} Gbit/s: "
        f"{len(s.slots)} slots, {s.reconfigurations} retunes"
    )


# --------------------------------------------------------------------------- picture


def plot_schedule(sched: Any, path: str, title: str = "") -> None:
    """Draw per node (rows) the slots it transmits in over time, coloured by channel.

    Each bar is the slot's window after its guard, labelled with the destination; guards are
    grey before the window (hatched where the node's laser retunes). Guards of microseconds
    next to holds of milliseconds are drawn at least 0.4 % of the time axis wide.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    n = sched.plan.n_ranks
    channels = sched.topology.grid.channels
    span = max(sched.makespan_s, 1e-12)
    t0 = sched.start_s
    min_guard = 0.004 * span
    fig = Figure(figsize=(12, max(2.5, 0.35 * n + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = _colormap(channels)
    data: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    colours: list[list[Any]] = [[] for _ in range(n)]
    guards: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    retunes: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    label_rows = n <= 32
    for slot in sched.slots:
        movers = set(slot.src_rank[slot.retune_flows].tolist())
        width = slot.end_s - slot.data_start_s
        g = ((slot.start_s - t0) * 1e3, max(slot.guard_s, min_guard) * 1e3)
        for s, d, ch in zip(
            slot.src_rank.tolist(), slot.dst_rank.tolist(), slot.channels().tolist(), strict=True
        ):
            data[s].append(((slot.data_start_s - t0) * 1e3, width * 1e3))
            colours[s].append(_colour(cmap, ch, channels))
            (retunes if s in movers else guards)[s].append(g)
            if label_rows and width >= 0.02 * span:
                ax.text(
                    (slot.data_start_s - t0 + width / 2) * 1e3,
                    s,
                    f"→{d}",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
    for r in range(n):
        if data[r]:
            ax.broken_barh(
                data[r], (r - 0.4, 0.8), facecolors=colours[r], edgecolor="white", linewidth=0.3
            )
        if guards[r]:
            ax.broken_barh(guards[r], (r - 0.4, 0.8), facecolors="lightgrey", zorder=3)
        if retunes[r]:
            ax.broken_barh(
                retunes[r],
                (r - 0.4, 0.8),
                facecolors="grey",
                hatch="////",
                edgecolor="black",
                linewidth=0.3,
                zorder=3,
            )
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [sched.nodes[r] for r in range(n)], fontsize=8 if n <= 32 else 5)
    ax.set_xlim(-0.01 * span * 1e3, 1.01 * span * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("transmitting node")
    ax.set_title(title or f"{sched.plan.collective} on {n} nodes", fontsize=10)
    used = sorted({int(c) for slot in sched.slots for c in slot.channels().tolist()})
    handles = [Patch(facecolor=_colour(cmap, c, channels), label=f"ch{c}") for c in used[:16]]
    handles += [
        Patch(facecolor="grey", hatch="////", edgecolor="black", label="guard, laser retunes"),
        Patch(facecolor="lightgrey", label="guard, skew only"),
    ]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        title="channel (= receiver)",
        title_fontsize=7,
    )
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _colormap(channels: int) -> Any:
    from matplotlib import colormaps

    return colormaps["tab20" if channels <= 20 else "viridis"]


def _colour(cmap: Any, channel: int, channels: int) -> Any:
    if channels <= 20:
        return cmap((channel - 1) % 20)
    return cmap((channel - 1) / max(1, channels - 1))


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
