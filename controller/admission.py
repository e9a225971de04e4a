"""Job admission: what a job may run on this testbed and the configuration it needs. Pure.

Admission checks the nodes and the collective, refuses a job that shares a node with a running
job (each job gets its own slice of transmitters, receivers and WSS channels) or that the
hardware cannot carry, and computes the job-scale configuration (WSS tables, the transmitters'
first channels) for the caller to apply. It neither keeps nor stores the job: its owner
(`oddl.controller.core.ControllerCore`) records it, persists it and applies the configuration.

The ``optinc`` collective (`oddl.common.config.OPTINC`) runs on the testbed's OptINC device with
the two-slot schedule of `oddl.controller.optinc_schedule`, not the TT-FR scheduler; its
registered plan has the devices as extra ranks (`oddl.controller.scheduling.optinc`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from oddl.common.config import OPTINC, OptincDeviceConfig, TestbedConfig
from oddl.common.errors import OddlError, OperationRefused
from oddl.controller.circuits import (
    PortCircuit,
    circuit_connections,
    port_circuits,
    topology_pairs,
)
from oddl.controller.device_types import Configuration
from oddl.controller.jobs import JobRecord
from oddl.controller.scheduling import (
    COLLECTIVES,
    Schedule,
    TimingModel,
    Topology,
    make_plan,
    schedule_plan,
)
from oddl.drivers.interfaces import Route

NETWORKS = ("optical", "ideal", "circuit")
"""The TT-FR slots of ODDL's WSS fabric; an ideal electrical switch (the baseline); the
standing light paths of an optical circuit switch, set at admission (`oddl.controller.circuits`)."""


def known_collectives() -> list[str]:
    """Every collective a job can name: the registered plans (``optinc`` among them)."""
    return sorted({*COLLECTIVES, OPTINC})


class Admission:
    """Decides whether a job may run and what the devices must hold for it."""

    def __init__(self, cfg: TestbedConfig, topology: Topology, timing: TimingModel):
        self.cfg = cfg
        self.topology = topology
        self.timing = timing

    def admit(self, name: str, nodes: Sequence[str], collective: str, network: str,
              params: Mapping[str, str], now_ns: int, *, job_id: str,
              jobs: Iterable[JobRecord],
              connections: Mapping[str, Mapping[int, int]] | None = None
              ) -> tuple[JobRecord, Configuration]:
        """Check a job against the testbed and the other `jobs`; return its record, named
        `job_id`, with its job-scale configuration (neither kept, stored nor applied).
        `connections`: the circuit switches' cross-connects now (a circuit job's change
        disconnects what stands in its way)."""
        known = [n.id for n in self.cfg.nodes]
        nodes = tuple(nodes) or tuple(known)
        for n in nodes:
            if n not in known:
                raise OperationRefused(f"unknown node {n!r}; the testbed has {', '.join(known)}")
        if len(set(nodes)) != len(nodes):
            raise OperationRefused("a node is listed twice; list each node once")
        if len(nodes) < 2:
            raise OperationRefused("a job needs at least two nodes")
        network = self._network(nodes, network)
        collective = collective or "ring"
        if collective not in COLLECTIVES and collective != OPTINC:
            raise OperationRefused(f"unknown collective {collective!r}; this controller serves "
                                   f"{', '.join(known_collectives())}")
        first: Schedule | None = None
        circuits: tuple[PortCircuit, ...] = ()
        if network == "circuit" or (network == "ideal" and not self._on_wss(nodes)):
            params = circuit_params(self.cfg, nodes, collective, params)
            circuits = self._circuits(nodes, collective, params) if network == "circuit" else ()
        elif collective == OPTINC:
            self._check_optinc(nodes, network, params)
        else:
            self._check_capacity(collective, params, nodes)
            try:
                plan = make_plan(collective, len(nodes), len(nodes) * 8, **plan_params(params))
                first = schedule_plan(plan, nodes, self.topology, self.timing, 4)
            except OddlError as exc:
                raise OperationRefused(f"the testbed cannot carry {collective} on {len(nodes)} "
                                       f"nodes: {exc}") from exc
        for job in jobs:
            shared = set(job.nodes) & set(nodes)
            if job.running and shared:
                raise OperationRefused(f"node(s) {', '.join(sorted(shared))} already run job "
                                       f"{job.id} ({job.name}); cancel it first "
                                       f"(`oddl jobs cancel {job.id}`) or pick other nodes")
        job = JobRecord(job_id, name or collective, nodes, collective, network,
                        dict(params), now_ns)
        target = Configuration()
        if circuits:
            target = Configuration(connections=circuit_connections(
                self.cfg, nodes, circuits, connections or {}))
        if network == "optical" and first is not None:
            tables = {w: {ch: Route(port, 0.0) for ch, port in t.items()}
                      for w, t in first.wss_tables().items()}
            channels = {}
            if first.slots:
                for c in first.slots[0].circuits():
                    channels[c.transmitter] = c.channel
            target = Configuration(channels, tables)
        return job, target

    def _on_wss(self, nodes: Sequence[str]) -> bool:
        """True when the nodes hang on a WSS (ODDL's fabric), False when their ports go to a
        circuit switch; OperationRefused for a mix, which no network connects."""
        on_wss = {n: self.cfg.node(n).on_wss for n in nodes}
        if len(set(on_wss.values())) > 1:
            raise OperationRefused(
                f"host(s) {', '.join(n for n, w in on_wss.items() if w)} hang on a WSS and "
                f"{', '.join(n for n, w in on_wss.items() if not w)} on a circuit switch; no "
                "light path joins the two, so pick nodes of one kind for a job")
        return all(on_wss.values())

    def _network(self, nodes: Sequence[str], network: str) -> str:
        """The job's network: as named, or by default the one its hosts' optics make."""
        on_wss = self._on_wss(nodes)
        network = network or ("optical" if on_wss else "circuit")
        if network not in NETWORKS:
            raise OperationRefused(f"unknown network {network!r}; use one of {', '.join(NETWORKS)}")
        if network == "optical" and not on_wss:
            raise OperationRefused(
                "network optical is ODDL's slotted WSS fabric, but these hosts' ports go to a "
                "circuit switch; use network circuit (light paths set at admission) or ideal")
        if network == "circuit" and on_wss:
            raise OperationRefused(
                "network circuit needs hosts whose ports go to an optical circuit switch; "
                "these hang on a WSS: use network optical (or ideal)")
        return network

    def _circuits(self, nodes: Sequence[str], collective: str, params: Mapping[str, str]
                  ) -> tuple[PortCircuit, ...]:
        """The light paths a circuit job needs (its plan's pairs on the hosts' ports)."""
        if collective == OPTINC:
            raise OperationRefused("optinc runs on the OptINC device of ODDL's WSS fabric; on a "
                                   "circuit switch use topoopt or ring")
        try:
            pairs = topology_pairs(collective, nodes, plan_params(params))
        except OddlError as exc:
            raise OperationRefused(f"the testbed cannot carry {collective} on {len(nodes)} "
                                   f"nodes: {exc}") from exc
        return port_circuits(self.cfg, nodes, pairs)

    def _check_capacity(self, collective: str, params: Mapping[str, str],
                        nodes: Sequence[str]) -> None:
        """Refuse what the hardware cannot carry: wavelengths beyond the WSS's allowed
        channels, a degree beyond the transceivers each node has (one tunable transmitter)."""
        wss_ids = {self.cfg.attachment(n).wss for n in nodes}
        channels = min(self.cfg.device(w).channels_allowed[1] - self.cfg.device(w).channels_allowed[0] + 1
                       for w in wss_ids)
        if "wavelengths" in params:
            w = plan_params(params)["wavelengths"]
            if not isinstance(w, int) or w < 1:
                raise OperationRefused(f"wavelengths must be a whole number >= 1; got {w!r}")
            if w > channels:
                raise OperationRefused(f"{collective} with {w} wavelengths needs more channels "
                                       f"than this testbed allows ({channels} per WSS); use "
                                       f"wavelengths={channels} or fewer")
        if "degree" in params:
            d = plan_params(params)["degree"]
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


def optinc_device(cfg: TestbedConfig, job: JobRecord) -> OptincDeviceConfig:
    """The OptINC device an optinc job runs on."""
    dev = cfg.optinc_device(job.params.get("device") or None)
    if dev is None:
        raise OperationRefused(f"job {job.id}: the testbed has no OptINC device "
                               f"{job.params.get('device', '')!r}")
    return dev


def optinc_bucket_refusal(cfg: TestbedConfig, job: JobRecord, n_elems: int,
                          dtype: np.dtype) -> str:
    """Why an optinc bucket cannot go to the job's device ("" if it can)."""
    if dtype.kind != "f":
        return (f"optinc all-reduces floating-point arrays (quantised to levels), not "
                f"{dtype}; use ring for integers")
    try:
        dev = optinc_device(cfg, job)
    except OddlError as exc:
        return str(exc)
    if n_elems > dev.max_elements:
        return (f"a bucket of {n_elems:,} elements is larger than OptINC device {dev.id} "
                f"accepts (max_elements = {dev.max_elements:,}); all-reduce buckets of at "
                f"most {dev.max_elements:,} elements")
    return ""


def circuit_params(cfg: TestbedConfig, nodes: Sequence[str], collective: str,
                   params: Mapping[str, str]) -> dict[str, str]:
    """A job's parameters on circuit-switch hosts: topoopt defaults to TopoOpt's rings on
    every port, each both ways (degree = the fewest ports of a host: TopoOpt's degree counts
    duplex interfaces, and a ring with its reverse runs on two of them)."""
    out = dict(params)
    if collective == "topoopt":
        ports = min(cfg.node(n).ports for n in nodes)
        out.setdefault("degree", str(ports))
        out.setdefault("both_directions", "true")
    return out


def plan_params(params: Mapping[str, str]) -> dict[str, object]:
    """A job's parameters as the plans take them: whole numbers, then decimals, true/false,
    else text."""
    out: dict[str, object] = {}
    for k, v in params.items():
        if v.lower() in ("true", "false"):
            out[k] = v.lower() == "true"
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out
