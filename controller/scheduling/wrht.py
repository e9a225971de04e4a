"""WRHT: wavelength-reused hierarchical tree all-reduce on an optical ring (docs/sources.md §2).

N ranks sit on a ring in rank order; every fibre carries W wavelengths. The all-reduce is a
tree of fan-in m:

- reduce, level ℓ = 0 .. L−1: the ranks still active (all ranks at level 0, then the roots of
  the level below) are cut into consecutive groups of at most m; every member sends its
  WHOLE buffer to its group's root at once (REDUCE), each on its own wavelength;
- broadcast, level ℓ = L−1 .. 0: every root sends the sum back to its members (COPY).

With L = ⌈log_m N⌉ this is 2⌈log_m N⌉ steps. On a bidirectional ring the root is the middle
member: the members left of it send clockwise, those right of it anticlockwise, so the
busiest fibre segment (next to the root) carries ⌈(m−1)/2⌉ lightpaths and m ≤ 2W+1. On a
unidirectional ring the root is the last member and m ≤ W+1. Every lightpath stays inside
its group's arc and the arcs of one level are disjoint, so all groups reuse the same
wavelengths and the count does not depend on N.

[reconstruction, docs/sources.md §2: verify against arXiv 2207.10982] Everything above beyond the
fan-in bound and the step count: the consecutive grouping, the root placement, the groups
of near-equal size (``balanced``; ``balanced=False`` gives groups of exactly m and a short
last group), and the link budget below with its default values. The paper's "level ℓ uses
the nodes ≡ 0 (mod mˡ)" does not fit middle roots; here level ℓ uses the roots of level ℓ−1.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from oddl.common.errors import PlanError
from oddl.controller.scheduling.link_budget import BudgetCheck, LinkBudget, link_budget
from oddl.controller.scheduling.plan import Op, Plan, Step, read_only
from oddl.controller.scheduling.registry import check_sizes, register_collective

DEFAULT_WAVELENGTHS = 4
"""Wavelengths per fibre on the four-node testbed."""


@dataclass(frozen=True)
class WrhtStepLambda:
    """Wavelengths and the longest path of one WRHT step."""

    step: int
    phase: str
    """``"reduce"`` or ``"broadcast"``."""
    level: int
    groups: int
    largest_group: int
    wavelengths: int
    """Wavelengths on the busiest fibre segment (the same set in every group)."""
    max_hops: int
    """Intermediate nodes passed by the longest lightpath."""
    budget: BudgetCheck


@dataclass(frozen=True)
class WrhtWavelengthPlan:
    """Per-step wavelength needs and link budget of a WRHT all-reduce."""

    n_ranks: int
    wavelengths: int
    """Wavelengths available per fibre (W)."""
    group_size: int
    bidirectional: bool
    balanced: bool
    budget: LinkBudget
    steps: tuple[WrhtStepLambda, ...]

    @property
    def wavelengths_needed(self) -> int:
        """Most wavelengths any step needs (0 without steps)."""
        return max((s.wavelengths for s in self.steps), default=0)

    @property
    def worst_slack_db(self) -> float:
        """Smallest link-budget slack over all steps (inf without steps)."""
        return min((s.budget.slack_db for s in self.steps), default=math.inf)

    @property
    def ok(self) -> bool:
        """Whether every step fits in W wavelengths and closes its link budget."""
        return self.wavelengths_needed <= self.wavelengths and all(s.budget.ok for s in self.steps)

    def check(self) -> None:
        """Raise PlanError naming the numbers and the nearest working W or m unless `ok`."""
        ring = "bidirectional" if self.bidirectional else "unidirectional"
        n, w, m = self.n_ranks, self.wavelengths, self.group_size
        need = self.wavelengths_needed
        m_fit = max_group_size(w, self.bidirectional)
        if need > w:
            worst = max(self.steps, key=lambda s: s.wavelengths)
            raise PlanError(
                f"wrht on {n} nodes with group size m={m} on a {ring} ring needs {need} "
                f"wavelengths (step {worst.step}, {worst.phase} level {worst.level}); W={w} is too "
                f"few: use wavelengths >= {need}, or group_size <= {m_fit}"
            )
        bad = [s for s in self.steps if not s.budget.ok]
        if not bad:
            return
        worst = min(bad, key=lambda s: s.budget.slack_db)
        c = worst.budget
        limit = self.budget.max_hops()
        allowed = "no path closes" if limit == -1 else f"at most {limit} nodes may be passed"
        fix = _nearest_group_size(n, w, self.bidirectional, self.balanced, self.budget, m)
        hint = (
            f"use group_size={fix}"
            if fix is not None
            else f"no group size 2..{max(2, min(m_fit, n))} closes it on "
            f"{n} nodes; use fewer nodes, a lower il_through_db or a stronger p_tx_dbm"
        )
        raise PlanError(
            f"wrht on {n} nodes (W={w}, m={m}, {ring} ring) fails the link budget at step "
            f"{worst.step} ({worst.phase} level {worst.level}): its longest path passes "
            f"{c.hops} nodes, loss {c.loss_db:.2f} dB, received {c.rx_dbm:.2f} dBm < "
            f"S_rx + margin = {c.required_dbm:.2f} dBm (short by {-c.slack_db:.2f} dB; "
            f"{allowed}); {hint}"
        )


def max_group_size(wavelengths: int, bidirectional: bool = True) -> int:
    """Return the largest fan-in W wavelengths allow: 2W+1 (bidirectional) or W+1."""
    return 2 * wavelengths + 1 if bidirectional else wavelengths + 1


def wrht_wavelength_plan(
    n_ranks: int,
    wavelengths: int = DEFAULT_WAVELENGTHS,
    *,
    group_size: int | None = None,
    bidirectional: bool = True,
    balanced: bool = True,
    budget: LinkBudget | None = None,
) -> WrhtWavelengthPlan:
    """Compute the wavelengths and the link budget of every WRHT step (does not raise on misfit).

    `group_size` defaults to ``min(max_group_size(W), N)``; a larger one is evaluated as
    given, so `check` reports the wavelengths it would need.
    """
    n, w, m = _check_wrht_args(
        n_ranks, wavelengths, group_size, bidirectional, balanced, limit=False
    )
    budget = budget or LinkBudget()
    levels = _levels(n, m, bidirectional, balanced)
    steps: list[WrhtStepLambda] = []
    order = [("reduce", lv) for lv in range(len(levels))]
    order += [("broadcast", lv) for lv in reversed(range(len(levels)))]
    for i, (phase, lv) in enumerate(order):
        x = levels[lv]
        steps.append(
            WrhtStepLambda(
                i,
                phase,
                lv,
                x.groups,
                x.largest,
                x.wavelengths,
                x.max_hops,
                link_budget(x.max_hops, budget),
            )
        )
    return WrhtWavelengthPlan(n, w, m, bidirectional, balanced, budget, tuple(steps))


@register_collective("wrht")
def wrht_allreduce(
    n_ranks: int,
    n_elems: int,
    *,
    wavelengths: int = DEFAULT_WAVELENGTHS,
    bidirectional: bool = True,
    group_size: int | None = None,
    balanced: bool = True,
    budget: LinkBudget | None = None,
) -> Plan:
    """WRHT tree all-reduce: 2⌈log_m N⌉ steps of whole-buffer transfers, m ≤ 2W+1 (or W+1).

    Refuses (PlanError) a group size above what W allows and a tree whose longest path fails
    the link budget, naming the numbers and the nearest working W or m.
    """
    n, n_elems = check_sizes("wrht", n_ranks, n_elems)
    n, w, m = _check_wrht_args(n, wavelengths, group_size, bidirectional, balanced, limit=True)
    if n == 1:
        return Plan("wrht", n, n_elems, ())
    levels = _levels(n, m, bidirectional, balanced)
    budget = budget or LinkBudget()
    worst = max(x.max_hops for x in levels)
    if not link_budget(worst, budget).ok:
        wrht_wavelength_plan(
            n, w, group_size=m, bidirectional=bidirectional, balanced=balanced, budget=budget
        ).check()
    if n_elems == 0:
        return Plan("wrht", n, n_elems, ())
    widest = max(len(x.members) for x in levels)
    zeros = read_only(np.zeros(widest, dtype=np.int64))
    whole = read_only(np.full(widest, n_elems, dtype=np.int64))
    def step(x: _Level, lv: int, up: bool) -> Step:
        src, dst = (x.members, x.roots) if up else (x.roots, x.members)
        k = len(x.members)
        return Step(src, dst, zeros[:k], whole[:k], Op.REDUCE if up else Op.COPY,
                    f"{'reduce' if up else 'broadcast'} level {lv}")

    steps = [step(x, lv, True) for lv, x in enumerate(levels)]
    steps += [step(x, lv, False) for lv, x in reversed(list(enumerate(levels)))]
    return Plan("wrht", n, n_elems, tuple(steps))


def wrht_levels(n_ranks: int, group_size: int) -> int:
    """Return L = ⌈log_m N⌉, the number of tree levels (the plan has 2L steps)."""
    n, m = operator.index(n_ranks), operator.index(group_size)
    if n < 1 or m < 2:
        raise PlanError(f"wrht_levels needs N >= 1 and m >= 2; got N={n}, m={m}")
    levels, reach = 0, 1
    while reach < n:
        reach *= m
        levels += 1
    return levels


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Level:
    members: np.ndarray
    """Non-root members of every group, ascending (read-only)."""
    roots: np.ndarray
    """Each member's root (read-only)."""
    groups: int
    largest: int
    wavelengths: int
    max_hops: int


