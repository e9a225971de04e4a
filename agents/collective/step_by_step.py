"""The step-by-step run of a collective: one step after the other, each as a unit.

Small collectives (one thread, inline sends, no hand-over per chunk) and plans whose steps
receive into ranges they also send (from a snapshot) run this way. A step's sends go inline
when small, else on the sender thread while this thread receives and reduces chunk by chunk.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import Future

import numpy as np

from oddl.agents.collective.context import RunContext
from oddl.agents.links.stream_wire import ChunkHead, node_tag

logger = logging.getLogger(__name__)

INLINE_SEND = 256 << 10
"""Steps that send at most this many bytes send inline (the kernel's socket buffers take
them at once); bigger ones send on the sender thread while this thread receives."""

Segments = dict[int, list[tuple[int, int]]]
"""Per peer rank, the (offset, length) element ranges of one step."""
Landings = dict[int, list[tuple[int, int, int]]]
"""Per peer rank, the (offset here, length, sender's offset) ranges one step receives."""


def run_steps(ctx: RunContext) -> None:
    """Run the collective's steps one after the other (see the module docstring)."""
    for k in range(len(ctx.run.steps)):
        _run_step(ctx, k)


def _run_step(ctx: RunContext, k: int) -> None:
    run, buf = ctx.run, ctx.buf
    sends, recvs = _segments(ctx, k)
    source = buf.copy() if _overlap(sends, recvs) else buf  # snapshot: sends read the start
    order = sorted(sends, key=lambda d: ctx.slot_start(k, run.nodes[d]))
    big = sum(n for segs in sends.values() for _, n in segs) * buf.itemsize > INLINE_SEND
    pending: Future[None] | None = None
    if big and recvs:
        pending = ctx.sender.submit(_send_step, ctx, k, order, source, sends)
    else:
        _send_step(ctx, k, order, source, sends)
    try:
        for s, segs in recvs.items():
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


def _segments(ctx: RunContext, k: int) -> tuple[Segments, Landings]:
    """This node's sends and receives of step k, by peer rank."""
    step, rank = ctx.run.steps[k], ctx.run.rank
    sends: Segments = defaultdict(list)
    recvs: Landings = defaultdict(list)
    for s, d, off, length, at in zip(step.src, step.dst, step.offset, step.length,
                                     step.landing, strict=True):
        if s == rank:
            sends[d].append((off, length))
        if d == rank:
            recvs[s].append((at, length, off))  # lands at `at` here; sent from `off`
    return sends, recvs


def _send_step(ctx: RunContext, k: int, order: list[int], source: np.ndarray,
               sends: Segments) -> None:
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
                                    source[o:o + m].data.cast("B"), run.receive_timeout_s,
                                    ctx.stop, run.gated)
        logger.debug("%s seq %d step %d: sent to %s", run.me, run.seq, k, dst)


def _receive(ctx: RunContext, k: int, src: str, segs: list[tuple[int, int, int]], op: str
             ) -> None:
    """Receive one peer's segments of step k chunk by chunk and apply each to the buffer,
    each chunk due by `RunContext.due` plus the receive timeout (the schedule, not how far
    this node has got)."""
    run, buf = ctx.run, ctx.buf
    chunk = max(1, run.chunk_bytes // buf.itemsize)
    for at, n, off in segs:
        for o in range(at, at + n, chunk):
            m = min(chunk, at + n - o)
            head, payload = ctx.link.recv_chunk(run.job_id, src, run.seq, k, ctx.deadline(k),
                                                ctx.stop)
            ctx.check_head(head, src, k, off + o - at, m)
            ctx.apply(buf[o:o + m], np.frombuffer(payload, dtype=buf.dtype), op)
            ctx.reduced()
    logger.debug("%s seq %d step %d: received from %s", run.me, run.seq, k, src)


def _overlap(sends: Segments, recvs: Landings) -> bool:
    """True when a range this node receives into overlaps one it sends in the same step."""
    out = sorted(seg for segs in sends.values() for seg in segs)
    return any(o < ro + rn and ro < o + n for segs in recvs.values() for ro, rn, _ in segs
               for o, n in out)
