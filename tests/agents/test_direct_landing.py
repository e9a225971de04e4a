"""The direct-landing proof never lets a receive land where an early landing changes a result.

An adversarial step-by-step run: each rank starts a step, reads each of its sends at any
moment of the step, and finishes it once its receives are in; a receive the proof marks safe
is written into the destination at any moment after its sender read it (the posted receive),
every other one is applied at the receiver's finish in transfer order (today's path).
Hypothesis picks the interleaving; every run must equal `execute_plan`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oddl.agents.collective.direct_landing import direct_receives
from oddl.common.errors import PlanError
from oddl.controller.scheduling import Op, Plan, Step, execute_plan, make_plan, validate_plan
from oddl.controller.scheduling.forwarding import forwarded
from oddl.controller.scheduling.native import native_plan

Action = tuple[str, int, int, int]
"""(read | land | finish, rank, step, transfer)"""

KINDS = ("all_gather", "reduce_scatter", "broadcast", "all_to_all", "gather", "scatter")


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


def _proved(plan: Plan) -> set[tuple[int, int]]:
    return {(k, t) for r in range(plan.n_ranks)
            for k, t in direct_receives(plan.steps, plan.n_ranks, r)}


def _adversarial_run(plan: Plan, inputs: list[np.ndarray], direct: set[tuple[int, int]],
                     choose: Callable[[list[Action]], Action]) -> list[np.ndarray]:
    bufs = [x.copy() for x in inputs]
    step_of = [0] * plan.n_ranks
    sent: dict[tuple[int, int], np.ndarray] = {}
    landed: set[tuple[int, int]] = set()
    while True:
        actions = _enabled(plan, step_of, sent, landed, direct)
        if not actions:
            break
        kind, r, k, t = choose(actions)
        step = plan.steps[k]
        if kind == "read":
            o, n = int(step.offset[t]), int(step.length[t])
            sent[(k, t)] = bufs[r][o:o + n].copy()
        elif kind == "land":
            at, n = int(step.landing[t]), int(step.length[t])
            bufs[int(step.dst[t])][at:at + n] = sent[(k, t)]
            landed.add((k, t))
        else:
            for u in np.flatnonzero(step.dst == r).tolist():
                if (k, u) in direct:
                    continue
                at, n = int(step.landing[u]), int(step.length[u])
                if step.op is Op.REDUCE:
                    bufs[r][at:at + n] += sent[(k, u)]
                else:
                    bufs[r][at:at + n] = sent[(k, u)]
            step_of[r] += 1
    assert all(k == len(plan.steps) for k in step_of), "the run stalled"
    return bufs


def _enabled(plan: Plan, step_of: list[int], sent: dict[tuple[int, int], np.ndarray],
             landed: set[tuple[int, int]], direct: set[tuple[int, int]]
             ) -> list[Action]:
    out: list[Action] = []
    for k, t in sent.keys() - landed:
        if (k, t) in direct:
            out.append(("land", int(plan.steps[k].dst[t]), k, t))
    for r, k in enumerate(step_of):
        if k == len(plan.steps):
            continue
        step = plan.steps[k]
        reads = [t for t in np.flatnonzero(step.src == r).tolist() if (k, t) not in sent]
        out += [("read", r, k, t) for t in reads]
        ins = np.flatnonzero(step.dst == r).tolist()
        if not reads and all((k, u) in sent and ((k, u) not in direct or (k, u) in landed)
                             for u in ins):
            out.append(("finish", r, k, -1))
    return sorted(out)


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([2, 3, 4]), b=st.integers(1, 3), which=st.integers(0, 100), data=st.data())
def test_no_early_landing_the_proof_allows_changes_a_result(n: int, b: int, which: int,
                                                           data: st.DataObject) -> None:
    plans = _plans(n, 2 * n * b)  # all_to_all needs 2·N equal blocks
    plan = plans[which % len(plans)]
    validate_plan(plan)
    rng = np.random.default_rng(which)
    inputs = [rng.integers(-1000, 1000, plan.n_elems) for _ in range(plan.n_ranks)]
    want = execute_plan(plan, inputs)
    got = _adversarial_run(plan, inputs, _proved(plan),
                           lambda acts: data.draw(st.sampled_from(acts)))
    for r in range(plan.n_ranks):
        assert np.array_equal(got[r], want[r]), f"{plan.collective} rank {r}"


def test_the_ring_all_gather_half_lands_directly() -> None:
    """Causality makes every all-gather receive of the ring's all-reduce safe but none of the
    reduce-scatter half (REDUCE); this is what the proof is for."""
    plan = make_plan("ring", 4, 40)
    for r in range(4):
        safe = direct_receives(plan.steps, 4, r)
        copies = {(k, t) for k, s in enumerate(plan.steps) if s.op is Op.COPY
                  for t in np.flatnonzero(s.dst == r).tolist()}
        assert safe == copies


def _step(src: list[int], dst: list[int], off: list[int], op: Op) -> Step:
    a = np.array
    return Step(a(src), a(dst), a(off), a([1] * len(src)), op)


@pytest.mark.parametrize("steps, unsafe", [
    # rank 1 sends element 0 in step 1 while rank 0 already sends its new value in step 1
    ([_step([0], [1], [1], Op.COPY), _step([0, 1], [1, 2], [0, 0], Op.COPY)], (1, 0)),
    # rank 1 reduces into 0 in step 0; rank 2's COPY of step 1 could land before it
    ([_step([0], [1], [0], Op.REDUCE), _step([2], [1], [0], Op.COPY)], (1, 0)),
])
def test_the_proof_refuses_a_receive_that_could_land_too_early(steps: list[Step],
                                                              unsafe: tuple[int, int]) -> None:
    assert unsafe not in direct_receives(steps, 3, 1)
    plan = Plan("constructed", 3, 2, tuple(steps))
    inputs = [np.array([1, 2]), np.array([10, 20]), np.array([100, 200])]
    want = execute_plan(plan, inputs)
    as_lists = lambda bufs: [b.tolist() for b in bufs]  # noqa: E731
    # every interleaving of 200 seeded ones keeps the result with the proof's choice...
    choosers = [random.Random(seed).choice for seed in range(200)]
    for choose in choosers:
        assert as_lists(_adversarial_run(plan, inputs, _proved(plan), choose)) == as_lists(want)
    # ...and landed anyway, the receive changes it in one of them: the simulation can tell
    assert any(as_lists(_adversarial_run(plan, inputs, _proved(plan) | {unsafe}, choose))
               != as_lists(want) for choose in choosers)


def test_a_forwarded_all_to_all_has_receives_that_must_keep_the_copy() -> None:
    """Relayed over a ring, landing every COPY receive directly goes wrong in some
    interleaving; the proof refuses those receives and every interleaving stays exact."""
    n = 4
    plan = forwarded(native_plan("ring", "all_to_all", n, 2 * n * 2),
                     {(i, (i + 1) % n) for i in range(n)})
    copies = {(k, t) for k, s in enumerate(plan.steps) if s.op is Op.COPY
              for t in range(len(s.dst))}
    assert _proved(plan) < copies
    rng = np.random.default_rng(1)
    inputs = [rng.integers(-1000, 1000, plan.n_elems) for _ in range(n)]
    want = [w.tolist() for w in execute_plan(plan, inputs)]
    choosers = [random.Random(seed).choice for seed in range(300)]
    runs = [[b.tolist() for b in _adversarial_run(plan, inputs, _proved(plan), c)]
            for c in choosers]
    assert all(run == want for run in runs)
    assert any([b.tolist() for b in _adversarial_run(plan, inputs, copies, c)] != want
               for c in choosers)
