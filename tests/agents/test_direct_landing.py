"""The direct-landing proof never lets a chunk land where an early landing changes a result.

An adversarial run of the executors at chunk level: each rank runs pipelined or step by step
(as `plan_run` may choose per rank) with its sends in any peer order; a send reads its range
at any moment its rules allow, a receive chunk the proof marks safe is written into the
destination at any moment after its sender read it (the posted receive), and every other one
is applied when the executor takes it (today's path). A seeded chooser picks the
interleaving; every run must equal `execute_plan`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback_ranks import step_specs

from oddl.agents.collective.chunks import ChunkPlan, chunk_plan
from oddl.agents.collective.direct_landing import direct_chunks
from oddl.common.errors import PlanError
from oddl.controller.scheduling import Op, Plan, Step, execute_plan, make_plan, validate_plan
from oddl.controller.scheduling.forwarding import forwarded
from oddl.controller.scheduling.native import native_plan
from oddl.protos.schedule_wire import StepSpec

KINDS = ("all_gather", "reduce_scatter", "broadcast", "all_to_all", "gather", "scatter")

Key = tuple[int, int, int, int]
"""A chunk on the wire: (sender, step, receiver, sender's offset)."""


def _plans(n: int, e: int) -> list[Plan]:
    """Every kind of plan the agents run that builds at n ranks (halving-doubling needs a
    power of two: at 3 ranks only the others)."""
    ring_links = {(i, (i + 1) % n) for i in range(n)}
    builders: list[Callable[[], Plan]] = [
        lambda a=a: make_plan(a, n, e)  # type: ignore[misc]
        for a in ("ring", "halving-doubling", "totientperms", "wrht", "parameter-server",
                  "topoopt")]
    builders += [lambda a=a, k=k: native_plan(a, k, n, e)  # type: ignore[misc]
                 for a in ("ring", "halving-doubling") for k in KINDS]
    builders += [lambda: forwarded(native_plan("ring", "all_to_all", n, e), ring_links),
                 lambda: forwarded(make_plan("ring", n, e), {(i, (i + 2) % n) for i in range(n)}
                                   | ring_links)]
    plans = []
    for build in builders:
        try:
            plans.append(build())
        except PlanError:
            assert n == 3, "every plan builds at 2 and 4 ranks"
    return plans


def _specs(steps: tuple[Step, ...] | list[Step]) -> tuple[StepSpec, ...]:
    return step_specs(steps)


@dataclass
class _Rank:
    """One rank's executor state: its chunks, how far its sender and taker have got."""

    plan: ChunkPlan
    pipelined: bool
    direct: frozenset[int]
    buf: np.ndarray
    sent: int = 0
    taken: int = 0
    step: int = 0
    source: np.ndarray | None = None
    """Step by step: what this step's sends read (a snapshot when the step receives into
    what it sends)."""
    landed: set[int] = field(default_factory=set)


def _run(steps: tuple[StepSpec, ...], inputs: list[np.ndarray], chunk: int,
         rng: random.Random, direct: Callable[[int], frozenset[int]]) -> list[np.ndarray]:
    n = len(inputs)
    ranks = []
    for r in range(n):
        order = tuple(tuple(rng.sample(peers, len(peers))) for peers in
                      (sorted({d for s, d in zip(st_.src, st_.dst, strict=True) if s == r})
                       for st_ in steps))
        plan = chunk_plan(steps, r, chunk, order)
        ranks.append(_Rank(plan, plan.pipelined and rng.random() < 0.5, direct(r),
                           inputs[r].copy()))
    wire: dict[Key, np.ndarray] = {}
    while True:
        for rank in ranks:
            _next_step(steps, rank)
        acts = _actions(steps, ranks, wire)
        if not acts:
            break
        rng.choice(acts)()
    assert all(rk.taken == len(rk.plan.recvs) and rk.sent == len(rk.plan.sends)
               for rk in ranks), "the run stalled"
    return [rk.buf for rk in ranks]


def _next_step(steps: tuple[StepSpec, ...], rank: _Rank) -> None:
    """Step by step: start the next step once this one's sends and receives are done."""
    if rank.pipelined:
        return
    plan = rank.plan
    while rank.step < len(steps) and all(
            op.step != rank.step for op in plan.sends[rank.sent:] + plan.recvs[rank.taken:]):
        rank.step += 1
        rank.source = None
    if rank.source is None and rank.step < len(steps):
        overlap = any(s.step == rank.step and r.step == rank.step and s.offset < r.landing + r.n
                      and r.landing < s.offset + s.n for s in plan.sends for r in plan.recvs)
        rank.source = rank.buf.copy() if overlap else rank.buf


def _actions(steps: tuple[StepSpec, ...], ranks: list[_Rank], wire: dict[Key, np.ndarray]
             ) -> list[Callable[[], None]]:
    acts: list[Callable[[], None]] = []
    for me, rank in enumerate(ranks):
        plan = rank.plan
        if rank.sent < len(plan.sends):
            op = plan.sends[rank.sent]
            ready = (rank.taken >= op.after if rank.pipelined else op.step == rank.step)
            if ready:
                acts.append(lambda me=me, rank=rank, op=op: _send(me, rank, op, wire))
        for j in range(len(plan.recvs)):
            op = plan.recvs[j]
            key = (op.peer, op.step, me, op.offset)
            if j in rank.direct and j not in rank.landed and key in wire:
                acts.append(lambda rank=rank, j=j, key=key: _land(rank, j, wire[key]))
        if rank.taken < len(plan.recvs):
            op = plan.recvs[rank.taken]
            key = (op.peer, op.step, me, op.offset)
            ready = (rank.sent >= op.after if rank.pipelined else op.step == rank.step)
            if ready and key in wire and (rank.taken not in rank.direct
                                          or rank.taken in rank.landed):
                acts.append(lambda rank=rank, key=key: _take(steps, rank, wire[key]))
    return acts


def _send(me: int, rank: _Rank, op, wire: dict[Key, np.ndarray]) -> None:  # type: ignore[no-untyped-def]
    source = rank.buf if rank.pipelined else rank.source
    assert source is not None
    wire[(me, op.step, op.peer, op.offset)] = source[op.offset:op.offset + op.n].copy()
    rank.sent += 1


def _land(rank: _Rank, j: int, data: np.ndarray) -> None:
    op = rank.plan.recvs[j]
    rank.buf[op.landing:op.landing + op.n] = data
    rank.landed.add(j)


def _take(steps: tuple[StepSpec, ...], rank: _Rank, data: np.ndarray) -> None:
    j = rank.taken
    op = rank.plan.recvs[j]
    if j not in rank.direct:
        target = rank.buf[op.landing:op.landing + op.n]
        if steps[op.step].op == "reduce":
            target += data
        else:
            target[...] = data
    rank.taken += 1


def _proved(steps: tuple[StepSpec, ...], n: int, chunk: int) -> Callable[[int], frozenset[int]]:
    return lambda r: direct_chunks(steps, n, r, chunk)


def _copies(steps: tuple[StepSpec, ...], r: int, chunk: int) -> frozenset[int]:
    plan = chunk_plan(steps, r, chunk)
    return frozenset(j for j, op in enumerate(plan.recvs) if steps[op.step].op == "copy")


@settings(max_examples=80, deadline=None)
@given(n=st.sampled_from([2, 3, 4]), b=st.integers(1, 3), which=st.integers(0, 100),
       chunk=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_no_early_landing_the_proof_allows_changes_a_result(n: int, b: int, which: int,
                                                           chunk: int, seed: int) -> None:
    plans = _plans(n, 2 * n * b)  # all_to_all needs 2·N equal blocks
    plan = plans[which % len(plans)]
    validate_plan(plan)
    steps = _specs(plan.steps)
    rng = np.random.default_rng(which)
    inputs = [rng.integers(-1000, 1000, plan.n_elems) for _ in range(plan.n_ranks)]
    want = execute_plan(plan, inputs)
    got = _run(steps, inputs, chunk, random.Random(seed), _proved(steps, n, chunk))
    for r in range(plan.n_ranks):
        assert np.array_equal(got[r], want[r]), f"{plan.collective} rank {r}"


@pytest.mark.parametrize("kind", ["allreduce", "all_gather"])
def test_the_ring_copy_receives_land_directly(kind: str) -> None:
    """Causality makes every all-gather chunk of the ring's all-reduce safe, and every
    chunk of its all_gather, at every rank; none of a reduce-scatter half (REDUCE)."""
    plan = make_plan("ring", 4, 40) if kind == "allreduce" else native_plan("ring", kind, 4, 40)
    steps = _specs(plan.steps)
    for r in range(4):
        assert direct_chunks(steps, 4, r, 3) == _copies(steps, r, 3)
        assert direct_chunks(steps, 4, r, 3), "the ring has COPY receives"


def _step(src: list[int], dst: list[int], off: list[int], op: Op) -> Step:
    a = np.array
    return Step(a(src), a(dst), a(off), a([1] * len(src)), op)


@pytest.mark.parametrize("steps, unsafe", [
    # rank 1 sends element 0 in step 1 while rank 0 already sends its new value in step 1
    ([_step([0], [1], [1], Op.COPY), _step([0, 1], [1, 2], [0, 0], Op.COPY)], 1),
    # rank 1 reduces into 0 in step 0; rank 2's COPY of step 1 could land before it
    ([_step([0], [1], [0], Op.REDUCE), _step([2], [1], [0], Op.COPY)], 1),
])
def test_the_proof_refuses_a_chunk_that_could_land_too_early(steps: list[Step],
                                                            unsafe: int) -> None:
    """`unsafe` is rank 1's receive chunk that must keep the copy."""
    specs = _specs(steps)
    assert unsafe not in direct_chunks(specs, 3, 1, 1)
    plan = Plan("constructed", 3, 2, tuple(steps))
    inputs = [np.array([1, 2]), np.array([10, 20]), np.array([100, 200])]
    want = [w.tolist() for w in execute_plan(plan, inputs)]
    proved = _proved(specs, 3, 1)
    # every interleaving of 200 seeded ones keeps the result with the proof's choice...
    runs = [[b.tolist() for b in _run(specs, inputs, 1, random.Random(s), proved)]
            for s in range(200)]
    assert all(run == want for run in runs)
    # ...and landed anyway, the chunk changes it in one of them: the simulation can tell
    forced = lambda r: proved(r) | ({unsafe} if r == 1 else frozenset())  # noqa: E731
    assert any([b.tolist() for b in _run(specs, inputs, 1, random.Random(s), forced)] != want
               for s in range(200))


def test_a_forwarded_all_to_all_has_chunks_that_must_keep_the_copy() -> None:
    """Relayed over a ring, landing every COPY chunk directly goes wrong in some
    interleaving; the proof refuses those chunks and every interleaving stays exact."""
    n = 4
    plan = forwarded(native_plan("ring", "all_to_all", n, 2 * n * 2),
                     {(i, (i + 1) % n) for i in range(n)})
    steps = _specs(plan.steps)
    proved = _proved(steps, n, 2)
    assert sum(len(proved(r)) for r in range(n)) < sum(len(_copies(steps, r, 2))
                                                        for r in range(n))
    rng = np.random.default_rng(1)
    inputs = [rng.integers(-1000, 1000, plan.n_elems) for _ in range(n)]
    want = [w.tolist() for w in execute_plan(plan, inputs)]
    runs = [[b.tolist() for b in _run(steps, inputs, 2, random.Random(s), proved)]
            for s in range(300)]
    assert all(run == want for run in runs)
    every = lambda r: _copies(steps, r, 2)  # noqa: E731
    assert any([b.tolist() for b in _run(steps, inputs, 2, random.Random(s), every)] != want
               for s in range(300))

