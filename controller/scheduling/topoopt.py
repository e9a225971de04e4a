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

import math

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Plan
from oddl.controller.scheduling.registry import check_sizes, register_collective

NAME = "topoopt"


@register_collective(NAME)
def topoopt_allreduce(n_ranks: int, n_elems: int, *, degree: int = 2,
                      both_directions: bool = False, jumps: object = None,
                      links: object = None) -> Plan:
    """All-reduce over the rings TopoOpt builds for a data-parallel job of `degree`.

    One ring per pick p of the authors' TotientPerms (a degree-2 job: the ring i → i+1);
    with `both_directions` the reverse rings n−p carry parts too (a node then sends on
    `degree` links at once). With `jumps` ("1,5,7,11": a topology `oddl topoopt` chose) the
    rings are exactly those jumps; `links` (its matchings, "0-6,1-7") only add light paths
    for other traffic (`topology_links`) and change nothing here.
    """
    n, n_elems = check_sizes(NAME, n_ranks, n_elems)
    if not isinstance(both_directions, bool):
        raise PlanError(f"both_directions must be True or False; got {both_directions!r}")
    matching_pairs(n, links)  # checked here, used by admission
    if n == 1:
        return Plan(NAME, 1, n_elems, ())
    # imported here: the scheduling package imports this module when it loads
    from oddl.controller.scheduling.totient import ring_jumps, rings_allreduce

    if jumps is not None:
        return rings_allreduce(n, n_elems, ring_jumps_of(n, jumps), NAME)
    try:
        chosen = ring_jumps(n, degree, both_directions)
    except PlanError as exc:
        raise PlanError(f"topoopt: {exc}") from None
    # the rings are TotientPerms' picks (and reverses): the totientperms plan, under this name
    return rings_allreduce(n, n_elems, chosen, NAME)


def ring_jumps_of(n: int, jumps: object) -> tuple[int, ...]:
    """Ring jumps given as "1,5,7,11" (or one whole number): each 1..n−1 and coprime to n
    (a ring visits every node), each once."""
    text = str(jumps)
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise PlanError(f"topoopt jumps {text!r}: give whole numbers, e.g. jumps=1,5,7,11"
                        ) from None
    bad = [p for p in values if not 1 <= p < n or math.gcd(p, n) != 1]
    if not values or bad or len(set(values)) != len(values):
        raise PlanError(f"topoopt jumps {text!r}: each ring jump must be in 1..{n - 1}, "
                        f"coprime to {n} and given once (bad: {bad or 'none'}); e.g. "
                        "the jumps `oddl topoopt --json` prints under topology.ring_jumps")
    return values


def matching_pairs(n: int, links: object) -> set[tuple[int, int]]:
    """The duplex links of a topology's matchings, given as "0-6,1-7" (both directions)."""
    if links is None or links == "":
        return set()
    out: set[tuple[int, int]] = set()
    for item in str(links).replace(" ", "").split(","):
        a, sep, b = item.partition("-")
        try:
            pair = (int(a), int(b))
        except ValueError:
            pair = (-1, -1)
        if not sep or not all(0 <= r < n for r in pair) or pair[0] == pair[1]:
            raise PlanError(f"topoopt links {links!r}: {item!r} is not a pair of two ranks "
                            f"0..{n - 1} as A-B; e.g. links=0-6,1-7")
        out |= {pair, pair[::-1]}
    return out
