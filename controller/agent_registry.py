"""The agents the controller knows: registration, heartbeats, liveness, per-node event streams.

Each node's agent registers (getting a session), sends heartbeats and holds one schedule
stream open (`WatchSchedule`); the controller pushes `ScheduleEvent`s to a node through its
queue here. An agent silent for three heartbeat intervals is dead: the collectives it takes
part in end at every other participant with the reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from oddl.common.config import TestbedConfig
from oddl.controller.jobs import JobManager, JobRecord
from oddl.controller.wire_views import job_pb
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)

LogEvent = Callable[[str, str, bool, str], None]
"""Record an event in the device log: (device or node, action, ok, detail)."""


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


class AgentRegistry:
    """The registered agents and their event queues; callers hold `lock` around changes that
    must agree with the jobs (the same lock the servicer takes)."""

    def __init__(self, cfg: TestbedConfig, jobs: JobManager, lock: threading.RLock,
                 errors: Counter[str], log_event: LogEvent):
        self.cfg = cfg
        self.jobs = jobs
        self.lock = lock
        self.errors = errors
        self.agents: dict[str, AgentRecord] = {}
        self._log_event = log_event

    def known_node(self, node_id: str) -> bool:
        """Whether the testbed has this node."""
        return any(n.id == node_id for n in self.cfg.nodes)

    def alive(self, rec: AgentRecord, now: float) -> bool:
        """Whether the agent sent a heartbeat within three intervals of `now` (monotonic)."""
        return now - rec.last_seen < 3 * self.cfg.controller.heartbeat_s

    def assigned(self, job: JobRecord, node: str) -> pb.ScheduleEvent:
        """The `JobAssigned` event telling `node` its rank and its peers' data addresses."""
        peers = {n: self.agents[n].data_address for n in job.nodes
                 if n in self.agents and self.agents[n].data_address}
        return pb.ScheduleEvent(assigned=pb.JobAssigned(job=job_pb(job),
                                                        rank=job.nodes.index(node), peers=peers,
                                                        next_seq=job.last_seq + 1))

    def push(self, nodes: tuple[str, ...], event: pb.ScheduleEvent) -> None:
        """Queue `event` for every registered node of `nodes`."""
        for n in nodes:
            rec = self.agents.get(n)
            if rec is not None:
                rec.events.put(event)

    def push_assigned(self, job: JobRecord, exclude: str = "") -> None:
        """Tell each registered node of `job` (but `exclude`) its assignment."""
        for n in job.nodes:
            if n != exclude and n in self.agents:
                self.agents[n].events.put(self.assigned(job, n))

    def register(self, request: pb.RegisterAgentRequest) -> AgentRecord:
        """A (re)registered agent's record, with a new session; its queue and stream carry
        over, and the peers of its running jobs learn its (new) data address."""
        with self.lock:
            old = self.agents.get(request.node_id)
            rec = AgentRecord(request.node_id, uuid.uuid4().hex[:12], request.data_address,
                              request.local_api, time.monotonic())
            if old is not None:
                rec.events = old.events
                rec.stream_generation = old.stream_generation
                rec.streaming = old.streaming
            self.agents[request.node_id] = rec
            for job in self.jobs.jobs.values():
                if job.running and request.node_id in job.nodes:
                    self.push_assigned(job, exclude=request.node_id)
        logger.info("agent %s registered (session %s, data %s)", request.node_id, rec.session,
                    request.data_address or "fabric")
        return rec

    def heartbeat(self, request: pb.HeartbeatRequest) -> bool:
        """Record a heartbeat; False when the session is unknown (the agent must register)."""
        with self.lock:
            rec = self.agents.get(request.node_id)
            if rec is None or rec.session != request.session:
                return False
            rec.last_seen = time.monotonic()
            rec.heartbeat = request
            if rec.dead:
                # back without restarting (a link or a stall that ended): its peers wait for
                # it until its jobs are announced again
                rec.dead = False
                logger.info("agent %s answers again", rec.node_id)
                self._log_event(rec.node_id, "agent back", True, "heartbeats resumed")
                for job in self.jobs.jobs.values():
                    if job.running and rec.node_id in job.nodes:
                        self.push_assigned(job, exclude=rec.node_id)
        return True

    def open_stream(self, node_id: str) -> tuple[AgentRecord, int] | None:
        """Start a new schedule stream to a registered node (None: not registered): its
        generation (a newer stream ends older ones), with its running jobs' assignments
        queued first."""
        with self.lock:
            rec = self.agents.get(node_id)
            if rec is None:
                return None
            rec.stream_generation += 1
            for job in self.jobs.jobs.values():
                if job.running and node_id in job.nodes:
                    rec.events.put(self.assigned(job, node_id))
            return rec, rec.stream_generation

    def stream(self, rec: AgentRecord, generation: int, active: Callable[[], bool],
               stop: threading.Event) -> Iterator[pb.ScheduleEvent]:
        """The events of `rec`'s node while `active()`, not `stop` and no newer stream."""
        events = rec.events
        rec.streaming = True
        try:
            while active() and not stop.is_set():
                if rec.stream_generation != generation:
                    return
                try:
                    event = events.get(timeout=0.25)
                except queue.Empty:
                    continue
                yield event
        finally:
            current = self.agents.get(rec.node_id)
            if current is not None and current.stream_generation == generation:
                current.streaming = False

    def monitor(self, stop: threading.Event) -> None:
        """Detect dead agents (no heartbeat for three intervals) until `stop`."""
        interval = self.cfg.controller.heartbeat_s
        while not stop.wait(interval / 2):
            now = time.monotonic()
            with self.lock:
                dying = [rec for rec in self.agents.values()
                         if not rec.dead and not self.alive(rec, now)]
                for rec in dying:
                    rec.dead = True
                    self._lost(rec, now - rec.last_seen)

    def _lost(self, rec: AgentRecord, silent_s: float) -> None:
        """End the collectives a dead agent takes part in, at every other participant."""
        reason = (f"node {rec.node_id} stopped answering (no heartbeat for {silent_s:.1f} s): "
                  "its agent, its host or its link to the controller is down; its peers' new "
                  "calls wait for it, and it rejoins by itself once its agent runs and reaches "
                  "the controller again")
        logger.warning("%s", reason)
        self.errors["agent lost"] += 1
        self._log_event(rec.node_id, "agent lost", False, reason)
        for job in self.jobs.jobs.values():
            if not job.running or rec.node_id not in job.nodes:
                continue
            others = tuple(n for n in job.nodes if n != rec.node_id)
            for barrier in self.jobs.abandon_pending(job, reason):
                self.push(others, pb.ScheduleEvent(go=pb.CollectiveGo(
                    job_id=job.id, seq=barrier.seq, error=barrier.error)))
            self.push(others, pb.ScheduleEvent(peer_lost=pb.PeerLost(
                job_id=job.id, node_id=rec.node_id, reason=reason)))

    def status(self, now: float) -> list[pb.AgentStatus]:
        """Every node's agent as `GetStatus` reports it (`now` monotonic)."""
        out = []
        for n in self.cfg.nodes:
            rec = self.agents.get(n.id)
            if rec is None:
                out.append(pb.AgentStatus(node_id=n.id, alive=False, last_heartbeat_age_s=-1))
                continue
            hb = rec.heartbeat
            out.append(pb.AgentStatus(
                node_id=n.id, alive=self.alive(rec, now) and rec.streaming,
                last_heartbeat_age_s=now - rec.last_seen, clock_offset_s=hb.clock_offset_s,
                clock_rtt_s=hb.clock_rtt_s, gate_error_p50_s=hb.gate_error_p50_s,
                gate_error_p99_s=hb.gate_error_p99_s, collectives_done=hb.collectives_done,
                collectives_failed=hb.collectives_failed, data_address=rec.data_address,
                clock_error_bound_s=hb.clock_error_bound_s,
                measured_line_rate_gbps=hb.measured_line_rate_gbps))
        return out

    def alive_count(self) -> int:
        """How many agents sent a recent heartbeat."""
        now = time.monotonic()
        return sum(1 for rec in list(self.agents.values()) if self.alive(rec, now))
