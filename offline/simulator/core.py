"""The simulator's inputs and outputs: `SimConfig`, `SystemResult`, the system names, and the
helpers every system model shares (plans from the registry, reduction cost, finishing a
result). The system models are in `engine` (ODDL, electrical) and `optical` (SiP-Ring,
WRHT, TopoOpt, OptINC); docs/explanation/simulator.md lists every assumption.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from oddl.common.config import OPTINC
from oddl.common.config import OPTINC_MAX_INPUTS as COMMON_OPTINC_MAX_INPUTS
from oddl.common.errors import OddlError
from oddl.controller.scheduling import Op, Plan, Step, TimingModel
from oddl.controller.scheduling.native import native_plan
from oddl.offline.simulator.sipring import RULES
from oddl.offline.workloads import DEFAULT_BATCH, MODELS, SUSTAINED_TFLOPS, ModelProfile

SYSTEMS = ("oddl", "fat-tree", "ideal", "sip-ring", "wrht", "topoopt", OPTINC)
"""Every simulated system, in table order."""

LABELS = {
    "oddl": "ODDL (TT-FR + LCoS WSS)",
    "fat-tree": "electrical fat-tree",
    "ideal": "ideal electrical switch",
    "sip-ring": "SiP-Ring",
    "wrht": "WRHT (optical ring)",
    "topoopt": "TopoOpt (TotientPerms)",
    OPTINC: "OptINC (in-network ONN)",
}

PLAN_SYSTEMS = ("oddl", "fat-tree", "ideal", "sip-ring")
"""Systems that run the collective chosen by `SimConfig.collective`."""

PLACEMENTS = ("packed", "random")

NORMS = ("node", "lambda")
"""Bandwidth normalisations (docs/explanation/simulator.md): per node (default) or per wavelength."""

SIP_RULES = RULES

T = TypeVar("T")

OPTINC_MAX_INPUTS = COMMON_OPTINC_MAX_INPUTS
"""Largest OptINC device the model builds (`oddl.common.config.OPTINC_MAX_INPUTS`)."""

PAPER: dict[str, Any] = {"model": "vgg19", "nodes": 1024, "gbps": 100.0, "fat-tree": 1.6,
                         "sip-ring": 1.7, "wrht": (0.7559, 0.8081)}
"""ODDL's headline (docs/sources.md §1.1): iteration-time ratios over ODDL at this setting; and
WRHT's (docs/sources.md §2): the cut in communication time against an optical-system all-reduce,
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
    kind: str = _f("all_reduce", "the collective the job runs: all_reduce, all_gather, "
                   "reduce_scatter, broadcast, all_to_all, gather, scatter (docs/explanation/collectives.md)")
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
    command_us: float = _f(0.0, "ODDL command budget per retune, µs (0: agents gate locally; "
                              "the testbed's one controller: ~450000 at 1024 lasers)")
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
    optinc_transceivers: int = _f(4, "OptINC transceivers per server M (a level's b bits as M "
                                     "digits of b/M bits; gbps/M each per node, gbps each per "
                                     "wavelength)")
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
        self._validate_job()
        self._validate_network()

    def _validate_job(self) -> None:
        """The model, sizes, rates and the modes (normalisation, SiP rule, message size)."""
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

    def _validate_network(self) -> None:
        """Latencies, overlap, the fat-tree, wavelengths and OptINC's levels."""
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
        m = self.optinc_transceivers
        if not 1 <= m <= self.optinc_bits or self.optinc_bits % m:
            raise SimulationError(
                f"optinc_transceivers must divide optinc_bits ({self.optinc_bits}); got {m}, "
                "e.g. 1, 2, 4 or 8 for 8 bits")
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


def _plan(config: SimConfig, collective: str, cache: dict[tuple[Any, ...], Plan],
          **params: Any) -> Plan:
    """The registered collective's plan for the model's gradient (shared between systems)."""
    if collective == "wrht":
        params.setdefault("wavelengths", config.wrht_wavelengths)
    elif collective == "totientperms":
        params.setdefault("degree", config.topoopt_degree)
    key = (collective, config.kind, config.nodes, config.elements,
           tuple(sorted(params.items())))
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = native_plan(collective, config.kind, config.nodes, config.elements,
                                        0, **params)
    return plan


def per_shape(plan: Plan, derive: Callable[[Step], T]) -> Iterator[tuple[Step, T]]:
    """The plan's non-empty steps, each with ``derive(step)``, computed once per distinct
    (src, dst) arrays (a plan's steps share them; it keeps them alive, so ids are unique)."""
    done: dict[tuple[int, int], T] = {}
    for step in plan.steps:
        if not len(step):
            continue
        key = (id(step.src), id(step.dst))
        hit = done.get(key)
        if hit is None:
            hit = done[key] = derive(step)
        yield step, hit


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


