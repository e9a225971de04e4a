"""A circuit job's topology on the optical circuit switches: which host port sends to which. Pure.

On a testbed whose hosts have several ports patched into an optical circuit switch (TopoOpt's
prototype: 12 hosts × 4 ports through a patch panel), a job's circuits are set once, at
admission, and stay for the job's life: the network is "circuit". Its plan names which node
sends to which (`plan_pairs`); every such pair needs its own light path, from a transmit
port of the sender through the switch to a receive port of the receiver.

Ports are given per node (`assign_ports`): the sender's transmit ports to its peers in the
order of the plan's jumps ((dst − src) mod n, so port 1 carries a ring's jump 1 on every
node), and each receive port to the peer the same port transmits to when it can (a duplex
link: TopoOpt's bidirectional rings use port j both ways), else the lowest free one. A node
needs as many ports as its most numerous peers in either direction; fewer is refused with the
count and the fix.

A port's transmit fibre enters the switch at its ingress port and its receive fibre leaves an
egress port (`oddl.common.config.TestbedConfig.port_links`), so a pair becomes one
cross-connect ingress → egress of one switch (`circuit_connections`). The change admission
applies also disconnects every other ingress of the job's hosts, and any ingress still
connected to one of the job's egress ports, so no light from an earlier job reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oddl.common.config import PortLink, TestbedConfig
from oddl.common.errors import OperationRefused
from oddl.controller.scheduling import Plan


@dataclass(frozen=True)
class PortCircuit:
    """One light path of a circuit job: `src`'s port `src_port` to `dst`'s port `dst_port`,
    through `switch` from `ingress` to `egress`."""

    src: str
    src_port: int
    dst: str
    dst_port: int
    switch: str
    ingress: int
    egress: int

    def describe(self) -> str:
        """E.g. 'n0.p1 → n1.p1 (ocs0 1→53)'."""
        return (f"{self.src}.p{self.src_port} → {self.dst}.p{self.dst_port} "
                f"({self.switch} {self.ingress}→{self.egress})")


def plan_pairs(plan: Plan, nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Every (sender, receiver) pair of nodes the plan moves data between, each once."""
    pairs: dict[tuple[int, int], None] = {}
    for step in plan.steps:
        for s, d in zip(step.src.tolist(), step.dst.tolist(), strict=True):
            if s != d:
                pairs.setdefault((int(s), int(d)), None)
    return [(nodes[s], nodes[d]) for s, d in pairs]


def topology_pairs(collective: str, nodes: Sequence[str],
                   params: Mapping[str, object]) -> list[tuple[str, str]]:
    """The (sender, receiver) pairs a circuit job's topology joins: its all-reduce plan's,
    and for topoopt the matchings' duplex `links` of the topology `oddl topoopt` chose.
    PlanError when the collective cannot be planned with these parameters."""
    from oddl.controller.scheduling import make_plan
    from oddl.controller.scheduling.topoopt import NAME as TOPOOPT
    from oddl.controller.scheduling.topoopt import matching_pairs

    pairs = plan_pairs(make_plan(collective, len(nodes), len(nodes) * 8, **params), nodes)
    if collective == TOPOOPT:
        have = set(pairs)
        pairs += [(nodes[a], nodes[b]) for a, b in sorted(matching_pairs(len(nodes),
                                                                         params.get("links")))
                  if (nodes[a], nodes[b]) not in have]
    return pairs


