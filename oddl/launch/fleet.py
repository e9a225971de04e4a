"""A fleet of lightweight agents: many nodes' control links in one process, on one event loop.

Each `FleetAgent` speaks the agent's real protocol to the controller over its own gRPC
connection (register, the `WatchSchedule` stream, a heartbeat every interval after a burst of
UDP clock probes, the barrier's ready) and nothing else: no data plane, no devices. It is what
the control plane sees of an agent, for loading a controller with a thousand of them
(benchmarks/bench_control_plane.py) and for the tests that a controller serves them all.

Every event an agent receives is kept with its arrival time (`time.time_ns`), so a caller can
ask when each node heard of something (`Fleet.wait_all`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from oddl.common.clock_wire import MAGIC, REQUEST
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc

Match = Callable[[pb.ScheduleEvent], bool]


@dataclass
class Heard:
    """One event as an agent received it."""

    at_ns: int
    event: pb.ScheduleEvent


@dataclass
class FleetAgent:
    """One node's control link (see the module docstring)."""

    node: str
    stub: pb_grpc.ControllerStub
    channel: grpc.aio.Channel
    session: str = ""
    clock_port: int = 0
    heard: dict[tuple[str, str, int], Heard] = field(default_factory=dict)
    """The first event of each kind, job and collective (later copies are counted only:
    a thousand agents keeping every assignment of a thousand peers would not fit)."""
    events: int = 0
    registrations: int = 0
    registered_ns: int = 0
    """When the last registration's reply came (time.time_ns)."""
    instance: str = field(default_factory=lambda: os.urandom(8).hex())
    """This agent's process id, as a real agent sends (a new one: a restarted agent)."""
    heartbeat_s: float = 0.0
    """The interval the controller asked for at registration (0: the fleet's own)."""
    beats: int = 0
    """Heartbeats the controller took since the last registration."""


