"""The plan behind `oddl plan`: build a collective's plan and schedule from the command line's
arguments (`build`) and describe both as one JSON-ready dict (`describe`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from oddl.common.config import OPTINC
from oddl.common.errors import PlanError

DETAIL_NODES = 16
"""Up to this many nodes, every slot's circuits are listed."""


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
    from oddl.controller.scheduling import TimingModel, Topology, schedule_plan
    from oddl.controller.scheduling.native import native_plan

    if collective == OPTINC:
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
    kind, root = getattr(args, "kind", "all_reduce"), getattr(args, "root", 0)
    plan = native_plan(collective, kind, args.nodes, n_elems, root, **params)
    if kind != "all_reduce":  # the job's algorithm gives its halves, or the ring's
        collective = f"{collective} {kind}" + (f" from rank {root}" if root else "")
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
        "params": {k: v for k, v in built.params.items() if jsonable(v)},
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
    if built.collective == "wrht":
        return _wrht_details(built.plan, built.params)
    if built.collective == "totientperms" and built.plan.n_ranks >= 2:
        return _totient_details(built.plan, built.params)
    return {}


def _wrht_details(plan: Any, params: dict[str, Any]) -> dict[str, Any]:
    """WRHT's wavelength plan: per step the groups, wavelengths, longest path and its budget."""
    from oddl.controller.scheduling.wrht import wrht_wavelength_plan

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


def _totient_details(plan: Any, params: dict[str, Any]) -> dict[str, Any]:
    """TotientPerms' jump set, the rings that carry parts, and the circulant's diameter."""
    from oddl.controller.scheduling.totient import (
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


def jsonable(v: Any) -> bool:
    """Whether a parameter value goes into JSON as it is."""
    return isinstance(v, bool | int | float | str) or v is None
