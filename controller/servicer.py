"""The Controller gRPC servicer: a thin translator over the controller's core.

Each method turns one request into one call on `ControllerCore` (jobs, barriers, agents'
news, flows; `oddl.controller.core`), on its registry for a stream's events, or on the
`DeviceManager` for the devices' own state, and a refusal (an `OddlError`) into a gRPC status.
It holds no state of its own beyond the clock service's port and the topology, built once.

Its methods are sync: the server calls them from its event loop's thread pool or, the cheap
ones, on the loop (`oddl.controller.aio_service`, which also owns the `WatchSchedule` stream).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc

from oddl.common.config import TestbedConfig
from oddl.common.errors import OddlError, OperationRefused, SafetyLimitError
from oddl.common.metrics import Metrics
from oddl.controller.core import ControllerCore
from oddl.controller.device_switches import check_connections, describe_ports
from oddl.controller.device_types import Configuration, TransactionError
from oddl.controller.devices import DeviceManager
from oddl.controller.heartbeat_lateness import HOLD_CAP_INTERVALS, Behind
from oddl.controller.store import Store
from oddl.controller.trace_switch import set_trace
from oddl.controller.wire_views import device_log_pb, device_states_pb, job_pb, topology_pb
from oddl.drivers.interfaces import Route
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

T = TypeVar("T")
logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Controller"].full_name


def status_code(exc: OddlError) -> grpc.StatusCode:
    """The gRPC status a refusal is reported with."""
    return (grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, SafetyLimitError)
            else grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, OperationRefused)
            else grpc.StatusCode.ABORTED if isinstance(exc, TransactionError)
            else grpc.StatusCode.UNAVAILABLE)


class ControllerService(pb_grpc.ControllerServicer):
    """The Controller gRPC service."""

    def __init__(self, cfg: TestbedConfig, devices: DeviceManager,
                 metrics: Metrics | None = None, store: Store | None = None):
        self.cfg = cfg
        self.devices = devices
        self.core = ControllerCore(cfg, devices, metrics, store)
        self.clock_port = 0
        """The UDP clock service's port, told to agents at registration (0: none)."""
        self.loop_lag: Callable[[], float] = lambda: 0.0
        """How far the server's event loop is behind, s (`ControllerServer` sets it)."""
        self.topology = topology_pb(cfg)
        """The testbed's topology, built once: every registration and `GetTopology` send it."""
        self.on_time_since = time.monotonic()
        """Since when the controller has read its agents on time (`sweep`): its start, or
        the last sweep it held."""
        self.held_since: float | None = None
        """When the monitor's current hold began (None: not held; `sweep`)."""

    @property
    def stopped(self) -> threading.Event:
        """Set when the service closes: streams, executors and monitors end."""
        return self.core.slots.stop

    def close(self) -> None:
        """Stop the streams and executors."""
        self.core.close()

    def retuning(self) -> bool:
        """Whether a collective's slots are being executed (retunes may be due any moment)."""
        return self.core.slots.retuning()

    def monitor(self) -> None:
        """Detect dead agents (no heartbeat for three intervals) until the service closes,
        counting silence only while the controller reads on time (`sweep`)."""
        while not self.stopped.wait(self.core.registry.interval_s / 2):
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> bool:
        """One round of the monitor at `now` (monotonic); False when held because the
        controller is behind: its loop is late, or the heartbeats it reads were sent an
        interval or more before (decision records 0032, 0034). An agent is dead after three
        intervals of silence counted from the last time the controller was behind (its
        start, first): what it did not read while behind may be waiting unread, and telling
        every peer of each such agent would put it further behind. A held sweep judges by
        the agents' send times, and after `HOLD_CAP_INTERVALS` by read silence with the
        lateness as grace (`Behind`, decision record 0038)."""
        interval = self.core.registry.interval_s
        late = self.core.registry.lateness
        lag, median = self.loop_lag(), late.median_s()
        held = ("event loop behind" if lag >= interval
                else "heartbeats read late" if median >= interval else "")
        late.next_period()
        if not held:
            self.held_since = None
            self.core.sweep(now, self.on_time_since)
            return True
        if self.held_since is None:
            self.held_since = now
        capped = now - self.held_since >= HOLD_CAP_INTERVALS * interval
        logger.warning("sweep held: %s (heartbeats read %.1f s late (median), loop %.1f s "
                       "behind, held for %.1f s%s)", held, median, lag, now - self.held_since,
                       ", capped" if capped else "")
        self.core.count_error(f"sweep held: {held}")
        self.core.sweep(now, self.held_since, Behind(capped, 2 * max(lag, median)))
        self.on_time_since = now
        return False

    def _refuse(self, context: grpc.ServicerContext, exc: OddlError) -> NoReturn:
        self.core.count_error(type(exc).__name__)
        context.abort(status_code(exc), str(exc))
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover

    def _refusing(self, context: grpc.ServicerContext, call: Callable[[], T]) -> T:
        """`call()`, or its OddlError as the RPC's refusal."""
        try:
            return call()
        except OddlError as exc:
            self._refuse(context, exc)

    def _unknown_node(self, context: grpc.ServicerContext, node_id: str) -> NoReturn:
        context.abort(*self.not_streaming(node_id))
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover

    # ---- agents -----------------------------------------------------------------------
    def RegisterAgent(self, request, context):  # noqa: N802 (gRPC names)
        if not self.core.registry.known_node(request.node_id):
            self._unknown_node(context, request.node_id)
        rec = self.core.register(request)
        return pb.RegisterAgentReply(session=rec.session,
                                     heartbeat_interval_s=self.core.registry.interval_s,
                                     topology=self.topology,
                                     fabric_address=self.cfg.fabric.address,
                                     link=self.cfg.fabric.link,
                                     line_rate_bps=self.cfg.fabric.line_rate_gbps * 1e9,
                                     clock_port=self.clock_port)

    def Heartbeat(self, request, context):  # noqa: N802
        known = self.core.heartbeat(request)
        return pb.HeartbeatReply(controller_time_ns=time.time_ns(), reregister=not known)

    def SyncClock(self, request, context):  # noqa: N802
        t2 = time.time_ns()
        return pb.SyncClockReply(agent_send_ns=request.agent_send_ns, controller_receive_ns=t2,
                                 controller_send_ns=time.time_ns())

    def not_streaming(self, node_id: str) -> tuple[grpc.StatusCode, str]:
        """Why `WatchSchedule` cannot open a stream to `node_id` (the stream itself waits on
        the event loop: `oddl.controller.aio_service`)."""
        if not self.core.registry.known_node(node_id):
            known = ", ".join(n.id for n in self.cfg.nodes)
            return (grpc.StatusCode.NOT_FOUND,
                    f"unknown node {node_id!r}: the testbed {self.cfg.name} has {known}; "
                    "start the agent with --node set to one of them")
        return (grpc.StatusCode.FAILED_PRECONDITION,
                f"{node_id} is not registered; call RegisterAgent first")

    # ---- collectives ------------------------------------------------------------------
    def ReadyCollective(self, request, context):  # noqa: N802
        self._refusing(context, lambda: self.core.ready(request))
        return pb.ReadyCollectiveReply()

    def StartStanding(self, request, context):  # noqa: N802
        self._refusing(context, lambda: self.core.start_standing(request))
        return pb.StartStandingReply()

    def RequestFlow(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: self.core.request_flow(request))

    def ConfirmDelivery(self, request, context):  # noqa: N802
        self.core.confirm(request)
        return pb.ConfirmDeliveryReply()

    def ReportCollective(self, request, context):  # noqa: N802
        self.core.report(request)
        return pb.ReportCollectiveReply()

    # ---- jobs -------------------------------------------------------------------------
    def SubmitJob(self, request, context):  # noqa: N802
        return job_pb(self._refusing(context, lambda: self.core.submit(request)))

    def CancelJob(self, request, context):  # noqa: N802
        return job_pb(self._refusing(context, lambda: self.core.cancel(request.job_id)))

    def ListJobs(self, request, context):  # noqa: N802
        return pb.ListJobsReply(jobs=self.core.job_views())

    def GetSchedule(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: self.core.schedule_pb(
            request.job_id, request.message_bytes, request.itemsize, request.kind or "all_reduce",
            request.root))

    # ---- reading ----------------------------------------------------------------------
    def GetTopology(self, request, context):  # noqa: N802
        return self.topology

    def GetStatus(self, request, context):  # noqa: N802
        return self.core.status()

    def GetDeviceState(self, request, context):  # noqa: N802
        return device_states_pb(self.devices)

    def GetDeviceLog(self, request, context):  # noqa: N802
        return device_log_pb(self.devices, request.device, request.limit)

    # ---- operator changes -------------------------------------------------------------
    def SetTrace(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: set_trace(self.cfg, self.core.registry, request))

    def Reconfigure(self, request, context):  # noqa: N802
        kind = request.WhichOneof("change")
        if kind == "set_channel":
            change = Configuration(channels={request.set_channel.transmitter:
                                             request.set_channel.channel})
            what = [f"{request.set_channel.transmitter}: channel → {request.set_channel.channel}"]
        elif kind == "set_route":
            r = request.set_route
            change = Configuration(wss_tables={r.wss: {r.channel: Route(r.port, r.attenuation_db)}})
            what = [f"{r.wss}: channel {r.channel} → port {r.port} at {r.attenuation_db} dB"]
        elif kind == "set_connections":
            change, what = self._refusing(context, lambda: self._connections_change(
                request.set_connections))
        else:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "give set_channel, set_route or set_connections (see `oddl "
                          "reconfigure --help`)")
        try:
            target = change.merged_over(self.devices.verified)
            self.devices.check_limits(target, change)
            if request.dry_run:
                return pb.ReconfigureReply(applied=False, changes=what,
                                           message="dry run: limits checked, nothing sent")
            self.devices.transact(change, reason="operator")
        except OddlError as exc:
            self._refuse(context, exc)
        return pb.ReconfigureReply(applied=True, changes=what, message="applied and verified")

    def _connections_change(self, sc: pb.SetConnections) -> tuple[Configuration, list[str]]:
        """The change of a `SetConnections` and a line per port for people; SafetyLimitError
        when it names nothing or a port both ways."""
        both = sorted(set(sc.connect) & set(sc.disconnect))
        if both:
            raise SafetyLimitError(f"{sc.ocs}: ingress {', '.join(map(str, both))} is both "
                                   "connected and disconnected; name each port once")
        ports = {**{int(i): int(e) for i, e in sc.connect.items()},
                 **{int(i): 0 for i in sc.disconnect}}
        if not ports:
            raise SafetyLimitError(f"{sc.ocs or 'the switch'}: nothing to change; give "
                                   "--connect IN:OUT,... and/or --disconnect IN,...")
        if any(e == 0 for e in sc.connect.values()):
            raise SafetyLimitError(f"{sc.ocs}: egress 0 is not a port; use --disconnect IN "
                                   "to leave an ingress port unconnected")
        check_connections(self.cfg, {sc.ocs: ports})
        before = self.devices.verified.connections.get(sc.ocs, {})
        return (Configuration(connections={sc.ocs: ports}),
                describe_ports(self.cfg, sc.ocs, ports, before))
