"""Jobs' durable records: what each job is, where it stands, its counters; and their table.

A `JobRecord` is what the controller's store keeps (`oddl.controller.store`, SQLite) and what a
restarted controller reads back. The `JobTable` holds every record by id, numbers new jobs
after the stored ones, looks them up, and writes a record through the store when asked (I/O).
What a job's collectives are doing right now lives elsewhere: the waiting barriers
(`oddl.controller.barriers`) and the schedules laid out for it (`oddl.controller.schedules`).
Their owner, `oddl.controller.core.ControllerCore`, is the only one to change a record or call
the table, under its lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from oddl.common.errors import OperationRefused
from oddl.controller.store import Store


@dataclass
class JobRecord:
    """One job and its counters."""

    id: str
    name: str
    nodes: tuple[str, ...]
    collective: str
    network: str
    params: dict[str, str]
    submitted_ns: int
    state: str = "running"
    reason: str = ""
    collectives_done: int = 0
    reconfigurations: int = 0
    guard_time_s: float = 0.0
    last_seq: int = 0
    """The highest collective sequence number any node has entered (rejoining agents continue
    after it)."""

    PERSISTED = ("id", "name", "nodes", "collective", "network", "params", "submitted_ns",
                 "state", "reason", "collectives_done", "reconfigurations", "guard_time_s",
                 "last_seq")

    @property
    def running(self) -> bool:
        """True until the job is cancelled or fails."""
        return self.state == "running"

    def to_doc(self) -> dict[str, Any]:
        """The durable part of the job."""
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k in self.PERSISTED for v in [getattr(self, k)]}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JobRecord:
        """A job as stored by `to_doc`."""
        values = {k: doc[k] for k in cls.PERSISTED if k in doc}
        values["nodes"] = tuple(values["nodes"])
        return cls(**values)


class JobTable:
    """Every job's record by id, loaded from the store at start."""

    def __init__(self, store: Store | None = None):
        self.store = store
        self._records: dict[str, JobRecord] = {}
        for doc in store.jobs() if store else []:
            job = JobRecord.from_doc(doc)
            self._records[job.id] = job
        self._next = 1 + max((int(j.split("-")[-1]) for j in self._records
                              if j.split("-")[-1].isdigit()), default=0)

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(list(self._records.values()))

    def next_id(self) -> str:
        """The id the next job admitted gets (``job-N``, after every stored one)."""
        return f"job-{self._next}"

    def add(self, job: JobRecord) -> None:
        """Keep a newly admitted job (named `next_id()`) and write it to the store."""
        self._records[job.id] = job
        self._next += 1
        self.save(job)

    def save(self, job: JobRecord) -> None:
        """Write a job's durable record to the store: SQLite I/O (nothing without one)."""
        if self.store is not None:
            self.store.save_job(job.to_doc())

    def find(self, job_id: str) -> JobRecord | None:
        """The job with this id, if any."""
        return self._records.get(job_id)

    def get(self, job_id: str) -> JobRecord:
        """The job with this id, or OperationRefused naming the known ids."""
        job = self._records.get(job_id)
        if job is None:
            raise OperationRefused(f"unknown job {job_id!r}; known jobs: "
                                   f"{', '.join(self._records) or 'none'} (`oddl jobs list`)")
        return job

    def entered_by(self, job_id: str, node: str) -> JobRecord:
        """The job a node's ready names: OperationRefused for an unknown job, one that ended,
        or one `node` is not part of."""
        job = self.get(job_id)
        if not job.running:
            raise OperationRefused(f"job {job_id} is {job.state}: {job.reason}")
        if node not in job.nodes:
            raise OperationRefused(f"node {node} is not part of job {job_id} "
                                   f"(nodes {', '.join(job.nodes)})")
        return job

    def running_with(self, job_id: str, node: str) -> JobRecord:
        """The running job `job_id` with `node` in it (what an agent's request names), or
        OperationRefused naming which is not so."""
        job = self._records.get(job_id)
        if job is None or not job.running:
            raise OperationRefused(f"job {job_id!r} is not running; see `oddl jobs list`")
        if node not in job.nodes:
            raise OperationRefused(f"node {node} is not part of job {job.id}")
        return job

    def running_of(self, node: str) -> list[JobRecord]:
        """The running jobs `node` takes part in."""
        return [job for job in self._records.values() if job.running and node in job.nodes]

    def running(self, job_id: str) -> bool:
        """Whether `job_id` runs (one read, safe without the owner's lock: the slot
        executor's threads ask it before each decision)."""
        job = self._records.get(job_id)
        return job is not None and job.running
