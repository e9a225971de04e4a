"""An all-to-all of blocks of any sizes as each rank's own plan
(`oddl.agents.collective.exchange`): the pure plan first, then the executor on real stream
links on loopback — exact blocks, empty ones included, and sizes that disagree failing the
ranks that see it with `CallsDiffer` instead of a result."""

from __future__ import annotations

import numpy as np
import pytest
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.chunks import chunk_plan, interleaved
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.exchange import STRIDE, one_element_blocks, place, sized_steps
from oddl.agents.collective.memory import Memory
from oddl.agents.collective.plan_run import run_in_memory
from oddl.agents.links.streams import StreamLink
from oddl.agents.slot_gate import SlotGate
from oddl.common.errors import CallsDiffer
from oddl.controller.scheduling.native import native_plan
from oddl.protos.schedule_wire import StepSpec


def _job_plan(world: int) -> tuple[StepSpec, ...]:
    return step_specs(native_plan("ring", "all_to_all", world, 2 * world).steps)


def test_the_jobs_all_to_all_moves_each_block_straight_and_once():
    for world in (2, 3, 4, 8):
        assert one_element_blocks(_job_plan(world), world)
    steps = _job_plan(4)
    forwarded = (StepSpec("copy", (0,), (1,), (2,), (1,), (5,)),) + steps  # 0's block for 2
    assert not one_element_blocks(forwarded, 4)
    assert not one_element_blocks(steps[:-1], 4), "a pair never exchanged"
    assert not one_element_blocks(step_specs(native_plan("ring", "all_to_all", 4, 16).steps), 4)


def test_a_rank_fills_in_only_the_sizes_it_knows():
    steps = sized_steps(_job_plan(3), 0, sent=(4, 5, 0), received=(4, 7, 2))
    mine = {(s, d): (off, n, at) for step in steps
            for s, d, off, n, at in zip(step.src, step.dst, step.offset, step.length,
                                        step.landing, strict=True)}
    # input block 1 -> their output block 0, each flush with the end of its stretch
    assert mine[(0, 1)] == (2 * STRIDE - 5, 5, 4 * STRIDE - 5)
    assert mine[(0, 2)] == (2 * STRIDE, 1, 3 * STRIDE)  # empty: one element at the start
    assert mine[(1, 0)] == (STRIDE - 7, 7, 5 * STRIDE - 7)  # their block 0 -> my block 1
    assert mine[(2, 0)] == (STRIDE - 2, 2, 6 * STRIDE - 2)
    assert mine[(1, 2)][1] == mine[(2, 1)][1] == 0  # between others: nothing in my plan
    assert place(2, 0) == 2 * STRIDE and place(2, 9) == 3 * STRIDE - 9


class _Posting(StreamLink):
    """A stream link that counts the chunks the executor posted a landing for."""

    def __init__(self, node_id: str):
        super().__init__(node_id, "127.0.0.1:0")
        self.posted = 0

    def post_landing(self, job, src, chunk, into):
        ok = super().post_landing(job, src, chunk, into)
        self.posted += ok
        return ok


def test_a_sized_plans_sends_take_turns_across_its_receivers():
    """Rank 0's blocks of 3, 1 and 2 chunks go a chunk to each receiver in turn, each
    receiver's in order; a plan whose chunks wait for others (a ring) keeps its order."""
    steps = sized_steps(_job_plan(4), 0, sent=(0, 12, 4, 8), received=(0, 4, 4, 4))
    plan = interleaved(chunk_plan(steps, 0, 4))
    assert [(op.peer, op.offset - place(op.peer, (0, 12, 4, 8)[op.peer])) for op in plan.sends] \
        == [(1, 0), (2, 0), (3, 0), (1, 4), (3, 4), (1, 8)]
    ring = step_specs(native_plan("ring", "all_reduce", 4, 64).steps)
    assert interleaved(chunk_plan(ring, 0, 4)) == chunk_plan(ring, 0, 4)


