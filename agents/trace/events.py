"""An agent's events on the trace (docs/reference/trace-format.md): per collective, per slot, per chunk,
and the faults (late and lost chunks, overruns).

`RunTrace` follows one collective while `TRACE.on`; `run_collective` makes one (else None)
and wraps the run's link in `TracedLink`, which times every chunk where it is sent and
received. So the two runners need only one call (`RunContext.reduced`) to mark where a
received chunk's reduction ends. A slot is drawn from its first chunk's send start (the gate's
actual opening for the data) to its last chunk's send end, beside the slot as planned. Times
are read on the agent's clock (`oddl.agents.clock.wall`) and put on the controller's by the recorder.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from oddl.agents.clock import wall as wallclock
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.links.stream_wire import ChunkHead
from oddl.agents.slot_gate import Cancel
from oddl.common.errors import CollectiveError
from oddl.common.tracing import TRACE, Track
from oddl.protos.schedule_wire import SlotSpec, continuing_slots


class RunTrace:
    """One collective at this node while the trace records (see the module docstring)."""

    def __init__(self, run: CollectiveRun, nbytes: int, itemsize: int):
        self.run = run
        self.nbytes = nbytes
        self.started = wallclock.now_ns()
        self.process = f"agent {run.me}"
        self._slots: dict[tuple[int, str, str], SlotSpec] = {
            (s.step, *pair): s for s in run.slots for pair in s.pairs}
        self._to_send: dict[tuple[int, str], int] = defaultdict(int)
        for k, step in enumerate(run.steps):
            for s, d, n in zip(step.src, step.dst, step.length, strict=True):
                if s == run.rank:
                    self._to_send[(k, run.nodes[d])] += n * itemsize
        self._hold_end = _hold_ends(run) if run.gated else {}
        self._sent: dict[tuple[int, str], list[int]] = {}
        self._received: dict[int, tuple[int, int, str, ChunkHead]] = {}
        self._lock = threading.Lock()

    def _base(self, **more: Any) -> dict[str, Any]:
        return {"job": self.run.job_id, "seq": self.run.seq, **more}

    def _rel_us(self, local_ns: int) -> float:
        return (TRACE.to_controller(local_ns) - TRACE.base_ns) / 1e3

    def _slot(self, step: int, src: str, dst: str) -> SlotSpec | None:
        return self._slots.get((step, src, dst)) if self.run.gated else None

    def _at(self, offset_s: float) -> int:
        """A time of the schedule (s after t0) on the agent's clock, ns."""
        return round((self.run.t0_local + offset_s) * 1e9)

    # ---- sends -------------------------------------------------------------------------
    def sent(self, dst: str, head: ChunkHead, start: int, end: int) -> None:
        """One chunk sent to `dst` from `start` to `end` (agent clock, ns)."""
        me, args = self.run.me, self._base(step=head.step, peer=dst, offset=head.offset,
                                          bytes=head.nbytes)
        TRACE.complete(Track(self.process, "send"), "send", "chunk", TRACE.to_controller(start),
                       TRACE.to_controller(end), args)
        slot = self._slot(head.step, me, dst)
        hold_end = self._at(self._hold_end[slot.index]) if slot is not None else end
        if end > hold_end:
            self._fault("overrun", head.step, dst, end, (end - hold_end) / 1e3)
        key = (head.step, dst)
        with self._lock:
            done = self._sent.setdefault(key, [start, 0])
            done[1] += head.nbytes
            finished = done[1] >= self._to_send.get(key, 0)
        if finished and slot is not None:
            self._slot_done(head.step, dst, slot, done[0], end)

    def _slot_done(self, step: int, dst: str, slot: SlotSpec, opened: int, end: int) -> None:
        planned = self._at(slot.data_start_s)
        TRACE.complete(Track(self.process, "slots"), f"step {step} -> {dst}", "slot",
                       TRACE.to_controller(opened), TRACE.to_controller(end), self._base(
                           step=step, peer=dst, slot=slot.index,
                           planned_start_us=self._rel_us(planned),
                           planned_end_us=self._rel_us(self._at(slot.end_s)),
                           gate_open_us=self._rel_us(opened),
                           gate_error_us=(opened - planned) / 1e3, data_us=(end - opened) / 1e3,
                           slot_us=(slot.end_s - slot.data_start_s) * 1e6))

    # ---- receives ----------------------------------------------------------------------
    def arrived(self, src: str, head: ChunkHead, at: int) -> None:
        """A chunk from `src` handed to the executor at `at` (its reduction follows)."""
        slot = self._slot(head.step, src, self.run.me)
        late = (max(0, at - self._at(self._hold_end[slot.index])) / 1e3 if slot is not None
                else 0.0)
        with self._lock:
            self._received[threading.get_ident()] = (at, round(late * 1e3), src, head)
        if late > 0:
            self._fault("late chunk", head.step, src, at, late)

    def reduced(self) -> None:
        """The chunk this thread received last is reduced (or copied) into the bucket."""
        end = wallclock.now_ns()
        with self._lock:
            got = self._received.pop(threading.get_ident(), None)
        if got is None:
            return
        at, late_ns, src, head = got
        TRACE.complete(Track(self.process, "recv"), "recv", "chunk", TRACE.to_controller(at),
                       TRACE.to_controller(end), self._base(
                           step=head.step, peer=src, offset=head.offset, bytes=head.nbytes,
                           late_us=late_ns / 1e3))

    def lost(self, src: str, step: int, error: BaseException) -> None:
        """A receive from `src` gave up: its chunk is lost."""
        now = wallclock.now_ns()
        slot = self._slot(step, src, self.run.me)
        by = (now - self._at(self._hold_end[slot.index])) / 1e3 if slot is not None else 0.0
        self._fault("lost chunk", step, src, now, max(by, 0.0), error=str(error)[:200])

    def _fault(self, name: str, step: int, peer: str, at: int, by_us: float, **more: Any) -> None:
        TRACE.instant(Track(self.process, "faults"), name, "fault", TRACE.to_controller(at),
                      self._base(step=step, peer=peer, by_us=by_us, **more))

    # ---- the collective ----------------------------------------------------------------
    def finished(self, collective: str, step: int, ok: bool) -> None:
        """The collective's own event, from the executor's start to now."""
        kind = self.run.kind
        TRACE.complete(Track(self.process, "collectives"), f"{collective or 'plan'} {kind}",
                       "collective", TRACE.to_controller(self.started),
                       TRACE.to_controller(wallclock.now_ns()), self._base(
                           collective=collective, kind=kind, bytes=self.nbytes, step=step,
                           ok=ok, network=self.run.network))


