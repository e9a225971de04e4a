"""TopoOpt's TotientPerms: ring jumps from Euler's totient, picked geometrically (docs/sources.md §3).

- `candidate_jumps` (``SpMulMat::construct_candidate_jumps`` [authors' code]): for an
  all-reduce group of size g | n, the jumps ``J(g) = {(n/g)·k : 1 ≤ k ≤ g, gcd(k, g) = 1}``;
  each gives a ring i → i+p that visits all g members of a group.
- `choose_geometric` (``SpMulMat::choose_n_geo`` with ``bidir = true`` [authors' code],
  hipersys-team/FlexFlow ``src/runtime/network.cc``): m picks from a candidate list, its
  floating-point steps reproduced exactly (docs/explanation/topoopt.md §2.1). `select_permutations`
  gives degree d its d/2 picks from J(n) and adds every pick's reverse n−p (links are
  bidirectional).
- `totientperms_allreduce`: the buffer is split into one part per chosen ring and each part
  is ring all-reduced (reduce-scatter, all-gather) on its ring; the rings run concurrently, so
  their steps are merged step by step. A node has one transmitter on the TT-FR fabric, so the
  scheduler splits every merged step into rounds.

The authors' picks exclude only earlier picks, not their reverses, so from degree 10 on (e.g.
n = 11, d = 10: picks 1, 2, 3, 4, 7 with 7 = 11 − 4) a pick can be the reverse of another:
the node pair then gets two circuits. That is the default (it is what their simulator
builds); ``distinct=True`` (ours) skips such candidates instead. Kept configurable too:
whether a pick's reverse ring n−p also carries a part (``both_directions``).
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step, append_nonempty, read_only
from oddl.controller.scheduling.registry import check_sizes, register_collective


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


def max_degree(n: int, distinct: bool = False) -> int:
    """Return the largest degree `select_permutations` serves on n nodes.

    The authors' generator takes up to φ(n) picks (every candidate once, each bringing its
    reverse), so degree 2·φ(n); with ``distinct`` a pick may not be another's reverse, so at
    most ⌊φ(n)/2⌋ picks for n ≥ 3. On n ≤ 2 the single ring has degree 2.
    """
    n = _whole(n, "n")
    if n < 1:
        raise PlanError(f"TotientPerms needs at least 1 node; got {n}")
    phi = len(candidate_jumps(n, n))
    return max(2, 2 * (phi // 2) if distinct else 2 * phi)


def check_degree(n: int, degree: int, distinct: bool = False) -> int:
    """Return `degree` if n nodes can serve it, else raise PlanError with the nearest valid one."""
    d = _whole(degree, "degree")
    top = max_degree(n, distinct)
    if d < 2:
        raise PlanError(f"totientperms degree must be >= 2 (one ring); got {d}, use 2")
    if d > top:
        phi = len(candidate_jumps(n, n))
        why = (f"each jump p also uses {n}-p, so there are at most {top // 2} distinct ring(s)"
               if distinct else f"each of the {top // 2} pick(s) is one of them")
        raise PlanError(
            f"totientperms degree {d} is too large for {n} nodes: J({n}) has {phi} jumps and "
            f"{why}, so the degree is at most {top}; use {top}"
        )
    if d % 2:
        near = [x for x in (d - 1, d + 1) if 2 <= x <= top]
        raise PlanError(
            f"totientperms degree {d} is odd: each jump p also brings n-p, so the degree is "
            f"even; use {' or '.join(map(str, near))}"
        )
    return d


def choose_geometric(
    cands: tuple[int, ...] | list[int], picks: int, *, reverse_of: int = 0
) -> tuple[int, ...]:
    """Return `picks` candidates geometrically spaced over ascending `cands` (ascending).

    The authors' ``choose_n_geo`` (bidirectional): one pick is ``cands[0]``; otherwise
    ``ratio = (cands[-1] / cands[0]) ** (1 / picks)`` and ``c = cands[0]`` as doubles; each
    round takes the first candidate ≥ c (a lower bound, compared exactly), steps past earlier
    picks, and multiplies c by ratio. With ``reverse_of = n`` (ours, ``distinct``) it also
    steps past the reverses n−p of earlier picks, and when nothing ≥ c is left takes the
    largest free candidate below c. Raises PlanError where the authors' code would read past
    the end of the list (never seen for any n ≤ 4096 we tried, tests/data).
    """
    if not 1 <= picks <= len(cands):
        raise PlanError(f"cannot pick {picks} of {len(cands)} candidate jumps; use 1 to {len(cands)}")
    if picks == 1:
        return (cands[0],)
    ratio = (cands[-1] / cands[0]) ** (1.0 / picks)
    taken: set[int] = set()
    c = float(cands[0])
    for _ in range(picks):
        i = bisect_left(cands, c)
        while i < len(cands) and (cands[i] in taken or (reverse_of and reverse_of - cands[i] in taken)):
            i += 1
        if i < len(cands):
            p = cands[i]
        elif reverse_of:
            free = [x for x in cands if x not in taken and reverse_of - x not in taken]
            if not free:
                raise PlanError(f"no free candidate jump left for pick {len(taken) + 1} of {picks}")
            p = free[-1]
        else:
            raise PlanError(
                f"the authors' geometric pick runs past the last candidate ({cands[-1]}) at pick "
                f"{len(taken) + 1} of {picks}; use a smaller degree or distinct=True"
            )
        taken.add(p)
        c *= ratio
    return tuple(sorted(taken))


def totient_picks(n: int, degree: int, g: int | None = None, distinct: bool = False) -> tuple[int, ...]:
    """Return the d/2 picks (one ring each) for an all-reduce group of size g (default n)."""
    n = _whole(n, "n")
    if n < 2:
        raise PlanError(f"select_permutations needs at least 2 nodes; got {n}")
    g = n if g is None else _whole(g, "g")
    if g == n:
        d = check_degree(n, degree, distinct)
    else:
        d = _whole(degree, "degree")
        if d < 2 or d % 2:
            raise PlanError(f"a group's ring degree must be even and >= 2; got {d}")
    return choose_geometric(candidate_jumps(n, g), d // 2, reverse_of=n if distinct else 0)


def select_permutations(n: int, degree: int, distinct: bool = False) -> tuple[int, ...]:
    """Return the jump set for `degree` on n nodes: every pick p and its reverse n−p, ascending.

    A jump appears twice where the authors' picks hold both p and n−p (degree ≥ 10; two
    circuits per node pair), so the tuple always has `degree` entries (n = 2: jump 1 twice).
    """
    picks = totient_picks(n, degree, None, distinct)
    return tuple(sorted(picks + tuple(n - p for p in picks)))


def ring_jumps(
    n: int, degree: int, both_directions: bool = False, distinct: bool = False
) -> tuple[int, ...]:
    """Return the jumps that carry a part of the all-reduce: the picks, or every jump of the
    set (picks and reverses) with `both_directions`."""
    if _whole(n, "n") < 2:
        return ()
    if both_directions:
        return select_permutations(n, degree, distinct)
    return totient_picks(n, degree, None, distinct)


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
    n_ranks: int,
    n_elems: int,
    *,
    degree: int = 2,
    both_directions: bool = False,
    distinct: bool = False,
) -> Plan:
    """TotientPerms all-reduce: one ring all-reduce per chosen jump, on its own part.

    2(N−1) merged steps; step k holds, for every ring, that ring's k-th ring step. Ring p
    visits ranks 0, p, 2p, … (mod N); its part of the buffer is cut into N chunks. A jump the
    authors' picks repeat (degree ≥ 10) carries two parts.
    """
    n, n_elems = check_sizes("totientperms", n_ranks, n_elems)
    if not isinstance(both_directions, bool):
        raise PlanError(f"both_directions must be True or False; got {both_directions!r}")
    if not isinstance(distinct, bool):
        raise PlanError(f"distinct must be True or False; got {distinct!r}")
    check_degree(n, degree, distinct)
    return rings_allreduce(n, n_elems, ring_jumps(n, degree, both_directions, distinct),
                           "totientperms")


def rings_allreduce(n: int, n_elems: int, jumps: tuple[int, ...], name: str) -> Plan:
    """One ring all-reduce per jump p (ring 0, p, 2p, … mod n, p coprime to n), each on its
    own part of the buffer, all rings in the same merged steps; the plan is called `name`."""
    if n == 1 or n_elems == 0:
        return Plan(name, n, n_elems, ())
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
    full = bool((ln > 0).all())  # checked once: at 1024 nodes a check per step costs 2.4x
    steps: list[Step] = []
    for phase, op, shift in (("reduce-scatter", Op.REDUCE, 0), ("all-gather", Op.COPY, 1)):
        for k in range(n - 1):
            j = (shift - k) % n
            o = ext_off[j * rings : (j + n) * rings]
            m = ext_len[j * rings : (j + n) * rings]
            if full:
                steps.append(Step(src, dst, o, m, op, phase))
            else:
                append_nonempty(steps, src, dst, o, m, op, phase)
    return Plan(name, n, n_elems, tuple(steps))


def _whole(x: object, name: str) -> int:
    try:
        return operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        raise PlanError(f"{name} must be a whole number; got {x!r}") from None