def _exchange(sent: list[list[int]], received: list[list[int]], chunk_bytes: int = 64 << 10
              ) -> tuple[list[object], list[list[np.ndarray]]]:
    """Every rank's sized all-to-all on loopback: sent[r][j] elements from r to j (rank r's
    block j holds 1000·r + j + 0, 1, ...); what each run returned and each rank's outputs."""
    world = len(sent)
    nodes = tuple(f"n{i}" for i in range(world))
    ins = [[1000 * r + j + np.arange(sent[r][j], dtype=np.float64) for j in range(world)]
           for r in range(world)]
    outs = [[np.full(received[r][i], -1.0) for i in range(world)] for r in range(world)]
    with loopback_links(nodes, _Posting) as links:
        def go(r: int) -> object:
            steps = sized_steps(_job_plan(world), r, tuple(sent[r]), tuple(received[r]))
            run = CollectiveRun("job-1", 1, r, nodes, steps, network="ideal",
                                receive_timeout_s=10.0, chunk_bytes=chunk_bytes,
                                exchange_once=True)
            regions = [(place(j, a.size), a if a.size else np.zeros(1))
                       for j, a in enumerate(ins[r])]
            regions += [(place(world + i, o.size), o if o.size else np.zeros(1))
                        for i, o in enumerate(outs[r]) if i != r]
            return run_in_memory(run, Memory.apart(regions), links[nodes[r]], SlotGate())

        ran = on_every_rank(world, go, timeout_s=60)
        _exchange.posted = sum(link.posted for link in links.values())  # type: ignore[attr-defined]
        return ran, outs


@pytest.mark.parametrize("scale", [1, 40_000])  # step by step; pipelined, landing directly
def test_blocks_of_any_size_land_exactly_where_each_receiver_wants_them(scale):
    sizes = [[0, 3, 0, 1], [2, 0, 5, 0], [7, 1, 0, 4], [0, 0, 6, 2]]
    sent = [[n * scale for n in row] for row in sizes]
    received = [[sent[i][r] for i in range(4)] for r in range(4)]
    ran, outs = _exchange(sent, received)
    assert ran == [None] * 4
    if scale > 1:  # pipelined: every chunk may be read straight into its output block
        assert _exchange.posted == sum(  # type: ignore[attr-defined]
            max(1, -(-sent[i][j] * 8 // (64 << 10))) for i in range(4) for j in range(4)
            if i != j)  # an empty block: its one element
    for r in range(4):
        for i in range(4):
            if i != r:  # block i is rank i's block r, whole
                want = 1000 * i + r + np.arange(sent[i][r], dtype=np.float64)
                np.testing.assert_array_equal(outs[r][i], want)


def test_sizes_that_disagree_fail_where_they_are_found():
    sent = [[0, 3, 3], [3, 0, 0], [3, 3, 0]]
    received = [[0, 3, 3], [2, 0, 3], [3, 1, 0]]  # n1 expects 2 of n0's 3; n2 expects 1 of none
    ran, _ = _exchange(sent, received)
    assert isinstance(ran[1], CallsDiffer) and "expected" in str(ran[1]), ran
    assert isinstance(ran[2], CallsDiffer) and "expected" in str(ran[2]), ran


@pytest.mark.parametrize("extra", [5, 4, 8])
def test_a_longer_block_than_a_whole_number_of_chunks_expected_fails(extra):
    """n1 expects 8 elements (two chunks of 4) where n0 sends 8 + `extra`: the first chunk
    already says the sizes differ (the tail chunks would otherwise go unread)."""
    sent = [[0, 8 + extra], [8, 0]]
    received = [[0, 8], [8, 0]]
    ran, outs = _exchange(sent, received, chunk_bytes=32)
    assert isinstance(ran[1], CallsDiffer), ran
    short = [[0, 8], [8, 0]]  # and the other way round: fewer sent than expected
    ran, _ = _exchange(short, [[0, 8], [8 + extra, 0]], chunk_bytes=32)
    assert isinstance(ran[1], CallsDiffer), ran
