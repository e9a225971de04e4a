"""The slot executor: carries out `oddl.controller.scheduling.slot_grants` for running collectives.

One thread per collective that changes circuits. It waits (until a slot's edge, or until a
confirmation arrives or the slot's deadline passes), feeds the hand-off confirmations the
agents sent and the clock into the pure `SlotGrants` core, and performs what it decides:
retunes through the `DeviceManager`, ``CircuitsReady`` pushes to the job's nodes (a grant, or
a failure with its reason), guard-phase metrics. A late confirmation or a failed retune delays
or fails this one collective with a reason; it never cuts a frame off, collides two senders,
or sends light to the wrong node.

It is given what it needs of a job as values (its id, a `running()` predicate) and tells its
owner what it did through `SlotReports`: the grants and failures to push, the retunes made
(the owner counts them into the job under its lock), the errors to count. It never touches a
job's record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from oddl.common.errors import OddlError
from oddl.common.metrics import Metrics
from oddl.common.tracing import TRACE
from oddl.controller import trace_hooks
from oddl.controller.devices import DeviceManager
from oddl.controller.scheduling.slot_grants import (
    RETUNE_FAILED,
    GatedSlot,
    Grant,
    RetuneOrder,
    SlotDecision,
    SlotFailure,
    SlotGrants,
    late_grant_advice,
)
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)

Running = Callable[[], bool]
"""Whether the collective's job still runs (a job that ended fails its remaining slots)."""


class SlotReports(Protocol):
    """What the executor tells its owner, from the executor's threads."""

    def circuits_ready(self, job_id: str, seq: int, slot: int, error: str) -> None:
        """Push ``CircuitsReady`` for `slot` of collective `seq` to the job's nodes: a grant
        (no `error`) or the reason the slot cannot go."""

    def retuned(self, job_id: str, transmitters: int) -> None:
        """`transmitters` transmitters of `job_id` were retuned (whether or not they lock)."""

    def count_error(self, kind: str) -> None:
        """Count one error of `kind` (``oddl_errors_total``)."""


class Confirmations:
    """The hand-off confirmations the agents sent, per collective, with a condition to wait
    on. They may arrive before the collective's executor starts (a standing collective runs
    ahead of its `StartStanding`), so they are kept here until the collective is over."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int, int, str]] = set()
        self._version = 0
        self._cond = threading.Condition()

    def add(self, job_id: str, seq: int, slot: int, src: str) -> None:
        """Record one confirmed arrival and wake the executors."""
        with self._cond:
            self._seen.add((job_id, seq, slot, src))
            if TRACE.on:
                trace_hooks.control("handoff confirmed", job_id, seq, slot=slot, node=src)
            self._version += 1
            self._cond.notify_all()

    def of(self, job_id: str, seq: int) -> tuple[int, set[tuple[int, str]]]:
        """(version, the (slot, src) arrivals confirmed for collective `seq` of `job_id`)."""
        with self._cond:
            return self._version, {(j, src) for job, s, j, src in self._seen
                                   if job == job_id and s == seq}

    def wait(self, version: int, timeout: float) -> None:
        """Wait up to `timeout` seconds for a confirmation newer than `version`."""
        with self._cond:
            if self._version == version:
                self._cond.wait(timeout)

    def forget(self, job_id: str, seq: int) -> None:
        """Drop the confirmations of `job_id`'s collectives up to `seq`."""
        with self._cond:
            self._seen = {c for c in self._seen if not (c[0] == job_id and c[1] <= seq)}


def gated_slots(schedule: pb.Schedule, t0_s: float) -> list[GatedSlot]:
    """The slots of an encoded schedule started at `t0_s` that change circuits, with the
    hand-offs the encoder put in the message. A slot's deadline is its data start plus the
    schedule's receive timeout, as the agents' receives."""
    out = []
    for slot in schedule.slots:
        if not slot.changes_circuits:
            continue
        guard_s = (slot.data_start_ns - slot.start_ns) / 1e9
        data_start = t0_s + slot.data_start_ns / 1e9
        out.append(GatedSlot(
            index=slot.index, edge_s=t0_s + slot.start_ns / 1e9, data_start_s=data_start,
            deadline_s=data_start + schedule.receive_timeout_s,
            waits_for=frozenset((h.slot, h.src) for h in slot.handoffs),
            retunes={c.transmitter: c.channel for c in slot.circuits if c.retune},
            retune_timeout_s=max(1.0, 20 * guard_s)))
    return out


def sleep_until(t: float, stop: threading.Event, clock: Callable[[], float] = time.time,
                spin_s: float = 0.001) -> bool:
    """Sleep, then spin the last `spin_s`, until `clock()` reaches `t`; False if stopped."""
    while True:
        remaining = t - clock()
        if remaining <= spin_s:
            break
        if stop.wait(min(remaining - spin_s, 0.05)):
            return False
    while clock() < t:
        pass
    return True


