"""Collective plans compute exactly the sum at every rank, and refuse what they cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oddl.common.errors import PlanError
from oddl.controller.scheduling import (
    COLLECTIVES,
    Op,
    Plan,
    Step,
    execute_plan,
    halving_doubling_allreduce,
    make_plan,
    register_collective,
    registry,
    ring_allreduce,
    validate_plan,
)

INT64 = np.iinfo(np.int64)


def random_inputs(seed: int, n_ranks: int, n_elems: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(INT64.min, INT64.max, size=n_elems, dtype=np.int64, endpoint=True)
        for _ in range(n_ranks)
    ]


def assert_allreduce(plan: Plan, seed: int) -> None:
    validate_plan(plan)
    inputs = random_inputs(seed, plan.n_ranks, plan.n_elems)
    before = [x.copy() for x in inputs]
    # int64 addition wraps modulo 2**64, which is associative: the sum is exact in any order.
    with np.errstate(over="ignore"):
        expected = np.sum(np.stack(inputs), axis=0, dtype=np.int64)
        outputs = execute_plan(plan, inputs)
    assert len(outputs) == plan.n_ranks
    for rank, out in enumerate(outputs):
        assert out.dtype == np.int64
        assert np.array_equal(out, expected), f"rank {rank} differs"
    for x, y in zip(inputs, before, strict=True):
        assert np.array_equal(x, y), "execute_plan modified its inputs"


sizes = st.integers(min_value=0, max_value=300)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=80, deadline=None)
@given(n_ranks=st.integers(min_value=1, max_value=33), n_elems=sizes, seed=seeds)
def test_ring_computes_the_exact_sum_everywhere(n_ranks: int, n_elems: int, seed: int) -> None:
    plan = ring_allreduce(n_ranks, n_elems)
    assert_allreduce(plan, seed)
    if n_elems >= n_ranks:
        assert plan.n_steps == 2 * (n_ranks - 1)
    assert all(len(s) > 0 for s in plan.steps)


@settings(max_examples=60, deadline=None)
@given(log2=st.integers(min_value=0, max_value=6), n_elems=sizes, seed=seeds)
def test_halving_doubling_computes_the_exact_sum_everywhere(
    log2: int, n_elems: int, seed: int
) -> None:
    plan = halving_doubling_allreduce(1 << log2, n_elems)
    assert_allreduce(plan, seed)
    if n_elems >= 1 << log2:
        assert plan.n_steps == 2 * log2
    for step in plan.steps:  # every step pairs rank i with i XOR 2^k: a perfect matching
        assert np.array_equal(np.sort(step.dst), np.unique(step.dst))


def test_n_elems_below_n_ranks_omits_empty_transfers() -> None:
    plan = ring_allreduce(8, 3)
    validate_plan(plan)
    assert all((s.length > 0).all() for s in plan.steps)
    assert plan.n_transfers < 2 * 7 * 8
    assert ring_allreduce(8, 0).n_steps == 0
    assert halving_doubling_allreduce(8, 0).n_steps == 0


def test_a_single_rank_needs_no_steps() -> None:
    assert ring_allreduce(1, 10).n_steps == 0
    assert halving_doubling_allreduce(1, 10).n_steps == 0
    out = execute_plan(ring_allreduce(1, 3), [np.arange(3)])
    assert out[0].tolist() == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(
    n_ranks=st.integers(min_value=2, max_value=64),
    n_elems=st.integers(min_value=0, max_value=10_000),
    itemsize=st.sampled_from([1, 2, 4, 8]),
)
def test_ring_sends_2_n_minus_1_over_n_of_the_buffer(
    n_ranks: int, n_elems: int, itemsize: int
) -> None:
    plan = ring_allreduce(n_ranks, n_elems)
    ideal = 2 * (n_ranks - 1) / n_ranks * n_elems * itemsize
    sent = plan.bytes_sent(itemsize)
    assert sent.shape == (n_ranks,)
    # Chunks are floor or ceil of S/N, and each rank skips two of them.
    assert np.all(np.abs(sent - ideal) < 2 * itemsize)
    assert sent.sum() == plan.bytes_received(itemsize).sum()


def test_ring_shares_arrays_between_steps() -> None:
    plan = ring_allreduce(16, 1600)
    assert all(s.src is plan.steps[0].src and s.dst is plan.steps[0].dst for s in plan.steps)
    assert not plan.steps[0].offset.flags.writeable
    assert [s.op for s in plan.steps] == [Op.REDUCE] * 15 + [Op.COPY] * 15


@pytest.mark.parametrize(
    ("n", "fix"), [(6, "use 4 or 8, or the ring"), (3, "use 2 or 4"), (1000, "use 512 or 1024")]
)
def test_halving_doubling_refuses_other_counts(n: int, fix: str) -> None:
    with pytest.raises(PlanError, match="power-of-two") as err:
        make_plan("halving-doubling", n, 100)
    assert f"got {n}" in str(err.value)
    assert fix in str(err.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ring", 0, 10), "at least 1 rank; got 0"),
        (("ring", 4, -1), "n_elems >= 0; got -1"),
        (("ring", 4.5, 10), "integer n_ranks"),
        (("rnig", 4, 10), "did you mean 'ring'"),
    ],
)
def test_make_plan_refusals_name_the_bad_value(args: tuple, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan(*args)


def test_make_plan_refuses_unknown_parameters() -> None:
    with pytest.raises(PlanError, match="does not take parameters \\['degree'\\]"):
        make_plan("ring", 4, 10, degree=3)


def test_new_collectives_register_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "COLLECTIVES", dict(COLLECTIVES))

    @register_collective("gather-broadcast")
    def gather_broadcast(n_ranks: int, n_elems: int, *, root: int = 0) -> Plan:
        others = np.array([r for r in range(n_ranks) if r != root], dtype=np.int64)
        roots = np.full(len(others), root, dtype=np.int64)
        zeros = np.zeros(len(others), dtype=np.int64)
        lengths = np.full(len(others), n_elems, dtype=np.int64)
        steps = (
            Step(others, roots, zeros, lengths, Op.REDUCE),
            Step(roots, others, zeros, lengths, Op.COPY),
        )
        return Plan("gather-broadcast", n_ranks, n_elems, steps)

    assert_allreduce(make_plan("gather-broadcast", 5, 7, root=2), seed=1)
    with pytest.raises(PlanError, match="already registered"):
        register_collective("gather-broadcast")(gather_broadcast)
    assert "gather-broadcast" not in COLLECTIVES  # the real registry is untouched


def _plan(
    src: list[int], dst: list[int], off: list[int], ln: list[int], op: Op = Op.REDUCE
) -> Plan:
    arr = [np.array(x, dtype=np.int64) for x in (src, dst, off, ln)]
    return Plan("hand-made", 3, 10, (Step(*arr, op),))


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (_plan([0], [3], [0], [1]), "ranks are 0..2"),
        (_plan([1], [1], [0], [1]), "rank 1 sends to itself"),
        (_plan([0], [1], [8], [5]), "inside \\[0, 10\\)"),
        (_plan([0], [1], [0], [0]), "non-empty"),
        (_plan([0], [1], [-1], [2]), "inside"),
        (_plan([0, 2], [1, 1], [0, 3], [5, 5], Op.COPY), "overlapping COPY segments"),
    ],
)
def test_validate_plan_rejects_bad_transfers(plan: Plan, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        validate_plan(plan)


def test_validate_plan_allows_overlapping_reduces() -> None:
    validate_plan(_plan([0, 2], [1, 1], [0, 3], [5, 5], Op.REDUCE))


def test_step_needs_equal_arrays() -> None:
    with pytest.raises(PlanError, match="equal length"):
        Step(
            np.zeros(2, np.int64),
            np.zeros(3, np.int64),
            np.zeros(2, np.int64),
            np.zeros(2, np.int64),
            Op.COPY,
        )


def test_execute_plan_checks_its_inputs() -> None:
    plan = ring_allreduce(3, 4)
    with pytest.raises(PlanError, match="3 ranks; got 2 inputs"):
        execute_plan(plan, [np.zeros(4), np.zeros(4)])
    with pytest.raises(PlanError, match="input 1 has shape \\(5,\\)"):
        execute_plan(plan, [np.zeros(4), np.zeros(5), np.zeros(4)])
