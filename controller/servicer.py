"""The Controller gRPC servicer: thin RPC methods over the controller's parts.

The decisions live elsewhere: `JobManager` (admission, schedules, barriers), `DeviceManager`
(verified transactions), `AgentRegistry` (agents, heartbeats, event streams),
`CollectiveStarts` (go, standing starts) and `SlotExecutor` with its pure core
`oddl.controller.scheduling.slot_grants` (retunes and grants at slot edges). Each method here
translates one request into calls on them and a refusal into a gRPC status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import grpc

from oddl.common.config import TestbedConfig
from oddl.common.errors import OddlError, OperationRefused, SafetyLimitError
from oddl.common.metrics import Metrics
from oddl.controller.agent_registry import AgentRegistry
from oddl.controller.collective_starts import CollectiveStarts
from oddl.controller.device_types import Configuration, TransactionError
from oddl.controller.devices import DeviceManager
from oddl.controller.flows import FlowDesk
from oddl.controller.jobs import JobManager, JobRecord
from oddl.controller.slot_executor import SlotExecutor
from oddl.controller.store import Store
from oddl.controller.testbed_model import timing_from_config, topology_from_config
from oddl.controller.trace_switch import set_trace
from oddl.controller.wire_views import device_log_pb, device_states_pb, job_pb, topology_pb
from oddl.drivers.interfaces import Route
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
        self.metrics = metrics
        self.topology = topology_from_config(cfg)
        self.clock_port = 0
        """The UDP clock service's port, told to agents at registration (0: none)."""
        self.timing = timing_from_config(cfg)
        self.jobs = JobManager(cfg, self.topology, self.timing, store)
        self.errors: Counter[str] = Counter()
        self._lock = threading.RLock()
        self.registry = AgentRegistry(cfg, self.jobs, self._lock, self.errors, devices.log_event)
        self.slots = SlotExecutor(devices, self._circuits_ready, self.errors, metrics,
                                  line_rate_gbps=cfg.fabric.line_rate_gbps, testbed=cfg.path)
        self.starts = CollectiveStarts(cfg, self.jobs, devices, self.registry, self.slots,
                                       self._lock, self.errors)
        self.flows = FlowDesk(cfg, self.jobs, devices, self.slots, self._lock, self.errors)

    @property
    def stopped(self) -> threading.Event:
        """Set when the service closes: streams, executors and monitors end."""
        return self.slots.stop

    @property
    def collectives_failed(self) -> int:
        """Collectives some node reported failed."""
        return self.starts.collectives_failed

    def close(self) -> None:
        """Stop the streams and executors."""
        self.slots.close()

    def retuning(self) -> bool:
        """Whether a collective's slots are being executed (retunes may be due any moment)."""
        return self.slots.retuning()

    def monitor(self) -> None:
        """Detect dead agents (no heartbeat for three intervals) until the service closes."""
        self.registry.monitor(self.stopped)

    def _circuits_ready(self, job: JobRecord, seq: int, slot: int, error: str) -> None:
        self.starts.circuits_ready(job, seq, slot, error)

    def _refuse(self, context: grpc.ServicerContext, exc: OddlError) -> NoReturn:
        self.errors[type(exc).__name__] += 1
        context.abort(status_code(exc), str(exc))
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover

    def _refusing(self, context: grpc.ServicerContext, call: Callable[[], T]) -> T:
        """`call()`, or its OddlError as the RPC's refusal."""
        try:
            return call()
        except OddlError as exc:
            self._refuse(context, exc)

    def _unknown_node(self, context: grpc.ServicerContext, node_id: str) -> NoReturn:
        known = ", ".join(n.id for n in self.cfg.nodes)
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f"unknown node {node_id!r}: the testbed {self.cfg.name} has {known}; "
                      "start the agent with --node set to one of them")
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover

    # ---- agents -----------------------------------------------------------------------
    def RegisterAgent(self, request, context):  # noqa: N802 (gRPC names)
        if not self.registry.known_node(request.node_id):
            self._unknown_node(context, request.node_id)
        rec = self.registry.register(request)
        return pb.RegisterAgentReply(session=rec.session,
                                     heartbeat_interval_s=self.cfg.controller.heartbeat_s,
                                     topology=topology_pb(self.cfg),
                                     fabric_address=self.cfg.fabric.address,
                                     link=self.cfg.fabric.link,
                                     line_rate_bps=self.cfg.fabric.line_rate_gbps * 1e9,
                                     clock_port=self.clock_port)

    def Heartbeat(self, request, context):  # noqa: N802
        known = self.registry.heartbeat(request)
        return pb.HeartbeatReply(controller_time_ns=time.time_ns(), reregister=not known)

    def SyncClock(self, request, context):  # noqa: N802
        t2 = time.time_ns()
        return pb.SyncClockReply(agent_send_ns=request.agent_send_ns, controller_receive_ns=t2,
                                 controller_send_ns=time.time_ns())

    def WatchSchedule(self, request, context) -> Iterator[pb.ScheduleEvent]:  # noqa: N802
        opened = self.registry.open_stream(request.node_id)
        if opened is None:
            if not self.registry.known_node(request.node_id):
                self._unknown_node(context, request.node_id)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{request.node_id} is not registered; call RegisterAgent first")
            return
        yield from self.registry.stream(*opened, context.is_active, self.stopped)

    # ---- collectives ------------------------------------------------------------------
    def ReadyCollective(self, request, context):  # noqa: N802
        self._refusing(context, lambda: self.starts.ready(request))
        return pb.ReadyCollectiveReply()

    def StartStanding(self, request, context):  # noqa: N802
        self._refusing(context, lambda: self.starts.start_standing(request))
        return pb.StartStandingReply()

    def RequestFlow(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: self.flows.request(request))

    def ConfirmDelivery(self, request, context):  # noqa: N802
        self.slots.confirmations.add(request.job_id, request.seq, request.slot, request.src)
        return pb.ConfirmDeliveryReply()

    def ReportCollective(self, request, context):  # noqa: N802
        self.starts.report(request)
        return pb.ReportCollectiveReply()

    # ---- jobs -------------------------------------------------------------------------
    def SubmitJob(self, request, context):  # noqa: N802
        with self._lock:
            try:
                job, target = self.jobs.admit(request.name, list(request.nodes),
                                              request.collective, request.network,
                                              dict(request.params), time.time_ns())
            except OddlError as exc:
                self._refuse(context, exc)
        try:
            if target.channels or target.wss_tables:
                self.devices.transact(target, reason=f"admit {job.id}")
        except OddlError as exc:
            with self._lock:
                self.jobs.end(job.id, "failed", f"job-scale configuration failed: {exc}")
            self._refuse(context, exc)
        with self._lock:
            self.registry.push_assigned(job)
        logger.info("admitted %s (%s on %s, %s network)", job.id, job.collective,
                    ",".join(job.nodes), job.network)
        return job_pb(job)

    def CancelJob(self, request, context):  # noqa: N802
        with self._lock:
            try:
                job = self.jobs.end(request.job_id, "cancelled", "cancelled by the operator")
            except OddlError as exc:
                self._refuse(context, exc)
            self.registry.push(job.nodes, pb.ScheduleEvent(ended=pb.JobEnded(
                job_id=job.id, reason=job.reason)))
            return job_pb(job)

    def ListJobs(self, request, context):  # noqa: N802
        with self._lock:
            return pb.ListJobsReply(jobs=[job_pb(j) for j in self.jobs.jobs.values()])

    def GetSchedule(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: self.starts.schedule_pb(
            request.job_id, request.message_bytes, request.itemsize, request.kind or "all_reduce",
            request.root))

    # ---- reading ----------------------------------------------------------------------
    def GetTopology(self, request, context):  # noqa: N802
        return topology_pb(self.cfg)

    def GetStatus(self, request, context):  # noqa: N802
        with self._lock:
            return pb.Status(testbed=self.cfg.name, controller_time_ns=time.time_ns(),
                             agents=self.registry.status(time.monotonic()),
                             jobs=[job_pb(j) for j in self.jobs.jobs.values()],
                             reconfigurations=self.devices.reconfigurations,
                             transactions_failed=self.devices.transactions_failed)

    def GetDeviceState(self, request, context):  # noqa: N802
        return device_states_pb(self.devices)

    def GetDeviceLog(self, request, context):  # noqa: N802
        return device_log_pb(self.devices, request.device, request.limit)

    # ---- operator changes -------------------------------------------------------------
    def SetTrace(self, request, context):  # noqa: N802
        return self._refusing(context, lambda: set_trace(self.cfg, self.registry, request))

    def Reconfigure(self, request, context):  # noqa: N802
        kind = request.WhichOneof("change")
        if kind == "set_channel":
            change = Configuration(channels={request.set_channel.transmitter:
                                             request.set_channel.channel})
            what = f"{request.set_channel.transmitter}: channel → {request.set_channel.channel}"
        elif kind == "set_route":
            r = request.set_route
            change = Configuration(wss_tables={r.wss: {r.channel: Route(r.port, r.attenuation_db)}})
            what = f"{r.wss}: channel {r.channel} → port {r.port} at {r.attenuation_db} dB"
        else:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "give set_channel or set_route (see `oddl reconfigure --help`)")
        try:
            target = change.merged_over(self.devices.verified)
            self.devices.check_limits(target)
            if request.dry_run:
                return pb.ReconfigureReply(applied=False, changes=[what],
                                           message="dry run: limits checked, nothing sent")
            self.devices.transact(change, reason="operator")
        except OddlError as exc:
            self._refuse(context, exc)
        return pb.ReconfigureReply(applied=True, changes=[what], message="applied and verified")
