"""The controller's core: the one owner of the jobs, their barriers and schedules, and the lock.

Every change to a job happens here, under one lock: admission and the end of a job, a node's
ready and the barrier's go, standing starts, reports, the slot executor's retunes, and what an
agent's news means for its jobs. Data flows one way: the servicer turns a request into one
call here, and the core asks its parts and acts on their answers:

- `Admission` (pure): may the job run, and what must the devices hold for it;
- `BarrierBook` (pure): the nodes' readies and what a complete barrier decides;
- `Schedules` (pure): the schedules laid out for each job, kept per bucket;
- `AgentRegistry`: sessions, liveness and each node's event queue, where the core pushes
  (`Announcer`: a job's peers announced once for a burst of registrations);
- `SlotExecutor`: the slots that retune, on threads of their own, reporting back through
  `SlotReports` (this class: `circuits_ready`, `retuned`, `count_error`); `FlowDesk`: flows;
- the `DeviceManager` (verified transactions) and the `Store` (SQLite: every job change).

The lock is never held while waiting for a slot executor's thread or a device transaction.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from oddl.common.collective_kinds import ALL_REDUCE, optinc_refusal
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import OddlError, OperationRefused
from oddl.common.metrics import Metrics
from oddl.common.tracing import TRACE
from oddl.controller import trace_hooks
from oddl.controller.admission import Admission, optinc_bucket_refusal
from oddl.controller.agent_registry import AgentRecord, AgentRegistry, Behind, Lost
from oddl.controller.announcer import Announcer
from oddl.controller.barriers import Agreed, Barrier, BarrierBook, Refusal
from oddl.controller.device_types import Configuration
from oddl.controller.devices import DeviceManager
from oddl.controller.flows import FlowDesk, check_request
from oddl.controller.jobs import JobRecord, JobTable
from oddl.controller.schedules import Schedules
from oddl.controller.scheduling.slot_grants import standing_refusal
from oddl.controller.slot_executor import SlotExecutor
from oddl.controller.store import Store
from oddl.controller.testbed_model import timing_from_config, topology_from_config
from oddl.controller.wire_views import Assignments, go_events, job_pb, peer_lost_pb, status_pb
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import encode_schedule, receive_timeout, schedule_sha256

logger = logging.getLogger(__name__)


class ControllerCore:
    """Owns the jobs, their barriers and schedules, one lock and one error counter, and the
    parts that act for them."""

    def __init__(self, cfg: TestbedConfig, devices: DeviceManager,
                 metrics: Metrics | None = None, store: Store | None = None):
        self.cfg, self.devices, self.store = cfg, devices, store
        self.lock = threading.RLock()
        self.errors: Counter[str] = Counter()
        self.collectives_failed = 0
        topology, timing = topology_from_config(cfg), timing_from_config(cfg)
        self.admission = Admission(cfg, topology, timing)
        self.schedules = Schedules(cfg, topology, timing, receive_timeout(cfg))
        self.barriers = BarrierBook()
        self.registry = AgentRegistry(cfg, devices.log_event)
        self.slots = SlotExecutor(devices, self, metrics, line_rate_gbps=cfg.fabric.line_rate_gbps,
                                  testbed=cfg.path)
        self.flows = FlowDesk(cfg, topology, timing, devices, self.count_error)
        self.jobs = JobTable(store)
        self.announcer = Announcer(self._announce)
        self.assignments = Assignments()
        self._transmitters = {n.id: n.transmitter for n in cfg.nodes}
        self._started: dict[str, int] = {}
        """Per job, the last collective whose slots were launched (barrier or standing)."""

    def close(self) -> None:
        """Stop the slot executors (at their next wait) and the streams (`slots.stop`)."""
        self.slots.close()
        self.announcer.close()
        self.registry.close()

    def count_error(self, kind: str) -> None:
        """Count one error of `kind` (``oddl_errors_total``)."""
        with self.lock:
            self.errors[kind] += 1

    def admit(self, name: str, nodes: Sequence[str], collective: str, network: str,
              params: Mapping[str, str], now_ns: int) -> tuple[JobRecord, Configuration]:
        """Check, record and store a job; its job-scale configuration, not applied (`submit`)."""
        with self.lock:
            job, target = self.admission.admit(name, nodes, collective, network, params, now_ns,
                                               job_id=self.jobs.next_id(), jobs=self.jobs,
                                               connections=self.devices.verified.connections)
            self.jobs.add(job)
        return job, target

    def submit(self, request: pb.SubmitJobRequest) -> JobRecord:
        """Admit a job, apply its job-scale configuration (one verified transaction) and tell
        its nodes; OddlError when refused, or when the configuration failed (the job failed)."""
        job, target = self.admit(request.name, list(request.nodes), request.collective,
                                 request.network, dict(request.params), time.time_ns())
        try:
            if target.channels or target.wss_tables or target.connections:
                self.devices.transact(target, reason=f"admit {job.id}")
        except OddlError as exc:
            with self.lock:
                self._end(job.id, "failed", f"job-scale configuration failed: {exc}")
            raise
        with self.lock:
            self._assign(job)
        logger.info("admitted %s (%s on %s, %s network)", job.id, job.collective,
                    ",".join(job.nodes), job.network)
        return job

    def cancel(self, job_id: str) -> JobRecord:
        """End a job at the operator's word and tell its nodes."""
        with self.lock:
            job = self._end(job_id, "cancelled", "cancelled by the operator")
            self.registry.push(job.nodes, pb.ScheduleEvent(ended=pb.JobEnded(
                job_id=job.id, reason=job.reason)))
            return job

    def _end(self, job_id: str, state: str, reason: str) -> JobRecord:
        """Mark a job cancelled, failed or finished; its barriers and schedules go."""
        job = self.jobs.get(job_id)
        if job.running:
            job.state, job.reason = state, reason
            self.barriers.forget(job.id)
            self.schedules.forget(job.id)
            self.jobs.save(job)
        return job

    def job_views(self) -> list[pb.Job]:
        """Every job as `ListJobs` carries it."""
        with self.lock:
            return [job_pb(j) for j in self.jobs]

    def status(self) -> pb.Status:
        """The agents, the jobs and the devices' counters (`GetStatus`)."""
        with self.lock:
            return status_pb(self.cfg.name, self.registry.status(time.monotonic()), self.jobs,
                             self.devices)

    # ---- agents' news -----------------------------------------------------------------------
    def _assign(self, job: JobRecord, to: tuple[str, ...] = ()) -> None:
        """Tell each registered node of `job` (or of `to`) its assignment."""
        nodes = [n for n in to or job.nodes if n in self.registry.agents]
        self.registry.push_each(self.assignments.events(
            job, nodes, self.registry.version, lambda: self.registry.data_addresses(job.nodes)),
            key=f"assigned {job.id}")

    def _announce(self, job_ids: set[str]) -> None:
        """Tell the nodes of these jobs, if still running, their peers now (`Announcer`)."""
        with self.lock:
            for job in (self.jobs.find(j) for j in sorted(job_ids)):
                if job is not None and job.running:
                    self._assign(job)

    def register(self, request: pb.RegisterAgentRequest) -> AgentRecord:
        """Register an agent (a new session); its jobs' peers learn its address (`Announcer`)."""
        with self.lock:
            rec, restarted = self.registry.register(request)
            if restarted is not None:  # a new agent process: its peers must not wait for it
                self.errors["agent restarted"] += 1
                self._peer_lost(restarted)
            for job in self.jobs.running_of(request.node_id):
                self.announcer.later(job.id)
            return rec

    def heartbeat(self, request: pb.HeartbeatRequest) -> bool:
        """Record a heartbeat; False: an unknown session (register again). See `agent_back`."""
        heard = self.registry.heartbeat(request)  # the registry's own lock: no wait on ours
        if heard.back:
            self.agent_back(request.node_id)
        return heard.known

    def agent_back(self, node_id: str) -> None:
        """Announce the jobs of an agent back from the dead (`Announcer`): its peers wait."""
        with self.lock:
            for job in self.jobs.running_of(node_id):
                self.announcer.later(job.id)

    def open_stream(self, node_id: str) -> tuple[AgentRecord, int] | None:
        """A new schedule stream to a node (None: not registered), its jobs' assignments first."""
        with self.lock:
            opened = self.registry.open_stream(node_id)
            for job in self.jobs.running_of(node_id) if opened is not None else ():
                self._assign(job, to=(node_id,))
            return opened

    def sweep(self, now: float, since: float = 0.0, behind: Behind | None = None) -> None:
        """Declare dead the agents silent at `now` since `since`; their peers learn it."""
        with self.lock:
            losses = self.registry.sweep(now, since, behind)
            self.errors["agent lost"] += len(losses)
            self._peer_lost(*losses)

    def _peer_lost(self, *losses: Lost) -> None:
        """Lost nodes' collectives end at their live peers, told once per job (ADR 0034)."""
        by_job: dict[str, tuple[JobRecord, list[Lost]]] = {}
        for lost in losses:
            for job in self.jobs.running_of(lost.node_id):
                by_job.setdefault(job.id, (job, []))[1].append(lost)
        for job, gone in by_job.values():
            ids = {x.node_id for x in gone}
            others = tuple(n for n in job.nodes if n not in ids)
            self._abandon(job, gone[0].reason, others)
            dead = set(self.registry.dead_among(others))
            self.registry.push(tuple(n for n in others if n not in dead), peer_lost_pb(job.id, gone))

    def _abandon(self, job: JobRecord, reason: str, nodes: tuple[str, ...]) -> None:
        """Fail every barrier of `job` still waiting (a participant is dead), at `nodes`."""
        for barrier in self.barriers.abandon(job.id, reason):
            self.registry.push(nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
                job_id=job.id, seq=barrier.seq, error=barrier.error)))

    # ---- through the barrier ----------------------------------------------------------------
    def ready(self, request: pb.ReadyCollectiveRequest) -> None:
        """Record a node's ready; start the collective once all are in (OddlError: refused)."""
        with self.lock:
            job = self.jobs.entered_by(request.job_id, request.node_id)
            barrier = self._enter(job, request)
            if barrier is None:
                down = self.registry.dead_among(job.nodes)
                if down:  # rather than let the others wait for it
                    self._abandon(job, f"node {down[0]} stopped answering (no heartbeat): its "
                                  "agent, host or link is down; it rejoins by itself once its "
                                  "agent reaches the controller again", job.nodes)
                return
        if barrier.error:
            self._go_error(job, barrier.seq, barrier.error, barrier.caller_steps)
        else:
            self._go(job, barrier)

    def _enter(self, job: JobRecord, request: pb.ReadyCollectiveRequest) -> Barrier | None:
        """Enter a ready into the job's barrier; its outcome once every node is in."""
        # (an abandoned collective was entered before it was abandoned: last_seq has it)
        job.last_seq = max(job.last_seq, request.seq)
        refuse: Refusal | None = None
        if job.collective == OPTINC:
            refuse = functools.partial(self._optinc_refusal, job)
        return self.barriers.ready(job.id, len(job.nodes), request.seq, request.node_id,
                                   request.shape, request.dtype, request.caller_step,
                                   (request.kind or ALL_REDUCE, request.op or "sum",
                                    request.root), refuse)

    def _optinc_refusal(self, job: JobRecord, agreed: Agreed) -> str:
        """Why the job's OptINC device cannot run what the nodes agreed on ("" if it can)."""
        return optinc_refusal(agreed.call) or optinc_bucket_refusal(self.cfg, job, agreed.n_elems,
                                                                    agreed.dtype)

    def _go_error(self, job: JobRecord, seq: int, error: str,
                  caller_steps: Mapping[str, int] | None = None) -> None:
        self.registry.push(job.nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
            job_id=job.id, seq=seq, error=error, caller_steps=caller_steps or {})))

    def _node_channels(self, job: JobRecord) -> dict[str, int | None]:
        """Each node's transmitter channel as last verified (None: unknown)."""
        verified = self.devices.verified.channels
        return {n: verified.get(self._transmitters[n]) for n in job.nodes}

    def _go(self, job: JobRecord, barrier: Barrier) -> None:
        """Lay out (or reuse) the collective's schedule, launch its slots that retune (an
        optinc collective's two slots retune nothing), tell every node to go."""
        optinc = job.collective == OPTINC
        if not optinc:
            self.slots.join(job.id)
        try:
            wire = self.schedules.wire(job, barrier.n_elems, barrier.itemsize, barrier.kind,
                                       barrier.root, self._node_channels(job))
        except OddlError as exc:
            self._go_error(job, barrier.seq, f"no schedule: {exc}")
            return
        t0_ns = time.time_ns() + round(self.cfg.timing.launch_margin_ms * 1e6)
        go = pb.CollectiveGo(job_id=job.id, seq=barrier.seq, t0_ns=t0_ns, schedule=wire)
        if optinc:
            with self.lock:
                job.guard_time_s += wire.guard_total_s
        else:
            self._launch(job, barrier.seq, go)
        self.registry.push_each(go_events(go, self.schedules.parts(job, wire)))
        self.jobs.save(job)
        if TRACE.on and not optinc:  # after the executor and the agents have what they need
            trace_hooks.planned(job.id, barrier.seq, job.nodes, go, "barrier start")

    def _launch(self, job: JobRecord, seq: int, go: pb.CollectiveGo) -> None:
        """Hand the collective's slots that change circuits (if any) to the executor."""
        if TRACE.on:
            trace_hooks.remember(job.id, seq, go)
        with self.lock:
            self._started[job.id] = max(self._started.get(job.id, 0), seq)
            self.slots.launch(job.id, seq, go, functools.partial(self.jobs.running, job.id))
            job.guard_time_s += go.schedule.guard_total_s

    def start_standing(self, request: pb.StartStandingRequest) -> None:
        """Execute a standing collective's slots if the controller would send the schedule
        the agents hold (ADR 0010); otherwise fail it where they first wait (they return to
        the barrier). Raises OperationRefused for a request that names no running job of its
        node or an impossible bucket."""
        job = self._standing_job(request)
        if job is None:
            return
        self.slots.join(job.id)
        go = pb.CollectiveGo(job_id=job.id, seq=request.seq, t0_ns=request.t0_ns)
        ours: bytes | None = None
        why = ""
        try:
            sched = self.schedules.schedule(job, request.message_bytes // request.itemsize,
                                            request.itemsize, self._node_channels(job),
                                            request.kind or ALL_REDUCE, request.root)
            go.schedule.CopyFrom(encode_schedule(sched, job.id, self.schedules.receive_timeout_s))
            ours = schedule_sha256(go.schedule)
        except OddlError as exc:
            why = str(exc)
        refusal = standing_refusal(request.schedule_sha256, ours, why)
        if refusal is not None:
            logger.warning("job %s collective %d: %s", job.id, request.seq, refusal.reason)
            self.count_error(refusal.kind)
            self.circuits_ready(job.id, request.seq, refusal.slot, refusal.reason)
            return
        self._launch(job, request.seq, go)
        self.jobs.save(job)
        if TRACE.on:  # after the executor and the agents have what they need
            trace_hooks.planned(job.id, request.seq, job.nodes, go, "standing start")

    def _standing_job(self, request: pb.StartStandingRequest) -> JobRecord | None:
        """The job of a standing start to execute, or None for a copy already seen."""
        with self.lock:
            job = self.jobs.running_with(request.job_id, request.node_id)
            if request.itemsize not in (1, 2, 4, 8) or request.message_bytes == 0 \
                    or request.message_bytes % request.itemsize:
                raise OperationRefused(
                    f"a standing start of {request.message_bytes} B in items of "
                    f"{request.itemsize} B; send the bucket's bytes and its dtype's itemsize")
            if request.seq <= self._started.get(job.id, 0):
                return None  # another agent's copy, or a collective already under way
            self._started[job.id] = request.seq
            job.last_seq = max(job.last_seq, request.seq)
            return job

    def report(self, request: pb.ReportCollectiveRequest) -> None:
        """Count a node's report of a collective (done once per collective, by rank 0)."""
        with self.lock:
            job = self.jobs.find(request.job_id)
            if job is not None:  # collectives on a standing schedule pass no barrier here
                job.last_seq = max(job.last_seq, request.seq)
            if job is not None and request.ok and job.nodes and request.node_id == job.nodes[0]:
                job.collectives_done += 1
                self.jobs.save(job)
            if not request.ok:
                self.collectives_failed += 1
                self.errors["collective failed"] += 1
        if not request.ok:
            logger.warning("collective %d of %s failed at %s: %s", request.seq, request.job_id,
                           request.node_id, request.error)

    def schedule_pb(self, job_id: str, message_bytes: int, itemsize: int,
                    kind: str = ALL_REDUCE, root: int = 0) -> pb.Schedule:
        """The schedule of a job's collective `kind` of `message_bytes` (`GetSchedule`)."""
        with self.lock:
            job = self.jobs.get(job_id)
            return self.schedules.encoded(job, message_bytes, itemsize, kind, root,
                                          self._node_channels(job))

    def request_flow(self, request: pb.RequestFlowRequest) -> pb.FlowGrant:
        """The grant of a point-to-point flow, after the job's collective slots end."""
        with self.lock:
            job = self.jobs.running_with(request.job_id, request.node_id)
            check_request(request, job.id, job.nodes)
            if self.schedules.on_circuits(job):
                raise OperationRefused(
                    f"job {job.id} runs on circuit-switch hosts, where point-to-point flows "
                    "have no windows to grant (they are ODDL's WSS fabric's): move the data "
                    "with a collective of the job (broadcast, all_gather), whose paths "
                    "admission set up")
            job_id, network, submitted_ns = job.id, job.network, job.submitted_ns
        self.slots.join(job_id)  # the job's collective slots end before its lasers move
        return self.flows.grant(request, job_id, network, submitted_ns)

    def confirm(self, request: pb.ConfirmDeliveryRequest) -> None:
        """A flow's arrival, confirmed by its receiver: a retune waiting for it may go."""
        self.slots.confirmations.add(request.job_id, request.seq, request.slot, request.src)

    def circuits_ready(self, job_id: str, seq: int, slot: int, error: str) -> None:
        """Tell the job's nodes that `slot` of collective `seq` may (or, `error`, cannot) go."""
        job = self.jobs.find(job_id)
        if job is not None:
            self.registry.push(job.nodes, pb.ScheduleEvent(circuits_ready=pb.CircuitsReady(
                job_id=job_id, seq=seq, slot=slot, error=error)))

    def retuned(self, job_id: str, transmitters: int) -> None:
        """Count the slot executor's retunes into the job's reconfigurations."""
        with self.lock:
            job = self.jobs.find(job_id)
            if job is not None:
                job.reconfigurations += transmitters
