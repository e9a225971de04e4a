"""The step-by-step run of a collective: one step after the other, each as a unit.

Small collectives (one thread, inline sends, no hand-over per chunk) and plans whose steps
receive into ranges they also send (from a snapshot) run this way. A step's sends go inline
when small, else on the sender thread while this thread receives and reduces chunk by chunk.

Without slots to keep (the ideal network), the leading steps whose sends read nothing an
earlier step receives (`sends_ahead`: every step of an all-to-all, which sends its input and
receives into its output) send at once, before any receive: the run waits for one hop, not
one per step. Later steps keep their order, so each peer's chunks still arrive in step order.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from oddl.agents.collective.context import RunContext
from oddl.agents.collective.memory import Memory
from oddl.agents.links.stream_wire import ChunkHead, node_tag
from oddl.protos.schedule_wire import StepSpec

logger = logging.getLogger(__name__)

INLINE_SEND = 256 << 10
"""Steps that send at most this many bytes send inline (the kernel's socket buffers take
them at once); bigger ones send on the sender thread while this thread receives."""

Segments = dict[int, list[tuple[int, int]]]
"""Per peer rank, the (offset, length) element ranges of one step."""
Landings = dict[int, list[tuple[int, int, int]]]
"""Per peer rank, the (offset here, length, sender's offset) ranges one step receives."""


@dataclass(frozen=True)
class StepShape:
    """What one node does in one step, worked out once per plan (`step_shapes`): its sends
    and receives by peer rank (in transfer order), whether they overlap, and how many
    elements it sends."""

    sends: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
    """Per peer rank, the (offset, length) element ranges sent to it."""
    recvs: tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]
    """Per peer rank, the (offset here, length, sender's offset) ranges received from it."""
    overlap: bool
    """A range received overlaps one sent in the same step: sends read a snapshot."""
    send_elems: int


@lru_cache(maxsize=256)
def step_shapes(steps: tuple[StepSpec, ...], rank: int) -> tuple[StepShape, ...]:
    """Each step's `StepShape` at `rank` (pure; cached per plan, so a call of a plan seen
    before pays none of this Python)."""
    shapes = []
    for step in steps:
        sends: Segments = defaultdict(list)
        recvs: Landings = defaultdict(list)
        for s, d, off, length, at in zip(step.src, step.dst, step.offset, step.length,
                                         step.landing, strict=True):
            if s == rank:
                sends[d].append((off, length))
            if d == rank:
                recvs[s].append((at, length, off))  # lands at `at` here; sent from `off`
        shapes.append(StepShape(
            tuple((d, tuple(segs)) for d, segs in sends.items()),
            tuple((p, tuple(segs)) for p, segs in recvs.items()),
            _overlap(sends, recvs), sum(n for segs in sends.values() for _, n in segs)))
    return tuple(shapes)


@lru_cache(maxsize=256)
def sends_ahead(steps: tuple[StepSpec, ...], rank: int) -> int:
    """How many leading steps may send before this rank receives anything (pure): none of
    their send ranges is written by a receive of an earlier step. Only a prefix counts, so
    the chunks a peer gets from this rank still come in step order."""
    written: list[tuple[int, int]] = []
    for k, shape in enumerate(step_shapes(steps, rank)):
        if any(o < wo + wn and wo < o + n for _, segs in shape.sends for o, n in segs
               for wo, wn in written):
            return k
        written += [(at, n) for _, segs in shape.recvs for at, n, _ in segs]
    return len(steps)


def run_steps(ctx: RunContext) -> None:
    """Run the collective's steps one after the other (see the module docstring)."""
    run = ctx.run
    shapes = step_shapes(tuple(run.steps), run.rank)
    ahead = 0 if run.gated else sends_ahead(tuple(run.steps), run.rank)
    for k in range(ahead):
        if shapes[k].sends:
            _send_step(ctx, k, [d for d, _ in shapes[k].sends], ctx.memory,
                       dict(shapes[k].sends))
    for k, shape in enumerate(shapes):
        _run_step(ctx, k, shape, sent=k < ahead)


def _run_step(ctx: RunContext, k: int, shape: StepShape, sent: bool = False) -> None:
    """Step k: its sends (unless `sent` already), then its receives, each applied."""
    run, memory = ctx.run, ctx.memory
    pending: Future[None] | None = None
    if not sent:
        source = memory.snapshot() if shape.overlap else memory  # sends read the start
        order = [d for d, _ in shape.sends]
        if ctx.slot_of:  # slots: send in the order of their starts
            order.sort(key=lambda d: ctx.slot_start(k, run.nodes[d]))
        sends = dict(shape.sends)
        if shape.send_elems * memory.itemsize > INLINE_SEND and shape.recvs:
            pending = ctx.sender.submit(_send_step, ctx, k, order, source, sends)
        else:
            _send_step(ctx, k, order, source, sends)
    try:
        for s, segs in shape.recvs:
            src = run.nodes[s]
            _receive(ctx, k, src, segs, run.steps[k].op)
            ctx.confirm(k, src)
    except BaseException:
        ctx.stop.set()
        if pending is not None:
            pending.exception()  # wait for the sender to give up
        raise
    if pending is not None:
        pending.result()


def _send_step(ctx: RunContext, k: int, order: list[int], source: Memory,
               sends: dict[int, tuple[tuple[int, int], ...]]) -> None:
    """Send step k to each peer in slot order, each gated into its slot."""
    run = ctx.run
    chunk = max(1, run.chunk_bytes // source.itemsize)
    for d in order:
        dst = run.nodes[d]
        if run.gated:
            ctx.gate_send(k, dst)
        tag = node_tag(dst)
        for off, n in sends[d]:
            for o in range(off, off + n, chunk):
                m = min(chunk, off + n - o)
                ctx.link.send_chunk(run.job_id, dst, ChunkHead(run.seq, k, o, m * source.itemsize,
                                                               tag),
                                    source.view(o, m).data.cast("B"), run.receive_timeout_s,
                                    ctx.stop, run.gated)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s seq %d step %d: sent to %s", run.me, run.seq, k, dst)


def _receive(ctx: RunContext, k: int, src: str, segs: tuple[tuple[int, int, int], ...],
             op: str) -> None:
    """Receive one peer's segments of step k chunk by chunk and apply each to the buffer,
    each chunk due by `RunContext.due` plus the receive timeout (the schedule, not how far
    this node has got)."""
    run, memory = ctx.run, ctx.memory
    chunk = max(1, run.chunk_bytes // memory.itemsize)
    for at, n, off in segs:
        for o in range(at, at + n, chunk):
            m = min(chunk, at + n - o)
            head, payload = ctx.link.recv_chunk(run.job_id, src, run.seq, k, ctx.deadline(k),
                                                ctx.stop)
            ctx.check_head(head, src, k, off + o - at, m)
            ctx.apply(memory.view(o, m), np.frombuffer(payload, dtype=memory.dtype), op)
            ctx.reduced()
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s seq %d step %d: received from %s", run.me, run.seq, k, src)


def _overlap(sends: Segments, recvs: Landings) -> bool:
    """True when a range this node receives into overlaps one it sends in the same step."""
    out = sorted(seg for segs in sends.values() for seg in segs)
    return any(o < ro + rn and ro < o + n for segs in recvs.values() for ro, rn, _ in segs
               for o, n in out)
