"""The agent's link to the controller: registration, heartbeats, clock sync, the schedule
stream, the barrier, hand-off confirmations and outcome reports (all gRPC).

The schedule stream's start signals (`CollectiveGo`) and grants (`CircuitsReady`) are kept
here for the collective runner to wait on; job assignments, ends and lost peers go to a
listener (`StreamListener`). One-way messages on a collective's critical path (confirmations,
standing starts) are sent without waiting; outcome reports queue for their own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from oddl.agents.agent_jobs import AgentJob
from oddl.agents.clock import wall as wallclock
from oddl.agents.clock.offset_filter import ClockEstimate, ClockSample
from oddl.agents.clock.sync import ClockSync
from oddl.common import __version__
from oddl.common.config import TestbedConfig
from oddl.common.errors import CollectiveError, ControllerUnavailable, OddlError, OperationRefused
from oddl.protos import oddl_pb2 as pb
from oddl.protos import oddl_pb2_grpc as pb_grpc
from oddl.protos.schedule_wire import EVERY_SLOT

logger = logging.getLogger(__name__)

RPC_TIMEOUT_S = 5.0


class StreamListener(Protocol):
    """Who hears the schedule stream's job events."""

    def on_assigned(self, event: pb.JobAssigned) -> None:
        """This node was (re-)assigned to a job."""

    def on_ended(self, event: pb.JobEnded) -> None:
        """A job ended."""

    def on_peer_lost(self, event: pb.PeerLost) -> None:
        """A participant of a job stopped answering."""

    def on_trace(self, event: pb.TraceSwitch) -> None:
        """The controller switches the trace on or off (`oddl trace start|stop`)."""


