"""Plans of the native collectives other than the all-reduce (`oddl.common.collective_kinds`).

Every plan works on one work buffer per rank, cut into blocks at ``(i·n_elems)//N``
(all-to-all: two halves of N blocks each); rank r's own block is block r.

- all-gather / reduce-scatter: the two halves of the ring (N−1 steps, i → i+1) or of
  halving-doubling (log₂N steps, distance doubling / halving), so each rank sends (N−1)/N
  of the buffer. Reduce-scatter leaves the reduced block r at rank r.
- broadcast: a chain from the root, root → root+1 → …, the buffer cut into N−1 pieces that
  follow one another down the chain (2N−3 steps, every hop busy in the middle ones).
- all-to-all: N−1 permutation steps; in step k rank i sends input block i+k to rank i+k,
  which receives it into output block i (a receive offset other than the send offset).
- gather / scatter: one step of N−1 flows to / from the root (the scheduler splits it into
  rounds, the root having one receiver and one transmitter).

`native_plan` picks the builder for a job's algorithm and a kind. Pure.
"""

from __future__ import annotations

import numpy as np

from oddl.common.collective_kinds import ROOTED
from oddl.common.errors import PlanError
from oddl.controller.scheduling.plan import Op, Plan, Step, append_nonempty, read_only
from oddl.controller.scheduling.registry import check_sizes, make_plan

HALVES = {"halving-doubling": "halving-doubling"}
"""Algorithms with their own all-gather and reduce-scatter halves; the others use the ring's."""


def native_plan(algorithm: str, kind: str, n_ranks: int, n_elems: int, root: int = 0,
                **params: object) -> Plan:
    """The plan of collective `kind` for a job running `algorithm` (its all-reduce)."""
    if kind == "all_reduce":
        return make_plan(algorithm, n_ranks, n_elems, **params)
    n, n_elems = check_sizes(kind, n_ranks, n_elems)
    if not 0 <= root < n:
        raise PlanError(f"{kind} root {root} is not a rank of {n}; use 0..{n - 1}")
    if root and kind not in ROOTED:
        raise PlanError(f"{kind} has no root (root {root}); only {', '.join(sorted(ROOTED))} "
                        "take one")
    family = HALVES.get(algorithm, "ring")
    if kind in ("all_gather", "reduce_scatter"):
        build = _hd_half if family == "halving-doubling" else _ring_half
        return build(kind, n, n_elems)
    if kind == "broadcast":
        return broadcast_chain(n, n_elems, root)
    if kind == "all_to_all":
        return all_to_all(n, n_elems)
    if kind in ("gather", "scatter"):
        return root_flows(kind, n, n_elems, root)
    raise PlanError(f"unknown collective kind {kind!r}")


def blocks(n: int, n_elems: int) -> np.ndarray:
    """The N+1 block bounds of a work buffer of `n_elems` elements."""
    return (np.arange(n + 1, dtype=np.int64) * n_elems) // n


def _ring_half(kind: str, n: int, n_elems: int) -> Plan:
    """Ring all-gather (step k: rank i sends block i−k, COPY) or reduce-scatter (block
    i−k−1, REDUCE, so rank i ends with block i reduced)."""
    bounds = blocks(n, n_elems)
    src = read_only(np.arange(n, dtype=np.int64))
    dst = read_only((src + 1) % n)
    gather = kind == "all_gather"
    steps: list[Step] = []
    for k in range(n - 1):
        block = (src - k - (0 if gather else 1)) % n
        off, ln = bounds[block], bounds[block + 1] - bounds[block]
        append_nonempty(steps, src, dst, off, ln, Op.COPY if gather else Op.REDUCE,
                         kind.replace("_", "-"))
    return Plan(f"ring/{kind}", n, n_elems, tuple(steps))


