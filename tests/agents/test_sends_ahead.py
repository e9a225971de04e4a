"""Steps whose sends depend on no receive go at once on the ideal network
(`oddl.agents.collective.step_by_step.sends_ahead`): an all-to-all waits one hop, not N−1.

The pure count first, then the executor on real stream links on loopback: exact results,
and every send of an all-to-all made before this rank's first receive — while a ring's
second step still waits for its first receive. (Slotted runs send none ahead: each send
waits for its slot.)
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from loopback_ranks import loopback_links, on_every_rank, step_specs

from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.plan_run import run_collective
from oddl.agents.collective.step_by_step import sends_ahead
from oddl.agents.links.streams import StreamLink
from oddl.agents.slot_gate import SlotGate
from oddl.controller.scheduling.native import native_plan
from oddl.protos.schedule_wire import StepSpec


def _specs(plan) -> tuple[StepSpec, ...]:
    return step_specs(plan.steps)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_every_step_of_an_all_to_all_sends_ahead_and_a_ring_only_its_first(n):
    a2a = _specs(native_plan("ring", "all_to_all", n, 2 * n * 5))
    assert len(a2a) == n - 1
    assert all(sends_ahead(a2a, r) == n - 1 for r in range(n))
    # a ring all-reduce sends on what it received the step before; an all-gather too
    for kind in ("all_reduce", "all_gather"):
        ring = _specs(native_plan("ring", kind, n, n * 5))
        assert all(sends_ahead(ring, r) == 1 for r in range(n)), kind


class _Recording(StreamLink):
    """A stream link that notes, per thread, the order of this rank's sends and receives."""

    def __init__(self, node_id: str):
        super().__init__(node_id, "127.0.0.1:0")
        self.moves: list[tuple[str, int]] = []
        self._caller = threading.get_ident()

    def send_chunk(self, job, dst, head, payload, deadline_s, cancel=None, optical=False):
        self.moves.append(("send", head.step))
        return super().send_chunk(job, dst, head, payload, deadline_s, cancel, optical)

    def recv_chunk(self, job, src, seq, step, deadline, cancel=None, into=None):
        self.moves.append(("recv", step))
        return super().recv_chunk(job, src, seq, step, deadline, cancel, into)


def _run(kind: str, n: int, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[list]]:
    nodes = tuple(f"n{i}" for i in range(n))
    steps = _specs(native_plan("ring", kind, n, arrays[0].size))
    with loopback_links(nodes, _Recording) as links:
        def go(r: int) -> object:
            run = CollectiveRun("job-1", 1, r, nodes, steps, network="ideal",
                                receive_timeout_s=5.0)
            return run_collective(run, arrays[r], links[nodes[r]], SlotGate())

        outs = on_every_rank(n, go, timeout_s=30)
    assert all(isinstance(o, np.ndarray) for o in outs), outs
    return outs, [links[nd].moves for nd in nodes]


def test_a_small_all_to_all_sends_every_block_before_its_first_receive():
    n, m = 4, 6
    # rank r's input block j holds 100·r + j; the output's block i is rank i's block r (its
    # own, r, put in place by the caller, as the agent's client does)
    arrays = [np.concatenate([np.full(m, 100 * r + j) for j in range(n)] + [np.zeros(n * m)])
              .astype(np.int64) for r in range(n)]
    for r, a in enumerate(arrays):
        a[(n + r) * m:(n + r + 1) * m] = 100 * r + r
    outs, moves = _run("all_to_all", n, arrays)
    for r, out in enumerate(outs):
        got = out[n * m:].reshape(n, m)
        assert [int(got[i, 0]) for i in range(n)] == [100 * i + r for i in range(n)]
        assert all((got[i] == got[i, 0]).all() for i in range(n))
    for r, seen in enumerate(moves):
        first_recv = next(i for i, (what, _) in enumerate(seen) if what == "recv")
        assert [w for w, _ in seen[:first_recv]] == ["send"] * (n - 1), (r, seen)


def test_a_ring_all_reduce_still_waits_for_each_receive_before_it_sends_on():
    n = 4
    arrays = [np.arange(8 * n, dtype=np.int64) * (r + 1) for r in range(n)]
    outs, moves = _run("all_reduce", n, arrays)
    for out in outs:
        assert np.array_equal(out, np.arange(8 * n) * sum(range(1, n + 1)))
    for seen in moves:  # step k + 1's send after step k's receive
        for k in range(1, 2 * (n - 1)):
            assert seen.index(("send", k)) > seen.index(("recv", k - 1)), seen
