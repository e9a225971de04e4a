"""Granting point-to-point flows (`RequestFlow`): the circuit, then a window (`FlowBook`).

A sender's agent asks for a flow to one node of its job before it sends. The controller waits
for the job's collective slots still being carried out, tunes the sender's transmitter to the
receiver's channel if it is elsewhere (through the `DeviceManager`, as a slot's retune: on a
failure the flow is refused unsent, naming the transmitter and where its log is), and
grants a window after the transmitter's and the receiver's previous flows. The receiver takes
part in nothing here: its agent keeps what arrives until its training process asks for it.

Grants are made one at a time: a retune waits for the transmitter's previous flow to be off
the air. The agents drop their standing schedules after a flow that moved a laser, so the
job's next collective lays its circuits out again at the barrier (`oddl.agents.point_to_point`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from oddl.common.config import TestbedConfig
from oddl.common.errors import OperationRefused
from oddl.common.tracing import TRACE
from oddl.controller import trace_hooks
from oddl.controller.devices import DeviceManager
from oddl.controller.flow_book import FlowBook, FlowNumbersExhausted
from oddl.controller.jobs import JobManager, JobRecord
from oddl.controller.slot_executor import SlotExecutor
from oddl.protos import oddl_pb2 as pb

MAX_FLOW_BYTES = 1 << 36
"""Largest flow a sender may ask for (64 GiB): a bound against arithmetic overflow."""
RETUNE_TIMEOUT_S = 2.0


class FlowDesk:
    """Grants flows; owns the `FlowBook`."""

    def __init__(self, cfg: TestbedConfig, jobs: JobManager, devices: DeviceManager,
                 executor: SlotExecutor, lock: threading.RLock, errors: Counter[str]):
        self.cfg = cfg
        self.jobs = jobs
        self.devices = devices
        self.executor = executor
        self.lock = lock
        self.errors = errors
        self.book = FlowBook()
        self.granted = 0
        self.retunes = 0
        self._grants = threading.Lock()

    def request(self, request: pb.RequestFlowRequest) -> pb.FlowGrant:
        """The grant of a flow; OperationRefused naming what is wrong with the request, or
        the device when the circuit could not be made (nothing was sent)."""
        job = self._checked(request)
        self.executor.join(job.id)  # the job's collective slots end before its lasers move
        src, dst = request.node_id, request.dst
        tx = self.cfg.node(src).transmitter
        channel = self.jobs.topology.node(dst).rx_channel
        timing = self.jobs.timing
        with self._grants:
            guard_s, retuned = 0.0, False
            if job.network != "ideal" and self.devices.verified.channels.get(tx) != channel:
                guard_s = self._retune(job, src, dst, tx, channel)
                retuned = True
            # the sender is the only one to tell, and it waits for this reply: its window may
            # open now (a retune above is locked already); the book keeps it after the
            # devices' previous windows, each with the slot margin and the clock skew
            earliest = time.time()
            try:
                window = self.book.book(
                    (job.id, src, dst, request.tag), tx, dst, earliest,
                    timing.hold_s(request.message_bytes), timing.slot_margin_s + timing.skew_s,
                    max(0.0, time.time() - job.submitted_ns / 1e9))
            except FlowNumbersExhausted as exc:
                raise OperationRefused(f"job {job.id}: {exc}") from None
            self.granted += 1
        if TRACE.on:
            trace_hooks.control("flow grant", job.id, window.number, src=src, dst=dst,
                                tag=request.tag, bytes=request.message_bytes,
                                channel=channel, retuned=retuned,
                                t0_ns=round(window.t0_s * 1e9))
        return pb.FlowGrant(flow=window.number, t0_ns=round(window.t0_s * 1e9),
                            hold_s=window.hold_s, channel=channel, retuned=retuned,
                            guard_s=guard_s)

    def _checked(self, request: pb.RequestFlowRequest) -> JobRecord:
        with self.lock:
            job = self.jobs.running_with(request.job_id, request.node_id)
            if request.dst not in job.nodes or request.dst == request.node_id:
                raise OperationRefused(
                    f"a flow from {request.node_id} to {request.dst!r}: the receiver must be "
                    f"another node of job {job.id} ({', '.join(job.nodes)})")
            if not 0 < request.message_bytes <= MAX_FLOW_BYTES:
                raise OperationRefused(f"a flow of {request.message_bytes} B; send 1 B to "
                                       f"{MAX_FLOW_BYTES:,} B")
            return job

    def _retune(self, job: JobRecord, src: str, dst: str, tx: str, channel: int) -> float:
        """Tune `tx` to `channel` once its previous flow is off the air; the time it took."""
        free_at = self.book.transmitter_free_at(tx)
        if free_at > time.time():
            time.sleep(free_at - time.time())
        start_ns = time.time_ns()
        errors = self.devices.retune({tx: channel}, RETUNE_TIMEOUT_S)
        if TRACE.on:
            TRACE.complete(trace_hooks.Track("controller", f"retunes {tx}"),
                           f"retune {tx} -> ch {channel}", "retune", start_ns, time.time_ns(),
                           {"job": job.id, "flow": f"{src} -> {dst}", "transmitter": tx,
                            "channel": channel, "ok": not errors, "errors": errors})
        if errors:
            self.errors["flow retune failed"] += 1
            raise OperationRefused(f"a flow from {src} to {dst} of job {job.id} needs {tx} on "
                              f"channel {channel}; the retune failed ({'; '.join(errors)}), "
                              f"so nothing was sent: see `oddl devices log {tx}`")
        self.retunes += 1
        return (time.time_ns() - start_ns) / 1e9
