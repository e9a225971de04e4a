"""The controller's gRPC shell: translates RPCs into calls on the job manager and devices.

The decisions live in `JobManager` (admission, schedules, barriers) and `DeviceManager`
(verified transactions); this module keeps the agents registry, the per-agent event streams
and the slot executor that retunes transmitters at slot edges during a collective.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.config import TestbedConfig
from common.errors import ConfigError, OddlError, OperationRefused, SafetyLimitError
from common.metrics import Metrics, counter, gauge
from controller.devices import Configuration, DeviceManager, TransactionError
from controller.jobs import (
    MAX_ELEMENTS,
    OPTINC,
    JobManager,
    JobRecord,
    OptincSchedule,
    timing_from_config,
    topology_from_config,
)
from controller.scheduling import Schedule, handoffs
from controller.store import Store
from drivers.interfaces import Route
from protos import oddl_pb2 as pb
from protos import oddl_pb2_grpc as pb_grpc
from protos.schedule_wire import EVERY_SLOT, schedule_sha256

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Controller"].full_name


@dataclass
class AgentRecord:
    """What the controller knows about one node's agent."""

    node_id: str
    session: str
    data_address: str
    local_api: str
    last_seen: float
    events: queue.Queue[pb.ScheduleEvent] = field(default_factory=queue.Queue)
    stream_generation: int = 0
    heartbeat: pb.HeartbeatRequest = field(default_factory=pb.HeartbeatRequest)
    dead: bool = False
    streaming: bool = False
    """A schedule stream to this agent is open (without one it cannot take part)."""


def schedule_to_proto(sched: Schedule, job_id: str) -> pb.Schedule:
    """The wire form of a schedule, times relative to its start, with the plan's transfers."""
    out = pb.Schedule(job_id=job_id, collective=sched.plan.collective,
                      n_elems=sched.plan.n_elems, itemsize=sched.itemsize,
                      reconfigurations=sched.reconfigurations,
                      guard_total_s=sched.guard_total_s, makespan_s=sched.makespan_s,
                      efficiency=sched.efficiency)
    for step in sched.plan.steps:
        out.steps.add(op=str(step.op), src=step.src.tolist(), dst=step.dst.tolist(),
                      offset=step.offset.tolist(), length=step.length.tolist())
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
    return out


def optinc_schedule_to_proto(sched: OptincSchedule, job_id: str) -> pb.Schedule:
    """The wire form of an optinc schedule: two slots whose circuits name the device as the
    destination (upload) and the source (broadcast); no plan steps (no rank-to-rank data)."""
    out = pb.Schedule(job_id=job_id, collective=OPTINC, n_elems=sched.n_elems,
                      itemsize=sched.itemsize, reconfigurations=0,
                      guard_total_s=sched.guard_total_s, makespan_s=sched.makespan_s,
                      efficiency=sched.efficiency)
    for slot in sched.slots:
        ps = out.slots.add(index=slot.index, step=slot.step, start_ns=round(slot.start_s * 1e9),
                           data_start_ns=round(slot.data_start_s * 1e9),
                           end_ns=round(slot.end_s * 1e9))
        for src, dst, nbytes in slot.flows:
            ps.circuits.add(src=src, dst=dst, bytes=nbytes)
    return out


