"""The node agent: one long-lived process per training host (`oddl agent serve`).

It registers with the controller over gRPC, keeps its clock offset to the controller, watches
the schedule stream (job assignments, collective start signals, job ends), serves a local API
to the training process (`allreduce(array) -> array`, see `agents.client`), and runs each
collective through its data-plane link, gating sends into their slots locally: no round trip
to the controller per flow, one barrier entry per collective.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import zmq

from agents import localapi
from agents.clock import ClockEstimate, ClockSample, estimate
from agents.dataplane import DirectLink, FabricLink
from agents.executor import (
    OPTINC,
    CollectiveRun,
    SlotSpec,
    StepSpec,
    run_collective,
    run_optinc,
)
from agents.gate import SlotGate
from agents.lightphy import LightPhy
from agents.standing import Ready, agree, exchange
from agents.streamauth import StreamAuth
from agents.streams import StreamLink
from common import __version__
from common.config import TestbedConfig
from common.errors import CollectiveError, ConfigError, OddlError, OperationRefused
from common.metrics import Metrics, counter, gauge
from common.shm import BucketMaps
from drivers.emulators.lighttable import LightTable
from protos import oddl_pb2 as pb
from protos import oddl_pb2_grpc as pb_grpc
from protos.schedule_wire import (
    EVERY_SLOT,
    ends_where_it_starts,
    first_data_start,
    retunes,
    schedule_sha256,
)

logger = logging.getLogger(__name__)

RPC_TIMEOUT_S = 5.0


@dataclass
class AgentJob:
    """What the agent knows about one job it takes part in."""

    id: str
    nodes: tuple[str, ...]
    rank: int
    network: str
    collective: str
    next_seq: int = 1
    ended: str = ""
    plans: dict[tuple[int, str], pb.Schedule] = field(default_factory=dict)
    standing: dict[tuple[int, str], pb.Schedule] = field(default_factory=dict)
    """The last schedule of each bucket (elements, dtype): run again without the
    controller's barrier (`agents.standing`); one that retunes is announced to the
    controller, which executes its retunes. Cleared when a collective fails."""


@dataclass
class _Request:
    ident: bytes
    header: dict[str, Any]
    payload: bytes
    shared: bool = False


class Agent:
    """The agent of one node; `start()` it, then `close()` it."""

    def __init__(self, cfg: TestbedConfig, node_id: str, controller: str,
                 local_api: str = localapi.AUTO, data_bind: str | None = None,
                 local_api_group: str | None = None):
        cfg.node(node_id)  # unknown node: ConfigError naming the known ids
        self.cfg = cfg
        self.node_id = node_id
        self.controller = controller
        self.metrics = Metrics("oddl_agent")
        self.metrics.add_state(self._metric_state)
        self.errors: Counter[str] = Counter()
        self.gate = SlotGate(on_release=self.metrics.gate_error.observe,
                             on_overrun=self.metrics.overrun.observe)
        self.clock = ClockEstimate(0.0, 0.0)
        self.jobs: dict[str, AgentJob] = {}
        self.session = ""
        self.done = 0
        self.failed = 0
        self.last_error = ""
        self._go: dict[tuple[str, int], pb.CollectiveGo] = {}
        self._go_cond = threading.Condition()
        self._stop = threading.Event()
        self._work: queue.Queue[_Request | None] = queue.Queue()
        self._reports: queue.Queue[Any] = queue.Queue()
        self._circuits: dict[tuple[str, int, int], str] = {}
        self._current_job = ""
        self._cancel = threading.Event()
        self._running = threading.Event()
        self._abort_reason = ""
        self._pending_ready: pb.ReadyCollectiveRequest | None = None
        security = None
        if cfg.security.enabled:
            from common.security import SecurityFiles, secure_channel, tls_channel_credentials

            security = SecurityFiles.load(cfg.security.certs)
            self._channel = secure_channel(controller,
                                           tls_channel_credentials(security.agent_tls(node_id)))
        else:
            self._channel = grpc.insecure_channel(controller)
        self._stub = pb_grpc.ControllerStub(self._channel)
        node = cfg.node(node_id)
        self.link_kind = cfg.fabric.link
        self.link: StreamLink | DirectLink | FabricLink
        self.device_link: FabricLink | None = None
        bind = data_bind or f"{node.host}:{node.data_port}"
        if self.link_kind == "direct" and cfg.fabric.transport == "curve":
            if security is None:
                raise ConfigError('[fabric] transport = "curve" encrypts the direct links '
                                  "with the lab's CURVE keys: set [security] certs, or use "
                                  'transport = "streams"')
            self.link = DirectLink(node_id, bind, security=security)  # encrypted, ZeroMQ
        elif self.link_kind == "direct":
            self.link = StreamLink(node_id, bind, auth=_stream_auth(cfg, node_id, security))
        else:
            if not cfg.fabric.address:
                raise OddlError("the testbed file has no [fabric] address; start the emulated "
                                "testbed with `oddl emulate testbed` and use its resolved file")
            curve = None if security is None else (security.curve_keys(node_id),
                                                   security.curve_public("fabric"))
            self.link = self.device_link = FabricLink(node_id, cfg.fabric.address, curve=curve)
            phy = _light_phy(cfg, node_id) if security is None else None
            if phy is not None:
                self.link = StreamLink(node_id, bind, phy=phy)
        self.phy = getattr(self.link, "phy", None)
        self._buckets = BucketMaps()
        self.gate_scheduling = "normal"
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"{node_id}-send",
                                          initializer=self._gate_thread_setup)
        self.api_bytes = 0
        self.shared_bytes = 0
        self.standing_runs = 0
        self._called_at = 0.0
        self.starts: deque[tuple[str, int, float, float]] = deque(maxlen=2000)
        """Per gated collective (job, seq, the all-reduce call's arrival, its first slot's
        start), local clock: the control overhead is the first slot's start minus the last
        node's arrival (the barrier or ready exchange, and the launch or standing margin)."""
        ctx = zmq.Context.instance()
        self._api = ctx.socket(zmq.ROUTER)
        self._api.setsockopt(zmq.LINGER, 0)
        self.local_api = localapi.bind(self._api, local_api, node_id, local_api_group)
        self._results = ctx.socket(zmq.PULL)
        self._results_addr = f"inproc://agent-results-{uuid.uuid4().hex}"
        self._results.bind(self._results_addr)
        self._threads: list[threading.Thread] = []

    def _gate_thread_setup(self) -> None:
        """Real-time priority and CPU affinity for the threads that gate sends (the sender,
        and the collective thread for small collectives), where the testbed file asks for
        them and the system permits (reported either way)."""
        want = self.cfg.agent
        done = []
        if want.gate_cpu >= 0:
            try:
                os.sched_setaffinity(0, {want.gate_cpu})
                done.append(f"pinned to CPU {want.gate_cpu}")
            except (OSError, AttributeError) as exc:
                done.append(f"not pinned to CPU {want.gate_cpu} ({exc})")
        if want.gate_priority > 0:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(want.gate_priority))
                done.append(f"SCHED_FIFO {want.gate_priority}")
            except (OSError, AttributeError) as exc:
                done.append(f"SCHED_FIFO {want.gate_priority} not permitted ({exc}); normal "
                            "scheduling")
        if done:
            self.gate_scheduling = ", ".join(done)
            logger.info("%s: gate thread %s", self.node_id, self.gate_scheduling)

    @property
    def data_address(self) -> str:
        """The address peers reach this agent at (direct links), else empty."""
        return getattr(self.link, "address", "")

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Register, synchronise clocks and start the agent's threads."""
        self.register()
        self.sync_clock()
        self._sender.submit(lambda: None)  # start the gate thread (and set its scheduling)
        for target, name in ((self._watch_loop, "watch"), (self._heartbeat_loop, "heartbeat"),
                             (self._api_loop, "local-api"), (self._work_loop, "collectives"),
                             (self._report_loop, "reports")):
            t = threading.Thread(target=target, name=f"{self.node_id}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop every thread and release sockets and the channel."""
        self.metrics.close()
        self._stop.set()
        self._work.put(None)
        self._reports.put(None)
        with self._go_cond:
            self._go_cond.notify_all()
        self._channel.close()
        for t in self._threads:
            t.join(timeout=3)
        self._sender.shutdown(wait=False, cancel_futures=True)
        self.link.close()
        if self.device_link is not None and self.device_link is not self.link:
            self.device_link.close()
        self._buckets.close()
        self._api.close(0)
        localapi.unlink(self.local_api)
        self._results.close(0)

    def register(self) -> None:
        """Announce this node to the controller (raises OperationRefused for unknown nodes)."""
        req = pb.RegisterAgentRequest(node_id=self.node_id, data_address=self.data_address,
                                      agent_version=__version__, local_api=self.local_api)
        try:
            reply = self._stub.RegisterAgent(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise _rpc_error(exc, f"registering {self.node_id} with {self.controller}") from exc
        self.session = reply.session
        self.heartbeat_s = reply.heartbeat_interval_s or 1.0
        logger.info("%s registered with %s (session %s)", self.node_id, self.controller,
                    self.session)
        pending = self._pending_ready
        if pending is not None:
            # the controller may have restarted and lost the barrier: enter it again
            try:
                self._stub.ReadyCollective(pending, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                logger.warning("%s: re-entering collective %d failed: %s", self.node_id,
                               pending.seq, exc.code() if hasattr(exc, "code") else exc)

    def sync_clock(self, samples: int = 8) -> ClockEstimate:
        """Estimate the controller-minus-agent clock offset from a few exchanges."""
        got: list[ClockSample] = []
        for _ in range(samples):
            t1 = time.time_ns()
            try:
                r = self._stub.SyncClock(pb.SyncClockRequest(node_id=self.node_id,
                                                             agent_send_ns=t1),
                                         timeout=RPC_TIMEOUT_S)
            except grpc.RpcError:
                continue
            got.append(ClockSample(t1, r.controller_receive_ns, r.controller_send_ns,
                                   time.time_ns()))
        if got:
            self.clock = estimate(got)
        return self.clock

    # ---- threads ----------------------------------------------------------------------
    def _watch_loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                stream = self._stub.WatchSchedule(
                    pb.WatchScheduleRequest(node_id=self.node_id, session=self.session))
                for event in stream:
                    backoff = 0.2
                    self._on_event(event)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                logger.warning("%s: schedule stream ended (%s); reconnecting", self.node_id,
                               exc.code() if hasattr(exc, "code") else exc)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 2.0)
            try:
                self.register()
            except OddlError as exc:
                logger.warning("%s: re-register failed: %s", self.node_id, exc)

    def _on_event(self, event: pb.ScheduleEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "assigned":
            job = event.assigned.job
            old = self.jobs.get(job.id)
            if old is not None and old.nodes == tuple(job.nodes) and not old.ended:
                # the controller re-announces a job this agent runs (its stream or the
                # controller restarted): keep the very object, since a collective in flight
                # counts its sequence number on it, and keep the agent's own count
                old.rank = event.assigned.rank
            else:
                # a fresh (restarted) agent continues after the job's last collective
                self.jobs[job.id] = AgentJob(job.id, tuple(job.nodes), event.assigned.rank,
                                             job.network, job.collective,
                                             next_seq=max(1, event.assigned.next_seq))
            if hasattr(self.link, "set_peers"):
                self.link.set_peers(dict(event.assigned.peers))
            logger.info("%s: assigned to job %s as rank %d", self.node_id, job.id,
                        event.assigned.rank)
        elif kind == "go":
            with self._go_cond:
                self._go[(event.go.job_id, event.go.seq)] = event.go
                self._go_cond.notify_all()
        elif kind == "peer_lost":
            lost = event.peer_lost
            if self._current_job == lost.job_id and self._running.is_set():
                self._abort_reason = lost.reason
                self._cancel.set()
            with self._go_cond:
                self._go_cond.notify_all()
        elif kind == "circuits_ready":
            cr = event.circuits_ready
            with self._go_cond:
                self._circuits[(cr.job_id, cr.seq, cr.slot)] = cr.error
                self._go_cond.notify_all()
        elif kind == "ended":
            job = self.jobs.get(event.ended.job_id)
            if job is not None:
                job.ended = event.ended.reason or "ended"
            with self._go_cond:
                self._go_cond.notify_all()
            if isinstance(self.link, StreamLink):
                self.link.forget_job(event.ended.job_id)  # its streams, threads and buffers

    def _heartbeat_loop(self) -> None:
        last_sync = time.monotonic()
        while not self._stop.wait(self.heartbeat_s):
            if time.monotonic() - last_sync > 10.0:
                self.sync_clock(4)
                last_sync = time.monotonic()
            p50, p99, _ = self.gate.percentiles()
            req = pb.HeartbeatRequest(
                node_id=self.node_id, session=self.session, clock_offset_s=self.clock.offset_s,
                clock_rtt_s=self.clock.rtt_s, collectives_done=self.done,
                collectives_failed=self.failed, gate_error_p50_s=p50, gate_error_p99_s=p99,
                bytes_sent=getattr(self.link, "sent_bytes", 0))
            try:
                reply = self._stub.Heartbeat(req, timeout=RPC_TIMEOUT_S)
                if reply.reregister:
                    self.register()
            except (grpc.RpcError, OddlError) as exc:
                logger.warning("%s: heartbeat failed: %s", self.node_id, exc)

    def _api_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._api, zmq.POLLIN)
        poller.register(self._results, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(100))
            if self._results in ready:
                while True:
                    try:
                        self._api.send_multipart(self._results.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            if self._api in ready:
                while True:
                    try:
                        frames = self._api.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_api(frames)

    def _on_api(self, frames: list[bytes]) -> None:
        ident = frames[0]
        op = frames[1] if len(frames) > 1 else b""
        if op == b"status":
            rid = _rid(frames[2]) if len(frames) > 2 else None
            self._api.send_multipart([ident, b"ok", json.dumps(
                {**self.status(), "rid": rid}).encode()])
        elif op == b"allreduce" and len(frames) == 4:
            try:
                header = json.loads(frames[2])
                if not isinstance(header, dict):
                    raise ValueError("header is not an object")
            except (ValueError, RecursionError) as exc:
                self._api.send_multipart([ident, b"error", _err("bad-request", str(exc), None)])
                return
            self.api_bytes += len(frames[3])
            self._work.put(_Request(ident, header, frames[3], shared="shm" in header))
        else:
            self._api.send_multipart([ident, b"error", _err(
                "bad-request", f"unknown request {op!r}; use agents.client.AgentClient",
                None)])

    def _work_loop(self) -> None:
        self._gate_thread_setup()  # small collectives gate their sends on this thread
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._results_addr)
        try:
            while not self._stop.is_set():
                req = self._work.get()
                if req is None:
                    return
                rid = req.header.get("rid")
                rid = rid if isinstance(rid, int) and not isinstance(rid, bool) else None
                try:
                    out = self.allreduce(req.header, req.payload)
                    meta = {"dtype": out.dtype.str, "shape": list(out.shape), "rid": rid}
                    if req.shared:  # the result is in the client's bucket already
                        reply = [req.ident, b"ok", json.dumps({**meta, "shm": True}).encode(),
                                 b""]
                    else:
                        reply = [req.ident, b"ok", json.dumps(meta).encode(), out.tobytes()]
                except CollectiveError as exc:
                    self.failed += 1
                    self.last_error = str(exc)
                    self.errors["lost data" if "lost data" in str(exc) else "collective"] += 1
                    reply = [req.ident, b"error", _err("collective", str(exc), rid)]
                except OddlError as exc:
                    self.failed += 1
                    self.last_error = str(exc)
                    self.errors["refused"] += 1
                    reply = [req.ident, b"error", _err("refused", str(exc), rid)]
                except Exception as exc:  # a defect: report it, keep serving the node
                    logger.exception("%s: all-reduce failed unexpectedly", self.node_id)
                    self.failed += 1
                    self.last_error = f"internal error: {exc!r}"
                    self.errors["internal"] += 1
                    reply = [req.ident, b"error", _err(
                        "internal", f"{self.node_id}: internal error ({exc!r}); the agent keeps "
                        "running — please report this with its log", rid)]
                push.send_multipart(reply)
        finally:
            push.close(0)

    # ---- collectives ------------------------------------------------------------------
    def _refresh_jobs(self) -> None:
        """Ask the controller which jobs this node is in (the event stream may lag a submit)."""
        try:
            jobs = self._stub.ListJobs(pb.ListJobsRequest(), timeout=RPC_TIMEOUT_S).jobs
            peers = {}
            if hasattr(self.link, "set_peers"):
                agents = self._stub.GetStatus(pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S).agents
                peers = {a.node_id: a.data_address for a in agents if a.data_address}
        except grpc.RpcError as exc:
            raise _rpc_error(exc, "listing jobs") from exc
        for job in jobs:
            if self.node_id not in job.nodes:
                continue
            known = self.jobs.get(job.id)
            if job.state != "running":
                if known is not None and not known.ended:
                    known.ended = job.reason or job.state
                continue
            if known is None:
                self.jobs[job.id] = AgentJob(job.id, tuple(job.nodes),
                                             list(job.nodes).index(self.node_id), job.network,
                                             job.collective)
        if peers and hasattr(self.link, "set_peers"):
            self.link.set_peers(peers)

    def _job_for(self, job_id: str | None, refreshed: bool = False) -> AgentJob:
        if not refreshed and ((job_id and job_id not in self.jobs)
                              or not any(not j.ended for j in self.jobs.values())):
            self._refresh_jobs()
            refreshed = True
        if job_id:
            job = self.jobs.get(job_id)
            if job is None:
                raise OperationRefused(f"{self.node_id} is not part of job {job_id!r}; known "
                                       f"jobs: {', '.join(self.jobs) or 'none'}")
            return job
        live = [j for j in self.jobs.values() if not j.ended]
        if not live:
            raise OperationRefused(f"no job is assigned to node {self.node_id}; submit one "
                                   "(`oddl jobs submit`) before calling allreduce")
        if len(live) > 1:
            raise OperationRefused(f"{self.node_id} takes part in jobs "
                                   f"{', '.join(j.id for j in live)}; name one")
        return live[0]

    def allreduce(self, header: dict[str, Any], payload: bytes) -> np.ndarray:
        """All-reduce one array (sum) with the job's collective and return the result."""
        self._called_at = time.time()
        req = localapi.parse_allreduce(header)
        try:
            if req.shm is not None:  # the bucket is in shared memory: run in place
                view = self._buckets.open_bucket(req.shm, req.nbytes)
                array = np.frombuffer(view, dtype=req.dtype).reshape(req.shape)
                self.shared_bytes += req.nbytes
            else:
                array = np.frombuffer(payload, dtype=req.dtype).reshape(req.shape)
        except ValueError as exc:
            raise OperationRefused(f"malformed allreduce request ({exc}); send dtype, shape and "
                                   "the array bytes") from exc
        job = self._job_for(req.job)
        if job.network == "ideal":
            seq = job.next_seq
            job.next_seq += 1
            return self._run_ideal(job, seq, array)
        if isinstance(self.link, StreamLink) and self.cfg.timing.standing_margin_ms > 0:
            standing = self._standing(job, array, req.timeout_s)
            if standing is not None:
                return standing
        t_ready = time.time()
        try:
            seq = self._ready(job, array)
        except OperationRefused:
            # the job may have ended and another started before the stream said so
            self._refresh_jobs()
            if not job.ended or req.job:
                raise
            job = self._job_for(None, refreshed=True)
            seq = self._ready(job, array)
        go = self._await_go(job, seq, req.timeout_s)
        if go.error:
            raise CollectiveError(go.error)
        t0_local = go.t0_ns / 1e9 - self.clock.offset_s
        logger.debug("%s seq %d: barrier %.2f ms, go arrived %.2f ms before t0", self.node_id,
                     seq, (time.time() - t_ready) * 1e3, (t0_local - time.time()) * 1e3)
        if go.schedule.collective != OPTINC and (not retunes(go.schedule)
                                                 or ends_where_it_starts(go.schedule)):
            # a schedule that leaves a laser elsewhere than it starts (WRHT, the parameter
            # server) goes through the barrier every time: the controller lays it out anew
            job.standing[(array.size, array.dtype.str)] = go.schedule
        return self._run(job, seq, array, go.schedule, t0_local)

    def _standing(self, job: AgentJob, array: np.ndarray, timeout_s: float
                  ) -> np.ndarray | None:
        """Agree with the peers on the next collective; run it on the standing schedule when
        every node holds one, else return None (the caller enters the controller's barrier
        with the same sequence number)."""
        if job.ended:
            raise OperationRefused(f"job {job.id} has ended: {job.ended}")
        key = (array.size, array.dtype.str)
        schedule = job.standing.get(key)
        seq = job.next_seq
        mine = Ready(self.node_id, array.size, array.dtype.str,
                     time.time() + self.clock.offset_s, schedule is not None)
        peers = [n for n in job.nodes if n != self.node_id]
        self._current_job = job.id
        self._abort_reason = ""
        self._cancel.clear()
        self._running.set()
        try:
            theirs = exchange(self.link, job.id, seq, mine, peers, time.time() + timeout_s,
                              self._cancel)
        except CollectiveError as exc:
            job.next_seq += 1  # the peers gave this collective up too
            error = exc
            if self._abort_reason:  # a peer was lost: say which, as the barrier does
                error = CollectiveError(f"{self.node_id}: collective {seq} of job {job.id} "
                                        f"ended: {self._abort_reason}")
            # the controller counts it, so a restarted peer continues after it
            self._report(job, seq, False, str(error), {})
            raise error from exc
        finally:
            self._running.clear()
        everyone, t0 = agree(mine, theirs, self.cfg.timing.standing_margin_ms / 1e3)
        if not everyone or schedule is None:
            return None
        job.next_seq += 1
        self.standing_runs += 1
        if retunes(schedule) and job.rank == 0:
            self._announce_standing(job, seq, t0, array, schedule)
        return self._run(job, seq, array, schedule, t0 - self.clock.offset_s)

    def _announce_standing(self, job: AgentJob, seq: int, t0: float, array: np.ndarray,
                           schedule: pb.Schedule) -> None:
        """Tell the controller the agreed start of a standing collective that retunes, without
        waiting: its first retune is a slot away, and a refusal or a lost message fails the
        collective where the agents wait for the retune. Every node computes the same start,
        so one (rank 0) says it: four copies would cost the controller CPU at the moment the
        agents need it for their first sends."""
        req = pb.StartStandingRequest(node_id=self.node_id, job_id=job.id, seq=seq,
                                      t0_ns=round(t0 * 1e9), message_bytes=array.nbytes,
                                      itemsize=array.dtype.itemsize,
                                      schedule_sha256=schedule_sha256(schedule))
        self._send_async(self._stub.StartStanding, req, f"the start of collective {seq}")

    def _ready(self, job: AgentJob, array: np.ndarray) -> int:
        """Enter the barrier of the job's next collective; return its sequence number."""
        if job.ended:
            raise OperationRefused(f"job {job.id} has ended: {job.ended}")
        seq = job.next_seq
        req = pb.ReadyCollectiveRequest(node_id=self.node_id, job_id=job.id, seq=seq,
                                        shape=list(array.shape), dtype=array.dtype.str)
        try:
            self._stub.ReadyCollective(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise _rpc_error(exc, f"entering collective {seq} of job {job.id}") from exc
        self._pending_ready = req  # re-sent if the controller restarts before the start signal
        job.next_seq += 1
        return seq

    def _await_go(self, job: AgentJob, seq: int, timeout_s: float) -> pb.CollectiveGo:
        deadline = time.monotonic() + timeout_s
        with self._go_cond:
            while (job.id, seq) not in self._go:
                if job.ended:
                    raise CollectiveError(f"job {job.id} ended while waiting for collective "
                                          f"{seq}: {job.ended}")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    raise CollectiveError(
                        f"collective {seq} of job {job.id} did not start within {timeout_s:.0f} s: "
                        "not every node of the job called allreduce (check the other training "
                        "processes and `oddl status`)")
                self._go_cond.wait(min(remaining, 0.1))
            self._pending_ready = None
            return self._go.pop((job.id, seq))

    def _run(self, job: AgentJob, seq: int, array: np.ndarray, schedule: pb.Schedule,
             t0_local: float) -> np.ndarray:
        run = CollectiveRun(
            job_id=job.id, seq=seq, rank=job.rank, nodes=job.nodes,
            steps=tuple(_step_spec(s) for s in schedule.steps),
            slots=tuple(_slot_spec(s) for s in schedule.slots), t0_local=t0_local,
            network=job.network, receive_timeout_s=_receive_timeout(self.cfg, schedule),
            line_rate_bps=self.cfg.fabric.line_rate_gbps * 1e9)
        if t0_local > 0:
            self.starts.append((job.id, seq, self._called_at,
                                t0_local + first_data_start(schedule)))
        ok, error = True, ""
        self._current_job = job.id
        self._abort_reason = ""
        self._cancel.clear()
        self._running.set()
        try:
            if schedule.collective == OPTINC:
                device, bits = self._optinc_device(schedule)
                if self.device_link is None:
                    raise CollectiveError(f"{self.node_id}: optinc needs the emulated fabric "
                                          "(link = \"fabric\"); this testbed has direct links")
                out = run_optinc(run, array, self.device_link, self.gate, device, bits,
                                 cancel=self._cancel)
                if array.flags.writeable:
                    array[...] = out
            else:
                out = run_collective(run, array, self.link, self.gate, cancel=self._cancel,
                                     handoffs=self, inplace=array.flags.writeable,
                                     sender=self._sender)
            self.done += 1
            return out
        except CollectiveError as exc:
            ok, error = False, str(exc)
            job.standing.clear()  # the next collective resynchronises at the barrier
            if self._abort_reason:
                error = (f"{self.node_id}: collective {seq} of job {job.id} ended: "
                         f"{self._abort_reason}")
                raise CollectiveError(error) from exc
            raise
        finally:
            self._running.clear()
            for link in {id(self.link): self.link, id(self.device_link): self.device_link
                         }.values():
                if isinstance(link, DirectLink | FabricLink):
                    link.inbox.discard(job.id, seq)
            with self._go_cond:
                for key in [k for k in self._circuits if k[0] == job.id and k[1] <= seq]:
                    del self._circuits[key]
            self._report(job, seq, ok, error, run.stats)

    def _optinc_device(self, schedule: pb.Schedule) -> tuple[str, int]:
        """The OptINC device an optinc schedule uploads to (its id and level bits)."""
        target = next((c.dst for s in schedule.slots[:1] for c in s.circuits), "")
        dev = self.cfg.optinc_device(target or None)
        if dev is None:
            raise CollectiveError(f"{self.node_id}: the schedule uploads to OptINC device "
                                  f"{target!r}, which this agent's testbed file does not have; "
                                  "start the agent with the emulator host's resolved file")
        return dev.id, dev.bits

    # ---- hand-offs (agents.executor.Handoffs) ------------------------------------
    def wait_circuits(self, seq: int, slot: int, deadline: float) -> None:
        """Wait for the controller's word that the slot's retuned transmitters are locked."""
        key = (self._current_job, seq, slot)
        every = (self._current_job, seq, EVERY_SLOT)
        with self._go_cond:
            if every in self._circuits:
                key = every
            while key not in self._circuits:
                remaining = deadline - time.time()
                if self._cancel.is_set():
                    raise CollectiveError(f"{self.node_id}: collective {seq} was cancelled")
                if remaining <= 0 or self._stop.is_set():
                    raise CollectiveError(
                        f"{self.node_id}: the controller did not confirm the retune for slot "
                        f"{slot} of collective {seq} in time; see the controller log and "
                        "`oddl devices log`")
                self._go_cond.wait(min(remaining, 0.05))
                if every in self._circuits:
                    key = every
            error = self._circuits[key]
        if error:
            raise CollectiveError(f"{self.node_id}: slot {slot} of collective {seq}: {error}")

    def confirm(self, seq: int, slot: int, src: str) -> None:
        """Confirm a hand-off arrival to the controller at once, without waiting for the
        reply: the retune it releases is on the collective's critical path, so it does not
        queue behind the outcome reports."""
        req = pb.ConfirmDeliveryRequest(node_id=self.node_id, job_id=self._current_job,
                                        seq=seq, slot=slot, src=src)
        self._send_async(self._stub.ConfirmDelivery, req,
                         f"the arrival from {src} (collective {seq}, slot {slot})")

    def _send_async(self, method: Any, req: Any, what: str) -> None:
        """Send a one-way message to the controller now; log (not raise) a failure, which
        the collective then meets as a missing grant at its receive timeout."""
        def done(f: Any) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None:
                logger.warning("%s: could not send %s to the controller: %s", self.node_id,
                               what, exc.code() if isinstance(exc, grpc.RpcError) else exc)

        try:
            method.future(req, timeout=RPC_TIMEOUT_S).add_done_callback(done)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel is closed
            logger.warning("%s: could not send %s to the controller: %s", self.node_id, what,
                           exc)

    def _run_ideal(self, job: AgentJob, seq: int, array: np.ndarray) -> np.ndarray:
        key = (array.size, array.dtype.str)
        schedule = job.plans.get(key)
        if schedule is None:
            try:
                schedule = self._stub.GetSchedule(
                    pb.GetScheduleRequest(job_id=job.id,
                                          message_bytes=array.size * array.dtype.itemsize,
                                          itemsize=array.dtype.itemsize), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                raise _rpc_error(exc, f"fetching the plan of job {job.id}") from exc
            job.plans[key] = schedule
        return self._run(job, seq, array, schedule, 0.0)

    def _report(self, job: AgentJob, seq: int, ok: bool, error: str,
                stats: dict[str, float]) -> None:
        """Queue the outcome for the controller (sent off the collective's critical path)."""
        self._reports.put(pb.ReportCollectiveRequest(
            node_id=self.node_id, job_id=job.id, seq=seq, ok=ok, error=error,
            duration_s=stats.get("duration_s", 0.0),
            gate_error_max_s=stats.get("gate_error_max_s", 0.0)))

    def _report_loop(self) -> None:
        while True:
            req = self._reports.get()
            if req is None:
                return
            try:
                self._stub.ReportCollective(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                logger.warning("%s: could not report to the controller (seq %d): %s",
                               self.node_id, req.seq, exc.code() if hasattr(exc, "code") else exc)

    def _metric_state(self) -> Iterator[Any]:
        node = {"node": self.node_id}
        yield counter("oddl_agent_collectives_total", "Collectives run by this agent",
                      self.done, {**node, "outcome": "ok"},
                      counter("oddl_agent_collectives_total", "", self.failed,
                              {**node, "outcome": "failed"}))
        peers = None
        for peer, nbytes in sorted(getattr(self.link, "sent_by_peer", {}).items()):
            peers = counter("oddl_agent_bytes_sent_total", "Payload bytes sent, by circuit "
                            "destination", nbytes, {**node, "peer": peer}, peers)
        if peers is not None:
            yield peers
        kinds = None
        for kind, n in sorted(self.errors.items()):
            kinds = counter("oddl_agent_errors_total", "Errors by kind", n,
                            {**node, "kind": kind}, kinds)
        if kinds is not None:
            yield kinds
        yield counter("oddl_agent_misrouted_frames_total", "Frames that arrived at the wrong "
                      "node", self.misrouted, node)
        yield gauge("oddl_agent_clock_offset_seconds", "Controller minus agent clock",
                    self.clock.offset_s, node)
        if self.phy is not None:
            yield counter("oddl_agent_late_chunks_total", "Chunks that arrived after their "
                          "serialisation end on the emulated wire (this machine cannot carry "
                          "the emulated line rate)", self.phy.late, node)

    @property
    def data_path(self) -> str:
        """How this agent's collective data moves, in words."""
        if isinstance(self.link, StreamLink):
            where = "tcp streams on the emulated light" if self.phy else "tcp streams"
            return f"{where}, authenticated" if self.link.auth is not None else where
        if isinstance(self.link, FabricLink):
            return "relay through the fabric process"
        return "zeromq with curve"

    @property
    def misrouted(self) -> int:
        """Frames or chunks that arrived here although meant for another node."""
        if isinstance(self.link, StreamLink):
            return self.link.misrouted
        return self.link.inbox.misrouted

    def status(self) -> dict[str, Any]:
        """A JSON-friendly snapshot of this agent."""
        p50, p99, worst = self.gate.percentiles()
        return {"node": self.node_id, "session": self.session, "link": self.link_kind,
                "data_path": self.data_path,
                "clock_offset_s": self.clock.offset_s, "clock_rtt_s": self.clock.rtt_s,
                "gate_error_p50_s": p50, "gate_error_p99_s": p99, "gate_error_max_s": worst,
                "collectives_done": self.done, "collectives_failed": self.failed,
                "last_error": self.last_error, "jobs": sorted(self.jobs),
                "misrouted_frames": self.misrouted,
                "local_api_bytes": self.api_bytes, "shared_memory_bytes": self.shared_bytes,
                "gate_scheduling": self.gate_scheduling,
                "collectives_on_standing_schedules": self.standing_runs,
                "late_chunks": self.phy.late if self.phy else 0,
                "worst_late_s": self.phy.worst_late_s if self.phy else 0.0,
                "lost_on_wire": dict(self.phy.lost_by_reason) if self.phy else {},
                "gate_errors": self.gate.errors()[-2000:],
                "overruns": self.gate.overruns()[-2000:],
                "collective_starts": [list(x) for x in self.starts]}


def _stream_auth(cfg: TestbedConfig, node_id: str, security: Any) -> StreamAuth | None:
    """The nodes' CURVE keys for authenticated streams (secure mode), else None."""
    if security is None:
        return None
    peers = {n.id: security.curve_public(n.id) for n in cfg.nodes}
    keys = security.curve_keys(node_id)
    from common.revocation import read_revoked

    return StreamAuth(node_id, keys.secret, peers, revoked=set(read_revoked(security.root).keys))


def _light_phy(cfg: TestbedConfig, node_id: str) -> LightPhy | None:
    """The emulated physical layer on the emulator host's light table, or None when the
    frames go through the fabric process (`transport = "relay"`, or an emulator host that
    publishes no table). Every agent of a testbed must take the same path, so a table that
    cannot be opened is an error, not a quiet fallback."""
    if cfg.fabric.transport != "streams" or not cfg.fabric.light_table:
        return None
    try:
        table = LightTable.open(cfg.fabric.light_table)
    except (OSError, ValueError) as exc:
        raise OddlError(f"{node_id}: cannot open the emulator host's light table "
                        f"{cfg.fabric.light_table} ({exc}); run the agents on the emulator "
                        "host's machine with its resolved testbed file, or set [fabric] "
                        'transport = "relay" for agents elsewhere') from exc
    return LightPhy(table, [n.id for n in cfg.nodes], node_id,
                    cfg.fabric.line_rate_gbps * 1e9)


def _receive_timeout(cfg: TestbedConfig, schedule: pb.Schedule) -> float:
    """The testbed's receive timeout past each slot's end (the ideal network: past the last
    progress)."""
    del schedule
    return cfg.timing.receive_timeout_ms / 1e3


def _step_spec(s: pb.PlanStep) -> StepSpec:
    return StepSpec(s.op, tuple(s.src), tuple(s.dst), tuple(s.offset), tuple(s.length))


def _slot_spec(s: pb.Slot) -> SlotSpec:
    return SlotSpec(s.index, s.step, s.data_start_ns / 1e9, s.end_ns / 1e9,
                    tuple((c.src, c.dst) for c in s.circuits),
                    frozenset(c.src for c in s.circuits if c.retune))


def _err(kind: str, message: str, rid: int | None) -> bytes:
    return json.dumps({"kind": kind, "message": message, "rid": rid}).encode()


def _rid(raw: bytes) -> int | None:
    """The request id a client sent with a status request (echoed in the reply)."""
    try:
        return int(raw)
    except ValueError:
        return None


def _rpc_error(exc: grpc.RpcError, doing: str) -> OddlError:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED):
        return OperationRefused(f"{doing}: {detail}")
    from common.errors import ControllerUnavailable
    return ControllerUnavailable(f"{doing}: the controller did not answer ({code}: {detail}); "
                                 "is `oddl controller serve` running at that address?")
