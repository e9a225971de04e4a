"""WRHT: exact sums, 2⌈log_m N⌉ steps, wavelengths reused across groups, link budget refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TIMING, assert_allreduce

from oddl.common.errors import PlanError
from oddl.controller.scheduling import (
    COLLECTIVES,
    LinkBudget,
    Op,
    Topology,
    link_budget,
    make_plan,
    schedule_plan,
    validate_plan,
    wrht_allreduce,
    wrht_wavelength_plan,
)
from oddl.controller.scheduling.wrht import max_group_size, wrht_levels


def levels_by_hand(n: int, m: int) -> int:
    """Smallest L with m**L >= n (the paper's ⌈log_m N⌉, without floating point)."""
    levels = 0
    while m**levels < n:
        levels += 1
    return levels


def segment_load(src: np.ndarray, dst: np.ndarray) -> int:
    """Most lightpaths on one directed fibre segment, each path going straight to its root."""
    load: dict[tuple[int, int], int] = {}
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        step = 1 if d > s else -1
        for a in range(s, d, step):
            load[a, step] = load.get((a, step), 0) + 1
    return max(load.values(), default=0)


@st.composite
def wrht_cases(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 40))
    w = draw(st.integers(1, 5))
    bidirectional = draw(st.booleans())
    m_max = max_group_size(w, bidirectional)
    group_size = draw(st.none() | st.integers(2, m_max))
    return {
        "n": n,
        "wavelengths": w,
        "bidirectional": bidirectional,
        "group_size": group_size,
        "balanced": draw(st.booleans()),
    }


@settings(max_examples=120, deadline=None)
@given(case=wrht_cases(), n_elems=st.integers(0, 60), seed=st.integers(0, 2**32 - 1))
def test_wrht_computes_the_exact_sum_everywhere(case: dict, n_elems: int, seed: int) -> None:
    n = case.pop("n")
    plan = wrht_allreduce(n, n_elems, **case)
    assert_allreduce(plan, seed)
    w, bidir = case["wavelengths"], case["bidirectional"]
    m = case["group_size"] or max(2, min(max_group_size(w, bidir), n))
    if n_elems and n > 1:
        assert plan.n_steps == 2 * levels_by_hand(n, m) == 2 * wrht_levels(n, m)
    half = plan.n_steps // 2
    for step in plan.steps:  # tree all-reduce: every transfer carries the whole buffer
        assert (step.offset == 0).all() and (step.length == n_elems).all()
    assert [s.op for s in plan.steps] == [Op.REDUCE] * half + [Op.COPY] * half
    for up, down in zip(plan.steps[:half], reversed(plan.steps[half:]), strict=True):
        assert np.array_equal(up.src, down.dst) and np.array_equal(up.dst, down.src)


@settings(max_examples=120, deadline=None)
@given(case=wrht_cases())
def test_wavelengths_and_hops_match_a_segment_count(case: dict) -> None:
    n = case.pop("n")
    wp = wrht_wavelength_plan(n, **case)
    plan = wrht_allreduce(n, 1, **case)
    assert len(wp.steps) == plan.n_steps
    for info, step in zip(wp.steps, plan.steps, strict=True):
        assert info.wavelengths == segment_load(step.src, step.dst)
        assert info.max_hops == int(np.abs(step.src - step.dst).max()) - 1
        assert info.wavelengths <= case["wavelengths"]
        assert info.phase == step.phase.split()[0] and f"level {info.level}" in step.phase
    assert wp.ok and wp.wavelengths_needed <= case["wavelengths"]


@pytest.mark.parametrize("groups", [1, 2, 5, 11])
def test_groups_on_disjoint_arcs_reuse_the_same_wavelengths(groups: int) -> None:
    """W = 4 gives m = 9 on a bidirectional ring: 4 wavelengths whatever the number of groups."""
    wp = wrht_wavelength_plan(9 * groups, 4)
    assert wp.group_size == 9
    assert wp.steps[0].wavelengths == 4
    assert wp.steps[0].groups == groups
    assert wp.wavelengths_needed == 4


def test_the_paper_example_1024_nodes_64_wavelengths() -> None:
    wp = wrht_wavelength_plan(1024, 64)
    assert wp.group_size == 129
    assert [s.phase for s in wp.steps] == ["reduce", "reduce", "broadcast", "broadcast"]
    assert wp.wavelengths_needed == 64
    assert wp.ok
    plan = make_plan("wrht", 1024, 1000, wavelengths=64)
    assert plan.n_steps == 4
    validate_plan(plan)


