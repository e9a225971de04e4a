"""TopoOpt's topology from traffic: circulant rings plus matchings, and its ring routes.

`build_topology` builds with the authors' pieces by default (`oddl.offline.topoopt.authors`:
degree split, ring allocation, coin-change rings, perfect matchings, single-path routing) or
with ours (``rings="ours"``, ``matching="ours"``, ``routing="ours"``:
`oddl.offline.topoopt.our_construction`, `oddl.offline.topoopt.routing.ecmp_loads`). A group without
rings of its own all-reduces over the chosen jumps: the authors' coin path, or ours, the
fewest hops to stride ±m (coin change), half each way. Model-parallel traffic is routed on
shortest paths over every link (`oddl.offline.topoopt.routing`). The iteration-time model that
uses a `FabricTopology` is `oddl.offline.topoopt.evaluation`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.totient import check_degree, totient_picks
from oddl.offline.topoopt.authors import (
    authors_rings,
    authors_split,
    coin_path,
    perfect_matchings,
    single_path_loads,
)
from oddl.offline.topoopt.job_model import TopoOptError, Traffic
from oddl.offline.topoopt.our_construction import allocate_rings, degree_split, mp_matchings
from oddl.offline.topoopt.routing import coin_change, ecmp_loads, hop_distances

VARIANTS = ("authors", "ours")
"""Ring allocation, matching and routing: the authors' code (default) or our variant."""


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
            hit = self._cache["dist"] = hop_distances(self.nodes, *self.edges,
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
        path = coin_change(n, jumps, target)
        share = per / (1 if m % n == (n - m) % n else 2)
        hops = max(hops, len(path))
        for p in path:
            coeff[p] = coeff.get(p, 0.0) + share
    return coeff, hops


def dp_ring_jumps(n: int, degree: int, both_directions: bool = False) -> tuple[int, ...]:
    """The ring jumps the co-optimiser builds for a data-parallel job on n nodes: the
    authors' picks for one group of all N nodes (with their reverses if `both_directions`)."""
    try:
        check_degree(n, degree)
        picks = totient_picks(n, degree)
    except PlanError as exc:
        raise TopoOptError(str(exc)) from None
    return tuple(sorted(picks + tuple(n - p for p in picks))) if both_directions else picks
