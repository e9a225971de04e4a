"""Our variant of TopoOpt's construction (``rings="ours"``, ``matching="ours"``).

1. **Degree split** (`degree_split`). d_ar ≈ d · T_ar/(T_ar + T_mp) by bytes per node,
   rounded to an even number in [2, d] (``split="all-dp"``: every interface to rings).
2. **All-reduce rings** (`allocate_rings`). A full N-ring is always kept. Per all-reduce
   group size g = N/m, picks (a jump p and its reverse N−p) are shared out in proportion to
   the group's ring traffic 2(g−1)/g·S, by largest remainder. The picks of g = N come from
   `select_permutations(..., distinct=True)`; those of g < N by the same geometric rule over
   J(g) = `candidate_jumps(N, g)`.
3. **Model-parallel links** (`mp_matchings`). d_mp rounds of maximum-weight matching
   (networkx) on the model-parallel demand only; after each round a matched pair's weight is
   scaled by conn/(conn+1). The demand of blocks of m consecutive nodes splits into identical
   components of lcm(m…) nodes: one is matched and the result translated to the others; a
   component that is a single uniform clique is matched by the round-robin
   1-factorisation, which is a maximum-weight matching in every round (see docs/explanation/topoopt.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np

from oddl.common.extras import require
from oddl.controller.scheduling.totient import candidate_jumps, max_degree, select_permutations
from oddl.offline.topoopt.authors import TIE_SEED
from oddl.offline.topoopt.job_model import TopoOptError, Traffic

SPLITS = ("proportional", "all-dp")
"""Degree splits: in proportion to the traffic, or every interface to all-reduce rings."""


def degree_split(tr: Traffic, degree: int, split: str = "proportional") -> tuple[int, int]:
    """(d_ar, d_mp): interfaces for all-reduce rings and for model-parallel matchings."""
    if split not in SPLITS:
        raise TopoOptError(f"unknown degree split {split!r}; use one of {', '.join(SPLITS)}")
    ar, mp = tr.ar_bytes_per_node, tr.mp_bytes_per_node
    top = min(degree, max_degree(tr.nodes, distinct=True))
    if split == "all-dp" or mp <= 0:
        return top - top % 2, degree - (top - top % 2)
    raw = degree * ar / (ar + mp)
    even = 2 * round(raw / 2)
    d_ar = max(2, min(top - top % 2, even))
    return d_ar, degree - d_ar


def _geometric(cands: Sequence[int], picks: int, n: int, used: set[int]) -> list[int]:
    """SelectPermutations' rule over `cands`: r = (max/min)^(1/picks), c = min; take the
    smallest unused candidate ≥ c (else the largest unused one), add it and n−p, c ← c·r."""
    out: list[int] = []
    if not cands or picks <= 0:
        return out
    r = (cands[-1] / cands[0]) ** (1.0 / picks)
    c = float(cands[0])
    for _ in range(picks):
        free = [x for x in cands if x not in used]
        if not free:
            break
        p = next((x for x in free if x >= c - 1e-9 * c), free[-1])
        used.update((p, n - p))
        out.extend(sorted({p, n - p}))
        c *= r
    return out


def allocate_rings(tr: Traffic, d_ar: int) -> tuple[dict[int, tuple[int, ...]], tuple[int, ...]]:
    """({m: jumps of that all-reduce group size}, every ring jump); uses ≤ d_ar interfaces.

    Picks go to the groups in proportion to their ring traffic (largest remainder), at most
    as many as a group's J(g) offers; what a group cannot take goes to the next heaviest.
    """
    n = tr.nodes
    if n < 2:
        return {}, ()
    classes = sorted(tr.allreduce, key=lambda c: (-_ring_bytes(n, *c), c[0]))
    has_full = any(m == 1 for m, _ in classes)
    ring = select_permutations(n, 2)
    budget = d_ar - (0 if has_full else len(ring))
    caps = [max_degree(n, distinct=True) // 2 if m == 1 else math.ceil(len(candidate_jumps(n, n // m)) / 2)
            for m, _ in classes]
    weights = [_ring_bytes(n, m, s) for m, s in classes]
    picks_left = min(max(0, budget // 2), sum(caps))
    total = sum(weights) or 1.0
    share = [picks_left * w / total for w in weights]
    picks = [min(math.floor(x), c) for x, c in zip(share, caps, strict=True)]
    order = sorted(range(len(classes)), key=lambda i: (picks[i] - share[i], i))
    while sum(picks) < picks_left:  # largest remainder first, then by traffic
        i = next((i for i in order if picks[i] < caps[i]), None)
        if i is None:
            break
        picks[i] += 1
        order.remove(i)
        order.append(i)
    for i, (m, _) in enumerate(classes):
        if m == 1 and picks[i] == 0:  # the class of all N nodes holds the full ring
            j = max(range(len(picks)), key=lambda k: picks[k])
            picks[j] -= 1
            picks[i] = 1
    own: dict[int, tuple[int, ...]] = {}
    used: set[int] = set()
    interfaces = 0 if has_full else len(ring)
    for (m, _), k in zip(classes, picks, strict=True):
        jumps: list[int] = []
        while k > 0:
            if m == 1:
                jumps = list(select_permutations(n, min(2 * k, max_degree(n, True)), True))
            else:
                jumps = _geometric(candidate_jumps(n, n // m), k, n, set(used))
            if interfaces + len(jumps) <= d_ar:
                break
            k -= 1
            jumps = []
        if jumps:
            used.update(jumps)
            interfaces += len(jumps)
            own[m] = tuple(sorted(jumps))
    every = set(ring) if not has_full else set()
    for js in own.values():
        every.update(js)
    return own, tuple(sorted(every))


def _ring_bytes(n: int, m: int, s: float) -> float:
    g = n // m
    return 2.0 * (g - 1) / g * s


def mp_matchings(n: int, demand: Sequence[tuple[int, float]], rounds: int
                 ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """`rounds` maximum-weight matchings on the demand {m: v} of m-blocks (conn/(conn+1)
    discount after each); each round is a tuple of pairs (i < j), sorted."""
    demand = [(m, v) for m, v in demand if m > 1 and v > 0]
    if rounds <= 0 or not demand:
        return ()
    size = reduce(math.lcm, (m for m, _ in demand))
    if len(demand) == 1:
        local = _round_robin(size, rounds)
    else:
        w = np.zeros((size, size))
        idx = np.arange(size)
        for m, v in demand:
            w += 2.0 * v * (idx[:, None] // m == idx[None, :] // m)
        np.fill_diagonal(w, 0.0)
        local = _repeated_matching(w, rounds)
    out = []
    for pairs in local:
        out.append(tuple(sorted((a + base, b + base) for base in range(0, n, size)
                                for a, b in pairs)))
    return tuple(out)


def _round_robin(size: int, rounds: int) -> list[list[tuple[int, int]]]:
    """Rounds of the circle-method 1-factorisation of K_size on randomly relabelled nodes.

    Every round avoids the pairs already linked while unlinked pairs remain, so it is a
    maximum-weight matching under the conn/(conn+1) discount. The relabelling breaks the
    ties: unrelabelled, the rounds are reflections i ↔ c−i of the ring and add no shortcuts.
    """
    label = np.random.default_rng(TIE_SEED).permutation(size).tolist()
    k = size if size % 2 == 0 else size + 1  # odd: a dummy node gives each round one bye
    out = []
    for r in range(rounds):
        r %= k - 1
        pairs = [(r, k - 1)] + [((r + i) % (k - 1), (r - i) % (k - 1)) for i in range(1, k // 2)]
        out.append(sorted((min(label[a], label[b]), max(label[a], label[b]))
                          for a, b in pairs if a < size and b < size))
    return out


def _repeated_matching(w: np.ndarray, rounds: int) -> list[list[tuple[int, int]]]:
    """Repeated Blossom maximum-weight matching (networkx) with the conn/(conn+1) discount.

    The graph is handed to networkx on randomly relabelled nodes (fixed seed), so ties
    between equally heavy matchings are not broken by node order (see `_round_robin`).
    Scaling the weights by tiny random factors would break them too, but makes Blossom ~100×
    slower (every weight distinct).
    """
    require("networkx", "TopoOpt's matchings")
    import networkx as nx

    size = w.shape[0]
    perm = np.random.default_rng(TIE_SEED).permutation(size)
    wl = w[np.ix_(perm, perm)]  # node k of the graph is node perm[k]
    g = nx.Graph()
    g.add_nodes_from(range(size))
    iu, ju = np.nonzero(np.triu(wl, 1))
    g.add_weighted_edges_from(zip(iu.tolist(), ju.tolist(), wl[iu, ju].tolist(), strict=True))
    conn: dict[tuple[int, int], int] = {}
    out = []
    for _ in range(rounds):
        match = nx.max_weight_matching(g)
        if not match:
            break
        for a, b in match:
            c = conn[a, b] = conn.get((a, b), 0) + 1
            g[a][b]["weight"] *= c / (c + 1)
        out.append(sorted((min(int(perm[a]), int(perm[b])), max(int(perm[a]), int(perm[b])))
                          for a, b in match))
    return out
