"""The ``topoopt`` collective: all-reduce over the topology TopoOpt builds for a data-parallel job.

For a data-parallel job the co-optimiser's traffic is one all-reduce group of all N nodes, so
its topology is TotientPerms rings only: `ring_jumps` (the authors' ring allocation gives
one group of N every interface, i.e. `select_permutations(N, degree)`; the offline
co-optimiser's `oddl.offline.topoopt.topology.dp_ring_jumps` is the same set). The buffer is split
into one part per ring and each part is ring all-reduced (reduce-scatter, then all-gather)
on its ring, all rings at once — exactly `totientperms_allreduce`'s plan, under this name.

On the ODDL testbed a node has one tunable transmitter, so the job gets degree 2: one ring,
i → i+1. Its circuits are the same in every step of every collective, so the controller
configures them once at admission (transceivers and WSS, `JobManager.admit`) and the job
keeps them: after the first slot no transmitter retunes.

Registered with the scheduling core on import (`make_plan("topoopt", n, elems, degree=2)`).
Only the scheduling core is imported at module level, so ``controller/scheduling/__init__.py``
can import this module at its end without an import cycle.
"""

from __future__ import annotations

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Plan
from oddl.controller.scheduling.registry import check_sizes, register_collective

NAME = "topoopt"


@register_collective(NAME)
def topoopt_allreduce(n_ranks: int, n_elems: int, *, degree: int = 2,
                      both_directions: bool = False) -> Plan:
    """All-reduce over the rings TopoOpt builds for a data-parallel job of `degree`.

    One ring per pick p of the authors' TotientPerms (a degree-2 job: the ring i → i+1);
    with `both_directions` the reverse rings n−p carry parts too (a node then sends on
    `degree` links at once).
    """
    n, n_elems = check_sizes(NAME, n_ranks, n_elems)
    if not isinstance(both_directions, bool):
        raise PlanError(f"both_directions must be True or False; got {both_directions!r}")
    if n == 1:
        return Plan(NAME, 1, n_elems, ())
    # imported here: the scheduling package imports this module when it loads
    from oddl.controller.scheduling.totient import ring_jumps, totientperms_allreduce

    try:
        ring_jumps(n, degree, both_directions)
    except PlanError as exc:
        raise PlanError(f"topoopt: {exc}") from None
    # the rings are TotientPerms' picks (and reverses): the same plan, under this name
    plan = totientperms_allreduce(n, n_elems, degree=degree, both_directions=both_directions)
    return Plan(NAME, n, n_elems, plan.steps)