def assign_ports(nodes: Sequence[str], pairs: Sequence[tuple[str, str]],
                 ports: Mapping[str, int]) -> list[tuple[str, int, str, int]]:
    """(src, src port, dst, dst port) for every pair (see the module docstring);
    OperationRefused when a node has fewer ports than peers in one direction."""
    index = {n: i for i, n in enumerate(nodes)}
    n = len(nodes)
    outs: dict[str, list[str]] = {node: [] for node in nodes}
    ins: dict[str, list[str]] = {node: [] for node in nodes}
    for src, dst in pairs:
        outs[src].append(dst)
        ins[dst].append(src)
    for node in nodes:
        need = max(len(outs[node]), len(ins[node]))
        if need > ports.get(node, 0):
            raise OperationRefused(
                f"host {node} has {ports.get(node, 0)} port(s) but this job's topology needs "
                f"{need} (it sends to {', '.join(outs[node]) or 'none'} and hears "
                f"{', '.join(ins[node]) or 'none'}); give the job a lower degree "
                f"(degree={ports.get(node, 0)} or less for topoopt) or the host more ports")
    tx: dict[tuple[str, str], int] = {}
    for node in nodes:
        by_jump = sorted(outs[node], key=lambda d: (index[d] - index[node]) % n)
        for port, dst in enumerate(by_jump, start=1):
            tx[(node, dst)] = port
    rx: dict[tuple[str, str], int] = {}
    for node in nodes:
        free = set(range(1, ports[node] + 1))
        later: list[str] = []
        for src in ins[node]:
            duplex = tx.get((node, src))
            if duplex is not None and duplex in free:
                rx[(src, node)] = duplex
                free.discard(duplex)
            else:
                later.append(src)
        for src in later:
            port = min(free)
            rx[(src, node)] = port
            free.discard(port)
    return [(src, tx[(src, dst)], dst, rx[(src, dst)]) for src, dst in pairs]


def port_circuits(cfg: TestbedConfig, nodes: Sequence[str], pairs: Sequence[tuple[str, str]]
                  ) -> tuple[PortCircuit, ...]:
    """The job's light paths through the testbed's circuit switches; OperationRefused when a
    node lacks the ports, a port is not wired to a switch, or two ends hang on different
    switches."""
    links = {(p.node, p.port): p for p in cfg.port_links()}
    ports = {n.id: n.ports for n in cfg.nodes}
    out: list[PortCircuit] = []
    for src, sp, dst, dp in assign_ports(nodes, pairs, ports):
        a, b = _link(links, src, sp), _link(links, dst, dp)
        if a.switch != b.switch:
            raise OperationRefused(
                f"{src}.p{sp} enters circuit switch {a.switch} but {dst}.p{dp} hangs on "
                f"{b.switch}: a light path crosses one switch; wire both hosts' ports to the "
                "same switch or pick nodes on one switch")
        out.append(PortCircuit(src, sp, dst, dp, a.switch, a.ingress, b.egress))
    return tuple(out)


def _link(links: Mapping[tuple[str, int], PortLink], node: str, port: int) -> PortLink:
    link = links.get((node, port))
    if link is None:
        raise OperationRefused(f"port p{port} of host {node} is not wired to a circuit switch "
                               f"in the testbed file; add its fibres ({node}.p{port}.tx → the "
                               f"switch's ingress, the switch's egress → {node}.p{port}.rx)")
    return link


def circuit_connections(cfg: TestbedConfig, nodes: Sequence[str],
                        circuits: Sequence[PortCircuit],
                        current: Mapping[str, Mapping[int, int]]
                        ) -> dict[str, dict[int, int]]:
    """The switch change that makes exactly `circuits` for the job's hosts: their
    cross-connects, every other ingress of the hosts disconnected (egress 0), and any ingress
    now connected to an egress the circuits need disconnected too."""
    mine = set(nodes)
    change: dict[str, dict[int, int]] = {}
    for link in cfg.port_links():
        if link.node in mine:
            change.setdefault(link.switch, {})[link.ingress] = 0
    needed: dict[str, set[int]] = {}
    for c in circuits:
        change.setdefault(c.switch, {})[c.ingress] = c.egress
        needed.setdefault(c.switch, set()).add(c.egress)
    for switch, table in current.items():
        for ingress, egress in table.items():
            if egress in needed.get(switch, ()) and ingress not in change.get(switch, {}):
                change.setdefault(switch, {})[ingress] = 0
    return change
