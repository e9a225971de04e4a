"""Plan steps as matchings: check a step's flows, merge them per (src, dst) and split a
step that is not a matching into Δ rounds by bipartite edge colouring (König).

Pure; used by the slot scheduler (`oddl.controller.scheduling.scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oddl.common.errors import ScheduleError
from oddl.controller.scheduling.job_nodes import JobNodes
from oddl.controller.scheduling.plan import Step, read_only


def bipartite_edge_colouring(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Colour the edges (left[i], right[i]) of a bipartite graph with Δ colours.

    No two edges sharing a left or a right vertex get the same colour, and colours are
    0..Δ−1 with Δ the maximum degree (König's theorem). Alternating-path algorithm: give each
    edge a colour free at both ends, swapping an a/b path first when none is (O(E·V)).
    """
    ls, rs = np.asarray(left).tolist(), np.asarray(right).tolist()
    if len(ls) != len(rs):
        raise ScheduleError(f"edge lists differ in length: {len(ls)} and {len(rs)}")
    colour = [-1] * len(ls)
    at_left: dict[int, dict[int, int]] = {}  # vertex -> colour -> edge
    at_right: dict[int, dict[int, int]] = {}
    for e, (u, v) in enumerate(zip(ls, rs, strict=True)):
        lu = at_left.setdefault(u, {})
        rv = at_right.setdefault(v, {})
        a = _first_free(lu)
        if a not in rv:
            c = a
        else:
            b = _first_free(rv)
            if b not in lu:
                c = b
            else:
                # Flip the path from v alternating a, b, a, ...; it cannot reach u (a is free
                # at u and the graph is bipartite), and afterwards a is free at v.
                path = []
                x, on_right, col = v, True, a
                while (f := (at_right if on_right else at_left)[x].get(col)) is not None:
                    path.append(f)
                    x = ls[f] if on_right else rs[f]
                    on_right, col = not on_right, (b if col == a else a)
                for f in path:
                    del at_left[ls[f]][colour[f]], at_right[rs[f]][colour[f]]
                for f in path:
                    colour[f] = b if colour[f] == a else a
                    at_left[ls[f]][colour[f]] = at_right[rs[f]][colour[f]] = f
                c = a
        colour[e] = c
        lu[c] = rv[c] = e
    return np.array(colour, dtype=np.int64)


def step_is_matching(src: np.ndarray, dst: np.ndarray, job: JobNodes, step_index: int) -> bool:
    """Check a step's flows can run on the fabric; return whether they form a matching."""
    n = len(job.node_ids)
    if src.min() < 0 or dst.min() < 0 or max(src.max(), dst.max()) >= n:
        raise ScheduleError(f"plan step {step_index} names ranks outside 0..{n - 1}")
    same = np.flatnonzero(src == dst)
    if len(same):
        raise ScheduleError(
            f"plan step {step_index}: rank {src[same[0]]} sends to itself; drop the transfer"
        )
    if len(job.wss_ids) > 1:
        apart = np.flatnonzero(job.wss_index[src] != job.wss_index[dst])
        if len(apart):
            i = apart[0]
            raise ScheduleError(
                f"plan step {step_index}: {job.node_ids[src[i]]!r} -> "
                f"{job.node_ids[dst[i]]!r} crosses from WSS {job.specs[src[i]].wss!r} to "
                f"{job.specs[dst[i]].wss!r}; a single-stage fabric needs both on one WSS"
            )
    return at_most_once(src, n) and at_most_once(dst, n)


@dataclass(frozen=True, eq=False)
class StepSplit:
    """How a non-matching step's transfers merge per (src, dst) and split into matchings.

    Computed once per distinct (src, dst) arrays and reused for every step sharing them (a
    plan's steps share their rank arrays), so only the per-step lengths are summed again.
    """

    order: np.ndarray
    first: np.ndarray
    rounds_idx: tuple[np.ndarray, ...]
    rounds_src: tuple[np.ndarray, ...]
    rounds_dst: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, step: Step, job: JobNodes) -> StepSplit:
        """Merge `step`'s transfers per (src, dst) and colour them into matchings."""
        n = len(job.node_ids)
        pair = step.src * n + step.dst
        order = np.argsort(pair, kind="stable")
        sorted_pair = pair[order]
        first = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
        src = step.src[order][first]
        dst = step.dst[order][first]
        colour = _colour(src, dst, n)
        idx = tuple(np.flatnonzero(colour == c) for c in range(int(colour.max(initial=-1)) + 1))
        idx = tuple(i for i in idx if len(i))
        return cls(order, first, idx, tuple(read_only(src[i]) for i in idx),
                   tuple(read_only(dst[i]) for i in idx))

    def rounds(self, step: Step) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The step's matchings: (src, dst, elements) per round."""
        elems = np.add.reduceat(step.length[self.order], self.first)
        return [(s, d, read_only(elems[i]))
                for s, d, i in zip(self.rounds_src, self.rounds_dst, self.rounds_idx, strict=True)]


def _colour(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Δ-colouring of the merged flows; vectorised when one side has degree one (a star)."""
    if at_most_once(src, n) and at_most_once(dst, n):
        return np.zeros(len(src), dtype=np.int64)
    for one, many in ((src, dst), (dst, src)):
        if at_most_once(one, n):
            # only `many` repeats: colour = the edge's rank among the edges at its vertex
            order = np.argsort(many, kind="stable")
            sorted_many = many[order]
            starts = np.flatnonzero(np.r_[True, sorted_many[1:] != sorted_many[:-1]])
            rank = np.arange(len(many)) - np.repeat(starts, np.diff(np.r_[starts, len(many)]))
            colour = np.empty(len(many), dtype=np.int64)
            colour[order] = rank
            return colour
    return bipartite_edge_colouring(src, dst)


def at_most_once(ranks: np.ndarray, n: int) -> bool:
    """Whether no rank of 0..n−1 appears twice in `ranks`."""
    return not len(ranks) or int(np.bincount(ranks, minlength=n).max()) <= 1


def first_duplicate(keys: np.ndarray) -> tuple[int, int] | None:
    """Return two indices with equal keys, or None."""
    if len(keys) < 2:
        return None
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    hit = np.flatnonzero(k[1:] == k[:-1])
    if not len(hit):
        return None
    return int(order[hit[0]]), int(order[hit[0] + 1])


def _first_free(used: dict[int, int]) -> int:
    c = 0
    while c in used:
        c += 1
    return c
