"""The agent's collective runner: one all-reduce from the training process's call to its
outcome report.

It picks the job, starts the collective — through the controller's barrier (`ReadyCollective`,
then the start signal on the schedule stream) or, when every node holds the bucket's standing
schedule, by agreeing the start with the peers (`oddl.agents.collective.standing`) — decodes the schedule
(`oddl.protos.schedule_wire`) and runs it (`oddl.agents.collective.plan_run`, `oddl.agents.collective.optinc`) with this node's
hand-offs: it waits for the controller's grants and confirms arrivals through the controller
link. A lost peer cancels the collective in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Executor
from typing import Any

import numpy as np

from oddl.agents.agent_jobs import AgentJob, JobTable
from oddl.agents.clock import wall as wallclock
from oddl.agents.collective import outcome
from oddl.agents.collective.context import CollectiveRun
from oddl.agents.collective.execute import Execution, execute
from oddl.agents.collective.lease import schedule_for
from oddl.agents.collective.standing import Ready, agree, exchange, start_request
from oddl.agents.collective.void import VoidWindow
from oddl.agents.controller_link import ControllerLink
from oddl.agents.links.choice import DataLinks
from oddl.agents.links.stream_wire import PeerAhead, PeerGaveUp
from oddl.agents.links.streams import StreamLink
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import BucketRegistry, request_array
from oddl.agents.slot_gate import SlotGate
from oddl.common.call_marks import MARKS
from oddl.common.collective_kinds import ALL_REDUCE, check_on_job
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import CollectiveError, OperationRefused, PeerDown, StepMismatch
from oddl.common.pairing import refusal
from oddl.common.shm import BucketMaps
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import (
    decode_schedule,
    ends_where_it_starts,
    first_data_start,
    retunes,
)

logger = logging.getLogger(__name__)


class CollectiveRunner:
    """Runs the all-reduces of one node (see the module docstring)."""

    def __init__(self, cfg: TestbedConfig, node_id: str, ctl: ControllerLink, jobs: JobTable,
                 links: DataLinks, gate: SlotGate, sender: Executor,
                 buckets: BucketRegistry | None = None):
        self.cfg = cfg
        self.node_id = node_id
        self.ctl = ctl
        self.jobs = jobs
        self.links = links
        self.gate = gate
        self.sender = sender
        self.buckets = buckets or BucketRegistry()
        """The buckets clients handed over as descriptors (`oddl.agents.local_api.bucket_server`)."""
        self.bucket_files = BucketMaps()
        """Maps of the clients' named bucket files (the fallback, `oddl.common.shm`)."""
        self.done = 0
        self.shared_bytes = 0
        self.standing_runs = 0
        self.starts: deque[tuple[str, int, float, float]] = deque(maxlen=2000)
        """Per gated collective (job, seq, call's arrival, first slot's start), local clock: the
        control overhead is the first slot's start minus the last node's arrival."""
        self._called_at = 0.0
        self._data_moved = False
        """The call in flight is past its start into its data phase (never run twice)."""
        self._current_job = ""
        self._step = 0
        self._call: tuple[str, str, int] = (ALL_REDUCE, "sum", 0)
        """(kind, op, root) of the call in flight."""
        self._cancel = threading.Event()
        self._running = threading.Event()
        self._abort_reason = ""
        self.voids = VoidWindow(self._cancel)
        """Whether the call in flight may still be voided, and why it was (decision 0033)."""

    def close(self) -> None:
        """Release the shared-memory buckets."""
        self.buckets.close()
        self.bucket_files.close()

    def abort(self, job_id: str, reason: str) -> None:
        """End the collective in flight of `job_id` (a peer was lost), with `reason`."""
        if self._current_job == job_id and self._running.is_set():
            self._abort_reason = reason
            self._cancel.set()

    def void(self, reason: str) -> bool:
        """Void the call in flight (its training process is gone), if it still waits for its
        peers: it fails with `reason` as a collective given up in the ready exchange does (its
        number used up, the failure reported; decision record 0033). False if it was past."""
        return self.voids.void(f"{self.node_id}: {reason}")

    # ---- the call ---------------------------------------------------------------------
    def serve_collective(self, header: dict[str, Any], payload: bytes) -> np.ndarray:
        """Run one call (an all-reduce, or another kind or op) on its job; its result."""
        self.voids.open()
        try:
            return self._serve_collective(header, payload)
        finally:
            self.voids.close()

    def _serve_collective(self, header: dict[str, Any], payload: bytes) -> np.ndarray:
        self._called_at = wallclock.now()
        req = localapi.parse_allreduce(header)
        array = request_array(req, payload, self.buckets, self.bucket_files)
        self.shared_bytes += req.nbytes if req.bucket is not None or req.shm is not None else 0
        job = self._job_for(req.job)
        self._call = req.call
        self._data_moved = False
        try:
            return self._allreduce_on(job, req, array, header)
        except (OperationRefused, CollectiveError):
            if req.job or self._data_moved:
                raise
            # a call that names no job runs on the one this node knows to be live; a job may
            # have ended and another started before the event stream said so (a submit
            # right after a cancel): ask the controller and, if no data moved yet, run on
            # the live job instead
            self._refresh_jobs()
            if not job.ended:
                raise
            live = self._job_for(None, refreshed=True)
            logger.info("%s: job %s ended under a call that named no job; running it on %s",
                        self.node_id, job.id, live.id)
            return self._allreduce_on(live, req, array, header)

    def _allreduce_on(self, job: AgentJob, req: localapi.AllreduceRequest, array: np.ndarray,
                      header: dict[str, Any]) -> np.ndarray:
        check_on_job(req.call, req.dtype, array.size, len(job.nodes), job.collective,
                     req.world)  # OperationRefused, unrun, unless the job can serve it
        # the caller's number for this call: its own, or its count of calls on this job
        step = req.step or req.steps.get(job.id, 0) + 1
        job.last_step = max(job.last_step, step)  # where a restarted job's ranks go on
        header["resolved"] = {"job": job.id, "step": step}  # told back to the client
        self._step = step  # for the trace
        MARKS.note(node=self.node_id, job=job.id, step=step, bytes=array.nbytes)
        if job.network in ("ideal", "circuit"):  # no slots: nothing to meet at a barrier for
            seq = job.next_seq
            job.next_seq += 1
            return self._run_ideal(job, seq, array)
        self._wait_for_peers(job, req.timeout_s)
        if isinstance(self.links.link, StreamLink) and self.cfg.timing.standing_margin_ms > 0:
            standing = self._standing(job, array, req.timeout_s, step)
            if standing is not None:
                return standing
        t_ready = wallclock.now()
        seq = self._ready(job, array, step)
        go = self.ctl.await_go(job, seq, req.timeout_s)
        MARKS.mark("go")
        if go.error:
            raise refusal(self.node_id, job.id, seq, go.caller_steps, go.error)
        t0_local = go.t0_ns / 1e9 - self.ctl.clock.offset_s
        logger.debug("%s seq %d: barrier %.2f ms, go arrived %.2f ms before t0", self.node_id,
                     seq, (wallclock.now() - t_ready) * 1e3, (t0_local - wallclock.now()) * 1e3)
        if go.schedule.collective != OPTINC and (not retunes(go.schedule)
                                                 or ends_where_it_starts(go.schedule)):
            # a schedule that leaves a laser elsewhere than it starts (WRHT, the parameter
            # server) goes through the barrier every time: the controller lays it out anew
            job.standing[self._key(array)] = go.schedule
        else:
            # and it leaves the job's other standing schedules (a ring's, which retunes
            # nothing) assuming circuits that are gone: every node ran this same schedule, so
            # all drop theirs alike and meet at the barrier, which lays the circuits out again
            job.standing.clear()
        return self._run(job, seq, array, go.schedule, t0_local)

    def _key(self, array: np.ndarray) -> tuple[int, str, str, int]:
        """A standing schedule's key: bucket, kind and root (the op changes no schedule)."""
        return array.size, array.dtype.str, self._call[0], self._call[2]

    def _refresh_jobs(self) -> None:
        """Ask the controller which jobs this node is in (the event stream may lag a submit)."""
        wants_peers = hasattr(self.links.link, "set_peers")
        listed, peers = self.ctl.list_jobs(wants_peers)
        self.jobs.refresh(listed)
        if peers:
            self.links.set_peers(peers)

    def _job_for(self, job_id: str | None, refreshed: bool = False) -> AgentJob:
        if not refreshed and self.jobs.needs_refresh(job_id):
            self._refresh_jobs()
        return self.jobs.pick(job_id)

    job_for = _job_for  # the job a call runs on (the agent's world answers)

    # ---- starting a collective --------------------------------------------------------
    def _wait_for_peers(self, job: AgentJob, timeout_s: float) -> None:
        """Before a collective starts: wait (up to the call's timeout) for the peers the
        controller declared down to come back; PeerDown, unrun, if one does not."""
        deadline = time.monotonic() + timeout_s
        with self.ctl.cond:
            while job.down and not job.ended and not self.ctl.stop.is_set():
                if self.voids.reason:
                    raise OperationRefused(f"{self.voids.reason}; it was not run")
                left = deadline - time.monotonic()
                if left <= 0:
                    peer, reason = next(iter(job.down.items()))
                    raise PeerDown(
                        f"{self.node_id}: {peer} of job {job.id} is down ({reason}); this call "
                        f"waited {timeout_s:.0f} s for it to come back and was not run (it "
                        f"used up no step): restart its agent (`systemctl restart "
                        f"oddl-agent@{peer}`) or bring its host and link back (`oddl status`)")
                self.ctl.cond.wait(min(left, 0.5))

    def _ready(self, job: AgentJob, array: np.ndarray, step: int) -> int:
        """Enter the barrier of the job's next collective; return its sequence number."""
        if job.ended:
            raise OperationRefused(f"job {job.id} has ended: {job.ended}")
        seq = job.next_seq
        kind, op, root = self._call
        self.ctl.ready(pb.ReadyCollectiveRequest(node_id=self.node_id, job_id=job.id, seq=seq,
                                                 shape=list(array.shape),
                                                 dtype=array.dtype.str, caller_step=step,
                                                 kind=kind, op=op, root=root))
        job.next_seq += 1
        return seq

    def _standing(self, job: AgentJob, array: np.ndarray, timeout_s: float, step: int
                  ) -> np.ndarray | None:
        """Agree with the peers on the next collective; run it on the standing schedule when
        every node holds one, else return None (the caller enters the controller's barrier
        with the same sequence number)."""
        if job.ended:
            raise OperationRefused(f"job {job.id} has ended: {job.ended}")
        schedule = job.standing.get(self._key(array))
        mine = Ready(self.node_id, array.size, array.dtype.str,
                     wallclock.now() + self.ctl.clock.offset_s, schedule is not None, step,
                     self._call)
        self._begin(job)
        try:
            seq, theirs = self._exchange(job, mine, wallclock.now() + timeout_s)
            MARKS.mark("ready_exchanged")
        except CollectiveError as exc:
            seq = job.next_seq
            job.next_seq += 1  # the peers gave this collective up too
            error = self._aborted(job, seq) or exc
            self.voids.close()
            # the controller counts it, so a restarted peer continues after it
            self._report(job, seq, False, str(error), {})
            raise error from exc
        finally:
            self._running.clear()
        self.voids.close()  # the peers count on this node now
        # retuning nothing, it needs no common instant: it starts at once (decision 0022)
        keeps_circuits = schedule is not None and not retunes(schedule)
        try:
            everyone, t0 = agree(job.id, seq, mine, theirs,
                                 0.0 if keeps_circuits else self.cfg.timing.standing_margin_ms / 1e3)
        except StepMismatch as exc:
            job.next_seq += 1  # every node saw the same readies and refuses alike
            self._report(job, seq, False, str(exc), {})
            raise
        if not everyone or schedule is None:
            return None
        job.next_seq += 1
        self.standing_runs += 1
        if retunes(schedule) and job.rank == 0:
            self.ctl.start_standing(start_request(self.node_id, job.id, seq, t0, array,
                                                  schedule, self._call))
        return self._run(job, seq, array, schedule, t0 - self.ctl.clock.offset_s,
                         circuits_standing=keeps_circuits)

    def _exchange(self, job: AgentJob, mine: Ready, deadline: float
                  ) -> tuple[int, list[Ready]]:
        """The ready exchange of the job's next collective: (its sequence number, the peers'
        readies). A peer already at a later collective means this node is behind: it takes
        that number and says it is ready again, so every node meets on the latest one."""
        peers = [n for n in job.nodes if n != self.node_id]
        behind: dict[str, int] = {}
        """Peers whose last ready was for an earlier step than this call's."""
        while True:
            seq = job.next_seq
            try:
                return seq, exchange(self.links.link, job.id, seq, mine, peers, deadline,
                                     self._cancel)
            except PeerAhead as ahead:
                logger.warning("%s: %s is at collective %d of job %s, this node at %d: taking "
                               "up its number", self.node_id, ahead.peer, ahead.seq, job.id, seq)
                job.next_seq = ahead.seq
                if ahead.their_step:
                    behind[ahead.peer] = ahead.their_step
            except CollectiveError as exc:
                if not behind or self._cancel.is_set():
                    raise
                seen = ", ".join(f"{peer} at step {step}" for peer, step in sorted(behind.items()))
                raise CollectiveError(f"{exc}; last seen: {seen}, behind this call's step "
                                      f"{mine.step}: its training process is behind this "
                                      "rank's (it skipped or repeated calls)") from exc

    def _run_ideal(self, job: AgentJob, seq: int, array: np.ndarray) -> np.ndarray:
        schedule = schedule_for(job, self._key(array), array.dtype.itemsize,
                                self.ctl.get_schedule)
        MARKS.mark("schedule")
        return self._run(job, seq, array, schedule, 0.0)

    # ---- running it -------------------------------------------------------------------
    def _begin(self, job: AgentJob) -> None:
        """Mark a collective of `job` as in flight (a lost peer cancels it)."""
        self._current_job = job.id
        self._abort_reason = ""
        self._cancel.clear()
        self.voids.rearm()  # a void that came before this phase ends it at once
        self._running.set()

    def _aborted(self, job: AgentJob, seq: int) -> CollectiveError | None:
        """The error naming why the collective ended, when a lost peer ended it."""
        reason = self._abort_reason or self.voids.reason
        if not reason:
            return None
        return CollectiveError(f"{self.node_id}: collective {seq} of job {job.id} ended: "
                               f"{reason}")

    def _run(self, job: AgentJob, seq: int, array: np.ndarray, schedule: pb.Schedule,
             t0_local: float, circuits_standing: bool = False) -> np.ndarray:
        self._data_moved = True
        self.voids.close()
        decoded = decode_schedule(schedule)
        run = CollectiveRun(
            job_id=job.id, seq=seq, rank=job.rank, nodes=job.nodes, steps=decoded.steps,
            slots=decoded.slots, t0_local=t0_local, network=job.network,
            receive_timeout_s=decoded.receive_timeout_s,
            line_rate_bps=self.cfg.fabric.line_rate_gbps * 1e9, reduce_op=self._call[1],
            kind=self._call[0],
            collective=decoded.collective, caller_step=self._step,
            circuits_standing=circuits_standing)
        if t0_local > 0:
            self.starts.append((job.id, seq, self._called_at,
                                t0_local + first_data_start(schedule)))
        ok, error = True, ""
        peers = [n for n in job.nodes if n != self.node_id]
        self._begin(job)
        try:
            MARKS.mark("data_start")
            out = self._execute(run, array, decoded.collective, decoded.device,
                                decoded.n_elems)
            MARKS.mark("data_end")
            # every rank ends it alike (`oddl.agents.collective.outcome`): the result goes back only where
            # every node succeeded
            outcome.agree_outcome(self.links.link, self.node_id, job.id, seq, peers,
                                  wallclock.now() + max(2 * run.receive_timeout_s, 5.0),
                                  self._cancel, self._call)
            MARKS.mark("outcome_end")
            self.done += 1
            return out
        except CollectiveError as exc:
            ok, error = False, str(exc)
            if not isinstance(exc, PeerGaveUp):
                outcome.tell_failure(self.links.link, job.id, seq, peers, exc)
            job.standing.clear()  # the next collective resynchronises at the barrier
            aborted = self._aborted(job, seq)
            if aborted is not None:
                error = str(aborted)
                raise aborted from exc
            raise
        finally:
            self._running.clear()
            self.links.forget(job.id, seq)
            self.ctl.forget_circuits(job.id, seq)
            self._report(job, seq, ok, error, run.stats)

    def _execute(self, run: CollectiveRun, array: np.ndarray, collective: str, device: str,
                 n_elems: int) -> np.ndarray:
        return execute(run, array, Execution(self.cfg, self.node_id, self.links, self.gate,
                                             self._cancel, self, self.sender),
                       collective, device, n_elems)

    def _report(self, job: AgentJob, seq: int, ok: bool, error: str,
                stats: dict[str, float]) -> None:
        """Queue the outcome for the controller (sent off the collective's critical path)."""
        self.ctl.report(pb.ReportCollectiveRequest(
            node_id=self.node_id, job_id=job.id, seq=seq, ok=ok, error=error,
            duration_s=stats.get("duration_s", 0.0),
            gate_error_max_s=stats.get("gate_error_max_s", 0.0)))

    # ---- hand-offs (oddl.agents.collective.context.Handoffs) --------------------------------------
    def wait_circuits(self, seq: int, slot: int, deadline: float) -> None:
        """Wait for the controller's word that the slot's retuned transmitters are locked."""
        self.ctl.wait_circuits(self._current_job, seq, slot, deadline, self._cancel)

    def confirm(self, seq: int, slot: int, src: str) -> None:
        """Confirm a hand-off arrival to the controller at once."""
        self.ctl.confirm(self._current_job, seq, slot, src)