class ControllerLink:
    """One node's gRPC link to the controller (see the module docstring)."""

    def __init__(self, cfg: TestbedConfig, node_id: str, controller: str, security: Any,
                 stop: threading.Event):
        self.node_id = node_id
        self.controller = controller
        self.stop = stop
        if security is not None:
            from oddl.common.security.tls import secure_channel, tls_channel_credentials

            self._channel = secure_channel(controller,
                                           tls_channel_credentials(security.agent_tls(node_id)))
        else:
            self._channel = grpc.insecure_channel(controller)
        self.stub = pb_grpc.ControllerStub(self._channel)
        self.session = ""
        self.instance = uuid.uuid4().hex
        """This agent process's id: the controller tells a restart from a re-registration."""
        self.heartbeat_s = 1.0
        self.sync = ClockSync(node_id, controller, cfg.timing.clock_skew_us, cfg.path,
                              self._rpc_clock_sample)
        self.pending_ready: pb.ReadyCollectiveRequest | None = None
        self.cond = threading.Condition()
        """Notified on every start signal, grant, job end and lost peer."""
        self._go: dict[tuple[str, int], pb.CollectiveGo] = {}
        self._circuits: dict[tuple[str, int, int], str] = {}
        self._reports: queue.Queue[pb.ReportCollectiveRequest | None] = queue.Queue()

    def close(self) -> None:
        """Wake the waiters and close the channel (set `stop` first)."""
        self._reports.put(None)
        self.sync.close()
        with self.cond:
            self.cond.notify_all()
        self._channel.close()

    # ---- registration and clock -------------------------------------------------------
    def register(self, data_address: str, local_api: str) -> None:
        """Announce this node to the controller (raises OperationRefused for unknown nodes)."""
        req = pb.RegisterAgentRequest(node_id=self.node_id, data_address=data_address,
                                      agent_version=__version__, local_api=local_api,
                                      instance=self.instance)
        try:
            reply = self.stub.RegisterAgent(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise rpc_error(exc, f"registering {self.node_id} with {self.controller}") from exc
        self.session = reply.session
        self.heartbeat_s = reply.heartbeat_interval_s or 1.0
        self.sync.use_port(reply.clock_port)
        logger.info("%s registered with %s (session %s)", self.node_id, self.controller,
                    self.session)
        pending = self.pending_ready
        if pending is not None:
            # the controller may have restarted and lost the barrier: enter it again
            try:
                self.stub.ReadyCollective(pending, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                logger.warning("%s: re-entering collective %d failed: %s", self.node_id,
                               pending.seq, _code(exc))

    @property
    def clock(self) -> ClockEstimate:
        """The controller-minus-agent clock estimate now, with its error bound."""
        return self.sync.estimate()

    def sync_clock(self, samples: int = 8) -> ClockEstimate:
        """Take a burst of clock samples and check the estimate against the budget."""
        est = self.sync.burst(samples)
        self.sync.check_budget()
        return est

    def _rpc_clock_sample(self) -> ClockSample | None:
        """One clock sample through the SyncClock RPC (the fallback), or None."""
        t1 = wallclock.now_ns()
        try:
            r = self.stub.SyncClock(pb.SyncClockRequest(node_id=self.node_id, agent_send_ns=t1),
                                    timeout=1.0)
        except grpc.RpcError:
            return None
        except ValueError:  # `close` closed the channel: no sample, as when it fails
            return None
        return ClockSample(t1, r.controller_receive_ns, r.controller_send_ns,
                           wallclock.now_ns())

    # ---- threads ----------------------------------------------------------------------
    def watch_loop(self, listener: StreamListener, reregister: Callable[[], None]) -> None:
        """Follow the schedule stream until `stop`; reconnect (and re-register) when it ends."""
        backoff = 0.2
        while not self.stop.is_set():
            try:
                stream = self.stub.WatchSchedule(
                    pb.WatchScheduleRequest(node_id=self.node_id, session=self.session))
                for event in stream:
                    backoff = 0.2
                    self._on_event(event, listener)
            except grpc.RpcError as exc:
                if self.stop.is_set():
                    return
                logger.warning("%s: schedule stream ended (%s); reconnecting", self.node_id,
                               _code(exc))
            except ValueError:  # `close` closed the channel under this call
                if self.stop.is_set():
                    return
                raise
            if self.stop.wait(backoff):
                return
            backoff = min(backoff * 2, 2.0)
            try:
                reregister()
            except OddlError as exc:
                logger.warning("%s: re-register failed: %s", self.node_id, exc)
            except ValueError:
                if self.stop.is_set():
                    return
                raise

    def _on_event(self, event: pb.ScheduleEvent, listener: StreamListener) -> None:
        kind = event.WhichOneof("event")
        if kind == "assigned":
            listener.on_assigned(event.assigned)
        elif kind == "go":
            with self.cond:
                self._go[(event.go.job_id, event.go.seq)] = event.go
        elif kind == "circuits_ready":
            cr = event.circuits_ready
            with self.cond:
                self._circuits[(cr.job_id, cr.seq, cr.slot)] = cr.error
        elif kind == "peer_lost":
            listener.on_peer_lost(event.peer_lost)
        elif kind == "ended":
            listener.on_ended(event.ended)
        elif kind == "trace":
            listener.on_trace(event.trace)
        with self.cond:
            self.cond.notify_all()

    def heartbeat_loop(self, counters: Callable[[], dict[str, Any]],
                       reregister: Callable[[], None]) -> None:
        """Send a heartbeat with `counters()` every interval until `stop`, each after a burst
        of clock samples, and re-register when the controller asks."""
        while not self.stop.wait(self.heartbeat_s):
            clock = self.sync_clock(4)
            req = pb.HeartbeatRequest(node_id=self.node_id, session=self.session,
                                      clock_offset_s=clock.offset_s, clock_rtt_s=clock.rtt_s,
                                      clock_error_bound_s=clock.error_bound_s,
                                      sent_ns=sent_ns(clock.offset_s, clock.error_bound_s),
                                      **counters())
            try:
                reply = self.stub.Heartbeat(req, timeout=RPC_TIMEOUT_S)
                if reply.reregister:
                    reregister()
            except (grpc.RpcError, OddlError) as exc:
                logger.warning("%s: heartbeat failed: %s", self.node_id, exc)
            except ValueError:  # `close` closed the channel under this beat
                if self.stop.is_set():
                    return
                raise

    def report(self, req: pb.ReportCollectiveRequest) -> None:
        """Queue a collective's outcome (sent off the collective's critical path)."""
        self._reports.put(req)

    def report_loop(self) -> None:
        """Send the queued outcome reports until `close`."""
        while True:
            req = self._reports.get()
            if req is None:
                return
            try:
                self.stub.ReportCollective(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                logger.warning("%s: could not report to the controller (seq %d): %s",
                               self.node_id, req.seq, _code(exc))
            except ValueError:  # `close` closed the channel under reports still queued
                logger.info("%s: the agent stopped with %d outcome reports unsent",
                            self.node_id, self._reports.qsize() + 1)
                return

    # ---- the barrier and the grants ---------------------------------------------------
    def ready(self, req: pb.ReadyCollectiveRequest) -> None:
        """Enter a collective's barrier (re-entered after a re-registration until its start)."""
        try:
            self.stub.ReadyCollective(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise rpc_error(exc, f"entering collective {req.seq} of job {req.job_id}") from exc
        self.pending_ready = req  # re-sent if the controller restarts before the start signal

    def await_go(self, job: AgentJob, seq: int, timeout_s: float) -> pb.CollectiveGo:
        """The start signal of collective `seq` of `job`; CollectiveError when the job ends
        or not every node called allreduce within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while (job.id, seq) not in self._go:
                if job.ended:
                    raise CollectiveError(f"job {job.id} ended while waiting for collective "
                                          f"{seq}: {job.ended}")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.stop.is_set():
                    raise CollectiveError(
                        f"collective {seq} of job {job.id} did not start within {timeout_s:.0f} s: "
                        "not every node of the job called allreduce (check the other training "
                        "processes and `oddl status`)")
                self.cond.wait(min(remaining, 0.1))
            self.pending_ready = None
            return self._go.pop((job.id, seq))

    def wait_circuits(self, job_id: str, seq: int, slot: int, deadline: float,
                      cancel: threading.Event) -> None:
        """Wait for the controller's word that the slot's retuned transmitters are locked."""
        key, every = (job_id, seq, slot), (job_id, seq, EVERY_SLOT)
        with self.cond:
            while every not in self._circuits and key not in self._circuits:
                remaining = deadline - wallclock.now()
                if cancel.is_set():
                    raise CollectiveError(f"{self.node_id}: collective {seq} was cancelled")
                if remaining <= 0 or self.stop.is_set():
                    raise CollectiveError(
                        f"{self.node_id}: the controller did not confirm the retune for slot "
                        f"{slot} of collective {seq} in time; see the controller log and "
                        "`oddl devices log`")
                self.cond.wait(min(remaining, 0.05))
            error = self._circuits[every if every in self._circuits else key]
        if error:
            raise CollectiveError(f"{self.node_id}: slot {slot} of collective {seq}: {error}")

    def forget_circuits(self, job_id: str, seq: int) -> None:
        """Drop the grants of a job's collectives up to `seq` (they are over)."""
        with self.cond:
            for key in [k for k in self._circuits if k[0] == job_id and k[1] <= seq]:
                del self._circuits[key]

    # ---- one-way messages -------------------------------------------------------------
    def confirm(self, job_id: str, seq: int, slot: int, src: str) -> None:
        """Confirm a hand-off arrival to the controller at once, without waiting for the
        reply: the retune it releases is on the collective's critical path, so it does not
        queue behind the outcome reports."""
        req = pb.ConfirmDeliveryRequest(node_id=self.node_id, job_id=job_id, seq=seq,
                                        slot=slot, src=src)
        self.send_async(self.stub.ConfirmDelivery, req,
                        f"the arrival from {src} (collective {seq}, slot {slot})")

    def start_standing(self, req: pb.StartStandingRequest) -> None:
        """Announce the agreed start of a standing collective that retunes, without waiting."""
        self.send_async(self.stub.StartStanding, req, f"the start of collective {req.seq}")

    def send_async(self, method: Any, req: Any, what: str) -> None:
        """Send a one-way message to the controller now; log (not raise) a failure, which
        the collective then meets as a missing grant at its receive timeout."""
        def done(f: Any) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None:
                logger.warning("%s: could not send %s to the controller: %s", self.node_id,
                               what, _code(exc))

        try:
            method.future(req, timeout=RPC_TIMEOUT_S).add_done_callback(done)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel is closed
            logger.warning("%s: could not send %s to the controller: %s", self.node_id, what,
                           exc)

    # ---- questions --------------------------------------------------------------------
    def list_jobs(self, with_peers: bool) -> tuple[list[pb.Job], dict[str, str]]:
        """The controller's jobs and (`with_peers`) the registered agents' data addresses."""
        try:
            jobs = list(self.stub.ListJobs(pb.ListJobsRequest(), timeout=RPC_TIMEOUT_S).jobs)
            peers = {}
            if with_peers:
                agents = self.stub.GetStatus(pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S).agents
                peers = {a.node_id: a.data_address for a in agents if a.data_address}
        except grpc.RpcError as exc:
            raise rpc_error(exc, "listing jobs") from exc
        return jobs, peers

    def request_flow(self, job_id: str, dst: str, message_bytes: int, tag: int,
                     timeout_s: float, lead_s: float = 0.0) -> pb.FlowGrant:
        """The grant of a point-to-point flow to `dst` (the controller may retune first),
        its window opening no sooner than `lead_s` after the grant."""
        try:
            return self.stub.RequestFlow(pb.RequestFlowRequest(
                node_id=self.node_id, job_id=job_id, dst=dst, message_bytes=message_bytes,
                tag=tag, lead_us=round(lead_s * 1e6)), timeout=max(timeout_s, RPC_TIMEOUT_S))
        except grpc.RpcError as exc:
            raise rpc_error(exc, f"asking for a flow to {dst} (job {job_id})") from exc

    def get_schedule(self, job_id: str, message_bytes: int, itemsize: int,
                     kind: str = "all_reduce", root: int = 0) -> pb.Schedule:
        """The schedule (and plan) of a job's collective `kind` of `message_bytes`."""
        try:
            return self.stub.GetSchedule(pb.GetScheduleRequest(
                job_id=job_id, message_bytes=message_bytes, itemsize=itemsize, kind=kind,
                root=root),
                timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise rpc_error(exc, f"fetching the plan of job {job_id}") from exc


def _code(exc: BaseException) -> Any:
    """An RPC error's status code (or the error)."""
    return exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else exc


def rpc_error(exc: grpc.RpcError, doing: str) -> OddlError:
    """The typed error for a failed RPC: refused (the controller said no) or unavailable."""
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED):
        return OperationRefused(f"{doing}: {detail}")
    return ControllerUnavailable(f"{doing}: the controller did not answer ({code}: {detail}); "
                                 "is `oddl controller serve` running at that address?")


def sent_ns(offset_s: float, error_bound_s: float) -> int:
    """Now on the controller's clock as this agent estimates it (a heartbeat's `sent_ns`);
    0 while the estimate is unbounded (the controller then leaves the beat out of its check
    on how late it reads heartbeats, decision record 0034)."""
    if not error_bound_s < float("inf"):
        return 0
    return wallclock.now_ns() + round(offset_s * 1e9)
