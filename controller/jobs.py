"""Jobs, their admission and the collective barrier (no I/O; time is passed in).

Admission checks the nodes and the collective, refuses a job that shares a node with a running
job (each job gets its own slice of transmitters, receivers and WSS channels), computes the
job-scale configuration (WSS tables, the transmitters' first channels) and hands it to the
caller to apply. The barrier collects every node's "ready" for one collective invocation and
decides: start (same shape and dtype everywhere) or refuse with the reason.

The ``optinc`` collective (`oddl.common.config.OPTINC`) runs on the testbed's OptINC device with
the two-slot schedule of `oddl.controller.optinc_schedule`, not the TT-FR scheduler; its
registered plan has the devices as extra ranks (`oddl.controller.scheduling.optinc`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oddl.common.collective_kinds import ALL_REDUCE, optinc_refusal
from oddl.common.config import OPTINC, OptincDeviceConfig, TestbedConfig
from oddl.common.errors import OddlError, OperationRefused
from oddl.controller.barrier_checks import Call, Entry, agreed_call
from oddl.controller.device_types import Configuration
from oddl.controller.optinc_schedule import (
    OptincSchedule,
    optinc_schedule,
)
from oddl.controller.scheduling import (
    COLLECTIVES,
    Schedule,
    TimingModel,
    Topology,
    make_plan,
    schedule_plan,
)
from oddl.controller.scheduling.native import native_plan
from oddl.controller.store import Store
from oddl.controller.testbed_model import (
    timing_from_config as timing_from_config,
)
from oddl.controller.testbed_model import (
    topology_from_config as topology_from_config,
)
from oddl.drivers.interfaces import Route

logger = logging.getLogger(__name__)

NETWORKS = ("optical", "ideal")


def known_collectives() -> list[str]:
    """Every collective a job can name: the registered plans (``optinc`` among them)."""
    return sorted({*COLLECTIVES, OPTINC})


@dataclass(frozen=True)
class Barrier:
    """The outcome of a complete barrier: start, or refuse with `error`."""

    job_id: str
    seq: int
    n_elems: int
    itemsize: int
    error: str = ""
    kind: str = ALL_REDUCE
    root: int = 0
    caller_steps: Mapping[str, int] = field(default_factory=dict)
    """With `error`: each node's step number (a node behind another goes on, `oddl.common.pairing`)."""


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
    ready: dict[int, dict[str, Entry]] = field(default_factory=dict)
    ready_steps: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per waiting barrier, each node's caller step (`oddl.common.pairing`)."""
    failed_seqs: set[int] = field(default_factory=set)
    schedules: dict[tuple[int, int, tuple[int | None, ...], str, int],
                    Schedule | OptincSchedule] = field(default_factory=dict)

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


