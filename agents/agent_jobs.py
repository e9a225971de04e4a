"""The jobs an agent takes part in, as the controller announced them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from oddl.common.errors import OperationRefused
from oddl.protos import oddl_pb2 as pb

logger = logging.getLogger(__name__)


@dataclass
class AgentJob:
    """What the agent knows about one job it takes part in."""

    id: str
    nodes: tuple[str, ...]
    rank: int
    network: str
    collective: str
    next_seq: int = 1
    last_step: int = 0
    """The highest step number a call of the job had here: a new process group's ranks
    number their calls after it (the torch backend's realign, decision record 0033)."""
    ended: str = ""
    plans: dict[tuple[int, str, str, int], pb.Schedule] = field(default_factory=dict)
    standing: dict[tuple[int, str, str, int], pb.Schedule] = field(default_factory=dict)
    """The last schedule of each bucket and collective (elements, dtype, kind, root): run
    again without the
    controller's barrier (`oddl.agents.collective.standing`); one that retunes is announced to the
    controller, which executes its retunes. Cleared when a collective fails."""
    down: dict[str, str] = field(default_factory=dict)
    """Peers the controller declared down (no heartbeat), with its reason, until the job is
    announced again (a node re-registered): a new collective waits for them to come back."""


class JobTable:
    """The jobs of one node, by id: filled from the schedule stream and, when the stream lags
    a submit, from the controller's job list."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.jobs: dict[str, AgentJob] = {}

    def assigned(self, event: pb.JobAssigned) -> list[str]:
        """The controller (re-)announced a job with this node in it; return the peers it had
        declared down, which are back (the caller clears them with `clear_down` once it has
        dropped its streams to their old selves)."""
        job = event.job
        old = self.jobs.get(job.id)
        if old is not None and old.nodes == tuple(job.nodes) and not old.ended:
            # the controller re-announces a job this agent runs (its stream or the controller
            # restarted): keep the very object, since a collective in flight counts its
            # sequence number on it, and keep the agent's own count; the controller announces
            # a job again when a node (re-)registers, so the peers it declared down are back
            old.rank = event.rank
            logger.info("%s: assigned to job %s as rank %d", self.node_id, job.id, event.rank)
            return list(old.down)
        else:
            # a fresh (restarted) agent continues after the job's last collective
            self.jobs[job.id] = AgentJob(job.id, tuple(job.nodes), event.rank, job.network,
                                         job.collective, next_seq=max(1, event.next_seq))
        logger.info("%s: assigned to job %s as rank %d", self.node_id, job.id, event.rank)
        return []

    def clear_down(self, job_id: str) -> None:
        """The job's peers declared down are back."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.down.clear()

    def peer_lost(self, job_id: str, node: str, reason: str) -> None:
        """The controller declared a peer of a job down."""
        job = self.jobs.get(job_id)
        if job is not None and node != self.node_id:
            job.down[node] = reason

    def ended(self, job_id: str, reason: str) -> None:
        """The controller ended a job."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.ended = reason or "ended"

    def refresh(self, listed: Iterable[pb.Job]) -> None:
        """Take in the controller's job list: new running jobs, ended ones."""
        for job in listed:
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

    def needs_refresh(self, job_id: str | None) -> bool:
        """Whether the table may lag the controller: an unknown job named, or no live one."""
        return bool((job_id and job_id not in self.jobs)
                    or not any(not j.ended for j in self.jobs.values()))

    def pick(self, job_id: str | None) -> AgentJob:
        """The named job, or the one live job; OperationRefused naming the choice otherwise."""
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