class Fleet:
    """`nodes`' agents against the controller at `address`; `await start()`, `await close()`."""

    def __init__(self, address: str, nodes: Iterable[str], heartbeat_s: float = 1.0,
                 clock_probes: int = 4, rpc_timeout_s: float = 30.0):
        self.address = address
        self.host = address.rsplit(":", 1)[0].strip("[]")
        self.heartbeat_s = heartbeat_s
        self.clock_probes = clock_probes
        self.timeout = rpc_timeout_s
        self.agents = {n: self._agent(n) for n in nodes}
        self._tasks: list[asyncio.Task[None]] = []
        self._own: dict[str, list[asyncio.Task[None]]] = {}
        self._changed = asyncio.Event()
        self._udp: socket.socket | None = None
        self.closing = False
        self.heartbeats = 0
        self.probes = 0
        self.beat_gap_max_s = 0.0
        """The longest an agent went between two heartbeats it sent (this side's lateness)."""
        self.errors: Counter[str] = Counter()
        """Failed calls, by RPC and status ("Heartbeat DEADLINE_EXCEEDED")."""

    def _agent(self, node: str) -> FleetAgent:
        # a connection of its own per agent, as separate agent processes have
        channel = grpc.aio.insecure_channel(self.address,
                                            options=[("grpc.use_local_subchannel_pool", 1)])
        return FleetAgent(node, pb_grpc.ControllerStub(channel), channel)

    async def start(self) -> None:
        """Start every agent's link: register, stream, beat (returns at once)."""
        self._udp = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                                  socket.SOCK_DGRAM)
        self._udp.setblocking(False)
        for a in self.agents.values():
            own = [asyncio.create_task(self._link(a)), asyncio.create_task(self._beat(a))]
            self._own[a.node] = own
            self._tasks.extend(own)

    async def kill(self, nodes: Iterable[str]) -> None:
        """Stop `nodes`' agents at once, as a SIGKILL would: no goodbye, their connections
        closed, no more heartbeats."""
        gone = [self.agents[n] for n in nodes]
        tasks = [t for a in gone for t in self._own.get(a.node, [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.channel.close() for a in gone), return_exceptions=True)

    async def close(self) -> None:
        """Stop every agent and close its connection."""
        self.closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(a.channel.close() for a in self.agents.values()),
                             return_exceptions=True)
        if self._udp is not None:
            self._udp.close()

    async def register(self, a: FleetAgent) -> None:
        reply = await a.stub.RegisterAgent(pb.RegisterAgentRequest(
            node_id=a.node, data_address=f"tcp://127.0.0.1:{10000 + len(a.node)}",
            agent_version="fleet", instance=a.instance), timeout=self.timeout)
        a.session, a.clock_port = reply.session, reply.clock_port
        a.heartbeat_s = reply.heartbeat_interval_s  # as the agent does
        a.registrations += 1
        a.registered_ns = time.time_ns()
        a.beats = 0

    async def _link(self, a: FleetAgent) -> None:
        """Register, follow the stream; on its end register again (the controller restarted)."""
        backoff = 0.2
        while not self.closing:
            try:
                await self.register(a)
                call = a.stub.WatchSchedule(pb.WatchScheduleRequest(node_id=a.node,
                                                                    session=a.session))
                async for event in call:
                    backoff = 0.2
                    a.events += 1
                    a.heard.setdefault(_key(event), Heard(time.time_ns(), event))
                    self._changed.set()
            except grpc.aio.AioRpcError as exc:
                self.errors[f"stream {exc.code().name}"] += 1
            if self.closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, 2.0)

    async def _beat(self, a: FleetAgent) -> None:
        """Every interval: a burst of UDP clock probes, then a heartbeat (as the agent)."""
        await asyncio.sleep(self.heartbeat_s * (hash(a.node) % 1000) / 1000)  # spread them
        last = 0.0
        while not self.closing:
            if a.session:
                now = time.monotonic()
                if last:
                    self.beat_gap_max_s = max(self.beat_gap_max_s, now - last)
                last = now
                self._probe(a)
                try:
                    # on the controller's host: its clock is the controller's
                    reply = await a.stub.Heartbeat(pb.HeartbeatRequest(
                        node_id=a.node, session=a.session, sent_ns=time.time_ns()),
                        timeout=self.timeout)
                    self.heartbeats += 1
                    if reply.reregister:  # as the agent does: register again at once
                        self.errors["Heartbeat reregister"] += 1
                        await self.register(a)
                    else:
                        a.beats += 1
                except grpc.aio.AioRpcError as exc:
                    self.errors[f"Heartbeat {exc.code().name}"] += 1
            await asyncio.sleep(a.heartbeat_s or self.heartbeat_s)

    def _probe(self, a: FleetAgent) -> None:
        if not a.clock_port or self._udp is None:
            return
        for _ in range(self.clock_probes):
            try:
                self._udp.sendto(REQUEST.pack(MAGIC, os.urandom(8)), (self.host, a.clock_port))
                self.probes += 1
            except OSError:
                return
        try:  # the answers are not used: drain what has come
            while True:
                self._udp.recv(64)
        except OSError:
            pass

    # ---- asking what the agents heard ----------------------------------------------------
    def first(self, a: FleetAgent, match: Match, since_ns: int = 0) -> Heard | None:
        """The first event `a` heard at or after `since_ns` that `match`es (of each kind, job
        and collective only the first is kept)."""
        return next((h for h in list(a.heard.values())
                     if h.at_ns >= since_ns and match(h.event)), None)

    async def wait_all(self, match: Match, timeout: float, since_ns: int = 0
                       ) -> dict[str, Heard]:
        """Each agent's first matching event since `since_ns`; TimeoutError naming how many
        never heard one."""
        deadline = time.monotonic() + timeout
        while True:
            got = {n: h for n, a in self.agents.items()
                   if (h := self.first(a, match, since_ns)) is not None}
            if len(got) == len(self.agents):
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(self.agents) - set(got))
                raise TimeoutError(f"{len(missing)} of {len(self.agents)} agents heard nothing "
                                   f"within {timeout:.0f} s (first: {', '.join(missing[:5])})")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass

    async def ready_all(self, job_id: str, seq: int, shape: list[int]) -> dict[str, int]:
        """Every agent enters collective `seq` of `job_id` at once; each reply's time."""
        async def one(a: FleetAgent) -> tuple[str, int]:
            await a.stub.ReadyCollective(pb.ReadyCollectiveRequest(
                job_id=job_id, seq=seq, node_id=a.node, shape=shape, dtype="<f4"),
                timeout=self.timeout)
            return a.node, time.time_ns()
        return dict(await asyncio.gather(*(one(a) for a in self.agents.values())))


def _key(event: pb.ScheduleEvent) -> tuple[str, str, int]:
    """An event's kind, job and collective (the keep-first key)."""
    kind = event.WhichOneof("event") or ""
    body = getattr(event, kind) if kind else None
    job = (body.job.id if kind == "assigned" else getattr(body, "job_id", "")) if body else ""
    return kind, job, int(getattr(body, "seq", 0) or 0)