class ControllerService(pb_grpc.ControllerServicer):
    """The Controller gRPC service."""

    def __init__(self, cfg: TestbedConfig, devices: DeviceManager,
                 metrics: Metrics | None = None, store: Store | None = None):
        self.cfg = cfg
        self.devices = devices
        self.metrics = metrics
        self.topology = topology_from_config(cfg)
        self.timing = timing_from_config(cfg)
        self.jobs = JobManager(cfg, self.topology, self.timing, store)
        self.agents: dict[str, AgentRecord] = {}
        self._lock = threading.RLock()
        self._executors: dict[str, threading.Thread] = {}
        self._started: dict[str, int] = {}
        """Per job, the last collective whose slots were launched (barrier or standing)."""
        self._stop = threading.Event()
        self._confirmed: set[tuple[str, int, int, str]] = set()
        self._confirm_cond = threading.Condition()
        self.errors: Counter[str] = Counter()
        self.collectives_failed = 0

    def close(self) -> None:
        """Stop the streams and executors."""
        self._stop.set()

    # ---- helpers ----------------------------------------------------------------------
    def _abort_unknown_node(self, context: grpc.ServicerContext, node_id: str) -> None:
        known = ", ".join(n.id for n in self.cfg.nodes)
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f"unknown node {node_id!r}: the testbed {self.cfg.name} has {known}; "
                      "start the agent with --node set to one of them")

    def _refuse(self, context: grpc.ServicerContext, exc: OddlError) -> None:
        self.errors[type(exc).__name__] += 1
        code = (grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, SafetyLimitError)
                else grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, OperationRefused)
                else grpc.StatusCode.ABORTED if isinstance(exc, TransactionError)
                else grpc.StatusCode.UNAVAILABLE)
        context.abort(code, str(exc))

    def _known_node(self, node_id: str) -> bool:
        return any(n.id == node_id for n in self.cfg.nodes)

    def _alive(self, rec: AgentRecord, now: float) -> bool:
        return now - rec.last_seen < 3 * self.cfg.controller.heartbeat_s

    def _job_pb(self, job: JobRecord) -> pb.Job:
        return pb.Job(id=job.id, name=job.name, nodes=job.nodes, collective=job.collective,
                      network=job.network, state=job.state, reason=job.reason,
                      collectives_done=job.collectives_done,
                      reconfigurations=job.reconfigurations, guard_time_s=job.guard_time_s,
                      submitted_ns=job.submitted_ns, params=job.params)

    def _assigned(self, job: JobRecord, node: str) -> pb.ScheduleEvent:
        peers = {n: self.agents[n].data_address for n in job.nodes
                 if n in self.agents and self.agents[n].data_address}
        return pb.ScheduleEvent(assigned=pb.JobAssigned(job=self._job_pb(job),
                                                        rank=job.nodes.index(node), peers=peers,
                                                        next_seq=job.last_seq + 1))

    def _push(self, nodes: tuple[str, ...], event: pb.ScheduleEvent) -> None:
        for n in nodes:
            rec = self.agents.get(n)
            if rec is not None:
                rec.events.put(event)

    # ---- agents -----------------------------------------------------------------------
    def RegisterAgent(self, request, context):  # noqa: N802 (gRPC names)
        if not self._known_node(request.node_id):
            self._abort_unknown_node(context, request.node_id)
        with self._lock:
            old = self.agents.get(request.node_id)
            rec = AgentRecord(request.node_id, uuid.uuid4().hex[:12], request.data_address,
                              request.local_api, time.monotonic())
            if old is not None:
                rec.events = old.events
                rec.stream_generation = old.stream_generation
                rec.streaming = old.streaming
            self.agents[request.node_id] = rec
            # peers learn the (new) data address of this node
            for job in self.jobs.jobs.values():
                if job.running and request.node_id in job.nodes:
                    for n in job.nodes:
                        if n != request.node_id and n in self.agents:
                            self.agents[n].events.put(self._assigned(job, n))
        logger.info("agent %s registered (session %s, data %s)", request.node_id, rec.session,
                    request.data_address or "fabric")
        return pb.RegisterAgentReply(session=rec.session,
                                     heartbeat_interval_s=self.cfg.controller.heartbeat_s,
                                     topology=self._topology_pb(),
                                     fabric_address=self.cfg.fabric.address,
                                     link=self.cfg.fabric.link,
                                     line_rate_bps=self.cfg.fabric.line_rate_gbps * 1e9)

    def Heartbeat(self, request, context):  # noqa: N802
        with self._lock:
            rec = self.agents.get(request.node_id)
            if rec is None or rec.session != request.session:
                return pb.HeartbeatReply(controller_time_ns=time.time_ns(), reregister=True)
            rec.last_seen = time.monotonic()
            rec.heartbeat = request
            rec.dead = False
        return pb.HeartbeatReply(controller_time_ns=time.time_ns())

    def SyncClock(self, request, context):  # noqa: N802
        t2 = time.time_ns()
        return pb.SyncClockReply(agent_send_ns=request.agent_send_ns, controller_receive_ns=t2,
                                 controller_send_ns=time.time_ns())

    def WatchSchedule(self, request, context) -> Iterator[pb.ScheduleEvent]:  # noqa: N802
        with self._lock:
            rec = self.agents.get(request.node_id)
            if rec is None:
                if not self._known_node(request.node_id):
                    self._abort_unknown_node(context, request.node_id)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{request.node_id} is not registered; call RegisterAgent first")
            rec.stream_generation += 1
            generation = rec.stream_generation
            events = rec.events
            for job in self.jobs.jobs.values():
                if job.running and request.node_id in job.nodes:
                    events.put(self._assigned(job, request.node_id))
        rec.streaming = True
        try:
            while context.is_active() and not self._stop.is_set():
                if rec.stream_generation != generation:
                    return
                try:
                    event = events.get(timeout=0.25)
                except queue.Empty:
                    continue
                yield event
        finally:
            current = self.agents.get(request.node_id)
            if current is not None and current.stream_generation == generation:
                current.streaming = False

    def ReadyCollective(self, request, context):  # noqa: N802
        with self._lock:
            try:
                barrier = self.jobs.ready(request.job_id, request.seq, request.node_id,
                                          request.shape, request.dtype)
            except OddlError as exc:
                self._refuse(context, exc)
            job = self.jobs.get(request.job_id)
            if barrier is None:
                down = [n for n in job.nodes if n in self.agents and self.agents[n].dead]
                if not down:
                    return pb.ReadyCollectiveReply()
                # a participant is known dead: do not let the others wait for it
                rec = self.agents[down[0]]
                barrier = self.jobs.abandon_pending(job, f"node {rec.node_id} stopped answering "
                                                    "(no heartbeat); its agent can rejoin by "
                                                    "restarting")[0]
        if barrier.error:
            self._push(job.nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
                job_id=job.id, seq=barrier.seq, error=barrier.error)))
            return pb.ReadyCollectiveReply()
        if job.collective == OPTINC:
            return self._go_optinc(job, barrier.seq, barrier.n_elems, barrier.itemsize)
        previous = self._executors.get(job.id)
        if previous is not None:
            previous.join(timeout=10)
        initial = self._node_channels(job)
        try:
            sched = self.jobs.schedule(job, barrier.n_elems, barrier.itemsize, initial)
        except OddlError as exc:
            self._push(job.nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
                job_id=job.id, seq=barrier.seq, error=f"no schedule: {exc}")))
            return pb.ReadyCollectiveReply()
        t0_ns = time.time_ns() + round(self.cfg.timing.launch_margin_ms * 1e6)
        go = pb.CollectiveGo(job_id=job.id, seq=barrier.seq, t0_ns=t0_ns,
                             schedule=schedule_to_proto(sched, job.id))
        self._launch_slots(job, barrier.seq, sched, go)
        self._push(job.nodes, pb.ScheduleEvent(go=go))
        self.jobs.save(job)
        return pb.ReadyCollectiveReply()

    def _launch_slots(self, job: JobRecord, seq: int, sched: Schedule, go: pb.CollectiveGo
                      ) -> None:
        """Start executing the collective's retunes and hand-offs (if it has any)."""
        with self._lock:
            self._started[job.id] = max(self._started.get(job.id, 0), seq)
            if any(s.retuned for s in sched.slots) or handoffs(_slot_pairs(go.schedule)):
                t = threading.Thread(target=self._execute_slots, args=(job, seq, sched, go),
                                     name=f"slots-{job.id}", daemon=True)
                self._executors[job.id] = t
                t.start()
            job.guard_time_s += sched.guard_total_s

    def StartStanding(self, request, context):  # noqa: N802
        job = self._standing_job(request, context)
        if job is None:
            return pb.StartStandingReply()
        previous = self._executors.get(job.id)
        if previous is not None:
            previous.join(timeout=10)
        n_elems = request.message_bytes // request.itemsize
        try:
            sched = self.jobs.schedule(job, n_elems, request.itemsize, self._node_channels(job))
        except OddlError as exc:
            sched, why = None, f"no schedule ({exc})"
        go = pb.CollectiveGo(job_id=job.id, seq=request.seq, t0_ns=request.t0_ns)
        if sched is not None:
            go.schedule.CopyFrom(schedule_to_proto(sched, job.id))
            why = "the devices no longer match the standing schedule the agents hold"
        if sched is None or schedule_sha256(go.schedule) != request.schedule_sha256:
            # the agents run on a schedule this controller would not execute: fail the
            # collective where they first wait for it, and they return to the barrier
            logger.warning("job %s collective %d: standing start refused: %s", job.id,
                           request.seq, why)
            self.errors["standing start refused"] += 1
            self._circuits_ready(job, request.seq, EVERY_SLOT,
                                 f"standing start refused: {why}; the next collective goes "
                                 "through the controller's barrier")
            return pb.StartStandingReply()
        self._launch_slots(job, request.seq, sched, go)
        self.jobs.save(job)
        return pb.StartStandingReply()

    def _standing_job(self, request: pb.StartStandingRequest, context: grpc.ServicerContext
                      ) -> JobRecord | None:
        """The job of a standing start to execute, or None for a copy already seen."""
        with self._lock:
            job = self.jobs.jobs.get(request.job_id)
            if job is None or not job.running:
                self._refuse(context, OperationRefused(
                    f"job {request.job_id} is not running; see `oddl jobs list`"))
            if request.node_id not in job.nodes:
                self._refuse(context, OperationRefused(
                    f"node {request.node_id} is not part of job {job.id}"))
            if request.itemsize not in (1, 2, 4, 8) or request.message_bytes == 0 \
                    or request.message_bytes % request.itemsize:
                self._refuse(context, OperationRefused(
                    f"a standing start of {request.message_bytes} B in items of "
                    f"{request.itemsize} B; send the bucket's bytes and its dtype's itemsize"))
            if request.seq <= self._started.get(job.id, 0):
                return None  # another agent's copy, or a collective already under way
            self._started[job.id] = request.seq
            job.last_seq = max(job.last_seq, request.seq)
            return job

    def _go_optinc(self, job: JobRecord, seq: int, n_elems: int, itemsize: int
                   ) -> pb.ReadyCollectiveReply:
        """Start an optinc collective: its two-slot schedule, no retunes, no slot executor."""
        try:
            sched = self.jobs.optinc_schedule(job, n_elems, itemsize)
        except OddlError as exc:
            self._push(job.nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
                job_id=job.id, seq=seq, error=f"no schedule: {exc}")))
            return pb.ReadyCollectiveReply()
        t0_ns = time.time_ns() + round(self.cfg.timing.launch_margin_ms * 1e6)
        go = pb.CollectiveGo(job_id=job.id, seq=seq, t0_ns=t0_ns,
                             schedule=optinc_schedule_to_proto(sched, job.id))
        with self._lock:
            job.guard_time_s += sched.guard_total_s
            self._push(job.nodes, pb.ScheduleEvent(go=go))
            self.jobs.save(job)
        return pb.ReadyCollectiveReply()

    def _node_channels(self, job: JobRecord) -> dict[str, int | None]:
        verified = self.devices.verified.channels
        return {n: verified.get(self.cfg.node(n).transmitter) for n in job.nodes}

    def _execute_slots(self, job: JobRecord, seq: int, sched: Schedule,
                       go: pb.CollectiveGo) -> None:
        """Grant each slot that changes circuits once its hand-offs are confirmed.

        At the slot's start (controller clock) and once the receivers of the flows that used
        the old circuits have confirmed their arrival (normally well before), the slot's
        transmitters retune and its senders are told the circuits are ready. A late
        confirmation or a failed retune delays or fails this one collective with a reason; it
        never cuts a frame off, collides two senders, or sends light to the wrong node.
        """
        need = handoffs(_slot_pairs(go.schedule))
        t0 = go.t0_ns / 1e9
        timeout = _receive_timeout(self.cfg, go.schedule)
        try:
            for slot in sched.slots:
                retunes = slot.retunes()
                if slot.index not in need:
                    continue
                if not _sleep_until(t0 + slot.start_s - sched.start_s, self._stop):
                    return
                required = {(job.id, seq, j, src) for j, src, _dst in need.get(slot.index, [])}
                # the schedule plus the receive timeout, as the agents' receives
                deadline = t0 + slot.data_start_s - sched.start_s + timeout
                with self._confirm_cond:
                    while not required <= self._confirmed:
                        remaining = deadline - time.time()
                        if remaining <= 0 or not job.running:
                            missing = ", ".join(f"{src}@slot{j}" for _, _, j, src in
                                                sorted(required - self._confirmed))
                            self.errors["hand-off timeout"] += 1
                            self._circuits_ready(job, seq, slot.index,
                                                 f"hand-off not confirmed ({missing}); the "
                                                 "previous flow did not arrive")
                            return
                        self._confirm_cond.wait(min(remaining, 0.05))
                confirmed = time.time()
                errors: list[str] = []
                if retunes:
                    try:
                        errors = self.devices.retune(
                            {r.transmitter: r.to_channel for r in retunes},
                            timeout=max(1.0, 20 * slot.guard_s))
                    except OddlError as exc:
                        errors = [str(exc)]
                    job.reconfigurations += len(retunes)
                granted = time.time()
                late = granted - (t0 + slot.data_start_s - sched.start_s)
                self._circuits_ready(job, seq, slot.index,
                                     f"retune failed: {'; '.join(errors)}" if errors else "")
                if errors:
                    self.errors["retune failed"] += 1
                    logger.error("job %s slot %d: retune failed: %s", job.id, slot.index,
                                 "; ".join(errors))
                    return
                if self.metrics is not None:
                    self.metrics.overrun.observe(max(late, 0.0))
                    edge = t0 + slot.start_s - sched.start_s
                    self.metrics.guard_phase.labels("confirmed").observe(max(confirmed - edge, 0))
                    self.metrics.guard_phase.labels("granted").observe(max(granted - edge, 0))
                if late > 0:
                    logger.warning("job %s slot %d: circuits ready %.2f ms after the guard; "
                                   "raise [timing] command_ms or laser_tune_ms", job.id,
                                   slot.index, late * 1e3)
        finally:
            with self._confirm_cond:
                self._confirmed = {c for c in self._confirmed if not (c[0] == job.id and c[1] <= seq)}

    def retuning(self) -> bool:
        """Whether a collective's slots are being executed (retunes may be due any moment)."""
        return any(t.is_alive() for t in list(self._executors.values()))

    def monitor(self) -> None:
        """Detect dead agents (no heartbeat for three intervals) until the service closes."""
        interval = self.cfg.controller.heartbeat_s
        while not self._stop.wait(interval / 2):
            now = time.monotonic()
            with self._lock:
                dying = [rec for rec in self.agents.values()
                         if not rec.dead and not self._alive(rec, now)]
                for rec in dying:
                    rec.dead = True
                    self._lost(rec, now - rec.last_seen)

    def _lost(self, rec: AgentRecord, silent_s: float) -> None:
        """End the collectives a dead agent takes part in, at every other participant."""
        reason = (f"node {rec.node_id} stopped answering (no heartbeat for {silent_s:.1f} s); "
                  "its agent can rejoin by restarting")
        logger.warning("%s", reason)
        self.errors["agent lost"] += 1
        self.devices._log(rec.node_id, "agent lost", False, reason)
        for job in self.jobs.jobs.values():
            if not job.running or rec.node_id not in job.nodes:
                continue
            others = tuple(n for n in job.nodes if n != rec.node_id)
            for barrier in self.jobs.abandon_pending(job, reason):
                self._push(others, pb.ScheduleEvent(go=pb.CollectiveGo(
                    job_id=job.id, seq=barrier.seq, error=barrier.error)))
            self._push(others, pb.ScheduleEvent(peer_lost=pb.PeerLost(
                job_id=job.id, node_id=rec.node_id, reason=reason)))

    def _circuits_ready(self, job: JobRecord, seq: int, slot: int, error: str) -> None:
        self._push(job.nodes, pb.ScheduleEvent(circuits_ready=pb.CircuitsReady(
            job_id=job.id, seq=seq, slot=slot, error=error)))

    def ConfirmDelivery(self, request, context):  # noqa: N802
        with self._confirm_cond:
            self._confirmed.add((request.job_id, request.seq, request.slot, request.src))
            self._confirm_cond.notify_all()
        return pb.ConfirmDeliveryReply()

    def ReportCollective(self, request, context):  # noqa: N802
        with self._lock:
            job = self.jobs.jobs.get(request.job_id)
            if job is not None:  # collectives on a standing schedule pass no barrier here
                job.last_seq = max(job.last_seq, request.seq)
            if job is not None and request.ok and job.nodes and request.node_id == job.nodes[0]:
                job.collectives_done += 1
                self.jobs.save(job)
        if not request.ok:
            self.collectives_failed += 1
            self.errors["collective failed"] += 1
            logger.warning("collective %d of %s failed at %s: %s", request.seq, request.job_id,
                           request.node_id, request.error)
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
            for n in job.nodes:
                if n in self.agents:
                    self.agents[n].events.put(self._assigned(job, n))
        logger.info("admitted %s (%s on %s, %s network)", job.id, job.collective,
                    ",".join(job.nodes), job.network)
        return self._job_pb(job)

    def CancelJob(self, request, context):  # noqa: N802
        with self._lock:
            try:
                job = self.jobs.end(request.job_id, "cancelled", "cancelled by the operator")
            except OddlError as exc:
                self._refuse(context, exc)
            self._push(job.nodes, pb.ScheduleEvent(ended=pb.JobEnded(job_id=job.id,
                                                                     reason=job.reason)))
            return self._job_pb(job)

    def ListJobs(self, request, context):  # noqa: N802
        with self._lock:
            return pb.ListJobsReply(jobs=[self._job_pb(j) for j in self.jobs.jobs.values()])

    def GetSchedule(self, request, context):  # noqa: N802
        with self._lock:
            try:
                job = self.jobs.get(request.job_id)
                itemsize = request.itemsize or 4
                if itemsize not in (1, 2, 4, 8, 16):
                    raise OperationRefused(f"itemsize {itemsize} is not a numeric element size; "
                                           "use 1, 2, 4, 8 or 16 bytes")
                if request.message_bytes > MAX_ELEMENTS * itemsize:
                    raise OperationRefused(f"message_bytes {request.message_bytes} is larger "
                                           f"than a job accepts ({MAX_ELEMENTS * itemsize:,})")
                if request.message_bytes % itemsize:
                    raise OperationRefused(f"message_bytes {request.message_bytes} is not a "
                                           f"multiple of itemsize {itemsize}")
                if job.collective == OPTINC:
                    return optinc_schedule_to_proto(self.jobs.optinc_schedule(
                        job, request.message_bytes // itemsize, itemsize), job.id)
                sched = self.jobs.schedule(job, request.message_bytes // itemsize, itemsize,
                                           self._node_channels(job))
            except OddlError as exc:
                self._refuse(context, exc)
        return schedule_to_proto(sched, job.id)

    # ---- reading ----------------------------------------------------------------------
    def _topology_pb(self) -> pb.Topology:
        cfg = self.cfg
        return pb.Topology(
            testbed=cfg.name, grid_first_thz=cfg.grid.first_thz,
            grid_spacing_ghz=cfg.grid.spacing_ghz, grid_channels=cfg.grid.channels,
            nodes=[pb.Node(id=n.id, host=n.host, transmitter=n.transmitter,
                           rx_channel=n.rx_channel, wss=cfg.attachment(n.id).wss,
                           out_port=cfg.attachment(n.id).out_port) for n in cfg.nodes],
            devices=[pb.Device(id=d.id, kind=d.kind, resource=d.resource)
                     for d in (*cfg.devices, *cfg.optinc)])

    def GetTopology(self, request, context):  # noqa: N802
        return self._topology_pb()

    def GetStatus(self, request, context):  # noqa: N802
        now = time.monotonic()
        with self._lock:
            agents = []
            for n in self.cfg.nodes:
                rec = self.agents.get(n.id)
                if rec is None:
                    agents.append(pb.AgentStatus(node_id=n.id, alive=False,
                                                 last_heartbeat_age_s=-1))
                    continue
                hb = rec.heartbeat
                agents.append(pb.AgentStatus(
                    node_id=n.id, alive=self._alive(rec, now) and rec.streaming,
                    last_heartbeat_age_s=now - rec.last_seen, clock_offset_s=hb.clock_offset_s,
                    clock_rtt_s=hb.clock_rtt_s, gate_error_p50_s=hb.gate_error_p50_s,
                    gate_error_p99_s=hb.gate_error_p99_s, collectives_done=hb.collectives_done,
                    collectives_failed=hb.collectives_failed, data_address=rec.data_address))
            return pb.Status(testbed=self.cfg.name, controller_time_ns=time.time_ns(),
                             agents=agents,
                             jobs=[self._job_pb(j) for j in self.jobs.jobs.values()],
                             reconfigurations=self.devices.reconfigurations,
                             transactions_failed=self.devices.transactions_failed)

    def GetDeviceState(self, request, context):  # noqa: N802
        out = pb.DeviceStateList()
        for dev_id, entry in self.devices.read_states().items():
            ds = out.devices.add(id=dev_id, kind=entry["kind"], reachable=entry["reachable"],
                                 error=entry.get("error", ""), verified_ns=entry["verified_ns"])
            st = entry.get("state")
            if st is not None:
                ds.channel, ds.frequency_thz, ds.power_dbm = st.channel, st.frequency_thz, st.power_dbm
                ds.output_enabled, ds.locked = st.output_enabled, st.locked
            for ch, route in sorted(entry.get("routes", {}).items()):
                ds.routes.add(channel=ch, port=route.port, attenuation_db=route.attenuation_db)
            for ch, dbm in sorted(entry.get("meter", {}).items()):
                ds.meter.add(channel=ch, power_dbm=dbm if dbm is not None else 0.0,
                             light=dbm is not None)
        return out

    def GetDeviceLog(self, request, context):  # noqa: N802
        events = [e for e in list(self.devices.events)
                  if not request.device or e.device in (request.device, "*")]
        limit = request.limit or 100
        return pb.DeviceLog(entries=[pb.DeviceLogEntry(time_ns=e.time_ns, device=e.device,
                                                       action=e.action, ok=e.ok,
                                                       detail=e.detail)
                                     for e in events[-limit:]])

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


class ControllerServer:
    """The controller process: devices, the gRPC service, health and reflection."""

    def __init__(self, cfg: TestbedConfig, listen: str | None = None,
                 devices: DeviceManager | None = None, max_workers: int = 32,
                 metrics_listen: str | None = "127.0.0.1:0", state: str | None = None,
                 insecure: bool = False):
        where = listen or cfg.controller.listen
        if not cfg.security.enabled and not insecure and not is_loopback(where):
            raise ConfigError(
                f"controller: refusing to serve without TLS on {where}: anyone who reaches it "
                "could retune lasers and rewrite WSS routes. Set [security] certs (make them "
                "with `oddl certs init`), listen on 127.0.0.1, or pass --insecure to serve "
                "plaintext on purpose")
        if not cfg.security.enabled and not is_loopback(where):
            logger.warning("controller: serving WITHOUT TLS on %s (--insecure): anyone who "
                           "reaches this port can reconfigure the testbed", where)
        self.cfg = cfg
        self.metrics = Metrics("oddl")
        path = state if state is not None else cfg.controller.state
        self.store = Store(path) if path else None
        self.devices = devices or DeviceManager(
            cfg, on_command=lambda d, op, s: self.metrics.command.labels(d, op).observe(s),
            store=self.store)
        self.service = ControllerService(cfg, self.devices, self.metrics, self.store)
        self.metrics.add_state(self._metric_state)
        self.metrics_listen = metrics_listen
        interceptors = []
        if cfg.security.enabled:
            from common.revocation import RevocationList
            from common.security import AuthorizationInterceptor, SecurityFiles, server_credentials

            self.security = SecurityFiles.load(cfg.security.certs)
            interceptors.append(AuthorizationInterceptor(
                revocations=RevocationList(self.security.root)))
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                             thread_name_prefix="grpc"),
                                  interceptors=interceptors)
        pb_grpc.add_ControllerServicer_to_server(self.service, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        if cfg.security.enabled:
            self.port = self.server.add_secure_port(where, server_credentials(self.security))
        else:
            self.port = self.server.add_insecure_port(where)
        if self.port == 0:
            raise OddlError(f"cannot listen on {where}; pick a free port or use port 0")
        self.address = f"{where.rsplit(':', 1)[0]}:{self.port}"

    def start(self, initialise_devices: bool = True) -> None:
        """Connect the devices, bring them to the stored (or default) configuration, serve."""
        if initialise_devices:
            self.devices.connect()
            channels, tables, stamps = self.store.verified() if self.store else ({}, {}, {})
            if channels or tables:
                self.devices.load_events()
                result = self.devices.reconcile(Configuration(channels, tables), stamps)
                logger.info("resumed from %s: adopted %s, restored %s", self.store.path,
                            result["adopted"], result["restored"])
            else:
                self.devices.initialise(default_configuration(self.cfg))
        self.server.start()
        threading.Thread(target=self.service.monitor, name="heartbeat-monitor",
                         daemon=True).start()
        if self.cfg.controller.device_check_s > 0:
            threading.Thread(target=self._watch_devices, name="device-check",
                             daemon=True).start()
        if self.metrics_listen:
            self.metrics.serve(self.metrics_listen)
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        logger.info("controller for %s serving on %s", self.cfg.name, self.address)

    def _watch_devices(self) -> None:
        """Read the devices back now and then; restore one that lost its configuration."""
        interval = self.cfg.controller.device_check_s
        while not self.service._stop.wait(interval):
            if self.service.retuning():
                continue  # a slot executor owns the devices' timing now
            try:
                restored = self.devices.check()
            except Exception:  # the watch must outlive any one bad reading
                logger.exception("device check failed")
                continue
            if restored:
                logger.warning("restored %s: they no longer held the verified configuration",
                               ", ".join(restored))
                self.service.errors["device restored"] += 1

    def _metric_state(self) -> Iterator[Any]:
        return _metric_state_of(self)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and release the devices (their optical state is left as it is)."""
        self.health.enter_graceful_shutdown()
        self.metrics.close()
        self.service.close()
        self.server.stop(grace).wait(grace + 1)
        self.devices.close()
        if self.store is not None:
            self.store.close()


def _metric_state_of(server: ControllerServer) -> Iterator[Any]:
    svc, dm = server.service, server.devices
    yield counter("oddl_reconfigurations_total", "Transmitter retunes applied", dm.reconfigurations)
    yield counter("oddl_transactions_failed_total", "Reconfiguration transactions rolled back",
                  dm.transactions_failed)
    jobs = list(svc.jobs.jobs.values())
    yield counter("oddl_guard_time_seconds_total", "Guard time in executed schedules",
                  sum(j.guard_time_s for j in jobs))
    done = None
    for j in jobs:
        done = counter("oddl_collectives_total", "Collectives completed, by job",
                       j.collectives_done, {"job": j.id}, done)
    if done is not None:
        yield done
    yield counter("oddl_collectives_failed_total", "Collectives that failed at some node",
                  svc.collectives_failed)
    kinds = None
    for kind, n in sorted(svc.errors.items()):
        kinds = counter("oddl_errors_total", "Errors by kind", n, {"kind": kind}, kinds)
    if kinds is not None:
        yield kinds
    now = time.monotonic()
    yield gauge("oddl_agents_alive", "Agents whose heartbeat is recent",
                sum(1 for rec in list(svc.agents.values()) if svc._alive(rec, now)))


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT listens on this host only (127.0.0.0/8, ::1, localhost)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard: reachable from elsewhere


def _receive_timeout(cfg: TestbedConfig, schedule: pb.Schedule) -> float:
    """How long past its slot a hand-off may take: the receive timeout, the same rule the
    agents apply to their receives (no stretching beyond the schedule)."""
    del schedule
    return cfg.timing.receive_timeout_ms / 1e3


def _slot_pairs(schedule: pb.Schedule) -> list[tuple[int, list[tuple[str, str, bool]]]]:
    return [(s.index, [(c.src, c.dst, c.retune) for c in s.circuits]) for s in schedule.slots]


def _sleep_until(t: float, stop: threading.Event, spin_s: float = 0.001) -> bool:
    """Sleep, then spin the last `spin_s`, until wall-clock time `t`; False if stopped."""
    while True:
        remaining = t - time.time()
        if remaining <= spin_s:
            break
        if stop.wait(min(remaining - spin_s, 0.05)):
            return False
    while time.time() < t:
        pass
    return True


def default_configuration(cfg: TestbedConfig) -> Configuration:
    """TT-FR at rest: every receive channel routed to its node's port; lasers on their own channel."""
    tables: dict[str, dict[int, Route]] = {}
    for n in cfg.nodes:
        att = cfg.attachment(n.id)
        tables.setdefault(att.wss, {})[n.rx_channel] = Route(att.out_port, 0.0)
    return Configuration({n.transmitter: n.rx_channel for n in cfg.nodes}, tables)
