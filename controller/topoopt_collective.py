"""The ``topoopt`` collective: all-reduce over the topology TopoOpt builds for a data-parallel job.

For a data-parallel job the co-optimiser's traffic is one all-reduce group of all N nodes, so
its topology is TotientPerms rings only: `dp_ring_jumps` (the co-optimiser's own ring
allocation, i.e. `select_permutations(N, degree)`). The buffer is split into one part per
ring and each part is ring all-reduced (reduce-scatter, then all-gather) on its ring, all
rings at once.

On the ODDL testbed a node has one tunable transmitter, so the job gets degree 2: one ring,
i → i+1. Its circuits are the same in every step of every collective, so the controller
configures them once at admission (transceivers and WSS, `JobManager.admit`) and the job
keeps them: after the first slot no transmitter retunes.

Registered with the scheduling core on import (`make_plan("topoopt", n, elems, degree=2)`).
Only the scheduling core is imported at module level, so ``controller/scheduling/__init__.py``
can import this module at its end without an import cycle.
"""

from __future__ import annotations

import numpy as np

from oddl.controller.scheduling.collectives import (
    Op,
    Plan,
    Step,
    _check_sizes,
    read_only,
    register_collective,
)
from oddl.errors import OddlError, PlanError

NAME = "topoopt"


def rings_allreduce(name: str, n: int, n_elems: int, jumps: tuple[int, ...]) -> Plan:
    """All-reduce with one ring per jump p (ring i → i+p, visiting every rank since
    gcd(p, n) = 1), each on its own contiguous part of the buffer; 2(n−1) merged steps."""
    if n == 1 or n_elems == 0 or not jumps:
        return Plan(name, n, n_elems, ())
    rings = len(jumps)
    bounds = (np.arange(rings + 1, dtype=np.int64) * n_elems) // rings
    steps: list[Step] = []
    # chunk c of ring r: [lo_r + c·len_r/n, …); rank at position q of ring r is q·p_r mod n
    chunk = bounds[:-1, None] + (np.arange(n + 1, dtype=np.int64)[None, :]
                                 * np.diff(bounds)[:, None]) // n  # (rings, n+1)
    pos = np.arange(n, dtype=np.int64)
    p = np.asarray(jumps, dtype=np.int64)[:, None]
    src = read_only(((pos[None, :] * p) % n).ravel())
    dst = read_only((((pos[None, :] + 1) * p) % n).ravel())
    for phase, op, shift in (("reduce-scatter", Op.REDUCE, 0), ("all-gather", Op.COPY, 1)):
        for k in range(n - 1):
            c = (pos - k + shift) % n  # the chunk the rank at position q sends
            off = chunk[:, c].ravel()
            ln = (chunk[:, c + 1] - chunk[:, c]).ravel()
            keep = ln > 0
            if keep.all():
                steps.append(Step(src, dst, read_only(off), read_only(ln), op, phase))
            elif keep.any():
                steps.append(Step(read_only(src[keep]), read_only(dst[keep]),
                                  read_only(off[keep]), read_only(ln[keep]), op, phase))
    return Plan(name, n, n_elems, tuple(steps))


@register_collective(NAME)
def topoopt_allreduce(n_ranks: int, n_elems: int, *, degree: int = 2,
                      both_directions: bool = False) -> Plan:
    """All-reduce over the rings TopoOpt builds for a data-parallel job of `degree`.

    One ring per pick p ≤ n−p (a degree-2 job: the ring i → i+1); with `both_directions`
    the reverse rings n−p carry parts too (a node then sends on `degree` links at once).
    """
    n, n_elems = _check_sizes(NAME, n_ranks, n_elems)
    if not isinstance(both_directions, bool):
        raise PlanError(f"both_directions must be True or False; got {both_directions!r}")
    if n == 1:
        return Plan(NAME, 1, n_elems, ())
    # imported here: the scheduling package imports this module when it loads
    from oddl.controller.topoopt_topology import dp_ring_jumps

    try:
        jumps = dp_ring_jumps(n, degree, both_directions)
    except OddlError as exc:
        raise PlanError(f"topoopt: {exc}") from None
    return rings_allreduce(NAME, n, n_elems, jumps)
