"""Native collectives end to end: every kind and reduction op, exact, on the emulated testbed
(ring, halving-doubling, optical and ideal) and on direct links; mismatched calls refused on
every rank alike; the refusals that name their reason (bitwise on floats, OptINC + max).

Real processes on loopback, as `tests/test_e2e.py`: emulators, controller, four agents, and
`AgentClient`s calling them all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import EMULATED

from agents.client import AgentClient
from agents.client_collectives import collective_all
from common.errors import OperationRefused, StepMismatch
from oddl.launch import RunningTestbed, write_config

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


def on_all(tb: RunningTestbed, call: Call) -> list[Any]:
    """`call(client, rank)` on every rank at once; each result (exceptions raised)."""
    outs = collective_all(tb.clients, call)[1]
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


def check_every_kind(tb: RunningTestbed, j: str, dtype: str, ops: tuple[str, ...], n: int
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
