"""Which receive chunks may land straight in the destination (issue 36, records 0037, 0039).

A posted receive writes a COPY chunk into the caller's buffer the moment its bytes arrive,
instead of into a stream buffer the executor copies out of when it reaches that chunk. The
bytes can then land at any time after the sender started sending the chunk and before this
node's executor takes it. That is exact only if every access of this node to an overlapping
range that, in plan order, comes before the landing is over by then:

- a send of this node in a step ``j <= k`` reading an overlapping range (it would send the
  landed bytes instead of the old ones);
- an earlier receive of this node into an overlapping range (a REDUCE would add onto the
  landed bytes, a COPY would overwrite them).

The proof works on the chunks every rank runs (`oddl.agents.collective.chunks.chunk_plan`)
and only on the order every run guarantees, pipelined or step by step, whichever each rank
chose (`oddl.agents.collective.plan_run` picks per rank):

- a rank's sender sends the chunks of a transfer in order, and a step's chunks only after
  every chunk of its earlier steps;
- a send chunk starts after the receive chunks it reads from are taken (its ``after``);
- a rank takes its receive chunks in order, each after the sends of earlier steps that read
  its range are over, and after its sender has started sending it.

An access is over before the peer's send starts when a path of these edges leads from it to
that send (ancestor sets as bitsets, one pass in topological order). This is what makes the
all-gather half of the ring exact: the value that arrives went through this node's own send.
Where no path exists the proof says no (2 of the 24 COPY receives of a forwarded all-to-all
over a 4-rank ring). REDUCE receives never land directly. Pure; cached per plan and chunk.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from oddl.agents.collective.chunks import ChunkOp, ChunkPlan, chunk_plan
from oddl.agents.collective.context import COPY
from oddl.protos.schedule_wire import StepSpec


@lru_cache(maxsize=32)
def direct_chunks(steps: tuple[StepSpec, ...], n_ranks: int, me: int, chunk: int
                  ) -> frozenset[int]:
    """The indices into ``chunk_plan(steps, me, chunk).recvs`` of the receive chunks that may
    land straight in rank `me`'s buffer (see the module docstring); every other one keeps the
    stream buffer and the copy. Empty when the chunk graph has a cycle (a plan that cannot
    run)."""
    plans = [chunk_plan(steps, r, chunk) for r in range(n_ranks)]
    graph = _ChunkGraph(steps, plans)
    before = graph.ancestors()
    if before is None:
        return frozenset()
    mine = plans[me]
    keys = Counter((op.step, op.peer, op.offset) for op in mine.recvs)
    safe = []
    for j, op in enumerate(mine.recvs):
        if steps[op.step].op != COPY or keys[(op.step, op.peer, op.offset)] > 1:
            continue  # a chunk the link could not tell from another of the same key
        sender = graph.send_id(op.peer, op.step, me, op.offset)
        if sender is None:
            continue
        started_after = _union(before, graph.preds[sender])
        conflicts = graph.conflicts(me, j)
        if conflicts & ~started_after == 0:
            safe.append(j)
    return frozenset(safe)


def _union(before: list[int], preds: list[int]) -> int:
    out = 0
    for p in preds:
        out |= before[p] | (1 << p)
    return out


class _ChunkGraph:
    """Every rank's send and receive chunks as one graph of happens-before edges: node ids
    are each rank's sends, then its receives, then one node per step that sends ("that
    step's sends are over")."""

    def __init__(self, steps: tuple[StepSpec, ...], plans: list[ChunkPlan]):
        self.plans = plans
        self.preds: list[list[int]] = []
        self.send_base: list[int] = []
        self.recv_base: list[int] = []
        self._sends_by_key: list[dict[tuple[int, int, int], int]] = []
        for plan in plans:
            self.send_base.append(len(self.preds))
            self.preds.extend([] for _ in plan.sends)
            self.recv_base.append(len(self.preds))
            self.preds.extend([] for _ in plan.recvs)
            by_key: dict[tuple[int, int, int], int] = {}
            for i, op in enumerate(plan.sends):  # a key sent twice matches nothing
                key = (op.step, op.peer, op.offset)
                by_key[key] = -1 if key in by_key else i
            self._sends_by_key.append(by_key)
        for r, plan in enumerate(plans):
            self._rank_edges(r, plan)

    def send_id(self, rank: int, step: int, peer: int, offset: int) -> int | None:
        """The node of `rank`'s send chunk of `step` to `peer` at `offset`."""
        i = self._sends_by_key[rank].get((step, peer, offset), -1)
        return None if i < 0 else self.send_base[rank] + i

    def _rank_edges(self, r: int, plan: ChunkPlan) -> None:
        s0, r0 = self.send_base[r], self.recv_base[r]
        done_before: int | None = None  # the node "every send of the last step is over"
        step_sends: list[int] = []
        step = -1
        for i, op in enumerate(plan.sends):
            if op.step != step:
                if step_sends:
                    done_before = self._node(step_sends)
                step, step_sends = op.step, []
            preds = self.preds[s0 + i]
            if done_before is not None:
                preds.append(done_before)
            if not op.first:
                preds.append(s0 + i - 1)
            if op.after:
                preds.append(r0 + op.after - 1)
            step_sends.append(s0 + i)
        lo, hi = _ranges(plan.sends)
        send_step = np.array([s.step for s in plan.sends], dtype=np.int64)
        for j, op in enumerate(plan.recvs):
            preds = self.preds[r0 + j]
            if j:
                preds.append(r0 + j - 1)
            reads = (send_step < op.step) & (lo < op.landing + op.n) & (hi > op.landing)
            preds.extend((s0 + np.flatnonzero(reads)).tolist())
            sender = self.send_id(op.peer, op.step, r, op.offset)
            if sender is not None:
                preds.append(sender)

    def _node(self, preds: list[int]) -> int:
        self.preds.append(list(preds))
        return len(self.preds) - 1

    def conflicts(self, me: int, j: int) -> int:
        """The nodes (a bitset) of `me`'s accesses that must be over before receive chunk j
        may land: sends of steps up to its own and earlier receives, into its range."""
        plan = self.plans[me]
        op = plan.recvs[j]
        lo, hi = op.landing, op.landing + op.n
        out = 0
        for i, s in enumerate(plan.sends):
            if s.step <= op.step and s.offset < hi and s.offset + s.n > lo:
                out |= 1 << (self.send_base[me] + i)
        for i, rv in enumerate(plan.recvs[:j]):
            if rv.landing < hi and rv.landing + rv.n > lo:
                out |= 1 << (self.recv_base[me] + i)
        return out

    def ancestors(self) -> list[int] | None:
        """Per node, the bitset of every node that happens before it; None on a cycle."""
        n = len(self.preds)
        anc: list[int | None] = [None] * n
        visiting = [False] * n
        for root in range(n):
            stack = [root]
            while stack:
                v = stack[-1]
                if anc[v] is not None:
                    stack.pop()
                    continue
                todo = [p for p in self.preds[v] if anc[p] is None]
                if todo:
                    if visiting[v] or any(visiting[p] for p in todo):
                        return None
                    visiting[v] = True
                    stack.extend(todo)
                    continue
                visiting[v] = False
                acc = 0
                for p in self.preds[v]:
                    acc |= anc[p] | (1 << p)  # type: ignore[operator]
                anc[v] = acc
                stack.pop()
        return anc  # type: ignore[return-value]


def _ranges(sends: tuple[ChunkOp, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Each send chunk's [lo, hi) element range in this node's buffer."""
    lo = np.array([op.offset for op in sends], dtype=np.int64)
    return lo, lo + np.array([op.n for op in sends], dtype=np.int64)
