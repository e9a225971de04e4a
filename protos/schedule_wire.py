"""The one schedule codec: a scheduled collective on the wire (`pb.Schedule`) and back.

The controller encodes the scheduling core's schedule once (`encode_schedule`,
`encode_optinc_schedule`); the agents decode it into the one form their executor runs on
(`decode_schedule`). What both ends must agree on is decided here, at encoding time, and
carried in the message: the receive timeout, and per slot whether it changes a circuit and
which earlier flows (hand-offs) must have arrived first. Nobody computes them again.

Hand-offs: two things change between slots on a TT-FR fabric: a transmitter retunes to a new
receiver, or a receiver starts hearing a new transmitter (on its own channel). Either is only
safe once the frame that used the old circuit has arrived: a transmitter that retuned early
would cut its last frame off, and a new sender on a receiver's channel would collide with a
late frame of the old one. For every slot that changes a circuit the encoder lists the
earlier flows that must have been received first; the receiver of each confirms its arrival
to the controller, which then (retunes and) grants the slot. One confirmation per circuit
change, none per flow on a circuit that stays (a ring never needs one).

This module sits below the controller (layer contract): the encoders read the core's
schedules through the protocols of `oddl.protos.schedule_shapes`, not by importing them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oddl.common.config import OPTINC
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_shapes import OptincScheduleShape, ScheduleShape, TotalsShape

if TYPE_CHECKING:
    from oddl.common.config import TestbedConfig

EVERY_SLOT = 0xFFFFFFFF
"""`CircuitsReady.slot` for an answer about every slot of the collective (a refusal)."""

SlotPairs = tuple[int, Sequence[tuple[str, str, bool]]]
"""(slot index, [(src node, dst node, src retunes in this slot), ...])."""

Handoff = tuple[int, str, str]
"""(slot index of the earlier flow, its src node, its dst node)."""


# ---- hand-offs -----------------------------------------------------------------------------


def handoffs(slots: Iterable[SlotPairs]) -> dict[int, list[Handoff]]:
    """For each slot that changes a circuit, the earlier flows that must have arrived.

    A slot is listed (possibly with no flows to wait for) when a transmitter retunes in it or
    a receiver hears a different transmitter than in its previous slot.
    """
    last_tx: dict[str, tuple[int, str]] = {}
    last_rx: dict[str, tuple[int, str]] = {}
    out: dict[int, list[Handoff]] = {}
    for index, pairs in slots:
        need: list[Handoff] = []
        changes = False
        for src, dst, retune in pairs:
            if retune:
                changes = True
                if src in last_tx:
                    need.append((last_tx[src][0], src, last_tx[src][1]))
            heard = last_rx.get(dst)
            if heard is not None and heard[1] != src:
                changes = True
                need.append((heard[0], heard[1], dst))
        if changes:
            out[index] = sorted(set(need))
        for src, dst, _retune in pairs:
            last_tx[src] = (index, dst)
            last_rx[dst] = (index, src)
    return out


def confirmations_for(node: str, slots: Iterable[SlotPairs]) -> set[tuple[int, str]]:
    """The arrivals (slot index, src) that `node` must confirm to the controller."""
    return {(j, src) for need in handoffs(slots).values() for j, src, dst in need if dst == node}


def wire_handoffs(schedule: pb.Schedule) -> dict[int, list[Handoff]]:
    """The hand-offs an encoded schedule carries: for each slot that changes a circuit (by
    index), the earlier flows (slot, src, dst) whose arrival must be confirmed first."""
    return {s.index: [(h.slot, h.src, h.dst) for h in s.handoffs]
            for s in schedule.slots if s.changes_circuits}


def receive_timeout(cfg: TestbedConfig) -> float:
    """The testbed's receive timeout in seconds: how long past its due time a receive (on the
    ideal network: past the last progress) or a hand-off confirmation may take."""
    return cfg.timing.receive_timeout_ms / 1e3


# ---- encoding (the controller) -------------------------------------------------------------


def encode_schedule(sched: ScheduleShape, job_id: str, receive_timeout_s: float
                    ) -> pb.Schedule:
    """The wire form of a schedule, times relative to its start, with the plan's transfers,
    the receive timeout and each slot's hand-offs."""
    out = _header(sched, job_id, sched.plan.collective, sched.plan.n_elems,
                  sched.reconfigurations, receive_timeout_s)
    for step in sched.plan.steps:
        wire = out.steps.add(op=str(step.op), src=step.src.tolist(), dst=step.dst.tolist(),
                             offset=step.offset.tolist(), length=step.length.tolist())
        if step.recv_offset is not None:  # absent: at the send offset (every all-reduce)
            wire.recv_offset.extend(step.recv_offset.tolist())
    grid = sched.topology.grid
    for slot in sched.slots:
        retuning = {r.transmitter for r in slot.retunes()}
        ps = out.slots.add(index=slot.index, step=slot.step,
                           start_ns=round((slot.start_s - sched.start_s) * 1e9),
                           data_start_ns=round((slot.data_start_s - sched.start_s) * 1e9),
                           end_ns=round((slot.end_s - sched.start_s) * 1e9))
        for c, nbytes in zip(slot.circuits(), slot.bytes.tolist(), strict=True):
            ps.circuits.add(src=c.src, dst=c.dst, transmitter=c.transmitter, channel=c.channel,
                            frequency_thz=grid.frequency_thz(c.channel), wss=c.wss,
                            in_port=c.in_port, out_port=c.out_port, bytes=nbytes,
                            retune=c.transmitter in retuning)
    by_index = {ps.index: ps for ps in out.slots}
    pairs = [(s.index, [(c.src, c.dst, c.retune) for c in s.circuits]) for s in out.slots]
    for index, need in handoffs(pairs).items():
        ps = by_index[index]
        ps.changes_circuits = True
        for j, src, dst in need:
            ps.handoffs.add(slot=j, src=src, dst=dst)
    return out


