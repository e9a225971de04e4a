"""``oddl plan optinc``: OptINC's cascade for a job, its devices and optics, bytes and time.

OptINC has no TT-FR slot schedule (its devices are not tunable-laser nodes), so `oddl plan`
hands the collective to `plan_report` instead of the scheduler.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from oddl.cli.exit_codes import EXIT_OK, EXIT_USAGE
from oddl.common.config import OPTINC
from oddl.common.errors import PlanError
from oddl.offline.optinc import model as om

PLAN_PARAMS = ("inputs", "bits", "transceivers", "latency_us")


def plan_report(args: argparse.Namespace) -> int:
    """``oddl plan optinc``: the cascade, its devices and optics, bytes and one-pass time.

    Parameters (``--param KEY=VALUE``): ``inputs`` (N1 of the level-1 devices; 0 picks),
    ``bits`` (default 8), ``transceivers`` (M, default b/2), ``latency_us`` (per level, 1).
    """
    try:
        plan, lay, bits, m = _layout(args)
        per_device = [om.OptincNetwork(n, bits, m, seed=0).hardware() for n in lay.levels]
    except (PlanError, om.OptincError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = _report(args, plan, lay, per_device)
    if args.json:
        print(json.dumps(out))
        return EXIT_OK
    _print_report(args, out, lay, bits, m)
    return EXIT_OK


def _layout(args: argparse.Namespace) -> tuple[Any, Any, int, int]:
    """(plan, layout, bits, transceivers) for the arguments; PlanError on a bad one."""
    from oddl.controller.scheduling import make_plan, optinc_layout

    params = dict(args.param)
    unknown = sorted(set(params) - set(PLAN_PARAMS))
    if unknown or args.wavelengths is not None or args.degree is not None:
        raise PlanError(f"optinc takes the parameters {', '.join(PLAN_PARAMS)} (as --param "
                        f"KEY=VALUE), not {unknown or ['--wavelengths/--degree']}")
    bits = int(params.get("bits", 8))
    m = int(params.get("transceivers") or om.default_transceivers(bits))
    if args.itemsize < 1 or not args.gbps > 0:
        raise PlanError("--itemsize must be >= 1 and --gbps positive")
    n_elems = args.bytes // args.itemsize
    plan = make_plan(OPTINC, args.nodes, n_elems, inputs=int(params.get("inputs", 0)))
    lay = optinc_layout(args.nodes, n_elems, args.itemsize, args.gbps * 1e9, bits=bits,
                        transceivers=m, inputs=int(params.get("inputs", 0)),
                        latency_s=float(params.get("latency_us", 1.0)) * 1e-6)
    return plan, lay, bits, m


def _report(args: argparse.Namespace, plan: Any, lay: Any, per_device: list[dict[str, Any]]
            ) -> dict[str, Any]:
    """The JSON-ready report: the layout, the plan's steps by role, the devices' optics."""
    two = len(lay.levels) == 2

    def role(rank: int) -> str:
        if rank < args.nodes:
            return "servers"
        if not two:
            return "device"
        return "level-2 device" if rank == plan.n_ranks - 1 else "level-1 devices"

    steps: list[dict[str, Any]] = [
        {"step": i, "phase": st.phase, "op": str(st.op), "transfers": len(st),
         "bytes_each": lay.level_bytes, "from": role(int(st.src[0])), "to": role(int(st.dst[0]))}
        for i, st in enumerate(plan.steps)]
    return {"collective": OPTINC, **lay.as_dict(), "bytes": args.bytes,
            "itemsize": args.itemsize, "line_rate_gbps": args.gbps, "plan_ranks": plan.n_ranks,
            "steps": steps,
            "device_optics": [{"inputs": n, "mzi_count": hw["mzi_count"],
                               "attenuator_count": hw["attenuator_count"],
                               "thresholders": hw["hidden"],
                               "splitter_loss_db": round(om.splitter_loss_db(n), 2)}
                              for n, hw in zip(lay.levels, per_device, strict=True)],
            "mzi_total": sum(hw["mzi_count"] * count for hw, count in
                             zip(per_device, _devices_per_level(lay.levels), strict=True))}


def _print_report(args: argparse.Namespace, out: dict[str, Any], lay: Any, bits: int, m: int
                  ) -> None:
    two = len(lay.levels) == 2
    n_elems = args.bytes // args.itemsize
    shape = (f"one {lay.levels[0]}-input device" if len(lay.levels) == 1 else
             f"two levels: {lay.levels[1]} devices of {lay.levels[0]} inputs, then one of "
             f"{lay.levels[1]} inputs")
    print(f"optinc all-reduce on {args.nodes} nodes: {shape} ({lay.devices} device"
          f"{'s' if lay.devices != 1 else ''}), {bits}-bit levels on {m} transceivers per server")
    print(f"  buffer {args.bytes / 1e6:.2f} MB ({n_elems:,} x {args.itemsize} B); each server "
          f"sends {lay.level_bytes / 1e6:.2f} MB of levels once and receives the result once")
    print(f"  one pass {lay.one_pass_s * 1e3:.3f} ms at {args.gbps:g} Gbit/s per transceiver "
          f"(ring all-reduce of the floats: {lay.ring_s * 1e3:.3f} ms)")
    for level, (n, d) in enumerate(zip(lay.levels, out["device_optics"], strict=True)):
        where = f"level-{level + 1} " if two else ""
        print(f"  {where}{n}-input device: {d['mzi_count']} MZIs + {d['attenuator_count']} "
              f"attenuators, {d['thresholders']} thresholders, splitter T "
              f"{d['splitter_loss_db']:.2f} dB")
    print(f"  MZIs in all devices: {out['mzi_total']:,}")
    print(f"{'step':<6}{'phase':<14}{'op':<8}{'transfers':>10}  from -> to")
    for st in out["steps"]:
        print(f"{st['step']:<6}{st['phase']:<14}{st['op'].upper():<8}{st['transfers']:>10}  "
              f"{st['from']} -> {st['to']}")


def _devices_per_level(levels: tuple[int, ...]) -> list[int]:
    return [1] if len(levels) == 1 else [levels[1], 1]