def _levels(n: int, m: int, bidirectional: bool, balanced: bool) -> list[_Level]:
    """Cut the active ranks into groups level by level until one root is left."""
    active = np.arange(n, dtype=np.int64)
    out: list[_Level] = []
    while len(active) > 1:
        k = len(active)
        g = -(-k // m)
        if balanced:
            bounds = (np.arange(g + 1, dtype=np.int64) * k) // g
        else:
            bounds = np.minimum(np.arange(g + 1, dtype=np.int64) * m, k)
        start, size = bounds[:-1], np.diff(bounds)
        root_pos = start + (size // 2 if bidirectional else size - 1)
        group = np.repeat(np.arange(g), size)
        is_member = np.arange(k) != root_pos[group]
        members = active[is_member]
        roots = active[root_pos[group[is_member]]]
        if bidirectional:
            lam = int(max((root_pos - start).max(), (start + size - 1 - root_pos).max()))
        else:
            lam = int(size.max()) - 1
        hops = int(np.abs(roots - members).max()) - 1
        out.append(_Level(read_only(members), read_only(roots), g, int(size.max()), lam, hops))
        active = active[root_pos]
    return out


def _check_wrht_args(
    n_ranks: int,
    wavelengths: int,
    group_size: int | None,
    bidirectional: bool,
    balanced: bool,
    *,
    limit: bool,
) -> tuple[int, int, int]:
    try:
        n = operator.index(n_ranks)
        w = operator.index(wavelengths)
        m_req = None if group_size is None else operator.index(group_size)
    except TypeError:
        raise PlanError(
            f"wrht needs whole numbers for nodes, wavelengths and group_size; got {n_ranks!r}, "
            f"{wavelengths!r} and {group_size!r}"
        ) from None
    if not isinstance(bidirectional, bool):
        raise PlanError(f"wrht bidirectional must be True or False; got {bidirectional!r}")
    if not isinstance(balanced, bool):
        raise PlanError(f"wrht balanced must be True or False; got {balanced!r}")
    if n < 1:
        raise PlanError(f"wrht needs at least 1 node; got {n}")
    if w < 1:
        raise PlanError(f"wrht needs at least 1 wavelength; got W={w}, use wavelengths >= 1")
    m_max = max_group_size(w, bidirectional)
    if m_req is None:
        return n, w, max(2, min(m_max, n))
    if m_req < 2:
        raise PlanError(f"wrht group_size must be >= 2; got {m_req}, use 2..{m_max}")
    if limit and m_req > m_max:
        ring = "bidirectional" if bidirectional else "unidirectional"
        need = -(-(m_req - 1) // 2) if bidirectional else m_req - 1
        raise PlanError(
            f"wrht group_size {m_req} needs {need} wavelengths on a {ring} ring; W={w} allows "
            f"m <= {m_max}: use group_size <= {m_max} or wavelengths >= {need}"
        )
    return n, w, m_req


def _nearest_group_size(
    n: int, w: int, bidirectional: bool, balanced: bool, budget: LinkBudget, m: int
) -> int | None:
    """Return the working group size closest to `m` (larger first on ties), or None."""
    top = max(2, min(max_group_size(w, bidirectional), n))
    limit = budget.max_hops()
    if limit is not None and limit < 0:
        return None
    for d in range(top):
        for cand in (m + d, m - d):
            if 2 <= cand <= top and all(
                limit is None or x.max_hops <= limit
                for x in _levels(n, cand, bidirectional, balanced)
            ):
                return cand
    return None
