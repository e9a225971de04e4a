"""One collective invocation at one node: what it runs on, and what its two runners share.

`CollectiveRun` is the invocation (the decoded schedule's steps and slots, this node's rank,
the start on the local clock); `RunContext` is its state while it runs (its memory, the link,
the gate, the hand-offs this node confirms and the slots it waits for) with the moves both
runners (`oddl.agents.collective.pipelined`, `oddl.agents.collective.step_by_step`) make: gate a send into its slot,
confirm an arrival, check a chunk's header, and say when a step's receives are due.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from oddl.agents.clock import wall as wallclock
from oddl.agents.collective import step_marks
from oddl.agents.collective.chunks import busiest_port_bytes
from oddl.agents.collective.memory import Memory
from oddl.agents.links.stream_wire import CHUNK_BYTES, ChunkHead
from oddl.agents.slot_gate import Cancel, SlotGate
from oddl.common.call_marks import MARKS
from oddl.common.collective_kinds import UFUNCS
from oddl.common.errors import CallsDiffer, CollectiveError
from oddl.protos.schedule_wire import (
    SlotSpec,
    StepSpec,
    confirmations,
    continuing_slots,
    granted_slots,
)

REDUCE = "reduce"
COPY = "copy"


class ChunkLink(Protocol):
    """What the executor needs to move chunks (`oddl.agents.links.streams.StreamLink` and the
    ZeroMQ links of `oddl.agents.links.zeromq`)."""

    def send_chunk(self, job: str, dst: str, head: ChunkHead, payload: memoryview,
                   deadline_s: float, cancel: Cancel | None = None,
                   optical: bool = False) -> None:
        """Send one chunk (on the optical network where the light goes); give up after
        `deadline_s` without progress or on cancel."""

    def recv_chunk(self, job: str, src: str, seq: int, step: int, deadline: float,
                   cancel: Cancel | None = None, into: memoryview | None = None
                   ) -> tuple[ChunkHead, memoryview]:
        """The next chunk from `src` for (seq, step); CollectiveError at `deadline`. The
        payload may be read straight into `into` when it fits exactly."""


class ReductionMarks(Protocol):
    """Where a run tells the trace that a received chunk is applied
    (`oddl.agents.trace.events.RunTrace` is one)."""

    def reduced(self) -> None:
        """The chunk this thread received last is reduced (or copied) into the buffer."""


class Handoffs(Protocol):
    """The control channel for reconfigurations (one message per retune, none per flow)."""

    def wait_circuits(self, seq: int, slot: int, deadline: float) -> None:
        """Block until the controller grants a slot that changes circuits; raise
        CollectiveError if it reports a failure or does not answer by `deadline`."""

    def confirm(self, seq: int, slot: int, src: str) -> None:
        """Tell the controller a flow whose circuit changes next has arrived here."""


@dataclass
class CollectiveRun:
    """Everything one node needs to run one collective invocation."""

    job_id: str
    seq: int
    rank: int
    nodes: tuple[str, ...]
    steps: tuple[StepSpec, ...]
    slots: tuple[SlotSpec, ...] = ()
    t0_local: float = 0.0
    network: str = "optical"
    receive_timeout_s: float = 2.0
    line_rate_bps: float = 0.0
    """The ideal network's line rate: its wire time is the schedule receives are due by."""
    reduce_op: str = "sum"
    """What a receiver does with a REDUCE segment (`oddl.common.collective_kinds.UFUNCS`)."""
    kind: str = "all_reduce"
    """The call's collective kind (`oddl.common.collective_kinds`), for the trace."""
    stats: dict[str, float] = field(default_factory=dict)
    collective: str = ""
    """The schedule's collective (``ring``, ...), for the trace."""
    caller_step: int = 0
    """The training process's number for this call, for the trace."""
    chunk_bytes: int = CHUNK_BYTES
    """The largest chunk a transfer is cut into; the same at every rank of a run (the
    receivers check each chunk's place against their own plan)."""
    exchange_once: bool = False
    """The plan is an all-to-all with this one call's block sizes filled in
    (`oddl.agents.collective.exchange`): its chunks are worked out without the plan caches
    (it would only push out plans that repeat), and every receive lands in an output block
    no send reads, so each may land straight in its place with no proof."""
    circuits_standing: bool = False
    """Every circuit the slots use is up before the run and none changes during it (a
    standing schedule that retunes nothing, decision record 0022): no send waits for a slot
    edge, the data paces the run."""

    @property
    def gated(self) -> bool:
        """True when sends wait for their slots (the optical network)."""
        return self.network == "optical"

    @property
    def on_light(self) -> bool:
        """True when chunks go where the emulated light goes: the optical network's slots,
        or a circuit job's standing light paths (ungated: the data paces the run)."""
        return self.network in ("optical", "circuit")

    @property
    def me(self) -> str:
        """This node's id."""
        return self.nodes[self.rank]


class CancelEither:
    """Set when this run gives up, or when the agent cancels the collective."""

    def __init__(self, outer: threading.Event | None):
        self._outer = outer
        self._own = threading.Event()

    def set(self) -> None:
        """Give this run up (the agent's event is left alone)."""
        self._own.set()

    def is_set(self) -> bool:
        """True once this run or the agent gave up."""
        return self._own.is_set() or (self._outer is not None and self._outer.is_set())


