"""Forwarding through hosts: a plan rewritten to follow the job's links hop by hop (TopoOpt's
routes on its rings) gives every rank exactly what the direct plan gives, with scratch past
the caller's elements."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oddl.common.errors import PlanError
from oddl.controller.scheduling import execute_plan, make_plan, validate_plan
from oddl.controller.scheduling.forwarding import forwarded, needs_forwarding, routes
from oddl.controller.scheduling.native import all_to_all, broadcast_chain
from oddl.offline.topoopt.routing import coin_change


def circulant(n: int, jumps: tuple[int, ...]) -> set[tuple[int, int]]:
    return {(i, (i + p) % n) for i in range(n) for p in jumps}


def _same_as_direct(plan, links, rng, *, dtype=np.int64):  # type: ignore[no-untyped-def]
    routed = forwarded(plan, links)
    validate_plan(routed)
    for step in routed.steps:
        assert set(zip(step.src.tolist(), step.dst.tolist(), strict=True)) <= set(links)
    inputs = [rng.integers(-1000, 1000, plan.n_elems).astype(dtype) for _ in range(plan.n_ranks)]
    want = execute_plan(plan, inputs)
    padded = [np.concatenate([x, np.zeros(routed.n_elems - plan.n_elems, dtype)]) for x in inputs]
    got = execute_plan(routed, padded)
    for r in range(plan.n_ranks):
        assert np.array_equal(got[r][:plan.n_elems], want[r]), f"rank {r}"
    return routed


def test_an_all_to_all_on_topoopts_rings_is_relayed_exactly() -> None:
    links = circulant(12, (1, 5, 7, 11))
    plan = all_to_all(12, 2 * 12 * 5)
    assert needs_forwarding(plan, links)
    routed = _same_as_direct(plan, links, np.random.default_rng(1))
    assert routed.n_elems > plan.n_elems  # the relays' scratch
    assert len(routed.steps) > len(plan.steps)


@pytest.mark.parametrize("jumps", [(1, 5, 7, 11), (1, 11), (5, 7)])
def test_routes_have_as_many_hops_as_topoopts_coin_change(jumps: tuple[int, ...]) -> None:
    n = 12
    found = routes(n, circulant(n, jumps))
    for stride in range(1, n):
        assert len(found[(0, stride)]) - 1 == len(coin_change(n, jumps, stride)), stride


def test_a_ring_all_reduce_on_other_jumps_and_a_broadcast_chain_are_exact() -> None:
    rng = np.random.default_rng(2)
    _same_as_direct(make_plan("ring", 12, 12 * 7), circulant(12, (5, 7)), rng)
    _same_as_direct(broadcast_chain(12, 12 * 11, 3), circulant(12, (5, 7)), rng)


def test_a_plan_on_its_links_is_left_alone_and_an_unreachable_pair_is_named() -> None:
    plan = make_plan("ring", 6, 60)
    links = circulant(6, (1,))
    assert forwarded(plan, links) is plan
    with pytest.raises(PlanError, match="no route from rank 0 to rank 1 over the job's links"):
        forwarded(plan, circulant(6, (2,)))  # jump 2 on 6 nodes reaches only even ranks


@settings(max_examples=40, deadline=None)
@given(n=st.integers(3, 9), data=st.data())
def test_any_connected_topology_gives_the_direct_result(n: int, data: st.DataObject) -> None:
    jumps = tuple(sorted(set(data.draw(st.lists(st.integers(1, n - 1), min_size=1,
                                                 max_size=3)))))
    links = circulant(n, jumps)
    if len(routes(n, links)) < n * (n - 1):
        jumps = (*jumps, 1)
        links = circulant(n, jumps)
    kind = data.draw(st.sampled_from(["all_to_all", "ring"]))
    if kind == "all_to_all":
        plan = all_to_all(n, 2 * n * data.draw(st.integers(1, 4)))
    else:
        plan = make_plan("ring", n, n * data.draw(st.integers(1, 5)))
    _same_as_direct(plan, links, np.random.default_rng(n))
