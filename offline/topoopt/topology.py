"""TopoOpt's topology from traffic, routing over it, and the iteration-time model.

`build_topology` builds with the authors' pieces by default (`topoopt_authors`: degree split,
ring allocation, coin-change rings, perfect matchings, single-path routing) or with ours
(``rings="ours"``, ``matching="ours"``, ``routing="ours"``), which this module holds:

1. **Degree split.** d_ar ≈ d · T_ar/(T_ar + T_mp) by bytes per node, rounded to an even
   number in [2, d] (``split="all-dp"``: every interface to rings).
2. **All-reduce rings.** A full N-ring is always kept. Per all-reduce group size g = N/m,
   picks (a jump p and its reverse N−p) are shared out in proportion to the group's ring
   traffic 2(g−1)/g·S, by largest remainder. The picks of g = N come from
   `select_permutations(..., distinct=True)`; those of g < N by the same geometric rule over
   J(g) = `candidate_jumps(N, g)`. A group without picks is routed over the chosen jumps by
   the fewest hops to stride ±m (coin change), half each way.
3. **Model-parallel links.** d_mp rounds of maximum-weight matching (networkx) on the
   model-parallel demand only; after each round a matched pair's weight is scaled by
   conn/(conn+1). The demand of blocks of m consecutive nodes splits into identical
   components of lcm(m…) nodes: one is matched and the result translated to the others; a
   component that is a single uniform clique is matched by the round-robin 1-factorisation,
   which is a maximum-weight matching in every round (see docs/topoopt.md).
4. **Routing.** All-reduce rings on their jumps (hosts forward multi-hop rings); model-parallel
   traffic on shortest paths over every link, split evenly over equal-cost next hops.

Iteration time (`evaluate`), in the spirit of `offline.simulator.engine`: compute +
model-parallel exchanges (on the critical path) + all-reduce + reduction − overlap. Each phase
is a fluid bottleneck: the most loaded directed link's bytes at the interface rate, plus
latency per step (``latency_us`` + ``forward_us`` per extra hop). Fat-tree and ideal switch
use the same traffic with the simulator's fat-tree model (host ports, ToR and pod links).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import numpy as np

from common.errors import PlanError
from controller.scheduling.totient import (
    candidate_jumps,
    check_degree,
    max_degree,
    select_permutations,
    totient_picks,
)
from offline.topoopt.authors import (
    authors_rings,
    authors_split,
    coin_path,
    perfect_matchings,
    single_path_loads,
)
from offline.topoopt.model import JobModel, Strategy, TopoOptError, Traffic, traffic

SPLITS = ("proportional", "all-dp")
VARIANTS = ("authors", "ours")
"""Ring allocation, matching and routing: the authors' code (default) or our variant."""


@dataclass(frozen=True)
class NetParams:
    """Physical constants shared by every network (defaults as `SimConfig`'s)."""

    latency_us: float = 1.0
    """Base latency per step (NIC, propagation), µs."""
    forward_us: float = 1.0
    """TopoOpt: extra latency per forwarding host on a multi-hop path, µs."""
    reduce_gbytes_s: float = 500.0
    """Rate of adding received bytes (GB/s)."""
    overlap: float = 0.0
    """Fraction of the backward pass (2/3 of compute) that hides the all-reduce."""
    ft_hosts_per_tor: int = 8
    ft_tors_per_pod: int = 8
    ft_oversub: float = 1.0
    ft_core_oversub: float = 1.0
    ft_hop_latency_us: float = 0.5


# --------------------------------------------------------------------------- construction


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


TIE_SEED = 20230417
"""Seed of the tie-breaking among equally heavy matchings (fixed: the topology is a function
of the traffic alone)."""


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


# --------------------------------------------------------------------------- the topology