def encode_optinc_schedule(sched: OptincScheduleShape, job_id: str, receive_timeout_s: float
                           ) -> pb.Schedule:
    """The wire form of an optinc schedule: two slots whose circuits name the device as the
    destination (upload) and the source (broadcast); no plan steps (no rank-to-rank data),
    no retunes and so no hand-offs."""
    out = _header(sched, job_id, OPTINC, sched.n_elems, 0, receive_timeout_s)
    for slot in sched.slots:
        ps = out.slots.add(index=slot.index, step=slot.step, start_ns=round(slot.start_s * 1e9),
                           data_start_ns=round(slot.data_start_s * 1e9),
                           end_ns=round(slot.end_s * 1e9))
        for src, dst, nbytes in slot.flows:
            ps.circuits.add(src=src, dst=dst, bytes=nbytes)
    return out


def _header(sched: TotalsShape, job_id: str, collective: str, n_elems: int,
            reconfigurations: int, receive_timeout_s: float) -> pb.Schedule:
    """A wire schedule with its totals and no slots yet."""
    return pb.Schedule(job_id=job_id, collective=collective, n_elems=n_elems,
                       itemsize=sched.itemsize, reconfigurations=reconfigurations,
                       guard_total_s=sched.guard_total_s, makespan_s=sched.makespan_s,
                       efficiency=sched.efficiency, receive_timeout_s=receive_timeout_s)


# ---- decoding (the agents) -----------------------------------------------------------------


@dataclass(frozen=True)
class StepSpec:
    """One plan step as the agent receives it: tuples of transfers (ranks and element
    ranges) and the op ("reduce" or "copy"); hashable, so chunk plans are cached by it."""

    op: str
    src: tuple[int, ...]
    dst: tuple[int, ...]
    offset: tuple[int, ...]
    length: tuple[int, ...]
    recv_offset: tuple[int, ...] = ()
    """Where each receiver puts its segment; empty: at `offset`."""

    @property
    def landing(self) -> tuple[int, ...]:
        """Where each transfer lands in its receiver's buffer (element offsets)."""
        return self.recv_offset or self.offset


