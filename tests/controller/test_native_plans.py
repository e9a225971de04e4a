"""The native collectives' plans and checks, without processes: every kind's plan delivers the
right blocks for N = 1..9 (the reference executor, snapshot semantics), all-gather and
reduce-scatter send (N−1)/N of the buffer per rank, all-to-all lands its blocks through the
receive offset on the wire, old plans stay byte-identical, and the calls the barrier, the
ready exchange and the agent refuse name their reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
from core_parts import go_of, ready, register_all, unconnected_core
from helpers import EMULATED
from plan_checks import TIMING

from oddl.agents.collective import outcome
from oddl.agents.collective.chunks import chunk_plan
from oddl.agents.collective.standing import Ready, agree
from oddl.cli.plan import main as plan_main
from oddl.common.collective_kinds import check_call, check_on_job, work_blocks
from oddl.common.config import parse_testbed
from oddl.common.errors import OperationRefused, PlanError, StepMismatch
from oddl.controller.barriers import BarrierBook
from oddl.controller.scheduling import (
    Topology,
    execute_plan,
    make_plan,
    schedule_plan,
    validate_plan,
)
from oddl.controller.scheduling.native import blocks, native_plan
from oddl.controller.testbed_model import timing_from_config, topology_from_config
from oddl.offline.simulator.core import SimConfig
from oddl.offline.simulator.engine import simulate
from oddl.offline.simulator.testbed import predict_testbed_allreduce
from oddl.protos.schedule_wire import decode_schedule, encode_schedule


def _inputs(n: int, n_elems: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-2**62, 2**62, n_elems) for _ in range(n)]


def _algorithms(n: int) -> list[str]:
    return ["ring", "halving-doubling"] if n & (n - 1) == 0 else ["ring"]


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("m", [1, 3, 7])
def test_all_gather_and_reduce_scatter_deliver_every_block(n: int, m: int):
    n_elems = n * m
    bound = blocks(n, n_elems)
    xs = _inputs(n, n_elems, n * 10 + m)
    for algorithm in _algorithms(n):
        gather = native_plan(algorithm, "all_gather", n, n_elems)
        validate_plan(gather)
        stacked = np.concatenate([xs[j][bound[j]:bound[j + 1]] for j in range(n)])
        assert all(np.array_equal(out, stacked) for out in execute_plan(gather, xs))
        for op, ufunc in (("sum", np.add), ("max", np.maximum), ("bxor", np.bitwise_xor)):
            scatter = native_plan(algorithm, "reduce_scatter", n, n_elems)
            validate_plan(scatter)
            outs = execute_plan(scatter, xs, ufunc)
            with np.errstate(over="ignore"):
                full = ufunc.reduce(np.stack(xs), axis=0)
            for r, out in enumerate(outs):
                assert np.array_equal(out[bound[r]:bound[r + 1]], full[bound[r]:bound[r + 1]]), (
                    algorithm, op, r)
        for plan in (gather, scatter):  # (N−1)/N of the buffer, on every rank
            assert plan.bytes_sent(8).tolist() == [(n - 1) * m * 8] * n
            assert plan.bytes_received(8).tolist() == [(n - 1) * m * 8] * n


@pytest.mark.parametrize("n", range(1, 10))
def test_rooted_kinds_deliver_from_and_to_every_root(n: int):
    n_elems = 5 * n + 2  # blocks of unequal size
    bound = blocks(n, n_elems)
    xs = _inputs(n, n_elems, n)
    for root in range(n):
        chain = native_plan("ring", "broadcast", n, n_elems, root)
        validate_plan(chain)
        assert all(np.array_equal(out, xs[root]) for out in execute_plan(chain, xs))
        assert chain.n_steps == max(0, 2 * n - 3)  # N−1 pieces, each N−1 hops, pipelined
        outs = execute_plan(native_plan("ring", "gather", n, n_elems, root), xs)
        assert np.array_equal(outs[root], np.concatenate(
            [xs[j][bound[j]:bound[j + 1]] for j in range(n)]))
        outs = execute_plan(native_plan("ring", "scatter", n, n_elems, root), xs)
        for r, out in enumerate(outs):
            assert np.array_equal(out[bound[r]:bound[r + 1]], xs[root][bound[r]:bound[r + 1]])


@pytest.mark.parametrize("n", range(1, 10))
def test_all_to_all_lands_block_i_from_rank_i(n: int):
    m = 3
    xs = _inputs(n, 2 * n * m, 100 + n)
    plan = native_plan("halving-doubling" if n & (n - 1) == 0 else "ring", "all_to_all", n,
                       2 * n * m)
    validate_plan(plan)
    assert plan.n_steps == max(n - 1, 0)
    outs = execute_plan(plan, xs)
    for r, out in enumerate(outs):
        for i in range(n):
            if i != r:
                assert np.array_equal(out[n * m + i * m:n * m + (i + 1) * m],
                                      xs[i][r * m:(r + 1) * m])
    assert plan.bytes_sent(1).tolist() == [(n - 1) * m] * n
    with pytest.raises(PlanError, match="2·N equal blocks"):
        native_plan("ring", "all_to_all", 4, 2 * 4 * 3 + 1)
    with pytest.raises(PlanError, match="all_to_all has no root"):
        native_plan("ring", "all_to_all", 4, 8, root=1)


def _wire(plan_name: str, kind: str, n: int, n_elems: int):
    topo = Topology.single_wss(n)
    plan = native_plan(plan_name, kind, n, n_elems)
    sched = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
    return plan, encode_schedule(sched, "job", 1.0)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_kind_schedules_without_contention(n: int):
    topo = Topology.single_wss(n)
    for algorithm in _algorithms(n):
        for kind in ("all_gather", "reduce_scatter", "broadcast", "all_to_all", "gather",
                     "scatter"):
            root = n - 1 if kind in ("broadcast", "gather", "scatter") else 0
            plan = native_plan(algorithm, kind, n, 2 * n * 1000, root=root)
            sched = schedule_plan(plan, topo.node_ids, topo, TIMING, 4)
            sched.check_contention_free()
            assert {s.step for s in sched.slots} == set(range(plan.n_steps)), (algorithm, kind)


def test_the_receive_offset_travels_and_old_plans_stay_byte_identical():
    _, ring = _wire("ring", "all_reduce", 4, 4000)
    assert all(len(s.recv_offset) == 0 for s in ring.steps)
    topo = Topology.single_wss(4)
    again = encode_schedule(schedule_plan(make_plan("ring", 4, 4000), topo.node_ids, topo,
                                          TIMING, 4), "job", 1.0)
    assert again.SerializeToString(deterministic=True) == ring.SerializeToString(
        deterministic=True)
    plan, wire = _wire("ring", "all_to_all", 4, 8 * 1000)
    steps = decode_schedule(wire).steps
    assert [list(s.landing) for s in steps] == [p.recv_offset.tolist() for p in plan.steps]
    # the agents' chunks land where the plan says: rank 1 gets rank 0's block 1 in output
    # block 0, and reads its own input block (k+1) to send
    cp = chunk_plan(steps, 1, 250)
    first = [c for c in cp.recvs if c.step == 0]
    assert first[0].peer == 0 and first[0].offset == 1000 and first[0].landing == 4000
    assert cp.pipelined


def test_the_barrier_refuses_mismatched_calls_and_optinc_other_than_sum():
    barriers, nodes = BarrierBook(), ("n0", "n1", "n2", "n3")
    calls = [("all_reduce", "sum", 0), ("all_reduce", "max", 0)] * 2
    for node, call in zip(nodes, calls, strict=True):
        outcome = barriers.ready("job-1", 4, 1, node, [8], "<f4", 0, call)
    assert outcome is not None and "n0: all_reduce sum, n1: all_reduce max" in outcome.error
    for node in nodes:
        outcome = barriers.ready("job-1", 4, 2, node, [8], "<f4", 0, ("broadcast", "sum", 2))
    assert outcome is not None and not outcome.error
    assert (outcome.kind, outcome.root, outcome.n_elems) == ("broadcast", 2, 8)
    core = unconnected_core()
    ojob, _ = core.admit("o", [], "optinc", "optical", {}, 0)
    register_all(core)
    for node in ojob.nodes:
        ready(core, ojob.id, 1, node, [8], "<f4", 0, ("all_reduce", "max", 0))
    assert "averages the uploads in the network" in go_of(core, "n0").error


def test_the_agent_refuses_what_the_job_cannot_serve():
    f4, i4 = np.dtype("<f4"), np.dtype("<i4")
    with pytest.raises(OperationRefused, match="bitwise: it takes integer arrays, not float32"):
        check_call("all_reduce", "band", 0, f4)
    with pytest.raises(OperationRefused, match="all_gather does not reduce"):
        check_call("all_gather", "max", 0, i4)
    with pytest.raises(OperationRefused, match="all_to_all has no root"):
        check_call("all_to_all", "sum", 1, i4)
    with pytest.raises(OperationRefused, match="optinc cannot run all_reduce max.*averages"):
        check_on_job(("all_reduce", "max", 0), f4, 8, 4, "optinc")
    with pytest.raises(OperationRefused, match="optinc cannot run all_gather"):
        check_on_job(("all_gather", "sum", 0), f4, 8, 4, "optinc")
    with pytest.raises(OperationRefused, match="8 equal blocks; 12 elements"):
        check_on_job(("all_to_all", "sum", 0), f4, 12, 4, "ring")
    with pytest.raises(OperationRefused, match="laid out its gather buffer for 3 ranks"):
        check_on_job(("gather", "sum", 0), f4, 12, 4, "ring", 3)
    check_on_job(("all_reduce", "sum", 0), f4, 7, 4, "optinc")
    assert [work_blocks(k, 4) for k in ("all_reduce", "broadcast", "gather", "all_to_all")] == [
        1, 1, 4, 8]


def test_the_ready_exchange_refuses_mismatched_calls_on_every_rank():
    mine = Ready("n0", 8, "<f4", 1.0, True, 3, ("all_reduce", "sum", 0))
    theirs = [Ready("n1", 8, "<f4", 1.0, True, 3, ("all_reduce", "prod", 0))]
    with pytest.raises(StepMismatch, match="n0: all_reduce sum, n1: all_reduce prod"):
        agree("job", 5, mine, theirs, 0.001)
    assert Ready.decode("n1", theirs[0].encode()) == theirs[0]
    old = b'{"n": 8, "dtype": "<f4", "ready": 1.0, "standing": true, "step": 3}'
    assert Ready.decode("n1", old).call == ("all_reduce", "sum", 0)  # an older agent's ready


def test_the_simulators_lay_out_every_kind():
    cfg = parse_testbed(EMULATED.read_text(), str(EMULATED))
    full = predict_testbed_allreduce(cfg, 4_000_000, kind="all_reduce").as_dict()
    half = predict_testbed_allreduce(cfg, 4_000_000, kind="all_gather").as_dict()
    assert half["slots"] * 2 == full["slots"] and half["schedule_ms"] < full["schedule_ms"]
    res = simulate(SimConfig(model="resnet50", nodes=8, kind="reduce_scatter"))
    whole = simulate(SimConfig(model="resnet50", nodes=8))
    assert 0 < res.result("oddl").comm_s < whole.result("oddl").comm_s


def test_oddl_plan_lays_out_a_kind(capsys: pytest.CaptureFixture[str]):
    assert plan_main(["plan", "halving-doubling", "--nodes", "8", "--bytes", "8MB", "--kind",
                      "reduce_scatter", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["collective"] == "halving-doubling reduce_scatter" and d["steps"] == 3
    assert plan_main(["plan", "ring", "--nodes", "5", "--kind", "broadcast", "--root", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ring broadcast from rank 2 on 5 nodes: 7 steps")
    assert "node2->node3" in out


def test_the_broadcast_chain_is_a_pipeline_on_the_slots():
    # N−1 pieces down the chain: every hop busy in the middle steps, so the slots carry
    # (2N−3)/(N−1) of the buffer's time, not N−1 of it; each hop still moves the whole buffer
    cfg = parse_testbed(EMULATED.read_text(), str(EMULATED))
    topo: Topology = topology_from_config(cfg)
    timing = timing_from_config(cfg)
    n, n_elems = 4, 3_000_000
    chain = native_plan("ring", "broadcast", n, n_elems, 1)
    assert chain.bytes_sent(4).tolist() == [0, n_elems * 4, n_elems * 4, n_elems * 4]
    hold = sum(slot.hold_s for slot in schedule_plan(chain, topo.node_ids, topo, timing,
                                                     4).slots)
    whole = timing.hold_s(n_elems * 4)
    assert hold == pytest.approx(whole * (2 * n - 3) / (n - 1), rel=1e-6)


def test_the_outcome_message_carries_the_call():
    body = outcome.encode(True, "", ("all_reduce", "max", 0))
    assert outcome.decode("n1", body).call == ("all_reduce", "max", 0)
    assert outcome.decode("n1", outcome.encode(True))[2] is None  # an older agent's says none
