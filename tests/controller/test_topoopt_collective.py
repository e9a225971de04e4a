"""The ``topoopt`` collective on the testbed: an exact all-reduce over TotientPerms rings, one
fixed ring at degree 2, configured once at admission (moved from test_topoopt.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import TIMING

import oddl.controller.scheduling.topoopt  # noqa: F401  (registers "topoopt")
from oddl.common.config import load_testbed
from oddl.common.errors import OperationRefused, PlanError
from oddl.controller.admission import Admission
from oddl.controller.schedules import Schedules
from oddl.controller.scheduling import (
    Topology,
    execute_plan,
    make_plan,
    schedule_plan,
    validate_plan,
)
from oddl.controller.scheduling.topoopt import topoopt_allreduce
from oddl.controller.testbed_model import timing_from_config, topology_from_config

EMULATED = Path(__file__).resolve().parents[2] / "deploy" / "testbeds" / "emulated-4node.toml"


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 12), n_elems=st.integers(0, 70), degree=st.sampled_from([2, 4, 6]),
       both=st.booleans(), seed=st.integers(0, 2**31))
def test_topoopt_plan_is_an_exact_allreduce(n: int, n_elems: int, degree: int, both: bool,
                                            seed: int) -> None:
    try:
        plan = make_plan("topoopt", n, n_elems, degree=degree, both_directions=both)
    except PlanError as exc:
        assert "degree" in str(exc)
        return
    validate_plan(plan)
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.int64)
    inputs = [rng.integers(info.min, info.max, size=n_elems, dtype=np.int64, endpoint=True)
              for _ in range(n)]
    with np.errstate(over="ignore"):
        expected = np.sum(np.stack(inputs), axis=0, dtype=np.int64) if n else None
        outputs = execute_plan(plan, inputs)
    for out in outputs:
        assert np.array_equal(out, expected)


def test_degree_two_plan_is_one_fixed_ring_and_never_retunes() -> None:
    plan = topoopt_allreduce(4, 1000)
    assert plan.n_steps == 6
    for step in plan.steps:
        assert step.src.tolist() == [0, 1, 2, 3] and step.dst.tolist() == [1, 2, 3, 0]
    topo = Topology.single_wss(4)
    sched = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    assert sched.slots[0].retuned
    assert not any(s.retuned for s in sched.slots[1:])
    again = schedule_plan(plan, topo.node_ids, topo, TIMING, 4,
                          initial_channels=sched.final_channels)
    assert again.reconfigurations == 0
    # the authors' picks for degree 4 on 4 nodes are 1 and 3 = 4 - 1: each neighbour pair
    # gets two circuits (docs/explanation/topoopt.md §2.1); degree 6 cannot be served
    four = topoopt_allreduce(4, 12, degree=4)
    assert sorted(set(zip(four.steps[0].src.tolist(), four.steps[0].dst.tolist(),
                          strict=True))) == sorted({(i, (i + p) % 4) for i in range(4)
                                                     for p in (1, 3)})
    with pytest.raises(PlanError, match="topoopt: totientperms degree 6 is too large for 4 "
                       "nodes.* use 4"):
        topoopt_allreduce(4, 10, degree=6)


def test_a_topoopt_job_is_configured_once_at_admission_and_keeps_it() -> None:
    cfg = load_testbed(EMULATED)
    topology, timing = topology_from_config(cfg), timing_from_config(cfg)
    admission, schedules = Admission(cfg, topology, timing), Schedules(cfg, topology, timing, 1.0)
    job, target = admission.admit("train", [], "topoopt", "optical", {}, 0, job_id="job-1",
                                  jobs=[])
    nodes = job.nodes
    assert len(target.channels) == len(nodes) and target.wss_tables
    held: dict[str, int | None] = {n.id: target.channels[n.transmitter] for n in cfg.nodes}
    for size in (1000, 250_000, 3):  # collectives of any size reuse the admission's circuits
        sched = schedules.schedule(job, size, 4, held)
        assert sched.reconfigurations == 0
        held = dict(sched.final_channels)
    with pytest.raises(OperationRefused, match="use degree 2"):
        admission.admit("big", [], "topoopt", "optical", {"degree": "4"}, 0, job_id="job-2",
                        jobs=[job])
