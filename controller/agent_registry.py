"""The agents the controller knows: sessions, heartbeats, liveness, per-node event queues.

Each node's agent registers (getting a session), sends heartbeats and holds one schedule
stream open (`WatchSchedule`); the controller pushes `ScheduleEvent`s to a node through its
queue here (an `EventQueue`: the stream waits on the server's event loop, not on a thread).
An agent silent for three heartbeat intervals is dead (`sweep`).

The registry knows nothing of jobs. What an agent's news means for its jobs (a registered or
returning agent's peers learn its address, a new stream gets its jobs first, a lost agent ends
its collectives) is its owner's part, `oddl.controller.core.ControllerCore`, which calls
`register`, `heartbeat`, `open_stream` and `sweep` under its lock and acts on their answers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from oddl.common.config import TestbedConfig
from oddl.controller.event_queue import EventQueue, wake_all
from oddl.controller.heartbeat_lateness import Behind, Lateness, send_front_ns
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)

BEATS_PER_S = 512.0
"""At most this many heartbeats a second from all agents together: each costs the controller
~0.4 ms of CPU with its clock probes (docs/results.md), so a thousand agents beating every
second would take 40 % of a core that a restart needs (decision record 0034)."""

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
    events: EventQueue = field(default_factory=EventQueue)
    stream_generation: int = 0
    heartbeat: pb.HeartbeatRequest = field(default_factory=pb.HeartbeatRequest)
    dead: bool = False
    streaming: bool = False
    """A schedule stream to this agent is open (without one it cannot take part)."""
    instance: str = ""
    """The agent process's own id (`RegisterAgentRequest.instance`; "" from older agents)."""
    beaten: bool = False
    """A heartbeat of this session came (until then the agent may still await the reply)."""
    sent_ns: int = 0
    """When the newest heartbeat read from this session was sent, on the controller's clock
    as the agent estimates it (0: none, or its agent does not know the clock)."""


@dataclass(frozen=True)
class Heard:
    """What a heartbeat told: whether its session is known (else the agent must register)
    and whether it came from an agent declared dead (it is back)."""

    known: bool
    back: bool = False


@dataclass(frozen=True)
class Lost:
    """An agent newly declared dead, with the reason its peers are told."""

    node_id: str
    reason: str


def heartbeat_interval(cfg: TestbedConfig) -> float:
    """The heartbeat interval the controller asks its agents for (`RegisterAgentReply`): the
    testbed file's, or longer on a testbed whose nodes would beat more than `BEATS_PER_S`
    times a second (2 s at 1024 nodes)."""
    return max(cfg.controller.heartbeat_s, len(cfg.nodes) / BEATS_PER_S)