def _hold_ends(run: CollectiveRun) -> dict[int, float]:
    """Per slot, when its circuits may change (s after t0): its end, or the end of the slots
    after it that keep every circuit (decision record 0013: their sends follow at once, so
    the plan's slot edges between them bind nothing). A send past it is an overrun, an
    arrival after it late."""
    keep = continuing_slots(run.slots)
    ends: dict[int, float] = {}
    for slot in sorted(run.slots, key=lambda s: s.index, reverse=True):
        later = ends.get(slot.index + 1)
        ends[slot.index] = later if slot.index + 1 in keep and later is not None else slot.end_s
    return ends


class TracedLink:
    """A chunk link that times every chunk on the run's `RunTrace` (same calls, same errors)."""

    def __init__(self, link: Any, trace: RunTrace):
        self._link = link
        self._trace = trace

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Cancel | None = None,
                   optical: bool = False) -> None:
        """Send one chunk (`oddl.agents.collective.context.ChunkLink`) and record it."""
        start = wallclock.now_ns()
        self._link.send_chunk(job, dst, head, payload, deadline_s, cancel, optical)
        self._trace.sent(dst, head, start, wallclock.now_ns())

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Cancel | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """Receive one chunk (`oddl.agents.collective.context.ChunkLink`) and record its arrival."""
        try:
            head, payload = self._link.recv_chunk(job, src, seq, step, deadline, cancel, into)
        except CollectiveError as exc:
            self._trace.lost(src, step, exc)
            raise
        self._trace.arrived(src, head, wallclock.now_ns())
        return head, payload
