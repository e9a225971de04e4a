"""Which receives of a step-by-step run may land straight in the destination (issue 36).

A posted receive writes a COPY segment into the caller's buffer the moment its bytes arrive,
instead of into a stream buffer the executor copies out of when it reaches that step. The
bytes can then land at any time after the sender started the step (it snapshots what it
sends then) and before this node finishes the step. That is exact only if every access of
this node to an overlapping range that, in plan order, comes before the landing is over by
then:

- a send of this node in a step ``j <= k`` reading an overlapping range (it would send the
  landed bytes instead of the old ones);
- a receive of this node in a step ``j < k`` into an overlapping range (a REDUCE would add
  onto the landed bytes, a COPY would overwrite them).

The only order a run guarantees is the plan's: a rank starts step ``m + 1`` after it has
received everything of step ``m``. So a send of this node to ``p`` in step ``j`` is over when
``p`` starts ``j + 1``, a receive of this node in step ``j`` when this node starts ``j + 1``,
and a receive of step ``k`` from ``s`` may land directly when each such event precedes ``s``
starting step ``k`` along those edges (`_earliest`, a forward sweep from the event). This is
what makes the all-gather half of the ring exact (the value that arrives went through this
node's own send). Where no such order exists the proof says no: 2 of the 24 COPY receives of
a forwarded all-to-all over a 4-rank ring (`oddl.controller.scheduling.forwarding`).

REDUCE receives never land directly (the reduction needs both operands). Pipelined runs
(`oddl.agents.collective.pipelined`) start sends per chunk, earlier than these edges assume;
this proof is for step-by-step runs only. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from oddl.protos.schedule_shapes import StepShape


class PlanStep(StepShape, Protocol):
    """The parts of a plan's step this proof reads (a scheduling `Step` or the agent's): the
    encoders' step and where each transfer lands."""

    @property
    def landing(self) -> np.ndarray: ...


def direct_receives(steps: Sequence[PlanStep], n_ranks: int, me: int
                    ) -> set[tuple[int, int]]:
    """The (step, transfer index) receives of rank `me` that may land straight in its buffer
    in a step-by-step run (see the module docstring); every other receive keeps the stream
    buffer and the copy."""
    reach: dict[tuple[int, int], list[int]] = {}
    safe: set[tuple[int, int]] = set()
    for k, step in enumerate(steps):
        if str(step.op) != "copy":
            continue
        for t in np.flatnonzero(step.dst == me).tolist():
            at, n, s = int(step.landing[t]), int(step.length[t]), int(step.src[t])
            events = _conflicts(steps, me, k, at, at + n)
            if all(_earliest(steps, n_ranks, e, reach)[s] <= k for e in events):
                safe.add((k, t))
    return safe


def _conflicts(steps: Sequence[PlanStep], me: int, k: int, lo: int, hi: int
               ) -> set[tuple[int, int]]:
    """The events (rank q starts step j) by which each access of `me` to [lo, hi) that
    precedes a receive of step k there is over: a send to p in step j <= k is over when p
    starts j + 1, a receive in step j < k when `me` starts j + 1."""
    out: set[tuple[int, int]] = set()
    for j in range(k + 1):
        step = steps[j]
        ln = step.length
        sends = (step.src == me) & (step.offset < hi) & (step.offset + ln > lo)
        out.update((p, j + 1) for p in step.dst[sends].tolist())
        if j < k:
            land = step.landing
            if ((step.dst == me) & (land < hi) & (land + ln > lo)).any():
                out.add((me, j + 1))
    return out


def _earliest(steps: Sequence[PlanStep], n_ranks: int, event: tuple[int, int],
              reach: dict[tuple[int, int], list[int]]) -> list[int]:
    """Per rank q, the first step q can start only after `event` (rank p starting step j)
    in every step-by-step run: q starts step m + 1 after receiving its step m transfers
    (memoised in `reach`; len(steps) + 1 where the event reaches q never)."""
    if event not in reach:
        p, j = event
        never = len(steps) + 1
        first = [never] * n_ranks
        first[p] = j
        for m in range(j, len(steps)):
            step = steps[m]
            for s, d in zip(step.src.tolist(), step.dst.tolist(), strict=True):
                if first[s] <= m:
                    first[d] = min(first[d], m + 1)
        reach[event] = first
    return reach[event]