def test_unidirectional_ring_roots_are_last_and_m_is_w_plus_1() -> None:
    plan = wrht_allreduce(8, 5, wavelengths=3, bidirectional=False)
    assert plan.n_steps == 4  # m = 4: 8 -> 2 -> 1
    assert (plan.steps[0].dst > plan.steps[0].src).all()
    assert wrht_wavelength_plan(8, 3, bidirectional=False).steps[0].wavelengths == 3


def test_testbed_default_is_four_wavelengths_one_level() -> None:
    plan = make_plan("wrht", 4, 12)
    assert plan.n_steps == 2
    assert plan.steps[0].dst.tolist() == [2, 2, 2]
    assert plan.bytes_sent(4).tolist() == [48, 48, 144, 48]
    topo = Topology.single_wss(4)
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    s.check_contention_free()
    assert len(s.slots) == 6  # one receiver at the root: 3 rounds up, 3 down


def test_single_node_and_empty_buffer_need_no_steps() -> None:
    assert wrht_allreduce(1, 10).n_steps == 0
    assert wrht_allreduce(5, 0).n_steps == 0
    assert "wrht" in COLLECTIVES


def test_link_budget_formula() -> None:
    b = LinkBudget(
        p_tx_dbm=5.0,
        il_mod_db=2.0,
        il_drop_db=0.5,
        il_through_db=0.01,
        il_cpl_db=1.0,
        span_km=0.05,
        alpha_db_per_km=0.2,
        s_rx_dbm=-20.0,
        margin_db=2.0,
    )
    c = link_budget(100, b)
    assert c.loss_db == pytest.approx(2.0 + 0.5 + 100 * 0.01 + 101 * 0.05 * 0.2 + 1.0)
    assert c.rx_dbm == pytest.approx(5.0 - c.loss_db)
    assert c.required_dbm == -18.0
    assert c.slack_db == pytest.approx(c.rx_dbm + 18.0)
    assert c.ok
    assert not link_budget(3000, b).ok
    limit = b.max_hops()
    assert limit is not None and link_budget(limit, b).ok and not link_budget(limit + 1, b).ok
    with pytest.raises(PlanError, match="must be >= 0; got -1"):
        LinkBudget(il_drop_db=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"wavelengths": 4, "group_size": 10},
            "group_size 10 needs 5 wavelengths on a "
            "bidirectional ring; W=4 allows m <= 9: use group_size <= 9 or wavelengths >= 5",
        ),
        (
            {"wavelengths": 2, "group_size": 4, "bidirectional": False},
            "needs 3 wavelengths on a unidirectional ring; W=2 allows m <= 3",
        ),
        ({"wavelengths": 0}, "at least 1 wavelength; got W=0"),
        ({"group_size": 1}, "group_size must be >= 2; got 1"),
        ({"wavelengths": 2.5}, "whole numbers"),
    ],
)
def test_refusals_name_the_numbers_and_what_works(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError) as err:
        make_plan("wrht", 16, 100, **kwargs)
    assert message in str(err.value)


def test_too_few_wavelengths_in_the_wavelength_plan() -> None:
    wp = wrht_wavelength_plan(16, 2, group_size=9)
    assert wp.wavelengths_needed == 4 and not wp.ok
    with pytest.raises(
        PlanError,
        match="needs 4 wavelengths .* W=2 is too few: use wavelengths >= 4, or group_size <= 5",
    ):
        wp.check()


def test_link_budget_refusal_names_the_nearest_group_size() -> None:
    with pytest.raises(PlanError) as err:
        make_plan("wrht", 2048, 100, wavelengths=64)
    text = str(err.value)
    assert "passes 1023 nodes" in text and "at most 755 nodes" in text
    assert "use group_size=31" in text
    assert make_plan("wrht", 2048, 100, wavelengths=64, group_size=31).n_steps == 6


def test_link_budget_refusal_without_a_working_group_size() -> None:
    weak = LinkBudget(p_tx_dbm=-10.0)
    with pytest.raises(PlanError, match="no path closes.*no group size 2..9 closes it"):
        make_plan("wrht", 16, 100, wavelengths=4, budget=weak)
