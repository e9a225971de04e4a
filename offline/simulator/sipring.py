"""SiP-Ring wavelength allocation, as the SiP-ML reimplementation in ffsim-opera does it.

The reference is the TopoOpt team's htsim fork (`Flasew/ffsim-opera`, ``src/clos/
dyn_net_sch.cpp``, ``DynFlatScheduler::update_all_queue_bandwidth``, strategy ``SIPML_RING``;
docs/sources.md §5). Read to learn the method, nothing copied. At every reconfiguration it:

1. normalises the outstanding demand matrix by its largest entry (``normalize_tm``);
2. solves an LP over one variable f(s, d) ∈ [0, 1] per pair with demand, plus a zero-cost
   "dummy" pair s → s+1 for every s without demand to s+1: flow conservation at every node
   (Σ in = Σ out), and on every segment k (the fibre k → k+1 of the unidirectional ring)
   Σ f over the pairs whose circuit crosses k ≤ 1; objective minimise Σ −f(s, d)/tm(s, d);
3. scales f by W (the wavelengths per segment), rounds each up with probability equal to its
   fractional part (``rand()`` against the fraction), and
4. walks the segments 0..N−1 and the pairs in (src, dst) order, taking wavelengths off the
   pair that pushes a segment past W;
5. gives each pair a rate of (its wavelengths) × (the per-wavelength rate).

So a circuit gets the wavelengths of its segments, shared with whatever else crosses them,
not one wavelength per node. What is ours: the LP is solved with HiGHS (scipy) instead of
Gurobi, the demand is rounded to 1/1000 of the largest entry before the LP (so steps whose
chunks differ by an element share one solution), and the random rounding uses numpy's
generator seeded from `SimConfig.seed`.

Segment coverage. A circuit s → d occupies the segments s, s+1, …, d−1 (mod N): segment k is
crossed when (k − s) mod N < (d − s) mod N (``rule="ring"``, the default). The reference
code computes the two offsets with ``n − offset`` instead of ``n + offset`` when they are
negative, which for a circuit that wraps past node 0 counts the segments d+1 … s−1 (which it
does not use) instead of 0 … d−1; ``rule="ffsim"`` reproduces that arithmetic as written.
On a ring all-reduce it halves every circuit's wavelengths (the wrapping circuit N−1 → 0
then shares every segment, and flow conservation spreads that to all circuits).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from oddl.common.errors import OddlError
from oddl.common.extras import require

log = logging.getLogger(__name__)

RULES = ("ring", "ffsim")
"""Segment-coverage rules: the ring's geometry, or the reference code's offset arithmetic."""

DEMAND_QUANTUM = 1000
"""The LP sees demand rounded to 1/DEMAND_QUANTUM of the largest entry."""


class AllocationError(OddlError):
    """The SiP-Ring LP could not be solved."""


@dataclass(frozen=True)
class RingFlows:
    """The pairs of one configuration (demand pairs and dummy s → s+1 pairs), in (src, dst)
    order, with which segments each one crosses."""

    n: int
    src: np.ndarray
    dst: np.ndarray
    dummy: np.ndarray
    """True for the zero-demand s → s+1 pairs the LP adds."""
    cover: np.ndarray
    """Boolean (segments × pairs): pair j's circuit crosses segment k."""

    @property
    def codes(self) -> np.ndarray:
        """src·n + dst of every pair (sorted)."""
        return self.src * self.n + self.dst


def covers(src: np.ndarray, dst: np.ndarray, n: int, rule: str = "ring") -> np.ndarray:
    """Boolean (n × len(src)) matrix: does the circuit src → dst cross segment k (k → k+1)?"""
    if rule not in RULES:
        raise AllocationError(f"unknown SiP-Ring segment rule {rule!r}; use one of {RULES}")
    seg = np.arange(n, dtype=np.int64)[:, None]
    s, d = src[None, :].astype(np.int64), dst[None, :].astype(np.int64)
    if rule == "ring":
        return (seg - s) % n < (d - s) % n
    seg_off = seg - s
    seg_off = np.where(seg_off < 0, n - seg_off, seg_off)
    dst_off = d - s
    dst_off = np.where(dst_off < 0, n - dst_off, dst_off)
    return dst_off > seg_off


def ring_flows(codes: np.ndarray, n: int, rule: str = "ring") -> RingFlows:
    """The LP's pairs for demand pairs `codes` (src·n + dst, unique): those plus a dummy
    s → s+1 for every s that has no demand to s+1, sorted by (src, dst) as the reference."""
    nxt = np.arange(n, dtype=np.int64) * n + (np.arange(n, dtype=np.int64) + 1) % n
    dummies = np.setdiff1d(nxt, codes)
    allc = np.concatenate([codes.astype(np.int64), dummies])
    order = np.argsort(allc, kind="stable")
    allc = allc[order]
    dummy = np.zeros(len(allc), dtype=bool)
    dummy[np.searchsorted(allc, dummies)] = True
    src, dst = allc // n, allc % n
    return RingFlows(n, src, dst, dummy, covers(src, dst, n, rule))


