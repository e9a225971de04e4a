"""The TT-FR scheduler's rounds: a step that is not a matching splits into Δ rounds by
bipartite edge colouring, its duplicate flows merged (moved from test_scheduler.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TESTBED_TIMING as TIMING

from oddl.controller.scheduling import (
    Op,
    Plan,
    Step,
    Topology,
    bipartite_edge_colouring,
    schedule_plan,
)


def _one_step_plan(n: int, pairs: list[tuple[int, int]], length: int = 5) -> Plan:
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)
    off = np.zeros(len(pairs), dtype=np.int64)
    ln = np.full(len(pairs), length, dtype=np.int64)
    return Plan("hand-made", n, length, (Step(src, dst, off, ln, Op.REDUCE),))


def test_all_to_one_is_split_into_n_minus_1_rounds() -> None:
    n = 6
    topo = Topology.single_wss(n)
    plan = _one_step_plan(n, [(r, 0) for r in range(1, n)])
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, itemsize=4)
    s.check_contention_free()
    assert len(s.slots) == n - 1
    assert [x.round for x in s.slots] == list(range(n - 1))
    assert sorted(int(x.src_rank[0]) for x in s.slots) == list(range(1, n))
    assert all(x.n_flows == 1 and x.step == 0 for x in s.slots)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 10),
    data=st.data(),
)
def test_any_step_splits_into_max_degree_rounds(n: int, data: st.DataObject) -> None:
    pairs = data.draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1]),
            min_size=1,
            max_size=40,
        )
    )
    topo = Topology.single_wss(n)
    s = schedule_plan(_one_step_plan(n, pairs, length=3), topo.node_ids, topo, TIMING, itemsize=2)
    s.check_contention_free()
    merged = Counter(pairs)
    degree = max(
        max(Counter(p[0] for p in merged).values()), max(Counter(p[1] for p in merged).values())
    )
    assert len(s.slots) == degree
    got = Counter()
    for slot in s.slots:
        for a, b, nbytes in zip(
            slot.src_rank.tolist(), slot.dst_rank.tolist(), slot.bytes.tolist(), strict=True
        ):
            assert (a, b) not in got, "a merged flow was split over two rounds"
            got[a, b] = nbytes
    assert got == {p: k * 3 * 2 for p, k in merged.items()}  # duplicates merged, bytes summed


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=60))
def test_edge_colouring_is_proper_with_max_degree_colours(edges: list[tuple[int, int]]) -> None:
    left = np.array([e[0] for e in edges], dtype=np.int64)
    right = np.array([e[1] for e in edges], dtype=np.int64)
    colour = bipartite_edge_colouring(left, right)  # multigraphs too
    assert len(colour) == len(edges)
    if not edges:
        return
    degree = max(max(Counter(left.tolist()).values()), max(Counter(right.tolist()).values()))
    assert colour.min() >= 0 and colour.max() == degree - 1
    for side in (left, right):
        seen = set()
        for v, c in zip(side.tolist(), colour.tolist(), strict=True):
            assert (v, c) not in seen
            seen.add((v, c))
