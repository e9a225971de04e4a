"""The simulator at small scale: predict one all-reduce on a testbed from its testbed file.

The ground truth for the simulator is the emulated four-node testbed. For a testbed file this
module builds the SAME schedule the controller builds (`topology_from_config`,
`timing_from_config` and `schedule_plan`, as in `oddl.controller.schedules`), in steady state
(the transmitters start on the channels the previous collective left them on), and predicts
the time a training process waits in ``AgentClient.allreduce``:

- optical network: ``fixed + copies + launch_margin + schedule``, where `schedule` runs from
  the first slot's start to the end of the last slot's data window (the last slot margin is
  not waited for) and `launch_margin` is the testbed file's ``[timing] launch_margin_ms``
  (the controller starts the collective that long after the barrier completes);
- ideal network (ungated, no barrier): ``fixed + copies + Σ steps busiest port's bytes at the
  line rate``.

`fixed` is everything that does not scale with the message: the local API round trip, the
barrier (ReadyCollective and the go event on the schedule stream) and, per step, the frame's
trip through the agents and the fabric. `copies` moves the array to the agent and back over
the local API. A-priori values come from docs/sources.md §7's measurements; `calibrate` instead
measures `fixed` with a tiny all-reduce of the same collective, so that what is compared with
the measurement is the part the simulator models: the slot schedule at the line rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oddl.common.config import TestbedConfig
from oddl.common.errors import OddlError
from oddl.controller.scheduling import Plan, schedule_plan
from oddl.controller.scheduling.native import native_plan

NETWORKS = ("optical", "ideal")


@dataclass(frozen=True)
class TestbedOverheads:
    """Costs outside the slot schedule (seconds; rates in Gbit/s)."""

    __test__ = False  # not a pytest test class

    barrier_s: float = 1.1e-3
    """ReadyCollective round trip (gRPC unary p50 0.54 ms) + the go event on the stream, on
    four nodes; at 1024 the barrier of a bucket's first call measured 0.75–1.1 s (decision
    record 0034), standing starts after it skip it."""
    api_round_trip_s: float = 0.12e-3
    """Local API request and reply (pyzmq round trip p50 121 µs)."""
    step_s: float = 0.12e-3
    """Software per ungated step (frame through agent, fabric, agent); ideal network only."""
    copy_gbps: float = 17.0
    """Local API payload copies, to the agent and back (pyzmq 1 MB copying: 17 Gbit/s)."""
    fixed_s: float | None = None
    """If set, replaces barrier + round trip + steps (e.g. measured with `calibrate`)."""


@dataclass(frozen=True)
class TestbedPrediction:
    """A predicted all-reduce time on a testbed and its parts (seconds)."""

    __test__ = False

    collective: str
    network: str
    n_ranks: int
    n_elems: int
    itemsize: int
    line_rate_gbps: float
    fixed_s: float
    copy_s: float
    launch_s: float
    schedule_s: float
    steps: int
    slots: int
    retunes: int

    @property
    def total_s(self) -> float:
        """The predicted time a training process waits for the result."""
        return self.fixed_s + self.copy_s + self.launch_s + self.schedule_s

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly copy (milliseconds)."""
        return {
            "collective": self.collective, "network": self.network, "nodes": self.n_ranks,
            "elements": self.n_elems, "bytes": self.n_elems * self.itemsize,
            "line_rate_gbps": self.line_rate_gbps, "fixed_ms": self.fixed_s * 1e3,
            "copy_ms": self.copy_s * 1e3, "launch_ms": self.launch_s * 1e3,
            "schedule_ms": self.schedule_s * 1e3, "total_ms": self.total_s * 1e3,
            "steps": self.steps, "slots": self.slots, "retunes": self.retunes,
        }


def predict_testbed_allreduce(
    cfg: TestbedConfig,
    n_elems: int,
    *,
    collective: str = "ring",
    network: str = "optical",
    itemsize: int = 4,
    overheads: TestbedOverheads | None = None,
    kind: str = "all_reduce",
    **params: object,
) -> TestbedPrediction:
    """Predict one collective `kind` (an all-reduce by default) of `n_elems` elements (its
    work buffer) over all nodes of the testbed `cfg`."""
    from oddl.controller.testbed_model import timing_from_config, topology_from_config

    if network not in NETWORKS:
        raise OddlError(f"unknown network {network!r}; use one of {', '.join(NETWORKS)}")
    o = overheads or TestbedOverheads()
    nodes = tuple(n.id for n in cfg.nodes)
    plan = native_plan(collective, kind, len(nodes), n_elems, 0, **params)
    timing = timing_from_config(cfg)
    copy_s = 2 * 8.0 * n_elems * itemsize / (o.copy_gbps * 1e9)
    steps = sum(1 for s in plan.steps if len(s))
    if network == "optical":
        topo = topology_from_config(cfg)
        first = schedule_plan(plan, nodes, topo, timing, itemsize)
        sched = schedule_plan(plan, nodes, topo, timing, itemsize,
                              initial_channels=first.final_channels)
        last = sched.slots[-1] if sched.slots else None
        schedule_s = (last.data_start_s + last.hold_s - sched.start_s) if last else 0.0
        fixed = o.fixed_s if o.fixed_s is not None else o.barrier_s + o.api_round_trip_s
        return TestbedPrediction(collective, network, plan.n_ranks, n_elems, itemsize,
                                 timing.line_rate_bps / 1e9, fixed, copy_s,
                                 cfg.timing.launch_margin_ms / 1e3, schedule_s, steps,
                                 len(sched.slots), sched.reconfigurations)
    schedule_s = _ideal_s(plan, itemsize, timing.line_rate_bps)
    fixed = o.fixed_s if o.fixed_s is not None else o.api_round_trip_s + steps * o.step_s
    return TestbedPrediction(collective, network, plan.n_ranks, n_elems, itemsize,
                             timing.line_rate_bps / 1e9, fixed, copy_s, 0.0, schedule_s, steps,
                             steps, 0)


def calibrate(measured_tiny_s: float, tiny: TestbedPrediction) -> TestbedOverheads:
    """Overheads whose `fixed_s` makes the tiny all-reduce's prediction equal its measurement:
    ``fixed = measured − (copies + launch + schedule)`` of the tiny message (floored at 0)."""
    rest = tiny.copy_s + tiny.launch_s + tiny.schedule_s
    return TestbedOverheads(fixed_s=max(0.0, measured_tiny_s - rest))


def _ideal_s(plan: Plan, itemsize: int, rate_bps: float) -> float:
    """Σ over steps of the busiest port's bytes at the line rate (non-blocking switch)."""
    total = 0.0
    for step in plan.steps:
        if len(step):
            out = np.bincount(step.src, weights=step.length, minlength=plan.n_ranks).max()
            inn = np.bincount(step.dst, weights=step.length, minlength=plan.n_ranks).max()
            total += float(max(out, inn)) * 8.0 * itemsize / rate_bps
    return total