def intervals(src: np.ndarray, dst: np.ndarray, n: int, rule: str = "ring"
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The segments each circuit crosses as half-open intervals [start, end) of 0..n:
    (start, end, circuit index); a circuit that wraps past node 0 gives two (same sets as
    `covers`)."""
    src, dst = src.astype(np.int64), dst.astype(np.int64)
    idx = np.arange(len(src))
    if rule == "ffsim":
        fwd = dst > src
        return (np.where(fwd, src, dst + 1), np.where(fwd, dst, n), idx)
    end = src + (dst - src) % n
    wrap = end > n
    return (np.concatenate([src, np.zeros(int(wrap.sum()), dtype=np.int64)]),
            np.concatenate([np.minimum(end, n), end[wrap] - n]),
            np.concatenate([idx, idx[wrap]]))


def solve_fractions(flows: RingFlows, demand: np.ndarray, rule: str = "ring") -> np.ndarray:
    """The LP's f ∈ [0, 1] for every pair of `flows`; `demand` is given for the non-dummy pairs
    in their order and is normalised here by its largest entry.

    The segment loads are written as running sums (load_k − load_{k−1} = f of the circuits
    whose interval starts at k − f of those whose interval ends at k), which is the same
    constraint set as Σ_{j crosses k} f_j ≤ 1 with O(n + pairs) non-zeros instead of
    O(n · pairs)."""
    require("scipy", "the SiP-Ring LP of the simulator")
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n, m = flows.n, len(flows.src)
    tm = np.asarray(demand, dtype=float)
    if tm.size != int((~flows.dummy).sum()) or not (tm > 0).all():
        raise AllocationError("SiP-Ring LP needs a positive demand for every non-dummy pair")
    tm = tm / tm.max()
    cost = np.zeros(m + n)
    cost[np.flatnonzero(~flows.dummy)] = -1.0 / tm
    start, end, which = intervals(flows.src, flows.dst, n, rule)
    cols = np.arange(m)
    segs = np.arange(n)
    inner = end < n
    # rows 0..n-1: conservation at node v (in − out); rows n..2n-1: load_k − load_{k−1}
    # − Σ_{start = k} f + Σ_{end = k} f = 0
    rows = np.concatenate([flows.dst, flows.src, n + segs, n + segs[1:], n + start,
                           n + end[inner]])
    cidx = np.concatenate([cols, cols, m + segs, m + segs[:-1], which, which[inner]])
    vals = np.concatenate([np.ones(m), -np.ones(m), np.ones(n), -np.ones(n - 1),
                           -np.ones(len(start)), np.ones(int(inner.sum()))])
    a_eq = coo_matrix((vals, (rows, cidx)), shape=(2 * n, m + n)).tocsr()
    bounds = np.concatenate([np.tile([0.0, 1.0], (m, 1)), np.tile([0.0, 1.0], (n, 1))])
    res = linprog(cost, A_eq=a_eq, b_eq=np.zeros(2 * n), bounds=bounds, method="highs")
    if res.status != 0:
        raise AllocationError(f"SiP-Ring LP failed on {n} nodes: {res.message}")
    return np.clip(res.x[:m], 0.0, 1.0)


def round_and_trim(flows: RingFlows, fractions: np.ndarray, wavelengths: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Wavelengths per pair: f·W rounded up with probability of its fraction, then trimmed so
    no segment carries more than W (segments in order, pairs in order, the pair that crosses
    the limit loses the excess and later pairs on that segment get none)."""
    scaled = fractions * wavelengths
    base = np.floor(scaled + 1e-9)
    frac = np.clip(scaled - base, 0.0, 1.0)
    alloc = (base + (rng.random(len(scaled)) <= frac) * (frac > 1e-9)).astype(np.int64)
    totals = flows.cover @ alloc
    for k in np.flatnonzero(totals > wavelengths):  # trimming only lowers later totals
        idx = np.flatnonzero(flows.cover[k])
        a = alloc[idx]
        before = np.cumsum(a) - a
        alloc[idx] = np.minimum(a, np.maximum(0, wavelengths - before))
    return alloc


class SipRingAllocator:
    """Solves and caches the LP per (pairs, rounded demand); rounds afresh every time."""

    def __init__(self, n: int, wavelengths: int, rule: str, seed: int) -> None:
        self.n, self.wavelengths, self.rule = n, wavelengths, rule
        self.rng = np.random.default_rng(seed)
        self._flows: dict[bytes, RingFlows] = {}
        self._fractions: dict[tuple[bytes, bytes], np.ndarray] = {}
        self.solves = 0
        self.lp_size = 0
        """Σ pairs × segments over the LPs solved so far."""

    def _key(self, codes: np.ndarray, demand: np.ndarray) -> tuple[bytes, np.ndarray]:
        q = np.maximum(1, np.rint(demand / demand.max() * DEMAND_QUANTUM)).astype(np.int64)
        return codes.tobytes(), q

    def cached(self, codes: np.ndarray, demand: np.ndarray) -> bool:
        """Whether the LP for these pairs and this (rounded) demand is already solved."""
        key, q = self._key(codes, demand)
        return (key, q.tobytes()) in self._fractions

    def allocate(self, codes: np.ndarray, demand: np.ndarray, draw: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(pair codes, wavelengths, random) of a configuration for demand pairs `codes`
        (sorted, unique) with outstanding `demand`; dummy pairs are left out. With `draw`,
        wavelengths are whole numbers rounded at random as the reference does; without, the
        LP's mean f·W (fractional). `random` tells whether the draw could have come out
        otherwise (some f·W not whole)."""
        key, q = self._key(codes, demand)
        flows = self._flows.get(key)
        if flows is None:
            flows = self._flows[key] = ring_flows(codes, self.n, self.rule)
        fkey = (key, q.tobytes())
        fractions = self._fractions.get(fkey)
        if fractions is None:
            fractions = self._fractions[fkey] = solve_fractions(flows, q.astype(float), self.rule)
            self.solves += 1
            self.lp_size += flows.cover.size
        keep = ~flows.dummy
        scaled = fractions * self.wavelengths
        random = bool((np.abs(scaled - np.rint(scaled)) > 1e-9).any())
        if not draw:
            return flows.codes[keep], scaled[keep], False
        alloc = round_and_trim(flows, fractions, self.wavelengths, self.rng)
        return flows.codes[keep], alloc[keep], random
