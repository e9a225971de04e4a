"""The controller's events on the trace (docs/reference/trace-format.md): the planned schedule, retunes
and the circuits they make, grants, hand-off confirmations, barrier and standing starts.

Every function here is called only while `TRACE.on` (the call sites check it), so none of this
costs anything when nothing records. Times are the controller's own clock: the trace's axis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from oddl.common.tracing import TRACE, Track
from oddl.controller.scheduling.slot_grants import RetuneOrder
from oddl.protos import oddl_pb2 as pb

CONTROL = Track("controller", "control")
_circuits: dict[tuple[str, int, int], list[pb.Circuit]] = {}
"""The circuits of each (job, seq, slot) of the collectives started while recording, for the
retunes that make them (`retuned`); dropped with the collective (`forget`)."""
_slot_ends: dict[tuple[str, int, int], int] = {}
_lock = threading.Lock()


def control(name: str, job: str, seq: int, t_ns: int | None = None, **more: Any) -> None:
    """A control instant (``grant``, ``handoff confirmed``, ``barrier start``, ...)."""
    TRACE.instant(CONTROL, name, "control", time.time_ns() if t_ns is None else t_ns,
                  {"job": job, "seq": seq, **more})


def remember(job: str, seq: int, go: pb.CollectiveGo) -> None:
    """Keep the circuits of a collective about to start, for its retunes (`retuned`): called
    before the slot executor starts, so its first retune finds them."""
    with _lock:  # only slots that retune: the slot executor that runs them forgets them
        for slot in (s for s in go.schedule.slots if any(c.retune for c in s.circuits)):
            _circuits[(job, seq, slot.index)] = list(slot.circuits)
            _slot_ends[(job, seq, slot.index)] = go.t0_ns + slot.end_ns


def planned(job: str, seq: int, nodes: Sequence[str], go: pb.CollectiveGo, how: str) -> None:
    """A collective starts (`how`: ``barrier start`` or ``standing start``): its planned slot
    windows per node, its circuits that need no retune (up for their slot as planned)."""
    control(how, job, seq, t0_ns=go.t0_ns, collective=go.schedule.collective)
    t0 = go.t0_ns
    for slot in go.schedule.slots:
        start, end = t0 + slot.data_start_ns, t0 + slot.end_ns
        for c in slot.circuits:
            _plan_window(job, seq, slot, c, start, end, t0)
            if not c.retune:
                _circuit(job, seq, slot.index, c, t0 + slot.start_ns, end)
    del nodes  # the windows name their nodes; kept for callers that pass the job's nodes


def _plan_window(job: str, seq: int, slot: pb.Slot, c: pb.Circuit, start: int, end: int,
                 t0: int) -> None:
    track = Track("controller", f"plan {c.src}")
    name = f"plan step {slot.step} -> {c.dst}"
    ident = f"{job}/{seq}/{slot.index}/{c.src}/{c.dst}"
    TRACE.begin(track, name, "plan", ident, start, {
        "job": job, "seq": seq, "step": slot.step, "node": c.src, "peer": c.dst,
        "slot": slot.index, "planned_start_us": (start - TRACE.base_ns) / 1e3,
        "planned_end_us": (end - TRACE.base_ns) / 1e3, "t0_offset_us": (start - t0) / 1e3,
        "guard_us": (slot.data_start_ns - slot.start_ns) / 1e3})
    TRACE.end(track, name, "plan", ident, end)


def _circuit(job: str, seq: int, slot: int, c: pb.Circuit, start: int, end: int) -> None:
    track = Track("controller", f"circuits {c.transmitter}")
    name = f"tx {c.src} -> rx {c.dst} ch {c.channel}"
    ident = f"{job}/{seq}/{slot}/{c.transmitter}"
    TRACE.begin(track, name, "circuit", ident, start, {
        "job": job, "seq": seq, "slot": slot, "src": c.src, "dst": c.dst, "channel": c.channel,
        "transmitter": c.transmitter, "wss": c.wss, "in_port": c.in_port,
        "out_port": c.out_port})
    TRACE.end(track, name, "circuit", ident, max(start, end))


def retuned(job: str, seq: int, order: RetuneOrder, start_ns: int, errors: Sequence[str]) -> None:
    """A slot's retunes, from the command to every lock confirmed, and the circuits they made
    (from the lock to the slot's planned end)."""
    end = time.time_ns()
    with _lock:
        circuits = {c.transmitter: c for c in _circuits.get((job, seq, order.slot), [])}
        slot_end = _slot_ends.get((job, seq, order.slot), end)
    for tx, channel in order.channels.items():
        c = circuits.get(tx)
        TRACE.complete(Track("controller", f"retunes {tx}"), f"retune {tx} -> ch {channel}",
                       "retune", start_ns, end, {
                           "job": job, "seq": seq, "slot": order.slot, "transmitter": tx,
                           "channel": channel, "wss": c.wss if c else "",
                           "in_port": c.in_port if c else "", "out_port": c.out_port if c else 0,
                           "ok": not errors, "errors": list(errors)})
        if c is not None and not errors:
            _circuit(job, seq, order.slot, c, end, slot_end)


def forget(job: str, seq: int) -> None:
    """Drop what was kept of `job`'s collectives up to `seq`."""
    with _lock:
        for key in [k for k in _circuits if k[0] == job and k[1] <= seq]:
            _circuits.pop(key, None)
            _slot_ends.pop(key, None)
