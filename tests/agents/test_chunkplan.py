"""Chunk plans: every registered collective, cut into chunks with their dependencies, still
computes the exact sum, and never deadlocks, when each node runs as eagerly as they allow."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from loopback_ranks import step_specs

from oddl.agents.collective.chunks import busiest_port_bytes, chunk_plan
from oddl.controller.scheduling import make_plan
from oddl.protos.schedule_wire import StepSpec


def _steps(plan) -> tuple[StepSpec, ...]:
    return step_specs(plan.steps)


def _simulate(steps: tuple[StepSpec, ...], arrays: list[np.ndarray], chunk: int
              ) -> list[np.ndarray]:
    """Run every rank's chunk plan, one operation at a time, as soon as its dependencies
    allow; wires are FIFO per (src, dst). Raise on a deadlock or an out-of-order chunk."""
    n = len(arrays)
    plans = [chunk_plan(steps, r, chunk) for r in range(n)]
    bufs = [a.copy() for a in arrays]
    sent, recvd = [0] * n, [0] * n
    wires: dict[tuple[int, int], deque] = {}
    progress = True
    while progress:
        progress = False
        for r, p in enumerate(plans):
            if not p.pipelined:
                pytest.skip("this plan runs step by step (receives into what it sends)")
            while sent[r] < len(p.sends) and recvd[r] >= p.sends[sent[r]].after:
                op = p.sends[sent[r]]
                wires.setdefault((r, op.peer), deque()).append(
                    (op.step, op.offset, bufs[r][op.offset:op.offset + op.n].copy()))
                sent[r] += 1
                progress = True
            while recvd[r] < len(p.recvs) and sent[r] >= p.recvs[recvd[r]].after:
                op = p.recvs[recvd[r]]
                wire = wires.get((op.peer, r))
                if not wire:
                    break
                step, offset, data = wire.popleft()
                assert (step, offset, data.size) == (op.step, op.offset, op.n)
                if steps[op.step].op == "reduce":
                    bufs[r][op.offset:op.offset + op.n] += data
                else:
                    bufs[r][op.offset:op.offset + op.n] = data
                recvd[r] += 1
                progress = True
    for r, p in enumerate(plans):
        assert (sent[r], recvd[r]) == (len(p.sends), len(p.recvs)), f"rank {r} deadlocked"
    return bufs


@pytest.mark.parametrize("collective,n,params", [
    ("ring", 4, {}), ("ring", 5, {}), ("halving-doubling", 4, {}), ("halving-doubling", 8, {}),
    ("wrht", 4, {"wavelengths": 2}), ("wrht", 8, {"wavelengths": 2}),
    ("totientperms", 6, {"degree": 2}), ("topoopt", 4, {}), ("parameter-server", 4, {})])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_plans_are_exact(collective, n, params, chunk):
    rng = np.random.default_rng(n * 31 + chunk)
    size = 997
    arrays = [rng.integers(-2**40, 2**40, size) for _ in range(n)]
    steps = _steps(make_plan(collective, n, size, **params))
    for out in _simulate(steps, arrays, chunk):
        assert np.array_equal(out, np.sum(arrays, axis=0))


def test_a_ring_step_waits_only_for_the_chunks_it_reads():
    steps = _steps(make_plan("ring", 4, 4000))
    plan = chunk_plan(steps, 0, 250)  # 1000-element segments, 4 chunks each
    assert plan.pipelined
    by_step = {}
    for op in plan.sends:
        by_step.setdefault(op.step, []).append(op)
    # step 0 sends this rank's own data: no wait; step 1's k-th chunk needs only the k-th
    # chunk received in step 0, not the whole step
    assert all(op.after == 0 for op in by_step[0])
    assert [op.after for op in by_step[1]] == [1, 2, 3, 4]
    assert [op.first for op in by_step[1]] == [True, False, False, False]
    assert [op.last for op in by_step[1]] == [False, False, False, True]


def test_the_ideal_wire_time_counts_the_busiest_port():
    # WRHT on 4 nodes: the root hears three whole buckets, then sends three
    wrht = _steps(make_plan("wrht", 4, 1000))
    assert busiest_port_bytes(wrht, 4) == (3 * 4000, 3 * 4000)
    ring = _steps(make_plan("ring", 4, 1000))
    assert busiest_port_bytes(ring, 4) == (1000,) * 6
