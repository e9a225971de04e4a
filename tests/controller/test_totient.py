"""TotientPerms: J(g) and SelectPermutations reproduce docs/sources.md §3; the all-reduce is exact."""

from __future__ import annotations

import gzip
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TIMING, assert_allreduce

from oddl.common.errors import PlanError
from oddl.controller.scheduling import (
    Topology,
    candidate_jumps,
    circulant_diameter,
    make_plan,
    schedule_plan,
    select_permutations,
    totientperms_allreduce,
)
from oddl.controller.scheduling.totient import (
    choose_geometric,
    max_degree,
    ring_jumps,
    totient_picks,
)

# --------------------------------------------------------------------------- docs/sources.md §3.1


@pytest.mark.parametrize(
    ("g", "jumps"),
    [(12, (1, 5, 7, 11)), (6, (2, 10)), (4, (3, 9)), (3, (4, 8)), (2, (6,))],
)
def test_candidate_jumps_table_for_n_12(g: int, jumps: tuple[int, ...]) -> None:
    assert candidate_jumps(12, g) == jumps


@pytest.mark.parametrize(("n", "phi"), [(128, 64), (1024, 512)])
def test_candidate_jumps_of_a_power_of_two_are_the_odd_numbers(n: int, phi: int) -> None:
    jumps = candidate_jumps(n, n)
    assert jumps == tuple(range(1, n, 2))
    assert len(jumps) == phi


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), data=st.data())
def test_candidate_jumps_follow_the_rule(n: int, data: st.DataObject) -> None:
    g = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    jumps = candidate_jumps(n, g)
    assert jumps == tuple((n // g) * k for k in range(1, g + 1) if math.gcd(k, g) == 1)
    if g > 1:  # every jump walks once around its group before closing
        for p in jumps:
            assert len({(p * i) % n for i in range(g)}) == g


def test_candidate_jumps_refuse_a_group_size_that_does_not_divide_n() -> None:
    with pytest.raises(PlanError, match="g that divides n; got n=12, g=5 .*1, 2, 3, 4, 6, 12"):
        candidate_jumps(12, 5)


# --------------------------------------------------------------------------- docs/sources.md §3.2


@pytest.mark.parametrize(
    ("n", "degree", "jumps", "diameter"),
    [
        (12, 4, (1, 5, 7, 11), 3),
        (16, 4, (1, 5, 11, 15), 4),
        (128, 4, (1, 13, 115, 127), 10),
        (128, 8, (1, 5, 13, 39, 89, 115, 123, 127), 5),
        (1024, 4, (1, 33, 991, 1023), 32),
        (1024, 8, (1, 7, 33, 181, 843, 991, 1017, 1023), 8),
    ],
)
def test_select_permutations_table(
    n: int, degree: int, jumps: tuple[int, ...], diameter: int
) -> None:
    assert select_permutations(n, degree) == jumps
    assert circulant_diameter(n, jumps) == diameter


def bfs_diameter(n: int, jumps: list[int]) -> int:
    """Plain BFS from every node (independent of the vectorised one)."""
    worst = 0
    for s in range(n):
        dist = {s: 0}
        todo = deque([s])
        while todo:
            u = todo.popleft()
            for p in jumps:
                v = (u + p) % n
                if v not in dist:
                    dist[v] = dist[u] + 1
                    todo.append(v)
        assert len(dist) == n
        worst = max(worst, max(dist.values()))
    return worst


AUTHORS_TABLE = Path(__file__).parents[1] / "data" / "totientperms_authors.txt.gz"


def authors_rows() -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(n, g, degree, picks) rows produced by the authors' own code (see the file's header)."""
    rows = []
    with gzip.open(AUTHORS_TABLE, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            n, g, d, *picks = map(int, line.split())
            rows.append((n, g, d, tuple(picks)))
    return rows


def test_picks_equal_the_authors_code_on_every_row_of_the_table() -> None:
    rows = authors_rows()
    assert len(rows) > 13000
    assert {n for n, *_ in rows} >= set(range(2, 513)) | {1024, 4096}
    wrong = [
        (n, g, d, picks, ours)
        for n, g, d, picks in rows
        if (ours := totient_picks(n, d, g)) != picks
    ]
    assert not wrong, f"{len(wrong)} rows differ, first: {wrong[:3]}"


@pytest.mark.parametrize(
    ("n", "degree", "picks"),
    # rows of the authors' table where a tolerance of 1e-9 in the lower bound (our earlier
    # version) picks a different jump: c lands within rounding of a candidate from above
    [(26, 8, (1, 3, 7, 15)), (50, 8, (1, 3, 9, 19)), (101, 8, (1, 4, 11, 32))],
)
def test_floating_point_steps_are_the_authors(n: int, degree: int, picks: tuple[int, ...]) -> None:
    assert totient_picks(n, degree) == picks


def test_degree_10_can_repeat_a_node_pair_as_the_authors_code_does() -> None:
    # n = 11, d = 10: the fifth pick, 7, is the reverse of the fourth, 4
    assert totient_picks(11, 10) == (1, 2, 3, 4, 7)
    jumps = select_permutations(11, 10)
    assert jumps == (1, 2, 3, 4, 4, 7, 7, 8, 9, 10)
    # ours: skip a candidate whose reverse is taken, so 5 distinct node pairs
    assert totient_picks(11, 10, distinct=True) == (1, 2, 3, 4, 6)
    assert len(set(select_permutations(11, 10, distinct=True))) == 10
    assert circulant_diameter(11, jumps) == 2 and circulant_diameter(11, range(1, 11)) == 1


def test_choose_geometric_refuses_more_picks_than_candidates() -> None:
    with pytest.raises(PlanError, match="cannot pick 5 of 4 candidate jumps; use 1 to 4"):
        choose_geometric((1, 5, 7, 11), 5)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 60), data=st.data(), distinct=st.booleans())
def test_selection_is_symmetric_connected_and_of_the_asked_degree(
    n: int, data: st.DataObject, distinct: bool
) -> None:
    degree = data.draw(st.sampled_from(range(2, max_degree(n, distinct) + 1, 2)))
    jumps = select_permutations(n, degree, distinct)
    assert sorted(jumps) == sorted((n - p) % n or n for p in jumps)
    assert set(jumps) <= set(candidate_jumps(n, n))
    assert len(jumps) == degree
    if distinct and n > 2:
        assert len(set(jumps)) == degree
    assert circulant_diameter(n, jumps) == bfs_diameter(n, sorted(set(jumps)))


def test_circulant_diameter_refuses_a_disconnected_graph() -> None:
    with pytest.raises(PlanError, match="do not connect 12 nodes .*multiples of 2"):
        circulant_diameter(12, [2, 10])


# --------------------------------------------------------------------------- all-reduce


@st.composite
def totient_cases(draw: st.DrawFn) -> tuple[int, int, bool]:
    n = draw(st.integers(1, 36))
    degree = draw(st.sampled_from(range(2, max_degree(n) + 1, 2)))
    return n, degree, draw(st.booleans())


@settings(max_examples=100, deadline=None)
@given(case=totient_cases(), n_elems=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_totientperms_computes_the_exact_sum_everywhere(
    case: tuple[int, int, bool], n_elems: int, seed: int
) -> None:
    n, degree, both = case
    plan = totientperms_allreduce(n, n_elems, degree=degree, both_directions=both)
    assert_allreduce(plan, seed)
    rings = ring_jumps(n, degree, both)
    if n > 1 and n_elems >= n * len(rings):
        assert plan.n_steps == 2 * (n - 1)
        # each merged step holds one i -> i+p transfer per rank and ring
        for step in plan.steps:
            pairs = sorted(zip(step.src.tolist(), step.dst.tolist(), strict=True))
            assert pairs == sorted((i, (i + p) % n) for i in range(n) for p in rings)


@settings(max_examples=40, deadline=None)
@given(case=totient_cases(), n_elems=st.integers(0, 5000), itemsize=st.sampled_from([1, 4]))
def test_every_node_sends_2_n_minus_1_over_n_of_the_buffer(
    case: tuple[int, int, bool], n_elems: int, itemsize: int
) -> None:
    n, degree, both = case
    plan = totientperms_allreduce(n, n_elems, degree=degree, both_directions=both)
    sent = plan.bytes_sent(itemsize)
    ideal = 2 * (n - 1) / n * n_elems * itemsize
    rings = len(ring_jumps(n, degree, both)) or 1
    assert np.all(np.abs(sent - ideal) <= 2 * rings * itemsize)


def test_default_is_one_ring_with_jump_1() -> None:
    plan = make_plan("totientperms", 6, 60)
    ring = make_plan("ring", 6, 60)
    assert plan.n_steps == ring.n_steps
    for a, b in zip(plan.steps, ring.steps, strict=True):
        assert a.src.tolist() == b.src.tolist() and a.dst.tolist() == b.dst.tolist()


def test_degree_4_on_12_nodes_uses_rings_1_and_5() -> None:
    assert ring_jumps(12, 4) == (1, 5)
    assert ring_jumps(12, 4, both_directions=True) == (1, 5, 7, 11)
    plan = totientperms_allreduce(12, 1200, degree=4)
    assert len(plan.steps[0]) == 24
    assert plan.steps[1].src is plan.steps[0].src  # steps share their arrays


def test_scheduler_splits_each_merged_step_into_one_round_per_ring() -> None:
    topo = Topology.single_wss(12)
    plan = totientperms_allreduce(12, 1200, degree=4)
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    s.check_contention_free()
    assert len(s.slots) == 2 * plan.n_steps
    assert {slot.round for slot in s.slots} == {0, 1}


@pytest.mark.parametrize(
    ("n", "degree", "message"),
    [
        (12, 3, "degree 3 is odd.*use 2 or 4"),
        (12, 0, "degree must be >= 2 .*got 0, use 2"),
        (
            12,
            10,
            "degree 10 is too large for 12 nodes: J\\(12\\) has 4 jumps and each of the 4 "
            "pick.*at most 8; use 8",
        ),
        (1024, 1026, "at most 1024; use 1024"),
        (4, 6, "at most 4; use 4"),
        (12, 2.0, "degree must be a whole number"),
    ],
)
def test_refusals_name_the_degree_and_the_nearest_valid_one(
    n: int, degree: object, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan("totientperms", n, 100, degree=degree)


def test_distinct_refuses_a_degree_that_must_repeat_a_pair() -> None:
    with pytest.raises(PlanError, match="at most 2 distinct ring.*at most 4; use 4"):
        make_plan("totientperms", 12, 100, degree=6, distinct=True)
    assert ring_jumps(12, 6) == (1, 5, 7)  # the authors' picks: 7 = 12 - 5, pair repeated


def test_single_node_and_empty_buffer_need_no_steps() -> None:
    assert totientperms_allreduce(1, 10).n_steps == 0
    assert totientperms_allreduce(8, 0, degree=4).n_steps == 0
