"""Forwarding through hosts: a plan rewritten so that every transfer follows the links it has.

On a circuit-switched testbed a job's light paths are fixed at admission (TopoOpt's rings), so
a collective whose plan sends between hosts no path joins (an all-to-all, model-parallel
traffic) must be relayed: the segment goes hop by hop along a shortest route over the job's
links, and each host on the way keeps it in a scratch area of its work buffer until it sends
it on. On a circulant topology (TopoOpt's: i → i+p for the ring jumps p) the shortest routes
have as many hops as TopoOpt's coin-change routing gives (`oddl.offline.topoopt.routing.
coin_change`; the tests compare the two).

`forwarded(plan, links)` turns each step into sub-steps: every transfer whose pair is a link
stays in the step's last sub-step; a transfer over h hops becomes h transfers, the first h−1
copies into scratch on the relays (COPY sub-steps), the last one into the receiver with the
step's own op and landing. A route of h hops takes the last h sub-steps, so every transfer
arrives in the step's last sub-step as it did before. Scratch lies past the plan's elements
(``n_elems`` grows by the largest step's need); the agent runs such a plan on a work buffer
that long and hands back the caller's elements (`oddl.agents.collective.runner`).

Pure: the plan and the links in, a plan out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step

Links = Collection[tuple[int, int]]
"""Directed (sender rank, receiver rank) pairs that have a light path."""


def routes(n: int, links: Links) -> dict[tuple[int, int], list[int]]:
    """A shortest route (the ranks from source to destination) for every pair of ranks that
    the links connect, by BFS from each source (the lowest-numbered next hop on a tie)."""
    out_of: dict[int, list[int]] = {r: [] for r in range(n)}
    for s, d in sorted(set(links)):
        out_of[s].append(d)
    found: dict[tuple[int, int], list[int]] = {}
    for src in range(n):
        prev = {src: src}
        queue = deque([src])
        while queue:
            x = queue.popleft()
            for y in out_of[x]:
                if y not in prev:
                    prev[y] = x
                    queue.append(y)
        for dst in prev:
            if dst == src:
                continue
            path = [dst]
            while path[-1] != src:
                path.append(prev[path[-1]])
            found[(src, dst)] = path[::-1]
    return found


def needs_forwarding(plan: Plan, links: Links) -> bool:
    """True when some transfer's pair has no link of its own."""
    have = set(links)
    return any((s, d) not in have for step in plan.steps
               for s, d in zip(step.src.tolist(), step.dst.tolist(), strict=True))


def forwarded(plan: Plan, links: Links) -> Plan:
    """The plan with every transfer routed over `links` (see the module docstring);
    PlanError naming a pair no route joins."""
    if not needs_forwarding(plan, links):
        return plan
    paths = routes(plan.n_ranks, links)
    steps: list[Step] = []
    scratch_need = 0
    for i, step in enumerate(plan.steps):
        sub, need = _route_step(step, paths, plan.n_elems, f"{plan.collective} step {i}")
        steps += sub
        scratch_need = max(scratch_need, need)
    return Plan(plan.collective, plan.n_ranks, plan.n_elems + scratch_need, tuple(steps))


def _route_step(step: Step, paths: Mapping[tuple[int, int], list[int]], base: int,
                where: str) -> tuple[list[Step], int]:
    """One step as its sub-steps, and the scratch elements they use past `base`."""
    transfers = []
    for t, (s, d) in enumerate(zip(step.src.tolist(), step.dst.tolist(), strict=True)):
        path = paths.get((s, d))
        if path is None:
            raise PlanError(f"{where}: no route from rank {s} to rank {d} over the job's links; "
                            "give the job a topology that connects every pair of its ranks")
        transfers.append((t, path))
    hops = max(len(path) - 1 for _t, path in transfers)
    # sub-step j (0 .. hops-1) carries hop (j - (hops - h)) of a route of h hops
    rows: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(hops)]
    scratch = base
    landing = step.landing
    for t, path in transfers:
        h, length = len(path) - 1, int(step.length[t])
        read_at = int(step.offset[t])
        for k in range(h):
            last = k == h - 1
            land_at = int(landing[t]) if last else scratch
            if not last:
                scratch += length
            rows[hops - h + k].append((path[k], path[k + 1], read_at, length, land_at))
            read_at = land_at
    out = []
    for j, row in enumerate(rows):
        last = j == hops - 1
        src, dst, off, ln, land = (np.array(col, dtype=np.int64) for col in zip(*row,
                                                                                   strict=True))
        recv = None if last and step.recv_offset is None and np.array_equal(land, off) else land
        out.append(Step(_ro(src), _ro(dst), _ro(off), _ro(ln), step.op if last else Op.COPY,
                        step.phase if last else f"{step.phase or 'step'} relay",
                        None if recv is None else _ro(recv)))
    return out, scratch - base


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
