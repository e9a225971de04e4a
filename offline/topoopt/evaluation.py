"""TopoOpt's iteration-time model, on its topology and on a fat-tree, and the network cost.

Iteration time (`evaluate`), in the spirit of `oddl.offline.simulator.engine`: compute +
model-parallel exchanges (on the critical path) + all-reduce + reduction − overlap. Each phase
is a fluid bottleneck: the most loaded directed link's bytes at the interface rate, plus
latency per step (``latency_us`` + ``forward_us`` per extra hop). Fat-tree and ideal switch
(`FatTree`) use the same traffic with the simulator's fat-tree model (host ports, ToR and pod
links). `CostModel` prices both networks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oddl.offline.topoopt.job_model import JobModel, Strategy, Traffic, traffic
from oddl.offline.topoopt.topology import FabricTopology


@dataclass(frozen=True)
class NetParams:
    """Physical constants shared by every network (defaults as `SimConfig`'s)."""

    latency_us: float = 1.0
    """Base latency per step (NIC, propagation), µs."""
    forward_us: float = 1.0
    """TopoOpt: extra latency per forwarding host on a multi-hop path, µs."""
    reduce_gbytes_s: float = 500.0
    """Rate of adding received bytes (GB/s)."""
    overlap: float = 0.0
    """Fraction of the backward pass (2/3 of compute) that hides the all-reduce."""
    ft_hosts_per_tor: int = 8
    ft_tors_per_pod: int = 8
    ft_oversub: float = 1.0
    ft_core_oversub: float = 1.0
    ft_hop_latency_us: float = 0.5


@dataclass(frozen=True)
class Breakdown:
    """Predicted iteration on one network (seconds)."""

    network: str
    compute_s: float
    mp_s: float
    """Model-parallel exchanges (critical path)."""
    allreduce_s: float
    """All-reduce network time."""
    reduce_s: float
    hidden_s: float
    """All-reduce time hidden behind the backward pass (`NetParams.overlap`)."""

    @property
    def iteration_s(self) -> float:
        """Compute + exchanges + all-reduce + reduction − hidden."""
        return self.compute_s + self.mp_s + self.allreduce_s + self.reduce_s - self.hidden_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy in milliseconds."""
        return {"network": self.network, "compute_ms": self.compute_s * 1e3,
                "mp_ms": self.mp_s * 1e3, "allreduce_ms": self.allreduce_s * 1e3,
                "reduce_ms": self.reduce_s * 1e3, "hidden_ms": self.hidden_s * 1e3,
                "iteration_ms": self.iteration_s * 1e3}


def _finish(network: str, model: JobModel, tr: Traffic, mp_s: float, ar_s: float,
            p: NetParams) -> Breakdown:
    n = tr.nodes
    red = sum((n // m - 1) / (n // m) * s for m, s in tr.allreduce) / (p.reduce_gbytes_s * 1e9)
    compute = model.compute_s
    hidden = min(ar_s + red, p.overlap * compute * 2.0 / 3.0)
    return Breakdown(network, compute, mp_s, ar_s, red, hidden)


def evaluate(model: JobModel, strategy: Strategy, topo: FabricTopology,
             p: NetParams = NetParams(), tr: Traffic | None = None) -> Breakdown:
    """Iteration time of `strategy` on a TopoOpt topology (built for it or not)."""
    tr = tr or traffic(model, strategy, topo.nodes)
    bits = 8.0 / (topo.gbps * 1e9)
    alpha, fwd = p.latency_us * 1e-6, p.forward_us * 1e-6
    mp = 0.0
    for m, v, ex in tr.mp:
        load, hops = topo.block_route(m)
        mp += v * load * bits + 2 * ex * (alpha + max(hops - 1, 0) * fwd)
    per_jump: dict[int, float] = {}
    lat = 0.0
    for m, s in tr.allreduce:
        coeff, hops = topo.ring_route(m)
        for j, c in coeff.items():
            per_jump[j] = per_jump.get(j, 0.0) + c * s
        lat = max(lat, 2 * (topo.nodes // m - 1) * (alpha + max(hops - 1, 0) * fwd))
    copies: dict[int, int] = {}
    for j in topo.jumps:
        copies[j] = copies.get(j, 0) + 1
    ar = max((b / copies.get(j, 1) for j, b in per_jump.items()), default=0.0) * bits + lat
    return _finish("topoopt", model, tr, mp, ar, p)


@dataclass(eq=False)
class FatTree:
    """An electrical 3-tier fat-tree (as the simulator's): host ports at `gbps`, ToR and pod
    links with oversubscription, per-switch latency, packed placement (rank r on host r)."""

    nodes: int
    gbps: float
    p: NetParams = field(default_factory=NetParams)
    ideal: bool = False
    """A non-blocking switch instead: host ports only, no switch latency."""
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """``ideal`` or ``fat-tree``."""
        return "ideal" if self.ideal else "fat-tree"

    def _ports(self, src: np.ndarray, dst: np.ndarray, vol: np.ndarray) -> tuple[float, int]:
        """(seconds per byte of `vol` at the bottleneck, switches crossed) of one flow set."""
        n, b, p = self.nodes, self.gbps * 1e9 / 8.0, self.p
        t = max(np.bincount(src, vol, n).max(), np.bincount(dst, vol, n).max()) / b
        if self.ideal:
            return float(t), 0
        rack, pod = np.arange(n) // p.ft_hosts_per_tor, np.arange(n) // (
            p.ft_hosts_per_tor * p.ft_tors_per_pod)
        xr, xp = rack[src] != rack[dst], pod[src] != pod[dst]
        tor = p.ft_hosts_per_tor * b / p.ft_oversub
        podcap = p.ft_hosts_per_tor * p.ft_tors_per_pod * b / (p.ft_oversub * p.ft_core_oversub)
        for side in (src, dst):
            if xr.any():
                t = max(t, np.bincount(rack[side[xr]], vol[xr]).max() / tor)
            if xp.any():
                t = max(t, np.bincount(pod[side[xp]], vol[xp]).max() / podcap)
        return float(t), 5 if xp.any() else 3 if xr.any() else 1

    def block(self, m: int) -> tuple[float, int]:
        """(seconds per pair-byte, switches) of the all-to-all within m-blocks."""
        hit = self._cache.get(("block", m))
        if hit is None:
            u = np.arange(self.nodes)
            a, b = np.nonzero(u[:, None] // m == u[None, :] // m)
            keep = a != b
            hit = self._cache["block", m] = self._ports(a[keep], b[keep],
                                                        np.ones(int(keep.sum())))
        return hit

    def ring(self, m: int) -> tuple[float, int]:
        """(seconds per byte of S, switches) of the ring all-reduce of group size N/m."""
        hit = self._cache.get(("ring", m))
        if hit is None:
            n, g = self.nodes, self.nodes // m
            u = np.arange(n)
            hit = self._cache["ring", m] = self._ports(u, (u + m) % n,
                                                       np.full(n, 2.0 * (g - 1) / g))
        return hit

    def evaluate(self, model: JobModel, strategy: Strategy, tr: Traffic | None = None
                 ) -> Breakdown:
        """Iteration time of `strategy` on this network."""
        tr = tr or traffic(model, strategy, self.nodes)
        p = self.p
        alpha, hop = p.latency_us * 1e-6, 0.0 if self.ideal else p.ft_hop_latency_us * 1e-6
        mp = 0.0
        for m, v, ex in tr.mp:
            per, sw = self.block(m)
            mp += v * per + 2 * ex * (alpha + sw * hop)
        n = self.nodes
        if tr.allreduce:
            # all groups at once: loads add up on the same ports
            u = np.arange(n)
            srcs, dsts, vols, lat = [], [], [], 0.0
            for m, s in tr.allreduce:
                g = n // m
                srcs.append(u)
                dsts.append((u + m) % n)
                vols.append(np.full(n, 2.0 * (g - 1) / g * s))
                lat = max(lat, 2 * (g - 1) * (alpha + self.ring(m)[1] * hop))
            key = ("ar", tr.allreduce)
            t = self._cache.get(key)
            if t is None:
                t = self._cache[key] = self._ports(np.concatenate(srcs), np.concatenate(dsts),
                                                   np.concatenate(vols))[0]
            ar = t + lat
        else:
            ar = 0.0
        return _finish(self.name, model, tr, mp, ar, p)


# --------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class CostModel:
    """Network cost per node, linear in the line rate (indicative prices, our assumption).

    TopoOpt: d × (NIC port + transceiver) at B each, plus d patch-panel ports. Fat-tree of
    t tiers (1: one switch, 2: leaf-spine, 3: core): a NIC port, 2t transceivers and 2t−1
    switch ports per host, all at the host rate.
    """

    nic_per_gbps: float = 5.0
    transceiver_per_gbps: float = 1.5
    switch_port_per_gbps: float = 4.0
    patch_panel_port: float = 100.0

    def topoopt_per_node(self, degree: int, gbps: float) -> float:
        """Cost of one TopoOpt node's network (currency units)."""
        return degree * (gbps * (self.nic_per_gbps + self.transceiver_per_gbps)
                         + self.patch_panel_port)

    def fattree_per_gbps(self, nodes: int, p: NetParams) -> float:
        """Cost per host and per Gbit/s of host rate of a full-bisection fat-tree."""
        tiers = 1 if nodes <= p.ft_hosts_per_tor else 2 if nodes <= (
            p.ft_hosts_per_tor * p.ft_tors_per_pod) else 3
        return (self.nic_per_gbps + 2 * tiers * self.transceiver_per_gbps
                + (2 * tiers - 1) * self.switch_port_per_gbps)

    def equal_cost_fattree_gbps(self, nodes: int, degree: int, gbps: float,
                                p: NetParams) -> float:
        """Host rate of the fat-tree that costs what the TopoOpt network costs."""
        return self.topoopt_per_node(degree, gbps) / self.fattree_per_gbps(nodes, p)

    def as_dict(self) -> dict[str, float]:
        """The prices."""
        return {"nic_per_gbps": self.nic_per_gbps,
                "transceiver_per_gbps": self.transceiver_per_gbps,
                "switch_port_per_gbps": self.switch_port_per_gbps,
                "patch_panel_port": self.patch_panel_port}
