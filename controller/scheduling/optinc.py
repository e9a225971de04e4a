"""The ``optinc`` collective: in-network averaging on OptINC devices, one level or two.

OptINC (docs/sources.md §4; ``docs/explanation/optinc.md``) has no rank-to-rank transfers: every server sends its
quantised gradient once to an OptINC device, whose optics output the quantised mean, and a
passive splitter (T) returns it to all of the device's servers. One device serves N servers;
two levels serve N1·N2 (the paper's cascade for N² servers): N2 level-1 devices of N1 inputs
each, whose results are detected and re-sent to one level-2 device of N2 inputs; its result
goes back down through the level-1 devices' splitters.

As a `Plan` the devices are extra ranks after the servers (ranks ``0…n−1`` are servers,
``n…n+g−1`` the level-1 devices, ``n+g`` the level-2 device) that start from zero buffers:

- ``upload``: every server REDUCEs its buffer into its device;
- ``cascade up``: every level-1 device REDUCEs into the level-2 device (two levels only);
- ``cascade down``: the level-2 device COPYs the total to every level-1 device;
- ``broadcast``: every device COPYs to its servers (T, one passive split).

The reference executor then leaves the sum on every rank, like every registered all-reduce
(the optics send the quantised mean; agents return N × that). The TT-FR slot scheduler does not
lay this plan out (a device is not a node with one tunable transmitter): the controller uses
`oddl.controller.jobs.optinc_schedule` and ``oddl plan optinc`` reports `optinc_layout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from oddl.common.config import OPTINC, OPTINC_MAX_INPUTS
from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step, read_only
from oddl.controller.scheduling.registry import check_sizes, register_collective

MAX_INPUTS = OPTINC_MAX_INPUTS
"""Largest OptINC device (`oddl.common.config.OPTINC_MAX_INPUTS`, as `oddl.offline.optinc.levels`)."""


def optinc_cascade(nodes: int, inputs: int = 0) -> tuple[int, ...]:
    """Device sizes, servers' side first: ``(N,)`` for one device or ``(N1, N2)`` for two levels.

    ``inputs`` = 0 picks one device up to `MAX_INPUTS` nodes, else the most even split
    N1 × N2 = nodes with N1 ≥ N2 (N1 = N2 = N for N² servers). A given ``inputs`` is N1.
    """
    if nodes < 2:
        raise PlanError(f"optinc needs at least 2 nodes; got {nodes}")
    if inputs:
        if not 2 <= inputs <= MAX_INPUTS:
            raise PlanError(f"optinc inputs must be 0 (pick) or 2..{MAX_INPUTS}; got {inputs}")
        if nodes == inputs:
            return (inputs,)
        if nodes % inputs == 0 and 2 <= nodes // inputs <= MAX_INPUTS:
            return (inputs, nodes // inputs)
        raise PlanError(f"optinc with {inputs}-input devices serves {inputs} nodes, or "
                        f"{inputs}·N2 nodes (N2 ≤ {MAX_INPUTS}) in two levels; {nodes} is "
                        f"neither (pass inputs=0 to pick the split)")
    if nodes <= MAX_INPUTS:
        return (nodes,)
    for n2 in range(math.isqrt(nodes), 1, -1):
        if nodes % n2 == 0 and nodes // n2 <= MAX_INPUTS:
            return (nodes // n2, n2)
    raise PlanError(f"optinc: {nodes} nodes do not split into two levels of devices with at most "
                    f"{MAX_INPUTS} inputs (N1 × N2 = nodes); e.g. 1024 = 32 × 32, 4096 = 64 × 64")


def _step(src: list[int], dst: list[int], n_elems: int, op: Op, phase: str) -> Step:
    k = len(src)
    return Step(read_only(np.asarray(src, dtype=np.int64)),
                read_only(np.asarray(dst, dtype=np.int64)),
                read_only(np.zeros(k, dtype=np.int64)),
                read_only(np.full(k, n_elems, dtype=np.int64)), op, phase)


@register_collective(OPTINC)
def optinc_allreduce(n_ranks: int, n_elems: int, inputs: int = 0) -> Plan:
    """The optinc plan for ``n_ranks`` servers; its Plan has the devices as extra ranks."""
    n, e = check_sizes(OPTINC, n_ranks, n_elems)
    levels = optinc_cascade(n, int(inputs))
    steps: list[Step] = []
    if e == 0:
        return Plan(OPTINC, n + optinc_device_count(levels), e, ())
    servers = list(range(n))
    if len(levels) == 1:
        dev = [n] * n
        steps.append(_step(servers, dev, e, Op.REDUCE, "upload"))
        steps.append(_step(dev, servers, e, Op.COPY, "broadcast"))
        return Plan(OPTINC, n + 1, e, tuple(steps))
    n1, g = levels
    group_dev = [n + i // n1 for i in servers]
    top = n + g
    l1 = list(range(n, n + g))
    steps.append(_step(servers, group_dev, e, Op.REDUCE, "upload"))
    steps.append(_step(l1, [top] * g, e, Op.REDUCE, "cascade up"))
    steps.append(_step([top] * g, l1, e, Op.COPY, "cascade down"))
    steps.append(_step(group_dev, servers, e, Op.COPY, "broadcast"))
    return Plan(OPTINC, n + g + 1, e, tuple(steps))


def optinc_device_count(levels: tuple[int, ...]) -> int:
    """Devices of a cascade: 1, or N2 level-1 devices + 1 level-2 device."""
    return 1 if len(levels) == 1 else levels[1] + 1


@dataclass(frozen=True)
class OptincLayout:
    """What ``oddl plan optinc`` reports: devices, their sizes, bytes and one-pass time."""

    nodes: int
    levels: tuple[int, ...]
    devices: int
    bits: int
    transceivers: int
    elements: int
    level_bytes: int
    """Bytes each server sends once: b bits per element."""
    one_pass_s: float
    """Upload time on M transceivers at the line rate each (cut-through: the result streams
    back while the upload streams in), plus the device latency per level."""
    ring_s: float
    """Ring all-reduce of the float buffer at the same line rate (one transceiver), for scale."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"nodes": self.nodes, "levels": list(self.levels), "devices": self.devices,
                "bits": self.bits, "transceivers": self.transceivers,
                "elements": self.elements, "level_bytes": self.level_bytes,
                "one_pass_s": self.one_pass_s, "ring_s": self.ring_s}


def optinc_layout(nodes: int, n_elems: int, itemsize: int, line_rate_bps: float, *,
                  bits: int = 8, transceivers: int = 4, inputs: int = 0,
                  latency_s: float = 1e-6) -> OptincLayout:
    """Lay out one optinc all-reduce: cascade, bytes on the wire, one-pass time."""
    if bits < 1 or transceivers < 1 or bits % transceivers:
        raise PlanError(f"optinc bits must be a multiple of transceivers; got bits={bits}, "
                        f"transceivers={transceivers}")
    if not line_rate_bps > 0:
        raise PlanError(f"line rate must be positive; got {line_rate_bps}")
    levels = optinc_cascade(nodes, inputs)
    wire = n_elems * (bits // transceivers) / line_rate_bps
    ring = 2 * (nodes - 1) / nodes * n_elems * itemsize * 8 / line_rate_bps
    return OptincLayout(nodes, levels, optinc_device_count(levels), bits, transceivers, n_elems,
                        math.ceil(n_elems * bits / 8), wire + len(levels) * latency_s, ring)
