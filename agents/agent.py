"""The node agent: one long-lived process per training host (`oddl agent serve`).

It registers with the controller over gRPC, keeps its clock offset to the controller, watches
the schedule stream (job assignments, collective start signals, job ends), serves a local API
to the training process (`allreduce(array) -> array`, see `oddl.agents.client.agent_client`), and runs each
collective through its data-plane link, gating sends into their slots locally: no round trip
to the controller per flow, one barrier entry per collective.

`Agent` is the composition of three parts, one job each: the link to the controller
(`oddl.agents.controller_link`), the local API side (`oddl.agents.local_api.server`) and the collective
runner (`oddl.agents.collective.runner`), over the data links (`oddl.agents.links.choice`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zmq

from oddl.agents.agent_jobs import JobTable
from oddl.agents.clock import wall as wallclock
from oddl.agents.clock.excursion import Excursion
from oddl.agents.clock.offset_filter import ClockEstimate
from oddl.agents.collective.lease import LeasedCalls, lease
from oddl.agents.collective.runner import CollectiveRunner
from oddl.agents.controller_link import ControllerLink
from oddl.agents.links.choice import open_links
from oddl.agents.links.line_rate import LineRateMeter, rate_warning
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import BucketRegistry, request_array
from oddl.agents.local_api.server import FAILURE_KINDS, LocalServer
from oddl.agents.point_to_point import Flows
from oddl.agents.slot_gate import SlotGate
from oddl.agents.trace import switch as trace_switch
from oddl.common.collective_kinds import P2P, check_on_job
from oddl.common.config import TestbedConfig
from oddl.common.errors import ControllerUnavailable, OperationRefused
from oddl.common.listen_errors import ListenOrigin, listen_error
from oddl.common.metrics import Metrics, counter, gauge
from oddl.common.tracing import TRACE
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)



def _data_origin(cfg: TestbedConfig, node_id: str, data_bind: str | None) -> ListenOrigin:
    """Where the agent's data address comes from: --data-bind, or the node's entry."""
    who = f"agent {node_id}"
    if data_bind:
        return ListenOrigin.option(who, "--data-bind")
    return ListenOrigin(who, f"[[nodes]] host of node {node_id} in {cfg.path}",
                        f"[[nodes]] data_port of node {node_id} in {cfg.path}",
                        f"[[nodes]] host/data_port of node {node_id} in {cfg.path}")


START_PATIENCE_S = 60.0
"""How long a starting agent keeps asking a controller that does not answer its registration."""


class Agent:
    """The agent of one node; `start()` it, then `close()` it."""

    def __init__(self, cfg: TestbedConfig, node_id: str, controller: str,
                 local_api: str = localapi.AUTO, data_bind: str | None = None,
                 local_api_group: str | None = None):
        node = cfg.node(node_id)  # unknown node: ConfigError naming the known ids
        shift = wallclock.shift_from_env()  # ODDL_CLOCK_SHIFT_US: rehearsals and tests
        if shift:
            logger.warning("%s: this agent's clock is shifted by %+.0f µs (%s, for rehearsals "
                           "and tests)", node_id, shift * 1e6, wallclock.SHIFT_ENV)
        self.cfg = cfg
        self.node_id = node_id
        self.controller = controller
        self.metrics = Metrics("oddl_agent")
        self.metrics.add_state(self._metric_state)
        self.errors: Counter[str] = Counter()
        self.gate = SlotGate(on_release=self.metrics.gate_error.observe,
                             on_overrun=self.metrics.overrun.observe)
        self.failed = 0
        self.leased = LeasedCalls()
        """What ranks ran on their leased data path (decision record 0040), as reported."""
        self.last_error = ""
        self.gate_scheduling = "normal"
        self.rate_excursion = Excursion()
        self._stop = threading.Event()
        security = None
        if cfg.security.enabled:
            from oddl.common.security.files import SecurityFiles

            security = SecurityFiles.load(cfg.security.certs)
        self.ctl = ControllerLink(cfg, node_id, controller, security, self._stop)
        self.link_kind = cfg.fabric.link
        bind = data_bind or f"{node.host}:{node.data_port}"
        try:
            self.links = open_links(cfg, node_id, bind, security)
        except (OSError, zmq.ZMQError) as exc:
            self.ctl.close()
            raise listen_error(exc.errno, exc.strerror or str(exc), bind,
                               _data_origin(cfg, node_id, data_bind)) from None
        except BaseException:
            self.ctl.close()
            raise
        self.jobs = JobTable(node_id)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"{node_id}-send",
                                          initializer=self._gate_thread_setup)
        self.buckets = BucketRegistry()
        """The clients' shared-memory buckets, handed over as descriptors."""
        self.runner = CollectiveRunner(cfg, node_id, self.ctl, self.jobs, self.links, self.gate,
                                       self._sender, self.buckets)
        self.flows = Flows(node_id, self.ctl, self.links.link, self.gate,
                           (cfg.timing.slot_margin_us + cfg.timing.clock_skew_us) / 1e6)
        self.local = LocalServer(node_id, local_api, local_api_group, self._stop, self.buckets)
        self.local_api = self.local.address
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
        return self.links.address

    @property
    def clock(self) -> ClockEstimate:
        """The controller-minus-agent clock estimate."""
        return self.ctl.clock

    @property
    def session(self) -> str:
        """The controller's session for this agent (changes when it re-registers)."""
        return self.ctl.session

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Register, synchronise clocks and start the agent's threads."""
        self.register()
        self.sync_clock()
        self._sender.submit(lambda: None)  # start the gate thread (and set its scheduling)
        for target, name in ((self._watch_loop, "watch"), (self._heartbeat_loop, "heartbeat"),
                             (self._api_loop, "local-api"), (self._work_loop, "collectives"),
                             (self._receive_loop, "receives"),
                             (self.local.bucket_loop, "buckets"),
                             (self.ctl.report_loop, "reports")):
            t = threading.Thread(target=target, name=f"{self.node_id}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop every thread and release sockets and the channel."""
        self.metrics.close()
        self._stop.set()
        self.local.wake()
        self.ctl.close()
        for t in self._threads:
            t.join(timeout=3)
        self._sender.shutdown(wait=False, cancel_futures=True)
        self.links.close()
        self.runner.close()
        self.local.close()

    def register(self, patience_s: float = START_PATIENCE_S) -> None:
        """Announce this node to the controller (OperationRefused for an unknown node). A
        controller that does not answer in time — busy with hundreds of registrations, or
        not up yet — is asked again after a growing pause for `patience_s`, each retry
        logged; then ControllerUnavailable, naming the address."""
        deadline = time.monotonic() + patience_s
        pause = 0.5
        while True:
            try:
                self.ctl.register(self.data_address, self.local_api)
                return
            except ControllerUnavailable as exc:
                if self._stop.is_set() or time.monotonic() + pause > deadline:
                    raise
                logger.warning("%s; asking again in %.1f s", exc, pause)
                self._stop.wait(pause)
                pause = min(2 * pause, 5.0)

    def sync_clock(self, samples: int = 8) -> ClockEstimate:
        """Estimate the controller-minus-agent clock offset from a few exchanges."""
        return self.ctl.sync_clock(samples)

    def serve_call(self, header: dict[str, Any], payload: bytes) -> np.ndarray:
        """Run one call of a training process: a collective of its job (`CollectiveRunner`),
        or a send or a receive (`oddl.agents.point_to_point`); its result."""
        if header.get("kind") in P2P:
            req = localapi.parse_allreduce(header)
            job = self.runner.job_for(req.job)
            check_on_job(req.call, req.dtype, 1, len(job.nodes), job.collective, req.world)
            array = request_array(req, payload, self.buckets, self.runner.bucket_files)
            header["resolved"] = {"job": job.id}
            return self.flows.serve(req, array, job, list(self.jobs.jobs.values()),
                                    header["resolved"])
        return self.runner.serve_collective(header, payload)

    # ---- threads ----------------------------------------------------------------------
    def _watch_loop(self) -> None:
        self.ctl.watch_loop(self, self.register)

    def _heartbeat_loop(self) -> None:
        self.ctl.heartbeat_loop(self._heartbeat_counters, self.register)

    def _api_loop(self) -> None:
        self.local.api_loop(self.status, self.runner.void)

    def _work_loop(self) -> None:
        self._gate_thread_setup()  # small collectives gate their sends on this thread
        self.local.work_loop(self.serve_call, self._failed, self._world)

    def _receive_loop(self) -> None:
        self.local.receive_loop(self.serve_call, self._failed)

    def _world(self, header: dict[str, Any]) -> dict[str, Any]:
        """The job a call naming `header["job"]` (or none) runs on: its id, this node's rank
        and its nodes (the client lays out the work buffer of a collective by them)."""
        job_id = header.get("job")
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise OperationRefused("malformed world request: job is not a job id")
        job = self.runner.job_for(job_id)
        world = {"job": job.id, "rank": job.rank, "nodes": list(job.nodes),
                 "last_step": job.last_step}
        if "lease" in header:  # the rank asks to move its own bytes (decision record 0040)
            world["lease"] = lease(job, self.links, header["lease"], self.ctl.get_schedule,
                                   self.cfg.fabric.line_rate_gbps * 1e9)
        if "report" in header:  # what a rank ran on its leased path
            self.leased.report(header["report"])
        return world

    def _heartbeat_counters(self) -> dict[str, Any]:
        p50, p99, _ = self.gate.percentiles()
        self.check_line_rate()
        in_ranks, failed_in_ranks, _ = self.leased.totals()
        return {"collectives_done": self.runner.done + in_ranks,
                "collectives_failed": self.failed + failed_in_ranks,
                "gate_error_p50_s": p50, "gate_error_p99_s": p99,
                "bytes_sent": getattr(self.links.link, "sent_bytes", 0),
                "measured_line_rate_gbps": (self.measured_line_rate_bps() or 0.0) / 1e9}

    def measured_line_rate_bps(self) -> float | None:
        """What the direct links carry, from the chunks received (None: not measured yet,
        or not direct TCP streams)."""
        meter = getattr(self.links.link, "rate", None)
        if self.link_kind != "direct" or not isinstance(meter, LineRateMeter):
            return None
        return meter.measured_bps()

    def check_line_rate(self) -> None:
        """Warn (once per excursion) when the links carry well below `line_rate_gbps`."""
        message = rate_warning(self.node_id, self.measured_line_rate_bps(),
                               self.cfg.fabric.line_rate_gbps, self.cfg.path)
        if self.rate_excursion.check(message is not None, time.monotonic()):
            logger.warning("%s", message)

    def _failed(self, kind: str, message: str) -> None:
        self.failed += 1
        self.last_error = message
        self.errors[kind] += 1

    # ---- the schedule stream (oddl.agents.controller_link.StreamListener) ------------------
    def on_assigned(self, event: pb.JobAssigned) -> None:
        """This node was (re-)assigned to a job: note it and its peers' addresses. Peers that
        were declared down are back: streams to their old selves go before new calls start."""
        back = self.jobs.assigned(event)
        self.links.set_peers(dict(event.peers))
        for peer in back:
            self.links.reset_peer(peer)
        if back:
            logger.info("%s: %s back in job %s", self.node_id, ", ".join(back), event.job.id)
            self.jobs.clear_down(event.job.id)

    def on_ended(self, event: pb.JobEnded) -> None:
        """A job ended: its collective in flight ends (a call that named no job moves to the
        live one), its streams go."""
        self.jobs.ended(event.job_id, event.reason)
        self.runner.abort(event.job_id, f"the job ended ({event.reason or 'no reason given'})")
        self.links.forget(event.job_id)

    def on_trace(self, event: pb.TraceSwitch) -> None:
        """Start or stop recording as the controller says (`oddl.agents.trace.switch`)."""
        trace_switch.on_switch(self.node_id, self.cfg, lambda: self.clock, event,
                               lambda: self.ctl.sync.offset_ns)

    def on_peer_lost(self, event: pb.PeerLost) -> None:
        """A peer of a job stopped answering: its collective in flight ends here too, and
        new ones wait for it to come back."""
        for node, reason in ((event.node_id, event.reason), *event.also.items()):
            self.jobs.peer_lost(event.job_id, node, reason)
        self.runner.abort(event.job_id, event.reason)

    # ---- what it reports ----------------------------------------------------------------
    def _metric_state(self) -> Iterator[Any]:
        node = {"node": self.node_id}
        yield counter("oddl_agent_collectives_total", "Collectives run by this agent",
                      self.runner.done, {**node, "outcome": "ok"},
                      counter("oddl_agent_collectives_total", "", self.failed,
                              {**node, "outcome": "failed"}))
        peers = None
        for peer, nbytes in sorted(getattr(self.links.link, "sent_by_peer", {}).items()):
            peers = counter("oddl_agent_bytes_sent_total", "Payload bytes sent, by circuit "
                            "destination", nbytes, {**node, "peer": peer}, peers)
        if peers is not None:
            yield peers
        kinds = None
        for kind, n in sorted({**dict.fromkeys(FAILURE_KINDS, 0), **self.errors}.items()):
            kinds = counter("oddl_agent_errors_total", "Errors by kind", n,
                            {**node, "kind": kind}, kinds)
        if kinds is not None:
            yield kinds
        yield counter("oddl_agent_misrouted_frames_total", "Frames that arrived at the wrong "
                      "node", self.links.misrouted, node)
        clock = self.clock
        yield gauge("oddl_agent_clock_offset_seconds", "Controller minus agent clock",
                    clock.offset_s, node)
        yield gauge("oddl_agent_clock_error_bound_seconds", "The clock offset is within this "
                    "of the truth (+Inf before the first sample)", clock.error_bound_s, node)
        yield gauge("oddl_agent_clock_skew_budget_seconds", "The testbed's clock skew budget "
                    "(timing.clock_skew_us) the error bound must stay within",
                    self.cfg.timing.clock_skew_us / 1e6, node)
        rate = self.measured_line_rate_bps()
        if rate is not None:
            yield gauge("oddl_agent_link_rate_bits_per_second", "What the direct links carry, "
                        "measured from the chunks received", rate, node)
        phy = self.links.phy
        if phy is not None:
            yield counter("oddl_agent_late_chunks_total", "Chunks that arrived after their "
                          "serialisation end on the emulated wire (this machine cannot carry "
                          "the emulated line rate)", phy.late, node)

    def _clock_status(self) -> dict[str, Any]:
        clock = self.clock
        return {"clock_offset_s": clock.offset_s, "clock_rtt_s": clock.rtt_s,
                "clock_error_bound_s": clock.error_bound_s if clock.known else None,
                "clock_skew_budget_s": self.cfg.timing.clock_skew_us / 1e6,
                "clock_samples_via": self.ctl.sync.via, "clock_shift_s": wallclock.shift_s()}

    def status(self) -> dict[str, Any]:
        """A JSON-friendly snapshot of this agent."""
        p50, p99, worst = self.gate.percentiles()
        phy, runner = self.links.phy, self.runner
        return {"node": self.node_id, "session": self.session, "link": self.link_kind,
                "data_path": self.links.data_path,
                **self._clock_status(),
                "line_rate_gbps": self.cfg.fabric.line_rate_gbps,
                "measured_line_rate_gbps": _gbps(self.measured_line_rate_bps()),
                "gate_error_p50_s": p50, "gate_error_p99_s": p99, "gate_error_max_s": worst,
                "collectives_done": runner.done, "collectives_failed": self.failed,
                "collectives_in_ranks": dict(zip(("done", "failed", "bytes"),
                                                 self.leased.totals(), strict=True)),
                "flows_sent": self.flows.sent, "flows_received": self.flows.received,
                "flows_that_retuned": self.flows.retuned,
                "flows_missed_windows": self.flows.missed_windows,
                "last_error": self.last_error, "jobs": sorted(self.jobs.jobs),
                "misrouted_frames": self.links.misrouted,
                "local_api_bytes": self.local.api_bytes,
                "call_in_flight": self.local.in_flight(), "calls_voided": self.local.voided,
                "shared_memory_bytes": runner.shared_bytes,
                "buckets_mapped": {str(pid): n for pid, n in self.buckets.holders().items()},
                "gate_scheduling": self.gate_scheduling, "tracing": TRACE.on,
                "collectives_on_standing_schedules": runner.standing_runs,
                "late_chunks": phy.late if phy else 0,
                "worst_late_s": phy.worst_late_s if phy else 0.0,
                "lost_on_wire": dict(phy.lost_by_reason) if phy else {},
                "gate_errors": self.gate.errors()[-2000:],
                "overruns": self.gate.overruns()[-2000:],
                "collective_starts": [list(x) for x in runner.starts]}


def _gbps(bps: float | None) -> float | None:
    return None if bps is None else bps / 1e9