@dataclass
class RunContext:
    """A collective while it runs at this node (see the module docstring)."""

    run: CollectiveRun
    memory: Memory
    """The plan's layout and the arrays holding it (usually one: the bucket)."""
    link: ChunkLink
    gate: SlotGate
    cancel: threading.Event | None
    handoffs: Handoffs | None
    sender: Executor
    stop: CancelEither
    slot_of: dict[tuple[int, str, str], SlotSpec] = field(default_factory=dict)
    step_end: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    granted: frozenset[int] = frozenset()
    continuing: frozenset[int] = frozenset()
    """Slots that keep the previous slot's circuits: their sends wait for no edge."""
    to_confirm: frozenset[tuple[int, str]] = frozenset()
    worst_gate_s: float = 0.0
    trace: ReductionMarks | None = None
    """This run on the trace while it records (`oddl.agents.trace.events.RunTrace`), else None."""

    def __post_init__(self) -> None:
        run, me = self.run, self.run.me
        if run.gated and self.handoffs is not None:
            self.granted = granted_slots(run.slots)
            self.to_confirm = confirmations(run.slots, me)
        if run.gated:
            self.continuing = (frozenset(slot.index for slot in run.slots)
                               if run.circuits_standing else continuing_slots(run.slots))
        for slot in run.slots:
            for pair in slot.pairs:
                self.slot_of[(slot.step, *pair)] = slot
            self.step_end[slot.step] = max(self.step_end[slot.step], slot.end_s)

    def ideal_timing(self, started: float) -> None:
        """The ideal network has no slots: a step is due when every port has carried the
        bytes of the steps so far at the line rate, counted from `started`."""
        self.step_end.clear()
        t, rate = 0.0, self.run.line_rate_bps
        for k, port_bytes in enumerate(busiest_port_bytes(tuple(self.run.steps),
                                                          self.memory.itemsize)):
            t += 8.0 * port_bytes / rate if rate > 0 else 0.0
            self.step_end[k] = t
        self.run = replace(self.run, t0_local=started)  # the caller's run keeps its t0

    def slot_start(self, step: int, dst: str) -> float:
        """When this node's send of `step` to `dst` may start (relative to t0; 0 unknown)."""
        slot = self.slot_of.get((step, self.run.me, dst))
        return slot.data_start_s if slot else 0.0

    def gate_send(self, step: int, dst: str) -> None:
        """Wait until this node may send `step` to `dst`: the controller's grant when its
        slot changes a circuit, then the slot's data start."""
        self.wait_edge(self.grant(step, dst))

    def grant(self, step: int, dst: str) -> float | None:
        """Wait for the controller's grant of the slot of this node's send of `step` to `dst`
        when it changes a circuit; return the slot's data start on the local clock, or None
        when the slot keeps the previous slot's circuits (the send follows the previous
        slot's at once: this node's sends go out in step order)."""
        run, me = self.run, self.run.me
        slot = self.slot_of.get((step, me, dst))
        if slot is None:
            raise CollectiveError(f"{me}: the schedule has no slot for step {step} {me}->{dst}; "
                                  "the plan and schedule disagree")
        if slot.index in self.continuing:
            return None
        edge = run.t0_local + slot.data_start_s
        if slot.index in self.granted and self.handoffs is not None:
            self.handoffs.wait_circuits(run.seq, slot.index,
                                        max(edge, wallclock.now()) + run.receive_timeout_s)
        return edge

    def wait_edge(self, edge: float | None) -> None:
        """Wait for a slot edge on the gate (None: no edge); keep the worst release error."""
        if edge is None:
            return
        self.worst_gate_s = max(self.worst_gate_s, self.gate.wait_until(edge, self.stop))

    def confirm(self, step: int, src: str) -> None:
        """Confirm the arrival of `src`'s flow of `step` when a circuit change waits for it."""
        if not self.to_confirm or self.handoffs is None:
            return
        slot = self.slot_of.get((step, src, self.run.me))
        if slot is not None and (slot.index, src) in self.to_confirm:
            self.handoffs.confirm(self.run.seq, slot.index, src)

    def check_head(self, head: ChunkHead, src: str, step: int, offset: int, n: int) -> None:
        """CallsDiffer unless the chunk carries elements [offset, offset+n)."""
        item = self.memory.itemsize
        if head.offset != offset or head.nbytes != n * item:
            raise CallsDiffer(
                f"{self.run.me}: chunk from {src} step {step} of collective {self.run.seq} "
                f"carries elements {head.offset}+{head.nbytes // item} ({head.nbytes} B), "
                f"expected {offset}+{n} of {self.memory.dtype}; the peers disagree on the plan "
                "or the dtype")

    def due(self, k: int) -> float:
        """When step k's receives are due: its last slot's end on the optical network; on the
        ideal network the later of now and its end on the wire (both then get the receive
        timeout on top)."""
        if k not in self.step_end:
            return wallclock.now()
        due = self.run.t0_local + self.step_end[k]
        return due if self.run.gated else max(wallclock.now(), due)

    def deadline(self, k: int) -> float:
        """When a receive of step k gives up: `due` plus the receive timeout."""
        return self.due(k) + self.run.receive_timeout_s

    def reduced(self) -> None:
        """The chunk received last on this thread is applied to the buffer (for the trace)."""
        if self.trace is not None:
            self.trace.reduced()
        if MARKS.on:
            step_marks.reduced()

    def apply(self, target: np.ndarray, data: np.ndarray, op: str) -> None:
        """Apply a received segment to `target`: reduce it with the run's op, or copy it."""
        if op == REDUCE:
            UFUNCS[self.run.reduce_op](target, data, out=target)
        elif not np.may_share_memory(data, target):  # else it was read into place already
            target[...] = data

    def raise_if_cancelled(self) -> None:
        """CollectiveError when the agent cancelled the collective (not when it failed)."""
        if self.stop.is_set() and self.cancel is not None and self.cancel.is_set():
            raise CollectiveError(f"{self.run.me}: collective {self.run.seq} of job "
                                  f"{self.run.job_id} was cancelled")
