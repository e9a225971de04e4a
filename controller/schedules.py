"""The schedules of each job's collectives: laid out once per bucket and kept.

A collective's schedule depends on the job (its nodes, collective and parameters), the bucket
(elements and item size), the collective kind and root, and the channels the transmitters
hold when it starts; laying it out takes the pure scheduling core
(`oddl.controller.scheduling`) from microseconds to milliseconds, and a training loop repeats
the same few buckets, so each job keeps the schedules it was given, keyed by all of those, at
most 64 (the 65th empties the job's before it is kept).

No I/O, no lock: its owner (`oddl.controller.core.ControllerCore`) is the only caller.
"""

from __future__ import annotations

from collections.abc import Mapping

from oddl.common.collective_kinds import ALL_REDUCE, KINDS, optinc_refusal
from oddl.common.config import OPTINC, TestbedConfig
from oddl.common.errors import OperationRefused
from oddl.controller.admission import optinc_device, plan_params
from oddl.controller.barriers import MAX_ELEMENTS
from oddl.controller.circuit_schedule import CircuitSchedule, circuit_schedule
from oddl.controller.circuits import topology_pairs
from oddl.controller.jobs import JobRecord
from oddl.controller.optinc_schedule import OptincSchedule, optinc_schedule
from oddl.controller.scheduling import Schedule, TimingModel, Topology, schedule_plan
from oddl.controller.scheduling.native import native_plan
from oddl.protos import oddl_pb2 as pb
from oddl.protos.schedule_wire import (
    encode_optinc_schedule,
    encode_schedule,
    node_parts,
    schedule_sha256,
)

Key = tuple[int, int, tuple[int | None, ...], str, int]
"""(elements, item size, each node's channel at the start, kind, root)."""
KEPT_PER_JOB = 64


class Schedules:
    """Lays out and keeps the schedules of every job's collectives."""

    def __init__(self, cfg: TestbedConfig, topology: Topology, timing: TimingModel,
                 receive_timeout_s: float):
        self.cfg = cfg
        self.topology = topology
        self.timing = timing
        self.receive_timeout_s = receive_timeout_s
        """What the encoded schedules tell the agents to wait for a slot's data."""
        self._kept: dict[str, dict[Key, Schedule | OptincSchedule | CircuitSchedule]] = {}
        self._paths: dict[str, frozenset[tuple[str, str]]] = {}
        self._parts: dict[str, dict[bytes, dict[str, pb.Schedule]]] = {}
        """Per job, each node's part of the schedules its gos carried, by the whole's digest."""

    def _keep(self, job_id: str, key: Key,
              sched: Schedule | OptincSchedule | CircuitSchedule) -> None:
        kept = self._kept.setdefault(job_id, {})
        if len(kept) > KEPT_PER_JOB:
            kept.clear()
        kept[key] = sched

    def schedule(self, job: JobRecord, n_elems: int, itemsize: int,
                 initial_channels: Mapping[str, int | None] | None = None,
                 kind: str = ALL_REDUCE, root: int = 0) -> Schedule:
        """The job's collective `kind` laid out for `n_elems` elements (kept)."""
        init = tuple((initial_channels or {}).get(n) for n in job.nodes)
        key = (n_elems, itemsize, init, kind, root)
        cached = self._kept.get(job.id, {}).get(key)
        if isinstance(cached, Schedule):
            return cached
        plan = native_plan(job.collective, kind, len(job.nodes), n_elems, root,
                           **plan_params(job.params))
        sched = schedule_plan(plan, job.nodes, self.topology, self.timing, itemsize,
                              initial_channels=dict(zip(job.nodes, init, strict=True)))
        self._keep(job.id, key, sched)
        return sched

    def circuit_schedule(self, job: JobRecord, n_elems: int, itemsize: int,
                         kind: str = ALL_REDUCE, root: int = 0) -> CircuitSchedule:
        """A collective of a job on standing light paths (network circuit), or of an ideal
        job on hosts no WSS serves: its plan, refused where it needs a path the job lacks."""
        key = (n_elems, itemsize, (), kind, root)
        cached = self._kept.get(job.id, {}).get(key)
        if isinstance(cached, CircuitSchedule):
            return cached
        params = plan_params(job.params)
        plan = native_plan(job.collective, kind, len(job.nodes), n_elems, root, **params)
        paths: frozenset[tuple[str, str]] | None = None
        if job.network == "circuit":
            paths = self._paths.get(job.id)
            if paths is None:
                paths = self._paths[job.id] = frozenset(
                    topology_pairs(job.collective, job.nodes, params))
        sched = circuit_schedule(plan, job.nodes, self.topology, itemsize,
                                 self.timing.line_rate_bps, paths)
        self._keep(job.id, key, sched)
        return sched

    def on_circuits(self, job: JobRecord) -> bool:
        """True for a job whose collectives run on standing paths, not TT-FR slots."""
        return job.network == "circuit" or not all(self.cfg.node(n).on_wss for n in job.nodes)

    def optinc_schedule(self, job: JobRecord, n_elems: int, itemsize: int) -> OptincSchedule:
        """The two-slot schedule of an optinc job for `n_elems` elements (kept)."""
        key = (n_elems, itemsize, (), ALL_REDUCE, 0)
        cached = self._kept.get(job.id, {}).get(key)
        if isinstance(cached, OptincSchedule):
            return cached
        sched = optinc_schedule(job.nodes, optinc_device(self.cfg, job), self.timing, n_elems,
                                itemsize)
        self._keep(job.id, key, sched)
        return sched

    def wire(self, job: JobRecord, n_elems: int, itemsize: int, kind: str, root: int,
             channels: Mapping[str, int | None]) -> pb.Schedule:
        """The encoded schedule of the job's collective `kind` for `n_elems` elements,
        starting from `channels` (an optinc job's: its two slots); OddlError when it
        cannot be laid out."""
        if job.collective == OPTINC:
            return encode_optinc_schedule(self.optinc_schedule(job, n_elems, itemsize), job.id,
                                          self.receive_timeout_s)
        if self.on_circuits(job):
            return encode_schedule(self.circuit_schedule(job, n_elems, itemsize, kind, root),
                                   job.id, self.receive_timeout_s)
        sched = self.schedule(job, n_elems, itemsize, channels, kind, root)
        return encode_schedule(sched, job.id, self.receive_timeout_s)

    def encoded(self, job: JobRecord, message_bytes: int, itemsize: int, kind: str, root: int,
                channels: Mapping[str, int | None]) -> pb.Schedule:
        """The schedule a job's collective `kind` of `message_bytes` would run on, starting
        from `channels` (`GetSchedule`); OperationRefused for a request no job accepts."""
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
        return self.wire(job, message_bytes // itemsize, itemsize, kind, root, channels)

    def parts(self, job: JobRecord, wire: pb.Schedule) -> dict[str, pb.Schedule]:
        """Each node's part of `wire`, a schedule of `job` (`node_parts`, kept: a collective
        that goes through the barrier every time, as one that retunes and ends elsewhere
        does, builds its N parts once)."""
        kept = self._parts.setdefault(job.id, {})
        digest = schedule_sha256(wire)
        parts = kept.get(digest)
        if parts is None:
            if len(kept) >= KEPT_PER_JOB:
                kept.clear()
            parts = kept[digest] = node_parts(wire, job.nodes)
        return parts

    def forget(self, job_id: str) -> None:
        """Drop the schedules of a job that ended."""
        self._kept.pop(job_id, None)
        self._paths.pop(job_id, None)
        self._parts.pop(job_id, None)
