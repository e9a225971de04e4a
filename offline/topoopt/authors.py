"""TopoOpt's topology construction and routing as the authors' code does them (the defaults).

Reconstructed from hipersys-team/FlexFlow ``src/runtime/network.cc`` (``SpMulMat``), read to
learn, written anew (docs/explanation/topoopt.md §2 says what is theirs and what is ours):

- `authors_split`: the degree split. Their active code gives every interface to all-reduce
  rings (``dp_degree = if_cnt``: ``split="all-dp"``); the proportional rule beside it,
  commented out, rounds ``d·T_dp/(T_dp+T_mp)`` with ``T_dp = Σ S·(2g−1)`` over every group
  and ``T_mp`` the sum of the model-parallel matrix, then makes the ring part even and ≥ 2.
- `authors_rings` (``generate_dp_topology``): group sizes sorted by ``Σ S·(2g−1)/g``,
  heaviest first, each gets ``⌊total·d/weight⌋`` picks' worth of links (≥ 1, doubled for
  bidirectional links, capped by what is left) — so the heaviest group takes every link;
  if no group of all N nodes got links, the last group gives 2 to the full ring. Each group's
  picks come from `choose_geometric` over J(g).
- `coin_path`: a group without links all-reduces over the chosen jumps: of its candidate
  jumps J(g), the first (ascending) whose fewest-jumps path is shortest, and that path
  reversed (two multi-hop rings, half the bytes each).
- `perfect_matchings` (``generate_mp_matching``): each round a minimum-cost *perfect*
  matching on the complete graph with cost ``max demand − demand`` (so zero-demand pairs are
  matched when needed), then a matched pair's demand × conn/(conn+1).
- `single_path_loads` (``ShortestPathNetworkRoutingStrategy``): one shortest path per pair,
  ties broken at random (fixed seed here).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from functools import reduce

import numpy as np

from oddl.common.extras import require
from oddl.controller.scheduling.totient import candidate_jumps, choose_geometric
from oddl.offline.topoopt.job_model import TopoOptError, Traffic
from oddl.offline.topoopt.routing import push_towards_targets, shortest_path_links

TIE_SEED = 20230417
"""Seed of every tie-break (the topology and its routes are a function of the traffic)."""


def authors_split(tr: Traffic, degree: int, split: str) -> tuple[int, int]:
    """(ring interfaces, matching interfaces) by the authors' rule (module docstring)."""
    if split == "all-dp" or not tr.mp:
        return degree, 0
    n = tr.nodes
    t_dp = sum(m * s * (2 * (n // m) - 1) for m, s in tr.allreduce)
    t_mp = sum((n // m) * m * (m - 1) * v for m, v, _ in tr.mp)
    dp = _lround(t_dp / (t_dp + t_mp) * degree)
    mp = _lround(t_mp / (t_dp + t_mp) * degree)
    if dp % 2:
        dp, mp = dp + 1, mp - 1
    if dp == 0:
        dp, mp = 2, mp - 2
    return dp, degree - dp


def _lround(x: float) -> int:
    return int(math.floor(x + 0.5))


def authors_rings(tr: Traffic, d_ar: int) -> dict[int, tuple[int, ...]]:
    """{m: jumps (picks and reverses)} of the all-reduce groups of size N/m that get links."""
    n = tr.nodes
    weights = {n // m: math.floor(m * s * (2 * (n // m) - 1) / (n // m))
               for m, s in tr.allreduce if n // m > 1}
    order = sorted(weights.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = sum(w for _, w in order)
    links: list[list[int]] = []
    assigned = 0
    for g, w in order:
        k = max(1, total * d_ar // w) * 2 if w else 2
        k = min(k, d_ar - assigned)
        assigned += k
        links.append([g, k])
        if assigned == d_ar:
            break
    if not links:  # ours: their code indexes an empty list when nothing is all-reduced
        links = [[n, d_ar]]
    elif all(g != n for g, _ in links):
        links[-1][1] -= 2
        if links[-1][1] <= 0:
            links.pop()
        links.append([n, 2])
    out: dict[int, tuple[int, ...]] = {}
    spare = 0
    for g, k in links:
        cands = candidate_jumps(n, g)
        picks = k // 2
        if picks > len(cands):  # ours: their pick would run past the list; rings get the rest
            spare += 2 * (picks - len(cands))
            picks = len(cands)
        if picks:
            out[n // g] = tuple(choose_geometric(cands, picks))
    if spare:
        full = candidate_jumps(n, n)
        have = len(out.get(1, ()))
        out[1] = tuple(choose_geometric(full, min(have + spare // 2, len(full))))
    return {m: tuple(sorted(p + tuple(n - x for x in p))) for m, p in out.items()}


def coin_path(n: int, m: int, jumps: Sequence[int]) -> list[int]:
    """Jumps of the multi-hop ring of the group of stride m (module docstring)."""
    dist, back = _coin_table(n, tuple(sorted(set(jumps))))
    best: list[int] | None = None
    for cj in candidate_jumps(n, n // m):
        if dist[cj] < 0:
            continue
        if best is None or dist[cj] < len(best):
            path, x = [], cj
            while x:
                path.append(back[x])
                x = (x - back[x]) % n
            best = path
    if best is None:
        raise TopoOptError(f"ring jumps {sorted(set(jumps))} cannot reach a member of the "
                           f"groups of stride {m} on {n} nodes; keep a full ring")
    return best


def _coin_table(n: int, coins: tuple[int, ...]) -> tuple[list[int], list[int]]:
    dist, back = [-1] * n, [0] * n
    dist[0] = 0
    queue = deque([0])
    while queue:
        x = queue.popleft()
        for c in coins:
            y = (x + c) % n
            if dist[y] < 0:
                dist[y], back[y] = dist[x] + 1, c
                queue.append(y)
    return dist, back


def perfect_matchings(n: int, demand: Sequence[tuple[int, float]], rounds: int
                      ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """`rounds` minimum-cost perfect matchings of all n nodes (module docstring).

    The demand of blocks of m consecutive nodes splits into identical components of
    lcm(m…) nodes; when that size is even a perfect matching inside each component is
    optimal (pairs across components have zero demand), so one component is matched and
    translated. A single even block size is matched by the round-robin 1-factorisation on
    relabelled nodes (every round takes the least-linked pairs: optimal under the discount);
    anything else goes to networkx on the complete graph.
    """
    demand = [(m, v) for m, v in demand if m > 1 and v > 0]
    if rounds <= 0 or not demand or n < 2:
        return ()
    size = reduce(math.lcm, (m for m, _ in demand))
    if len(demand) == 1 and size % 2 == 0:
        local = _round_robin(size, rounds)
    elif len(demand) == 1 and n % (2 * size) == 0:
        size *= 2  # two odd blocks: each matched inside, their spare nodes to each other
        local = _odd_pair(size // 2, rounds)
    else:
        if size % 2:
            size = n
        w = np.zeros((size, size))
        idx = np.arange(size)
        for m, v in demand:
            w += v * (idx[:, None] // m == idx[None, :] // m)
        np.fill_diagonal(w, 0.0)
        local = _complete_matchings(w, rounds)
    return tuple(tuple(sorted((a + base, b + base) for base in range(0, n, size)
                              for a, b in pairs)) for pairs in local)


def _round_robin(size: int, rounds: int) -> list[list[tuple[int, int]]]:
    label = np.random.default_rng(TIE_SEED).permutation(size).tolist()
    out = []
    for r in range(rounds):
        r %= size - 1
        pairs = [(r, size - 1)] + [((r + i) % (size - 1), (r - i) % (size - 1))
                                   for i in range(1, size // 2)]
        out.append(sorted((min(label[a], label[b]), max(label[a], label[b])) for a, b in pairs))
    return out


def _odd_pair(m: int, rounds: int) -> list[list[tuple[int, int]]]:
    """Rounds on two odd blocks of m: the round-robin of each block (a dummy gives one node a
    bye), the two byes matched to each other (a zero-demand pair): optimal and perfect."""
    label = np.random.default_rng(TIE_SEED).permutation(m).tolist()
    k = m + 1
    out = []
    for r in range(rounds):
        r %= k - 1
        pairs = [(r, k - 1)] + [((r + i) % (k - 1), (r - i) % (k - 1)) for i in range(1, k // 2)]
        inner = [(label[a], label[b]) for a, b in pairs if a < m and b < m]
        bye = next(label[a if b == m else b] for a, b in pairs if m in (a, b))
        both = [tuple(sorted((a + base, b + base))) for base in (0, m) for a, b in inner]
        out.append(sorted(both + [(bye, bye + m)]))
    return out


def _complete_matchings(w: np.ndarray, rounds: int) -> list[list[tuple[int, int]]]:
    """Maximum-weight matchings of maximum cardinality (= minimum-cost perfect matchings
    with cost max − w) on the complete graph, nodes relabelled at random for the ties."""
    require("networkx", "TopoOpt's matchings")
    import networkx as nx

    size = w.shape[0]
    perm = np.random.default_rng(TIE_SEED).permutation(size)
    wl = w[np.ix_(perm, perm)]
    iu, ju = np.triu_indices(size, 1)
    g = nx.Graph()
    g.add_weighted_edges_from(zip(iu.tolist(), ju.tolist(), wl[iu, ju].tolist(), strict=True))
    conn: dict[tuple[int, int], int] = {}
    out = []
    for _ in range(rounds):
        match = nx.max_weight_matching(g, maxcardinality=True)
        for a, b in match:
            c = conn[a, b] = conn.get((a, b), 0) + 1
            g[a][b]["weight"] = math.floor(g[a][b]["weight"] * c / (c + 1))
        out.append(sorted((min(int(perm[a]), int(perm[b])), max(int(perm[a]), int(perm[b])))
                          for a, b in match))
    return out


def single_path_loads(n: int, src: np.ndarray, dst: np.ndarray, demand: np.ndarray,
                      dist: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Bytes on each directed link when demand[u, i] goes to targets[i] on one shortest path.

    Every node picks one next hop towards each target among those one hop closer, at random
    (seed `TIE_SEED`; parallel links count as separate next hops), so each pair's traffic
    takes a single path as in the authors' routing. `dist[i, u]` is the hop distance between
    targets[i] and u.
    """
    rng = np.random.default_rng(TIE_SEED)
    loads = np.zeros(len(src))
    for lo, k, du, ti, ei in shortest_path_links(src, dst, dist, targets):
        tail = ti * n + src[ei]
        pick = np.lexsort((rng.random(len(ei)), tail))  # random order within each tail
        first = np.ones(len(pick), dtype=bool)
        first[1:] = tail[pick][1:] != tail[pick][:-1]
        ti, ei = ti[pick][first], ei[pick][first]
        tail, head = ti * n + src[ei], ti * n + dst[ei]
        f = demand[:, lo:lo + k].T.astype(float).ravel()
        push_towards_targets(loads, n, k, ei, du[ti, ei], tail, head, f)
    return loads
