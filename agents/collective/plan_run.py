"""Runs one collective at one node: plan steps, gated into schedule slots, over a link.

The plan says, per step, which element ranges every rank sends to whom and whether the
receiver adds them (reduce) or overwrites (copy). Sends read the buffer as it was at the start
of the step. Transfers move in chunks: a step's sends run on a sender thread while the
executor receives and reduces chunk by chunk into the bucket, in place. On the optical
network every send waits for the data window of the slot whose circuit reaches its
destination (slot edges are local: t0 converted to this agent's clock plus the slot's
offset), and, when that slot changes a circuit, for the controller's grant; a slot that keeps
every circuit of the slot before it (the ring's steps) has no edge: its sends follow the
previous slot's as soon as their data is ready (decision record 0013); the arrivals a
circuit change waits for are confirmed as they come in (both as the encoded schedule says:
`oddl.protos.schedule_wire`). On the ideal network sends go as soon as the data is ready. A receive
that has not arrived by its slot's end plus the receive timeout fails the collective with a
clear error rather than hanging.

Large collectives pipeline their chunks across steps (`oddl.agents.collective.pipelined`), small ones
and those whose steps receive into what they send run step by step (`oddl.agents.collective.step_by_step`).
The ``optinc`` collective has no plan steps and runs through the device (`oddl.agents.collective.optinc`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol, runtime_checkable

import numpy as np

from oddl.agents.clock import wall as wallclock
from oddl.agents.collective.chunks import ChunkPlan, chunk_plan, interleaved
from oddl.agents.collective.context import (
    COPY,
    CancelEither,
    ChunkLink,
    CollectiveRun,
    Handoffs,
    RunContext,
)
from oddl.agents.collective.direct_landing import direct_chunks
from oddl.agents.collective.memory import Memory
from oddl.agents.collective.pipelined import run_pipelined
from oddl.agents.collective.step_by_step import INLINE_SEND, run_steps, step_shapes
from oddl.agents.collective.step_marks import MarkedLink
from oddl.agents.slot_gate import SlotGate
from oddl.agents.trace.events import RunTrace, TracedLink
from oddl.common.call_marks import MARKS
from oddl.common.tracing import TRACE

__all__ = ["run_collective", "run_in_memory"]

DIRECT_LANDING = os.environ.get("ODDL_DIRECT_LANDING", "1") != "0"
"""Whether runs post their proved COPY chunks (decision record 0039); ``ODDL_DIRECT_LANDING=0``
in an agent's environment turns it off, for measuring the difference."""

PROOF_EVENTS = 4096
"""Ranks × this rank's chunks above which a run does not prove its direct landings: the
proof grows as its square (decision record 0039) and is paid at a plan's first call."""


@runtime_checkable
class LandingLink(Protocol):
    """A link that can read a posted chunk straight into the destination
    (`oddl.agents.links.streams.StreamLink`)."""

    def post_landing(self, job: str, src: str, chunk: tuple[int, int, int],
                     into: memoryview) -> bool: ...

    def end_landings(self, job: str, seq: int) -> None: ...


def run_collective(run: CollectiveRun, buffer: np.ndarray, link: ChunkLink, gate: SlotGate,
                   cancel: threading.Event | None = None,
                   handoffs: Handoffs | None = None, *, inplace: bool = False,
                   sender: Executor | None = None) -> np.ndarray:
    """Execute `run` over `link` and return the result.

    With `inplace` the result is written into `buffer` (contiguous and writable), else into a
    copy. Each step cuts its transfers into chunks; the step's sends run on `sender` (a
    one-thread pool) while this thread receives and reduces chunk by chunk, so sending,
    receiving and reducing overlap. Small steps send inline.
    """
    flat = np.ascontiguousarray(buffer).reshape(-1)
    buf = flat if inplace else flat.copy()
    run_in_memory(run, Memory.whole(buf), link, gate, cancel, handoffs, sender=sender)
    return buf.reshape(buffer.shape)


