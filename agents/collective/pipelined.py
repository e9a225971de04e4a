"""The pipelined run of a large collective: every step at once, chunk by chunk.

A send chunk goes (in its slot) as soon as the receive chunks it depends on are reduced
(`oddl.agents.collective.chunks`), so a step starts before the previous one has ended and the slot edge
never waits for the last reduction. Sends run on the sender thread, receives and reductions
on the calling thread; `_Progress` counts both so each side waits only for what it needs.
"""

from __future__ import annotations

import threading

import numpy as np

from oddl.agents.collective.chunks import ChunkOp, ChunkPlan
from oddl.agents.collective.context import REDUCE, CancelEither, RunContext
from oddl.agents.links.stream_wire import ChunkHead, node_tag


class _Progress:
    """How many send and receive chunks are done, for the two threads of a pipelined run."""

    def __init__(self, stop: CancelEither):
        self.sent = 0
        self.received = 0
        self.stop = stop
        self._cond = threading.Condition()

    def wait(self, attr: str, count: int) -> bool:
        """Block until `attr` reaches `count`; False when the run is given up."""
        if getattr(self, attr) >= count:
            return True
        with self._cond:
            while getattr(self, attr) < count:
                if self.stop.is_set():
                    return False
                self._cond.wait(0.05)
        return True

    def bump(self, attr: str) -> None:
        """One more chunk sent or received."""
        with self._cond:
            setattr(self, attr, getattr(self, attr) + 1)
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake the other thread (the run is given up)."""
        with self._cond:
            self._cond.notify_all()


def run_pipelined(ctx: RunContext, plan: ChunkPlan) -> None:
    """Run every step of `plan` at once (see the module docstring)."""
    progress = _Progress(ctx.stop)

    def send_all() -> None:
        try:
            _send_all(ctx, plan, progress)
        except BaseException:
            ctx.stop.set()
            progress.wake()
            raise

    pending = ctx.sender.submit(send_all)
    try:
        for op in plan.recvs:
            if not progress.wait("sent", op.after):
                break
            _receive_chunk(ctx, op)
            progress.bump("received")
    except BaseException:
        ctx.stop.set()
        progress.wake()
        pending.exception()
        raise
    pending.result()  # the sender's error, if it failed first
    ctx.raise_if_cancelled()


def _send_all(ctx: RunContext, plan: ChunkPlan, progress: _Progress) -> None:
    """The sender thread: each chunk once what it reads is in, the first of a transfer
    gated into its slot."""
    run, memory, item = ctx.run, ctx.memory, ctx.memory.itemsize
    for op in plan.sends:
        dst = run.nodes[op.peer]
        if op.first and run.gated:
            edge = ctx.grant(op.step, dst)  # the grant may come before the data is ready
            if not progress.wait("received", op.after):
                return
            ctx.wait_edge(edge)
        elif not progress.wait("received", op.after):
            return
        ctx.link.send_chunk(run.job_id, dst, ChunkHead(run.seq, op.step, op.offset,
                                                       op.n * item, node_tag(dst)),
                            memory.view(op.offset, op.n).data.cast("B"),
                            run.receive_timeout_s, ctx.stop, run.on_light)
        progress.bump("sent")


def _receive_chunk(ctx: RunContext, op: ChunkOp) -> None:
    """Receive one chunk, confirm the flow's arrival when it is its last, apply it."""
    run = ctx.run
    src = run.nodes[op.peer]
    target = ctx.memory.view(op.landing, op.n)
    copy = run.steps[op.step].op != REDUCE
    head, payload = ctx.link.recv_chunk(run.job_id, src, run.seq, op.step, ctx.deadline(op.step),
                                        ctx.stop, target.data.cast("B") if copy else None)
    ctx.check_head(head, src, op.step, op.offset, op.n)
    if op.last:
        # the flow's light has done its work once its last chunk is in: confirm before
        # reducing it, so the controller's retune starts a reduction earlier
        ctx.confirm(op.step, src)
    ctx.apply(target, np.frombuffer(payload, dtype=target.dtype), run.steps[op.step].op)
    ctx.reduced()