class JobManager:
    """Admits jobs, builds their schedules and runs their barriers."""

    def __init__(self, cfg: TestbedConfig, topology: Topology, timing: TimingModel,
                 store: Store | None = None):
        self.cfg = cfg
        self.topology = topology
        self.timing = timing
        self.store = store
        self.jobs: dict[str, JobRecord] = {}
        for doc in store.jobs() if store else []:
            job = JobRecord.from_doc(doc)
            self.jobs[job.id] = job
        first = 1 + max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()),
                        default=0)
        self._ids = itertools.count(first)

    def save(self, job: JobRecord) -> None:
        """Persist a job's durable fields (no-op without a store)."""
        if self.store is not None:
            self.store.save_job(job.to_doc())

    # ---- admission --------------------------------------------------------------------
    def admit(self, name: str, nodes: Sequence[str], collective: str, network: str,
              params: Mapping[str, str], now_ns: int) -> tuple[JobRecord, Configuration]:
        """Check a job and return it with its job-scale configuration (not yet applied)."""
        known = [n.id for n in self.cfg.nodes]
        nodes = tuple(nodes) or tuple(known)
        for n in nodes:
            if n not in known:
                raise OperationRefused(f"unknown node {n!r}; the testbed has {', '.join(known)}")
        if len(set(nodes)) != len(nodes):
            raise OperationRefused("a node is listed twice; list each node once")
        if len(nodes) < 2:
            raise OperationRefused("a job needs at least two nodes")
        network = network or "optical"
        if network not in NETWORKS:
            raise OperationRefused(f"unknown network {network!r}; use one of {', '.join(NETWORKS)}")
        collective = collective or "ring"
        if collective not in COLLECTIVES and collective != OPTINC:
            raise OperationRefused(f"unknown collective {collective!r}; this controller serves "
                                   f"{', '.join(known_collectives())}")
        first: Schedule | None = None
        if collective == OPTINC:
            self._check_optinc(nodes, network, params)
        else:
            self._check_capacity(collective, params, nodes)
            try:
                plan = make_plan(collective, len(nodes), len(nodes) * 8, **_plan_params(params))
                first = schedule_plan(plan, nodes, self.topology, self.timing, 4)
            except OddlError as exc:
                raise OperationRefused(f"the testbed cannot carry {collective} on {len(nodes)} "
                                       f"nodes: {exc}") from exc
        for job in self.jobs.values():
            shared = set(job.nodes) & set(nodes)
            if job.running and shared:
                raise OperationRefused(f"node(s) {', '.join(sorted(shared))} already run job "
                                       f"{job.id} ({job.name}); cancel it first "
                                       f"(`oddl jobs cancel {job.id}`) or pick other nodes")
        job = JobRecord(f"job-{next(self._ids)}", name or collective, nodes, collective, network,
                        dict(params), now_ns)
        target = Configuration()
        if network == "optical" and first is not None:
            tables = {w: {ch: Route(port, 0.0) for ch, port in t.items()}
                      for w, t in first.wss_tables().items()}
            channels = {}
            if first.slots:
                for c in first.slots[0].circuits():
                    channels[c.transmitter] = c.channel
            target = Configuration(channels, tables)
        self.jobs[job.id] = job
        self.save(job)
        return job, target

    def _check_capacity(self, collective: str, params: Mapping[str, str],
                        nodes: Sequence[str]) -> None:
        """Refuse what the hardware cannot carry: wavelengths beyond the WSS's allowed
        channels, a degree beyond the transceivers each node has (one tunable transmitter)."""
        wss_ids = {self.cfg.attachment(n).wss for n in nodes}
        channels = min(self.cfg.device(w).channels_allowed[1] - self.cfg.device(w).channels_allowed[0] + 1
                       for w in wss_ids)
        if "wavelengths" in params:
            w = _plan_params(params)["wavelengths"]
            if not isinstance(w, int) or w < 1:
                raise OperationRefused(f"wavelengths must be a whole number >= 1; got {w!r}")
            if w > channels:
                raise OperationRefused(f"{collective} with {w} wavelengths needs more channels "
                                       f"than this testbed allows ({channels} per WSS); use "
                                       f"wavelengths={channels} or fewer")
        if "degree" in params:
            d = _plan_params(params)["degree"]
            transceivers = 1
            if not isinstance(d, int) or d > 2 * transceivers:
                raise OperationRefused(f"degree {d} needs {max(1, int(d) // 2) if isinstance(d, int) else '?'} "
                                       f"transceivers per node; the nodes of this testbed have "
                                       f"{transceivers} tunable transmitter each; use degree 2")

    def _check_optinc(self, nodes: Sequence[str], network: str,
                      params: Mapping[str, str]) -> OptincDeviceConfig:
        """Refuse an optinc job this testbed cannot run; return its device."""
        unknown = sorted(set(params) - {"device"})
        if unknown:
            raise OperationRefused(f"optinc takes no parameters {unknown}; it takes 'device' "
                                   "(an OptINC device id of the testbed file)")
        if not self.cfg.optinc:
            raise OperationRefused(
                f"testbed {self.cfg.name} has no OptINC device, so it cannot run optinc; add a "
                '[[devices]] entry with kind = "optinc" (see deploy/testbeds/emulated-4node.toml) '
                "or submit another collective (e.g. ring)")
        dev = self.cfg.optinc_device(params.get("device") or None)
        if dev is None:
            raise OperationRefused(f"no OptINC device {params.get('device')!r}; the testbed has "
                                   f"{', '.join(d.id for d in self.cfg.optinc)}")
        if len(nodes) != dev.inputs:
            raise OperationRefused(
                f"OptINC device {dev.id} has {dev.inputs} inputs (phases trained for N="
                f"{dev.inputs}) but the job has {len(nodes)} nodes; submit optinc on exactly "
                f"{dev.inputs} nodes, or give the device inputs = {len(nodes)} with phases "
                f"trained for it (oddl optinc train --nodes {len(nodes)} --bits {dev.bits})")
        if network != "optical":
            raise OperationRefused(f"optinc runs on the OptINC device of the optical fabric; "
                                   f"network {network!r} has none — use network optical (ring "
                                   "on the ideal network is the electrical baseline)")
        if self.cfg.fabric.link != "fabric":
            raise OperationRefused("optinc needs the emulated fabric (its OptINC device lives "
                                   f"there), but [fabric] link = {self.cfg.fabric.link!r}")
        return dev

    def optinc_device(self, job: JobRecord) -> OptincDeviceConfig:
        """The OptINC device an optinc job runs on."""
        dev = self.cfg.optinc_device(job.params.get("device") or None)
        if dev is None:
            raise OperationRefused(f"job {job.id}: the testbed has no OptINC device "
                                   f"{job.params.get('device', '')!r}")
        return dev

    def optinc_schedule(self, job: JobRecord, n_elems: int, itemsize: int) -> OptincSchedule:
        """The two-slot schedule of an optinc job for `n_elems` elements (cached)."""
        key = (n_elems, itemsize, (), ALL_REDUCE, 0)
        cached = job.schedules.get(key)
        if isinstance(cached, OptincSchedule):
            return cached
        sched = optinc_schedule(job.nodes, self.optinc_device(job), self.timing, n_elems,
                                itemsize)
        if len(job.schedules) > 64:
            job.schedules.clear()
        job.schedules[key] = sched
        return sched

    def get(self, job_id: str) -> JobRecord:
        """The job with this id, or OperationRefused naming the known ids."""
        job = self.jobs.get(job_id)
        if job is None:
            raise OperationRefused(f"unknown job {job_id!r}; known jobs: "
                                   f"{', '.join(self.jobs) or 'none'} (`oddl jobs list`)")
        return job

    def running_with(self, job_id: str, node: str) -> JobRecord:
        """The running job `job_id` with `node` in it (what an agent's request names), or
        OperationRefused naming which is not so."""
        job = self.jobs.get(job_id)
        if job is None or not job.running:
            raise OperationRefused(f"job {job_id!r} is not running; see `oddl jobs list`")
        if node not in job.nodes:
            raise OperationRefused(f"node {node} is not part of job {job.id}")
        return job

    def end(self, job_id: str, state: str, reason: str) -> JobRecord:
        """Mark a job cancelled, failed or finished."""
        job = self.get(job_id)
        if job.running:
            job.state, job.reason = state, reason
            job.ready.clear()
            self.save(job)
        return job

    # ---- schedules --------------------------------------------------------------------
    def schedule(self, job: JobRecord, n_elems: int, itemsize: int,
                 initial_channels: Mapping[str, int | None] | None = None,
                 kind: str = ALL_REDUCE, root: int = 0) -> Schedule:
        """The job's collective `kind` laid out for `n_elems` elements (cached)."""
        init = tuple((initial_channels or {}).get(n) for n in job.nodes)
        key = (n_elems, itemsize, init, kind, root)
        cached = job.schedules.get(key)
        if isinstance(cached, Schedule):
            return cached
        plan = native_plan(job.collective, kind, len(job.nodes), n_elems, root,
                           **_plan_params(job.params))
        sched = schedule_plan(plan, job.nodes, self.topology, self.timing, itemsize,
                              initial_channels=dict(zip(job.nodes, init, strict=True)))
        if len(job.schedules) > 64:
            job.schedules.clear()
        job.schedules[key] = sched
        return sched

    # ---- the barrier ------------------------------------------------------------------
    def ready(self, job_id: str, seq: int, node: str, shape: Sequence[int], dtype: str,
              step: int = 0, call: Call = (ALL_REDUCE, "sum", 0)) -> Barrier | None:
        """Record one node's ready; return the barrier's outcome once every node is in."""
        job = self.get(job_id)
        if not job.running:
            raise OperationRefused(f"job {job_id} is {job.state}: {job.reason}")
        if node not in job.nodes:
            raise OperationRefused(f"node {node} is not part of job {job_id} "
                                   f"(nodes {', '.join(job.nodes)})")
        if seq in job.failed_seqs:
            return Barrier(job_id, seq, 0, 0, error=f"collective {seq} of job {job_id} was "
                           "already abandoned (a node failed); continue with the next one")
        job.last_seq = max(job.last_seq, seq)
        job.ready.setdefault(seq, {})[node] = (tuple(int(x) for x in shape), dtype, call)
        job.ready_steps.setdefault(seq, {})[node] = step
        if len(job.ready[seq]) < len(job.nodes):
            return None
        steps = job.ready_steps.pop(seq)
        agreed = agreed_call(job_id, seq, job.ready.pop(seq), steps)
        if isinstance(agreed, str):
            return Barrier(job_id, seq, 0, 0, error=agreed, caller_steps=steps)
        if job.collective == OPTINC:
            error = optinc_refusal(agreed.call) or self._optinc_barrier(job, agreed.n_elems,
                                                                        agreed.dtype)
            if error:
                return Barrier(job_id, seq, 0, 0, error=f"collective {seq} of job {job_id} "
                               f"refused: {error}")
        kind, _op, root = agreed.call
        return Barrier(job_id, seq, agreed.n_elems, agreed.dtype.itemsize, kind=kind, root=root)

    def _optinc_barrier(self, job: JobRecord, n_elems: int, dtype: np.dtype) -> str:
        """Why an optinc bucket cannot go to the device ("" if it can)."""
        if dtype.kind != "f":
            return (f"optinc all-reduces floating-point arrays (quantised to levels), not "
                    f"{dtype}; use ring for integers")
        try:
            dev = self.optinc_device(job)
        except OddlError as exc:
            return str(exc)
        if n_elems > dev.max_elements:
            return (f"a bucket of {n_elems:,} elements is larger than OptINC device {dev.id} "
                    f"accepts (max_elements = {dev.max_elements:,}); all-reduce buckets of at "
                    f"most {dev.max_elements:,} elements")
        return ""

    def abandon_pending(self, job: JobRecord, reason: str) -> list[Barrier]:
        """Fail every barrier of `job` still waiting for nodes (a participant died)."""
        failed = []
        for seq in sorted(job.ready):
            job.failed_seqs.add(seq)
            failed.append(Barrier(job.id, seq, 0, 0, error=f"collective {seq} of job {job.id} "
                                  f"abandoned: {reason}"))
        job.ready.clear()
        job.ready_steps.clear()
        return failed


def _plan_params(params: Mapping[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in params.items():
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out
