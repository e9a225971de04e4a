"""Native collectives end to end: every kind and reduction op, exact, on the emulated testbed
(ring, halving-doubling, optical and ideal) and on direct links; mismatched calls refused on
every rank alike; the refusals that name their reason (bitwise on floats, OptINC + max).

Real processes on loopback, as `tests/e2e/test_e2e.py`: emulators, controller, four agents, and
`AgentClient`s calling them all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import EMULATED

from oddl.agents.client.agent_client import AgentClient
from oddl.agents.client.every_rank import collective_all
from oddl.common.errors import CollectiveError, OperationRefused, StepMismatch
from oddl.launch.testbed import RunningTestbed, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

N = 4
Call = Callable[[AgentClient, int], Any]


@pytest.fixture(scope="module", params=["fabric", "direct"])
def testbed(request, tmp_path_factory) -> Iterator[RunningTestbed]:
    tmp = tmp_path_factory.mktemp(f"native-{request.param}")
    path = EMULATED if request.param == "fabric" else write_config(
        EMULATED, Path(tmp) / "direct.toml", {'link = "fabric"': 'link = "direct"'})
    with RunningTestbed(tmp, path) as tb:
        yield tb


def on_all(tb: RunningTestbed | list[AgentClient], call: Call) -> list[Any]:
    """`call(client, rank)` on every rank at once; each result (exceptions raised)."""
    outs = collective_all(tb if isinstance(tb, list) else tb.clients, call)[1]
    for out in outs:
        if isinstance(out, Exception):
            raise out
    return outs


def _data(seed: int, shape: tuple[int, ...], dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":  # powers of two: products and sums stay exact
        return [(2.0 ** rng.integers(-3, 4, shape)).astype(dtype) for _ in range(N)]
    return [rng.integers(-2**20, 2**20, shape).astype(dtype) for _ in range(N)]


REDUCE = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def _reduced(xs: list[np.ndarray], op: str) -> np.ndarray:
    return REDUCE[op].reduce(np.stack(xs), axis=0)


def check_every_kind(tb: RunningTestbed | list[AgentClient], j: str, dtype: str, ops: tuple[str, ...], n: int
                     ) -> None:
    """Every kind (and every op of `ops`) on job `j`, exact."""
    xs = _data(1, (n,), dtype)
    for op in ops:
        ys = [x.copy() for x in xs]
        for y in on_all(tb, lambda c, r, op=op, ys=ys: c.allreduce(ys[r], op=op, job=j)):
            assert np.array_equal(y, _reduced(xs, op)), op
    for out in on_all(tb, lambda c, r: c.all_gather(xs[r], job=j)):
        assert np.array_equal(out, np.stack(xs))
    blocks = _data(2, (N, n), dtype)
    for op in ops[:2]:
        outs = on_all(tb, lambda c, r, op=op: c.reduce_scatter(blocks[r], op=op, job=j))
        for r, out in enumerate(outs):
            assert np.array_equal(out, _reduced(blocks, op)[r]), op
    bufs = [x.copy() for x in xs]
    for r, out in enumerate(on_all(tb, lambda c, r: c.broadcast(bufs[r], root=2, job=j))):
        assert out is bufs[r] and np.array_equal(out, xs[2])  # in place
    for r, out in enumerate(on_all(tb, lambda c, r: c.all_to_all(blocks[r], job=j))):
        assert np.array_equal(out, np.stack([blocks[i][r] for i in range(N)]))
    outs = on_all(tb, lambda c, r: c.gather(xs[r], root=1, job=j))
    assert np.array_equal(outs[1], np.stack(xs)) and all(o is None for o in outs[:1] + outs[2:])
    outs = on_all(tb, lambda c, r: c.scatter(blocks[3] if r == 3 else None, root=3,
                                             out=np.empty(n, dtype), job=j))
    for r, out in enumerate(outs):
        assert np.array_equal(out, blocks[3][r])


@pytest.fixture
def job(testbed: RunningTestbed, request) -> Iterator[str]:
    collective, network = getattr(request, "param", ("ring", "ideal"))
    j = testbed.operator.submit(f"native-{collective}", [], collective, network)
    yield j["id"]
    testbed.operator.cancel(j["id"])


@pytest.mark.parametrize("job", [("ring", "optical"), ("halving-doubling", "optical"),
                                 ("ring", "ideal"), ("halving-doubling", "ideal")],
                         indirect=True)
def test_every_kind_and_op_is_exact(testbed: RunningTestbed, job: str):
    check_every_kind(testbed, job, "<i8", tuple(REDUCE), 1001)
    check_every_kind(testbed, job, "<f4", ("sum", "min", "max", "prod"), 300_003)


def test_shared_arrays_run_with_no_copy(testbed: RunningTestbed, job: str):
    shared = [c.shared_array((N, 1000), np.int32) for c in testbed.clients]
    outs = on_all(testbed, lambda c, r: c.all_gather(np.full(1000, r, np.int32), out=shared[r],
                                                     job=job))
    for r, out in enumerate(outs):
        assert out is shared[r]
        assert np.array_equal(out, np.repeat(np.arange(N, dtype=np.int32)[:, None], 1000, 1))
    arrays = [c.shared_array(5000, np.float32) for c in testbed.clients]
    for r, a in enumerate(arrays):
        a[...] = r
    outs = on_all(testbed, lambda c, r: c.broadcast(arrays[r], root=3, job=job))
    assert all(o is a and np.all(o == 3) for o, a in zip(outs, arrays, strict=True))
    strided = [np.arange(20, dtype=np.int16)[::2] * (r + 1) for r in range(N)]
    outs = on_all(testbed, lambda c, r: c.broadcast(strided[r], root=1, job=job))
    for o, a in zip(outs, strided, strict=True):
        assert o is a and np.array_equal(o, np.arange(0, 40, 4, dtype=np.int16))


@pytest.mark.parametrize("job", [("ring", "optical")], indirect=True)
def test_mismatched_calls_fail_on_every_rank_alike(testbed: RunningTestbed, job: str):
    xs = _data(3, (64,), "<i8")
    ops = ["sum", "max", "sum", "sum"]
    outs = collective_all(testbed.clients, lambda c, r: c.allreduce(xs[r], op=ops[r], job=job))
    for out in outs[1]:
        assert isinstance(out, StepMismatch), out
        assert "n1: all_reduce max" in str(out) and "n0: all_reduce sum" in str(out)
    outs = collective_all(testbed.clients, lambda c, r: c.broadcast(xs[r], root=0, job=job)
                          if r else c.allreduce(xs[r], job=job))
    for out in outs[1]:
        assert isinstance(out, StepMismatch) and "broadcast root 0" in str(out), out
    # the job goes on
    for out in on_all(testbed, lambda c, r: c.allreduce(xs[r], op="min", job=job)):
        assert np.array_equal(out, _reduced(xs, "min"))


def test_bitwise_ops_on_floats_are_refused_unrun(testbed: RunningTestbed, job: str):
    client = testbed.clients[0]
    with pytest.raises(OperationRefused, match="bitwise.*integer arrays, not float32"):
        client.allreduce(np.ones(8, np.float32), op="bxor", job=job)
    with pytest.raises(OperationRefused, match="unknown reduction op 'avg'"):
        client.allreduce(np.ones(8, np.float32), op="avg", job=job)
    with pytest.raises(OperationRefused, match="root 7 is not a rank of this job of 4"):
        client.broadcast(np.ones(8, np.float32), root=7, job=job)
    # refused unrun: no number used up, the next call of every rank pairs
    xs = _data(4, (16,), "<i4")
    for out in on_all(testbed, lambda c, r: c.allreduce(xs[r], op="bxor", job=job)):
        assert np.array_equal(out, _reduced(xs, "bxor"))


def test_every_kind_without_shared_memory(testbed: RunningTestbed, job: str):
    """The bytes path (an agent on another mount, a client that turned sharing off)."""
    clients = [AgentClient(c.address, shared_memory=False) for c in testbed.clients]
    try:
        before = sum(c.status()["local_api_bytes"] for c in clients)
        check_every_kind(clients, job, "<i4", ("sum", "bor"), 777)
        assert sum(c.status()["local_api_bytes"] for c in clients) > before
        assert [c.world(job) for c in clients] == [(r, N) for r in range(N)]
    finally:
        for c in clients:
            c.close()


def test_the_client_names_a_wrong_layout(testbed: RunningTestbed, job: str):
    client = testbed.clients[0]
    with pytest.raises(ValueError, match=r"shape \(world, ...\) with world = 4"):
        client.reduce_scatter(np.ones((3, 5)), job=job)
    with pytest.raises(ValueError, match="passes out="):
        client.scatter(None, root=1, job=job)
    with pytest.raises(ValueError, match=r"out of all_gather must be a writable float64\[4, 5\]"):
        client.all_gather(np.ones(5), out=np.empty((4, 4)), job=job)


def test_schedule_show_lays_out_a_kind(testbed: RunningTestbed, job: str):
    sched = testbed.operator.schedule(job, 4 * 4000, 4, "all_gather")
    assert sched.collective == "ring/all_gather" and len(sched.steps) == N - 1
    chain = testbed.operator.schedule(job, 4000, 4, "broadcast", 2)
    # three pieces down 2 -> 3 -> 0 -> 1, one hop further each step
    assert [list(zip(s.src, s.dst, strict=True)) for s in chain.steps] == [
        [(2, 3)], [(2, 3), (3, 0)], [(2, 3), (3, 0), (0, 1)], [(3, 0), (0, 1)], [(0, 1)]]
    with pytest.raises(OperationRefused, match="unknown collective kind 'reduce'"):
        testbed.operator.schedule(job, 4000, 4, "reduce")


def test_different_ops_on_the_ideal_network_fail_on_every_rank(testbed: RunningTestbed,
                                                               job: str):
    """The ideal network starts a call at once, comparing nothing first: the outcome round
    compares the calls, so a rank with another op fails every rank instead of returning a
    result that differs from its peers'."""
    xs = _data(5, (256,), "<i8")
    ops = ["max", "max", "min", "max"]
    outs = collective_all(testbed.clients, lambda c, r: c.allreduce(xs[r], op=ops[r], job=job))
    for out in outs[1]:
        assert isinstance(out, CollectiveError) and not isinstance(out, StepMismatch), out
        assert "n0: all_reduce max, n1: all_reduce max, n2: all_reduce min" in str(out)
    for out in on_all(testbed, lambda c, r: c.allreduce(xs[r], op="max", job=job)):
        assert np.array_equal(out, _reduced(xs, "max"))


@pytest.mark.parametrize("job", [("ring", "optical")], indirect=True)
def test_a_collective_after_one_that_moves_the_lasers_is_exact(testbed: RunningTestbed,
                                                                job: str):
    """An all-to-all on a ring job retunes the lasers to circuits the ring does not use and
    leaves them there; the ring's standing schedules (which retune nothing) must not run on
    the circuits the all-to-all left: the next call meets at the barrier, which lays the
    ring's circuits out again."""
    def gather_twice() -> None:
        for _ in range(2):  # the second runs on the standing schedule of the first
            outs = on_all(testbed, lambda c, r: c.all_gather(np.full(3000, r, np.int64),
                                                             job=job))
            want = np.repeat(np.arange(N, dtype=np.int64)[:, None], 3000, 1)
            assert all(np.array_equal(o, want) for o in outs)

    gather_twice()
    for _ in range(2):
        blocks = [np.arange(N * 700, dtype=np.int64).reshape(N, 700) + 10_000 * r
                  for r in range(N)]
        outs = on_all(testbed, lambda c, r, b=blocks: c.all_to_all(b[r], job=job))
        for r, out in enumerate(outs):
            assert np.array_equal(out, np.stack([blocks[i][r] for i in range(N)]))
        gather_twice()