@dataclass(frozen=True)
class SlotSpec:
    """One slot as the agent needs it: times relative to t0, the (src, dst) node pairs,
    whether its senders wait for the controller's grant (it changes a circuit) and the
    earlier flows whose arrival the grant waits for (their receivers confirm them)."""

    index: int
    step: int
    data_start_s: float
    end_s: float
    pairs: tuple[tuple[str, str], ...]
    changes_circuits: bool = False
    handoffs: tuple[Handoff, ...] = ()
    keeps: bool | None = None
    """Whether the slot keeps every circuit of the slot before it, as the whole schedule
    says (a node's part carries it); None: decide from the slots at hand."""


@dataclass(frozen=True)
class DecodedSchedule:
    """A wire schedule in the form the agent's executor runs on."""

    collective: str
    steps: tuple[StepSpec, ...]
    slots: tuple[SlotSpec, ...]
    receive_timeout_s: float
    n_elems: int = 0
    """The work buffer the steps use: more than the caller's elements when hosts forward
    (the relays' scratch, `oddl.controller.scheduling.forwarding`)."""

    @property
    def device(self) -> str:
        """The destination of the first slot's first circuit (an optinc schedule's device)."""
        return next((dst for s in self.slots[:1] for _src, dst in s.pairs[:1]), "")


def decode_schedule(schedule: pb.Schedule) -> DecodedSchedule:
    """Decode a wire schedule (as `encode_schedule`/`encode_optinc_schedule` made it)."""
    steps = tuple(StepSpec(s.op, tuple(s.src), tuple(s.dst), tuple(s.offset), tuple(s.length),
                           tuple(s.recv_offset))
                  for s in schedule.steps)
    part = bool(schedule.node_id)
    slots = tuple(SlotSpec(s.index, s.step, s.data_start_ns / 1e9, s.end_ns / 1e9,
                           tuple((c.src, c.dst) for c in s.circuits), s.changes_circuits,
                           tuple((h.slot, h.src, h.dst) for h in s.handoffs),
                           s.keeps_circuits if part else None)
                  for s in schedule.slots)
    return DecodedSchedule(schedule.collective, steps, slots, schedule.receive_timeout_s,
                           schedule.n_elems)


def granted_slots(slots: Iterable[SlotSpec]) -> frozenset[int]:
    """The slots whose senders wait for the controller's CircuitsReady."""
    return frozenset(s.index for s in slots if s.changes_circuits)


def continuing_slots(slots: Iterable[SlotSpec]) -> frozenset[int]:
    """The slots that keep every circuit of the slot before them: they change no circuit and
    carry exactly its (src, dst) pairs, so each transmitter's light already reaches the same
    receiver and no other transmitter can reach it. A send of such a slot needs no slot edge:
    it may follow the previous slot's sends as soon as its data is ready. Slots of a node's
    part say it themselves (`SlotSpec.keeps`): a part alone cannot tell."""
    slots = list(slots)
    if any(s.keeps is not None for s in slots):
        return frozenset(s.index for s in slots if s.keeps)
    out: set[int] = set()
    previous: SlotSpec | None = None
    for slot in sorted(slots, key=lambda s: s.index):
        if (previous is not None and slot.index == previous.index + 1
                and not slot.changes_circuits and set(slot.pairs) == set(previous.pairs)):
            out.add(slot.index)
        previous = slot
    return frozenset(out)


def confirmations(slots: Iterable[SlotSpec], node: str) -> frozenset[tuple[int, str]]:
    """The arrivals (slot index, src) that `node` confirms to the controller."""
    return frozenset((j, src) for s in slots for j, src, dst in s.handoffs if dst == node)


# ---- questions about a wire schedule -------------------------------------------------------


def schedule_sha256(schedule: pb.Schedule) -> bytes:
    """SHA-256 of the whole schedule's deterministic serialisation (of a node's part: the
    digest of the whole it carries): equal digests, same schedule."""
    if schedule.node_id:
        return schedule.whole_sha256
    return hashlib.sha256(schedule.SerializeToString(deterministic=True)).digest()


def retunes(schedule: pb.Schedule) -> bool:
    """Whether any slot of the (whole) schedule retunes a transmitter."""
    if schedule.node_id:
        return schedule.whole_retunes
    return any(c.retune for slot in schedule.slots for c in slot.circuits)


