"""A subgroup's collectives made of flows (`oddl.torch.mesh.FlowMesh`), on in-process members.

The members' sends and receives meet in queues per (sender, receiver), in order, as flows do
per (sender, receiver, tag, session); each member runs on its own thread. The algorithms are
checked for every member count from 1 to 5 (blocks that do not split evenly, empty blocks),
every reduction op, and the results identical bit for bit on every member.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from oddl.torch.mesh import FlowMesh, MeshClient


class _Posted:
    """A receive posted into `out`, completed by `wait()` from the pair's queue."""

    def __init__(self, q: queue.Queue[np.ndarray], out: np.ndarray):
        self.q, self.out = q, out

    def wait(self) -> None:
        got = self.q.get(timeout=10)
        assert got.shape == self.out.shape and got.dtype == self.out.dtype
        self.out[...] = got


def _meshes(k: int) -> list[FlowMesh]:
    pipes = {(i, j): queue.Queue() for i in range(k) for j in range(k)}
    return [FlowMesh(me, k,
                     lambda a, j, me=me: pipes[(me, j)].put(a.copy()),
                     lambda out, j, me=me: _Posted(pipes[(j, me)], out))
            for me in range(k)]


def _on_all(meshes: list[FlowMesh], call: Callable[[FlowMesh], Any]) -> list[Any]:
    results: list[Any] = [None] * len(meshes)

    def run(m: FlowMesh) -> None:
        try:
            results[m.me] = call(m)
        except Exception as exc:  # handed to the test
            results[m.me] = exc
    threads = [threading.Thread(target=run, args=(m,)) for m in meshes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("op", ["sum", "min", "max", "prod"])
def test_all_reduce_is_exact_and_the_same_everywhere(k: int, op: str):
    rng = np.random.default_rng(k)
    xs = [rng.integers(-5, 6, 11).astype(np.float64) for _ in range(k)]  # 11: uneven blocks
    outs = _on_all(_meshes(k), lambda m: m.all_reduce(xs[m.me].copy(), op))
    want = {"sum": np.add, "min": np.minimum, "max": np.maximum,
            "prod": np.multiply}[op].reduce(np.stack(xs), axis=0)
    for out in outs:
        assert np.array_equal(out, want) and out.tobytes() == outs[0].tobytes()
    # fewer elements than members: some blocks are empty
    tiny = _on_all(_meshes(k), lambda m: m.all_reduce(np.array([m.me + 1.0]), "sum"))
    assert all(t.tolist() == [k * (k + 1) / 2] for t in tiny)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_other_collectives_move_each_block_to_its_member(k: int):
    ms = _meshes(k)
    clients = [MeshClient(m, lambda *a, **kw: None) for m in ms]
    gathered = _on_all(ms, lambda m: clients[m.me].all_gather(np.full(3, m.me)))
    assert all(g.tolist() == [[r] * 3 for r in range(k)] for g in gathered)
    blocks = [np.arange(k * 2).reshape(k, 2) * (r + 1) for r in range(k)]
    scattered = _on_all(ms, lambda m: clients[m.me].reduce_scatter(blocks[m.me], op="sum"))
    total = sum(blocks)
    assert [s.tolist() for s in scattered] == [total[r].tolist() for r in range(k)]
    swapped = _on_all(ms, lambda m: clients[m.me].all_to_all(
        np.array([[10 * m.me + j] for j in range(k)])))
    assert [s.ravel().tolist() for s in swapped] == [[10 * i + r for i in range(k)]
                                                      for r in range(k)]
    root = k - 1
    bufs = [np.full(4, float(r)) for r in range(k)]
    _on_all(ms, lambda m: clients[m.me].broadcast(bufs[m.me], root=root))
    assert all(b.tolist() == [float(root)] * 4 for b in bufs)
    at_root = _on_all(ms, lambda m: clients[m.me].gather(np.full(2, m.me), root=0))
    assert at_root[0].tolist() == [[r, r] for r in range(k)] and at_root[1] is None
    parts = _on_all(ms, lambda m: clients[m.me].scatter(
        np.arange(k * 2).reshape(k, 2) if m.me == 1 else None, root=1,
        out=np.empty(2, np.int64)))
    assert [p.tolist() for p in parts] == [[2 * r, 2 * r + 1] for r in range(k)]
    # one flow per block that leaves a member: none to itself, none for a rooted call's
    # receivers (broadcast, scatter) or its root (gather)
    for m in ms:
        assert m.flows == (3 * (k - 1) + (k - 1) * (m.me == root) + (m.me != 0)
                           + (k - 1) * (m.me == 1)), m.me
