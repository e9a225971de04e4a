"""The cluster simulator: one training iteration of data-parallel DL on seven networks.

`simulate(SimConfig(model="vgg19", nodes=1024, gbps=100))` predicts, for every system, the
iteration time = compute + exposed communication, with the reconfiguration overhead inside
the communication broken out:

- ``oddl``: the collective's plan laid out by THE controller's TT-FR scheduler
  (`schedule_plan`, the code the controller runs) on a one-WSS topology with tunable-laser
  timing; the communication time is the schedule's makespan in steady state (the
  transmitters hold the channels the previous iteration left them on). The job-scale LCoS WSS
  partition (`wss_ms`) is set once per job and reported as set-up, not per iteration.
- ``fat-tree``: an electrical 3-tier fat-tree (ToR, aggregation, core) with oversubscription
  and per-hop latency. Per plan step a fluid bottleneck model: the most loaded of host ports,
  ToR uplinks/downlinks and pod uplinks/downlinks, with perfect load balancing (ECMP without
  collisions), plus latency for the most switches any flow crosses.
- ``ideal``: a non-blocking electrical switch: each step takes the busiest port's bytes at the
  line rate plus the base latency.
- ``sip-ring``: SiP-ML's photonic ring. Circuits s→d occupy every segment between s and d
  (unidirectional); each segment carries at most `sip_wavelengths` λ. The ring reconfigures
  for δ, then runs for 4δ, periodically; a step whose circuits differ from the previous
  step's waits for the next reconfiguration.
- ``wrht``: the WRHT tree (registered collective ``wrht``) on an optical ring with
  `wrht_wavelengths` λ per fibre: members send their whole buffer to the group root at once,
  each on its own λ at the line rate; the root reduces m−1 buffers.
- ``topoopt``: TopoOpt's direct-connect fabric: `topoopt_degree` interfaces per node, each at
  gbps/degree (same total bandwidth per node), TotientPerms rings (registered collective
  ``totientperms``) in both directions, one part of the buffer per ring, all rings at once.
- ``optinc``: OptINC's in-network averaging (papers.md §4): every server sends its gradient
  once, as b-bit levels, to an MZI-mesh device that streams the quantised mean back through a
  passive splitter; one pass S_b/B plus the device latency per cascade level (one device up to
  64 servers, else a two-level cascade N1 × N2), after a scale agreement (one small round
  trip). No server-side reduction.

Every plan comes from the scheduling core's registry (`make_plan`). Reductions cost
``received bytes / reduce_gbytes_s`` per REDUCE step on every system (not overlapped with the
transfer). All assumptions are listed in docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oddl.controller.scheduling import (
    Grid,
    Op,
    Plan,
    Schedule,
    Step,
    TimingModel,
    Topology,
    make_plan,
    schedule_plan,
)
from oddl.controller.sim_models import DEFAULT_BATCH, MODELS, SUSTAINED_TFLOPS, ModelProfile
from oddl.controller.sim_sipring import RULES, SipRingAllocator
from oddl.errors import OddlError

SYSTEMS = ("oddl", "fat-tree", "ideal", "sip-ring", "wrht", "topoopt", "optinc")
"""Every simulated system, in table order."""

LABELS = {
    "oddl": "ODDL (TT-FR + LCoS WSS)",
    "fat-tree": "electrical fat-tree",
    "ideal": "ideal electrical switch",
    "sip-ring": "SiP-Ring",
    "wrht": "WRHT (optical ring)",
    "topoopt": "TopoOpt (TotientPerms)",
    "optinc": "OptINC (in-network ONN)",
}

PLAN_SYSTEMS = ("oddl", "fat-tree", "ideal", "sip-ring")
"""Systems that run the collective chosen by `SimConfig.collective`."""

PLACEMENTS = ("packed", "random")

NORMS = ("node", "lambda")
"""Bandwidth normalisations (docs/simulator.md): per node (default) or per wavelength."""

SIP_RULES = RULES

OPTINC_MAX_INPUTS = 64
"""Largest OptINC device the model builds (oddl.drivers.optinc_model.MAX_INPUTS)."""

PAPER: dict[str, Any] = {"model": "vgg19", "nodes": 1024, "gbps": 100.0, "fat-tree": 1.6,
                         "sip-ring": 1.7, "wrht": (0.7559, 0.8081)}
"""ODDL's headline (papers.md §1.1): iteration-time ratios over ODDL at this setting; and
WRHT's (papers.md §2): the cut in communication time against an optical-system all-reduce,
arXiv v1 and the later version."""


class SimulationError(OddlError):
    """The simulator cannot run the requested configuration (bad input)."""


def _f(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class SimConfig:
    """Every input of one simulated iteration (times in the unit their name says)."""

    model: str = _f("vgg19", "model profile (see --list-models)")
    nodes: int = _f(1024, "data-parallel workers, one per node")
    gbps: float = _f(100.0, "line rate per node (and per wavelength), Gbit/s")
    collective: str = _f("ring", "all-reduce on ODDL, fat-tree, ideal and SiP-Ring")
    itemsize: int = _f(4, "bytes per gradient element (4 = fp32, 2 = fp16)")
    batch: int = _f(DEFAULT_BATCH, "images per worker per iteration")
    sustained_tflops: float = _f(SUSTAINED_TFLOPS, "sustained training TFLOP/s per worker")
    compute_ms: float = _f(-1.0, "compute time per iteration, ms (-1: from the model profile; "
                                 "0: communication only)")
    overlap: float = _f(0.0, "fraction of the backward pass that hides communication, 0..1")
    bandwidth_norm: str = _f("node", "node: every node sends and receives at most gbps in "
                                     "total over all its wavelengths/interfaces; lambda: every "
                                     "wavelength/interface runs at gbps")
    message_mb: float = _f(-1.0, "all-reduce size in MB (-1: the model's gradient)")
    latency_us: float = _f(1.0, "base latency per step (NIC, propagation), µs")
    step_overhead_us: float = _f(0.0, "fixed cost per collective step on every system "
                                      "(synchronisation, kernel launch), µs")
    ring_hop_latency_us: float = _f(0.05, "optical ring latency per node a lightpath passes "
                                          "(SiP-Ring, WRHT), µs")
    reduce_gbytes_s: float = _f(500.0, "rate of reducing received bytes, GB/s")
    amortise_iterations: int = _f(0, "iterations per job that share the one-off set-up "
                                     "(WSS partition, patch panel); 0: report it apart")
    tune_us: float = _f(1.0, "ODDL laser retune time, µs")
    skew_us: float = _f(0.1, "ODDL worst clock skew in every guard, µs")
    cdr_us: float = _f(1.0, "ODDL receiver clock-recovery lock, µs")
    command_us: float = _f(0.0, "ODDL command budget per retune, µs (0: agents gate locally)")
    wss_ms: float = _f(100.0, "ODDL LCoS WSS settle time (job scale), ms")
    ft_oversub: float = _f(1.0, "fat-tree ToR oversubscription (1 = full bisection)")
    ft_core_oversub: float = _f(1.0, "fat-tree aggregation-to-core oversubscription")
    ft_hop_latency_us: float = _f(0.5, "fat-tree latency per switch crossed, µs")
    ft_hosts_per_tor: int = _f(8, "fat-tree hosts per ToR (k=16: 8)")
    ft_tors_per_pod: int = _f(8, "fat-tree ToRs per pod (k=16: 8)")
    ft_placement: str = _f("packed", "rank to host placement: packed or random")
    seed: int = _f(1, "seed of the random placement")
    sip_delta_us: float = _f(50.0, "SiP-Ring reconfiguration time δ, µs")
    sip_live_factor: float = _f(4.0, "SiP-Ring live period after each reconfiguration, in δ")
    sip_wavelengths: int = _f(64, "SiP-Ring wavelengths per ring segment W (a circuit gets "
                                  "its share of its segments' W)")
    sip_segment_rule: str = _f("ring", "SiP-Ring segments a circuit crosses: ring (s..d-1 mod "
                                       "N) or ffsim (the reference code's offset arithmetic)")
    wrht_wavelengths: int = _f(64, "WRHT wavelengths per fibre W (fan-in up to 2W+1)")
    topoopt_degree: int = _f(4, "TopoOpt interfaces per node (even), each at gbps/degree")
    topoopt_setup_s: float = _f(60.0, "TopoOpt patch-panel reconfiguration per job, s")
    optinc_inputs: int = _f(0, "OptINC device inputs N (0: one device up to 64 nodes, else a "
                               "two-level cascade N1 x N2 = nodes)")
    optinc_bits: int = _f(8, "OptINC level bit width b (b bits per gradient element on the "
                             "wire)")
    optinc_latency_us: float = _f(0.1, "OptINC device latency per cascade level (P, MZI mesh, "
                                       "detection, splitter), µs")

    @property
    def profile(self) -> ModelProfile:
        """The model profile named by `model`."""
        p = MODELS.get(self.model)
        if p is None:
            raise SimulationError(
                f"unknown model {self.model!r}; known models: {', '.join(sorted(MODELS))}"
            )
        return p

    @property
    def elements(self) -> int:
        """Gradient elements all-reduced: the model's, or `message_mb` at `itemsize`."""
        if self.message_mb >= 0:
            return max(1, round(self.message_mb * 1e6 / self.itemsize))
        return self.profile.params

    @property
    def message_bytes(self) -> int:
        """Bytes all-reduced per iteration."""
        return self.elements * self.itemsize

    @property
    def step_s(self) -> float:
        """Fixed time per collective step on every system: base latency + step overhead."""
        return (self.latency_us + self.step_overhead_us) * 1e-6

    @property
    def compute_s(self) -> float:
        """Forward + backward time of one worker's batch."""
        if self.compute_ms >= 0:
            return self.compute_ms / 1e3
        return self.profile.compute_s(self.batch, self.sustained_tflops)

    @property
    def rate_bps(self) -> float:
        """Line rate in bit/s."""
        return self.gbps * 1e9

    @property
    def latency_s(self) -> float:
        """Base latency per step in seconds."""
        return self.latency_us * 1e-6

    def timing(self) -> TimingModel:
        """ODDL's device timing for the scheduler (slot margin = the base latency)."""
        return TimingModel(
            tune_s=self.tune_us * 1e-6,
            skew_s=self.skew_us * 1e-6,
            cdr_s=self.cdr_us * 1e-6,
            command_s=self.command_us * 1e-6,
            wss_settle_s=self.wss_ms * 1e-3,
            slot_margin_s=self.latency_s,
            line_rate_bps=self.rate_bps,
        )

    def validate(self) -> None:
        """Raise SimulationError naming the first bad value and the accepted range."""
        self.profile  # noqa: B018 (raises for an unknown model)
        if self.nodes < 2:
            raise SimulationError(f"nodes must be >= 2; got {self.nodes}")
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise SimulationError(f"gbps must be a positive line rate; got {self.gbps}, e.g. 100")
        if self.itemsize < 1:
            raise SimulationError(f"itemsize must be >= 1 byte; got {self.itemsize}, e.g. 4")
        if self.batch < 1:
            raise SimulationError(f"batch must be >= 1; got {self.batch}")
        if self.amortise_iterations < 0:
            raise SimulationError(
                f"amortise_iterations must be >= 0 (0: not amortised); got {self.amortise_iterations}"
            )
        positive = ("sustained_tflops", "reduce_gbytes_s", "sip_delta_us", "sip_live_factor")
        for name in positive:
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise SimulationError(f"{name} must be > 0; got {v}")
        if not (math.isfinite(self.compute_ms) and (self.compute_ms >= 0 or self.compute_ms == -1)):
            raise SimulationError(
                f"compute_ms must be >= 0, or -1 for the model profile's; got {self.compute_ms}"
            )
        if self.bandwidth_norm not in NORMS:
            raise SimulationError(
                f"bandwidth_norm must be one of {', '.join(NORMS)}; got {self.bandwidth_norm!r}")
        if self.sip_segment_rule not in SIP_RULES:
            raise SimulationError(f"sip_segment_rule must be one of {', '.join(SIP_RULES)}; "
                                  f"got {self.sip_segment_rule!r}")
        if not (math.isfinite(self.message_mb) and (self.message_mb > 0
                                                    or self.message_mb == -1)):
            raise SimulationError(
                f"message_mb must be > 0, or -1 for the model's gradient; got {self.message_mb}")
        non_negative = ("latency_us", "step_overhead_us", "ring_hop_latency_us",
                        "tune_us", "skew_us", "cdr_us",
                        "command_us", "wss_ms", "ft_hop_latency_us", "topoopt_setup_s",
                        "optinc_latency_us")
        for name in non_negative:
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SimulationError(f"{name} must be a finite value >= 0; got {v}")
        if not 0.0 <= self.overlap <= 1.0:
            raise SimulationError(f"overlap must be in [0, 1]; got {self.overlap}")
        for name in ("ft_oversub", "ft_core_oversub"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 1.0):
                raise SimulationError(f"{name} must be >= 1 (1 = non-blocking); got {v}")
        for name in ("ft_hosts_per_tor", "ft_tors_per_pod", "sip_wavelengths",
                     "wrht_wavelengths"):
            if getattr(self, name) < 1:
                raise SimulationError(f"{name} must be >= 1; got {getattr(self, name)}")
        if not 2 <= self.optinc_bits <= 16:
            raise SimulationError(f"optinc_bits must be in 2..16; got {self.optinc_bits}")
        if self.optinc_inputs != 0 and not 2 <= self.optinc_inputs <= OPTINC_MAX_INPUTS:
            raise SimulationError(f"optinc_inputs must be 0 (auto) or in 2..{OPTINC_MAX_INPUTS}; "
                                  f"got {self.optinc_inputs}")
        if self.ft_placement not in PLACEMENTS:
            raise SimulationError(
                f"ft_placement must be one of {', '.join(PLACEMENTS)}; got {self.ft_placement!r}"
            )

    def with_values(self, **values: Any) -> SimConfig:
        """Return a copy with some fields replaced (names as in the dataclass)."""
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(values) - names)
        if bad:
            raise SimulationError(f"unknown parameter(s) {bad}; known: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **values)


@dataclass(frozen=True)
class SystemResult:
    """One system's predicted iteration (seconds)."""

    system: str
    collective: str
    compute_s: float
    comm_s: float
    """Network time of the all-reduce, including reconfiguration and reduction."""
    reconfig_s: float
    """Part of `comm_s` spent reconfiguring (retune guards, SiP-Ring dark time)."""
    reduce_s: float
    """Part of `comm_s` spent adding received data."""
    iteration_s: float
    setup_s: float = 0.0
    """One-off per job (WSS partition, patch panel); in `iteration_s` only as its share when
    `SimConfig.amortise_iterations` is set."""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Human-readable system name."""
        return LABELS[self.system]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (milliseconds)."""
        return {
            "system": self.system,
            "label": self.label,
            "collective": self.collective,
            "compute_ms": self.compute_s * 1e3,
            "comm_ms": self.comm_s * 1e3,
            "reconfig_ms": self.reconfig_s * 1e3,
            "reduce_ms": self.reduce_s * 1e3,
            "iteration_ms": self.iteration_s * 1e3,
            "setup_ms": self.setup_s * 1e3,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Simulation:
    """All systems' results for one configuration."""

    config: SimConfig
    results: tuple[SystemResult, ...]
    elapsed_s: float = 0.0

    def result(self, system: str) -> SystemResult:
        """The result of `system` (SimulationError if it was not simulated)."""
        for r in self.results:
            if r.system == system:
                return r
        raise SimulationError(
            f"{system!r} was not simulated; simulated: {', '.join(r.system for r in self.results)}"
        )

    def ratios(self, baseline: str = "oddl", what: str = "iteration_s") -> dict[str, float]:
        """Each system's `what` divided by the baseline's (>1: slower than the baseline)."""
        if not any(r.system == baseline for r in self.results):
            return {}
        base = getattr(self.result(baseline), what)
        return {r.system: getattr(r, what) / base if base > 0 else math.inf for r in self.results}

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        cfg = self.config
        prof = cfg.profile
        return {
            "model": {
                "name": prof.name,
                "params": prof.params,
                "gradient_bytes": prof.gradient_bytes(cfg.itemsize),
                "message_bytes": cfg.message_bytes,
                "gmacs": prof.gmacs,
                "compute_ms": cfg.compute_s * 1e3,
                "source": prof.source,
            },
            "config": dataclasses.asdict(cfg),
            "results": [r.as_dict() for r in self.results],
            "iteration_ratio_vs_oddl": self.ratios(),
            "comm_ratio_vs_oddl": self.ratios(what="comm_s"),
            "elapsed_s": self.elapsed_s,
        }


# --------------------------------------------------------------------------- entry points


def simulate(config: SimConfig, systems: Iterable[str] | None = None) -> Simulation:
    """Simulate one iteration on each of `systems` (default: all); SimulationError on bad input."""
    t0 = time.perf_counter()
    config.validate()
    wanted = _check_systems(systems)
    plans: dict[tuple[Any, ...], Plan] = {}
    if set(wanted) & set(PLAN_SYSTEMS):
        try:
            _plan(config, config.collective, plans)
        except OddlError as exc:
            raise SimulationError(
                f"collective {config.collective!r} on {config.nodes} nodes: {exc}"
            ) from None
    results = []
    for name in wanted:
        try:
            results.append(_RUNNERS[name](config, plans))
        except OddlError as exc:
            raise SimulationError(
                f"{LABELS[name]}: {exc} (change its parameters, or leave it out with "
                f"--systems {','.join(s for s in wanted if s != name)})"
            ) from None
    return Simulation(config, tuple(results), time.perf_counter() - t0)


@dataclass(frozen=True)
class SweepPoint:
    """One value of a sweep: its simulation, or why some systems could not run it."""

    value: Any
    simulation: Simulation | None
    errors: dict[str, str]


@dataclass(frozen=True)
class Sweep:
    """A parameter swept over values."""

    param: str
    values: tuple[Any, ...]
    points: tuple[SweepPoint, ...]
    systems: tuple[str, ...]
    elapsed_s: float = 0.0

    def series(self, system: str, what: str = "iteration_s") -> list[float | None]:
        """`what` of `system` at every point (None where it could not run)."""
        out: list[float | None] = []
        for p in self.points:
            r = next((x for x in p.simulation.results if x.system == system), None) \
                if p.simulation else None
            out.append(getattr(r, what) if r is not None else None)
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        return {
            "sweep": {"param": self.param, "values": list(self.values)},
            "systems": list(self.systems),
            "points": [
                {
                    "value": p.value,
                    "results": [r.as_dict() for r in p.simulation.results] if p.simulation else [],
                    "iteration_ratio_vs_oddl": p.simulation.ratios() if p.simulation else {},
                    "errors": p.errors,
                }
                for p in self.points
            ],
            "elapsed_s": self.elapsed_s,
        }


def sweep(config: SimConfig, param: str, values: Sequence[Any],
          systems: Iterable[str] | None = None) -> Sweep:
    """Simulate `config` with `param` set to each value.

    A value the configuration refuses outright (e.g. gbps=0) raises SimulationError; a system
    that cannot run one point (e.g. TopoOpt's degree on too few nodes) is left out of that
    point with the reason in `errors`, so the other systems' curves stay complete.
    """
    t0 = time.perf_counter()
    wanted = _check_systems(systems)
    if not values:
        raise SimulationError(f"sweep of {param} needs at least one value")
    points = []
    for v in values:
        cfg = config.with_values(**{param: v})
        cfg.validate()
        results, errors = [], {}
        plans: dict[tuple[Any, ...], Plan] = {}
        for name in wanted:
            try:
                results.append(_RUNNERS[name](cfg, plans))
            except OddlError as exc:
                errors[name] = str(exc)
        if not results:
            raise SimulationError(
                f"no system can run {param}={v}: "
                + "; ".join(f"{k}: {e}" for k, e in errors.items())
            )
        points.append(SweepPoint(v, Simulation(cfg, tuple(results)), errors))
    return Sweep(param, tuple(values), tuple(points), wanted, time.perf_counter() - t0)


def ring_formula_s(config: SimConfig) -> float:
    """Closed-form ring all-reduce: 2(N−1)α + 2(N−1)/N · 8S/B (performance.md)."""
    n = config.nodes
    s = config.message_bytes
    return 2 * (n - 1) * config.step_s + 2 * (n - 1) / n * 8.0 * s / config.rate_bps


def _check_systems(systems: Iterable[str] | None) -> tuple[str, ...]:
    wanted = tuple(systems) if systems is not None else SYSTEMS
    bad = [s for s in wanted if s not in SYSTEMS]
    if bad or not wanted:
        raise SimulationError(
            f"unknown system(s) {bad or '(none given)'}; known: {', '.join(SYSTEMS)}"
        )
    return tuple(dict.fromkeys(wanted))


# --------------------------------------------------------------------------- plans


def _plan(config: SimConfig, collective: str, cache: dict[tuple[Any, ...], Plan],
          **params: Any) -> Plan:
    """The registered collective's plan for the model's gradient (shared between systems)."""
    if collective == "wrht":
        params.setdefault("wavelengths", config.wrht_wavelengths)
    elif collective == "totientperms":
        params.setdefault("degree", config.topoopt_degree)
    key = (collective, config.nodes, config.elements, tuple(sorted(params.items())))
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = make_plan(collective, config.nodes, config.elements, **params)
    return plan


def _busy_steps(plan: Plan) -> int:
    """Steps of `plan` that move data."""
    return sum(1 for step in plan.steps if len(step))


def _node_bytes(step: Step, n: int, side: str) -> np.ndarray:
    """Elements each rank sends (side "src") or receives ("dst") in a step."""
    return np.bincount(getattr(step, side), weights=step.length, minlength=n)


def _reduce_s(plan: Plan, config: SimConfig) -> float:
    """Σ over REDUCE steps of the busiest receiver's bytes / reduce rate."""
    rate = config.reduce_gbytes_s * 1e9
    total = 0.0
    for step in plan.steps:
        if step.op is Op.REDUCE and len(step):
            total += float(_node_bytes(step, plan.n_ranks, "dst").max()) * config.itemsize / rate
    return total


def _finish(config: SimConfig, system: str, collective: str, network_s: float, reconfig_s: float,
            reduce_s: float, setup_s: float = 0.0, **detail: Any) -> SystemResult:
    compute = config.compute_s
    comm = network_s + reduce_s
    hidden = min(comm, config.overlap * compute * 2.0 / 3.0)  # backward ≈ 2/3 of compute
    share = setup_s / config.amortise_iterations if config.amortise_iterations else 0.0
    return SystemResult(system, collective, compute, comm, reconfig_s, reduce_s,
                        compute + comm - hidden + share, setup_s, detail)


# --------------------------------------------------------------------------- ODDL


def oddl_topology(n_nodes: int) -> Topology:
    """One logical WSS with a receive channel per node (an abstract 50 GHz grid of N channels).

    Physically one WSS serves ~96 C-band channels on a few dozen ports; a 1024-node TT-FR
    fabric needs many WSSs. The scheduler's contention rules (one flow per transmitter, per
    receiver, per (port, λ)) are what this grid provides; see docs/simulator.md.
    """
    return Topology.single_wss(n_nodes, Grid(first_thz=191.3, spacing_ghz=50.0, channels=n_nodes))


def oddl_schedule(plan: Plan, timing: TimingModel, itemsize: int) -> tuple[Schedule, Schedule]:
    """(first, steady) schedules of `plan`: the steady one starts with the channels the
    first one ends on, as every iteration after the first does."""
    topo = oddl_topology(plan.n_ranks)
    first = schedule_plan(plan, topo.node_ids, topo, timing, itemsize)
    steady = schedule_plan(plan, topo.node_ids, topo, timing, itemsize,
                           initial_channels=first.final_channels)
    return first, steady


def _run_oddl(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    plan = _plan(config, config.collective, cache)
    timing = config.timing()
    _, sched = oddl_schedule(plan, timing, config.itemsize)
    retune_guards = sum(s.guard_s for s in sched.slots if s.retuned)
    overhead = _busy_steps(plan) * config.step_overhead_us * 1e-6  # not in the slot margin
    return _finish(
        config, "oddl", config.collective, sched.makespan_s + overhead, retune_guards,
        _reduce_s(plan, config), setup_s=timing.wss_settle_s,
        slots=len(sched.slots), retunes=sched.reconfigurations,
        guard_ms=sched.guard_total_s * 1e3, efficiency=sched.efficiency,
        scheduler="oddl.controller.scheduling.schedule_plan",
    )


# --------------------------------------------------------------------------- electrical


def _run_ideal(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    plan = _plan(config, config.collective, cache)
    n, bits = plan.n_ranks, 8.0 * config.itemsize / config.rate_bps
    total = 0.0
    for step in plan.steps:
        if len(step):
            busiest = max(_node_bytes(step, n, "src").max(), _node_bytes(step, n, "dst").max())
            total += float(busiest) * bits + config.step_s
    return _finish(config, "ideal", config.collective, total, 0.0, _reduce_s(plan, config),
                   steps=plan.n_steps)


def _placement(config: SimConfig) -> np.ndarray:
    n = config.nodes
    if config.ft_placement == "packed":
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(config.seed).permutation(n).astype(np.int64)


def _run_fattree(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    plan = _plan(config, config.collective, cache)
    n, b = plan.n_ranks, config.rate_bps
    hpt, tpp = config.ft_hosts_per_tor, config.ft_tors_per_pod
    host = _placement(config)
    rack = host // hpt
    pod = rack // tpp
    n_racks, n_pods = int(rack.max()) + 1, int(pod.max()) + 1
    tor_cap = hpt * b / config.ft_oversub  # bit/s out of (and into) one ToR
    pod_cap = hpt * tpp * b / (config.ft_oversub * config.ft_core_oversub)
    hop = config.ft_hop_latency_us * 1e-6
    shape: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
    total = 0.0
    tiers = [0, 0, 0]
    for step in plan.steps:
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        hit = shape.get(key)
        if hit is None:
            xr = rack[step.src] != rack[step.dst]
            xp = pod[step.src] != pod[step.dst]
            switches = 5 if xp.any() else 3 if xr.any() else 1
            hit = shape[key] = (xr, xp, switches)
        xr, xp, switches = hit
        tiers[(switches - 1) // 2] += 1
        bits = step.length * (8.0 * config.itemsize)
        t = max(np.bincount(step.src, bits, n).max(), np.bincount(step.dst, bits, n).max()) / b
        if xr.any():
            for side in (step.src, step.dst):
                t = max(t, np.bincount(rack[side[xr]], bits[xr], n_racks).max() / tor_cap)
        if xp.any():
            for side in (step.src, step.dst):
                t = max(t, np.bincount(pod[side[xp]], bits[xp], n_pods).max() / pod_cap)
        total += float(t) + config.step_s + switches * hop
    return _finish(config, "fat-tree", config.collective, total, 0.0, _reduce_s(plan, config),
                   steps=plan.n_steps, racks=n_racks, pods=n_pods,
                   steps_by_switches_crossed={1: tiers[0], 3: tiers[1], 5: tiers[2]})


# --------------------------------------------------------------------------- SiP-Ring


def _advance(t: float, need: float, delta: float, live: float) -> float:
    """Time at which `need` seconds of live time, starting at `t`, have elapsed
    (live windows are [kT+δ, (k+1)T) with T = δ + live)."""
    period = delta + live
    k = math.floor(t / period)
    pos = t - k * period
    if pos < delta:
        t, pos = k * period + delta, delta
    rem = period - pos
    if need <= rem:
        return t + need
    need -= rem
    full = math.floor(need / live)
    last = need - full * live
    if last <= 0:
        return (k + 1 + full) * period
    return (k + 1 + full) * period + delta + last


def _dark_s(t: float, delta: float, live: float) -> float:
    """Dark (reconfiguring) time in [0, t] of the δ / live cycle."""
    period = delta + live
    k = math.floor(t / period)
    return k * delta + min(t - k * period, delta)


SIP_LP_BUDGET = 60_000_000
"""Σ (pairs × segments) over the SiP-Ring LPs of one simulation (≈ 30 solves at 1024 nodes,
thousands at 64); beyond it new configurations split each segment equally instead."""

SIP_DRAW_BUDGET = 2_000
"""SiP-Ring configurations drawn at random per simulation; beyond, the LP's mean f·W."""

SIP_MAX_CONFIGS_PER_STEP = 1_000_000
"""Reconfigurations one step may wait through before the simulation is refused."""


def _lookup(codes: np.ndarray, values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """values[i] where codes[i] == want[j], else 0 (codes sorted)."""
    if not len(codes):
        return np.zeros(len(want))
    idx = np.minimum(np.searchsorted(codes, want), len(codes) - 1)
    return np.where(codes[idx] == want, values[idx], 0).astype(float)


def _equal_share(codes: np.ndarray, n: int, w: int, rule: str) -> np.ndarray:
    """Wavelengths (fractional) per circuit when every segment's W is split equally among the
    circuits crossing it and each circuit gets its scarcest segment's share."""
    from oddl.controller.sim_sipring import covers

    cover = covers(codes // n, codes % n, n, rule)
    count = cover.sum(axis=1)
    share = np.where(count > 0, w / np.maximum(count, 1), np.inf)
    return np.where(cover, share[:, None], np.inf).min(axis=0)


def _window_end(t: float, delta: float, live: float, finished: bool = False) -> float:
    """End of the live window that `t` is in (or, if dark, the next one); with `finished`,
    a `t` on a period boundary belongs to the window that just ended."""
    period = delta + live
    k = math.floor(t / period)
    if finished and t - k * period < delta:
        return k * period
    return (k + 1) * period


def _run_sipring(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    """SiP-ML's ring with ffsim-opera's allocation (sim_sipring) on a δ / live cycle: the
    circuits of a configuration stay until the next reconfiguration; a step whose pairs have
    no wavelengths waits for one, which allocates for the demand still outstanding."""
    plan = _plan(config, config.collective, cache)
    n, w = plan.n_ranks, config.sip_wavelengths
    lam = config.rate_bps / w if config.bandwidth_norm == "node" else config.rate_bps
    delta = config.sip_delta_us * 1e-6
    live = config.sip_live_factor * delta
    hop = config.ring_hop_latency_us * 1e-6
    allocator = SipRingAllocator(n, w, config.sip_segment_rule, config.seed)
    pairs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
    cur_codes = np.empty(0, dtype=np.int64)
    cur_lams = np.empty(0)
    t, configs, draws, shares, max_hops, random = 0.0, 0, 0, 0, 0, False

    def configure(codes: np.ndarray, demand: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        nonlocal draws, shares
        if allocator.lp_size < SIP_LP_BUDGET or allocator.cached(codes, demand):
            got = allocator.allocate(codes, demand, draw=draws < SIP_DRAW_BUDGET)
            draws += got[2]
            return got
        shares += 1
        return codes, _equal_share(codes, n, w, config.sip_segment_rule), False

    for step in plan.steps:
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        hit = pairs.get(key)
        if hit is None:
            pair = step.src.astype(np.int64) * n + step.dst
            codes, inv = np.unique(pair, return_inverse=True)
            hops = int(((codes % n - codes // n) % n).max())
            hit = pairs[key] = (codes, inv, hops)
        codes, inv, hops = hit
        max_hops = max(max_hops, hops)
        remaining = np.bincount(inv, weights=step.length * (8.0 * config.itemsize),
                                minlength=len(codes))
        if configs == 0:  # the first configuration, for the first step's demand
            cur_codes, cur_lams, random = configure(codes, remaining)
            t, configs = delta, 1
        t = _advance(t, config.step_s + hops * hop, delta, live)
        for _ in range(SIP_MAX_CONFIGS_PER_STEP):
            rate = _lookup(cur_codes, cur_lams, codes) * lam
            act = remaining > 0
            if (rate[act] > 0).all():
                t = _advance(t, float((remaining[act] / rate[act]).max()), delta, live)
                break
            # some pairs have no circuit: the others run until a reconfiguration can change
            # that (the next one if this draw was random, else the one after the first of
            # them finishes), then the ring is configured for what is still outstanding
            moving = act & (rate > 0)
            if random or not moving.any():
                end = _window_end(t, delta, live)
                used = end - max(t, end - live)
            else:
                first = float((remaining[moving] / rate[moving]).min())
                done = _advance(t, first, delta, live)
                end = _window_end(done, delta, live, finished=True)
                used = first + (end - done)
            remaining = np.maximum(0.0, remaining - rate * used)
            remaining[remaining < 1e-6] = 0.0
            act = remaining > 0
            if not act.any():
                t = _advance(t, used, delta, live)
                break
            t = end + delta
            cur_codes, cur_lams, random = configure(codes[act], remaining[act])
            configs += 1
        else:
            raise SimulationError(
                f"SiP-Ring: a step of {config.collective} waited through "
                f"{SIP_MAX_CONFIGS_PER_STEP} reconfigurations without finishing; raise "
                "sip_wavelengths or sip_live_factor")
    return _finish(config, "sip-ring", config.collective, t, _dark_s(t, delta, live),
                   _reduce_s(plan, config), steps=plan.n_steps, configurations=configs,
                   lp_solves=allocator.solves, random_draws=draws,
                   equal_share_configurations=shares, cycles=math.ceil(t / (delta + live)),
                   duty=live / (delta + live), wavelength_gbps=lam / 1e9,
                   longest_circuit_segments=max_hops, segment_rule=config.sip_segment_rule)


# --------------------------------------------------------------------------- WRHT, TopoOpt


def _run_wrht(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    """Per step: node normalisation — the busiest node's sent or received bytes at gbps (a
    root takes its m−1 streams at gbps in total); lambda — the largest stream at gbps (a
    root receives on all its wavelengths at once)."""
    plan = _plan(config, "wrht", cache)
    n = plan.n_ranks
    bits = 8.0 * config.itemsize / config.rate_bps
    guard = config.timing().guard_s  # lightpaths change between levels
    hop = config.ring_hop_latency_us * 1e-6
    total = reconf = 0.0
    fan_in = 0
    for step in plan.steps:
        if not len(step):
            continue
        if config.bandwidth_norm == "node":
            busiest = max(_node_bytes(step, n, "src").max(), _node_bytes(step, n, "dst").max())
        else:
            busiest = step.length.max()
        fwd = (step.dst - step.src) % n
        spans = int(np.minimum(fwd, n - fwd).max())
        total += float(busiest) * bits + config.step_s + spans * hop + guard
        reconf += guard
        fan_in = max(fan_in, int(np.bincount(step.dst).max()))
    return _finish(config, "wrht", "wrht", total, reconf, _reduce_s(plan, config),
                   steps=plan.n_steps, wavelengths=config.wrht_wavelengths,
                   largest_group=fan_in + 1)


def _run_topoopt(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    d = config.topoopt_degree
    plan = _plan(config, "totientperms", cache, both_directions=True)
    n = plan.n_ranks
    iface = config.rate_bps / d if config.bandwidth_norm == "node" else config.rate_bps
    bits = 8.0 * config.itemsize / iface
    total = 0.0
    unique: dict[tuple[int, int], bool] = {}
    for step in plan.steps:
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        if key not in unique:
            pair = step.src * n + step.dst
            unique[key] = len(np.unique(pair)) == len(pair)
        if unique[key]:
            biggest = float(step.length.max())
        else:
            pair = step.src * n + step.dst
            _, inv = np.unique(pair, return_inverse=True)
            biggest = float(np.bincount(inv, weights=step.length).max())
        total += biggest * bits + config.step_s
    from oddl.controller.scheduling.totient import ring_jumps

    return _finish(config, "topoopt", f"totientperms(d={d})", total, 0.0,
                   _reduce_s(plan, config), setup_s=config.topoopt_setup_s,
                   steps=plan.n_steps, rings=len(ring_jumps(n, d, True)),
                   interface_gbps=iface / 1e9)


# --------------------------------------------------------------------------- OptINC


def optinc_levels(nodes: int, inputs: int = 0) -> tuple[int, ...]:
    """Device sizes of the OptINC cascade, servers' side first: ``(N,)`` or ``(N1, N2)``.

    A level-1 device averages N1 servers, the level-2 device the N2 level-1 outputs
    (N1·N2 = nodes, equal groups, so the mean of the group means is the mean). ``inputs = 0``
    picks one device up to 64 servers, else the most balanced split with N1 ≤ 64.
    """
    if inputs == 0:
        if nodes <= OPTINC_MAX_INPUTS:
            return (nodes,)
        for n2 in range(math.isqrt(nodes), 1, -1):
            if nodes % n2 == 0:
                if nodes // n2 <= OPTINC_MAX_INPUTS:
                    return (nodes // n2, n2)
                break
        raise SimulationError(
            f"OptINC: {nodes} nodes do not split into two levels of devices with at most "
            f"{OPTINC_MAX_INPUTS} inputs (N1 × N2 = nodes, equal groups); e.g. 1024 = 32 × 32, "
            "256 = 16 × 16")
    if nodes == inputs:
        return (inputs,)
    if nodes % inputs == 0 and 2 <= nodes // inputs <= inputs:
        return (inputs, nodes // inputs)
    raise SimulationError(
        f"OptINC with {inputs}-input devices serves {inputs} nodes, or up to {inputs}² in a "
        f"two-level cascade of equal groups of {inputs}; {nodes} nodes is neither (set "
        "optinc_inputs to 0 to pick the split)")


def _run_optinc(config: SimConfig, cache: dict[tuple[Any, ...], Plan]) -> SystemResult:
    levels = optinc_levels(config.nodes, config.optinc_inputs)
    elems = config.elements
    wire_s = elems * config.optinc_bits / config.rate_bps  # one pass of the b-bit levels
    device_s = len(levels) * config.optinc_latency_us * 1e-6
    scale_s = config.step_s + device_s  # max|g| to the devices and back, no payload
    network_s = scale_s + config.step_s + wire_s + device_s
    devices = (config.nodes // levels[0]) + (1 if len(levels) > 1 else 0)
    mzis = (config.nodes // levels[0]) * levels[0] * (levels[0] - 1) // 2
    if len(levels) > 1:
        mzis += levels[1] * (levels[1] - 1) // 2
    label = "optinc" if len(levels) == 1 else f"optinc({levels[0]}x{levels[1]})"
    return _finish(config, "optinc", label, network_s, 0.0, 0.0,
                   levels=len(levels), inputs=list(levels), devices=devices,
                   mzis_unitary_diagonal=mzis, bits=config.optinc_bits,
                   wire_bytes=elems * config.optinc_bits / 8, one_pass_ms=wire_s * 1e3,
                   scale_agreement_us=scale_s * 1e6,
                   quantisation=f"{config.optinc_bits}-bit levels, per-tensor scale"
                   + (", rounded twice (O-E-O between levels)" if len(levels) > 1 else ""))


_RUNNERS: dict[str, Callable[[SimConfig, dict[tuple[Any, ...], Plan]], SystemResult]] = {
    "oddl": _run_oddl,
    "fat-tree": _run_fattree,
    "ideal": _run_ideal,
    "sip-ring": _run_sipring,
    "wrht": _run_wrht,
    "topoopt": _run_topoopt,
    "optinc": _run_optinc,
}