@dataclass(eq=False)
class FabricTopology:
    """A TopoOpt topology: circulant ring jumps plus matching links, d interfaces per node."""

    nodes: int
    degree: int
    gbps: float
    """Rate of every interface (Gbit/s)."""
    d_ar: int
    d_mp: int
    ring_jumps: dict[int, tuple[int, ...]]
    """Jumps owned by the all-reduce groups of size N/m, by m."""
    jumps: tuple[int, ...]
    """Every circulant jump (i → i+p), the kept full ring included."""
    matchings: tuple[tuple[tuple[int, int], ...], ...]
    rings: str = "authors"
    """How a group without its own rings is routed: ``authors`` (the candidate jump with the
    shortest coin path, both ways) or ``ours`` (stride m by the fewest hops, both ways)."""
    routing: str = "authors"
    """Model-parallel routing: ``authors`` (one shortest path per pair) or ``ours`` (split
    over equal-cost next hops)."""
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def interfaces_used(self) -> int:
        """Interfaces per node actually wired (≤ degree)."""
        return len(self.jumps) + len(self.matchings)

    @property
    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Directed links (src, dst): N per jump, two per matched pair."""
        hit = self._cache.get("edges")
        if hit is None:
            n = self.nodes
            u = np.arange(n, dtype=np.int64)
            src = [u for _ in self.jumps]
            dst = [(u + p) % n for p in self.jumps]
            for pairs in self.matchings:
                if pairs:
                    a = np.array(pairs, dtype=np.int64)
                    src += [a[:, 0], a[:, 1]]
                    dst += [a[:, 1], a[:, 0]]
            hit = self._cache["edges"] = (np.concatenate(src) if src else u[:0],
                                          np.concatenate(dst) if dst else u[:0])
        return hit

    @property
    def period(self) -> int:
        """Smallest shift s with the topology invariant under i → i+s (the matchings repeat
        every `period` nodes; the jumps under any shift)."""
        if not self.matchings:
            return 1
        hit = self._cache.get("period")
        if hit is None:
            n = self.nodes
            pairs = {frozenset(p) for r in self.matchings for p in r}
            hit = next(s for s in range(1, n + 1) if n % s == 0 and all(
                frozenset(((a + s) % n, (b + s) % n)) in pairs for a, b in pairs))
            self._cache["period"] = hit
        return hit

    def hops_from(self, sources: int) -> np.ndarray:
        """Hop distances from nodes 0..sources−1 to every node (rows)."""
        hit = self._cache.get("dist")
        if hit is None or hit.shape[0] < sources:
            hit = self._cache["dist"] = _hops(self.nodes, *self.edges,
                                              max(sources, self.period))
        return hit[:sources]

    @property
    def diameter(self) -> int:
        """Largest hop distance (every node's eccentricity repeats with the period)."""
        return int(self.hops_from(self.period).max()) if self.nodes > 1 else 0

    def ring_route(self, m: int) -> tuple[dict[int, float], int]:
        """({jump: bytes per link per byte of S}, hops) of the all-reduce of group size N/m."""
        key = ("ring", m)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = _ring_route(self.nodes, m, self.ring_jumps.get(m, ()),
                                                 self.jumps, self.rings)
        return hit

    def block_route(self, m: int) -> tuple[float, int]:
        """(largest link load, most hops) of 1 byte between every ordered pair of m-blocks.

        Topology and demand repeat every P = lcm(period, m) nodes, so only destinations
        0..P−1 are routed; a link's load is the sum over its orbit under shifts by P.
        """
        key = ("block", m)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._block_route(m)
        return hit

    def _block_route(self, m: int) -> tuple[float, int]:
        n = self.nodes
        src, dst = self.edges
        if m < 2 or not len(src):
            return 0.0, 0
        period = math.lcm(self.period, m)
        dist = self.hops_from(period)  # rows: destinations 0..period-1 (links are symmetric)
        t = np.arange(period)
        demand = np.zeros((n, period))  # demand[u, t]: bytes from u to destination t
        same = np.arange(n)[:, None] // m == t[None, :] // m
        demand[same] = 1.0
        demand[t, t] = 0.0
        loads = single_path_loads if self.routing == "authors" else ecmp_loads
        part = loads(n, src, dst, demand, dist, t)
        key = (src % period) * n + (dst - src) % n
        _, orbit, count = np.unique(key, return_inverse=True, return_counts=True)
        total = np.bincount(orbit, part) * (n // period) / count
        hops = int(dist[:, :][same.T].max())
        return float(total.max()), hops

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly description."""
        return {"nodes": self.nodes, "degree": self.degree, "interface_gbps": self.gbps,
                "d_allreduce": self.d_ar, "d_model_parallel": self.d_mp,
                "jumps": list(self.jumps),
                "ring_jumps": {str(m): list(j) for m, j in sorted(self.ring_jumps.items())},
                "matchings": [[list(p) for p in r] for r in self.matchings],
                "interfaces_used": self.interfaces_used, "diameter": self.diameter,
                "period": self.period, "rings": self.rings, "routing": self.routing}


def build_topology(tr: Traffic, degree: int, gbps: float, split: str = "proportional",
                   rings: str = "authors", matching: str = "authors", routing: str = "authors"
                   ) -> FabricTopology:
    """The TopoOpt topology for `tr` with `degree` interfaces of `gbps` each.

    `rings`, `matching`, `routing`: ``authors`` (`topoopt_authors`, the default) or ``ours``
    (this module's proportional ring shares, maximum-weight matchings that may leave nodes
    unmatched, equal-cost multipath).
    """
    n = tr.nodes
    if degree < 2:
        raise TopoOptError(f"degree must be >= 2 (one ring); got {degree}, use 2")
    for name, v in (("rings", rings), ("matching", matching), ("routing", routing)):
        if v not in VARIANTS:
            raise TopoOptError(f"{name} must be one of {', '.join(VARIANTS)}; got {v!r}")
    if rings == "authors":
        d_ar, _ = authors_split(tr, degree, split)
        own = authors_rings(tr, d_ar)
        jumps = tuple(sorted(j for js in own.values() for j in js))
    else:
        d_ar, _ = degree_split(tr, degree, split)
        own, jumps = allocate_rings(tr, d_ar)
    d_mp = degree - len(jumps)
    build = perfect_matchings if matching == "authors" else mp_matchings
    matchings = build(n, tr.mp_by_degree(), d_mp)
    return FabricTopology(n, degree, gbps, d_ar, d_mp, own, jumps, matchings, rings, routing)


def _ring_route(n: int, m: int, own: tuple[int, ...], jumps: tuple[int, ...],
                rings: str = "authors") -> tuple[dict[int, float], int]:
    """({jump: bytes per link per byte of S}, hops); a repeated jump counts once per copy."""
    g = n // m
    per = 2.0 * (g - 1) / g
    if g < 2:
        return {}, 0
    coeff: dict[int, float] = {}
    if own:
        for p in own:
            coeff[p] = coeff.get(p, 0.0) + per / len(own)
        return coeff, 1
    if rings == "authors":
        path = coin_path(n, m, jumps)
        for p in path:  # the path and its reverse, half the bytes each
            for q in (p, n - p):
                coeff[q] = coeff.get(q, 0.0) + per / 2
        return coeff, len(path)
    hops = 0
    for target in {m % n, (n - m) % n}:
        path = _coin_change(n, jumps, target)
        share = per / (1 if m % n == (n - m) % n else 2)
        hops = max(hops, len(path))
        for p in path:
            coeff[p] = coeff.get(p, 0.0) + share
    return coeff, hops


def _coin_change(n: int, jumps: Sequence[int], target: int) -> list[int]:
    """Fewest jumps (with repetition) that add up to `target` mod n, by BFS over Z_n."""
    prev: dict[int, tuple[int, int]] = {0: (0, 0)}
    queue = deque([0])
    while queue and target not in prev:
        x = queue.popleft()
        for p in sorted(jumps):
            y = (x + p) % n
            if y not in prev:
                prev[y] = (x, p)
                queue.append(y)
    if target not in prev:
        raise TopoOptError(f"ring jumps {sorted(jumps)} cannot reach stride {target} on {n} "
                           "nodes; keep a full ring (a jump coprime to N)")
    path = []
    x = target
    while x != 0:
        x, p = prev[x]
        path.append(p)
    return path


def _hops(n: int, src: np.ndarray, dst: np.ndarray, sources: int) -> np.ndarray:
    """BFS from nodes 0..sources−1 at once (links are bidirectional): (sources, n) hops.

    Each level expands only the frontier through a CSR adjacency, so the work is about
    sources · links whatever the diameter.
    """
    a = np.concatenate((src, dst))
    b = np.concatenate((dst, src))
    order = np.argsort(a, kind="stable")
    nbr = b[order]
    indptr = np.searchsorted(a[order], np.arange(n + 1))
    deg = np.diff(indptr)
    dist = np.full((sources, n), -1, dtype=np.int64)
    r = np.arange(sources)
    u = r.copy()
    dist[r, u] = 0
    depth = 0
    while len(u):
        cnt = deg[u]
        rr = np.repeat(r, cnt)
        first = np.repeat(indptr[u] - (np.cumsum(cnt) - cnt), cnt)
        v = nbr[first + np.arange(len(rr))]
        fresh = dist[rr, v] < 0
        key = np.unique(rr[fresh] * n + v[fresh])
        r, u = key // n, key % n
        depth += 1
        dist[r, u] = depth
    if (dist < 0).any():
        raise TopoOptError(f"the topology does not connect all {n} nodes; keep a full ring")
    return dist


def ecmp_loads(n: int, src: np.ndarray, dst: np.ndarray, demand: np.ndarray,
               dist: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Bytes on each directed link when demand[u, i] goes to node targets[i] on shortest
    paths, split evenly over the links to equal-cost next hops at every node.

    `dist[i, u]` is the hop distance between targets[i] and u. Work is proportional to the
    (target, shortest-path link) pairs, whatever the diameter.
    """
    e = len(src)
    loads = np.zeros(e)
    chunk = max(1, (1 << 21) // max(e, 1))
    for lo in range(0, len(targets), chunk):
        d = dist[lo:lo + chunk]
        k = d.shape[0]
        du = d[:, src]  # (k, E): hops from each link's tail to the target
        ti, ei = np.nonzero(d[:, dst] == du - 1)  # links on shortest paths, per target
        lvl = du[ti, ei]
        tail = ti * n + src[ei]
        head = ti * n + dst[ei]
        share = 1.0 / np.bincount(tail, minlength=k * n)[tail]
        order = np.argsort(-lvl, kind="stable")
        ti, ei, lvl, tail, head, share = (x[order] for x in (ti, ei, lvl, tail, head, share))
        cuts = np.flatnonzero(np.diff(lvl)) + 1
        f = demand[:, lo:lo + chunk].T.astype(float).ravel()  # bytes at u heading to target
        for part in np.split(np.arange(len(lvl)), cuts):
            c = f[tail[part]] * share[part]
            loads += np.bincount(ei[part], c, e)
            f += np.bincount(head[part], c, k * n)
    return loads


def dp_ring_jumps(n: int, degree: int, both_directions: bool = False) -> tuple[int, ...]:
    """The ring jumps the co-optimiser builds for a data-parallel job on n nodes: the
    authors' picks for one group of all N nodes (with their reverses if `both_directions`)."""
    try:
        check_degree(n, degree)
        picks = totient_picks(n, degree)
    except PlanError as exc:
        raise TopoOptError(str(exc)) from None
    return tuple(sorted(picks + tuple(n - p for p in picks))) if both_directions else picks


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Breakdown:
    """Predicted iteration on one network (seconds)."""

    network: str
    compute_s: float
    mp_s: float
    """Model-parallel exchanges (critical path)."""
    allreduce_s: float
    """All-reduce network time."""
    reduce_s: float
    hidden_s: float
    """All-reduce time hidden behind the backward pass (`NetParams.overlap`)."""

    @property
    def iteration_s(self) -> float:
        """Compute + exchanges + all-reduce + reduction − hidden."""
        return self.compute_s + self.mp_s + self.allreduce_s + self.reduce_s - self.hidden_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy in milliseconds."""
        return {"network": self.network, "compute_ms": self.compute_s * 1e3,
                "mp_ms": self.mp_s * 1e3, "allreduce_ms": self.allreduce_s * 1e3,
                "reduce_ms": self.reduce_s * 1e3, "hidden_ms": self.hidden_s * 1e3,
                "iteration_ms": self.iteration_s * 1e3}


def _finish(network: str, model: JobModel, tr: Traffic, mp_s: float, ar_s: float,
            p: NetParams) -> Breakdown:
    n = tr.nodes
    red = sum((n // m - 1) / (n // m) * s for m, s in tr.allreduce) / (p.reduce_gbytes_s * 1e9)
    compute = model.compute_s
    hidden = min(ar_s + red, p.overlap * compute * 2.0 / 3.0)
    return Breakdown(network, compute, mp_s, ar_s, red, hidden)


def evaluate(model: JobModel, strategy: Strategy, topo: FabricTopology,
             p: NetParams = NetParams(), tr: Traffic | None = None) -> Breakdown:
    """Iteration time of `strategy` on a TopoOpt topology (built for it or not)."""
    tr = tr or traffic(model, strategy, topo.nodes)
    bits = 8.0 / (topo.gbps * 1e9)
    alpha, fwd = p.latency_us * 1e-6, p.forward_us * 1e-6
    mp = 0.0
    for m, v, ex in tr.mp:
        load, hops = topo.block_route(m)
        mp += v * load * bits + 2 * ex * (alpha + max(hops - 1, 0) * fwd)
    per_jump: dict[int, float] = {}
    lat = 0.0
    for m, s in tr.allreduce:
        coeff, hops = topo.ring_route(m)
        for j, c in coeff.items():
            per_jump[j] = per_jump.get(j, 0.0) + c * s
        lat = max(lat, 2 * (topo.nodes // m - 1) * (alpha + max(hops - 1, 0) * fwd))
    copies: dict[int, int] = {}
    for j in topo.jumps:
        copies[j] = copies.get(j, 0) + 1
    ar = max((b / copies.get(j, 1) for j, b in per_jump.items()), default=0.0) * bits + lat
    return _finish("topoopt", model, tr, mp, ar, p)


@dataclass(eq=False)
class FatTree:
    """An electrical 3-tier fat-tree (as the simulator's): host ports at `gbps`, ToR and pod
    links with oversubscription, per-switch latency, packed placement (rank r on host r)."""

    nodes: int
    gbps: float
    p: NetParams = field(default_factory=NetParams)
    ideal: bool = False
    """A non-blocking switch instead: host ports only, no switch latency."""
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """``ideal`` or ``fat-tree``."""
        return "ideal" if self.ideal else "fat-tree"

    def _ports(self, src: np.ndarray, dst: np.ndarray, vol: np.ndarray) -> tuple[float, int]:
        """(seconds per byte of `vol` at the bottleneck, switches crossed) of one flow set."""
        n, b, p = self.nodes, self.gbps * 1e9 / 8.0, self.p
        t = max(np.bincount(src, vol, n).max(), np.bincount(dst, vol, n).max()) / b
        if self.ideal:
            return float(t), 0
        rack, pod = np.arange(n) // p.ft_hosts_per_tor, np.arange(n) // (
            p.ft_hosts_per_tor * p.ft_tors_per_pod)
        xr, xp = rack[src] != rack[dst], pod[src] != pod[dst]
        tor = p.ft_hosts_per_tor * b / p.ft_oversub
        podcap = p.ft_hosts_per_tor * p.ft_tors_per_pod * b / (p.ft_oversub * p.ft_core_oversub)
        for side in (src, dst):
            if xr.any():
                t = max(t, np.bincount(rack[side[xr]], vol[xr]).max() / tor)
            if xp.any():
                t = max(t, np.bincount(pod[side[xp]], vol[xp]).max() / podcap)
        return float(t), 5 if xp.any() else 3 if xr.any() else 1

    def block(self, m: int) -> tuple[float, int]:
        """(seconds per pair-byte, switches) of the all-to-all within m-blocks."""
        hit = self._cache.get(("block", m))
        if hit is None:
            u = np.arange(self.nodes)
            a, b = np.nonzero(u[:, None] // m == u[None, :] // m)
            keep = a != b
            hit = self._cache["block", m] = self._ports(a[keep], b[keep],
                                                        np.ones(int(keep.sum())))
        return hit

    def ring(self, m: int) -> tuple[float, int]:
        """(seconds per byte of S, switches) of the ring all-reduce of group size N/m."""
        hit = self._cache.get(("ring", m))
        if hit is None:
            n, g = self.nodes, self.nodes // m
            u = np.arange(n)
            hit = self._cache["ring", m] = self._ports(u, (u + m) % n,
                                                       np.full(n, 2.0 * (g - 1) / g))
        return hit

    def evaluate(self, model: JobModel, strategy: Strategy, tr: Traffic | None = None
                 ) -> Breakdown:
        """Iteration time of `strategy` on this network."""
        tr = tr or traffic(model, strategy, self.nodes)
        p = self.p
        alpha, hop = p.latency_us * 1e-6, 0.0 if self.ideal else p.ft_hop_latency_us * 1e-6
        mp = 0.0
        for m, v, ex in tr.mp:
            per, sw = self.block(m)
            mp += v * per + 2 * ex * (alpha + sw * hop)
        n = self.nodes
        if tr.allreduce:
            # all groups at once: loads add up on the same ports
            u = np.arange(n)
            srcs, dsts, vols, lat = [], [], [], 0.0
            for m, s in tr.allreduce:
                g = n // m
                srcs.append(u)
                dsts.append((u + m) % n)
                vols.append(np.full(n, 2.0 * (g - 1) / g * s))
                lat = max(lat, 2 * (g - 1) * (alpha + self.ring(m)[1] * hop))
            key = ("ar", tr.allreduce)
            t = self._cache.get(key)
            if t is None:
                t = self._cache[key] = self._ports(np.concatenate(srcs), np.concatenate(dsts),
                                                   np.concatenate(vols))[0]
            ar = t + lat
        else:
            ar = 0.0
        return _finish(self.name, model, tr, mp, ar, p)


# --------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class CostModel:
    """Network cost per node, linear in the line rate (indicative prices, our assumption).

    TopoOpt: d × (NIC port + transceiver) at B each, plus d patch-panel ports. Fat-tree of
    t tiers (1: one switch, 2: leaf-spine, 3: core): a NIC port, 2t transceivers and 2t−1
    switch ports per host, all at the host rate.
    """

    nic_per_gbps: float = 5.0
    transceiver_per_gbps: float = 1.5
    switch_port_per_gbps: float = 4.0
    patch_panel_port: float = 100.0

    def topoopt_per_node(self, degree: int, gbps: float) -> float:
        """Cost of one TopoOpt node's network (currency units)."""
        return degree * (gbps * (self.nic_per_gbps + self.transceiver_per_gbps)
                         + self.patch_panel_port)

    def fattree_per_gbps(self, nodes: int, p: NetParams) -> float:
        """Cost per host and per Gbit/s of host rate of a full-bisection fat-tree."""
        tiers = 1 if nodes <= p.ft_hosts_per_tor else 2 if nodes <= (
            p.ft_hosts_per_tor * p.ft_tors_per_pod) else 3
        return (self.nic_per_gbps + 2 * tiers * self.transceiver_per_gbps
                + (2 * tiers - 1) * self.switch_port_per_gbps)

    def equal_cost_fattree_gbps(self, nodes: int, degree: int, gbps: float,
                                p: NetParams) -> float:
        """Host rate of the fat-tree that costs what the TopoOpt network costs."""
        return self.topoopt_per_node(degree, gbps) / self.fattree_per_gbps(nodes, p)

    def as_dict(self) -> dict[str, float]:
        """The prices."""
        return {"nic_per_gbps": self.nic_per_gbps,
                "transceiver_per_gbps": self.transceiver_per_gbps,
                "switch_port_per_gbps": self.switch_port_per_gbps,
                "patch_panel_port": self.patch_panel_port}