def first_data_start(schedule: pb.Schedule) -> float:
    """Seconds from the schedule's start (`t0`) to its first slot's data window."""
    return min((slot.data_start_ns for slot in schedule.slots), default=0) / 1e9


def ends_where_it_starts(schedule: pb.Schedule) -> bool:
    """Whether running the schedule leaves every transmitter on the channel it starts on, so
    the same schedule can run again at once: each transmitter's first circuit needs no retune
    (it is already there) and its last circuit is on that same channel."""
    if schedule.node_id:
        return schedule.whole_ends_where_it_starts
    first: dict[str, tuple[int, bool]] = {}
    last: dict[str, int] = {}
    for slot in sorted(schedule.slots, key=lambda s: s.start_ns):
        for c in slot.circuits:
            if not c.transmitter:
                continue
            first.setdefault(c.transmitter, (c.channel, c.retune))
            last[c.transmitter] = c.channel
    return all(not retuned and last[tx] == ch for tx, (ch, retuned) in first.items())


# ---- each node's part (the controller, for a go) -------------------------------------------


def node_parts(whole: pb.Schedule, nodes: Sequence[str]) -> dict[str, pb.Schedule]:
    """Each node's part of `whole` (`nodes` in rank order), in one pass over it: the slots
    where the node sends, receives or confirms a hand-off, with only those circuits and
    hand-offs; every step, with only the node's own transfers (a step keeps its place); the
    totals, and what only the whole tells, so every node decides alike: its digest, whether
    it retunes, whether it ends where it starts, which slots keep their circuits."""
    keeps = continuing_slots(decode_schedule(whole).slots)
    header = pb.Schedule()
    header.CopyFrom(whole)
    header.ClearField("slots")
    header.ClearField("steps")
    header.whole_sha256 = schedule_sha256(whole)
    header.whole_retunes = retunes(whole)
    header.whole_ends_where_it_starts = ends_where_it_starts(whole)
    parts: dict[str, pb.Schedule] = {}
    for n in nodes:
        parts[n] = part = pb.Schedule()
        part.CopyFrom(header)
        part.node_id = n
    for step in whole.steps:
        _split_step(step, nodes, parts)
    for slot in whole.slots:
        _split_slot(slot, slot.index in keeps, parts)
    return parts


def _split_step(step: pb.PlanStep, nodes: Sequence[str], parts: dict[str, pb.Schedule]
                ) -> None:
    """Add to each node's part its own transfers of `step` (an empty step when none)."""
    mine: list[list[int]] = [[] for _ in nodes]
    src, dst = list(step.src), list(step.dst)
    for i, (s, d) in enumerate(zip(src, dst, strict=True)):
        mine[s].append(i)
        if d != s:
            mine[d].append(i)
    offset, length, landing = list(step.offset), list(step.length), list(step.recv_offset)
    for rank, n in enumerate(nodes):
        ix = mine[rank]
        parts[n].steps.add(op=step.op, src=[src[i] for i in ix], dst=[dst[i] for i in ix],
                           offset=[offset[i] for i in ix], length=[length[i] for i in ix],
                           recv_offset=[landing[i] for i in ix] if landing else [])


def _split_slot(slot: pb.Slot, keeps: bool, parts: dict[str, pb.Schedule]) -> None:
    """Add `slot` to the part of each node that sends or receives in it (with its circuits)
    or confirms one of its hand-offs (with those)."""
    circuits: dict[str, list[pb.Circuit]] = {}
    for c in slot.circuits:
        circuits.setdefault(c.src, []).append(c)
        if c.dst != c.src:
            circuits.setdefault(c.dst, []).append(c)
    confirms: dict[str, list[pb.Handoff]] = {}
    for h in slot.handoffs:
        confirms.setdefault(h.dst, []).append(h)
    for n in circuits.keys() | confirms.keys():
        part = parts.get(n)
        if part is None:  # not a node of the job: an optinc device
            continue
        part.slots.add(index=slot.index, step=slot.step, start_ns=slot.start_ns,
                       data_start_ns=slot.data_start_ns, end_ns=slot.end_ns,
                       circuits=circuits.get(n, ()), changes_circuits=slot.changes_circuits,
                       handoffs=confirms.get(n, ()), keeps_circuits=keeps)
