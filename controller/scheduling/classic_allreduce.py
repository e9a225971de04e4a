"""The two classic all-reduce plans, registered as ``ring`` and ``halving-doubling``.

A plan is the steps of transfers of `oddl.controller.scheduling.plan`; `make_plan` finds these
builders by name (`oddl.controller.scheduling.registry`). Pure.
"""

from __future__ import annotations

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step, append_nonempty, read_only
from oddl.controller.scheduling.registry import check_sizes, register_collective


@register_collective("ring")
def ring_allreduce(n_ranks: int, n_elems: int) -> Plan:
    """Ring all-reduce: reduce-scatter then all-gather, 2(N−1) steps, i → i+1 in every step.

    The buffer is cut into N chunks whose sizes differ by at most one element. In
    reduce-scatter step k rank i sends chunk (i−k) mod N (REDUCE); afterwards rank i holds
    the full sum of chunk (i+1) mod N. In all-gather step k it sends chunk (i+1−k) mod N
    (COPY). N = 1 gives zero steps.
    """
    n, n_elems = check_sizes("ring", n_ranks, n_elems)
    bounds = (np.arange(n + 1, dtype=np.int64) * n_elems) // n
    # Rotations of the chunk table as views: ext[j:j+n][i] describes chunk (i+j) mod n.
    ext_off = read_only(np.concatenate((bounds[:-1], bounds[:-1])))
    ext_len = read_only(np.concatenate((np.diff(bounds), np.diff(bounds))))
    src = read_only(np.arange(n, dtype=np.int64))
    dst = read_only((src + 1) % n)
    full = n_elems >= n  # every chunk is non-empty: all steps share src and dst
    steps: list[Step] = []
    for phase, op, shift in (("reduce-scatter", Op.REDUCE, 0), ("all-gather", Op.COPY, 1)):
        for k in range(n - 1):
            j = (shift - k) % n
            off, ln = ext_off[j : j + n], ext_len[j : j + n]
            if full:
                steps.append(Step(src, dst, off, ln, op, phase))
            else:
                append_nonempty(steps, src, dst, off, ln, op, phase)
    return Plan("ring", n, n_elems, tuple(steps))


@register_collective("halving-doubling")
def halving_doubling_allreduce(n_ranks: int, n_elems: int) -> Plan:
    """Halving-doubling (Rabenseifner) all-reduce: 2·log₂N steps, power-of-two N only.

    Reduce-scatter by recursive vector halving with distance doubling: in step k (k = 0 ..
    log₂N−1) rank i and its partner i XOR 2^k split their common segment [lo, mid, hi);
    the rank whose bit k is 0 keeps the lower half and sends the upper (REDUCE), the other the
    reverse. All-gather mirrors it (distance halving, vector doubling): each rank sends its
    whole owned segment to i XOR 2^k (COPY), for k = log₂N−1 down to 0.
    """
    n, n_elems = check_sizes("halving-doubling", n_ranks, n_elems)
    if n & (n - 1):
        lower = 1 << (n.bit_length() - 1)
        raise PlanError(
            f"halving-doubling needs a power-of-two number of nodes; got {n}, use {lower} or "
            f"{lower * 2}, or the ring"
        )
    ranks = read_only(np.arange(n, dtype=np.int64))
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, n_elems, dtype=np.int64)
    owned: list[tuple[np.ndarray, np.ndarray]] = []
    partners: list[np.ndarray] = []
    steps: list[Step] = []
    for k in range(n.bit_length() - 1):
        bit = 1 << k
        partner = read_only(ranks ^ bit)
        keep_lower = (ranks & bit) == 0
        mid = lo + (hi - lo) // 2
        off = np.where(keep_lower, mid, lo)
        ln = np.where(keep_lower, hi - mid, mid - lo)
        append_nonempty(steps, ranks, partner, off, ln, Op.REDUCE, "reduce-scatter")
        lo, hi = np.where(keep_lower, lo, mid), np.where(keep_lower, mid, hi)
        owned.append((lo, hi))
        partners.append(partner)
    for k in reversed(range(len(owned))):
        lo, hi = owned[k]
        append_nonempty(steps, ranks, partners[k], lo, hi - lo, Op.COPY, "all-gather")
    return Plan("halving-doubling", n, n_elems, tuple(steps))
