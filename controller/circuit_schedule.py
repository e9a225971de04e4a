"""A collective on standing light paths: the plan's steps, no slots.

A circuit job's light paths are set once, at admission (`oddl.controller.circuits`), and do
not change while it runs, so its collectives need no slots, no retunes and no hand-offs:
every send goes as soon as its data is ready, on the host port whose light reaches the
receiver, and the data paces the run. Its schedule is the plan alone; the makespan it reports
is the wire time of each step's busiest port at the line rate, summed over the steps.

A call whose plan needs a pair of hosts the job's light paths do not join (an all-to-all on
TopoOpt's rings, model-parallel traffic) is forwarded: the hosts on a shortest route relay
the segment hop by hop (`oddl.controller.scheduling.forwarding`), keeping it in scratch past
the caller's elements. Only a pair no route joins is refused, before any byte moves.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from oddl.common.errors import OperationRefused, PlanError
from oddl.controller.scheduling import Plan, Topology
from oddl.controller.scheduling.forwarding import forwarded


@dataclass(frozen=True)
class CircuitSchedule:
    """A plan on standing light paths (see the module docstring); encodes like a schedule."""

    plan: Plan
    topology: Topology
    itemsize: int
    makespan_s: float
    slots: tuple[()] = ()
    start_s: float = 0.0
    reconfigurations: int = 0
    guard_total_s: float = 0.0
    efficiency: float = 1.0


def circuit_schedule(plan: Plan, nodes: Sequence[str], topology: Topology, itemsize: int,
                     line_rate_bps: float, paths: Collection[tuple[str, str]] | None
                     ) -> CircuitSchedule:
    """The plan on the job's light paths `paths` (None: any pair, the ideal network);
    OperationRefused when the plan sends between hosts no path joins."""
    if paths is not None:
        index = {node: i for i, node in enumerate(nodes)}
        links = {(index[a], index[b]) for a, b in paths}
        try:
            plan = forwarded(plan, links)
        except PlanError as exc:
            raise OperationRefused(f"{plan.collective} cannot run on this job's light paths: "
                                   f"{exc}") from None
    makespan = 0.0
    for step in plan.steps:
        per_pair: Counter[tuple[int, int]] = Counter()
        for s, d, n in zip(step.src.tolist(), step.dst.tolist(), step.length.tolist(),
                           strict=True):
            per_pair[(s, d)] += n * itemsize
        if per_pair and line_rate_bps > 0:
            makespan += 8.0 * max(per_pair.values()) / line_rate_bps
    return CircuitSchedule(plan, topology, itemsize, makespan)
