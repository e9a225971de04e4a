"""Runs one collective at one node: plan steps, gated into schedule slots, over a link.

The plan says, per step, which element ranges every rank sends to whom and whether the
receiver adds them (reduce) or overwrites (copy). Sends read the buffer as it was at the start
of the step. On the optical network every send waits for the data window of the slot whose
circuit reaches its destination (slot edges are local: t0 converted to this agent's clock plus
the slot's offset); on the ideal network sends go as soon as the data is ready. A receive that
has not arrived by its slot's end plus the receive timeout fails the collective with a clear
error rather than hanging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from oddl.agents.dataplane import Link
from oddl.agents.gate import SlotGate
from oddl.controller.scheduling.handoff import handoffs as slot_handoffs
from oddl.errors import CollectiveError

logger = logging.getLogger(__name__)

REDUCE = "reduce"
COPY = "copy"


@dataclass(frozen=True)
class StepSpec:
    """One plan step as arrays of transfers (ranks and element ranges)."""

    op: str
    src: tuple[int, ...]
    dst: tuple[int, ...]
    offset: tuple[int, ...]
    length: tuple[int, ...]


@dataclass(frozen=True)
class SlotSpec:
    """One slot as the agent needs it: times relative to t0, the (src, dst) node pairs and
    the source nodes whose transmitters retune at the start of this slot."""

    index: int
    step: int
    data_start_s: float
    end_s: float
    pairs: tuple[tuple[str, str], ...]
    retuning: frozenset[str] = frozenset()


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
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        """True when sends wait for their slots (the optical network)."""
        return self.network == "optical"


def run_collective(run: CollectiveRun, buffer: np.ndarray, link: Link, gate: SlotGate,
                   cancel: threading.Event | None = None,
                   handoffs: Handoffs | None = None) -> np.ndarray:
    """Execute `run` on a flat copy of `buffer` and return the result."""
    buf = np.ascontiguousarray(buffer).reshape(-1).copy()
    me = run.nodes[run.rank]
    to_confirm: set[tuple[int, str]] = set()
    granted: set[int] = set()
    if run.gated and handoffs is not None:
        pairs = [(s.index, [(a, b, a in s.retuning) for a, b in s.pairs]) for s in run.slots]
        needs = slot_handoffs(pairs)
        granted = set(needs)
        to_confirm = {(j, src) for need in needs.values() for j, src, dst in need if dst == me}
    slot_of: dict[tuple[int, str, str], SlotSpec] = {}
    step_end: dict[int, float] = defaultdict(float)
    for slot in run.slots:
        for pair in slot.pairs:
            slot_of[(slot.step, *pair)] = slot
        step_end[slot.step] = max(step_end[slot.step], slot.end_s)
    started = time.time()
    worst_gate = 0.0
    for k, step in enumerate(run.steps):
        sends: dict[int, list[tuple[int, int]]] = defaultdict(list)
        recvs: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for s, d, off, length in zip(step.src, step.dst, step.offset, step.length, strict=True):
            if s == run.rank:
                sends[d].append((off, length))
            if d == run.rank:
                recvs[s].append((off, length))
        # one copy per send, taken at the start of the step (snapshot semantics); the copy is
        # handed to ZeroMQ without another copy
        payloads = {d: memoryview(_gather(buf, segs)) for d, segs in sends.items()}
        order = sorted(sends, key=lambda d: _slot_start(slot_of, k, me, run.nodes[d]))
        for d in order:
            dst = run.nodes[d]
            if run.gated:
                slot = slot_of.get((k, me, dst))
                if slot is None:
                    raise CollectiveError(f"{me}: the schedule has no slot for step {k} "
                                          f"{me}->{dst}; the plan and schedule disagree")
                if slot.index in granted and handoffs is not None:
                    handoffs.wait_circuits(run.seq, slot.index, run.t0_local + slot.data_start_s
                                           + run.receive_timeout_s)
                err = gate.wait_until(run.t0_local + slot.data_start_s, cancel)
                worst_gate = max(worst_gate, err)
            header = {"job": run.job_id, "seq": run.seq, "step": k, "src": me, "dst": dst,
                      "net": run.network, "segs": sends[d], "dtype": buf.dtype.str}
            link.send(header, payloads[d])
            logger.debug("%s seq %d step %d: sent %d B to %s", me, run.seq, k,
                         len(payloads[d]), dst)
        for s, segs in recvs.items():
            src = run.nodes[s]
            if run.gated and k in step_end:
                deadline = run.t0_local + step_end[k] + run.receive_timeout_s
            else:
                deadline = time.time() + run.receive_timeout_s
            frame = link.inbox.take((run.job_id, run.seq, k, src), deadline, cancel)
            logger.debug("%s seq %d step %d: received from %s", me, run.seq, k, src)
            if frame is None:
                if cancel is not None and cancel.is_set():
                    raise CollectiveError(f"{me}: collective {run.seq} of job {run.job_id} "
                                          "was cancelled")
                raise CollectiveError(
                    f"{me}: lost data: nothing from {src} for step {k} of collective {run.seq} "
                    f"(job {run.job_id}) by the end of its slot + {run.receive_timeout_s:.1f} s; "
                    "the light path does not reach this node (check the transmitter channel and "
                    "the WSS route, `oddl status`) or the peer failed")
            if to_confirm and handoffs is not None:
                slot = slot_of.get((k, src, me))
                if slot is not None and (slot.index, src) in to_confirm:
                    handoffs.confirm(run.seq, slot.index, src)
            expected = [list(seg) for seg in segs]
            if frame.header.get("segs") != expected or frame.header.get("dtype") != buf.dtype.str:
                raise CollectiveError(f"{me}: frame from {src} step {k} carries "
                                      f"{frame.header.get('segs')} {frame.header.get('dtype')}, "
                                      f"expected {expected} {buf.dtype.str}")
            data = np.frombuffer(frame.payload, dtype=buf.dtype)
            total = sum(n for _, n in segs)
            if data.size != total:
                raise CollectiveError(f"{me}: frame from {src} step {k} has {data.size} "
                                      f"elements, expected {total}")
            pos = 0
            for o, n in segs:
                if step.op == REDUCE:
                    buf[o:o + n] += data[pos:pos + n]
                else:
                    buf[o:o + n] = data[pos:pos + n]
                pos += n
    run.stats["duration_s"] = time.time() - started
    run.stats["gate_error_max_s"] = worst_gate
    return buf.reshape(buffer.shape)


def _gather(buf: np.ndarray, segs: list[tuple[int, int]]) -> np.ndarray:
    if len(segs) == 1:
        o, n = segs[0]
        return buf[o:o + n].copy()
    return np.concatenate([buf[o:o + n] for o, n in segs])


def _slot_start(slot_of: dict[tuple[int, str, str], SlotSpec], step: int, src: str, dst: str
                ) -> float:
    slot = slot_of.get((step, src, dst))
    return slot.data_start_s if slot else 0.0
