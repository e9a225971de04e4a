"""TopoOpt's TotientPerms: ring jumps from Euler's totient, picked geometrically (papers.md §3).

- `candidate_jumps` (``SpMulMat::construct_candidate_jumps`` [authors' code]): for an
  all-reduce group of size g | n, the jumps ``J(g) = {(n/g)·k : 1 ≤ k ≤ g, gcd(k, g) = 1}``;
  each gives a ring i → i+p that visits all g members of a group.
- `select_permutations` (``choose_n_geo`` [authors' code]): degree d gives d/2 picks from
  J(n), geometrically spaced between min J and max J; each pick p also brings n−p (links are
  bidirectional).
- `totientperms_allreduce`: the buffer is split into one part per chosen ring and each part
  is ring all-reduced (reduce-scatter, all-gather) on its ring; the rings run concurrently, so
  their steps are merged step by step. A node has one transmitter on the TT-FR fabric, so the
  scheduler splits every merged step into rounds.

[reconstruction] Kept configurable: whether a pick's reverse ring n−p also carries a part
(``both_directions``), and what a pick does when no unused candidate ≥ c is left (it takes the
largest unused one below c; the table rows of papers.md §3.2 never get there).
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left

import numpy as np

from oddl.controller.scheduling.collectives import (
    Op,
    Plan,
    Step,
    _check_sizes,
    read_only,
    register_collective,
)
from oddl.errors import PlanError


def candidate_jumps(n: int, g: int) -> tuple[int, ...]:
    """Return J(g) = {(n/g)·k : 1 ≤ k ≤ g, gcd(k, g) = 1}, ascending (|J(g)| = φ(g))."""
    n, g = _whole(n, "n"), _whole(g, "g")
    if n < 1 or g < 1 or n % g:
        divisors = [d for d in range(1, n + 1) if n % d == 0][:12] if n >= 1 else []
        raise PlanError(
            f"candidate jumps need a group size g that divides n; got n={n}, g={g} "
            f"(divisors of n: {divisors or 'none'})"
        )
    k = np.arange(1, g + 1, dtype=np.int64)
    return tuple(((n // g) * k[np.gcd(k, g) == 1]).tolist())


def max_degree(n: int) -> int:
    """Return the largest degree `select_permutations` serves on n nodes.

    Each pick p also uses n−p, so J(n) yields at most ⌊φ(n)/2⌋ distinct rings (φ(n) for
    n ≥ 3); on n ≤ 2 the single ring has degree 2.
    """
    n = _whole(n, "n")
    if n < 1:
        raise PlanError(f"TotientPerms needs at least 1 node; got {n}")
    return max(2, 2 * (len(candidate_jumps(n, n)) // 2))


def check_degree(n: int, degree: int) -> int:
    """Return `degree` if n nodes can serve it, else raise PlanError with the nearest valid one."""
    d = _whole(degree, "degree")
    top = max_degree(n)
    if d < 2:
        raise PlanError(f"totientperms degree must be >= 2 (one ring); got {d}, use 2")
    if d > top:
        raise PlanError(
            f"totientperms degree {d} is too large for {n} nodes: J({n}) has "
            f"{len(candidate_jumps(n, n))} jumps and each jump p also uses {n}-p, so there "
            f"are at most {top // 2} distinct ring(s) and the degree is at most {top}; use {top}"
        )
    if d % 2:
        near = [x for x in (d - 1, d + 1) if 2 <= x <= top]
        raise PlanError(
            f"totientperms degree {d} is odd: each jump p also brings n-p, so the degree is "
            f"even; use {' or '.join(map(str, near))}"
        )
    return d


def select_permutations(n: int, degree: int) -> tuple[int, ...]:
    """Return the jump set for `degree` on n nodes, ascending and including every n−p.

    Geometric pick over J(n): ``r = (max J / min J)^(1/(d/2))``, ``c = min J``; take the
    smallest unused candidate ≥ c (used: the picks and their n−p), then ``c ← c·r``.
    """
    n = _whole(n, "n")
    if n < 2:
        raise PlanError(f"select_permutations needs at least 2 nodes; got {n}")
    d = check_degree(n, degree)
    cand = candidate_jumps(n, n)
    picks = d // 2
    r = (cand[-1] / cand[0]) ** (1.0 / picks)
    used: set[int] = set()
    c = float(cand[0])
    for _ in range(picks):
        i = bisect_left(cand, c - 1e-9 * c)
        p = next((x for x in cand[i:] if x not in used), None)
        if p is None:
            p = max(x for x in cand if x not in used)
        used.update((p, n - p))
        c *= r
    return tuple(sorted(used))


def ring_jumps(n: int, degree: int, both_directions: bool = False) -> tuple[int, ...]:
    """Return the jumps that carry a part of the all-reduce: one per pick p (p ≤ n−p), or
    every jump of the set with `both_directions`."""
    if _whole(n, "n") < 2:
        return ()
    jumps = select_permutations(n, degree)
    return jumps if both_directions else tuple(p for p in jumps if p <= n - p)


def circulant_diameter(n: int, jumps: tuple[int, ...] | list[int]) -> int:
    """Return the diameter of the circulant graph i → i+p (mod n), p in `jumps`, by BFS.

    Raises PlanError if the jumps do not connect all n nodes.
    """
    n = _whole(n, "n")
    if n < 1:
        raise PlanError(f"a circulant graph needs at least 1 node; got {n}")
    steps = np.unique(np.asarray(list(jumps), dtype=np.int64) % n)
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = np.zeros(1, dtype=np.int64)
    depth = 0
    while True:
        nxt = np.unique((frontier[:, None] + steps[None, :]).ravel() % n)
        nxt = nxt[~seen[nxt]]
        if not len(nxt):
            break
        seen[nxt] = True
        frontier = nxt
        depth += 1
    if not seen.all():
        g = math.gcd(n, *steps.tolist()) if len(steps) else n
        raise PlanError(
            f"jumps {sorted(set(int(p) for p in jumps))} do not connect {n} nodes (they only "
            f"reach multiples of {g}); add a jump coprime to {n}"
        )
    return depth


@register_collective("totientperms")
def totientperms_allreduce(
    n_ranks: int, n_elems: int, *, degree: int = 2, both_directions: bool = False
) -> Plan:
    """TotientPerms all-reduce: one ring all-reduce per chosen jump, on its own part.

    2(N−1) merged steps; step k holds, for every ring, that ring's k-th ring step. Ring p
    visits ranks 0, p, 2p, … (mod N); its part of the buffer is cut into N chunks.
    """
    n, n_elems = _check_sizes("totientperms", n_ranks, n_elems)
    if not isinstance(both_directions, bool):
        raise PlanError(f"both_directions must be True or False; got {both_directions!r}")
    check_degree(n, degree)
    jumps = ring_jumps(n, degree, both_directions)
    if n == 1 or n_elems == 0:
        return Plan("totientperms", n, n_elems, ())
    rings = len(jumps)
    part = (np.arange(rings + 1, dtype=np.int64) * n_elems) // rings
    frac = (np.arange(n + 1, dtype=np.int64) * np.diff(part)[:, None]) // n  # (rings, n+1)
    off = part[:-1, None] + frac[:, :-1]
    ln = np.diff(frac, axis=1)
    # Transfer t = pos·rings + r is ring r's sender at position pos; a step's segments are
    # one contiguous slice of the doubled chunk table: ext[(pos + j)·rings + r] is chunk
    # (pos + j) mod n of part r, so steps share src/dst and their offsets are views.
    ext_off = read_only(np.concatenate((off, off), axis=1).T.ravel())
    ext_len = read_only(np.concatenate((ln, ln), axis=1).T.ravel())
    pos = np.arange(n, dtype=np.int64)[:, None]
    p = np.asarray(jumps, dtype=np.int64)[None, :]
    src = read_only(((pos * p) % n).ravel())
    dst = read_only((((pos + 1) * p) % n).ravel())
    full = bool((ln > 0).all())
    steps: list[Step] = []
    for phase, op, shift in (("reduce-scatter", Op.REDUCE, 0), ("all-gather", Op.COPY, 1)):
        for k in range(n - 1):
            j = (shift - k) % n
            o = ext_off[j * rings : (j + n) * rings]
            m = ext_len[j * rings : (j + n) * rings]
            if full:
                steps.append(Step(src, dst, o, m, op, phase))
            else:
                keep = m > 0
                if keep.any():
                    steps.append(
                        Step(
                            read_only(src[keep]),
                            read_only(dst[keep]),
                            read_only(o[keep]),
                            read_only(m[keep]),
                            op,
                            phase,
                        )
                    )
    return Plan("totientperms", n, n_elems, tuple(steps))


def _whole(x: object, name: str) -> int:
    try:
        return operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        raise PlanError(f"{name} must be a whole number; got {x!r}") from None
