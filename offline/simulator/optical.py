"""The optical baselines of the simulator: SiP-Ring (with ffsim-opera's wavelength allocation,
`oddl.offline.simulator.sipring`), WRHT, TopoOpt and OptINC. Each `_run_*` takes a `SimConfig` and
the plan cache and returns a `SystemResult`; docs/explanation/simulator.md lists what each takes from its
paper or its authors' code and what is ours.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from oddl.common.config import OPTINC
from oddl.controller.scheduling import Plan, Step
from oddl.offline.simulator.core import (
    OPTINC_MAX_INPUTS,
    SimConfig,
    SimulationError,
    SystemResult,
    _finish,
    _node_bytes,
    _plan,
    _reduce_s,
    per_shape,
)
from oddl.offline.simulator.sipring import SipRingAllocator

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
    from oddl.offline.simulator.sipring import covers

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
    """SiP-ML's ring with ffsim-opera's allocation (oddl.offline.simulator.sipring) on a δ / live cycle: the
    circuits of a configuration stay until the next reconfiguration; a step whose pairs have
    no wavelengths waits for one, which allocates for the demand still outstanding."""
    plan = _plan(config, config.collective, cache)
    n = plan.n_ranks
    ring = _SipRing(config, n)
    delta, live = ring.delta, ring.live
    hop = config.ring_hop_latency_us * 1e-6
    t, max_hops = 0.0, 0

    def pair_codes(step: Step) -> tuple[np.ndarray, np.ndarray, int]:
        """(distinct src·n+dst codes, each transfer's code index, most ring segments)."""
        pair = step.src.astype(np.int64) * n + step.dst
        codes, inv = np.unique(pair, return_inverse=True)
        return codes, inv, int(((codes % n - codes // n) % n).max())

    for step, (codes, inv, hops) in per_shape(plan, pair_codes):
        max_hops = max(max_hops, hops)
        remaining = np.bincount(inv, weights=step.length * (8.0 * config.itemsize),
                                minlength=len(codes))
        if ring.configs == 0:  # the first configuration, for the first step's demand
            ring.configure(codes, remaining)
            t = delta
        t = _advance(t, config.step_s + hops * hop, delta, live)
        t = ring.run_step(t, codes, remaining)
    return _finish(config, "sip-ring", config.collective, t, _dark_s(t, delta, live),
                   _reduce_s(plan, config), steps=plan.n_steps, configurations=ring.configs,
                   lp_solves=ring.allocator.solves, random_draws=ring.draws,
                   equal_share_configurations=ring.shares, cycles=math.ceil(t / (delta + live)),
                   duty=live / (delta + live), wavelength_gbps=ring.lam / 1e9,
                   longest_circuit_segments=max_hops, segment_rule=config.sip_segment_rule)


class _SipRing:
    """SiP-Ring over one collective: the allocator, the configuration in force, the counts."""

    def __init__(self, config: SimConfig, n: int) -> None:
        self.config, self.n, self.w = config, n, config.sip_wavelengths
        self.lam = config.rate_bps / self.w if config.bandwidth_norm == "node" else config.rate_bps
        self.delta = config.sip_delta_us * 1e-6
        self.live = config.sip_live_factor * self.delta
        self.allocator = SipRingAllocator(n, self.w, config.sip_segment_rule, config.seed)
        self.cur_codes = np.empty(0, dtype=np.int64)
        self.cur_lams = np.empty(0)
        self.random = False
        self.configs = self.draws = self.shares = 0

    def configure(self, codes: np.ndarray, demand: np.ndarray) -> None:
        """Allocate wavelengths for `demand` on the pairs `codes` (an LP, a random draw, or an
        equal share when the LP would be too large)."""
        alloc = self.allocator
        self.configs += 1
        if alloc.lp_size < SIP_LP_BUDGET or alloc.cached(codes, demand):
            got = alloc.allocate(codes, demand, draw=self.draws < SIP_DRAW_BUDGET)
            self.draws += got[2]
            self.cur_codes, self.cur_lams, self.random = got
            return
        self.shares += 1
        self.cur_codes, self.random = codes, False
        self.cur_lams = _equal_share(codes, self.n, self.w, self.config.sip_segment_rule)

    def run_step(self, t: float, codes: np.ndarray, remaining: np.ndarray) -> float:
        """Carry one step's `remaining` bits per pair from time `t`; return when it ends."""
        delta, live = self.delta, self.live
        for _ in range(SIP_MAX_CONFIGS_PER_STEP):
            rate = _lookup(self.cur_codes, self.cur_lams, codes) * self.lam
            act = remaining > 0
            if (rate[act] > 0).all():
                return _advance(t, float((remaining[act] / rate[act]).max()), delta, live)
            # some pairs have no circuit: the others run until a reconfiguration can change
            # that (the next one if this draw was random, else the one after the first of
            # them finishes), then the ring is configured for what is still outstanding
            moving = act & (rate > 0)
            if self.random or not moving.any():
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
                return _advance(t, used, delta, live)
            t = end + delta
            self.configure(codes[act], remaining[act])
        raise SimulationError(
            f"SiP-Ring: a step of {self.config.collective} waited through "
            f"{SIP_MAX_CONFIGS_PER_STEP} reconfigurations without finishing; raise "
            "sip_wavelengths or sip_live_factor")


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
    m = config.optinc_transceivers  # b/M-bit digits on M transceivers at once
    per_server = config.rate_bps * (m if config.bandwidth_norm == "lambda" else 1)
    wire_s = elems * config.optinc_bits / per_server  # one pass of the b-bit levels
    device_s = len(levels) * config.optinc_latency_us * 1e-6
    scale_s = config.step_s + device_s  # max|g| to the devices and back, no payload
    network_s = scale_s + config.step_s + wire_s + device_s
    devices = (config.nodes // levels[0]) + (1 if len(levels) > 1 else 0)
    mzis = (config.nodes // levels[0]) * levels[0] * (levels[0] - 1) // 2
    if len(levels) > 1:
        mzis += levels[1] * (levels[1] - 1) // 2
    label = OPTINC if len(levels) == 1 else f"{OPTINC}({levels[0]}x{levels[1]})"
    return _finish(config, OPTINC, label, network_s, 0.0, 0.0,
                   levels=len(levels), inputs=list(levels), devices=devices,
                   mzis_unitary_diagonal=mzis, bits=config.optinc_bits, transceivers=m,
                   wire_bytes=elems * config.optinc_bits / 8, one_pass_ms=wire_s * 1e3,
                   scale_agreement_us=scale_s * 1e6,
                   quantisation=f"{config.optinc_bits}-bit levels, per-tensor scale"
                   + (", rounded twice (O-E-O between levels)" if len(levels) > 1 else ""))


