"""Parameter server: exact sums, two whole-buffer steps, N−1 rounds at the server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TIMING, assert_allreduce

from oddl.common.errors import PlanError
from oddl.controller.scheduling import (
    Op,
    Topology,
    make_plan,
    parameter_server_allreduce,
    schedule_plan,
)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 40),
    n_elems=st.integers(0, 200),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_parameter_server_computes_the_exact_sum_everywhere(
    n: int, n_elems: int, seed: int, data: st.DataObject
) -> None:
    server = data.draw(st.integers(0, n - 1))
    plan = parameter_server_allreduce(n, n_elems, server=server)
    assert_allreduce(plan, seed)
    if n > 1 and n_elems:
        assert [s.op for s in plan.steps] == [Op.REDUCE, Op.COPY]
        assert set(plan.steps[0].dst.tolist()) == {server}
        sent = plan.bytes_sent(4)
        assert sent[server] == (n - 1) * n_elems * 4
        assert all(sent[r] == n_elems * 4 for r in range(n) if r != server)
    else:
        assert plan.n_steps == 0


def test_scheduler_serialises_the_server() -> None:
    topo = Topology.single_wss(5)
    plan = make_plan("parameter-server", 5, 100, server=2)
    s = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    s.check_contention_free()
    assert len(s.slots) == 8  # 4 rounds into the server's receiver, 4 out of its transmitter
    assert all(slot.n_flows == 1 for slot in s.slots)


@pytest.mark.parametrize(
    ("server", "message"), [(4, "server rank 4 is not a rank of 4; use 0..3"), ("a", "rank number")]
)
def test_refuses_a_server_outside_the_job(server: object, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan("parameter-server", 4, 10, server=server)
