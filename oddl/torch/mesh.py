"""Collectives of a subgroup, made of point-to-point flows among its members (on the optics).

A subgroup (`dist.new_group(ranks)` with fewer ranks than the world) is no job of the
controller: a job's collective needs every node of the job. But every member can send a flow
to every other (`oddl.agents.point_to_point`: the controller makes the circuit and grants the window), so
the subgroup's collectives are composed of flows, each phase one exchange among the members:

- all-reduce: each member sends block j of its buffer to member j, which reduces the blocks
  it receives into its own (in member order, so every result is computed once), then sends
  the reduced block to every member: 2(k−1)/k of the buffer per member, as a ring's;
- all-gather, reduce-scatter, all-to-all: one exchange (each member's block to each member);
- broadcast, scatter: the root sends; gather: every member sends to the root.

Sends never wait for the receiver, and every receive of a phase is posted (on the group's
own receiving lane) before its sends, so no order of members deadlocks. Flows pair in order
per (sender, tag, session): the members make the group's collectives in the same order (as
c10d requires), so the n-th phase of one member pairs with the n-th of the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from oddl.common.collective_kinds import UFUNCS

Send = Callable[[np.ndarray, int], None]
"""Send an array to a member (by index in the group)."""
Receive = Callable[[np.ndarray, int], Any]
"""Post a receive from a member into an array; returns something with `wait()`."""


class FlowMesh:
    """One member's view of a subgroup: its index, the group's size, its send and receive."""

    def __init__(self, me: int, size: int, send: Send, receive: Receive):
        self.me, self.size = me, size
        self._send, self._receive = send, receive
        self.flows = 0
        """Flows this member sent (each one circuit and one window)."""

    def exchange(self, outgoing: Mapping[int, np.ndarray],
                 incoming: Mapping[int, np.ndarray]) -> None:
        """Send `outgoing[j]` to member j and receive member j's into `incoming[j]`."""
        posted = [self._receive(out, j) for j, out in incoming.items() if out.nbytes]
        for j, a in outgoing.items():
            if a.nbytes:
                self._send(np.ascontiguousarray(a), j)
                self.flows += 1
        for receive in posted:
            receive.wait()

    @property
    def others(self) -> list[int]:
        return [j for j in range(self.size) if j != self.me]

    # ---- collectives on numpy arrays (flat, contiguous, writable) --------------------------
    def all_reduce(self, a: np.ndarray, op: str) -> np.ndarray:
        """Reduce `a` across the members with `op` (a `UFUNCS` name), in place."""
        blocks = np.array_split(a, self.size)
        mine = blocks[self.me]
        parts = {j: np.empty_like(mine) for j in self.others}
        self.exchange({j: blocks[j] for j in self.others}, parts)
        ufunc = UFUNCS[op]
        result = None
        for j in range(self.size):  # every member's block j is reduced in one order, at j
            part = mine if j == self.me else parts[j]
            result = part.copy() if result is None else ufunc(result, part)
        if result is not None:
            mine[...] = result
        self.exchange({j: mine for j in self.others}, {j: blocks[j] for j in self.others})
        return a

    def broadcast(self, a: np.ndarray, root: int) -> np.ndarray:
        if self.me == root:
            self.exchange({j: a for j in self.others}, {})
        else:
            self.exchange({}, {root: a})
        return a

    def all_gather(self, mine: np.ndarray, out: list[np.ndarray]) -> None:
        """Every member's `mine` into `out[member]` (this member's copied)."""
        out[self.me][...] = mine
        self.exchange({j: mine for j in self.others}, {j: out[j] for j in self.others})

    def all_to_all(self, blocks: list[np.ndarray], out: list[np.ndarray]) -> None:
        """`blocks[j]` to member j; member j's block for this member into `out[j]` (blocks
        may differ in size per member: uneven splits need no padding)."""
        out[self.me][...] = blocks[self.me]
        self.exchange({j: blocks[j] for j in self.others}, {j: out[j] for j in self.others})

    def reduce_scatter(self, blocks: list[np.ndarray], out: np.ndarray, op: str) -> None:
        """This member's block of the reduction of every member's `blocks`, into `out`."""
        parts = {j: np.empty_like(out) for j in self.others}
        self.exchange({j: blocks[j] for j in self.others}, parts)
        ufunc = UFUNCS[op]
        result = blocks[self.me] if self.me == 0 else parts[0]
        for j in range(1, self.size):
            result = ufunc(result, blocks[self.me] if j == self.me else parts[j])
        out[...] = result

    def gather(self, mine: np.ndarray, out: list[np.ndarray] | None, root: int) -> None:
        if self.me == root:
            assert out is not None
            out[root][...] = mine
            self.exchange({}, {j: out[j] for j in self.others})
        else:
            self.exchange({root: mine}, {})

    def scatter(self, blocks: list[np.ndarray] | None, out: np.ndarray, root: int) -> None:
        if self.me == root:
            assert blocks is not None
            out[...] = blocks[root]
            self.exchange({j: blocks[j] for j in self.others}, {})
        else:
            self.exchange({}, {root: out})


class MeshClient:
    """`AgentClient`'s collective calls (as `oddl.torch.native` makes them) on a `FlowMesh`:
    ranks and roots are member indices, results in member order."""

    def __init__(self, mesh: FlowMesh, send: Callable[..., None]):
        self.mesh = mesh
        self._send = send
        """The agent client's send, for the group's own point-to-point calls."""

    def allreduce(self, a: np.ndarray, *, op: str = "sum", job: str | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        target = out if out is not None else a.copy()
        if target is not a:
            target[...] = a
        self.mesh.all_reduce(target.reshape(-1), op)
        return target

    def broadcast(self, a: np.ndarray, *, root: int, job: str | None = None) -> np.ndarray:
        target = a if a.flags.writeable else a.copy()
        self.mesh.broadcast(target.reshape(-1), root)
        return target

    def all_gather(self, a: np.ndarray, *, out: np.ndarray | None = None,
                   job: str | None = None) -> np.ndarray:
        if out is None:
            out = np.empty((self.mesh.size, *a.shape), a.dtype)
        self.mesh.all_gather(np.ascontiguousarray(a), list(out))
        return out

    def reduce_scatter(self, blocks: np.ndarray, *, op: str = "sum",
                       job: str | None = None) -> np.ndarray:
        out = np.empty(blocks.shape[1:], blocks.dtype)
        self.mesh.reduce_scatter([np.ascontiguousarray(b) for b in blocks], out, op)
        return out

    def all_to_all(self, blocks: np.ndarray, *, job: str | None = None) -> np.ndarray:
        out = np.empty_like(blocks)
        self.mesh.all_to_all([np.ascontiguousarray(b) for b in blocks], list(out))
        return out

    def gather(self, a: np.ndarray, *, root: int, job: str | None = None
               ) -> np.ndarray | None:
        out = np.empty((self.mesh.size, *a.shape), a.dtype) if self.mesh.me == root else None
        self.mesh.gather(np.ascontiguousarray(a), None if out is None else list(out), root)
        return out

    def scatter(self, blocks: np.ndarray | None, *, root: int, out: np.ndarray | None = None,
                job: str | None = None) -> np.ndarray:
        target = out if out is not None else np.empty_like(blocks[0])  # type: ignore[index]
        self.mesh.scatter(None if blocks is None else
                          [np.ascontiguousarray(b) for b in blocks], target, root)
        return target

    def send(self, a: np.ndarray, dst: int, **where: Any) -> None:
        self._send(a, dst, **where)
