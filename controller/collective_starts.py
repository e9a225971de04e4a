"""Starting collectives: the barrier's go, standing starts, OptINC, and their outcomes.

When every node of a job is ready (`JobManager.ready`), the controller lays out the
collective (`JobManager.schedule`), encodes it once (`oddl.protos.schedule_wire`), pushes the same
``CollectiveGo`` to every participant and hands the slots that change circuits to the
`SlotExecutor`. A standing collective (ADR 0010) starts without a barrier: its agents announce
it with the digest of the schedule they hold, and the controller executes its retunes only if
it would send the very same schedule now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping

from oddl.common.collective_kinds import ALL_REDUCE, KINDS, optinc_refusal
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import OddlError, OperationRefused
from oddl.common.tracing import TRACE
from oddl.controller import trace_hooks
from oddl.controller.agent_registry import AgentRegistry
from oddl.controller.barrier_checks import MAX_ELEMENTS
from oddl.controller.devices import DeviceManager
from oddl.controller.jobs import Barrier, JobManager, JobRecord
from oddl.controller.scheduling.slot_grants import standing_refusal
from oddl.controller.slot_executor import SlotExecutor
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import (
    encode_optinc_schedule,
    encode_schedule,
    receive_timeout,
    schedule_sha256,
)

logger = logging.getLogger(__name__)


class CollectiveStarts:
    """Turns barriers and standing starts into ``CollectiveGo`` events and slot executions."""

    def __init__(self, cfg: TestbedConfig, jobs: JobManager, devices: DeviceManager,
                 registry: AgentRegistry, executor: SlotExecutor, lock: threading.RLock,
                 errors: Counter[str]):
        self.cfg = cfg
        self.jobs = jobs
        self.devices = devices
        self.registry = registry
        self.executor = executor
        self.lock = lock
        self.errors = errors
        self.collectives_failed = 0
        self.receive_timeout_s = receive_timeout(cfg)
        self._started: dict[str, int] = {}
        """Per job, the last collective whose slots were launched (barrier or standing)."""

    def circuits_ready(self, job: JobRecord, seq: int, slot: int, error: str) -> None:
        """Tell the job's nodes that `slot` of collective `seq` may (or, `error`, cannot) go."""
        self.registry.push(job.nodes, pb.ScheduleEvent(circuits_ready=pb.CircuitsReady(
            job_id=job.id, seq=seq, slot=slot, error=error)))

    def _go_error(self, job: JobRecord, seq: int, error: str,
                  caller_steps: Mapping[str, int] | None = None) -> None:
        self.registry.push(job.nodes, pb.ScheduleEvent(go=pb.CollectiveGo(
            job_id=job.id, seq=seq, error=error, caller_steps=caller_steps or {})))

    def _t0_ns(self) -> int:
        return time.time_ns() + round(self.cfg.timing.launch_margin_ms * 1e6)

    def node_channels(self, job: JobRecord) -> dict[str, int | None]:
        """Each node's transmitter channel as last verified (None: unknown)."""
        verified = self.devices.verified.channels
        return {n: verified.get(self.cfg.node(n).transmitter) for n in job.nodes}

    # ---- through the barrier ------------------------------------------------------------
    def ready(self, request: pb.ReadyCollectiveRequest) -> None:
        """Record a node's ready; start the collective once every node is in. Raises
        OddlError when the ready itself is refused (unknown job, node not in it, ...)."""
        with self.lock:
            barrier = self.jobs.ready(request.job_id, request.seq, request.node_id,
                                      request.shape, request.dtype, request.caller_step,
                                      (request.kind or ALL_REDUCE, request.op or "sum",
                                       request.root))
            job = self.jobs.get(request.job_id)
            if barrier is None:
                barrier = self._abandon_for_dead(job)
                if barrier is None:
                    return
        if barrier.error:
            self._go_error(job, barrier.seq, barrier.error, barrier.caller_steps)
        elif job.collective == OPTINC:
            self._go_optinc(job, barrier)
        else:
            self._go(job, barrier)

    def _abandon_for_dead(self, job: JobRecord) -> Barrier | None:
        """A participant known dead: fail the waiting barrier rather than let the others wait."""
        down = [n for n in job.nodes if n in self.registry.agents and self.registry.agents[n].dead]
        if not down:
            return None
        return self.jobs.abandon_pending(job, f"node {down[0]} stopped answering (no heartbeat): "
                                         "its agent, host or link is down; it rejoins by "
                                         "itself once its agent reaches the controller "
                                         "again")[0]

    def _go(self, job: JobRecord, barrier: Barrier) -> None:
        self.executor.join(job.id)
        try:
            sched = self.jobs.schedule(job, barrier.n_elems, barrier.itemsize,
                                       self.node_channels(job), barrier.kind, barrier.root)
        except OddlError as exc:
            self._go_error(job, barrier.seq, f"no schedule: {exc}")
            return
        go = pb.CollectiveGo(job_id=job.id, seq=barrier.seq, t0_ns=self._t0_ns(),
                             schedule=encode_schedule(sched, job.id, self.receive_timeout_s))
        self._launch(job, barrier.seq, go)
        self.registry.push(job.nodes, pb.ScheduleEvent(go=go))
        self.jobs.save(job)
        if TRACE.on:  # after the executor and the agents have what they need
            trace_hooks.planned(job.id, barrier.seq, job.nodes, go, "barrier start")

    def _go_optinc(self, job: JobRecord, barrier: Barrier) -> None:
        """Start an optinc collective: its two-slot schedule, no retunes, no slot executor."""
        try:
            sched = self.jobs.optinc_schedule(job, barrier.n_elems, barrier.itemsize)
        except OddlError as exc:
            self._go_error(job, barrier.seq, f"no schedule: {exc}")
            return
        go = pb.CollectiveGo(job_id=job.id, seq=barrier.seq, t0_ns=self._t0_ns(),
                             schedule=encode_optinc_schedule(sched, job.id,
                                                             self.receive_timeout_s))
        with self.lock:
            job.guard_time_s += sched.guard_total_s
            self.registry.push(job.nodes, pb.ScheduleEvent(go=go))
            self.jobs.save(job)

    def _launch(self, job: JobRecord, seq: int, go: pb.CollectiveGo) -> None:
        """Hand the collective's slots that change circuits (if any) to the executor."""
        if TRACE.on:
            trace_hooks.remember(job.id, seq, go)
        with self.lock:
            self._started[job.id] = max(self._started.get(job.id, 0), seq)
            self.executor.launch(job, seq, go)
            job.guard_time_s += go.schedule.guard_total_s

    # ---- standing collectives -----------------------------------------------------------
    def start_standing(self, request: pb.StartStandingRequest) -> None:
        """Execute a standing collective's slots if the controller would send the schedule
        the agents hold; otherwise fail it where they first wait (they return to the
        barrier). Raises OperationRefused for a request that names no running job of its
        node or an impossible bucket."""
        job = self._standing_job(request)
        if job is None:
            return
        self.executor.join(job.id)
        go = pb.CollectiveGo(job_id=job.id, seq=request.seq, t0_ns=request.t0_ns)
        ours: bytes | None = None
        why = ""
        try:
            sched = self.jobs.schedule(job, request.message_bytes // request.itemsize,
                                       request.itemsize, self.node_channels(job),
                                       request.kind or ALL_REDUCE, request.root)
            go.schedule.CopyFrom(encode_schedule(sched, job.id, self.receive_timeout_s))
            ours = schedule_sha256(go.schedule)
        except OddlError as exc:
            why = str(exc)
        refusal = standing_refusal(request.schedule_sha256, ours, why)
        if refusal is not None:
            logger.warning("job %s collective %d: %s", job.id, request.seq, refusal.reason)
            self.errors[refusal.kind] += 1
            self.circuits_ready(job, request.seq, refusal.slot, refusal.reason)
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

    # ---- outcomes -----------------------------------------------------------------------
    def report(self, request: pb.ReportCollectiveRequest) -> None:
        """Count a node's report of a collective (done once per collective, by rank 0)."""
        with self.lock:
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

    def schedule_pb(self, job_id: str, message_bytes: int, itemsize: int,
                    kind: str = ALL_REDUCE, root: int = 0) -> pb.Schedule:
        """The schedule a job's collective `kind` of `message_bytes` would run on
        (`GetSchedule`)."""
        with self.lock:
            job = self.jobs.get(job_id)
            itemsize = itemsize or 4
            if itemsize not in (1, 2, 4, 8, 16):
                raise OperationRefused(f"itemsize {itemsize} is not a numeric element size; "
                                       "use 1, 2, 4, 8 or 16 bytes")
            if message_bytes > MAX_ELEMENTS * itemsize:
                raise OperationRefused(f"message_bytes {message_bytes} is larger than a job "
                                       f"accepts ({MAX_ELEMENTS * itemsize:,})")
            if message_bytes % itemsize:
                raise OperationRefused(f"message_bytes {message_bytes} is not a multiple of "
                                       f"itemsize {itemsize}")
            if kind not in KINDS:
                raise OperationRefused(f"unknown collective kind {kind!r}; use one of "
                                       f"{', '.join(KINDS)}")
            if job.collective == OPTINC and kind != ALL_REDUCE:
                raise OperationRefused(optinc_refusal((kind, "sum", root)))
            if job.collective == OPTINC:
                return encode_optinc_schedule(self.jobs.optinc_schedule(
                    job, message_bytes // itemsize, itemsize), job.id, self.receive_timeout_s)
            sched = self.jobs.schedule(job, message_bytes // itemsize, itemsize,
                                       self.node_channels(job), kind, root)
            return encode_schedule(sched, job.id, self.receive_timeout_s)
