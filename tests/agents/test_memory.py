"""A run's memory (`oddl.agents.collective.memory`): the plan's layout held by one array or
by the call's own arrays apart, and the executor running a plan in either with the same
result.

The pure views first; then an all-to-all run by the executor on real stream links on
loopback, once in one work buffer and once straight from each rank's input blocks into
its output blocks (small: step by step; large: pipelined with direct landings), and a plan
that reaches past the arrays handed over failing on every rank with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.memory import Memory
from oddl.agents.collective.plan_run import run_collective, run_in_memory
from oddl.agents.slot_gate import SlotGate
from oddl.common.errors import CollectiveError
from oddl.controller.scheduling.native import native_plan


def test_one_array_holds_the_whole_layout():
    buf = np.arange(10, dtype=np.float32)
    memory = Memory.whole(buf)
    view = memory.view(3, 4)
    assert view.tolist() == [3, 4, 5, 6] and np.shares_memory(view, buf)
    assert (memory.size, memory.nbytes, memory.itemsize) == (10, 40, 4)
    with pytest.raises(CollectiveError, match="elements 8\\+4 of the plan's layout"):
        memory.view(8, 4)


def test_arrays_apart_each_hold_their_range_and_nothing_between():
    first, second = np.arange(4, dtype=np.int64), np.arange(100, 106, dtype=np.int64)
    memory = Memory.apart([(10, second), (0, first)])
    assert memory.view(1, 3).tolist() == [1, 2, 3]
    assert memory.view(12, 2).tolist() == [102, 103] and np.shares_memory(memory.view(12, 2),
                                                                          second)
    assert (memory.size, memory.nbytes) == (16, 80)
    for offset, n in ((2, 4), (4, 1), (14, 3)):  # across a gap, in it, past the end
        with pytest.raises(CollectiveError, match="check that every rank makes the same call"):
            memory.view(offset, n)
    copy = memory.snapshot()
    copy.view(0, 1)[0] = -1
    assert first[0] == 0 and copy.view(10, 6).tolist() == second.tolist()


def test_arrays_that_cannot_hold_a_layout_are_refused_by_name():
    with pytest.raises(ValueError, match="overlap"):
        Memory.apart([(0, np.zeros(4)), (3, np.zeros(4))])
    with pytest.raises(ValueError, match="one dtype"):
        Memory.apart([(0, np.zeros(4, np.float32)), (4, np.zeros(4, np.float64))])
    with pytest.raises(ValueError, match="flat and contiguous"):
        Memory.apart([(0, np.zeros(8)[::2])])
    with pytest.raises(ValueError, match="at least one array"):
        Memory.apart([])


def _all_to_all(n: int, m: int, apart: bool, plan_m: int | None = None
                ) -> tuple[list[object], list[list[np.ndarray]]]:
    """An all-to-all of blocks of `m` int64 on `n` ranks (rank r's block j holds 1000·r + j
    and its position), run in one work buffer or apart; what each rank's run returned and
    each rank's output blocks. `plan_m`: the block size the plan is made for."""
    nodes = tuple(f"n{i}" for i in range(n))
    steps = step_specs(native_plan("ring", "all_to_all", n, 2 * n * (plan_m or m)).steps)
    ins = [[1000 * r + j + np.arange(m, dtype=np.int64) * 10_000_000 for j in range(n)]
           for r in range(n)]
    outs = [[np.zeros(m, np.int64) for _ in range(n)] for _ in range(n)]
    with loopback_links(nodes) as links:
        def go(r: int) -> object:
            run = CollectiveRun("job-1", 1, r, nodes, steps, network="ideal",
                                receive_timeout_s=5.0, chunk_bytes=64 << 10)
            outs[r][r][...] = ins[r][r]
            if apart:
                return run_in_memory(run, Memory.apart(
                    [(j * m, a) for j, a in enumerate(ins[r])]
                    + [((n + i) * m, o) for i, o in enumerate(outs[r])]),
                    links[nodes[r]], SlotGate())
            work = np.concatenate(ins[r] + outs[r])
            run_collective(run, work, links[nodes[r]], SlotGate(), inplace=True)
            for i in range(n):
                outs[r][i][...] = work[(n + i) * m:(n + i + 1) * m]
            return None

        return on_every_rank(n, go, timeout_s=60), outs


@pytest.mark.parametrize("m", [5, 200_000])  # step by step; pipelined, landing directly
def test_an_all_to_all_run_apart_lands_what_one_work_buffer_does(m):
    n = 4
    ran, apart = _all_to_all(n, m, apart=True)
    assert ran == [None] * n
    _, together = _all_to_all(n, m, apart=False)
    for r in range(n):
        for i in range(n):  # block i came from rank i's block r
            np.testing.assert_array_equal(apart[r][i], 1000 * i + r
                                          + np.arange(m, dtype=np.int64) * 10_000_000)
            np.testing.assert_array_equal(apart[r][i], together[r][i])


def test_a_plan_past_the_arrays_fails_every_rank_with_the_reason():
    # the plan is for blocks of 8; the arrays handed over hold blocks of 5
    ran, _ = _all_to_all(3, 5, apart=True, plan_m=8)
    assert all(isinstance(r, CollectiveError) for r in ran), ran
    assert any("lie in none of the run's arrays" in str(r) for r in ran), ran
