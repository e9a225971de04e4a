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
from collections.abc import Callable

from oddl.common.config import TestbedConfig
from oddl.common.errors import OperationRefused
from oddl.common.tracing import TRACE
from oddl.controller import trace_hooks
from oddl.controller.devices import DeviceManager
from oddl.controller.flow_book import FlowBook, FlowNumbersExhausted
from oddl.controller.scheduling import TimingModel, Topology
from oddl.protos import oddl_pb2 as pb

MAX_FLOW_BYTES = 1 << 36
"""Largest flow a sender may ask for (64 GiB): a bound against arithmetic overflow."""
RETUNE_TIMEOUT_S = 2.0
MAX_LEAD_US = 1_000_000
"""Latest a sender may ask its window to open after the grant (1 s): a sender that needs
longer to get going has a host too loaded for any window."""


def check_request(request: pb.RequestFlowRequest, job_id: str, nodes: tuple[str, ...]) -> None:
    """OperationRefused for a flow request job `job_id` (of `nodes`) cannot carry."""
    if request.dst not in nodes or request.dst == request.node_id:
        raise OperationRefused(
            f"a flow from {request.node_id} to {request.dst!r}: the receiver must be "
            f"another node of job {job_id} ({', '.join(nodes)})")
    if not 0 < request.message_bytes <= MAX_FLOW_BYTES:
        raise OperationRefused(f"a flow of {request.message_bytes} B; send 1 B to "
                               f"{MAX_FLOW_BYTES:,} B")
    if request.lead_us > MAX_LEAD_US:
        raise OperationRefused(
            f"a flow from {request.node_id} asks for a window {request.lead_us} us ahead; "
            f"ask for at most {MAX_LEAD_US} us (a host that needs longer to start a send "
            "is too loaded to keep any window: free CPU for its agent)")


class FlowDesk:
    """Grants flows; owns the `FlowBook`. Its owner checks the request against the job
    (`check_request`) and waits for the job's collective slots to end before asking."""

    def __init__(self, cfg: TestbedConfig, topology: Topology, timing: TimingModel,
                 devices: DeviceManager, count_error: Callable[[str], None]):
        self.cfg = cfg
        self.topology = topology
        self.timing = timing
        self.devices = devices
        self.count_error = count_error
        self.book = FlowBook()
        self.granted = 0
        self.retunes = 0
        self._grants = threading.Lock()

    def grant(self, request: pb.RequestFlowRequest, job_id: str, network: str,
              submitted_ns: int) -> pb.FlowGrant:
        """The grant of a checked flow of job `job_id`; OperationRefused naming the device
        when the circuit could not be made (nothing was sent)."""
        src, dst = request.node_id, request.dst
        tx = self.cfg.node(src).transmitter
        channel = self.topology.node(dst).rx_channel
        timing = self.timing
        with self._grants:
            guard_s, retuned = 0.0, False
            if network != "ideal" and self.devices.verified.channels.get(tx) != channel:
                guard_s = self._retune(job_id, src, dst, tx, channel)
                retuned = True
            # the sender is the only one to tell, and it waits for this reply: its window may
            # open as soon as the reply can reach it (the lead it asked for; a retune above is
            # locked already); the book keeps it after the devices' previous windows, each
            # with the slot margin and the clock skew
            earliest = time.time() + request.lead_us / 1e6
            try:
                window = self.book.book(
                    (job_id, src, dst, request.tag), tx, dst, earliest,
                    timing.hold_s(request.message_bytes), timing.slot_margin_s + timing.skew_s,
                    max(0.0, time.time() - submitted_ns / 1e9))
            except FlowNumbersExhausted as exc:
                raise OperationRefused(f"job {job_id}: {exc}") from None
            self.granted += 1
        if TRACE.on:
            trace_hooks.control("flow grant", job_id, window.number, src=src, dst=dst,
                                tag=request.tag, bytes=request.message_bytes,
                                channel=channel, retuned=retuned,
                                t0_ns=round(window.t0_s * 1e9))
        return pb.FlowGrant(flow=window.number, t0_ns=round(window.t0_s * 1e9),
                            hold_s=window.hold_s, channel=channel, retuned=retuned,
                            guard_s=guard_s)

    def _retune(self, job_id: str, src: str, dst: str, tx: str, channel: int) -> float:
        """Tune `tx` to `channel` once its previous flow is off the air; the time it took."""
        free_at = self.book.transmitter_free_at(tx)
        if free_at > time.time():
            time.sleep(free_at - time.time())
        start_ns = time.time_ns()
        errors = self.devices.retune({tx: channel}, RETUNE_TIMEOUT_S)
        if TRACE.on:
            TRACE.complete(trace_hooks.Track("controller", f"retunes {tx}"),
                           f"retune {tx} -> ch {channel}", "retune", start_ns, time.time_ns(),
                           {"job": job_id, "flow": f"{src} -> {dst}", "transmitter": tx,
                            "channel": channel, "ok": not errors, "errors": errors})
        if errors:
            self.count_error("flow retune failed")
            raise OperationRefused(f"a flow from {src} to {dst} of job {job_id} needs {tx} on "
                              f"channel {channel}; the retune failed ({'; '.join(errors)}), "
                              f"so nothing was sent: see `oddl devices log {tx}`")
        self.retunes += 1
        return (time.time_ns() - start_ns) / 1e9