def _hd_half(kind: str, n: int, n_elems: int) -> Plan:
    """Halving-doubling reduce-scatter (distance halving from N/2: the rank whose bit is 0
    keeps the lower half of its block range, so rank i ends with block i) or all-gather
    (distance doubling from 1: each rank sends its whole block range to its partner)."""
    if n & (n - 1):
        lower = 1 << (n.bit_length() - 1)
        raise PlanError(f"halving-doubling {kind} needs a power-of-two number of nodes; got {n}, "
                        f"use {lower} or {lower * 2}, or a ring job")
    bounds = blocks(n, n_elems)
    ranks = read_only(np.arange(n, dtype=np.int64))
    bits = [1 << k for k in range(n.bit_length() - 1)]
    steps: list[Step] = []
    if kind == "reduce_scatter":
        lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n, dtype=np.int64)
        for bit in reversed(bits):
            keep_lower = (ranks & bit) == 0
            mid = (lo + hi) // 2
            send_lo, send_hi = np.where(keep_lower, mid, lo), np.where(keep_lower, hi, mid)
            append_nonempty(steps, ranks, read_only(ranks ^ bit), bounds[send_lo],
                             bounds[send_hi] - bounds[send_lo], Op.REDUCE, "reduce-scatter")
            lo, hi = np.where(keep_lower, lo, mid), np.where(keep_lower, mid, hi)
    else:
        for bit in bits:
            lo = ranks & ~(bit - 1)  # the aligned range of `bit` blocks this rank holds
            append_nonempty(steps, ranks, read_only(ranks ^ bit), bounds[lo],
                             bounds[lo + bit] - bounds[lo], Op.COPY, "all-gather")
    return Plan(f"halving-doubling/{kind}", n, n_elems, tuple(steps))


def broadcast_chain(n: int, n_elems: int, root: int) -> Plan:
    """The root's buffer down the chain root → root+1 → … → root+N−1, cut into N−1 pieces that
    follow one another (COPY): in step s hop h forwards piece s−h, so the hops carry pieces at
    once and the chain takes 2N−3 steps of 1/(N−1) of the buffer, not N−1 steps of all of it
    (a pipeline the slots carry on the optical network too, where each step is a slot)."""
    pieces = min(n - 1, n_elems)
    bounds = (np.arange(pieces + 1, dtype=np.int64) * n_elems) // max(pieces, 1)
    steps: list[Step] = []
    for s in range(pieces + n - 2 if pieces else 0):
        hops = np.array([h for h in range(n - 1) if 0 <= s - h < pieces], dtype=np.int64)
        piece = s - hops
        append_nonempty(steps, read_only((root + hops) % n), read_only((root + hops + 1) % n),
                         bounds[piece], bounds[piece + 1] - bounds[piece], Op.COPY, "chain")
    return Plan("chain/broadcast", n, n_elems, tuple(steps))


def all_to_all(n: int, n_elems: int) -> Plan:
    """N−1 permutation steps over a buffer of 2N equal blocks (input, then output)."""
    if n_elems % (2 * n):
        raise PlanError(f"all_to_all needs a work buffer of 2·N equal blocks (input and "
                        f"output); {n_elems} elements do not split into {2 * n}")
    m, half = n_elems // (2 * n), n_elems // 2
    ranks = read_only(np.arange(n, dtype=np.int64))
    steps: list[Step] = []
    for k in range(1, n if m else 0):
        peer = read_only((ranks + k) % n)
        steps.append(Step(ranks, peer, read_only(peer * m), read_only(np.full(n, m)), Op.COPY,
                          "permutation", read_only(half + ranks * m)))
    return Plan("permutation/all_to_all", n, n_elems, tuple(steps))


def root_flows(kind: str, n: int, n_elems: int, root: int) -> Plan:
    """Gather: every other rank's block to the root; scatter: the root's block j to rank j."""
    bounds = blocks(n, n_elems)
    others = read_only(np.delete(np.arange(n, dtype=np.int64), root))
    hub = read_only(np.full(n - 1, root, dtype=np.int64))
    src, dst = (others, hub) if kind == "gather" else (hub, others)
    steps: list[Step] = []
    append_nonempty(steps, src, dst, bounds[others], bounds[others + 1] - bounds[others],
                     Op.COPY, kind)
    return Plan(f"flows/{kind}", n, n_elems, tuple(steps))
