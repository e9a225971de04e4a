"""The cluster simulator: one training iteration of data-parallel DL on seven networks.

`simulate(SimConfig(model="vgg19", nodes=1024, gbps=100))` predicts, for every system, the
iteration time = compute + exposed communication, with the reconfiguration overhead inside
the communication broken out. Every node has the same bandwidth, `gbps` in and `gbps` out,
over however many wavelengths or interfaces (`bandwidth_norm="node"`); `"lambda"` gives every
wavelength or interface `gbps` instead. Fixed costs per step (`latency_us`,
`step_overhead_us`) and per hop (`ft_hop_latency_us`, `ring_hop_latency_us`) apply alike:

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
  (unidirectional); each segment has W = `sip_wavelengths` λ, which an LP shares among the
  circuits crossing it, rounded at random to whole λ (ffsim-opera's SiP-ML allocation,
  `oddl.offline.simulator.sipring`). The ring reconfigures for δ, then runs for 4δ, periodically;
  a step whose pairs have no λ waits for the next reconfiguration.
- ``wrht``: the WRHT tree (registered collective ``wrht``) on an optical ring with
  `wrht_wavelengths` λ per fibre: members send their whole buffer to the group root, each on
  its own λ; the root takes them at gbps in total (per node) or all at once (per λ) and
  reduces m−1 buffers.
- ``topoopt``: TopoOpt's direct-connect fabric: `topoopt_degree` interfaces per node, each at
  gbps/degree (per node) or gbps (per λ), TotientPerms rings (registered collective
  ``totientperms``) in both directions, one part of the buffer per ring, all rings at once.
- ``optinc``: OptINC's in-network averaging (docs/sources.md §4): every server sends its gradient
  once, as b-bit levels, to an MZI-mesh device that streams the quantised mean back through a
  passive splitter; one pass S_b/B plus the device latency per cascade level (one device up to
  64 servers, else a two-level cascade N1 × N2), after a scale agreement (one small round
  trip). No server-side reduction.

Every plan comes from the scheduling core's registry (`make_plan`). Reductions cost
``received bytes / reduce_gbytes_s`` per REDUCE step on every system (not overlapped with the
transfer). All assumptions are listed in docs/explanation/simulator.md.

Module layout: inputs, outputs and shared helpers (`SimConfig`, `SYSTEMS`, `LABELS`, ...) in
`oddl.offline.simulator.core`; ODDL and the electrical networks here; SiP-Ring, WRHT, TopoOpt and
OptINC in `oddl.offline.simulator.optical` (SiP-Ring's wavelength allocation in
`oddl.offline.simulator.sipring`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oddl.common.config import OPTINC
from oddl.common.errors import OddlError
from oddl.controller.scheduling import (
    Grid,
    Plan,
    Schedule,
    Step,
    TimingModel,
    Topology,
    schedule_plan,
)
from oddl.offline.simulator.core import (
    LABELS,
    PLAN_SYSTEMS,
    SYSTEMS,
    SimConfig,
    SimulationError,
    SystemResult,
    _busy_steps,
    _finish,
    _node_bytes,
    _plan,
    _reduce_s,
    per_shape,
)
from oddl.offline.simulator.optical import (
    _run_optinc,
    _run_sipring,
    _run_topoopt,
    _run_wrht,
)

__all__ = [
    "Simulation", "Sweep", "SweepPoint", "oddl_schedule", "oddl_topology", "ring_formula_s",
    "simulate", "sweep",
]


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
    """Closed-form ring all-reduce: 2(N−1)α + 2(N−1)/N · 8S/B (docs/sources.md §7)."""
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



# --------------------------------------------------------------------------- ODDL


def oddl_topology(n_nodes: int) -> Topology:
    """One logical WSS with a receive channel per node (an abstract 50 GHz grid of N channels).

    Physically one WSS serves ~96 C-band channels on a few dozen ports; a 1024-node TT-FR
    fabric needs many WSSs. The scheduler's contention rules (one flow per transmitter, per
    receiver, per (port, λ)) are what this grid provides; see docs/explanation/simulator.md.
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
    total = 0.0
    tiers = [0, 0, 0]

    def crossings(step: Step) -> tuple[np.ndarray, np.ndarray, int]:
        """(crosses racks, crosses pods, switches on the longest path) per transfer."""
        xr = rack[step.src] != rack[step.dst]
        xp = pod[step.src] != pod[step.dst]
        return xr, xp, 5 if xp.any() else 3 if xr.any() else 1

    for step, (xr, xp, switches) in per_shape(plan, crossings):
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


_RUNNERS: dict[str, Callable[[SimConfig, dict[tuple[Any, ...], Plan]], SystemResult]] = {
    "oddl": _run_oddl,
    "fat-tree": _run_fattree,
    "ideal": _run_ideal,
    "sip-ring": _run_sipring,
    "wrht": _run_wrht,
    "topoopt": _run_topoopt,
    OPTINC: _run_optinc,
}