def run_in_memory(run: CollectiveRun, memory: Memory, link: ChunkLink, gate: SlotGate,
                  cancel: threading.Event | None = None, handoffs: Handoffs | None = None, *,
                  sender: Executor | None = None) -> None:
    """Execute `run` over `link` in place in `memory` (the plan's layout, held by one array
    or by the caller's tensors apart: `oddl.agents.collective.memory`); see
    `run_collective`."""
    wire = link
    own_sender = sender is None
    if sender is None:
        sender = ThreadPoolExecutor(1, thread_name_prefix=f"{run.me}-send")
    trace = RunTrace(run, memory.nbytes, memory.itemsize) if TRACE.on else None
    if trace is not None:
        link = TracedLink(link, trace)
    if MARKS.on:
        link = MarkedLink(link)
    ctx = RunContext(run, memory, link, gate, cancel, handoffs, sender, CancelEither(cancel),
                     trace=trace)
    started = wallclock.now()
    if not run.gated:
        ctx.ideal_timing(started)
    chunk = max(1, run.chunk_bytes // memory.itemsize)
    # small collectives run step by step with inline sends: one thread, no hand-over per
    # chunk, and no chunk plan; large ones pipeline their chunks across steps on the sender
    # thread
    biggest = max((shape.send_elems for shape in step_shapes(tuple(run.steps), run.rank)),
                  default=0) * memory.itemsize
    plan_of = chunk_plan.__wrapped__ if run.exchange_once else chunk_plan
    plan = None if biggest <= INLINE_SEND else plan_of(
        tuple(run.steps), run.rank, chunk, tuple(_send_order(ctx, k) for k in range(len(run.steps))))
    if plan is not None and run.exchange_once:  # each receiver fed from the start
        plan = interleaved(plan)
    ok = posted = False
    try:
        posted = plan is not None and _post_landings(run, memory, wire, plan, chunk)
        if plan is not None and plan.pipelined:
            run_pipelined(ctx, plan)
        else:
            run_steps(ctx)
        ok = True
    finally:
        if posted:
            assert isinstance(wire, LandingLink)
            wire.end_landings(run.job_id, run.seq)
        if own_sender:
            sender.shutdown(wait=True)
        if trace is not None:
            trace.finished(run.collective, run.caller_step, ok)
    run.stats["duration_s"] = wallclock.now() - started
    run.stats["gate_error_max_s"] = ctx.worst_gate_s


def _post_landings(run: CollectiveRun, memory: Memory, link: ChunkLink, plan: ChunkPlan,
                   chunk: int) -> bool:
    """Post every COPY chunk the proof lets land straight in `memory` (decision record 0039);
    False when none was posted (a link that cannot, emulated optics, a plan too big to
    prove)."""
    if not DIRECT_LANDING or not isinstance(link, LandingLink) \
            or not any(run.steps[op.step].op == COPY for op in plan.recvs):
        return False
    if run.exchange_once:  # nothing reads an output block: every chunk may land at once
        safe: Iterable[int] = range(len(plan.recvs))
    elif len(run.nodes) * (len(plan.sends) + len(plan.recvs)) > PROOF_EVENTS:
        return False
    else:
        safe = sorted(direct_chunks(run.steps, len(run.nodes), run.rank, chunk))
    posted = False
    for j in safe:
        op = plan.recvs[j]
        into = memory.view(op.landing, op.n).data.cast("B")
        if not link.post_landing(run.job_id, run.nodes[op.peer], (run.seq, op.step, op.offset),
                                 into):
            return posted
        posted = True
    return posted


def _send_order(ctx: RunContext, k: int) -> tuple[int, ...]:
    """The ranks this node sends to in step k, in the order of their slots."""
    step, run = ctx.run.steps[k], ctx.run
    dsts = {d for s, d in zip(step.src, step.dst, strict=True) if s == run.rank}
    return tuple(sorted(dsts, key=lambda d: ctx.slot_start(k, run.nodes[d])))
