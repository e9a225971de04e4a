"""One node's part of a collective plan as chunks, with the dependencies that let steps overlap.

A step's sends read what earlier steps received; its receives overwrite or add into ranges
that earlier steps sent. Cut into chunks, a send need not wait for the whole previous step:
only for the earlier receive chunks that touch its range, and a receive only for the earlier
send chunks that read its range. `chunk_plan` lists this node's send and receive chunks in the
order they run and, for each, how many chunks of the other list must be done first. Pure: no
I/O, cached per (plan, rank, chunk size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from oddl.protos.schedule_wire import StepSpec


@dataclass(frozen=True)
class ChunkOp:
    """One chunk to send to (or receive from) `peer` in `step`: elements [offset, offset+n).
    `after` = how many chunks of the other list must be done before this one may run;
    `first`/`last` mark the first and last chunk of its (step, peer) transfer."""

    step: int
    peer: int
    offset: int
    n: int
    after: int
    first: bool
    last: bool
    at: int = -1
    """A receive chunk's place in this node's buffer (its sender's `offset` unless the step
    lands it elsewhere, as all-to-all does); -1: at `offset`."""

    @property
    def landing(self) -> int:
        """Where the chunk's elements are in this node's buffer."""
        return self.offset if self.at < 0 else self.at


@dataclass(frozen=True)
class ChunkPlan:
    """This node's sends and receives in order; `pipelined` is False when some step receives
    into a range it also sends (the step must then run as a unit, from a snapshot)."""

    sends: tuple[ChunkOp, ...]
    recvs: tuple[ChunkOp, ...]
    pipelined: bool


def _segments(steps: Sequence[StepSpec], rank: int, k: int, mine_src: bool,
              order: Sequence[int] | None) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """Per peer, this node's (offset, length, place in this node's buffer) segments."""
    step = steps[k]
    by_peer: dict[int, list[tuple[int, int, int]]] = {}
    for s, d, off, length, at in zip(step.src, step.dst, step.offset, step.length,
                                     step.landing, strict=True):
        if (s if mine_src else d) == rank and length > 0:
            by_peer.setdefault(d if mine_src else s, []).append(
                (off, length, off if mine_src else at))
    peers = list(by_peer) if order is None else [p for p in order if p in by_peer]
    return [(p, by_peer[p]) for p in peers]


def _cut(segs: list[tuple[int, int, int]], chunk: int) -> list[tuple[int, int, int]]:
    return [(o, min(chunk, off + n - o), at + o - off) for off, n, at in segs
            for o in range(off, off + n, chunk)]


@lru_cache(maxsize=64)
def chunk_plan(steps: tuple[StepSpec, ...], rank: int, chunk: int,
               send_order: tuple[tuple[int, ...], ...] | None = None) -> ChunkPlan:
    """The chunks of `rank` (see the module docstring). `send_order[k]` lists the peers of
    step k in the order this node sends to them (default: transfer order)."""
    sends: list[tuple[int, int, int, int, bool, bool, int]] = []
    recvs: list[tuple[int, int, int, int, bool, bool, int]] = []
    send_step: list[int] = []
    recv_step: list[int] = []
    pipelined = True
    for k in range(len(steps)):
        out = _segments(steps, rank, k, True, send_order[k] if send_order else None)
        inc = _segments(steps, rank, k, False, None)
        if any(o < ra + rn and ra < o + n for _, a in out for o, n, _ in a for _, b in inc
               for _, rn, ra in b):
            pipelined = False
        for box, step_of, groups in ((sends, send_step, out), (recvs, recv_step, inc)):
            for peer, segs in groups:
                cut = _cut(segs, chunk)
                for i, (o, n, at) in enumerate(cut):
                    box.append((k, peer, o, n, i == 0, i == len(cut) - 1, at))
                    step_of.append(k)
    # dependencies are between ranges of this node's buffer: where a send reads, where a
    # receive lands
    # (sorted in Python: `np.unique` imports numpy.ma at its first use, 16 ms of a process's
    # first call)
    bounds = np.array(sorted({0, *(o for c in sends + recvs for o in (c[6], c[6] + c[3]))}),
                      dtype=np.int64)
    last_recv = np.zeros(len(bounds), dtype=np.int64)  # recv chunks done before (count)
    last_send = np.zeros(len(bounds), dtype=np.int64)
    send_after = [0] * len(sends)
    recv_after = [0] * len(recvs)
    si = ri = 0
    for k in range(len(steps)):
        s0, r0 = si, ri
        while si < len(sends) and send_step[si] == k:
            a, b = np.searchsorted(bounds, (sends[si][6], sends[si][6] + sends[si][3]))
            send_after[si] = int(last_recv[a:b].max(initial=0))
            si += 1
        while ri < len(recvs) and recv_step[ri] == k:
            a, b = np.searchsorted(bounds, (recvs[ri][6], recvs[ri][6] + recvs[ri][3]))
            recv_after[ri] = int(last_send[a:b].max(initial=0))
            ri += 1
        for i in range(s0, si):
            a, b = np.searchsorted(bounds, (sends[i][6], sends[i][6] + sends[i][3]))
            last_send[a:b] = i + 1
        for i in range(r0, ri):
            a, b = np.searchsorted(bounds, (recvs[i][6], recvs[i][6] + recvs[i][3]))
            last_recv[a:b] = i + 1
    return ChunkPlan(
        tuple(ChunkOp(*c[:4], after, c[4], c[5]) for c, after in zip(sends, send_after,
                                                                       strict=True)),
        tuple(ChunkOp(*c[:4], after, c[4], c[5], c[6] if c[6] != c[2] else -1)
              for c, after in zip(recvs, recv_after, strict=True)),
        pipelined)


def interleaved(plan: ChunkPlan) -> ChunkPlan:
    """`plan` with its sends taken round-robin across its transfers (each transfer's chunks
    still in order), where no chunk waits for another (every `after` 0, as in an all-to-all):
    each receiver's chunks then come at a share of the sender's rate from the start instead of
    behind every earlier transfer whole, so a small block is not held up by a large one, nor
    a receiver's deadline passed while the sender feeds another. Else `plan` unchanged."""
    if any(op.after for op in plan.sends + plan.recvs):
        return plan
    transfers: dict[tuple[int, int], list[ChunkOp]] = {}
    for op in plan.sends:
        transfers.setdefault((op.step, op.peer), []).append(op)
    rounds = max((len(ops) for ops in transfers.values()), default=0)
    sends = tuple(ops[i] for i in range(rounds) for ops in transfers.values() if i < len(ops))
    return ChunkPlan(sends, plan.recvs, plan.pipelined)


@lru_cache(maxsize=64)
def busiest_port_bytes(steps: tuple[StepSpec, ...], itemsize: int) -> tuple[int, ...]:
    """Per step, the bytes of the busiest port (a node's sends or its receives, whichever
    is more, ports being full duplex): what the ideal network's line rate must carry."""
    out = []
    for step in steps:
        sent: dict[int, int] = {}
        got: dict[int, int] = {}
        for s, d, n in zip(step.src, step.dst, step.length, strict=True):
            sent[s] = sent.get(s, 0) + n
            got[d] = got.get(d, 0) + n
        out.append(max((*sent.values(), *got.values()), default=0) * itemsize)
    return tuple(out)