class AgentRegistry:
    """The registered agents and their event queues (its own lock guards them)."""

    def __init__(self, cfg: TestbedConfig, log_event: LogEvent):
        self.cfg = cfg
        self.agents: dict[str, AgentRecord] = {}
        self._log_event = log_event
        self._lock = threading.Lock()
        self._nodes = frozenset(n.id for n in cfg.nodes)
        self.version = 0
        """Counts registrations: the data addresses may have changed since another count."""
        self.last_registered = 0.0
        """When the latest registration was recorded (monotonic)."""
        self.interval_s = heartbeat_interval(cfg)
        """The agents' heartbeat interval; three of them silent: dead."""
        self._dead: set[str] = set()
        """The nodes whose current record is declared dead (`AgentRecord.dead`)."""
        self.lateness = Lateness()
        """How late heartbeats are read (the monitor holds its verdicts while they are)."""

    def known_node(self, node_id: str) -> bool:
        """Whether the testbed has this node."""
        return node_id in self._nodes

    def alive(self, rec: AgentRecord, now: float) -> bool:
        """Whether the agent sent a heartbeat within three intervals of `now` (monotonic)."""
        return now - rec.last_seen < 3 * self.interval_s

    def dead_among(self, nodes: tuple[str, ...]) -> list[str]:
        """The nodes of `nodes` whose agents were declared dead (none: at once, not O(N))."""
        if not self._dead:
            return []
        return [n for n in nodes if n in self._dead]

    def dead(self, node_id: str) -> bool:
        """Whether `node_id`'s agent registered and was declared dead since."""
        rec = self.agents.get(node_id)
        return rec is not None and rec.dead

    def data_addresses(self, nodes: tuple[str, ...]) -> dict[str, str]:
        """The data addresses of the registered nodes of `nodes` that gave one."""
        with self._lock:
            return {n: self.agents[n].data_address for n in nodes
                    if n in self.agents and self.agents[n].data_address}

    def push(self, nodes: tuple[str, ...], event: pb.ScheduleEvent, key: str = "") -> None:
        """Queue `event` for every registered node of `nodes` (and wake their streams); with
        `key`, in place of a queued event of the same key (`EventQueue.put`)."""
        wakes = []
        for n in nodes:
            rec = self.agents.get(n)
            if rec is not None:
                wakes.append(rec.events.put(event, key))
        wake_all(wakes)

    def push_each(self, events: Mapping[str, pb.ScheduleEvent], key: str = "") -> None:
        """Queue each registered node's own event (and wake their streams); with `key`, in
        place of a queued event of the same key (`EventQueue.put`)."""
        wakes = []
        for n, event in events.items():
            rec = self.agents.get(n)
            if rec is not None:
                wakes.append(rec.events.put(event, key))
        wake_all(wakes)

    def register(self, request: pb.RegisterAgentRequest) -> tuple[AgentRecord, Lost | None]:
        """A (re)registered agent's record, with a new session (its queue and stream carry
        over), and, when another agent process registered for the node before (a restarted
        agent), what its peers are told: its collectives in flight are lost."""
        with self._lock:
            old = self.agents.get(request.node_id)
            rec = AgentRecord(request.node_id, uuid.uuid4().hex[:12], request.data_address,
                              request.local_api, time.monotonic(), instance=request.instance)
            if old is not None:
                rec.events = old.events
                rec.stream_generation = old.stream_generation
                rec.streaming = old.streaming
            self.agents[request.node_id] = rec
            self._dead.discard(request.node_id)
            self.last_registered = rec.last_seen
            self.version += 1
        logger.info("agent %s registered (session %s, data %s)", request.node_id, rec.session,
                    request.data_address or "fabric")
        if old is None or not old.instance or not request.instance \
                or old.instance == request.instance:
            return rec, None
        reason = (f"node {request.node_id} restarted (a new agent process registered): what "
                  "it had in flight is lost; it takes part again from its next call")
        logger.warning("%s", reason)
        self._log_event(request.node_id, "agent restarted", False, reason)
        return rec, Lost(request.node_id, reason)

    def heartbeat(self, request: pb.HeartbeatRequest, now: float | None = None,
                  now_ns: int | None = None) -> Heard:
        """Record a heartbeat read at `now` (monotonic) and `now_ns` (the wall clock; both
        read here when not given), and whether it brings back an agent declared dead."""
        self.lateness.read(request.sent_ns, time.time_ns() if now_ns is None else now_ns)
        with self._lock:
            rec = self.agents.get(request.node_id)
            if rec is None or rec.session != request.session:
                return Heard(known=False)
            rec.last_seen = time.monotonic() if now is None else now
            rec.heartbeat, rec.beaten = request, True
            rec.sent_ns = max(rec.sent_ns, request.sent_ns)
            if not rec.dead:
                return Heard(known=True)
            # back without restarting (a link or a stall that ended)
            rec.dead = False
            self._dead.discard(rec.node_id)
        logger.info("agent %s answers again", rec.node_id)
        self._log_event(rec.node_id, "agent back", True, "heartbeats resumed")
        return Heard(known=True, back=True)

    def open_stream(self, node_id: str) -> tuple[AgentRecord, int] | None:
        """Start a new schedule stream to a registered node (None: not registered): its
        record and generation (a newer stream ends older ones)."""
        with self._lock:
            rec = self.agents.get(node_id)
            if rec is None:
                return None
            rec.stream_generation += 1
            generation = rec.stream_generation
        wake_all([rec.events.kick()])  # an older stream parked on the queue ends now
        return rec, generation

    def _current(self, node_id: str, generation: int) -> bool:
        rec = self.agents.get(node_id)
        return rec is not None and rec.stream_generation == generation

    async def stream(self, rec: AgentRecord, generation: int,
                     stop: threading.Event) -> AsyncIterator[pb.ScheduleEvent]:
        """The events of `rec`'s node until `stop` or a newer stream (the caller's
        cancellation, when its client goes, ends it too). Waits on the event loop."""
        events = rec.events
        self._mark_streaming(rec.node_id, generation, True)
        try:
            while not stop.is_set() and self._current(rec.node_id, generation):
                event = events.get_nowait()
                if event is None:
                    await events.wait()
                    continue
                yield event
        finally:
            self._mark_streaming(rec.node_id, generation, False)

    def _mark_streaming(self, node_id: str, generation: int, streaming: bool) -> None:
        """Mark the node's current record (a registration since the stream opened made a new
        one, which carries the mark over) as streaming or not, if `generation` is current."""
        with self._lock:
            current = self.agents.get(node_id)
            if current is not None and current.stream_generation == generation:
                current.streaming = streaming

    def close(self) -> None:
        """End every stream at its next wake (call after setting their `stop`)."""
        wake_all([rec.events.kick() for rec in list(self.agents.values())])

    def sweep(self, now: float, since: float = 0.0, behind: Behind | None = None
              ) -> list[Lost]:
        """Declare dead every agent silent for three heartbeat intervals at `now`
        (monotonic; silence counted from `since` at the earliest: the controller was behind
        until then) and not dead already; each with the reason its peers are told. An agent
        that has not beaten since it registered is counted from the latest registration: its
        reply may wait behind the others' of a burst (a controller restart, ADR 0034).
        `behind`: the controller reads late, judge as `Behind` says (ADR 0038)."""
        deadline = 3 * self.interval_s
        with self._lock:
            burst = self.last_registered
            if behind is None:
                dying = [rec for rec in self.agents.values() if not rec.dead and now - max(
                    rec.last_seen, since, burst if not rec.beaten else 0.0) >= deadline]
            else:
                dying = self._behind(now, since, behind)
            for rec in dying:
                rec.dead = True
                self._dead.add(rec.node_id)
        lost = []
        for rec in dying:
            reason = (f"node {rec.node_id} stopped answering (no heartbeat for "
                      f"{now - rec.last_seen:.1f} s): its agent, its host or its link to the "
                      "controller is down; its peers' new calls wait for it, and it rejoins by "
                      "itself once its agent runs and reaches the controller again")
            logger.warning("%s", reason)
            self._log_event(rec.node_id, "agent lost", False, reason)
            lost.append(Lost(rec.node_id, reason))
        return lost

    def _behind(self, now: float, since: float, behind: Behind) -> list[AgentRecord]:
        """The agents a held sweep finds dead (`Behind`; the caller holds the lock): sent
        three intervals before the send front and read-silent three intervals since `since`
        (the hold's start: what waited while the controller fell behind is read in a burst,
        most agents' first), or, once the hold is capped, read-silent three intervals and
        the grace since `since`."""
        deadline = 3 * self.interval_s
        live = [rec for rec in self.agents.values() if not rec.dead]
        front = send_front_ns([rec.sent_ns for rec in live if rec.beaten])
        dying = []
        for rec in live:
            silent = now - max(rec.last_seen, since) >= deadline
            by_send = rec.beaten and rec.sent_ns > 0 and front - rec.sent_ns >= deadline * 1e9
            by_cap = behind.capped and now - max(
                rec.last_seen, since, self.last_registered if not rec.beaten else 0.0
            ) >= deadline + behind.grace_s
            if silent and (by_send or by_cap):
                dying.append(rec)
        return dying

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