class SlotExecutor:
    """Runs the gated slots of each job's current collective on a thread of its own."""

    def __init__(self, devices: DeviceManager, reports: SlotReports,
                 metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.time, line_rate_gbps: float = 0.0,
                 testbed: str = ""):
        self.devices = devices
        self.line_rate_gbps = line_rate_gbps
        self.testbed = testbed
        self.metrics = metrics
        self.confirmations = Confirmations()
        self.stop = threading.Event()
        self._reports = reports
        self._clock = clock
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop every executor (at its next wait)."""
        self.stop.set()

    def join(self, job_id: str, timeout: float = 10) -> None:
        """Wait for the executor of `job_id`'s previous collective, if any."""
        previous = self._threads.get(job_id)
        if previous is not None:
            previous.join(timeout=timeout)

    def retuning(self) -> bool:
        """Whether a collective's slots are being executed (retunes may be due any moment)."""
        return any(t.is_alive() for t in list(self._threads.values()))

    def launch(self, job_id: str, seq: int, go: pb.CollectiveGo, running: Running) -> bool:
        """Start executing collective `seq` of `job_id` (the schedule and `t0` of `go`), if
        any of its slots changes circuits; whether it did."""
        slots = gated_slots(go.schedule, go.t0_ns / 1e9)
        if not slots:
            return False
        t = threading.Thread(target=self._execute, args=(job_id, seq, slots, running),
                             name=f"slots-{job_id}", daemon=True)
        with self._lock:
            self._threads[job_id] = t
        t.start()
        return True

    def _execute(self, job_id: str, seq: int, slots: list[GatedSlot], running: Running) -> None:
        core = SlotGrants(slots)
        try:
            while not self.stop.is_set():
                version, arrived = self.confirmations.of(job_id, seq)
                for slot, src in arrived:
                    core.confirm(slot, src)
                decision = core.decide(self._clock(), running=running())
                if self._carry_out(job_id, seq, core, decision):
                    return
                if decision.retune is not None or decision.wake_at is None:
                    continue  # a retune was carried out: decide again at once
                if decision.at_edge:
                    if not sleep_until(decision.wake_at, self.stop, self._clock):
                        return
                else:
                    self.confirmations.wait(
                        version, min(max(decision.wake_at - self._clock(), 0.0), 0.05))
        finally:
            self.confirmations.forget(job_id, seq)
            trace_hooks.forget(job_id, seq)

    def _carry_out(self, job_id: str, seq: int, core: SlotGrants,
                   decision: SlotDecision) -> bool:
        """Push the grants, perform the retune, report the failure; True when finished."""
        for grant in decision.grants:
            self._grant(job_id, seq, grant)
        if decision.retune is not None:
            started = time.time_ns()
            errors = self._retune(job_id, decision.retune)
            core.retuned(decision.retune.slot, errors)
            if TRACE.on:
                trace_hooks.retuned(job_id, seq, decision.retune, started, errors)
        if decision.failure is not None:
            self._fail(job_id, seq, decision.failure)
        return decision.done

    def _retune(self, job_id: str, order: RetuneOrder) -> list[str]:
        try:
            errors = self.devices.retune(dict(order.channels), timeout=order.timeout_s)
        except OddlError as exc:
            errors = [str(exc)]
        self._reports.retuned(job_id, len(order.channels))
        return errors

    def _grant(self, job_id: str, seq: int, grant: Grant) -> None:
        granted = self._clock()
        late = granted - grant.data_start_s
        self._reports.circuits_ready(job_id, seq, grant.slot, "")
        if TRACE.on:
            trace_hooks.control("grant", job_id, seq, slot=grant.slot, late_us=late * 1e6)
        if self.metrics is not None:
            self.metrics.overrun.observe(max(late, 0.0))
            self.metrics.guard_phase.labels("confirmed").observe(
                max(grant.confirmed_s - grant.edge_s, 0))
            self.metrics.guard_phase.labels("granted").observe(max(granted - grant.edge_s, 0))
        if late > 0:
            logger.warning("job %s %s", job_id, late_grant_advice(
                grant, granted, self.line_rate_gbps, self.testbed))

    def _fail(self, job_id: str, seq: int, failure: SlotFailure) -> None:
        self._reports.count_error(failure.kind)
        self._reports.circuits_ready(job_id, seq, failure.slot, failure.reason)
        if failure.kind == RETUNE_FAILED:
            logger.error("job %s slot %d: %s", job_id, failure.slot, failure.reason)
